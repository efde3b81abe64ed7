"""A bounded FIFO of whole trajectory fragments: what an IMPALA memory host holds.

A fragment is ``steps`` consecutive env steps of one env of one actor, acted
with one weights version: a dict of fields ``[steps, *row_shape]`` (the
transition spec's rows, one per step), fields it holds once ``[*shape]`` (the
per-fragment spec: a recurrent policy's state at its first step), plus its
origin (actor, env) and that version. The queue keeps at most ``capacity``
fragments in preallocated storage, one slot per fragment (both kinds of field
sit in it, so whatever drops or takes a fragment moves them together), and
hands them out oldest first.

- `push` stores fragments whole or not at all: every field's shape and dtype
  is checked against the spec before anything changes. A full queue either
  refuses (``full="throttle"``: the caller's credits promised room, so a push
  that does not fit is the producer breaking the protocol) or drops its
  oldest fragments to make room (``full="drop_oldest"``), counted.
- `drop_older(min_version)` drops every fragment acted with a version older
  than `min_version` (the policy-lag bound), wherever it sits, counted.
- `take(n)` returns the n oldest fragments as fresh arrays ``[n, steps, ...]``
  and ``[n, ...]`` (plus ``weights_version``, ``actor`` and ``env``, ``[n]`` int64): copies,
  never views of storage, so a later push into the freed slots cannot change
  a batch already handed out (on the wire, a large array is sent from its
  own memory after `send` returns).

Slots are reached through an order list and a free list, so dropping from
the middle moves no data.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from aiorl.replay import FramePool, FrameStream
from aiorl.replay.frames import unpack_frames

FULL_POLICIES = ("throttle", "drop_oldest")
ORIGIN_FIELDS = ("weights_version", "actor", "env")


@dataclass(frozen=True)
class QueueSpec:
    """What an algorithm asks of the memories' trajectory queues (`Algorithm.fragment_queue`)."""

    capacity: int  # fragments per memory host
    full: str  # "throttle" or "drop_oldest"
    max_policy_lag: int | None  # versions; None: no bound
    fragments_per_batch: int  # fragments in one learner batch


class QueueFull(ValueError):
    """A push that does not fit a throttled queue (the producer sent without credit)."""


class TrajectoryQueue:
    """`TrajectoryQueue(capacity, spec, steps, full="throttle", per_fragment=None)`: see the
    module docstring.

    spec: {name: (row_shape, dtype)} of one step; storage of each field is
    ``[capacity, steps, *row_shape]``. per_fragment: {name: (shape, dtype)} of the fields a
    fragment holds once; storage ``[capacity, *shape]``.
    """

    def __init__(self, capacity: int, spec: dict, steps: int, full: str = "throttle", per_fragment: dict | None = None):
        if capacity < 1 or steps < 1:
            raise ValueError(f"TrajectoryQueue: capacity and steps must be at least 1, got {capacity}, {steps}")
        if full not in FULL_POLICIES:
            raise ValueError(f"TrajectoryQueue: full must be one of {FULL_POLICIES}, got {full!r}")
        per_fragment = per_fragment or {}
        clash = sorted((set(spec) | set(per_fragment)) & set(ORIGIN_FIELDS))
        if clash:
            raise ValueError(f"TrajectoryQueue: field names {clash} are reserved for a fragment's origin")
        if set(spec) & set(per_fragment):
            raise ValueError(
                f"TrajectoryQueue: fields {sorted(set(spec) & set(per_fragment))} both per step and per fragment"
            )
        self.capacity, self.steps, self.full = capacity, steps, full
        self.spec = {name: (tuple(shape), np.dtype(dtype).newbyteorder("=")) for name, (shape, dtype) in spec.items()}
        self.per_fragment = {
            name: (tuple(shape), np.dtype(dtype).newbyteorder("=")) for name, (shape, dtype) in per_fragment.items()
        }
        # One fragment's shape of every field: a per-step field is `steps` rows of it.
        self._fragment_shapes = {
            **{name: ((steps,) + shape, dtype) for name, (shape, dtype) in self.spec.items()},
            **self.per_fragment,
        }
        self._storage = {
            name: np.zeros((capacity,) + shape, dtype) for name, (shape, dtype) in self._fragment_shapes.items()
        }
        self._origin = {name: np.full(capacity, -1, np.int64) for name in ORIGIN_FIELDS}
        self._order: deque[int] = deque()  # slots, oldest first
        self._free = list(range(capacity - 1, -1, -1))  # a stack: slot 0 is used first
        self.pushed = 0
        self.taken = 0
        self.dropped_full = 0
        self.dropped_lag = 0

    def __repr__(self) -> str:
        return (
            f"<TrajectoryQueue {len(self)}/{self.capacity} fragments of {self.steps} steps, full={self.full} "
            f"pushed={self.pushed} taken={self.taken} dropped_full={self.dropped_full} "
            f"dropped_lag={self.dropped_lag}>"
        )

    def __len__(self) -> int:
        return len(self._order)

    @property
    def free(self) -> int:
        return self.capacity - len(self._order)

    def versions(self) -> np.ndarray:
        """Weights versions of the queued fragments, oldest first."""
        return self._origin["weights_version"][list(self._order)]

    # ------------------------------------------------------------------ in

    def check(self, fragments: dict) -> int:
        """The number of fragments in `fragments` ([n, steps, *row_shape] per step field, [n, *shape]
        per per-fragment field, every field and no other); ValueError naming the first field that
        does not fit."""
        expected = self._fragment_shapes
        missing = [name for name in expected if name not in fragments]
        extra = [name for name in fragments if name not in expected]
        if missing or extra:
            raise ValueError(f"fragment fields: missing {missing}, unexpected {extra} (expected {list(expected)})")
        n = None
        for name, (shape, dtype) in expected.items():
            array = fragments[name]
            if not isinstance(array, np.ndarray) or array.dtype.newbyteorder("=") != dtype or array.ndim < 1:
                got = f"{array.dtype}" if isinstance(array, np.ndarray) else type(array).__name__
                raise ValueError(f"fragment field {name!r}: expected dtype {dtype}, got {got}")
            if n is None:
                n = array.shape[0]
            if array.shape != (n,) + shape:
                raise ValueError(f"fragment field {name!r}: expected shape {(n,) + shape}, got {array.shape}")
        return int(n or 0)

    def push(self, fragments: dict, version: int, actor: int, envs=None) -> int:
        """Store `fragments` (see `check`) acted with weights `version` by `actor`'s envs
        `envs` (default 0..n-1); return how many old fragments were dropped to make room."""
        n = self.check(fragments)
        envs = np.arange(n, dtype=np.int64) if envs is None else np.asarray(envs, np.int64)
        if envs.shape != (n,):
            raise ValueError(f"envs: expected {n} env indices, got shape {envs.shape}")
        if n > self.capacity:
            raise QueueFull(f"{n} fragments can never fit a queue of {self.capacity}")
        dropped = 0
        if n > self.free:
            if self.full == "throttle":
                raise QueueFull(
                    f"{n} fragments pushed with room for {self.free} "
                    f"({len(self)}/{self.capacity} queued): a producer sent without credit"
                )
            dropped = n - self.free
            self._release([self._order.popleft() for _ in range(dropped)])
            self.dropped_full += dropped
        slots = [self._free.pop() for _ in range(n)]
        self._store(slots, fragments)
        for name, value in (("weights_version", version), ("actor", actor)):
            self._origin[name][slots] = value
        self._origin["env"][slots] = envs
        self._order.extend(slots)
        self.pushed += n
        return dropped

    def _store(self, slots: list[int], fragments: dict) -> None:
        for name, storage in self._storage.items():
            storage[slots] = fragments[name]

    # ------------------------------------------------------------------ out

    def drop_older(self, min_version: int) -> int:
        """Drop every fragment acted with a weights version below `min_version`; return how many."""
        version = self._origin["weights_version"]
        stale = [s for s in self._order if version[s] < min_version]
        if stale:
            gone = set(stale)
            self._order = deque(s for s in self._order if s not in gone)
            self._release(stale)
            self.dropped_lag += len(stale)
        return len(stale)

    def take(self, n: int) -> dict:
        """The `n` oldest fragments as fresh arrays, removed from the queue."""
        if not 0 <= n <= len(self._order):
            raise ValueError(f"take({n}) from a queue holding {len(self._order)} fragments")
        slots = [self._order.popleft() for _ in range(n)]
        batch = self._gather(slots)
        for name, origin in self._origin.items():
            batch[name] = origin[slots]
        self._release(slots)
        self.taken += n
        return batch

    def _gather(self, slots: list[int]) -> dict:
        # Fancy indexing copies: the batch owns its memory.
        return {name: storage[slots] for name, storage in self._storage.items()}

    def clear(self) -> int:
        """Drop everything queued (the end of a run); return how many fragments."""
        n = len(self._order)
        self._release(list(self._order))
        self._order.clear()
        return n

    def _release(self, slots: list[int]) -> None:
        """Slots whose fragments left the queue (taken or dropped) become free."""
        for s in slots:
            self._origin["weights_version"][s] = -1
        self._free.extend(slots)


class FrameTrajectoryQueue(TrajectoryQueue):
    """A trajectory queue whose stacked-observation fields are stored as frames, each once.

    `FrameTrajectoryQueue(capacity, spec, steps, layout, full="throttle", max_streams=1, per_fragment=None)`:
    spec is the naive one (stacked ``(k, *frame)`` observation fields). Fragment messages
    come as the frame layout sends them (`aiorl.replay.frames`): frame fields as ``[n, steps,
    k]`` frame ids, plus ``frames`` (or ``frames_lz4``) and ``frame_ids``, against the
    sender's `stream()`. Queued fragments hold their frames in a reference-counted
    `FramePool`; `take` rebuilds the stacks, ``[n, steps, k, *frame]``, fresh arrays as ever.
    """

    def __init__(
        self,
        capacity: int,
        spec: dict,
        steps: int,
        layout,
        full: str = "throttle",
        max_streams: int = 1,
        per_fragment: dict | None = None,
    ):
        self.layout = layout
        self.naive_spec = {name: (tuple(shape), np.dtype(dtype)) for name, (shape, dtype) in spec.items()}
        # Checked and stored as the wire has them: a frame field is k ids a step (stored: pool slots).
        super().__init__(capacity, layout.wire_spec(spec), steps, full, per_fragment)
        self._incoming = None  # the message `push` is storing: (stream, frames, frame_ids, refs, keep_from)
        max_frames = capacity * steps * len(layout.fields) * layout.stack + max(1, max_streams) * layout.window
        self.pool = FramePool(layout.frame_shape, layout.dtype, max_frames)

    def __repr__(self) -> str:
        return super().__repr__()[:-1] + f" frames={len(self.pool)}>"

    def stream(self):
        """A new producer's frame ids; `release()` it when the producer is gone."""

        return FrameStream(self.pool, self.layout.window, self.layout.stack)

    def push(self, fragments: dict, version: int, actor: int, envs=None, *, stream=None, keep_from: int = 0) -> int:
        """As `TrajectoryQueue.push`, for a frame-layout message of `stream`'s producer; nothing
        changes if any part of it is invalid (ValueError)."""

        rows = dict(fragments)
        packed = rows.pop("frames_lz4", None)
        try:
            frames = rows.pop("frames") if packed is None else None
            frame_ids = np.asarray(rows.pop("frame_ids"))
        except KeyError as exc:
            raise ValueError(
                f"fragment message lacks {exc.args[0]!r} (the frame layout sends 'frames' or "
                "'frames_lz4', and 'frame_ids')"
            ) from None
        n = self.check(rows)
        if packed is not None:
            frames = unpack_frames(self.layout, packed, frame_ids, n * self.steps, "fragment message")
        if not isinstance(keep_from, (int, np.integer)) or stream is None:
            raise ValueError(
                f"a frame-layout fragment message needs its stream and an integer keep_from, got {keep_from!r}"
            )
        refs = np.concatenate([rows[f].reshape(-1) for f in self.layout.fields]).astype(np.int64, copy=False)
        stream.check(frames, frame_ids, refs, int(keep_from))
        self._incoming = (stream, frames, frame_ids, refs, int(keep_from))
        try:
            return super().push(rows, version, actor, envs)
        finally:
            self._incoming = None

    def _store(self, slots: list[int], fragments: dict) -> None:
        stream, frames, frame_ids, refs, keep_from = self._incoming
        resolved = stream.admit(frames, frame_ids, refs, keep_from)
        self.pool.incref(resolved)
        per_field = len(slots) * self.steps * self.layout.stack
        tables = {
            f: resolved[i * per_field : (i + 1) * per_field].reshape(len(slots), self.steps, self.layout.stack)
            for i, f in enumerate(self.layout.fields)
        }
        super()._store(slots, {**fragments, **tables})

    def _gather(self, slots: list[int]) -> dict:
        batch = {}
        rows = (np.asarray(slots, np.int64)[:, None] * self.steps + np.arange(self.steps)).reshape(-1)
        frame_fields = list(self.layout.fields)
        tables = [self._storage[f].reshape(self.capacity * self.steps, self.layout.stack) for f in frame_fields]
        stacks = self.pool.gather(tables, rows)
        shape = (len(slots), self.steps) + self.naive_spec[frame_fields[0]][0]
        for name, storage in self._storage.items():
            if name in frame_fields:
                batch[name] = stacks[frame_fields.index(name)].reshape(shape)
            else:
                batch[name] = storage[slots]
        return batch

    def _release(self, slots: list[int]) -> None:
        if slots:
            for f in self.layout.fields:
                self.pool.decref(self._storage[f][slots])
        super()._release(slots)
