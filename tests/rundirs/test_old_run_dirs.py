"""A run directory written by an earlier aiorl still evaluates and resumes.

tests/fixtures/run_before_layout is a whole run directory as aiorl wrote it before its
modules moved into packages (commit 2206e43): Ape-X DQN on CartPole-v1 with a 16-unit
network, 400 learner steps, its final checkpoint, the exported final and best policies,
metrics and summary. Nothing in a run directory names a module, so it must keep working.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

FIXTURE = Path(__file__).parents[1] / "fixtures" / "run_before_layout"
HANG_S = 300  # only bounds a hang


def run_aiorl(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "aiorl", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=HANG_S,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


@pytest.fixture
def old_run(tmp_path) -> Path:
    run_dir = tmp_path / "old-run"
    shutil.copytree(FIXTURE, run_dir)
    os.chmod(run_dir / "token", 0o600)  # git keeps no file modes but the executable bit
    return run_dir


def test_the_fixture_is_a_finished_run_of_the_old_layout():
    summary = json.loads((FIXTURE / "summary.json").read_text())
    assert summary["outcome"] == "finished" and summary["learner_steps"] >= 400
    assert sorted(p.name for p in (FIXTURE / "checkpoints").iterdir()) == ["checkpoint-000000403.pt"]


def test_aiorl_eval_of_an_old_run_directory(old_run, tmp_path):
    # Its policies are programs only (policy.pt2): loading one runs code from the file, so only when told.
    proc = run_aiorl("eval", str(old_run), "--episodes", "2", "--json", cwd=tmp_path)
    assert proc.returncode == 2 and "--trust-program" in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    proc = run_aiorl("eval", str(old_run), "--episodes", "2", "--json", "--trust-program", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["episodes"] == 2 and result["which"] == "best" and result["env"] == "CartPole-v1"
    proc = run_aiorl("eval", str(old_run), "--checkpoint", "403", "--episodes", "1", "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["which"] == "checkpoint"


def test_resume_of_an_old_run_directory_continues_from_its_checkpoint(old_run, tmp_path):
    proc = run_aiorl(
        "run", "--resume", str(old_run), "--quiet", "--set", "agent.scheduled_global_steps=600", cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = json.loads((old_run / "summary.json").read_text())
    assert summary["outcome"] == "finished"
    assert summary["resumed_from"]["checkpoint"].endswith("checkpoint-000000403.pt")
    assert summary["resumed_from"]["learner_steps"] == 403
    assert summary["learner_steps"] >= 600
    attempts = json.loads((old_run / "run.json").read_text())["attempts"]
    assert [a["attempt"] for a in attempts] == [1, 2]
