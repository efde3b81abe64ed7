"""Checkpoints never lost, a resume that always continues: real `aiorl run`s over loopback with
one checkpoint kept and corrupt files planted, a run killed before its first checkpoint, and the
first checkpoint written as soon as learning has started."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from cluster_helpers import alive, finish, last_metrics, pids, read_json, run, wait_for
from configs import APEX_CARTPOLE_TINY, RANDOM_CARTPOLE, configured, dppo_cartpole

from aiorl.io import checkpoint

pytestmark = pytest.mark.cluster

DPPO = dppo_cartpole(1, 1, 1, scheduled_timesteps=96)  # 3 iterations


def resume(tmp_path: Path, run_dir: Path, *sets: str) -> subprocess.Popen:
    args = [arg for value in sets for arg in ("--set", value)]
    return subprocess.Popen(
        [sys.executable, "-m", "aiorl", "run", "--resume", str(run_dir), "--quiet", *args],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def good_checkpoint(run_dir: Path) -> Path:
    """The newest checkpoint on disk that passes every check; fails the test if there is none."""
    path, _, bad = checkpoint.newest_good(run_dir / "checkpoints")
    assert path is not None, f"no good checkpoint on disk: {[str(e) for e in bad]}"
    return path


def corrupt_copy(source: Path, target: Path, at: float = 0.5) -> Path:
    """`source` with one byte flipped (at this fraction of its length), under `target`: its header
    and sizes look whole, its digest fails."""
    data = bytearray(source.read_bytes())
    data[int(len(data) * at)] ^= 0xFF
    target.write_bytes(bytes(data))
    return target


def test_resume_twice_past_corrupt_newer_files_with_one_checkpoint_kept(tmp_path, launch):
    code, out, run_dir = run(
        tmp_path, configured(APEX_CARTPOLE_TINY, agent={"scheduled_global_steps": 100}, run={"keep_checkpoints": 1})
    )
    assert code == 0, out
    run_dir = run_dir.resolve()  # as the launcher names files
    checkpoints = run_dir / "checkpoints"
    first_run = good_checkpoint(run_dir)
    stale = corrupt_copy(first_run, checkpoints / checkpoint.checkpoint_name(999_999_999))
    assert good_checkpoint(run_dir) == first_run

    (run_dir / "pids.json").unlink()  # so that pids() below waits for the resumed launch's own
    proc = launch.track(resume(tmp_path, run_dir, "agent.scheduled_global_steps=300"))
    pids(run_dir)
    # Newer-named than anything this launch writes, planted while it runs: with one file kept,
    # pruning by name alone deleted every checkpoint the launch wrote, and kept this one.
    later = corrupt_copy(
        stale.with_name(f"{stale.name}.bad"), checkpoints / checkpoint.checkpoint_name(999_999_998), at=0.75
    )
    code, out = finish(proc, 300)
    assert code == 0, out
    assert f"{stale} is corrupt (SHA-256 mismatch); set aside as {stale.name}.bad" in out
    assert later.exists()  # a bad file is neither counted among those kept nor deleted
    first_resume = good_checkpoint(run_dir)
    assert checkpoint.read_meta(first_resume)["learner_steps"] >= 300

    code, out = finish(resume(tmp_path, run_dir, "agent.scheduled_global_steps=400"), 300)
    assert code == 0, out
    assert f"{later} is corrupt (SHA-256 mismatch); set aside as {later.name}.bad" in out
    assert f"resuming from {first_resume}" in out
    assert checkpoint.read_meta(good_checkpoint(run_dir))["learner_steps"] >= 400
    owner = read_json(run_dir / "run.json")
    assert [a["resume_from"] for a in owner["attempts"]] == [None, str(first_run), str(first_resume)]
    assert [a.get("set_aside") for a in owner["attempts"]] == [None, [f"{stale}.bad"], [f"{later}.bad"]]


def kill_everything(proc: subprocess.Popen, run_dir: Path) -> None:
    started = pids(run_dir)
    for pid in [*started.values(), proc.pid]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait(30)
    wait_for(lambda: not any(alive(pid) for pid in started.values()), 30, "every process gone")


def test_a_run_killed_before_its_first_checkpoint_starts_again_then_continues(tmp_path, launch):
    # Pre-empted before its first checkpoint (here: with checkpoints off until the end, which a
    # SIGKILL never reaches), a run must start again, not refuse.
    cfg = configured(
        RANDOM_CARTPOLE,
        agent={"scheduled_global_steps": 10**9},
        run={"checkpoint_interval_s": None, "checkpoint_every": None},
    )
    proc, run_dir = launch(cfg)
    wait_for(lambda: (last_metrics(run_dir) or {}).get("learner_steps"), 120, "the first launch learning")
    kill_everything(proc, run_dir)
    assert checkpoint.list_checkpoints(run_dir / "checkpoints") == []
    (run_dir / "checkpoints").mkdir(exist_ok=True)
    garbage = run_dir / "checkpoints" / checkpoint.checkpoint_name(7)
    garbage.write_bytes(b"the start of a checkpoint, then nothing")

    sets = ("agent.scheduled_global_steps=40", "run.checkpoint_interval_s=60")
    code, out = finish(resume(tmp_path, run_dir, *sets), 300)
    assert code == 0, out
    real = run_dir.resolve()
    assert (
        f"aiorl: {real} has no usable checkpoint yet ({real}/checkpoints/{garbage.name} is not an aiorl checkpoint "
        f"(bad magic); set aside as {garbage.name}.bad); starting the run again from the beginning\n"
    ) in out
    owner = read_json(run_dir / "run.json")
    second = owner["attempts"][1]
    assert second["resume_from"] is None and second["restart_from_scratch"] is True
    summary = read_json(run_dir / "summary.json")
    assert summary["outcome"] == "finished" and summary["attempt"] == 2 and summary["run_id"] == owner["run_id"]
    assert summary["resumed_from"] is None
    learner = summary["roles"]["learner-0"]["stats"]
    assert learner["total_learner_steps"] == learner["learner_steps"] >= 40  # from step 0, not from a checkpoint
    attempts = [json.loads(line).get("attempt") for line in (run_dir / "metrics.jsonl").read_text().splitlines()[:-1]]
    assert attempts[0] == 1 and 2 in attempts  # the first launch's rows kept, the second's appended

    # The requeue loop's next round: now there is a checkpoint to continue from.
    code, out = finish(resume(tmp_path, run_dir, "agent.scheduled_global_steps=80"), 300)
    assert code == 0, out
    newest = good_checkpoint(run_dir)
    assert "no usable checkpoint" not in out and read_json(run_dir / "run.json")["attempts"][2]["resume_from"]
    assert checkpoint.read_meta(newest)["learner_steps"] >= 80


@pytest.mark.parametrize(
    "base, first_step",
    [(configured(RANDOM_CARTPOLE, agent={"publish_interval": 5, "scheduled_global_steps": 60}), 5), (DPPO, 1)],
    ids=["async: at learner step publish_interval", "synchronous: after the first iteration"],
)
def test_the_first_checkpoint_comes_with_the_first_weights_published(tmp_path, base, first_step):
    # An interval far longer than the run: only the early first checkpoint and the final one.
    cfg = configured(base, run={"checkpoint_interval_s": 3600, "keep_checkpoints": 10})
    code, out, run_dir = run(tmp_path, cfg)
    assert code == 0, out
    metas = [checkpoint.verify(p) for p in checkpoint.list_checkpoints(run_dir / "checkpoints")]
    assert [(m["reason"], m["learner_steps"]) for m in metas][0] == ("first", first_step)
    assert metas[-1]["reason"] == "final" and metas[-1]["learner_steps"] > first_step
    assert len(metas) == 2
