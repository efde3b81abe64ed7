"""Run directories and the files in them: modes, atomic writes, token mistakes caught up front."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys

import pytest

from aiorl.io import rundir
from aiorl.io.rundir import make_run_dir, write_json_atomic


def test_run_directories_are_owner_only_even_if_they_existed(tmp_path):
    fresh = make_run_dir(tmp_path / "runs" / "a")
    assert stat.S_IMODE(os.stat(fresh).st_mode) == 0o700
    existing = tmp_path / "open"
    existing.mkdir(mode=0o755)
    os.chmod(existing, 0o755)
    make_run_dir(existing)
    assert stat.S_IMODE(os.stat(existing).st_mode) == 0o700


def test_write_json_atomic_fsyncs_the_data_before_the_rename(tmp_path, monkeypatch):
    events = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(rundir.os, "fsync", lambda fd: (events.append("fsync"), real_fsync(fd)))
    monkeypatch.setattr(rundir.os, "replace", lambda a, b: (events.append("replace"), real_replace(a, b)))
    path = tmp_path / "summary.json"
    write_json_atomic(path, {"ok": True})
    assert events[:2] == ["fsync", "replace"]  # (then the directory's fsync)
    assert json.loads(path.read_text()) == {"ok": True}
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o644 & ~_umask()
    assert not (tmp_path / "summary.json.tmp").exists()


def test_write_json_atomic_does_not_follow_a_planted_symlink(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("precious")
    (tmp_path / "summary.json.tmp").symlink_to(victim)
    with pytest.raises(OSError):
        write_json_atomic(tmp_path / "summary.json", {"ok": True})
    assert victim.read_text() == "precious"


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@pytest.mark.parametrize("setting", ["env", "file"])
def test_a_weak_token_is_one_line_and_exit_2_before_anything_starts(tmp_path, setting):
    config = tmp_path / "cfg.json"
    config.write_text(json.dumps({"algo": "random_agent", "run": {"dir": str(tmp_path / "run")}}))
    env = {k: v for k, v in os.environ.items() if k != "AIORL_TOKEN"}
    args = [sys.executable, "-m", "aiorl", "run", str(config), "--quiet"]
    if setting == "env":
        env["AIORL_TOKEN"] = "too-short-0123456789"
    else:
        token = tmp_path / "token"
        token.write_text("too-short-0123456789\n")
        os.chmod(token, 0o600)
        args += ["--set", f"run.token_file={token}"]
    out = subprocess.run(args, capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("aiorl: token error:") and "at least 32" in lines[0]
    assert "Traceback" not in out.stderr and not (tmp_path / "run" / "logs").exists()
