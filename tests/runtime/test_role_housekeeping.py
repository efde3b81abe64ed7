"""Housekeeping (heartbeat stats, metrics rows, limits) never kills a role."""

from __future__ import annotations

import errno
import logging
import subprocess
import sys

from aiorl.experiment.loading import load_config
from aiorl.runtime.actor import ActorRole
from aiorl.runtime.coordinator import Coordinator

CONFIG = {"algo": "random_agent", "env": {"id": "CartPole-v1"}, "run": {"tensorboard": False}}


def emfile(*args, **kwargs):
    raise OSError(errno.EMFILE, "Too many open files")


def test_heartbeat_stats_survive_running_out_of_file_descriptors(tmp_path, monkeypatch):
    role = ActorRole(load_config(data=CONFIG, overrides=[f"run.dir={tmp_path}"]), 0, tmp_path, b"t" * 64)
    first = role._heartbeat_meta()["metrics"]["rss_bytes"]
    assert first > 0
    monkeypatch.setattr(role._process, "memory_info", emfile)
    assert role._heartbeat_meta()["metrics"]["rss_bytes"] == first  # the last good value


async def test_a_metrics_row_that_cannot_be_written_does_not_end_the_coordinator(tmp_path, caplog):
    coordinator = Coordinator(load_config(data=CONFIG, overrides=[f"run.dir={tmp_path}"]), tmp_path, b"t" * 64)
    try:
        coordinator._metrics.write = emfile
        with caplog.at_level(logging.ERROR, logger="aiorl.coordinator"):
            for _ in range(3):
                coordinator._write_metrics_row()
        assert "could not write a metrics row" in caplog.text
        assert coordinator.last_row["phase"] == "STARTING"
    finally:
        coordinator._metrics.close()


def test_roles_raise_their_soft_open_file_limit_to_the_hard_one():
    code = (
        "import resource\n"
        "soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (64, hard))\n"
        "from aiorl.runtime.resources import raise_open_file_limit\n"
        "now = raise_open_file_limit()\n"
        "assert now == resource.getrlimit(resource.RLIMIT_NOFILE), now\n"
        "assert now[0] == hard or (hard == resource.RLIM_INFINITY and now[0] > 64), now\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
