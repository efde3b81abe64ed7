"""A checkpoint's size is checked against its own records before it is hashed or read whole, and a
write that fails (a full disk) leaves no temporary file and says so in one line (issue 44)."""

import errno
import io
import os
import re
import struct
import zipfile

import pytest
import torch

from aiorl.io import checkpoint
from aiorl.io.checkpoint import CheckpointError, WriteError

HOLE = 3 << 30  # a sparse stretch: no disk, and reading it would take seconds


@pytest.fixture
def bytes_read(monkeypatch):
    """What checkpoint reads through os.pread, in all; past 64 MiB the test fails at once."""
    counted = {"bytes": 0}
    pread = os.pread

    def counting(fd, n, offset):
        data = pread(fd, n, offset)
        counted["bytes"] += len(data)
        assert counted["bytes"] <= 64 << 20, "read far more than the payload's records"
        return data

    monkeypatch.setattr(os, "pread", counting)
    return counted


def real_payload() -> bytes:
    return checkpoint.serialize({"w": torch.ones(4), "step": 3})


def directory_of(payload: bytes) -> tuple[int, bytes]:
    """(offset, bytes) of a torch.save archive's central directory entries."""
    archive = zipfile.ZipFile(io.BytesIO(payload))
    start = archive.start_dir
    end = payload.index(b"PK\x06\x06", start) if b"PK\x06\x06" in payload[start:] else payload.index(b"PK\x05\x06")
    return start, payload[start:end], len(archive.infolist())


def end_record(entries: int, directory_size: int, directory_offset: int) -> bytes:
    return struct.pack("<4sHHHHIIH", b"PK\x05\x06", 0, 0, entries, entries, directory_size, directory_offset, 0)


def checkpoint_file(path, parts: list[bytes | int]) -> None:
    """A checkpoint whose payload is `parts` (bytes, or an int: a hole of that many bytes), with a
    right header and a zero digest (the digest is never reached)."""
    payload_len = sum(p if isinstance(p, int) else len(p) for p in parts)
    meta = b"{}"
    with open(path, "wb") as f:
        f.write(checkpoint.MAGIC + struct.pack("<IQ", 1, len(meta)) + meta + struct.pack("<Q", payload_len))
        for part in parts:
            if isinstance(part, int):
                f.seek(part, os.SEEK_CUR)
            else:
                f.write(part)
        f.write(bytes(checkpoint.DIGEST_BYTES))


def hole_after_the_payload(path):
    # The real payload, then GiBs of nothing: its end record is not where the payload ends.
    checkpoint_file(path, [real_payload(), HOLE])


def hole_before_the_directory(path):
    # The real members, GiBs no member holds, then the directory (offsets right, end record moved).
    payload = real_payload()
    start, directory, count = directory_of(payload)
    checkpoint_file(path, [payload[:start], HOLE, directory, end_record(count, len(directory), start + HOLE)])


def a_record_no_tensor_names(path):
    # A stored member of GiBs the pickle never names: its sizes add up, its pickle does not.
    payload = real_payload()
    start, directory, count = directory_of(payload)
    name = b"archive/data/99"
    local = struct.pack("<4sHHHHHIIIHH", b"PK\x03\x04", 20, 0, 0, 0, 0, 0, HOLE, HOLE, len(name), 0) + name
    central = struct.pack(
        "<4sHHHHHHIIIHHHHHII", b"PK\x01\x02", 20, 20, 0, 0, 0, 0, 0, HOLE, HOLE, len(name), 0, 0, 0, 0, 0, start
    )
    directory += central + name
    offset = start + len(local) + HOLE
    checkpoint_file(path, [payload[:start], local, HOLE, directory, end_record(count + 1, len(directory), offset)])


CRAFTED = {
    "a hole after the payload": (hole_after_the_payload, "does not end with a zip end record"),
    "a hole before the directory": (hole_before_the_directory, f"{HOLE} bytes before the central directory"),
    "a record no tensor names": (a_record_no_tensor_names, f"record data/99 ({HOLE} bytes) holds no tensor"),
}


@pytest.mark.parametrize("name", CRAFTED, ids=list(CRAFTED))
def test_a_sparse_checkpoint_larger_than_its_records_is_refused_before_it_is_hashed(tmp_path, bytes_read, name):
    make, message = CRAFTED[name]
    path = tmp_path / checkpoint.checkpoint_name(8)
    make(path)
    assert path.stat().st_size > HOLE and path.stat().st_blocks * 512 < 1 << 20  # sparse
    for read in (checkpoint.verify, checkpoint.read, checkpoint.load):  # resume; aiorl eval --checkpoint
        with pytest.raises(CheckpointError, match=re.escape(message)) as info:
            read(path)
        assert "\n" not in str(info.value) and path.name in str(info.value)
    assert bytes_read["bytes"] < 1 << 20
    assert checkpoint.newest_good(tmp_path)[0] is None


def test_a_real_checkpoint_passes_the_size_check(tmp_path, bytes_read):
    state = {"w": torch.ones(1 << 20), "b": torch.zeros(3), "nested": {"x": [torch.arange(5)]}, "n": 7}
    path = checkpoint.save(tmp_path, 4, state, {"run": {}}, keep=1)
    assert checkpoint.verify(path)["learner_steps"] == 4
    assert torch.equal(checkpoint.load(path)[1]["w"], state["w"])


def test_a_small_file_damaged_in_its_zip_directory_is_named_corrupt(tmp_path):
    path = checkpoint.save(tmp_path, 5, {"w": torch.ones(4)}, {}, keep=1)
    data = bytearray(path.read_bytes())
    data[data.rindex(b"PK\x01\x02") + 46] ^= 0xFF  # the name of the last central directory entry
    path.write_bytes(bytes(data))
    for read in (checkpoint.verify, checkpoint.read):
        with pytest.raises(CheckpointError, match=r"is corrupt \(SHA-256 mismatch\)"):
            read(path)


# ---------------------------------------------------------------------------- a full disk


def no_space(*args):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_a_full_disk_leaves_no_temporary_file_and_names_the_checkpoint(tmp_path, monkeypatch):
    old = checkpoint.save(tmp_path, 1, {"w": torch.ones(3)}, {}, keep=2)
    monkeypatch.setattr(os, "fsync", no_space)
    with pytest.raises(WriteError) as info:
        checkpoint.save(tmp_path, 2, {"w": torch.ones(3)}, {}, keep=2)
    message = str(info.value)
    assert message == (
        f"{tmp_path / checkpoint.checkpoint_name(2)}: checkpoint at learner step 2 not written "
        "(No space left on device); no partial file left"
    )
    assert isinstance(info.value, OSError) and info.value.errno == errno.ENOSPC  # callers catch OSError
    assert os.listdir(tmp_path) == [old.name]


def test_a_write_that_fails_half_way_leaves_no_temporary_file(tmp_path):
    def half(f):
        f.write(b"half")
        no_space()

    target = tmp_path / "snapshot.npz"
    with pytest.raises(WriteError, match=r"snapshot\.npz: replay snapshot not written \(No space left on device\)"):
        checkpoint.atomic_write(target, half, "replay snapshot")
    with pytest.raises(WriteError, match="the file not written"):
        checkpoint.atomic_write(target, half)
    assert os.listdir(tmp_path) == []
