"""A resume that reaches its budget: real `aiorl run`s over loopback with a learner-step budget,
crashed after learner 0 stepped past a checkpoint (the launcher SIGKILLed, then `aiorl run
--resume`; memory host 0 SIGKILLed, then the run's own restart). The run's learner steps start
where learner 0's do, so the resumed run ends on its budget, not short of it for ever."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from cluster_helpers import alive, finish, pids, read_json, wait_for
from configs import APEX_CARTPOLE_TINY, configured

from aiorl.io import checkpoint

pytestmark = pytest.mark.cluster

BUDGET = 4000
# A checkpoint every 100 learner steps, none by time: learner 0 soon steps past one. Heartbeats a
# second apart (the tests' default is 0.2 s): learner 0's own count is well past the run's totals
# its last heartbeat brought back when the coordinator goes.
CONFIG = configured(
    APEX_CARTPOLE_TINY,
    agent={"scheduled_global_steps": BUDGET},
    run={"checkpoint_every": 100, "checkpoint_interval_s": None, "keep_checkpoints": 3},
    cluster={"heartbeat_interval_s": 1.0},
)
# Bounds a hang (the resumed coordinator waiting for learner steps that never come), not the run.
RESUME_TIMEOUT_S = 240


def kill(pid: int, sig: int = signal.SIGKILL) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def newest_steps(run_dir: Path) -> int:
    """The learner steps of the newest checkpoint on disk (0: none yet), by its name: an older file
    may be pruned while this looks."""
    files = checkpoint.list_checkpoints(run_dir / "checkpoints")
    return int(checkpoint.CHECKPOINT_RE.match(files[-1].name).group(1)) if files else 0


def past_a_checkpoint(run_dir: Path) -> bool:
    """Learner 0 wrote a checkpoint and stepped on past it (to write the next): the run's totals
    its last heartbeat brought back are older than its own count by then."""
    return newest_steps(run_dir) >= 2 * CONFIG["run"]["checkpoint_every"]


def wait_past_a_checkpoint(proc: subprocess.Popen, run_dir: Path) -> None:
    def ready() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"the run ended before learner 0 stepped past a checkpoint:\n{proc.stdout.read()}")
        return past_a_checkpoint(run_dir)

    wait_for(ready, 180, "learner 0 stepping past a checkpoint")


def assert_reached_budget(code: int, out: str, run_dir: Path, learners: int = 1) -> dict:
    assert code == 0, out
    assert "reached scheduled_global_steps" in out, out
    summary = read_json(run_dir / "summary.json")
    assert summary["outcome"] == "finished", summary["stop_reason"]
    assert summary["stop_reason"].startswith("reached scheduled_global_steps"), summary["stop_reason"]
    assert summary["learner_steps"] >= BUDGET, summary["learner_steps"]
    resumed = summary["resumed_from"]
    assert resumed is not None
    # The run's learner steps started where its learners did, each from learner 0's count, and
    # each learner stepped to its share of the budget: the run's total is the budget.
    for i in range(learners):
        learner = summary["roles"][f"learner-{i}"]["stats"]
        start = learner["total_learner_steps"] - learner["learner_steps"]
        assert resumed["learner_steps"] == learners * start > 0
        assert learner["total_learner_steps"] == BUDGET // learners
    assert summary["learner_steps"] == BUDGET
    return summary


def test_a_resume_after_the_launcher_was_sigkilled_reaches_its_budget(tmp_path, launch):
    proc, run_dir = launch(CONFIG)
    wait_past_a_checkpoint(proc, run_dir)
    roles = pids(run_dir)
    # A job killed process by process: the launcher and memory host 0 (the coordinator) first.
    # The roles left end on their launcher's death and the coordinator's loss, learner 0 with a
    # last checkpoint; what is still there after a while is killed.
    kill(proc.pid)
    kill(roles["memory-0"])
    proc.wait()
    try:
        wait_for(lambda: not any(alive(pid) for pid in roles.values()), 60, "the roles ending")
    finally:
        for pid in roles.values():
            kill(pid)
    wait_for(lambda: not any(alive(pid) for pid in roles.values()), 30, "every role gone")
    (run_dir / "pids.json").unlink()
    resumed = launch.track(
        subprocess.Popen(
            [sys.executable, "-m", "aiorl", "run", "--resume", str(run_dir), "--quiet"],
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        ),
        run_dir,
    )
    code, out = finish(resumed, RESUME_TIMEOUT_S)
    summary = assert_reached_budget(code, out, run_dir)
    assert summary["attempt"] == 2


@pytest.mark.parametrize("learners", [1, 2])
def test_the_restart_after_memory_host_0_was_sigkilled_reaches_its_budget(tmp_path, launch, learners):
    proc, run_dir = launch(configured(CONFIG, cluster={"learners": learners}))
    wait_past_a_checkpoint(proc, run_dir)
    kill(pids(run_dir)["memory-0"])
    code, out = finish(proc, RESUME_TIMEOUT_S)
    assert "run finished after 1 run restart(s)" in out, out
    summary = assert_reached_budget(code, out, run_dir, learners)
    assert summary["run_restarts"] == 1
