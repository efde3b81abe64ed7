"""Run directories belong to one run: refusal, locking, resume, launch ownership of files."""

import pytest
import torch

from aiorl.io import checkpoint
from aiorl.io.rundir import Identity, RunDir, RunDirError, latest_launch_id, read_json


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
        assert not (path / "coordinator.json").exists()
        assert latest_launch_id(path) == second.identity.launch_id
        assert read_json(path / "run.json")["attempts"][1]["overrides"] == ["agent.batch_size=8"]
    finally:
        second.close()


def test_resume_refuses_what_it_cannot_continue(tmp_path):
    with pytest.raises(RunDirError, match="not an aiorl run directory"):
        RunDir.resume(tmp_path)
    RunDir.create(tmp_path / "r").close()
    (tmp_path / "r" / "config.yaml").write_text("{}")
    with pytest.raises(RunDirError, match="no usable checkpoint"):
        RunDir.resume(tmp_path / "r")


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
