"""The memory host's own bookkeeping, in process (no sockets): priority updates
for slots overwritten since sampling are counted stale and never applied by
its replay store."""

from __future__ import annotations

import numpy as np

from aiorl.experiment.loading import load_config
from aiorl.replay import PrioritizedReplayBuffer
from aiorl.runtime.memory import LearnerLink, MemoryRole
from aiorl.runtime.memory.replay_store import ReplayStore
from aiorl.wire import Message

SPEC = {
    "obs": ((4,), "<f4"),
    "action": ((), "<i8"),
    "reward": ((), "<f4"),
    "next_obs": ((4,), "<f4"),
    "done": ((), "|b1"),
    "discount": ((), "<f4"),
}


def rows(n: int, start: int = 0) -> dict[str, np.ndarray]:
    obs = np.arange(start, start + n, dtype=np.float32)[:, None].repeat(4, axis=1)
    return {
        "obs": obs,
        "action": np.zeros(n, np.int64),
        "reward": np.ones(n, np.float32),
        "next_obs": obs + 1,
        "done": np.zeros(n, bool),
        "discount": np.full(n, 0.99, np.float32),
    }


def test_priorities_for_overwritten_slots_are_stale_and_not_applied(tmp_path):
    cfg = load_config(data={"algo": "random_agent", "agent": {"buffer_size": 4, "batch_size": 4, "learning_starts": 4}})
    memory = MemoryRole(cfg, 0, tmp_path, b"t" * 32)
    replay = PrioritizedReplayBuffer(4, SPEC, alpha=1.0, eps=1e-6, seed=0)
    store = ReplayStore(memory.store_parts(), replay, None, capacity=4, threshold=4, batch_size=4, prioritized=True)
    replay.add(rows(4), priorities=[1.0, 2.0, 3.0, 4.0])
    sampled = replay.sample(8, beta=0.4)
    replay.add(rows(2, start=100), priorities=[0.5, 0.5])  # slots 0 and 1 now hold other rows
    overwritten = np.isin(sampled["indices"], [0, 1])
    assert overwritten.any() and not overwritten.all()
    before = replay.tree.get(np.arange(4))

    link = LearnerLink("learner-0")
    store.on_priorities(
        link,
        Message(
            "priorities",
            {},
            {"indices": sampled["indices"], "generations": sampled["generations"], "priorities": np.full(8, 9.0)},
        ),
    )

    assert link.priority_messages == 1
    assert link.priorities_stale == int(overwritten.sum())
    assert link.priorities_applied == int((~overwritten).sum())
    after = replay.tree.get(np.arange(4))
    assert after[0] == before[0] and after[1] == before[1], "the new rows keep their own priority"
    for slot in set(sampled["indices"][~overwritten].tolist()):
        assert after[slot] == 9.0 + 1e-6
