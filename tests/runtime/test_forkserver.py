"""The fork server (`aiorl.cli.forkserver`): a launch that names it (AIORL_FORKSERVER) gets a warm
spawner forked from it, which takes the launcher's environment, working directory and umask and
behaves as a spawner of its own (a session of its own, its roles end with the launcher); a client
it cannot stand in for (another import-time environment) or a server that is not there leaves the
launch to start its own spawner. Real `aiorl run` launches over real sockets; this module starts a
fork server of its own."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from cluster_helpers import alive, cluster, finish, live_status, pids, stopped, wait_for

from aiorl.runtime.hold import ENV_HOLD
from aiorl.runtime.warm_fork import ENV_FORKSERVER, spawner_from_forkserver

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    where = tmp_path_factory.mktemp("forkserver")
    path = str(where / "sock")
    proc = subprocess.Popen(
        [sys.executable, "-P", "-m", "aiorl.cli.forkserver", path],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        wait_for(lambda: os.path.exists(path), 120, "the fork server's socket")
        time.sleep(0.2)  # bound, then listening
        yield proc, path
    finally:
        proc.kill()
        proc.wait()


@pytest.fixture
def uses(server, monkeypatch):
    monkeypatch.setenv(ENV_FORKSERVER, server[1])
    return server[0]


def endless(**cluster_keys) -> dict:
    config = cluster(1, 1, 1, scheduled_timesteps=10**9)
    config["cluster"].update(cluster_keys)
    return config


def spawner_of(run_dir: Path) -> psutil.Process:
    return psutil.Process(psutil.Process(pids(run_dir)["memory-0"]).ppid())


def test_a_launch_forks_its_spawner_from_the_server_with_the_launchers_state(uses, tmp_path, launch, monkeypatch):
    # The launcher's environment reaches the roles through the spawner's: a role's first process
    # is held only if the spawner took this variable (/proc/PID/environ shows a process's first
    # environment, the fork server's here, so it cannot tell).
    monkeypatch.setenv(ENV_HOLD, "actor-0")
    old = os.umask(0o027)  # the launcher's, and so the spawner's
    try:
        proc, run_dir = launch(endless())
        wait_for(lambda: (run_dir / "pids.json").exists(), 60, "pids.json")
        spawner = spawner_of(run_dir)
    finally:
        os.umask(old)
    assert spawner.ppid() == uses.pid  # forked by the fork server, not started by the launcher
    assert os.getsid(spawner.pid) == spawner.pid  # a session of its own
    assert spawner.cwd() == str(tmp_path)
    assert "Umask:\t0027" in Path(f"/proc/{spawner.pid}/status").read_text()
    wait_for(lambda: stopped(pids(run_dir)["actor-0"]), 60, "actor-0 held before it registers")
    os.kill(pids(run_dir)["actor-0"], signal.SIGCONT)
    wait_for(lambda: live_status(run_dir) and live_status(run_dir).get("phase") == "RUNNING", 60, "RUNNING")
    roles = pids(run_dir)
    assert all(psutil.Process(pid).ppid() == spawner.pid for pid in roles.values())
    proc.send_signal(signal.SIGINT)
    code, out = finish(proc, 60)
    assert code == 130, out
    assert not any(alive(pid) for pid in roles.values())
    wait_for(lambda: not alive(spawner.pid), 30, "the forked spawner to end with its launcher")


def test_killing_the_launcher_outright_ends_the_forked_spawner_and_its_roles(uses, launch):
    proc, run_dir = launch(endless())
    wait_for(lambda: (run_dir / "pids.json").exists(), 60, "pids.json")
    spawner = spawner_of(run_dir)
    roles = pids(run_dir)
    assert spawner.ppid() == uses.pid
    proc.kill()
    proc.wait()
    for pid in [spawner.pid, *roles.values()]:
        wait_for(lambda: not alive(pid), 30, f"pid {pid} to end after the launcher was killed")
    assert uses.poll() is None  # the fork server serves on


def test_a_client_with_another_import_time_environment_is_refused_and_starts_its_own(uses, launch, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "3")  # torch would have read it at its import
    assert spawner_from_forkserver(os.environ[ENV_FORKSERVER]) is None
    proc, run_dir = launch(endless())
    wait_for(lambda: (run_dir / "pids.json").exists(), 60, "pids.json")
    assert spawner_of(run_dir).ppid() == proc.pid  # a spawner of its own
    proc.send_signal(signal.SIGINT)
    code, out = finish(proc, 60)
    assert code == 130, out


def test_a_server_that_is_not_there_leaves_the_launch_to_start_its_own(tmp_path, launch, monkeypatch):
    monkeypatch.setenv(ENV_FORKSERVER, str(tmp_path / "no-such-socket"))
    proc, run_dir = launch(endless())
    wait_for(lambda: (run_dir / "pids.json").exists(), 60, "pids.json")
    assert spawner_of(run_dir).ppid() == proc.pid
    proc.send_signal(signal.SIGINT)
    code, out = finish(proc, 60)
    assert code == 130, out
