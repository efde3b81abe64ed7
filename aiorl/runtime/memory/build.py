"""Which store a memory host keeps, from what the run declares (``offline.dataset``) and
what the algorithm does (`aiorl.runtime.algorithm.Algorithm`: ``is_synchronous``,
``fragment_queue``, the frame layout, ``agent.prioritized_replay``), built once.

`STORES` is asked in order: the first store class whose `wanted` holds is the
run's. A new kind of data is one more class there, never a branch in the role.
"""

from __future__ import annotations

from aiorl.replay.frames import frame_layout
from aiorl.runtime.memory.dataset_store import DatasetStore
from aiorl.runtime.memory.queue_store import QueueStore
from aiorl.runtime.memory.replay_store import ReplayStore, shard_capacity
from aiorl.runtime.memory.rounds_store import RoundsStore
from aiorl.runtime.memory.store import Store, StoreParts
from aiorl.runtime.messages import RowSpec

STORES: list[type[Store]] = [DatasetStore, RoundsStore, QueueStore, ReplayStore]


def store_class(cfg) -> type[Store]:
    """The store the configured algorithm keeps its data in."""
    return next(cls for cls in STORES if cls.wanted(cfg))


def build_store(cfg, algo, parts: StoreParts) -> Store:
    """The run's store, with the checks every message from an actor goes through."""
    layout = frame_layout(cfg, algo)
    # Frame layout: a batch's rows carry frame ids; its frames travel beside them. A fragment's
    # own fields are held to the same values (a NaN state is as bad as a NaN reward).
    spec = algo.transition_spec()
    wire = layout.wire_spec(spec) if layout is not None else spec
    rows = RowSpec({**wire, **algo.per_fragment_spec()}, bounds=algo.value_bounds())
    return store_class(cfg).build(cfg, algo, parts, rows, layout)


def replay_bytes(cfg, algo) -> tuple[int, int]:
    """(bytes per row, bytes of one memory host's shard when full): what the configured store
    takes at least for ``agent.buffer_size`` (0 for a store whose memory does not grow with it)."""
    per_row = store_class(cfg).bytes_per_row(cfg, algo, frame_layout(cfg, algo))
    return per_row, per_row * shard_capacity(cfg)
