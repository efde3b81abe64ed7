"""The `launch` fixture (tests/cluster_helpers.py): a run it started is ended at the test's teardown even
when the test body fails mid-way, its launcher and every role, so that no test needs a `finally:` for it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from cluster_helpers import read_json, wait_for

pytestmark = pytest.mark.cluster

TESTS = Path(__file__).resolve().parents[1]

# Run by a pytest of its own: its launch fixture is the one every test here gets (tests/conftest.py).
FAILING = """
import json
import os
from pathlib import Path

import psutil
from cluster_helpers import cluster, live_status, pids, wait_for


def test_a_body_that_fails_mid_way(launch):
    proc, run_dir = launch(cluster(1, 1, 1, scheduled_timesteps=10**9))  # it never ends by itself
    wait_for(lambda: (live_status(run_dir) or {}).get("phase") == "RUNNING", 120, "RUNNING")
    started = {"launcher": proc.pid, **pids(run_dir)}  # the run directory's pids.json names the roles
    processes = {name: [pid, psutil.Process(pid).create_time()] for name, pid in started.items()}
    Path(os.environ["LAUNCHED"]).write_text(json.dumps(processes))
    raise AssertionError("the test body fails mid-way")
"""

CONFTEST = f"""
import sys

sys.path.insert(0, {str(TESTS)!r})
from cluster_helpers import launch  # noqa: E402, F401
"""


def running(pid: int, created: float) -> bool:
    """Whether that process (not another one given its pid since) still runs."""
    try:
        process = psutil.Process(pid)
        return process.create_time() == created and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_a_launched_run_whose_test_fails_mid_way_is_ended_at_teardown(tmp_path):
    (tmp_path / "test_failing.py").write_text(FAILING)
    (tmp_path / "conftest.py").write_text(CONFTEST)
    launched = tmp_path / "launched.json"
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--basetemp={tmp_path / 'inner'}"],
        cwd=tmp_path,
        env={**os.environ, "LAUNCHED": str(launched)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = result.stdout + result.stderr
    assert result.returncode == 1 and "1 failed" in out and "the test body fails mid-way" in out, out
    processes = read_json(launched)
    assert {"launcher", "memory-0", "learner-0", "actor-0"} <= set(processes), processes
    try:
        # The launcher was killed and reaped before its pytest exited; each role ends with it.
        assert not running(*processes["launcher"]), "the launcher outlived its test"
        wait_for(
            lambda: not any(running(pid, created) for pid, created in processes.values()),
            30,
            "every role of the run to end",
        )
    finally:
        for pid, created in processes.values():  # what a broken fixture left behind
            if running(pid, created):
                psutil.Process(pid).kill()
