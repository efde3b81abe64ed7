"""Checkpoint files: whole or refused, named when bad, newest kept, weights_only on read."""

import os

import pytest
import torch

from aiorl.io import checkpoint
from aiorl.io.checkpoint import CheckpointError


def state(value: float) -> dict:
    return {"w": torch.full((3,), value), "steps": 7, "rng": torch.get_rng_state(), "nested": {"a": [1, 2.5, None]}}


def test_round_trip_keeps_meta_and_state(tmp_path):
    path = checkpoint.save(tmp_path, 12, state(1.5), {"run": {"env_steps": 900}}, keep=3)
    assert path.name == "checkpoint-000000012.pt"
    meta, loaded = checkpoint.load(path)
    assert meta["learner_steps"] == 12 and meta["run"] == {"env_steps": 900}
    assert torch.equal(loaded["w"], torch.full((3,), 1.5)) and loaded["nested"] == {"a": [1, 2.5, None]}
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary file left behind


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda data: data[:-1] + bytes([data[-1] ^ 1]), "corrupt (SHA-256 mismatch)"),
        (
            lambda data: data[: len(data) // 2] + bytes([data[len(data) // 2] ^ 0xFF]) + data[len(data) // 2 + 1 :],
            "corrupt (SHA-256 mismatch)",
        ),
        (lambda data: data[: len(data) - 100], "truncated"),
        (lambda data: data[:30], "truncated"),
        (lambda data: data + b"x", "trailing bytes"),
        (lambda data: b"not a checkpoint at all", "not an aiorl checkpoint"),
    ],
)
def test_a_damaged_file_is_refused_by_name(tmp_path, damage, message):
    path = checkpoint.save(tmp_path, 5, state(2.0), {}, keep=3)
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(CheckpointError) as info:
        checkpoint.load(path)
    assert message in str(info.value) and path.name in str(info.value)


def test_newest_good_falls_back_past_bad_files_and_says_which(tmp_path):
    for steps in (100, 200, 300):
        checkpoint.save(tmp_path, steps, state(steps), {}, keep=5)
    newest = tmp_path / checkpoint.checkpoint_name(300)
    newest.write_bytes(newest.read_bytes()[:-10])
    path, meta, bad = checkpoint.newest_good(tmp_path)
    assert path.name == checkpoint.checkpoint_name(200) and meta["learner_steps"] == 200
    assert len(bad) == 1 and newest.name in str(bad[0])
    assert checkpoint.newest_good(tmp_path / "missing") == (None, None, [])


def test_only_the_newest_are_kept_ordered_by_steps(tmp_path):
    for steps in (9, 10, 100, 11):
        checkpoint.save(tmp_path, steps, state(0.0), {}, keep=2)
    assert [p.name for p in checkpoint.list_checkpoints(tmp_path)] == [
        checkpoint.checkpoint_name(11),
        checkpoint.checkpoint_name(100),
    ]


class Gadget:
    """Unpickling this would import and build an arbitrary class."""


def test_a_payload_with_code_is_refused_by_weights_only(tmp_path):
    # The checksum holds (the file is whole); the payload still may not run code when read.
    payload = checkpoint.serialize({"object": Gadget()})
    path = checkpoint.write_file(tmp_path, 1, payload, {}, keep=1)
    checkpoint.read_meta(path)
    with pytest.raises(CheckpointError, match="weights_only"):
        checkpoint.load(path)


def test_atomic_write_leaves_the_old_file_when_the_writer_fails(tmp_path):
    target = tmp_path / "f.bin"
    checkpoint.atomic_write(target, lambda f: f.write(b"old"))

    def broken(f):
        f.write(b"half")
        raise RuntimeError("disk on fire")

    with pytest.raises(RuntimeError):
        checkpoint.atomic_write(target, broken)
    assert target.read_bytes() == b"old" and os.listdir(tmp_path) == ["f.bin"]


def test_weights_that_blew_up_are_never_checkpointed(tmp_path):
    bad = {"model": {"w": torch.tensor([1.0, float("inf")])}, "optimizer": {"state": {0: {"step": 3}}}}
    with pytest.raises(CheckpointError, match=r"model\.w holds NaN or infinite values"):
        checkpoint.save(tmp_path, 1, bad, {}, keep=1)
    assert not list(tmp_path.iterdir())
    assert checkpoint.non_finite({"ids": torch.tensor([1, 2]), "x": [torch.zeros(2), {"y": torch.ones(1)}]}) is None
    assert checkpoint.non_finite({"x": [torch.zeros(2), {"y": torch.tensor([float("nan")])}]}) == "x.1.y"
