"""The learner role's own logic with fake connections: weights snapshots, memory loss, PER's beta.

These drive `LearnerRole` methods in-process (a unit test of the role, not of
the transport: the cluster tests cover that); the fakes record what the
learner sends.
"""

from __future__ import annotations

import asyncio
import threading
import time

import numpy as np
import pytest
from cluster_helpers import read_json, run

from aiorl.experiment.loading import load_config
from aiorl.runtime.algorithm import LearnerCore, LearnerResult
from aiorl.runtime.learner import _END, LearnerRole
from aiorl.wire import Message

CONFIG = {
    "algo": "random_agent",
    "env": {"id": "CartPole-v1"},
    "agent": {
        "batch_size": 4,
        "buffer_size": 100,
        "learning_starts": 4,
        "publish_interval": 1,
        "scheduled_global_steps": 1000,
        "prioritized_replay_beta": 0.4,
        "prioritized_replay_beta_final": 1.0,
    },
    "run": {"tensorboard": False},
}


class FakeConnection:
    def __init__(self):
        self.sent: list[tuple[str, dict]] = []
        self.published: list[dict[str, np.ndarray]] = []

    async def send(self, kind, meta=None, arrays=None):
        self.sent.append((kind, dict(meta or {})))
        await asyncio.sleep(0)

    async def request(self, kind, meta=None, arrays=None, *, timeout_s):
        if kind == "publish":
            # The wire sends large arrays zero-copy, later: what matters is their content then.
            await asyncio.sleep(0.001)
            self.published.append({k: v.copy() for k, v in arrays.items()})
        return Message("ok", {"version": len(self.published)}, {}, 1)


class SlowCore(LearnerCore):
    """Eight weight arrays that each step sets to its step number one after the other,
    sleeping (GIL released) in between: a torn read sees two step numbers."""

    def __init__(self):
        self.weights = [np.zeros(256) for _ in range(8)]
        self.steps = 0
        self.in_step = threading.Event()

    def step(self, batch):
        self.steps += 1
        for w in self.weights:
            w[:] = self.steps
            time.sleep(0.003)
        return LearnerResult({"loss": 0.0}, None)

    def get_weights(self):
        return {f"w{i}": w.copy() for i, w in enumerate(self.weights)}


def make_learner(tmp_path, overrides=()) -> LearnerRole:
    cfg = load_config(data=CONFIG, overrides=[f"run.dir={tmp_path}", *overrides])
    learner = LearnerRole(cfg, 0, tmp_path, b"t" * 64)
    learner._fatal = asyncio.get_running_loop().create_future()
    learner.coordinator = FakeConnection()
    learner.memories = [FakeConnection()]
    learner.per_memory = [{"batches": 0, "priority_messages": 0, "priorities": 0}]
    return learner


def checksum_ok(weights: dict[str, np.ndarray]) -> bool:
    """All arrays of one snapshot come from one step: their sum is 8x the first array's."""
    total = sum(float(w.sum()) for w in weights.values())
    return total == 8 * float(weights["w0"].sum())


async def test_published_weights_are_never_torn_between_two_steps(tmp_path):
    learner = make_learner(tmp_path)
    learner.core = SlowCore()
    batch = {"obs": np.zeros((4, 4), np.float32)}
    for _ in range(12):
        learner.queue.put_nowait((0, Message("samples", {"memory": 0}, batch)))
    learner.queue.put_nowait((0, _END))
    async with asyncio.timeout(60):
        await learner._async_loop()
    published = learner.coordinator.published
    assert len(published) >= 3 and learner.counters["learner_steps"] == 12
    torn = [sorted({float(w[0]) for w in p.values()}) for p in published if not checksum_ok(p)]
    assert not torn, f"torn snapshots (step numbers mixed in one publish): {torn}"


class EndlessConnection:
    """A memory connection that delivers one batch, then ends (cleanly or not) without `end`."""

    def __init__(self, error: Exception | None):
        self.error = error

    def __aiter__(self):
        self.items = [Message("samples", {"memory": 0}, {})]
        return self

    async def __anext__(self):
        if self.items:
            return self.items.pop()
        if self.error is not None:
            raise self.error
        raise StopAsyncIteration


@pytest.mark.parametrize("error", [None, __import__("aiorl.wire", fromlist=["x"]).ConnectionClosed("gone")])
async def test_a_memory_connection_that_ends_before_its_end_message_fails_the_learner(tmp_path, error):
    learner = make_learner(tmp_path)
    with pytest.raises(RuntimeError, match="before its end message"):
        await learner._reader(0, EndlessConnection(error))
    assert learner.queue.qsize() == 1  # the batch it did get; no _END that would pass for a clean end


async def test_beta_anneals_over_the_runs_learner_steps_not_this_learners(tmp_path):
    learner = make_learner(tmp_path, ["cluster.learners=2"])
    assert learner.beta() == pytest.approx(0.4)
    # Two data-parallel learners step together, each to its share (500) of the run's 1000: this
    # one's 260 steps put the run at 520, whatever the last heartbeat said (it lags).
    learner.run_counters = {"learner_steps": 400, "env_steps": 0}
    learner.counters["learner_steps"] = 260
    assert learner.schedule_progress() == pytest.approx(0.52)
    assert learner.beta() == pytest.approx(0.4 + 0.52 * 0.6)
    learner.counters["learner_steps"] = 500  # its share done: the run's budget is (it stops there)
    assert learner.beta() == pytest.approx(1.0) and learner.budget_reached


async def test_beta_anneals_over_env_steps_when_those_end_the_run(tmp_path):
    learner = make_learner(tmp_path, ["agent.scheduled_global_steps=null", "agent.scheduled_timesteps=2000"])
    learner.run_counters = {"learner_steps": 5, "env_steps": 1500}
    assert learner.beta() == pytest.approx(0.4 + 0.75 * 0.6)


def test_two_learners_reach_the_final_beta_when_the_run_ends(tmp_path):
    config = {
        "algo": "random_agent",
        "env": {"id": "CartPole-v1", "num_envs": 2},
        "cluster": {"actors": 1, "memories": 1, "learners": 2},
        "agent": {
            "sample_batch_size": 16,
            "batch_size": 32,
            "buffer_size": 4000,
            "learning_starts": 200,
            "scheduled_global_steps": 600,
            "prioritized_replay_beta": 0.4,
            "prioritized_replay_beta_final": 1.0,
        },
        "model": {"learner_step_sleep_s": 0.004},
        "run": {"tensorboard": False},
    }
    code, out, run_dir = run(tmp_path, config)
    assert code == 0, out
    summary = read_json(run_dir / "summary.json")
    for name in ("learner-0", "learner-1"):
        stats = summary["roles"][name]["stats"]
        # Each learner made about half of the 600 steps; by its own count beta would end near 0.7.
        assert stats["learner_steps"] < 500
        assert stats["prioritized_replay_beta_last"] >= 0.97, (name, stats["prioritized_replay_beta_last"])
