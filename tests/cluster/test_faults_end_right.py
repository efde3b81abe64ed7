"""Faults that end in the right place, with real role processes over loopback: a role hung past
the heartbeat timeout is ended and restarted like a dead one; an actor lost once the run is past
RUNNING leaves a finished run finished; a stale internal ``AIORL_*`` variable in the launcher's
environment changes nothing of a new run."""

from __future__ import annotations

import os
import shutil
import signal
import socket
from pathlib import Path

import pytest
from cluster_helpers import alive, finish, live_status, pids, read_json, stopped, wait_for
from configs import RANDOM_CARTPOLE, configured
from test_faults import metrics_rows

from aiorl.io.rundir import ENV_RESUME_FROM
from aiorl.runtime.hold import ENV_HOLD

pytestmark = pytest.mark.cluster

# An env slow enough (STEP_S a step) that a budget of env steps is seconds of acting, whatever the
# machine: the actor is stopped long before it could reach it.
# With HELPERS set, an actor's env starts a process of its own (in the actor's process group, as a
# helper a real env might start) and writes there "ACTOR_PID HELPER_PID".
SLOW_ENV = """
import os
import shutil
import socket
import subprocess
import sys
import time

import gymnasium as gym
import numpy as np

STEP_S = {step_s}
HELPERS = {helpers!r}


class Slow(gym.Env):
    observation_space = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self):
        if HELPERS and "actor" in sys.argv:
            helper = subprocess.Popen(["sleep", "600"])
            with open(HELPERS, "a") as f:
                f.write(f"{{os.getpid()}} {{helper.pid}}\\n")

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(4, np.float32), {{}}

    def step(self, action):
        time.sleep(STEP_S)
        self.t += 1
        return np.full(4, 0.1 * int(action), np.float32), 1.0, False, self.t >= 50, {{}}
"""


def slow_env(tmp_path: Path, monkeypatch, step_s: float = 0.005, helpers: Path | None = None) -> str:
    (tmp_path / "slow_env.py").write_text(SLOW_ENV.format(step_s=step_s, helpers=str(helpers or "")))
    # The role processes import the env module by name (env.id module:Class).
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    return "slow_env:Slow"


def helper_pids(path: Path) -> list[tuple[int, int]]:
    """(actor pid, helper pid) of each helper an env started."""
    lines = path.read_text().splitlines() if path.exists() else []
    return [(int(actor), int(helper)) for actor, helper in (line.split() for line in lines)]


def one_actor(env_id: str, steps: int, **cluster) -> dict:
    return configured(
        RANDOM_CARTPOLE,
        env={"id": env_id, "num_envs": 1},
        agent={"scheduled_timesteps": steps, "learning_starts": 50},
        cluster={"actors": 1, "memories": 1, "learners": 1, **cluster},
    )


def stepping(run_dir: Path, name: str) -> int | None:
    """`name`'s pid once the coordinator has that process running and acting in RUNNING."""
    status = live_status(run_dir) or {}
    role = (status.get("roles") or {}).get(name) or {}
    pid = pids(run_dir).get(name)
    acting = (role.get("counters") or {}).get("env_steps", 0) > 0
    ok = status.get("phase") == "RUNNING" and role.get("pid") == pid and role.get("status") == "running"
    return pid if ok and acting else None


@pytest.mark.parametrize("warm", [True, False], ids=["forked", "own-process"])
def test_an_actor_stopped_past_the_heartbeat_timeout_is_ended_and_replaced_and_the_run_finishes(
    tmp_path, monkeypatch, launch, warm
):
    """It was declared lost and left stopped: it could never rejoin, nothing acted for the run's
    budget, and woken it exited 3, never restarted, and the run was reported failed."""
    helpers = tmp_path / "helpers"
    config = one_actor(
        slow_env(tmp_path, monkeypatch, helpers=helpers), 2000, heartbeat_timeout_s=2.0, warm_spawner=warm
    )
    proc, run_dir = launch(config)
    hung = wait_for(lambda: stepping(run_dir, "actor-0"), 120, "actor-0 acting")
    os.kill(hung, signal.SIGSTOP)
    try:
        # The only actor: the budget of env steps is reached only if a new process acts for it.
        code, out = finish(proc, timeout_s=240)
        # The hung actor's whole process group was ended: its env's helper too.
        theirs = [helper for actor, helper in helper_pids(helpers) if actor == hung]
        assert theirs and not any(alive(pid) for pid in theirs), theirs
    finally:
        for _, helper in helper_pids(helpers):
            if alive(helper):
                os.kill(helper, signal.SIGKILL)
    assert code == 0, out
    assert f"actor-0 (pid {hung}) was declared lost by the coordinator (no heartbeat for" in out, out
    assert not alive(hung) and not stopped(hung)
    assert pids(run_dir)["actor-0"] != hung
    restarts = read_json(run_dir / "restarts.json")["restarts"]
    assert [(r["role"], r["exit"]) for r in restarts] == [("actor-0", -signal.SIGKILL)], restarts
    summary = read_json(run_dir / "summary.json")
    assert summary["outcome"] == "finished" and summary["ok"] and not summary["failures"], summary
    assert summary["roles"]["actor-0"]["status"] == "done" and summary["restarts"] == 1, summary["roles"]


def past_running_with(run_dir: Path, name: str) -> int | None:
    """`name`'s pid once the run has left RUNNING and `name` has reported done."""
    status = live_status(run_dir) or {}
    role = (status.get("roles") or {}).get(name) or {}
    done = status.get("phase") in ("STOPPING", "DRAINING", "CLOSING") and role.get("status") == "done"
    return role.get("pid") if done else None


def test_an_actor_killed_once_the_run_reached_its_budget_leaves_it_finished(tmp_path, monkeypatch, launch):
    """The chaos run of the review: the run reached its budget, an actor that had reported done was
    SIGKILLed, its restart never came (its backoff outlasted the shutdown, or the coordinator refused
    it), and the launcher reported the finished run FAILED, exit 1, beside a summary that said
    finished with no failures."""
    config = one_actor(slow_env(tmp_path, monkeypatch), 400, restart_backoff_s=60.0, restart_backoff_max_s=60.0)
    config["cluster"]["actors"] = 2
    config["model"] = {"learner_step_sleep_s": 2.0}  # DRAINING waits for a step in flight
    proc, run_dir = launch(config)
    victim = wait_for(lambda: past_running_with(run_dir, "actor-0"), 120, "actor-0 done past RUNNING", 0.02)
    os.kill(victim, signal.SIGKILL)
    code, out = finish(proc, timeout_s=120)
    summary = read_json(run_dir / "summary.json")
    assert summary["outcome"] == "finished" and summary["ok"] and not summary["failures"], summary
    assert read_json(run_dir / "exits.json")["actor-0"] == -signal.SIGKILL
    assert code == 0, out
    assert "run directory" in out and "(ok)" in out and "(FAILED)" not in out, out


def test_a_stale_resume_variable_in_the_shell_does_not_make_a_new_run_continue_another(tmp_path, launch):
    """AIORL_RESUME_FROM, set by the launcher for its roles only, was passed on from the shell: a new
    run silently continued another run's checkpoint."""
    config = configured(RANDOM_CARTPOLE, agent={"scheduled_timesteps": 3000}, cluster={"actors": 1})
    for where in ("a", "b"):
        (tmp_path / where).mkdir()
    first, first_dir = launch(config, where=tmp_path / "a")
    code, out = finish(first, timeout_s=120)
    assert code == 0, out
    other = sorted((first_dir / "checkpoints").glob("checkpoint-*.pt"))[-1]
    assert read_json(first_dir / "summary.json")["env_steps"] >= 3000
    proc, run_dir = launch(config, env={ENV_RESUME_FROM: str(other)}, where=tmp_path / "b")
    code, out = finish(proc, timeout_s=120)
    assert code == 0, out
    assert "resuming from" not in out, out
    summary = read_json(run_dir / "summary.json")
    assert summary["resumed_from"] is None, summary["resumed_from"]
    first_row = next(r for r in metrics_rows(run_dir) if "env_steps" in r)
    assert first_row["env_steps"] < 3000, first_row


def test_a_whole_run_restart_is_never_held(tmp_path, monkeypatch, launch):
    """AIORL_HOLD_BEFORE_REGISTER held the first processes of a whole-run restart too (the docs say
    restarts are never held): attempt 2 stayed in STARTING until its start timeout failed it."""
    config = one_actor(slow_env(tmp_path, monkeypatch), 3000, start_timeout_s=60.0)
    config["run"] = {"checkpoint_interval_s": 1.0}
    proc, run_dir = launch(config, env={ENV_HOLD: "actor-0"})
    held = wait_for(lambda: next((p for p in [pids(run_dir).get("actor-0")] if p and stopped(p)), None), 60, "held")
    os.kill(held, signal.SIGCONT)  # the user lets it go on
    wait_for(lambda: stepping(run_dir, "actor-0"), 120, "actor-0 acting")
    learner = pids(run_dir)["learner-0"]
    os.kill(learner, signal.SIGKILL)  # not restarted in place: the whole run restarts
    wait_for(lambda: pids(run_dir).get("learner-0") not in (None, learner), 120, "attempt 2 started")
    second = pids(run_dir)["actor-0"]
    # Held, attempt 2's actor would stay in STARTING until cluster.start_timeout_s failed the run.
    wait_for(lambda: stepping(run_dir, "actor-0") == second, 50, "attempt 2's actor-0 acting")
    code, out = finish(proc, timeout_s=240)
    assert code == 0, out
    assert "run finished after 1 run restart(s)" in out, out


BROKEN_ENV = """
import gymnasium as gym
import numpy as np


class Broken(gym.Env):
    observation_space = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, seed=None, options=None):
        if {in_reset}:
            raise RuntimeError("the simulator is not installed")
        return np.zeros(4, np.float32), {{}}

    def step(self, action):
        return np.zeros(4, np.float32), 1.0, False, {{}}  # gym's old 4-tuple
"""


@pytest.mark.parametrize("in_reset", [True, False], ids=["reset-raises", "old-4-tuple-step"])
def test_an_env_error_that_repeats_at_the_same_point_fails_the_run_at_once_naming_it(
    tmp_path, monkeypatch, launch, in_reset
):
    """Such an actor was restarted cluster.max_restarts times, with backoff, over a minute, before the
    run failed; the cause was in its log only. Now its first restart failing the same way ends it."""
    (tmp_path / "broken_env.py").write_text(BROKEN_ENV.format(in_reset=in_reset))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    config = one_actor("broken_env:Broken", 1000, restart_backoff_s=0.2, restart_backoff_max_s=0.4, max_restarts=10)
    proc, run_dir = launch(config)
    code, out = finish(proc, timeout_s=180)
    assert code == 1, out
    error = "RuntimeError: the simulator is not installed" if in_reset else "ValueError: not enough values to unpack"
    named = [line for line in out.splitlines() if error in line and "the same error at the same point" in line]
    assert named and "a restart would fail the same way" in named[0], out
    summary = read_json(run_dir / "summary.json")
    assert summary["restarts"] == 1, summary["restarts"]  # the first restart failed the same way
    assert any("the same error at the same point as actor-0" in f for f in summary["failures"]), summary["failures"]


def test_a_coordinator_port_in_use_is_named_on_the_console(launch):
    """The launcher said only "exited before listening: exit code 2 (failed); see LOG"."""
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    try:
        config = configured(
            RANDOM_CARTPOLE, agent={"scheduled_timesteps": 1000}, cluster={"port": taken.getsockname()[1]}
        )
        proc, run_dir = launch(config)
        code, out = finish(proc, timeout_s=120)
    finally:
        taken.close()
    assert code == 1, out
    line = next(line for line in out.splitlines() if "exited before listening" in line)
    assert "address already in use" in line.lower() and f"{run_dir}/logs/memory-0.log" in line, out


def test_a_run_directory_deleted_mid_run_ends_the_run_in_one_line(launch):
    """The run reported (ok), exit 0, and its directory came back 0755 with its checkpoints."""
    config = configured(RANDOM_CARTPOLE, agent={"scheduled_timesteps": 10**9}, cluster={"actors": 1})
    config["run"] = {"checkpoint_interval_s": 3600.0}
    proc, run_dir = launch(config)
    wait_for(lambda: stepping(run_dir, "actor-0"), 120, "actor-0 acting")
    started = pids(run_dir)
    shutil.rmtree(run_dir)
    code, out = finish(proc, timeout_s=120)
    assert code == 1, out
    named = [line for line in out.splitlines() if f"the run directory {run_dir} was deleted mid-run" in line]
    assert len(named) == 1, out
    assert "Traceback" not in out, out
    assert not any(alive(pid) for pid in started.values())
    # Nothing made it again with wider permissions than the launcher gives it.
    assert not run_dir.exists() or run_dir.stat().st_mode & 0o077 == 0, oct(run_dir.stat().st_mode)
