"""Checkpoint files: atomic, checksummed, the newest few kept.

A checkpoint is one self-checking file, ``checkpoints/checkpoint-<steps>.pt``
(``<steps>``: learner 0's own learner steps, zero-padded)::

    b"aiorl-checkpoint\\n"            magic, 17 bytes
    u32 little-endian                 format version (1)
    u64 little-endian + bytes         meta: UTF-8 JSON (counters, run id, time; readable without torch)
    u64 little-endian + bytes         payload: ``torch.save`` of the learner's state (tensors, numbers,
                                      strings, lists, dicts: what ``torch.load(weights_only=True)`` reads)
    32 bytes                          SHA-256 of everything before it

A file is written to a temporary name in the same directory, flushed and
fsynced, renamed over its final name, and the directory is fsynced: a reader
(or a resume after a crash) sees either the whole new file or none of it. A
truncated or altered file fails its length or checksum check and is named as
such; `newest_good` then falls back to the previous one. The payload is read
with ``weights_only=True``: a checkpoint can hold no code to run.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import struct
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

MAGIC = b"aiorl-checkpoint\n"
VERSION = 1
DIGEST_BYTES = 32
CHECKPOINT_RE = re.compile(r"^checkpoint-(\d+)\.pt$")
# Caps on the two length fields, checked before anything is allocated.
MAX_META_BYTES = 64 << 20
MAX_PAYLOAD_BYTES = 1 << 40


class CheckpointError(ValueError):
    """A checkpoint file that cannot be used; the message names the file and why."""


def atomic_write(path: str | Path, write: Callable[[BinaryIO], None]) -> Path:
    """Write `path` through `write(file)` so that it appears whole or not at all.

    Temporary file in the same directory, fsync, rename over `path`, fsync of
    the directory (so the rename itself survives a power cut).
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    fsync_dir(path.parent)
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


def decode(data: bytes | memoryview, name: str = "checkpoint") -> tuple[dict, memoryview]:
    """(meta, payload) of a checkpoint file's bytes; CheckpointError naming `name` if it is not whole."""
    view = memoryview(data)
    if bytes(view[: len(MAGIC)]) != MAGIC:
        raise CheckpointError(f"{name} is not an aiorl checkpoint (bad magic)")
    offset = len(MAGIC)
    if len(view) < offset + 12:
        raise CheckpointError(f"{name} is truncated ({len(view)} bytes)")
    (version,) = struct.unpack_from("<I", view, offset)
    if version != VERSION:
        raise CheckpointError(f"{name} has checkpoint format version {version}; this aiorl reads {VERSION}")
    (meta_len,) = struct.unpack_from("<Q", view, offset + 4)
    offset += 12
    if meta_len > MAX_META_BYTES or offset + meta_len + 8 > len(view):
        raise CheckpointError(f"{name} is truncated ({len(view)} bytes; its meta block says {meta_len})")
    meta_bytes = view[offset : offset + meta_len]
    offset += meta_len
    (payload_len,) = struct.unpack_from("<Q", view, offset)
    offset += 8
    expected = offset + payload_len + DIGEST_BYTES
    if payload_len > MAX_PAYLOAD_BYTES or expected != len(view):
        raise CheckpointError(f"{name} is truncated or has trailing bytes ({len(view)} bytes, expected {expected})")
    digest = hashlib.sha256(view[: offset + payload_len]).digest()
    if digest != bytes(view[offset + payload_len :]):
        raise CheckpointError(f"{name} is corrupt (SHA-256 mismatch)")
    try:
        meta = json.loads(bytes(meta_bytes))
    except ValueError as exc:  # cannot happen past the checksum unless the writer was broken
        raise CheckpointError(f"{name}: meta block is not JSON: {exc}") from None
    return meta, view[offset : offset + payload_len]


def read(path: str | Path) -> tuple[dict, memoryview]:
    """(meta, payload) of the checkpoint at `path`, checked whole."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise CheckpointError(f"{path}: cannot read: {exc.strerror or exc}") from None
    return decode(data, str(path))


def read_meta(path: str | Path) -> dict:
    return read(path)[0]


def load(path: str | Path, map_location="cpu") -> tuple[dict, dict]:
    """(meta, state) of a checkpoint; the state is read with ``torch.load(weights_only=True)``."""
    import torch

    meta, payload = read(path)
    try:
        state = torch.load(io.BytesIO(payload), map_location=map_location, weights_only=True)
    except Exception as exc:  # the checksum held: the writer stored something weights_only refuses
        raise CheckpointError(f"{path}: payload does not load with weights_only=True: {exc}") from None
    return meta, state


def save(directory: str | Path, learner_steps: int, state: dict, meta: dict, keep: int) -> Path:
    """Write ``checkpoint-<learner_steps>.pt`` (atomic, checksummed) and keep the newest `keep` files."""
    return write_file(directory, learner_steps, serialize(state), meta, keep)


def write_file(directory: str | Path, learner_steps: int, payload: bytes | memoryview, meta: dict, keep: int) -> Path:
    """The file-writing half of `save`, for a payload serialized earlier (e.g. off the training path)."""
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    data = encode({**meta, "learner_steps": int(learner_steps)}, bytes(payload))
    path = atomic_write(root / checkpoint_name(learner_steps), lambda f: f.write(data))
    prune(root, keep)
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


def prune(directory: str | Path, keep: int) -> None:
    for old in list_checkpoints(directory)[:-keep]:
        old.unlink(missing_ok=True)


def newest_good(directory: str | Path) -> tuple[Path | None, dict | None, list[CheckpointError]]:
    """The newest checkpoint that passes its checks, its meta, and the errors of newer bad ones."""
    bad: list[CheckpointError] = []
    for path in reversed(list_checkpoints(directory)):
        try:
            return path, read_meta(path), bad
        except CheckpointError as exc:
            bad.append(exc)
    return None, None, bad
