"""Run directories belong to one run: refusal, locking, resume, launch ownership of files."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from aiorl.io import checkpoint
from aiorl.io.rundir import Identity, RunDir, RunDirError, latest_launch_id, read_json

ROOT = Path(__file__).resolve().parents[2]


def test_a_new_run_takes_an_absent_or_empty_directory_only(tmp_path):
    run = RunDir.create(tmp_path / "a" / "b")
    owner = read_json(tmp_path / "a" / "b" / "run.json")
    assert owner["run_id"] == run.identity.run_id and owner["attempts"][0]["launch_id"] == run.identity.launch_id
    run.close()
    with pytest.raises(RunDirError, match=r"already holds a run .*aiorl run --resume"):
        RunDir.create(tmp_path / "a" / "b")
    (tmp_path / "empty").mkdir()
    RunDir.create(tmp_path / "empty").close()
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "notes.txt").write_text("mine")
    with pytest.raises(RunDirError, match="is not empty .*notes.txt.* holds no aiorl run"):
        RunDir.create(tmp_path / "used")
    (tmp_path / "file").write_text("")
    with pytest.raises(RunDirError, match="is a file"):
        RunDir.create(tmp_path / "file")


def test_one_launcher_at_a_time(tmp_path):
    run = RunDir.create(tmp_path / "r")
    checkpoint.save(tmp_path / "r" / "checkpoints", 1, {"w": torch.zeros(1)}, {}, keep=1)
    (tmp_path / "r" / "config.yaml").write_text("{}")
    with pytest.raises(RunDirError, match="in use by another"):
        RunDir.resume(tmp_path / "r")
    run.close()
    RunDir.resume(tmp_path / "r").close()


def test_resume_takes_the_newest_good_checkpoint_and_records_the_launch(tmp_path):
    path = tmp_path / "r"
    first = RunDir.create(path)
    (path / "config.yaml").write_text("{}")
    (path / "coordinator.json").write_text('{"port": 1}')  # a leftover of the first launch
    for steps in (10, 20):
        checkpoint.save(path / "checkpoints", steps, {"w": torch.zeros(1)}, {"run": {"env_steps": steps}}, keep=3)
    newest = path / "checkpoints" / checkpoint.checkpoint_name(20)
    newest.write_bytes(newest.read_bytes()[:-1])
    first.close()
    second = RunDir.resume(path, ["agent.batch_size=8"])
    try:
        assert second.identity.run_id == first.identity.run_id
        assert second.identity.launch_id != first.identity.launch_id and second.identity.attempt == 2
        assert second.identity.resume_from.endswith(checkpoint.checkpoint_name(10))
        assert len(second.skipped) == 1 and newest.name in str(second.skipped[0])
        assert f"set aside as {newest.name}.bad" in str(second.skipped[0]) and second.starting_over is None
        # Set aside: no longer a checkpoint, so learner 0's pruning never counts it among those kept.
        assert not newest.exists() and (path / "checkpoints" / f"{newest.name}.bad").exists()
        assert [p.name for p in checkpoint.list_checkpoints(path / "checkpoints")] == [checkpoint.checkpoint_name(10)]
        assert not (path / "coordinator.json").exists()
        assert latest_launch_id(path) == second.identity.launch_id
        attempt = read_json(path / "run.json")["attempts"][1]
        assert attempt["overrides"] == ["agent.batch_size=8"] and attempt["restart_from_scratch"] is False
        assert attempt["set_aside"] == [str(path / "checkpoints" / f"{newest.name}.bad")]
    finally:
        second.close()


def test_resume_refuses_a_directory_that_never_held_a_run(tmp_path):
    with pytest.raises(RunDirError, match="not an aiorl run directory"):
        RunDir.resume(tmp_path)
    RunDir.create(tmp_path / "r").close()
    with pytest.raises(RunDirError, match="has no config.yaml"):
        RunDir.resume(tmp_path / "r")


def test_resume_before_the_first_checkpoint_starts_the_run_again(tmp_path):
    path = tmp_path / "r"
    first = RunDir.create(path)
    first.close()
    (path / "config.yaml").write_text("{}")
    (path / "checkpoints").mkdir()
    garbage = path / "checkpoints" / checkpoint.checkpoint_name(50)
    garbage.write_bytes(b"half a checkpoint")
    second = RunDir.resume(path)
    try:
        assert second.identity.run_id == first.identity.run_id and second.identity.attempt == 2
        assert second.identity.resume_from is None and "AIORL_RESUME_FROM" not in second.identity.env()
        assert second.skipped == []  # nothing to fall back to: the line below says it all
        assert second.starting_over == (
            f"{path} has no usable checkpoint yet ({garbage} is not an aiorl checkpoint (bad magic); "
            f"set aside as {garbage.name}.bad); starting the run again from the beginning"
        )
        assert (path / "checkpoints" / f"{garbage.name}.bad").exists()
        attempt = read_json(path / "run.json")["attempts"][1]
        assert attempt["resume_from"] is None and attempt["restart_from_scratch"] is True
    finally:
        second.close()
    third = RunDir.resume(path)  # a requeue loop: again and again, never a dead end
    third.close()
    assert third.identity.attempt == 3 and third.starting_over.endswith(
        "yet; starting the run again from the beginning"
    )


def test_resume_never_imports_torch(tmp_path):
    # The launcher of `aiorl run --resume` chooses the checkpoint without torch (it starts fast), and
    # still falls back past a whole file whose payload torch would refuse.
    path = tmp_path / "r"
    RunDir.create(path).close()
    (path / "config.yaml").write_text("{}")
    good = checkpoint.save(path / "checkpoints", 10, {"w": torch.zeros(2)}, {}, keep=3)
    data = checkpoint.encode({"learner_steps": 20}, b"not a zip")
    checkpoint.atomic_write(path / "checkpoints" / checkpoint.checkpoint_name(20), lambda f: f.write(data))
    code = (
        "import sys\n"
        "from aiorl.io.rundir import RunDir\n"
        f"run = RunDir.resume({str(path)!r})\n"
        "assert 'torch' not in sys.modules, sorted(m for m in sys.modules if m.startswith('torch'))[:5]\n"
        "print(run.identity.resume_from)\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (str(ROOT), os.environ.get("PYTHONPATH"))))}
    result = subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == str(good)


def test_files_are_taken_only_from_this_launch(tmp_path):
    run = RunDir.create(tmp_path / "r")
    try:
        run.write_owned("summary.json", {"ok": True})
        assert run.read_owned("summary.json")["ok"] is True
        other = Identity(run.identity.run_id, "another-launch")
        (tmp_path / "r" / "summary.json").write_text(
            '{"ok": true, "run_id": "%s", "launch_id": "%s"}' % (other.run_id, other.launch_id)
        )
        assert run.read_owned("summary.json") is None
        (tmp_path / "r" / "summary.json").write_text('{"ok": tr')  # half written
        assert run.read_owned("summary.json") is None
    finally:
        run.close()


def test_identity_travels_through_the_environment():
    identity = Identity("run", "launch", 3, "/x/checkpoint-000000001.pt")
    assert Identity.from_env(identity.env()) == identity
    by_hand = Identity.from_env({})
    assert by_hand.launch_id and by_hand.run_id == "" and by_hand.attempt == 1


def test_runs_latest_points_at_the_newest_run_launched_there(tmp_path, monkeypatch):
    from aiorl.experiment.loading import load_config
    from aiorl.io.rundir import claim

    monkeypatch.chdir(tmp_path)
    data = {"algo": "random_agent", "env": {"id": "CartPole-v1"}, "agent": {"scheduled_timesteps": 100}}
    first = claim(load_config(data=data), None, [])
    first.close()
    assert os.readlink("runs/latest") == first.path.name  # relative: the runs folder can move
    monkeypatch.setattr(
        "aiorl.io.rundir.default_path", lambda algo, env: Path("runs") / f"{algo}-{env}-2"
    )  # a second name
    second = claim(load_config(data=data), None, [])
    second.close()
    assert os.readlink("runs/latest") == second.path.name != first.path.name
    assert (Path("runs/latest") / "config.yaml").is_file()
    # Resuming a run there makes it the newest launched.
    checkpoint.save(first.path / "checkpoints", 1, {"w": torch.zeros(1)}, {}, keep=1)
    claim(load_config(data=data), str(first.path), []).close()
    assert os.readlink("runs/latest") == first.path.name
    # A run.dir of the user's own touches no `latest` beside it.
    claim(load_config(data={**data, "run": {"dir": str(tmp_path / "mine" / "r")}}), None, []).close()
    assert not (tmp_path / "mine" / "latest").exists()
    # Nor does aiorl replace a `latest` that is not its link.
    os.unlink("runs/latest")
    os.mkdir("runs/latest")
    monkeypatch.setattr("aiorl.io.rundir.default_path", lambda algo, env: Path("runs") / f"{algo}-{env}-3")
    claim(load_config(data=data), None, []).close()
    assert Path("runs/latest").is_dir() and not Path("runs/latest").is_symlink()
