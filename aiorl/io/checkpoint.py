"""Checkpoint files: atomic, checksummed, checked before use, never pruned into loss.

A checkpoint is one self-checking file, ``checkpoints/checkpoint-<steps>.pt``
(``<steps>``: learner 0's own learner steps, zero-padded)::

    b"aiorl-checkpoint\\n"            magic, 17 bytes
    u32 little-endian                 format version (1)
    u64 little-endian + bytes         meta: UTF-8 JSON (counters, run id, time; readable without torch)
    u64 little-endian + bytes         payload: ``torch.save`` of the learner's state (tensors, numbers,
                                      strings, lists, dicts: what ``torch.load(weights_only=True)`` reads)
    32 bytes                          SHA-256 of everything before it

Writing (`write_file`): the payload is checked first (the payload check below),
so learner 0 never leaves a file that a resume would refuse. The file is
written to a temporary name in the same directory, flushed and fsynced,
renamed over its final name, and the directory is fsynced: a reader (or a
resume after a crash) sees either the whole new file or none of it. A write that
fails (a full disk) leaves no temporary file and raises `WriteError`, one line
naming the file and what was not written.

Checking (`verify`; `newest_good` runs it on each file, newest first, and
falls back past every file that fails, naming each):

1. the file is opened without following a symbolic link (``O_NOFOLLOW``) and
   without blocking (a FIFO would wait for a writer), and must be a regular file;
2. its header (magic, version, the two declared lengths) is checked against
   the caps and against the file's size before anything else is read: a large
   file that is not a checkpoint is never read whole;
3. its payload's sizes, from its own records (`aiorl.io.torch_archive.size_refusal`:
   the zip's directories and ``data.pkl`` only): its members must take every
   byte of it, and its pickle must name every tensor record it holds, so a
   file far larger than what its pickle references (a crafted sparse file of
   GiBs) is refused before it is hashed (`verify`) or read whole (`read`,
   `load`: ``aiorl eval --checkpoint``); one of at most `HASHED_ANYWAY_BYTES`
   is hashed first, so that a file damaged on disk is named corrupt;
4. its SHA-256, streamed in 1 MiB chunks;
5. its payload: what ``torch.load(weights_only=True)`` accepts, checked
   without torch (`aiorl.io.torch_archive`: the zip archive, and its pickle
   run through an abstract copy of torch's weights-only unpickler), because
   the launcher that chooses the checkpoint of a resume
   (`aiorl.io.rundir.RunDir.resume`) never imports torch, to start fast.

A file that passes was written by `write_file` (or is byte for byte one that
could have been), and such a file loads. What the payload check cannot see is
what torch's rebuild functions make of their arguments, which only a file
crafted to pass the digest could get wrong. The real weights-only load happens
in each learner (`load`); should learner 0 still fail to load the file a
resume chose, it sets the file aside before the launch fails
(`aiorl.runtime.learner_outputs.load_resume_checkpoint`), and the next
``--resume`` continues from the one before it: a resume never continues from a
file it cannot load, and never chooses that file again.

Pruning (`prune`, after each write): the file just written (durable before
anything is deleted) is always kept, with the newest ``keep - 1`` others that
pass `verify`; only files that pass are deleted, beyond those. A file that fails is
neither counted nor deleted: the next resume names it and sets it aside
(`set_aside`: ``checkpoint-<steps>.pt.bad``), out of the checkpoints' names.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import io
import json
import os
import re
import stat
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from aiorl.io import torch_archive

MAGIC = b"aiorl-checkpoint\n"
VERSION = 1
DIGEST_BYTES = 32
CHECKPOINT_RE = re.compile(r"^checkpoint-(\d+)\.pt$")
# Caps on the two length fields, checked before anything is allocated.
MAX_META_BYTES = 64 << 20
MAX_PAYLOAD_BYTES = 1 << 40
CHUNK_BYTES = 1 << 20
HEAD_BYTES = len(MAGIC) + 12  # magic, version, meta length
# A payload its records refuse is hashed first below this size only (cheap), so that a damaged
# file is named corrupt; a larger one is refused unread (a crafted sparse file of GiBs).
HASHED_ANYWAY_BYTES = 64 << 20


class CheckpointError(ValueError):
    """A checkpoint file that cannot be used; the message names the file and why."""

    def __init__(self, message: str, path: str | Path | None = None):
        super().__init__(message)
        self.path = Path(path) if path is not None else None


class CheckpointUnreadable(CheckpointError):
    """The file could not be opened or read (a missing file, permissions, an I/O error): nothing
    is known about its content."""


class WriteError(OSError):
    """A file that could not be written (a full disk, a read-only or deleted directory): its
    message is one line naming the file and what was not written; no temporary file is left."""

    def __str__(self) -> str:
        return str(self.strerror)


def atomic_write(path: str | Path, write: Callable[[BinaryIO], None], what: str | None = None) -> Path:
    """Write `path` through `write(file)` so that it appears whole or not at all.

    Temporary file in the same directory, fsync, rename over `path`, fsync of
    the directory (so the rename itself survives a power cut). An OSError on the
    way is a `WriteError` naming `path` and `what` (a checkpoint's learner step by default), the
    temporary file removed.
    """
    path = Path(path)
    if what is None:
        named = CHECKPOINT_RE.match(path.name)
        what = f"checkpoint at learner step {int(named.group(1))}" if named else "the file"
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_dir(path.parent)
    except OSError as exc:
        reason = exc.strerror or str(exc) or type(exc).__name__
        raise WriteError(exc.errno, f"{path}: {what} not written ({reason}); no partial file left") from None
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()
    return path


def fsync_dir(directory: str | Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def checkpoint_name(learner_steps: int) -> str:
    return f"checkpoint-{learner_steps:09d}.pt"


def encode(meta: dict, payload: bytes) -> bytes:
    """The bytes of a checkpoint file holding `meta` (JSON) and `payload`."""
    meta_bytes = json.dumps(meta, sort_keys=True).encode()
    head = b"".join(
        (
            MAGIC,
            struct.pack("<I", VERSION),
            struct.pack("<Q", len(meta_bytes)),
            meta_bytes,
            struct.pack("<Q", len(payload)),
        )
    )
    digest = hashlib.sha256(head)
    digest.update(payload)
    return b"".join((head, payload, digest.digest()))


@dataclass(frozen=True)
class Layout:
    """Where a checkpoint file's parts are, from its header (checked against the file's size)."""

    meta_offset: int
    meta_len: int
    payload_offset: int
    payload_len: int

    @property
    def digest_offset(self) -> int:
        return self.payload_offset + self.payload_len


def layout(read_at: Callable[[int, int], bytes], size: int, name: str) -> Layout:
    """The parts of a checkpoint of `size` bytes, reading only its header through `read_at(offset, n)`."""
    head = read_at(0, HEAD_BYTES)
    if head[: len(MAGIC)] != MAGIC:
        raise CheckpointError(f"{name} is not an aiorl checkpoint (bad magic)", name)
    if size < HEAD_BYTES or len(head) < HEAD_BYTES:
        raise CheckpointError(f"{name} is truncated ({size} bytes)", name)
    version, meta_len = struct.unpack_from("<IQ", head, len(MAGIC))
    if version != VERSION:
        raise CheckpointError(f"{name} has checkpoint format version {version}; this aiorl reads {VERSION}", name)
    if meta_len > MAX_META_BYTES or HEAD_BYTES + meta_len + 8 > size:
        raise CheckpointError(f"{name} is truncated ({size} bytes; its meta block says {meta_len})", name)
    payload_offset = HEAD_BYTES + meta_len + 8
    (payload_len,) = struct.unpack("<Q", read_at(HEAD_BYTES + meta_len, 8))
    expected = payload_offset + payload_len + DIGEST_BYTES
    if payload_len > MAX_PAYLOAD_BYTES or expected != size:
        raise CheckpointError(f"{name} is truncated or has trailing bytes ({size} bytes, expected {expected})", name)
    return Layout(HEAD_BYTES, meta_len, payload_offset, payload_len)


def parse_meta(meta_bytes: bytes, name: str) -> dict:
    try:
        meta = json.loads(meta_bytes)
    except ValueError as exc:  # past the checksum only if the writer was broken
        raise CheckpointError(f"{name}: meta block is not JSON: {exc}", name) from None
    if not isinstance(meta, dict):
        raise CheckpointError(f"{name}: meta block is not a JSON object", name)
    return meta


def decode(data: bytes | memoryview, name: str = "checkpoint") -> tuple[dict, memoryview]:
    """(meta, payload) of a checkpoint file's bytes; CheckpointError naming `name` if it is not whole."""
    view = memoryview(data)
    parts = layout(lambda offset, n: bytes(view[offset : offset + n]), len(view), name)
    digest = hashlib.sha256(view[: parts.digest_offset]).digest()
    if digest != bytes(view[parts.digest_offset :]):
        raise CheckpointError(f"{name} is corrupt (SHA-256 mismatch)", name)
    meta = parse_meta(bytes(view[parts.meta_offset : parts.meta_offset + parts.meta_len]), name)
    return meta, view[parts.payload_offset : parts.digest_offset]


class Opened:
    """A checkpoint file opened for reading: never through a symbolic link, never blocking on a
    FIFO, a regular file only. A context manager; `size` is the file's size when opened."""

    def __init__(self, path: str | Path):
        self.name = str(path)
        try:
            self.fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise CheckpointError(f"{path} is a symbolic link, not a checkpoint file", path) from None
            raise CheckpointUnreadable(f"{path}: cannot read: {exc.strerror or exc}", path) from None
        try:
            st = os.fstat(self.fd)
            if not stat.S_ISREG(st.st_mode):
                raise CheckpointError(f"{path} is not a regular file, not a checkpoint file", path)
            # O_NONBLOCK only kept the open from waiting on a FIFO; reads of a regular file block.
            fcntl.fcntl(self.fd, fcntl.F_SETFL, fcntl.fcntl(self.fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
        except BaseException:
            os.close(self.fd)
            raise
        self.size = st.st_size

    def __enter__(self) -> Opened:
        return self

    def __exit__(self, *exc) -> None:
        os.close(self.fd)

    def pread(self, offset: int, n: int) -> bytes:
        """`n` bytes at `offset` (fewer at the end of the file), a chunk at a time."""
        chunks, done = [], 0
        while done < n:
            chunk = os.pread(self.fd, min(n - done, CHUNK_BYTES), offset + done)
            if not chunk:
                break
            chunks.append(chunk)
            done += len(chunk)
        return b"".join(chunks)

    def read_at(self, offset: int, n: int) -> bytes:
        """`pread`, an I/O error being a CheckpointUnreadable."""
        try:
            return self.pread(offset, n)
        except OSError as exc:
            raise CheckpointUnreadable(f"{self.name}: cannot read: {exc.strerror or exc}", self.name) from None

    def layout(self) -> Layout:
        return layout(self.read_at, self.size, self.name)

    def check_digest(self, parts: Layout) -> None:
        """Stream the file through SHA-256, a chunk at a time, against its stored digest."""
        digest = hashlib.sha256()
        for offset in range(0, parts.digest_offset, CHUNK_BYTES):
            chunk = self.read_at(offset, min(CHUNK_BYTES, parts.digest_offset - offset))
            if not chunk:
                raise CheckpointError(f"{self.name} is truncated (it shrank while being read)", self.name)
            digest.update(chunk)
        if digest.digest() != self.read_at(parts.digest_offset, DIGEST_BYTES):
            raise CheckpointError(f"{self.name} is corrupt (SHA-256 mismatch)", self.name)

    def check_sizes(self, parts: Layout) -> None:
        """The payload against its own records, before it is hashed or read whole (docstring, 3)."""
        end = parts.digest_offset

        def read_at(offset: int, n: int) -> bytes:
            return self.read_at(parts.payload_offset + offset, max(0, min(n, end - parts.payload_offset - offset)))

        refused = torch_archive.size_refusal(read_at, parts.payload_len)
        if refused is None:
            return
        if parts.payload_len <= HASHED_ANYWAY_BYTES:  # a file damaged on disk: its digest says so best
            self.check_digest(parts)
        raise CheckpointError(f"{self.name}: {refused}", self.name)

    def window(self, offset: int, length: int) -> io.BufferedReader:
        """A seekable file of the `length` bytes at `offset` (the payload, for `zipfile`)."""
        return io.BufferedReader(_Window(self, offset, length), CHUNK_BYTES)


class _Window(io.RawIOBase):
    """A read-only, seekable slice of an opened file, read with pread (the fd's offset is never moved)."""

    def __init__(self, opened: Opened, offset: int, length: int):
        self.opened, self.offset, self.length, self.pos = opened, offset, length, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, pos: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: self.length}[whence]
        self.pos = max(0, base + pos)
        return self.pos

    def readinto(self, buffer) -> int:
        n = max(0, min(len(buffer), self.length - self.pos))
        data = self.opened.pread(self.offset + self.pos, n)
        buffer[: len(data)] = data
        self.pos += len(data)
        return len(data)


def read(path: str | Path) -> tuple[dict, memoryview]:
    """(meta, payload) of the checkpoint at `path`, checked whole (its header before the rest is read)."""
    with Opened(path) as f:
        parts = f.layout()
        f.check_sizes(parts)
        data = f.read_at(0, f.size)
    return decode(data, str(path))


def read_meta(path: str | Path) -> dict:
    """The meta of the checkpoint at `path`, from its header and meta block alone (no digest: for a
    file checked already, or a look at one; `verify` checks it whole)."""
    with Opened(path) as f:
        parts = f.layout()
        return parse_meta(f.read_at(parts.meta_offset, parts.meta_len), str(path))


def verify(path: str | Path) -> dict:
    """The meta of the checkpoint at `path` once it passes every check of the module docstring
    (type, header, SHA-256, payload); CheckpointError naming the file and the first check it fails."""
    with Opened(path) as f:
        parts = f.layout()
        f.check_sizes(parts)
        f.check_digest(parts)
        meta = parse_meta(f.read_at(parts.meta_offset, parts.meta_len), f.name)
        check_payload(f.window(parts.payload_offset, parts.payload_len), f.name, path)
    return meta


def load(path: str | Path, map_location="cpu") -> tuple[dict, dict]:
    """(meta, state) of a checkpoint; the state is read with ``torch.load(weights_only=True)``."""
    import torch

    meta, payload = read(path)
    check_payload(io.BytesIO(payload), str(path), path)
    try:
        state = torch.load(io.BytesIO(payload), map_location=map_location, weights_only=True)
    except Exception as exc:  # past the payload check: a file crafted to pass it
        raise CheckpointError(f"{path}: payload does not load with weights_only=True: {exc}", path) from None
    return meta, state


def check_payload(file: BinaryIO, name: str, path: str | Path | None = None) -> None:
    """CheckpointError naming `name` unless `file` holds what ``torch.load(weights_only=True)``
    accepts (`aiorl.io.torch_archive`, without torch); `path`: the checkpoint file, if any."""
    try:
        refused = torch_archive.refusal(file)
    except OSError as exc:
        raise CheckpointUnreadable(f"{name}: cannot read: {exc.strerror or exc}", path) from None
    if refused is not None:
        raise CheckpointError(f"{name}: {refused}", path)


def save(directory: str | Path, learner_steps: int, state: dict, meta: dict, keep: int) -> Path:
    """Write ``checkpoint-<learner_steps>.pt`` (atomic, checksummed) and prune to `keep` good files."""
    return write_file(directory, learner_steps, serialize(state), meta, keep)


def write_file(directory: str | Path, learner_steps: int, payload: bytes | memoryview, meta: dict, keep: int) -> Path:
    """The file-writing half of `save`, for a payload serialized earlier (e.g. off the training path).
    A payload a resume would refuse is not written (CheckpointError)."""
    root = Path(directory)
    check_payload(io.BytesIO(payload), f"checkpoint at learner step {learner_steps} (not written)")
    root.mkdir(parents=True, exist_ok=True)
    data = encode({**meta, "learner_steps": int(learner_steps)}, bytes(payload))
    path = atomic_write(root / checkpoint_name(learner_steps), lambda f: f.write(data))
    _remember_good(path)
    prune(root, keep, path)
    return path


def non_finite(state, path: str = "") -> str | None:
    """The key path of the first floating tensor in `state` holding a NaN or an infinity, or None.

    A checksum proves a file is whole, not that its weights are sane: a learner whose weights
    blew up must not leave a checkpoint that a resume would take for good.
    """
    import torch

    if isinstance(state, torch.Tensor):
        if state.is_floating_point() and not bool(torch.isfinite(state).all()):
            return path or "state"
        return None
    items = state.items() if isinstance(state, dict) else enumerate(state) if isinstance(state, (list, tuple)) else ()
    for key, value in items:
        found = non_finite(value, f"{path}.{key}" if path else str(key))
        if found:
            return found
    return None


def serialize(state: dict) -> bytes:
    """The payload of a checkpoint: ``torch.save`` bytes of `state` (refused if any weight is not finite)."""
    import torch

    bad = non_finite(state)
    if bad is not None:
        raise CheckpointError(f"not checkpointed: {bad} holds NaN or infinite values")

    buffer = io.BytesIO()
    torch.save(state, buffer)
    return buffer.getvalue()


def list_checkpoints(directory: str | Path) -> list[Path]:
    """Checkpoint files under `directory`, oldest first (by learner steps)."""
    root = Path(directory)
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if (m := CHECKPOINT_RE.match(p.name))]
    return [p for _, p in sorted(found)]


# Files this process wrote or verified, by path -> (device, inode, size, mtime): pruning after
# every write verifies each other file it keeps once, not at every write. A file replaced or
# changed since has another identity and is verified again.
_known_good: dict[Path, tuple[int, int, int, int]] = {}


def _identity(path: Path) -> tuple[int, int, int, int] | None:
    try:
        st = os.stat(path, follow_symlinks=False)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def _remember_good(path: Path) -> None:
    identity = _identity(path)
    if identity is not None:
        _known_good[path] = identity


def is_good(path: Path) -> bool:
    """Whether `path` passes `verify` (remembered while the file stays the same)."""
    identity = _identity(path)
    if identity is not None and _known_good.get(path) == identity:
        return True
    try:
        verify(path)
    except CheckpointError:
        return False
    if identity is not None:  # as it was before the check: a file changed meanwhile is checked again
        _known_good[path] = identity
    return True


def prune(directory: str | Path, keep: int, written: Path) -> None:
    """Delete the checkpoints beyond the newest `keep` good ones, `written` (the file just written,
    durable already) always one of them. Files that fail `verify` are neither counted nor deleted."""
    kept = 1
    for path in reversed(list_checkpoints(directory)):
        if path.name == written.name or not is_good(path):
            continue
        if kept < keep:
            kept += 1
        else:
            path.unlink(missing_ok=True)
            _known_good.pop(path, None)


def newest_good(directory: str | Path) -> tuple[Path | None, dict | None, list[CheckpointError]]:
    """The newest checkpoint that passes `verify`, its meta, and the errors of the newer ones that
    failed (each naming its file, in ``.path``). Reads only: `set_aside` is the caller's."""
    bad: list[CheckpointError] = []
    for path in reversed(list_checkpoints(directory)):
        try:
            return path, verify(path), bad
        except CheckpointError as exc:
            exc.path = path
            bad.append(exc)
    return None, None, bad


def set_aside(path: str | Path) -> Path:
    """Rename `path` out of the checkpoints' names, to ``<name>.bad`` (``.bad.2``, ... when taken);
    the new path. Only by a process that holds the run directory (its launcher, or a role of it)."""
    path = Path(path)
    n = 1
    while os.path.lexists(target := path.with_name(f"{path.name}.bad{'' if n == 1 else f'.{n}'}")):
        n += 1
    os.rename(path, target)
    fsync_dir(path.parent)
    return target
