"""Restart policy: budget per role, backoff, which roles and exits are restarted."""

import signal

import pytest

from aiorl.runtime.phase import EXIT_COORDINATOR_LOST, EXIT_FAILED, EXIT_OK, EXIT_REFUSED, interrupted_exit_code
from aiorl.runtime.restart import RestartPolicy, restartable


def test_backoff_doubles_on_quick_failures_and_resets_after_a_healthy_run():
    policy = RestartPolicy(max_restarts=10, backoff_s=0.5, backoff_max_s=3.0, healthy_after_s=60)
    delays = [policy.decide("actor-0", -signal.SIGKILL, ran_s=1.0) for _ in range(5)]
    assert delays == [0.5, 1.0, 2.0, 3.0, 3.0]
    assert policy.decide("actor-0", EXIT_FAILED, ran_s=120.0) == 0.5  # it had run long: start over
    assert policy.decide("actor-1", -signal.SIGSEGV, ran_s=0.1) == 0.5  # per role
    assert policy.restarts == {"actor-0": 6, "actor-1": 1}
    assert [h["restart"] for h in policy.history if h["role"] == "actor-0"] == [1, 2, 3, 4, 5, 6]


def test_the_budget_is_per_role_for_the_whole_run():
    policy = RestartPolicy(max_restarts=2)
    assert policy.decide("memory-1", -9, 0.0) is not None
    assert policy.decide("memory-1", -9, 100.0) is not None
    assert policy.decide("memory-1", -9, 100.0) is None and policy.left("memory-1") == 0
    assert RestartPolicy(max_restarts=0).decide("actor-0", -9, 0.0) is None


@pytest.mark.parametrize("code", [EXIT_OK, EXIT_COORDINATOR_LOST, EXIT_REFUSED])
def test_clean_exits_lost_coordinators_and_refusals_are_not_restarted(code):
    assert RestartPolicy(max_restarts=5).decide("actor-0", code, 0.0) is None


@pytest.mark.parametrize(
    "name, expected",
    [
        ("actor-0", True),
        ("actor-7", True),
        ("memory-1", True),
        ("memory-0", False),
        ("learner-0", False),
        ("learner-1", False),
    ],
)
def test_which_roles_are_restarted(name, expected):
    kind, _, index = name.rpartition("-")
    assert restartable(kind, int(index)) is expected
    assert (RestartPolicy(max_restarts=1).decide(name, -9, 0.0) is not None) is expected
    # A synchronous run's memory hosts hold its rounds: losing one restarts the whole run instead.
    in_sync = expected and kind == "actor"
    assert restartable(kind, int(index), synchronous=True) is in_sync
    assert (RestartPolicy(max_restarts=1, synchronous=True).decide(name, -9, 0.0) is not None) is in_sync


def test_exit_codes_of_an_interrupted_run():
    assert interrupted_exit_code("SIGINT") == 130 and interrupted_exit_code("SIGTERM") == 143
    assert interrupted_exit_code(None) == 130


def test_a_restart_the_run_ended_without_is_ended_and_not_a_failure(tmp_path):
    """actor-1 was restarted, but the run ended before its new process registered: the
    coordinator's summary lists it as lost with restarts left. The launcher ends that
    process at once and does not count it; a role that really failed still counts."""
    import subprocess
    import sys

    from aiorl.experiment.loading import load_config
    from aiorl.io.rundir import RunDir
    from aiorl.launch.local import Child, LocalLauncher

    cfg = load_config("examples/apex_dqn_cartpole.yaml", ["cluster.max_restarts=2"])
    run = RunDir.create(tmp_path / "run")
    launcher = LocalLauncher(cfg, run, quiet=True)
    launcher.policy.restarts["actor-1"] = 1
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    procs = {"actor-0": [sys.executable, "-c", "raise SystemExit(1)"], "actor-1": sleeper, "actor-2": sleeper}
    for name, cmd in procs.items():
        launcher.children[name] = Child(name, subprocess.Popen(cmd))
    launcher.children["actor-0"].proc.wait()
    try:
        run.write_owned("summary.json", {"lost_with_restarts_left": ["actor-1", "actor-2"]})
        launcher._end_late_restarts(list(launcher.children.values()))
        assert launcher.children["actor-1"].proc.poll() is not None
        assert launcher.children["actor-2"].proc.poll() is None  # lost, but never restarted: not late
        launcher.children["actor-2"].proc.kill()
        launcher.children["actor-2"].proc.wait()
        failed = {c.name for c in launcher.failed_children({EXIT_OK})}
        assert failed == {"actor-0", "actor-2"}
    finally:
        for child in launcher.children.values():
            if child.proc.poll() is None:
                child.proc.kill()
                child.proc.wait()
        run.close()
