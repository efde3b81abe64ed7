"""Per-connection frame limits: what each role legitimately sends fits, a little more does not."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from apex_helpers import make_algo
from hostile_helpers import Memory0, batch

from aiorl.envs import EnvRunner
from aiorl.replay import AggregateBuffer, PrioritizedReplayBuffer
from aiorl.runtime import frame_limits
from aiorl.wire import Limits

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def payload(arrays: dict) -> int:
    """The payload bytes of the frame these arrays make: each array starts on 8 bytes (see the codec)."""
    end = 0
    for array in arrays.values():
        end = ((end + 7) & ~7) + np.asarray(array).nbytes
    return end


def fits(arrays: dict, limits: Limits) -> bool:
    return payload(arrays) <= limits.max_payload_bytes and len(arrays) <= limits.max_arrays


@pytest.mark.parametrize("algo_name, env_id, n_step", [("apex_dqn", "CartPole-v1", 5), ("apex_ddpg", "Pendulum-v1", 3)])
def test_the_largest_actor_batch_and_the_weights_fit(algo_name, env_id, n_step):
    algo = make_algo(
        algo_name, env_id, {"n_step": n_step}, env={"num_envs": 3}, agent={"sample_batch_size": 32, "batch_size": 16}
    )
    cfg = algo.cfg
    actor = algo.make_actor(0, 1, seed=0)
    runner = EnvRunner(cfg.env, 3, seed=0)
    to_memory = frame_limits.actor_to_memory(cfg, algo)
    largest = 0
    for _ in range(6):  # open windows carried over: later batches hold more rows than the first
        rows, priorities = actor.postprocess(runner.rollout(actor.act, 32))
        if rows:
            arrays = {**rows, "priorities": priorities}
            largest = max(largest, len(priorities))
            assert fits(arrays, to_memory)
    runner.close()
    assert 32 * 3 <= largest <= algo.max_batch_rows() == (32 + n_step - 1) * 3
    # A batch of max_batch_rows rows is the bound itself; one row more is over it.
    full = {k: np.repeat(v[:1], algo.max_batch_rows(), axis=0) for k, v in rows.items()}
    assert fits({**full, "priorities": np.ones(algo.max_batch_rows())}, to_memory)
    over = {k: np.repeat(v[:1], algo.max_batch_rows() + 2, axis=0) for k, v in rows.items()}
    assert not fits({**over, "priorities": np.ones(algo.max_batch_rows() + 2)}, to_memory)
    # Weights: exactly what learner 0 publishes.
    weights = algo.make_learner(0, 1, seed=0).get_weights()
    assert fits(weights, frame_limits.to_coordinator("learner-0", algo))
    assert fits(weights, frame_limits.from_coordinator(algo))
    assert not fits(weights, frame_limits.to_coordinator("actor-0", algo))
    # A sampled batch and the priorities that come back.
    replay = PrioritizedReplayBuffer(1000, algo.transition_spec(), alpha=0.6, seed=0)
    replay.add(full, np.ones(len(full["reward"])))
    sample = replay.sample(cfg.agent.batch_size, 0.4)
    assert fits(sample, frame_limits.memory_to_learner(cfg, algo))
    update = {
        "indices": sample["indices"],
        "generations": sample["generations"],
        "priorities": np.ones(cfg.agent.batch_size),
    }
    assert fits(update, frame_limits.learner_to_memory(cfg, algo))


def test_synchronous_rollouts_and_aggregates_fit():
    algo = make_algo(
        "random_agent",
        "CartPole-v1",
        {"synchronous": True},
        env={"num_envs": 4},
        cluster={"actors": 3, "memories": 2},
        agent={"sample_batch_size": 16},
    )
    cfg = algo.cfg
    policy = algo.make_actor(0, 3, seed=0)
    runner = EnvRunner(cfg.env, 4, seed=0)
    rollout, _ = policy.postprocess(runner.rollout(policy.act, 16))
    runner.close()
    assert len(rollout["obs"]) == 16 * 4 == algo.max_batch_rows()
    assert fits(rollout, frame_limits.actor_to_memory(cfg, algo))
    aggregate = AggregateBuffer(2, algo.transition_spec())  # memory 0 collects actors 0 and 2
    aggregate.add(0, rollout)
    aggregate.add(1, rollout)
    assert fits(aggregate.take(), frame_limits.memory_to_learner(cfg, algo))


async def test_a_batch_over_the_actors_limit_closes_its_connection(tmp_path, caplog):
    async with Memory0(tmp_path) as m:
        actor, session = await m.register("actor-0")
        await m.register("learner-0")
        await m.running()
        conn = await m.attach("actor-0", session)
        limit = frame_limits.actor_to_memory(m.cfg, m.memory.algorithm()).max_payload_bytes
        rows = max(m.memory.algorithm().max_batch_rows(), limit // 61)  # 61 bytes a row, priority included
        await conn.send("batch", {"actor": 0, "seq": 0}, {**batch(rows), "priorities": np.ones(rows)})
        await m.until(lambda: m.memory.inserted == rows, "a batch at the limit")
        more = rows + 8
        await conn.send("batch", {"actor": 0, "seq": 1}, {**batch(more), "priorities": np.ones(more)})
        async with asyncio.timeout(30):
            await conn.wait_closed()
    assert "exceeds max_payload_bytes" in caplog.text
