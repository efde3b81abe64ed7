"""Survival with the defaults, for every algorithm, with real role processes over loopback: actors
SIGKILLed in STARTING (registered, or before registering) and again while RUNNING are restarted in
place and the run stops cleanly, nothing accepted lost or counted twice; a lost learner 0 or memory
host 0 makes the run restart itself from its newest checkpoint."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from cluster_helpers import alive, cluster, finish, last_metrics, live_status, pids, read_json, stopped, wait_for
from test_faults import assert_nothing_accepted_was_lost, metrics_rows
from test_impala_faults import assert_every_fragment_accounted_for

from aiorl.runtime.hold import ENV_HOLD

pytestmark = pytest.mark.cluster

ROOT = Path(__file__).resolve().parents[2]
# Each example with its own settings, its step budget made long enough not to end the run first and
# its target return dropped (the test stops it once its kills are done), and two actors, so that one
# can be held back while another dies.
CHAOS = {
    "apex_dqn": ("apex_dqn_cartpole", {"scheduled_global_steps": 10**6}),
    "apex_ddpg": ("apex_ddpg_pendulum", {"scheduled_global_steps": 10**6}),
    "dppo": ("dppo_cartpole", {"scheduled_timesteps": 10**8}),
    "es": ("es_cartpole", {"scheduled_global_steps": 10**5}),
    "impala": ("impala_cartpole", {"scheduled_timesteps": 10**8}),
    "r2d2": ("r2d2_cartpole_novel", {"scheduled_global_steps": 10**6}),
}
# Kills while RUNNING, each once the last successor steps. They are counted, not fitted into a
# stretch of wall-clock time: under load a restart's start took seconds (a role process of its own,
# before the warm spawner, 11 s and more), which let a 12 s window hold a single kill.
RUNNING_KILLS = 2


def example(name: str, **sections) -> dict:
    config = yaml.safe_load((ROOT / "examples" / f"{name}.yaml").read_text())
    for section, values in sections.items():
        config.setdefault(section, {}).update(values)
    return config


def kill(pid: int, sig: int = signal.SIGKILL) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def role_status(run_dir: Path) -> tuple[str | None, dict]:
    status = live_status(run_dir) or {}
    return status.get("phase"), status.get("roles") or {}


def registered(run_dir: Path, name: str, pid: int) -> bool:
    _, roles = role_status(run_dir)
    role = roles.get(name) or {}
    return role.get("pid") == pid and role.get("status") == "running"


def stepping(run_dir: Path, name: str, pid: int) -> bool:
    _, roles = role_status(run_dir)
    role = roles.get(name) or {}
    return role.get("pid") == pid and role.get("status") == "running" and role["counters"].get("env_steps", 0) > 0


def successor(run_dir: Path, name: str, old: int) -> int:
    wait_for(lambda: pids(run_dir)[name] != old, 60, f"{name} started again")
    return pids(run_dir)[name]


def kill_in_starting(run_dir: Path, actors: list[str], held: list[int]) -> list[str]:
    """Hold the run in STARTING (the last actor's first process stops itself before it registers:
    `AIORL_HOLD_BEFORE_REGISTER`), SIGKILL actor-0 once it registered and wait for its successor to
    register, still in STARTING; then SIGKILL the held actor, which never registered. Returns the
    victims; `held` gets the held pid (a stopped process cannot act on its parent-death signal: the
    caller ends it if this fails)."""
    held_name = actors[-1]
    wait_for(lambda: held_name in pids(run_dir) and stopped(pids(run_dir)[held_name]), 60, f"{held_name} held")
    started = pids(run_dir)
    held.append(started[held_name])
    assert "held before registering" in (run_dir / "logs" / f"{held_name}.log").read_text()
    wait_for(lambda: registered(run_dir, "actor-0", started["actor-0"]), 60, "actor-0 registered")
    assert role_status(run_dir)[0] == "STARTING"
    assert (role_status(run_dir)[1][held_name]["status"]) == "expected"  # held before it registered
    kill(started["actor-0"])
    new = successor(run_dir, "actor-0", started["actor-0"])
    wait_for(lambda: registered(run_dir, "actor-0", new), 60, "actor-0's successor registered")
    phase, roles = role_status(run_dir)
    assert phase == "STARTING" and roles["actor-0"]["restarts"] == 1, (phase, roles["actor-0"])
    kill(started[held_name])  # SIGKILL ends a stopped process too; its successor is not held
    return ["actor-0", held_name]


def chaos(proc: subprocess.Popen, run_dir: Path, actors: list[str], rng: random.Random) -> tuple[list, list]:
    """While RUNNING, RUNNING_KILLS times: SIGKILL a random stepping actor, wait for its successor to
    step, rest a moment. Returns the victims and each restart's seconds from the kill to the
    successor stepping."""
    wait_for(lambda: role_status(run_dir)[0] == "RUNNING", 120, "RUNNING")
    victims, lost_s = [], []
    while proc.poll() is None and len(victims) < RUNNING_KILLS:
        now = pids(run_dir)
        ready = [name for name in actors if stepping(run_dir, name, now[name])]
        if not ready or role_status(run_dir)[0] != "RUNNING":
            time.sleep(0.1)
            continue
        victim = rng.choice(ready)
        killed_at = time.monotonic()
        kill(now[victim])
        victims.append(victim)
        new = successor(run_dir, victim, now[victim])
        wait_for(lambda: stepping(run_dir, victim, new) or proc.poll() is not None, 60, f"{victim}'s successor")
        lost_s.append(round(time.monotonic() - killed_at, 2))
        time.sleep(rng.uniform(0.5, 1.5))
    return victims, lost_s


@pytest.mark.parametrize("algo", sorted(CHAOS))
def test_chaos_actors_killed_in_starting_and_running_are_restarted_and_the_run_finishes(launch, algo):
    name, agent = CHAOS[algo]
    config = example(
        name,
        agent={"target_return": None, **agent},
        cluster={"actors": 2, "restart_backoff_s": 0.2, "restart_backoff_max_s": 1.0},
    )
    actors = ["actor-0", "actor-1"]
    proc, run_dir = launch(config, env={ENV_HOLD: actors[-1]})
    held: list[int] = []
    try:
        victims = kill_in_starting(run_dir, actors, held)
        more, lost_s = chaos(proc, run_dir, actors, random.Random(algo))
        victims += more
        # Every successor steps: the run stops cleanly, through the same phases as at a stop criterion.
        proc.send_signal(signal.SIGINT)
        code, out = finish(proc, timeout_s=240)
    finally:
        for pid in held:  # stopped, it cannot act on its parent-death signal; pids.json names its successor
            kill(pid)
    print(f"{algo}: kills {victims}; seconds from a kill to the successor stepping: {lost_s}")
    assert code == 130, out  # interrupted, after a clean shutdown
    assert len(victims) == 2 + RUNNING_KILLS, victims  # two in STARTING, then those while RUNNING
    summary = read_json(run_dir / "summary.json")
    assert summary["ok"] and summary["outcome"] == "interrupted" and summary["signal"] == "SIGINT", summary
    assert not summary["failures"], summary["failures"]
    restarts = [h["role"] for h in read_json(run_dir / "restarts.json")["restarts"]]
    assert restarts == victims
    roles = summary["roles"]
    # The held actor never registered: its first process to register was its first admission.
    assert summary["restarts"] == len(victims) - 1
    assert all(r["status"] == "done" for r in roles.values()), {n: r["status"] for n, r in roles.items()}
    rows = [r for r in metrics_rows(run_dir) if "env_steps" in r]
    for key in ("env_steps", "learner_steps", "episodes"):
        values = [r[key] for r in rows]
        assert values == sorted(values), key
    if algo.startswith("apex") or algo == "r2d2":
        connections = roles["memory-0"]["stats"]["actors"]
        assert sum(len(a["connections"]) for a in connections.values()) <= len(victims) + 2
        assert_nothing_accepted_was_lost(roles, ["memory-0"], actors)
    elif algo == "impala":
        memory = roles["memory-0"]["stats"]
        assert_every_fragment_accounted_for(memory)
        for actor in actors:  # the last incarnation's own account matches the memory's
            last = memory["actors"][actor]["connections"][-1]
            assert last["finished"] and last["transitions"] == roles[actor]["stats"]["memories"][0]["transitions"]
    elif algo == "dppo":
        for actor in actors:  # the last incarnation acted in lock step with the learner's versions
            log = roles[actor]["stats"]["iterations"]
            assert log and [e["iteration"] for e in log] == [e["weights_version"] for e in log], log
    assert not any(alive(pid) for pid in read_json(run_dir / "pids.json").values())


def test_a_lone_synchronous_actor_killed_mid_run_comes_back_and_the_learner_steps_past_its_round(launch):
    """DPPO with one actor: while it is away no round can complete; its successor joins the next
    iteration, the round it left closes empty, the learner skips it (no step) and the run goes on.
    The test ends the run (SIGINT, the phases of a stop criterion) once the learner stepped past."""
    config = example("dppo_cartpole", cluster={"actors": 1}, agent={"scheduled_timesteps": 10**8})
    proc, run_dir = launch(config)
    learner_log = run_dir / "logs" / "learner-0.log"
    wait_for(lambda: (last_metrics(run_dir) or {}).get("learner_steps", 0) > 0, 120, "learning")
    old = pids(run_dir)["actor-0"]
    kill(old)
    new = successor(run_dir, "actor-0", old)
    wait_for(lambda: stepping(run_dir, "actor-0", new), 60, "the successor stepping")
    wait_for(lambda: "every actor was away (restarting); no step" in learner_log.read_text(), 60, "the skip")
    # Two more steps, each on a round only the successor can have delivered.
    steps = (live_status(run_dir) or {})["learner_steps"]
    past = lambda: (live_status(run_dir) or {}).get("learner_steps", 0) >= steps + 2  # noqa: E731
    wait_for(past, 120, "the learner stepping past it")
    proc.send_signal(signal.SIGINT)
    code, out = finish(proc, timeout_s=240)
    assert code == 130, out  # interrupted, after a clean shutdown
    summary = read_json(run_dir / "summary.json")
    assert summary["ok"] and summary["outcome"] == "interrupted", summary
    assert summary["restarts"] == 1 and not summary["failures"]
    assert summary["learner_steps"] >= steps + 2
    log = summary["roles"]["actor-0"]["stats"]["iterations"]
    assert [e["iteration"] for e in log] == [e["weights_version"] for e in log]


def test_every_process_sigkilled_10_s_after_launch_then_resume_completes_the_run(launch):
    """A pre-empted job: the launcher and every role SIGKILLed at once, 10 s after launch (before or
    after the first checkpoint, whichever the machine's speed gives); `--resume` completes the run."""
    config = example("dppo_cartpole")
    proc, run_dir = launch(config)
    launched = time.monotonic()
    roles = pids(run_dir)
    time.sleep(max(0.0, 10.0 - (time.monotonic() - launched)))
    assert proc.poll() is None, "the run ended before it could be killed"
    for pid in [proc.pid, *pids(run_dir).values(), *roles.values()]:
        kill(pid)
    proc.wait()
    wait_for(lambda: not any(alive(pid) for pid in pids(run_dir).values()), 30, "every role gone")
    before = read_json(run_dir / "run.json")["run_id"]
    resumed = aiorl("run", "--resume", str(run_dir), "--quiet", timeout_s=400)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    summary = read_json(run_dir / "summary.json")
    assert summary["outcome"] == "finished" and summary["env_steps"] >= 100_000, summary["stop_reason"]
    assert summary["run_id"] == before and summary["attempt"] == 2
    owner = read_json(run_dir / "run.json")
    assert len(owner["attempts"]) == 2
    resume_from = owner["attempts"][1]["resume_from"]
    # Continued from its checkpoint if it had one, else started over, and said which.
    assert (resume_from is None) == ("starting the run again from the beginning" in resumed.stderr), resumed.stderr
    assert not any(alive(pid) for pid in read_json(run_dir / "pids.json").values())


def aiorl(*args: str, timeout_s: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "aiorl", *args], capture_output=True, text=True, timeout=timeout_s, cwd=ROOT
    )


@pytest.mark.slow  # it ends on the example's learning bar
@pytest.mark.parametrize(
    "victim, name, bar",
    [("learner-0", "dppo_cartpole", 475.0), ("memory-0", "apex_dqn_cartpole", 475.0)],
)
def test_a_lost_learner_0_or_memory_0_restarts_the_whole_run_from_its_checkpoint(launch, victim, name, bar):
    config = example(name, run={"checkpoint_interval_s": 2.0})
    proc, run_dir = launch(config)
    # The first checkpoint comes at the first publication, the next one 2 s later, with counts.
    wait_for(lambda: len(list((run_dir / "checkpoints").glob("checkpoint-*.pt"))) >= 2, 120, "2 checkpoints")
    wait_for(lambda: (last_metrics(run_dir) or {}).get("learner_steps", 0) > 0, 60, "learning")
    first = pids(run_dir)
    killed_at = time.monotonic()
    kill(first[victim])
    wait_for(lambda: pids(run_dir).get(victim) not in (None, first[victim]), 120, "the run started again")
    back_s = wait_for(
        lambda: (
            (live_status(run_dir) or {}).get("phase") == "RUNNING"
            and (last_metrics(run_dir) or {}).get("attempt") == 2
            and time.monotonic() - killed_at
        ),
        120,
        "attempt 2 RUNNING",
    )
    code, out = finish(proc, timeout_s=400)
    print(f"{name}: {victim} killed; attempt 2 RUNNING {back_s:.1f} s later")
    assert code == 0, out
    assert "run finished after 1 run restart(s)" in out and f"attempt 1: {victim}" in out, out
    summary = read_json(run_dir / "summary.json")
    assert summary["outcome"] == "finished" and summary["run_restarts"] == 1, summary
    assert [a["attempt"] for a in summary["attempts"]] == [1, 2]
    assert victim in summary["attempts"][0]["cause"] and summary["attempts"][1]["cause"] is None
    resumed = summary["resumed_from"]
    assert resumed and summary["attempts"][1]["resume_from"] == resumed["checkpoint"]
    owner = read_json(run_dir / "run.json")
    assert [a.get("run_restart_cause") is not None for a in owner["attempts"]] == [False, True]
    rows = metrics_rows(run_dir)
    events = [r for r in rows if r.get("event") == "run_restart"]
    assert len(events) == 1 and victim in events[0]["cause"] and events[0]["attempt"] == 2
    # The counters go on from the checkpoint's: attempt 2's first row starts from them, not 0.
    second = [r for r in rows if r.get("attempt") == 2 and "env_steps" in r]
    assert second[0]["env_steps"] >= resumed["env_steps"] > 0
    evaluated = aiorl("eval", str(run_dir), "--episodes", "20", "--json")
    assert evaluated.returncode == 0, evaluated.stderr
    assert json.loads(evaluated.stdout)["mean"] >= bar, evaluated.stdout
    assert not any(alive(pid) for pid in [*first.values(), *read_json(run_dir / "pids.json").values()])


def learner_stepping(run_dir: Path) -> int | None:
    """learner-0's pid, once the coordinator of the current attempt has it running and stepping."""
    pid = pids(run_dir).get("learner-0")
    phase, roles = role_status(run_dir)
    role = roles.get("learner-0") or {}
    steps = (role.get("counters") or {}).get("learner_steps", 0)
    return pid if phase == "RUNNING" and role.get("pid") == pid and role.get("status") == "running" and steps else None


def test_a_run_whose_restart_budget_is_spent_fails_naming_every_cause(launch):
    config = cluster(1, 1, 1, scheduled_timesteps=10**9)
    config["cluster"]["max_run_restarts"] = 1
    config["run"] = {"checkpoint_interval_s": 1.0}
    proc, run_dir = launch(config)
    for attempt in (1, 2):
        wait_for(lambda: (last_metrics(run_dir) or {}).get("attempt") == attempt, 120, f"attempt {attempt}")
        # This attempt's own learner, registered and stepping: the run's counters go on from the
        # checkpoint (attempt 2's rows have learner steps at once), and a learner killed before it
        # registers is another loss, found only after cluster.start_timeout_s.
        learner = wait_for(lambda: learner_stepping(run_dir), 60, f"attempt {attempt}'s learner stepping")
        kill(learner)
        if attempt == 1:
            wait_for(lambda: read_json(run_dir / "run.json")["attempts"][-1]["attempt"] == 2, 120, "attempt 2")
    code, out = finish(proc, timeout_s=240)
    assert code == 1, out
    assert "its restart budget is spent (cluster.max_run_restarts=1)" in out, out
    summary = read_json(run_dir / "summary.json")
    assert summary["outcome"] == "failed" and summary["run_restart_budget_spent"] is True
    causes = [f for f in summary["failures"] if f.startswith("attempt ")]
    # Both the learners killed while stepping (neither lost for never registering).
    assert len(causes) == 2 and all("learner-0 exited: killed by SIGKILL" in c for c in causes), summary["failures"]
