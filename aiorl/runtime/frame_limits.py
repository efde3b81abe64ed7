"""The largest frame each connection of a run can legitimately carry, derived from the config.

A receiver allocates a frame's payload as soon as its header is checked, so
the wire refuses any frame over the connection's `Limits`. Rather than one
generous cap (1 GiB) for every peer, each connection gets what its peer's
role can send: an actor one batch of its rollouts' rows in the replay spec,
a learner one priority update, a memory host one sampled batch (or, for
synchronous algorithms, one aggregate of the rollouts of its actors; for
IMPALA, one batch of whole fragments, with the fields each fragment holds once),
learner 0 one set of weights. A peer whose role is not known yet (before
`attach` or `register`) gets `UNKNOWN_PEER`.

Bounds are exact up to the codec's alignment (each array starts on 8 bytes).
"""

from __future__ import annotations

import math

import numpy as np

from aiorl.replay.frames import frame_layout
from aiorl.replay.trajectory_queue import ORIGIN_FIELDS
from aiorl.wire import Limits

__all__ = [
    "UNKNOWN_PEER",
    "row_bytes",
    "actor_to_memory",
    "learner_to_memory",
    "memory_to_learner",
    "to_coordinator",
    "from_coordinator",
]

_ALIGN = 8
#: What a peer may send before it says who it is: control metadata only.
UNKNOWN_PEER = Limits(max_payload_bytes=4096, max_arrays=8)
# The coordinator's replies and pushes carry no arrays except weights.
_CONTROL_ARRAYS = 8


def row_bytes(spec) -> int:
    """Bytes of one row of a ``{name: (shape, dtype)}`` spec."""
    return sum(int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize for shape, dtype in spec.values())


def _payload(rows: int, spec, extra_row_bytes: int, extra_arrays: int) -> int:
    arrays = len(spec) + extra_arrays
    return rows * (row_bytes(spec) + extra_row_bytes) + _ALIGN * arrays


def _limits(payload: int, arrays: int) -> Limits:
    return Limits(
        max_payload_bytes=max(payload, UNKNOWN_PEER.max_payload_bytes), max_arrays=max(arrays, UNKNOWN_PEER.max_arrays)
    )


def actor_to_memory(cfg, algo) -> Limits:
    """One batch (rows + float64 priorities) or one synchronous rollout. In the frame layout
    a batch's rows hold frame ids, and its new frames (raw or lz4) and their ids travel beside."""

    spec = algo.transition_spec()
    rows = algo.max_batch_rows()
    once = _per_fragment(cfg, algo, cfg.env.num_envs)  # a fragment message: one fragment per env
    layout = frame_layout(cfg, algo)
    if layout is None:
        return _limits(_payload(rows, spec, 8, 1) + once[0], len(spec) + 1 + once[1])
    wire = layout.wire_spec(spec)
    frames = max(layout.max_frames(rows) * layout.frame_bytes, layout.max_compressed_bytes(rows))
    extra = frames + 8 * layout.max_frames(rows) + 3 * _ALIGN  # frames, frame_ids
    return _limits(_payload(rows, wire, 8, 1) + extra + once[0], len(wire) + 3 + once[1])


def _per_fragment(cfg, algo, fragments: int) -> tuple[int, int]:
    """(payload bytes, arrays) of the fields `fragments` fragments hold once (`per_fragment_spec`)."""
    if algo.fragment_queue(cfg) is None:
        return 0, 0
    spec = algo.per_fragment_spec()
    return _payload(fragments, spec, 0, 0), len(spec)


def learner_to_memory(cfg, algo) -> Limits:
    """One priority update: int64 indices, uint64 generations, float64 priorities per sampled row."""
    return _limits(_payload(cfg.agent.batch_size, {}, 24, 3), 3)


def memory_to_learner(cfg, algo) -> Limits:
    """One sampled batch (+ indices, weights, generations), or one aggregate of a memory's actors."""
    spec = algo.transition_spec()
    if algo.is_synchronous(cfg):
        c = cfg.cluster
        items = algo.work_items(cfg)  # a round holds every producer's part: actors or work items
        producers_per_memory = math.ceil((c.actors if items is None else items) / c.memories)
        return _limits(_payload(producers_per_memory * algo.max_batch_rows(), spec, 0, 0), len(spec))
    queue = algo.fragment_queue(cfg)
    if queue is not None:  # whole fragments, each with its origin (weights version, actor, env: int64)
        once = _per_fragment(cfg, algo, queue.fragments_per_batch)
        payload = (
            _payload(cfg.agent.batch_size, spec, 0, len(ORIGIN_FIELDS))
            + 8 * len(ORIGIN_FIELDS) * queue.fragments_per_batch
            + once[0]
        )
        return _limits(payload, len(spec) + len(ORIGIN_FIELDS) + once[1])
    return _limits(_payload(cfg.agent.batch_size, spec, 8 + 4 + 8, 3), len(spec) + 3)


def _weights(algo) -> Limits:
    spec = algo.weights_spec()
    if spec is None:  # the algorithm does not say: the wire's default cap
        return Limits()
    return _limits(_payload(1, spec, 0, 0), len(spec) + _CONTROL_ARRAYS)


#: A role's final stats travel as one packed table (`messages.pack_table`): a memory host's
#: account of each actor grows with the cluster (80 KiB, past a frame header's 64 KiB, at 256
#: actors per memory host); 4 MiB holds some 12,000 actors' accounts.
STATS_BYTES = 4 << 20


def to_coordinator(role_name: str, algo) -> Limits:
    """What the coordinator accepts from a registered role: its final stats, and weights from
    learner 0 (it publishes)."""
    if role_name == "learner-0":
        weights = _weights(algo)
        return _limits(max(weights.max_payload_bytes, STATS_BYTES), weights.max_arrays)
    return Limits(max_payload_bytes=STATS_BYTES, max_arrays=1)


def from_coordinator(algo) -> Limits:
    """What a role accepts from the coordinator: weights at most (get_weights replies)."""
    return _weights(algo)
