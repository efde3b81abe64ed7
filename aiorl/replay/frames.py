"""Replay that stores each frame once: frame-stacked observations kept as references.

A transition spec names its observation fields (``obs``, ``next_obs``) with
stacked shapes ``(*lead, k, *frame)``: ``(k, *frame)`` for a transition,
``(m + 1, k, *frame)`` for an R2D2 sequence (lead ``(m + 1,)``). In the frame
layout each such field is stored, and travels from actor to memory, as
``(*lead, k)`` int64 frame references (consecutive steps share k - 1 of
them, overlapping sequences share theirs too);
the frames themselves live once in a reference-counted `FramePool` (compiled,
`aiorl._ext.framestore`) and are gathered back into stacks at sample time.
Everything else (the ring of rows, the sum-tree, the rng) is the ordinary
`ReplayBuffer` / `PrioritizedReplayBuffer` over the remaining fields, so for
the same added transitions and priorities `FrameReplayBuffer.sample` returns
exactly what the naive buffer (obs and next_obs stored per row) returns.

The actor side (`aiorl.replay.frame_sender.FrameSender`) numbers each new
frame with a per-actor id and sends, with each batch of rows, only the frames
its rows reference that the receiving memory does not hold yet. A batch
message in this layout carries the rows (frame fields as ``[n, *lead, k]``
int64 ids), ``frames [f, *frame]`` with ``frame_ids [f]`` (strictly increasing), and
``keep_from`` (meta): no id below it is referenced by this or any later
message of that actor, so the memory releases the frames it held for them
(rows still referencing a frame keep it alive). With ``cluster.frame_compression:
lz4`` the frames come as ``frames_lz4``, one lz4 block of the raw frames (uint8); the
receiver checks the frame count against its bound first and decompresses to exactly
``len(frame_ids)`` frames, or refuses the message.

Bounds a receiver can check before it allocates (see `FrameLayout`): a
message's frames are at most its rows' references, ``len(fields) * prod(lead) * k``
per row, and at most ``window``, which the ids a stream references span less than.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from aiorl.config import ConfigError
from aiorl.core.buffer_pool import BufferPool
from aiorl.replay import FramePool, FrameStream, PrioritizedReplayBuffer, ReplayBuffer

LAYOUTS = ("auto", "frames", "transitions")
COMPRESSIONS = ("none", "lz4")


def lz4_block():
    """The lz4.block module, or a ConfigError saying how to get it."""

    try:
        import lz4.block
    except ImportError:
        raise ConfigError(
            "cluster.frame_compression: 'lz4' needs the lz4 package: pip install 'aiorl[atari]' (or pip install lz4)"
        ) from None
    return lz4.block


def check_compression(name: str) -> None:
    if name not in COMPRESSIONS:
        raise ConfigError(f"cluster.frame_compression: expected 'none' or 'lz4', got {name!r}")
    if name == "lz4":
        lz4_block()


# Sampled frame fields this large go into recycled memory, as in the ring buffers.
_POOLED_BYTES = 1 << 20


def _next_pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


@dataclass(frozen=True)
class FrameLayout:
    """How observation fields are sent and stored as frames.

    fields: transition fields holding stacked observations; stack: frames per
    observation; frame_shape, dtype: one frame; window: the frame-id window of
    one actor stream (a power of two, both ends derive it from the config: see
    `for_spec`); lead: the dims of a field before its observations (``()`` for a
    transition, ``(m + 1,)`` for a sequence of m steps).
    """

    fields: tuple[str, ...]
    stack: int
    frame_shape: tuple[int, ...]
    dtype: np.dtype
    window: int
    lead: tuple[int, ...] = ()

    @classmethod
    def for_spec(
        cls,
        spec: dict,
        fields,
        num_envs: int,
        steps_per_batch: int,
        lookback_steps: int,
        obs_shape: tuple[int, ...] | None = None,
    ) -> FrameLayout:
        """The layout of `spec`'s observation `fields` for actors stepping `num_envs` envs,
        `steps_per_batch` steps per batch, whose rows start up to `lookback_steps` before it.
        `obs_shape`: one observation's shape ``(k, *frame)``, the fields' trailing dims (None:
        the fields are single observations).

        Ids live in the stacks of at most k consecutive steps (each step makes at
        least one new id per env, a fresh stack at most k), so the ids a stream still
        references span at most ``num_envs * k * (steps_per_batch + lookback_steps + k)``;
        the window is twice that, rounded up to a power of two.
        """
        fields = tuple(fields)
        shapes = {tuple(spec[f][0]) for f in fields}
        dtypes = {np.dtype(spec[f][1]) for f in fields}
        if len(shapes) != 1 or len(dtypes) != 1:
            raise ValueError(f"frame fields {fields} must share one shape and dtype, got {shapes} {dtypes}")
        shape = shapes.pop()
        obs_shape = shape if obs_shape is None else tuple(obs_shape)
        lead = shape[: len(shape) - len(obs_shape)]
        if len(obs_shape) < 2 or lead + obs_shape != shape:
            raise ValueError(f"frame fields {fields} have shape {shape}; expected (stack, *frame) after any lead dims")
        stack = obs_shape[0]
        span = num_envs * stack * (steps_per_batch + lookback_steps + stack)
        return cls(fields, stack, obs_shape[1:], dtypes.pop().newbyteorder("="), _next_pow2(2 * span), lead)

    @property
    def frame_bytes(self) -> int:
        return int(np.prod(self.frame_shape)) * self.dtype.itemsize

    @property
    def stacks_per_field(self) -> int:
        """Stacks one row holds in each frame field (the product of `lead`)."""
        return int(np.prod(self.lead, dtype=np.int64))

    @property
    def refs_per_row(self) -> int:
        """Frame references one row holds, all its frame fields together."""
        return len(self.fields) * self.stacks_per_field * self.stack

    def wire_spec(self, spec: dict) -> dict:
        """Per-row spec of a batch message: frame fields become ``(*lead, k)`` int64 ids. A
        message also carries ``frames`` (rows of `frame_spec`) and ``frame_ids`` (int64), at
        most `max_frames(rows)` of each."""
        ids = (self.lead + (self.stack,), "<i8")
        return {name: (ids if name in self.fields else entry) for name, entry in spec.items()}

    def frame_spec(self) -> tuple[tuple[int, ...], str]:
        return self.frame_shape, self.dtype.str

    def max_frames(self, rows: int) -> int:
        """Most frames one message of `rows` rows can need: one per reference, and never more
        than the window (a message's ids span less than it; this bounds sequences, whose rows
        hold many references)."""
        return min(rows * self.refs_per_row, self.window)

    def max_compressed_bytes(self, rows: int) -> int:
        """Most bytes of ``frames_lz4`` in a message of `rows` rows (lz4's worst-case bound)."""
        raw = self.max_frames(rows) * self.frame_bytes
        return raw + raw // 255 + 16


def stacked_env(env_cfg) -> bool:
    """Whether the configured env stacks frames (the Atari preset, its native backend, or a
    FrameStackObservation wrapper)."""
    from aiorl.envs.wrappers import wrapper_names

    return (
        env_cfg.preset == "atari"
        or env_cfg.backend != "gymnasium"
        or "FrameStackObservation" in wrapper_names(env_cfg.wrappers)
    )


def frame_layout(cfg, algo) -> FrameLayout | None:
    """The frame layout a run uses, or None for rows that store their observations.

    ``agent.replay_layout``: "frames" always (observation fields must be stacks),
    "transitions" never, "auto" for replay (not synchronous) algorithms on envs
    that stack frames (see `stacked_env`).
    """

    choice = cfg.agent.replay_layout
    if choice == "transitions" or algo.is_synchronous(cfg):
        return None
    spec = algo.transition_spec()
    fields = [f for f in algo.observation_fields if f in spec]
    obs_shape = tuple(getattr(algo.env_spec.observation_space, "shape", None) or ())
    if choice == "auto" and not (fields and stacked_env(cfg.env) and len(obs_shape) >= 3):
        return None
    if not fields:
        raise ConfigError(
            f"agent.replay_layout: 'frames' needs observation fields {algo.observation_fields} "
            f"in the {cfg.algo} transition spec"
        )
    try:
        layout = FrameLayout.for_spec(
            spec, fields, cfg.env.num_envs, cfg.agent.sample_batch_size, algo.lookback_steps(), obs_shape
        )
    except ValueError as exc:
        raise ConfigError(f"agent.replay_layout: 'frames' does not fit this env: {exc}") from None
    if cfg.run.snapshot_replay:
        raise ConfigError(
            "run.snapshot_replay: replay snapshots do not cover the frame layout yet; "
            "set agent.replay_layout: transitions to snapshot"
        )
    return layout


def unpack_frames(layout: FrameLayout, packed, frame_ids, rows: int, who: str) -> np.ndarray:
    """The frames of the ``frames_lz4`` block of a message of `rows` rows, its size checked
    before anything is allocated."""
    what = f"{who}: frames_lz4"
    count = frame_ids.shape[0] if frame_ids.ndim == 1 else -1
    if not 0 <= count <= layout.max_frames(rows):
        raise ValueError(f"{what}: {count} frame ids for {rows} rows (at most {layout.max_frames(rows)})")
    packed = np.asarray(packed)
    if packed.dtype != np.uint8 or packed.ndim != 1:
        raise ValueError(f"{what}: expected a 1-d uint8 array, got {packed.shape} {packed.dtype}")
    expected = count * layout.frame_bytes
    try:
        raw = lz4_block().decompress(packed, uncompressed_size=expected) if expected else b""
    except Exception as exc:  # lz4.block.LZ4BlockError: corrupt, or not `expected` bytes
        raise ValueError(f"{what}: not an lz4 block of {count} frames ({exc})") from None
    if len(raw) != expected:
        raise ValueError(f"{what}: decompressed to {len(raw)} bytes, expected {expected}")
    return np.frombuffer(raw, layout.dtype).reshape((count,) + layout.frame_shape)


class FrameReplayBuffer:
    """Uniform or prioritized replay whose observation fields are stored as frames.

    ``FrameReplayBuffer(capacity, spec, layout, alpha=None, eps=1e-6, seed=None, max_streams=1)``:
    spec is the naive transition spec (stacked observation fields included);
    alpha None means uniform replay, otherwise proportional prioritized
    replay with that exponent. Each producer (actor connection) gets a
    `stream()`; `add` takes its batch messages (see the module docstring).
    `sample` and `update_priorities` behave exactly like the ring buffers'.
    """

    def __init__(
        self,
        capacity: int,
        spec: dict,
        layout: FrameLayout,
        alpha: float | None = None,
        eps: float = 1e-6,
        seed=None,
        max_streams: int = 1,
    ):
        self.layout = layout
        self.spec = {name: (tuple(shape), np.dtype(dtype)) for name, (shape, dtype) in spec.items()}
        missing = [f for f in layout.fields if f not in self.spec]
        if missing:
            raise ValueError(f"FrameReplayBuffer: frame fields {missing} are not in the spec {list(self.spec)}")
        rows_spec = {name: entry for name, entry in self.spec.items() if name not in layout.fields}
        if alpha is None:
            self._rows = ReplayBuffer(capacity, rows_spec, seed=seed)
        else:
            self._rows = PrioritizedReplayBuffer(capacity, rows_spec, alpha=alpha, eps=eps, seed=seed)
        self.prioritized = alpha is not None
        self.capacity = capacity
        # Frames alive at once: those rows reference (at most one per reference) and those
        # the streams hold (at most a window each). Blocks open only as they fill.
        max_frames = capacity * layout.refs_per_row + max(1, max_streams) * layout.window
        self.pool = FramePool(layout.frame_shape, layout.dtype, max_frames)
        # One table row of stacks per replay row: viewed as [capacity * stacks, k], each
        # stack is one row of the pool's gather.
        self._stacks = layout.stacks_per_field
        self._tables = {f: np.full((capacity, self._stacks, layout.stack), -1, np.int64) for f in layout.fields}
        self._out = BufferPool()

    def __repr__(self) -> str:
        return (
            f"FrameReplayBuffer(size={len(self)}, capacity={self.capacity}, frames={len(self.pool)}, "
            f"fields={list(self.spec)}, prioritized={self.prioritized})"
        )

    def __len__(self) -> int:
        return len(self._rows)

    @property
    def added(self) -> int:
        return self._rows.added

    @property
    def rows(self):
        """The ring (and sum-tree) over the fields other than the frame fields."""
        return self._rows

    def stream(self) -> FrameStream:
        """A new producer's frame ids; `release()` it when the producer is gone."""
        return FrameStream(self.pool, self.layout.window, self.layout.stack)

    def add(self, batch: dict, priorities=None, *, stream: FrameStream, keep_from: int):
        """Store one batch message of `stream`'s producer; returns the rows' slots.

        Nothing changes if any part of the message is invalid (ValueError).
        """
        what = "FrameReplayBuffer.add"
        rows = dict(batch)
        try:
            packed = rows.pop("frames_lz4", None)
            frames = rows.pop("frames") if packed is None else None
            frame_ids = np.asarray(rows.pop("frame_ids"))
            refs = [np.asarray(rows.pop(f)) for f in self.layout.fields]
        except KeyError as exc:
            raise ValueError(
                f"{what}: batch lacks {exc.args[0]!r} (expected the fields {list(self.spec)}, "
                "'frames' (or 'frames_lz4') and 'frame_ids')"
            ) from None
        n = len(next(iter(rows.values()))) if rows else 0
        if packed is not None:
            frames = unpack_frames(self.layout, packed, frame_ids, n, what)
        elif frame_ids.ndim != 1 or len(frame_ids) > self.layout.max_frames(n):
            # Each frame sent must be one the rows reference: more is a malformed message.
            raise ValueError(f"{what}: {frame_ids.shape} frame ids for {n} rows (at most {self.layout.max_frames(n)})")
        want = (n, *self.layout.lead, self.layout.stack)
        for f, ref in zip(self.layout.fields, refs):
            if ref.shape != want or ref.dtype.kind not in "iu":
                raise ValueError(f"{what}: field {f!r}: expected {want} int64 frame ids, got {ref.shape} {ref.dtype}")
        flat = np.concatenate([ref.reshape(-1) for ref in refs]).astype(np.int64, copy=False)
        if not isinstance(keep_from, (int, np.integer)):
            raise ValueError(f"{what}: keep_from must be an integer, got {keep_from!r}")
        stream.check(frames, frame_ids, flat, int(keep_from))
        before = self._rows.added
        slots = self._rows.add(rows, priorities) if self.prioritized else self._rows.add(rows)
        # Rows landing at or past position `capacity` overwrite live rows, whose frames
        # are released after the new rows took theirs (a frame both share stays).
        evicted = slots[max(0, self.capacity - before) :]
        old = [table[evicted] for table in self._tables.values()] if len(evicted) else []
        resolved = stream.admit(frames, frame_ids, flat, int(keep_from))
        size = n * self._stacks * self.layout.stack
        for i, table in enumerate(self._tables.values()):
            table[slots] = resolved[i * size : (i + 1) * size].reshape(n, self._stacks, self.layout.stack)
        self.pool.incref(resolved)
        for table_rows in old:
            self.pool.decref(table_rows)
        return slots

    def sample(self, batch_size: int, beta: float | None = None) -> dict:
        """The ring's sample (indices, weights, generations as usual) with each frame field
        rebuilt as ``(batch_size, *lead, k, *frame)`` stacks; keys in spec order."""
        sampled = self._rows.sample(batch_size, beta) if self.prioritized else self._rows.sample(batch_size)
        k, per = self.layout.stack, self._stacks
        shape = (batch_size * per, k) + self.layout.frame_shape
        nbytes = int(np.prod(shape)) * self.layout.dtype.itemsize
        dests = (
            [self._out.take(nbytes).view(self.layout.dtype).reshape(shape) for _ in self._tables]
            if nbytes >= _POOLED_BYTES
            else None
        )
        indices = np.asarray(sampled["indices"], np.int64)
        stack_rows = (indices[:, None] * per + np.arange(per)).reshape(-1) if per > 1 else indices
        tables = [table.reshape(-1, k) for table in self._tables.values()]
        # One pass over the rows for every frame field: more frames in flight per row.
        gathered = self.pool.gather(tables, stack_rows, dests)
        full = (batch_size, *self.layout.lead, k) + self.layout.frame_shape
        stacks = {name: g.reshape(full) for name, g in zip(self._tables, gathered)}
        out = {name: stacks[name] if name in stacks else sampled[name] for name in self.spec}
        for key in ("indices", "weights", "generations"):
            if key in sampled:
                out[key] = sampled[key]
        return out

    def update_priorities(self, indices, priorities, generations=None) -> int:
        return self._rows.update_priorities(indices, priorities, generations)

    def row_references(self) -> np.ndarray:
        """References the stored rows hold to each pool slot (int64, one per slot ever
        opened): with each stream's held frames, what the pool's counts must add up to."""
        size = len(self)
        flat = np.concatenate([table[:size].reshape(-1) for table in self._tables.values()])
        return np.bincount(flat, minlength=self.pool.slots)
