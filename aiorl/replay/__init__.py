"""Replay for aiorl: sum-tree, replay buffers, n-step, GAE and V-trace, backed by the compiled `aiorl._ext`.

    from aiorl.replay import (SumTree, ReplayBuffer, PrioritizedReplayBuffer, AggregateBuffer,
                              FramePool, FrameStream, n_step_adjustment, n_step_flush, NStep, SequenceAdder,
                              gae, vtrace, BACKEND)
    from aiorl.replay.frames import FrameReplayBuffer    # frames stored once (see that module)

The compiled extension is required: if it is missing this import fails with
instructions to build it. `aiorl.replay.reference` holds the plain numpy
implementations the tests use as oracles (and the benchmarks as baselines);
they are only ever used when imported by name, never as a fallback.

Batches are `dict[str, np.ndarray]` with a leading batch dimension. A buffer
spec maps field name -> (row shape, dtype), e.g.
`{"obs": ((4,), "float32"), "action": ((), "int64")}`; rows are stored in
that dtype (uint8 frames stay uint8).

Snapshot format (`state_dict()`, `save(path)`): a flat dict of plain numpy
arrays, no pickled objects, written by `save` with `numpy.savez` and read by
`load` with `allow_pickle=False`:

- "meta": uint8 array holding UTF-8 JSON: {"format": "aiorl.replay",
  "version": 1, "kind": class name, "spec": [[name, shape, dtype.str], ...],
  ...} plus per-class counters (capacity, size, next slot, rows added, the
  numpy bit generator state; alpha, eps and max_priority for prioritized
  replay; producers received and dropped for the aggregate buffer).
- "field.<name>": the stored rows [0, size) of each field, in slot order
  (ring buffers), or "part.<producer>.<name>" (aggregate buffer).
- "priorities": float64 [size], the sum-tree values (p + eps) ** alpha
  (prioritized buffer only; p is clipped to MAX_PRIORITY = 1e8).

Loading checks the kind, capacity and spec against the receiving buffer and
every array's shape and dtype, and raises ValueError naming any mismatch.
"""

try:
    from aiorl._ext.aggregate import AggregateBuffer
    from aiorl._ext.buffers import MAX_PRIORITY, PrioritizedReplayBuffer, ReplayBuffer
    from aiorl._ext.framestore import FramePool, FrameStream
    from aiorl._ext.gae import gae
    from aiorl._ext.nstep import NStep, NStepCarry, n_step_adjustment, n_step_flush
    from aiorl._ext.sequence import SequenceAdder
    from aiorl._ext.sumtree import SumTree
    from aiorl._ext.vtrace import vtrace
except ImportError as exc:  # pragma: no cover - exercised by a subprocess test
    raise ImportError(
        f"aiorl.replay needs the compiled extension aiorl._ext, which did not import ({exc}). "
        "Build it with `pip install -e .` (or `make build`, or `python setup.py build_ext --inplace` "
        "in a checkout). The numpy code in aiorl.replay.reference is a test oracle, not a fallback."
    ) from exc

# Which implementation backs this package: always the compiled one (see above).
BACKEND = "cython"

__all__ = [
    "BACKEND",
    "MAX_PRIORITY",
    "AggregateBuffer",
    "FramePool",
    "FrameStream",
    "NStep",
    "NStepCarry",
    "PrioritizedReplayBuffer",
    "ReplayBuffer",
    "SequenceAdder",
    "SumTree",
    "gae",
    "n_step_adjustment",
    "n_step_flush",
    "vtrace",
]
