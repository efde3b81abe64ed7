"""Checkpoint files: whole or refused, named when bad, newest kept, weights_only on read."""

import contextlib
import io
import json
import os
import pickle
import re
import struct
import threading
import zipfile
from pathlib import Path
from unittest import mock

import pytest
import torch
from apex_helpers import build_example

from aiorl.experiment.loading import load_config
from aiorl.io import checkpoint, torch_archive
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


def write_raw(directory, steps: int, payload: bytes, meta: dict | None = None):
    """A checkpoint file as a writer that skips the payload check would leave it (the digest right)."""
    data = checkpoint.encode({**(meta or {}), "learner_steps": steps}, payload)
    return checkpoint.atomic_write(directory / checkpoint.checkpoint_name(steps), lambda f: f.write(data))


def test_a_payload_with_code_is_refused_by_weights_only(tmp_path):
    # The checksum holds (the file is whole); the payload still may not run code when read.
    payload = checkpoint.serialize({"object": Gadget()})
    path = write_raw(tmp_path, 1, payload)
    checkpoint.read_meta(path)
    with pytest.raises(CheckpointError, match="weights_only"):
        checkpoint.load(path)
    with pytest.raises(CheckpointError, match="global test_checkpoint.Gadget is not allowed"):
        checkpoint.verify(path)


def test_the_writer_refuses_a_payload_a_resume_would_refuse(tmp_path):
    payload = checkpoint.serialize({"object": Gadget()})
    with pytest.raises(CheckpointError, match=r"learner step 3 \(not written\).*Gadget is not allowed"):
        checkpoint.write_file(tmp_path, 3, payload, {}, keep=1)
    assert not list(tmp_path.iterdir())


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


# --- pruning never loses a checkpoint


def flip_a_byte(path, where: float = 0.5) -> None:
    data = bytearray(path.read_bytes())
    data[int(len(data) * where)] ^= 0xFF
    path.write_bytes(bytes(data))


def good_ones(directory) -> list[str]:
    return [p.name for p in checkpoint.list_checkpoints(directory) if checkpoint.is_good(p)]


def test_pruning_keeps_the_file_just_written_past_newer_named_bad_ones(tmp_path):
    # A resumed run writes lower step numbers than a stale file it left behind: with keep=1 the old
    # rule (keep the newest names) deleted each new checkpoint as soon as it was written.
    garbage = tmp_path / checkpoint.checkpoint_name(900)
    garbage.write_bytes(b"not a checkpoint at all")
    damaged = checkpoint.save(tmp_path, 800, state(8.0), {}, keep=5)
    flip_a_byte(damaged)  # its header and sizes still look whole: only its digest tells
    for steps in (5, 6):
        written = checkpoint.save(tmp_path, steps, state(float(steps)), {}, keep=1)
        assert written.exists() and good_ones(tmp_path) == [written.name]
    # Bad files are neither counted among those kept nor deleted: a resume names them and sets them aside.
    assert garbage.exists() and damaged.exists()
    assert not (tmp_path / checkpoint.checkpoint_name(5)).exists()  # a good one beyond keep goes


def test_the_new_file_is_on_disk_before_an_old_one_is_deleted(tmp_path, monkeypatch):
    old = checkpoint.save(tmp_path, 1, state(1.0), {}, keep=1)

    def disk_full(path, write):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(checkpoint, "atomic_write", disk_full)
    with pytest.raises(OSError):
        checkpoint.save(tmp_path, 2, state(2.0), {}, keep=1)
    assert checkpoint.newest_good(tmp_path)[0] == old


def test_pruning_counts_only_good_files_towards_keep(tmp_path):
    for steps in (1, 2):
        checkpoint.save(tmp_path, steps, state(1.0), {}, keep=3)
    newest_bad = write_raw(tmp_path, 50, b"not a zip")  # whole, digest right, payload refused
    checkpoint.save(tmp_path, 3, state(3.0), {}, keep=3)
    assert good_ones(tmp_path) == [checkpoint.checkpoint_name(s) for s in (1, 2, 3)]
    checkpoint.save(tmp_path, 4, state(4.0), {}, keep=3)
    assert good_ones(tmp_path) == [checkpoint.checkpoint_name(s) for s in (2, 3, 4)] and newest_bad.exists()


def test_pruning_notices_a_kept_file_changed_since_it_was_checked(tmp_path):
    kept = checkpoint.save(tmp_path, 1, state(1.0), {}, keep=2)
    checkpoint.save(tmp_path, 2, state(2.0), {}, keep=2)
    flip_a_byte(kept)  # damaged after its writer remembered it as good
    os.utime(kept, ns=(1, 1))
    assert not checkpoint.is_good(kept)
    checkpoint.save(tmp_path, 3, state(3.0), {}, keep=2)
    assert good_ones(tmp_path) == [checkpoint.checkpoint_name(2), checkpoint.checkpoint_name(3)]


# --- the payload: what torch.load(weights_only=True) accepts, checked without torch


def torch_archive_of(pickle_bytes: bytes, records: dict | None = None, version: bytes | None = b"3\n") -> bytes:
    """A torch.save-like zip around `pickle_bytes` (stored members under one directory)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as archive:
        archive.writestr("archive/data.pkl", pickle_bytes)
        if version is not None:
            archive.writestr("archive/version", version)
        for name, data in (records or {}).items():
            archive.writestr(f"archive/{name}", data)
    return buffer.getvalue()


def without_member(payload: bytes, member: str) -> bytes:
    source = zipfile.ZipFile(io.BytesIO(payload))
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as archive:
        for info in source.infolist():
            if info.filename != member:
                archive.writestr(info, source.read(info))
    return buffer.getvalue()


def every_kind_of_state() -> dict:
    net = torch.nn.Linear(3, 2)
    optimizer = torch.optim.Adam(net.parameters())
    net(torch.ones(1, 3)).sum().backward()
    optimizer.step()
    return {
        "model": net.state_dict(),
        "optimizer": optimizer.state_dict(),
        "rng": torch.get_rng_state(),
        "parameter": torch.nn.Parameter(torch.ones(2)),
        "view": torch.arange(10)[2:5],
        "empty": torch.empty(0),
        "dtypes": [torch.zeros(2, dtype=d) for d in (torch.float16, torch.bfloat16, torch.uint8, torch.bool)],
        "uint16": torch.zeros(2, dtype=torch.uint16),
        "complex": torch.zeros(2, dtype=torch.complex64),
        "plain": [1, -5, 2**80, 2.5, None, True, "s", b"bytes", (1, 2), {1, 2}, 1 + 2j, bytearray(b"ab")],
        "device": torch.device("cpu"),
        "size": torch.Size([2, 3]),
    }


def torch_refuses(payload: bytes) -> bool:
    try:
        torch.load(io.BytesIO(payload), weights_only=True)
    except Exception:
        return True
    return False


def test_the_payload_check_takes_what_torch_saves_of_every_kind_of_state(tmp_path):
    payload = checkpoint.serialize(every_kind_of_state())
    assert torch_archive.refusal(io.BytesIO(payload)) is None and not torch_refuses(payload)
    path = checkpoint.write_file(tmp_path, 7, payload, {"run": {"env_steps": 3}}, keep=1)
    assert checkpoint.verify(path)["learner_steps"] == 7


EXAMPLES = sorted(p.name for p in (Path(__file__).resolve().parents[2] / "examples").glob("*.yaml"))


@pytest.mark.parametrize("example", EXAMPLES)
def test_every_examples_learner_state_passes_the_payload_check(example):
    # Refusing a state torch would load is a checkpoint lost: a resume would start the run over.
    cfg = load_config(Path(__file__).resolve().parents[2] / "examples" / example)
    if hasattr(cfg.model, "device"):
        cfg.model.device = "cpu"
    payload = checkpoint.serialize(build_example(cfg).make_learner(0, 1, seed=0).state_dict())
    assert torch_archive.refusal(io.BytesIO(payload)) is None and not torch_refuses(payload)


REFUSED = {
    "not a zip": (b"not a zip", "not a torch.save archive"),
    "a forbidden global": (
        torch_archive_of(pickle.dumps({"run": os.system}, protocol=2)),
        f"global {os.system.__module__}.system is not allowed",
    ),
    "a protocol 4 pickle": (torch_archive_of(pickle.dumps({"a": 1}, protocol=4)), "opcode FRAME"),
    "a list at the top": (torch_archive_of(pickle.dumps([1], protocol=2)), "not a dict"),
    "no version record": (torch_archive_of(pickle.dumps({"a": 1}, protocol=2), version=None), "no version record"),
    "a bad version": (torch_archive_of(pickle.dumps({"a": 1}, protocol=2), version=b"0\n"), "record version"),
    "a storage without its record": (
        without_member(checkpoint.serialize({"w": torch.ones(4)}), "archive/data/0"),
        "storage 0 needs a record data/0 of 16 bytes",
    ),
    "a truncated pickle": (torch_archive_of(pickle.dumps({"a": 1}, protocol=2)[:-3]), "malformed pickle"),
    "items set on a list": (torch_archive_of(b"\x80\x02](K\x01K\x02us."), "SETITEMS of 2 items to a List"),
    "a dict built": (torch_archive_of(b"\x80\x02}K\x01b."), "BUILD of a Dict"),
}


@pytest.mark.filterwarnings("ignore:Detected pickle protocol 4")
@pytest.mark.parametrize("payload, message", REFUSED.values(), ids=REFUSED.keys())
def test_a_payload_torch_refuses_is_refused_without_torch(tmp_path, payload, message):
    assert torch_refuses(payload) or message == "not a dict"  # torch takes a list; a learner state is a dict
    path = write_raw(tmp_path, 1, payload)
    with pytest.raises(CheckpointError, match=re.escape(message)) as info:
        checkpoint.verify(path)
    assert path.name in str(info.value)


def test_a_member_failing_its_crc_is_refused(tmp_path):
    # Torch reads it without a word (one float changed); the digest is right: only the CRC tells.
    payload = bytearray(checkpoint.serialize({"w": torch.ones(4)}))
    member = zipfile.ZipFile(io.BytesIO(bytes(payload))).getinfo("archive/data/0")
    name_len, extra_len = struct.unpack_from("<HH", payload, member.header_offset + 26)
    payload[member.header_offset + 30 + name_len + extra_len] ^= 0xFF
    path = write_raw(tmp_path, 1, bytes(payload))
    with pytest.raises(CheckpointError, match="member archive/data/0 fails its CRC"):
        checkpoint.verify(path)


def test_the_allowed_globals_are_torchs_own():
    from torch._weights_only_unpickler import _get_allowed_globals

    allowed = _get_allowed_globals()
    assert torch_archive.ALLOWED_GLOBALS <= set(allowed)
    for name, size in torch_archive.STORAGE_ELEMENT_BYTES.items():
        dtype = torch.uint8 if name == "torch.storage.UntypedStorage" else allowed[name].dtype
        assert torch._utils._element_size(dtype) == size, name


def test_newest_good_falls_back_past_whole_files_whose_payload_would_not_load(tmp_path):
    good = checkpoint.save(tmp_path, 10, state(1.0), {}, keep=5)
    not_zip = write_raw(tmp_path, 20, b"not a zip")
    system = write_raw(tmp_path, 30, torch_archive_of(pickle.dumps({"run": os.system}, protocol=2)))
    path, meta, bad = checkpoint.newest_good(tmp_path)
    assert path == good and meta["learner_steps"] == 10
    assert [e.path for e in bad] == [system, not_zip]
    assert "is not allowed" in str(bad[0]) and "not a torch.save archive" in str(bad[1])


# --- safe reads


def test_a_symlink_under_a_checkpoint_name_is_refused(tmp_path):
    target = checkpoint.save(tmp_path / "elsewhere", 1, state(1.0), {}, keep=1)
    link = tmp_path / checkpoint.checkpoint_name(2)
    link.symlink_to(target)
    for read in (checkpoint.verify, checkpoint.read_meta, checkpoint.load):
        with pytest.raises(CheckpointError, match="is a symbolic link"):
            read(link)
    assert checkpoint.newest_good(tmp_path) == (None, None, [mock.ANY])


def call_with_deadline(function, *args, deadline_s: float = 30.0):
    """`function(*args)` in a thread: its result or exception, or a test failure if it hangs."""
    outcome: dict = {}

    def call():
        try:
            outcome["result"] = function(*args)
        except BaseException as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    thread.join(deadline_s)
    if thread.is_alive():
        pytest.fail(f"{function.__name__} hung on its argument (still blocked after {deadline_s} s)")
    return outcome


@pytest.mark.parametrize("reader", [checkpoint.verify, checkpoint.read_meta, checkpoint.newest_good])
def test_a_fifo_under_a_checkpoint_name_is_refused_without_hanging(tmp_path, reader):
    fifo = tmp_path / checkpoint.checkpoint_name(3)
    os.mkfifo(fifo)
    try:
        outcome = call_with_deadline(reader, tmp_path if reader is checkpoint.newest_good else fifo)
    finally:
        # Unblock a reader stuck in open(): a writer that opens (non-blocking fails with no reader).
        with contextlib.suppress(OSError):
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    error = outcome["result"][2][0] if reader is checkpoint.newest_good else outcome["error"]
    assert isinstance(error, CheckpointError) and "is not a regular file" in str(error)


def test_a_directory_under_a_checkpoint_name_is_refused(tmp_path):
    (tmp_path / checkpoint.checkpoint_name(4)).mkdir()
    with pytest.raises(CheckpointError, match="is not a regular file"):
        checkpoint.verify(tmp_path / checkpoint.checkpoint_name(4))


@pytest.fixture
def bytes_read(monkeypatch):
    """Counts what checkpoint reads (os.pread) and the largest piece it asks for at once
    (`Opened.read_at`); past 256 MiB read in all the test fails rather than fill the memory."""
    counted = {"bytes": 0, "largest": 0}
    pread, read_at = os.pread, checkpoint.Opened.read_at

    def counting_pread(fd, n, offset):
        data = pread(fd, n, offset)
        counted["bytes"] += len(data)
        assert counted["bytes"] <= 256 << 20, "read far more than a header"
        return data

    def counting_read_at(self, offset, n):
        counted["largest"] = max(counted["largest"], n)
        return read_at(self, offset, n)

    monkeypatch.setattr(os, "pread", counting_pread)
    monkeypatch.setattr(checkpoint.Opened, "read_at", counting_read_at)
    return counted


HUGE = 10 << 30


def sparse(path, head: bytes = b"", size: int = HUGE):
    with open(path, "wb") as f:
        f.write(head)
    os.truncate(path, size)
    return path


def header(meta: bytes, payload_len: int) -> bytes:
    return checkpoint.MAGIC + struct.pack("<IQ", 1, len(meta)) + meta + struct.pack("<Q", payload_len)


@pytest.mark.parametrize(
    "head, message",
    [
        (b"", "not an aiorl checkpoint (bad magic)"),
        (header(b"{}", 5 << 30), f"truncated or has trailing bytes ({HUGE} bytes, expected"),
        (checkpoint.MAGIC + struct.pack("<IQ", 1, 1 << 40), "its meta block says 1099511627776"),
    ],
    ids=["zeros", "payload size wrong", "meta size absurd"],
)
def test_a_huge_file_that_is_not_a_checkpoint_is_refused_without_reading_it(tmp_path, bytes_read, head, message):
    path = sparse(tmp_path / checkpoint.checkpoint_name(5), head)
    for read in (checkpoint.verify, checkpoint.read_meta, checkpoint.read):
        with pytest.raises(CheckpointError, match=re.escape(message)):
            read(path)
    assert bytes_read["bytes"] < 1 << 20


def test_meta_is_read_without_the_payload(tmp_path, bytes_read):
    meta = json.dumps({"run": {"env_steps": 12}}).encode()
    path = sparse(tmp_path / checkpoint.checkpoint_name(6), header(meta, HUGE - len(header(meta, 0)) - 32))
    assert checkpoint.read_meta(path) == {"run": {"env_steps": 12}}
    assert bytes_read["bytes"] < 1 << 20


def test_the_digest_is_checked_in_chunks(tmp_path, bytes_read):
    path = checkpoint.save(tmp_path, 1, {"w": torch.zeros(3 << 20)}, {}, keep=1)  # 12 MiB of weights
    checkpoint.verify(path)
    assert bytes_read["bytes"] >= path.stat().st_size and bytes_read["largest"] <= checkpoint.CHUNK_BYTES
    flip_a_byte(path)
    with pytest.raises(CheckpointError, match="SHA-256 mismatch"):
        checkpoint.verify(path)


# --- setting a file aside


def test_a_file_set_aside_gets_a_name_of_its_own(tmp_path):
    names = []
    for _ in range(3):
        path = write_raw(tmp_path, 9, b"not a zip")
        names.append(checkpoint.set_aside(path).name)
    assert names == ["checkpoint-000000009.pt.bad", "checkpoint-000000009.pt.bad.2", "checkpoint-000000009.pt.bad.3"]
    assert checkpoint.list_checkpoints(tmp_path) == []


# --- what the launcher's check cannot see: learner 0 sets the file aside


class Core:
    """A learner core as far as loading a checkpoint goes."""

    def load_checkpoint(self, path: str) -> dict:
        return checkpoint.load(path)[0]


# Digest right, payload check passed (an allowed rebuild function), yet torch's call of it fails.
BAD_ARGUMENTS = torch_archive_of(b"\x80\x02}q\x00X\x01\x00\x00\x00wq\x01ctorch._utils\n_rebuild_tensor_v2\nq\x02)Rs.")


def test_a_chosen_file_learner_0_cannot_load_is_set_aside_for_the_next_resume(tmp_path):
    from aiorl.runtime.learner_outputs import load_resume_checkpoint

    previous = checkpoint.save(tmp_path, 10, state(1.0), {}, keep=5)
    chosen = write_raw(tmp_path, 20, BAD_ARGUMENTS)
    assert checkpoint.newest_good(tmp_path)[0] == chosen  # what the launcher's check cannot see
    with pytest.raises(CheckpointError, match="weights_only") as info:
        load_resume_checkpoint(Core(), str(chosen), sets_aside=False)  # learner k > 0 leaves it
    assert chosen.exists() and "set aside" not in str(info.value)
    with pytest.raises(CheckpointError, match=r"set aside as checkpoint-000000020\.pt\.bad: `aiorl run --resume`"):
        load_resume_checkpoint(Core(), str(chosen), sets_aside=True)
    assert not chosen.exists() and checkpoint.newest_good(tmp_path)[0] == previous
    assert load_resume_checkpoint(Core(), str(previous), sets_aside=True)["learner_steps"] == 10


def test_a_chosen_file_that_cannot_be_read_stays_where_it_is(tmp_path):
    from aiorl.runtime.learner_outputs import load_resume_checkpoint

    missing = tmp_path / checkpoint.checkpoint_name(30)
    with pytest.raises(checkpoint.CheckpointUnreadable, match="cannot read"):
        load_resume_checkpoint(Core(), str(missing), sets_aside=True)
    assert list(tmp_path.iterdir()) == []
