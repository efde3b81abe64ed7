"""Values checked where they arrive, not where they crash (issue 29, point 3).

A memory host drops, counts and logs the rows a learner must not get: a Discrete action out of
the space, a float that is not finite, an ES noise index off the table, a fragment acted with
weights not yet published. The peer's connection stays open and the rest of its message is kept.
Memory hosts run in the test's loop behind real TCP (`hostile_helpers.Memory0`); the test plays
the actors and learner 0 over real connections. The learner's last line: V-trace lets a NaN
through to the non-finite guard, and a batch holding non-finite values is dropped, not fatal.
"""

from __future__ import annotations

import asyncio
import logging

import numpy as np
import pytest
from hostile_helpers import HANG_S, Memory0

from aiorl.experiment.loading import load_config
from aiorl.replay import vtrace
from aiorl.runtime.algorithm import LearnerCore, PeerNotFinite, build_algorithm
from aiorl.runtime.learner import _END, LearnerRole
from aiorl.runtime.memory import MemoryRole
from aiorl.wire import Message

ES = ["algo=es", "model.population=5", "model.noise_table_size=10000"]
IMPALA = ["algo=impala", "env.num_envs=2"]
DROPPED = "with a value out of range or not finite"


def rows_of(spec: dict, n: int) -> dict[str, np.ndarray]:
    """`n` rows of `spec` that every check lets through (zeros: action 0, noise index 0)."""
    return {name: np.zeros((n, *shape), dtype) for name, (shape, dtype) in spec.items()}


def spec_of(m) -> dict:
    return m.memory.algorithm().transition_spec()


def lines(caplog, needle: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and needle in r.getMessage()]


async def started(tmp_path, overrides=()) -> Memory0:
    m = Memory0(tmp_path, overrides)
    await m.__aenter__()
    m.actor, m.actor_session = await m.register("actor-0")
    m.learner, m.learner_session = await m.register("learner-0")
    await m.running()
    return m


@pytest.fixture
async def cluster(tmp_path, caplog, request):
    caplog.set_level(logging.INFO)
    m = await started(tmp_path, getattr(request, "param", ()))
    try:
        yield m
    finally:
        await m.__aexit__(None, None, None)


# ------------------------------------------------------------------ replay batches (Ape-X)


@pytest.mark.parametrize(
    "cluster, priorities",
    [((), True), ((), False), (("agent.prioritized_replay=false",), False)],
    indirect=["cluster"],
    ids=["prioritized", "prioritized-without-priorities", "uniform"],
)
async def test_actions_outside_the_discrete_space_are_dropped_counted_and_the_connection_stays(
    cluster, caplog, priorities
):
    m = cluster
    actor = await m.attach("actor-0", m.actor_session)
    rows = rows_of(spec_of(m), 6)
    rows["action"][:] = [0, 7, 1, -1, 2**40, 1]  # CartPole: two actions
    extra = {"priorities": np.ones(6)} if priorities else {}
    await actor.send("batch", {"actor": 0, "seq": 0}, {**rows, **extra})
    good = rows_of(spec_of(m), 2)
    await actor.send("batch", {"actor": 0, "seq": 1}, {**good, **({"priorities": np.ones(2)} if priorities else {})})
    await m.until(lambda: m.memory.inserted == 5, "the good rows of both batches")
    (link,) = m.memory.actor_links
    assert link.rows_rejected == 3 and m.memory.rows_rejected == 3 and link.batches == 2
    assert m.memory.metrics()["rows_rejected"] == 3 and m.memory._actor_stats()["actor-0"]["rows_rejected"] == 3
    assert not actor.closed and m.memory.bad_messages == 0 and not m.memory._fatal.done()
    assert len(m.memory.store.replay) == 5
    sampled = (
        m.memory.store.replay.sample(64, 0.4) if m.cfg.agent.prioritized_replay else m.memory.store.replay.sample(64)
    )
    assert set(np.unique(sampled["action"])) <= {0, 1}
    assert lines(caplog, f"actor-0: dropped 3 of 6 rows {DROPPED} (in action)")


@pytest.mark.parametrize("bad", [(np.nan, np.inf, -np.inf), (np.inf, -np.inf, np.inf)], ids=["nan", "infinities"])
@pytest.mark.parametrize(
    "cluster, field",
    [((), "obs"), ((), "reward"), ((), "next_obs"), ((), "discount"), (("env.id=Pendulum-v1",), "action")],
    indirect=["cluster"],
)
async def test_non_finite_floats_are_dropped_and_counted(cluster, field, bad):
    m = cluster
    actor = await m.attach("actor-0", m.actor_session)
    rows = rows_of(spec_of(m), 5)
    flat = rows[field].reshape(5, -1)
    flat[1, 0], flat[2, -1], flat[4, 0] = bad
    await actor.send("batch", {"actor": 0, "seq": 0}, {**rows, "priorities": np.ones(5)})
    await m.until(lambda: m.memory.inserted == 2, "the two finite rows")
    assert m.memory.rows_rejected == 3 and not actor.closed
    stored = m.memory.store.replay.sample(32, 0.4)
    assert all(np.isfinite(v).all() for v in stored.values() if v.dtype.kind == "f")


FRAMES = ["env.wrappers=[{FrameStackObservation: {stack_size: 2}}]", "agent.replay_layout=frames"]


def frame_rows(obs: list, next_obs: list, actions: list) -> dict[str, np.ndarray]:
    """Rows of the frame layout (stacks of 2 CartPole frames, as frame ids)."""
    n = len(actions)
    return {
        "obs": np.array(obs, np.int64),
        "action": np.array(actions, np.int64),
        "reward": np.ones(n, np.float32),
        "next_obs": np.array(next_obs, np.int64),
        "done": np.zeros(n, np.bool_),
        "discount": np.full(n, 0.99, np.float32),
        "priorities": np.ones(n),
    }


@pytest.mark.parametrize("cluster", [FRAMES], indirect=True)
async def test_frame_layout_rows_are_dropped_and_their_frames_kept_for_later_messages(cluster):
    m = cluster
    actor = await m.attach("actor-0", m.actor_session)
    frames = np.arange(5 * 4, dtype=np.float32).reshape(5, 4)
    # Row 1 is the only one referencing frame 3; message 2 leans on frame 3 without sending it.
    first = frame_rows([[0, 1], [1, 2]], [[1, 2], [2, 3]], [0, 7])
    await actor.send("batch", {"seq": 0, "keep_from": 0}, {**first, "frames": frames[:4], "frame_ids": np.arange(4)})
    second = frame_rows([[2, 3]], [[3, 4]], [1])
    await actor.send("batch", {"seq": 1, "keep_from": 0}, {**second, "frames": frames[4:], "frame_ids": np.array([4])})
    await m.until(lambda: m.memory.inserted == 2, "rows 0 and the second message's")
    assert m.memory.rows_rejected == 1 and not actor.closed and m.memory.bad_messages == 0
    sampled = m.memory.store.replay.sample(16, 0.4)
    assert set(np.unique(sampled["action"])) <= {0, 1}
    stacks = {tuple(map(tuple, s)) for s in sampled["next_obs"]}
    assert stacks <= {tuple(map(tuple, frames[[1, 2]])), tuple(map(tuple, frames[[3, 4]]))}


# ------------------------------------------------------------------ ES results (rollouts of work items)


@pytest.mark.parametrize("cluster", [ES], indirect=True)
async def test_es_noise_indices_off_the_table_and_non_finite_returns_are_dropped(cluster):
    m = cluster
    algo = m.memory.algorithm()
    last = m.cfg.model.noise_table_size - algo.dim  # the last index with a whole perturbation
    actor = await m.attach("actor-0", m.actor_session)
    # Item 4's return is NaN; item 3 is at the edge of the table, and fine.
    for item, index in enumerate([-1, 2**40, last + 1, last, 17]):
        rows = rows_of(algo.transition_spec(), 1)
        rows["noise_index"][:] = index
        rows["returns"][:] = [1.0, 2.0] if item != 4 else [np.nan, 2.0]
        await actor.send("rollout", {"actor": 0, "iteration": 0, "item": item, "weights_version": 0}, rows)
    # Every item counts as delivered (its round does not wait for it); only item 3's row is kept.
    await m.until(lambda: 0 in m.memory.store.rounds.completed, "round 0")
    batch, _ = m.memory.store.rounds.completed[0]
    assert batch["noise_index"].tolist() == [last]
    assert m.memory.rows_rejected == 4 and not actor.closed and not m.memory._fatal.done()
    # The learner takes the round as it is: a whole perturbation, a finite update.
    learner = algo.make_learner(0, 1, seed=0)
    learner.step(batch)
    assert np.isfinite(learner.theta).all()


# ------------------------------------------------------------------ IMPALA fragments


def fragments_of(m, **bad) -> dict[str, np.ndarray]:
    """One fragment per env (two envs), env 0's field `name` set to `value` for each bad item."""
    T = m.cfg.agent.sample_batch_size
    spec = spec_of(m)
    arrays = {name: np.zeros((2, T, *shape), dtype) for name, (shape, dtype) in spec.items()}
    for name, value in bad.items():
        arrays[name][0, T // 2] = value
    return arrays


@pytest.mark.parametrize("cluster", [IMPALA], indirect=True)
async def test_fragments_with_bad_values_or_an_unpublished_version_are_dropped(cluster, caplog):
    m = cluster
    T = m.cfg.agent.sample_batch_size
    assert await m.publish(m.learner) == 0
    actor = await m.attach("actor-0", m.actor_session)
    depth = m.cfg.cluster.actor_credits  # the memory tops an actor up to it (the queue has room for more)
    await m.until(lambda: m.memory.actor_links and m.memory.actor_links[0].credits == depth, "the actor's credits")
    link = m.memory.actor_links[0]
    sent = [
        (0, fragments_of(m, behaviour_logits=np.nan)),  # env 0 dropped, env 1 kept
        (1, fragments_of(m)),  # version 1 is not published: both dropped
        (0, fragments_of(m, action=7)),  # env 0 dropped
        (2**40, fragments_of(m)),  # both dropped
        (0, fragments_of(m, reward=np.inf, obs=np.nan)),  # env 0 dropped
    ]
    for seq, (version, arrays) in enumerate(sent):
        await m.until(lambda: link.credits > 0, "a credit")  # the memory host's, as a real actor waits
        await actor.send("fragment", {"seq": seq, "weights_version": version}, arrays)
        await m.until(lambda: link.batches == seq + 1, f"fragment message {seq}")
    queue = m.memory.store.hub.queue
    assert len(queue) == 3 and queue.versions().tolist() == [0, 0, 0]
    assert m.memory.rows_rejected == link.rows_rejected == 7 * T
    assert link.transitions == 3 * T and not actor.closed and m.memory.bad_messages == 0
    batch, _ = m.memory.store.hub.take()
    assert np.isfinite(batch["behaviour_logits"]).all() and set(np.unique(batch["action"])) <= {0, 1}
    assert lines(caplog, f"actor-0: dropped {2 * T} of {2 * T} rows acted with weights version 1, not yet published")
    assert lines(caplog, f"actor-0: dropped {T} of {2 * T} rows {DROPPED} (in behaviour_logits)")
    assert lines(caplog, f"actor-0: dropped {T} of {2 * T} rows {DROPPED} (in obs, reward)")


async def test_a_memory_host_that_has_not_heard_of_a_version_asks_before_it_drops(tmp_path, caplog):
    """Memory 1 hears of new versions by heartbeat or a learner's credit; an actor may fetch one
    from the coordinator first. Its fragments are kept: memory 1 asks the coordinator."""
    caplog.set_level(logging.INFO)
    slow = [*IMPALA, "cluster.memories=2", "cluster.heartbeat_interval_s=20", "cluster.coordinator_timeout_s=30"]
    async with Memory0(tmp_path, slow) as m:
        memory1 = MemoryRole(m.cfg, 1, m.run_dir, m.token)
        m.tasks.append(asyncio.create_task(memory1.run()))
        m.actor, m.actor_session = await m.register("actor-0")
        m.learner, _ = await m.register("learner-0")
        await m.running()
        await m.until(lambda: memory1.store is not None and memory1.server is not None, "memory 1 serving")
        assert await m.publish(m.learner) == 0 and memory1.weights_version_seen == -1
        conn = await m.connect(m.coordinator.roles["memory-1"].address, "actor-0")
        await conn.request("attach", {"session": m.actor_session}, timeout_s=HANG_S)
        await m.until(lambda: memory1.actor_links and memory1.actor_links[0].credits > 0, "a credit")
        await conn.send("fragment", {"seq": 0, "weights_version": 0}, fragments_of(m))
        await m.until(lambda: memory1.actor_links[0].batches == 1, "the fragment message")
        await conn.send("fragment", {"seq": 1, "weights_version": 1}, fragments_of(m))
        await m.until(lambda: memory1.actor_links[0].batches == 2, "the second fragment message")
        assert len(memory1.store.hub.queue) == 2 and memory1.weights_version_seen == 0
        assert memory1.rows_rejected == 2 * m.cfg.agent.sample_batch_size  # version 1 was never published
        await memory1.cleanup()


# ------------------------------------------------------------------ the learner's last line


def test_vtrace_lets_a_nan_importance_ratio_through():
    B, T = 2, 5
    log_rhos = np.zeros((B, T), np.float32)
    log_rhos[0, 2] = np.nan
    rewards, values = np.ones((B, T), np.float32), np.zeros((B, T), np.float32)
    done = np.zeros((B, T), np.bool_)
    for bars in ((1.0, 1.0), (np.inf, np.inf)):
        vs, pg = vtrace(log_rhos, rewards, values, np.zeros(B, np.float32), done, done, 0.9, *bars)
        assert np.isnan(vs[0, :3]).all() and np.isnan(pg[0, 2]), (bars, vs, pg)
        assert np.isfinite(vs[0, 3:]).all() and np.isfinite(vs[1]).all() and np.isfinite(pg[1]).all()


class FakeConnection:
    def __init__(self):
        self.sent: list[tuple[str, dict]] = []

    async def send(self, kind, meta=None, arrays=None):
        self.sent.append((kind, dict(meta or {})))

    async def request(self, kind, meta=None, arrays=None, *, timeout_s):
        return Message("ok", {"version": 0}, {}, 1)


def impala_learner(tmp_path) -> tuple[LearnerRole, object]:
    cfg = load_config(
        data={
            "algo": "impala",
            "env": {"id": "CartPole-v1", "num_envs": 2},
            "agent": {"sample_batch_size": 4, "batch_size": 8, "publish_interval": 1},
            "model": {"network": ["linear:16", "tanh"]},
            "run": {"tensorboard": False},
        },
        overrides=[f"run.dir={tmp_path}"],
    )
    learner = LearnerRole(cfg, 0, tmp_path, b"t" * 64)
    learner._fatal = asyncio.get_running_loop().create_future()
    learner.coordinator = FakeConnection()
    learner.memories = [FakeConnection()]
    learner.per_memory = [{"batches": 0, "priority_messages": 0, "priorities": 0}]
    algo = build_algorithm(cfg)
    learner.core = algo.make_learner(0, 1, seed=0)
    return learner, algo


def fragment_batch(algo, rng) -> dict[str, np.ndarray]:
    spec = algo.transition_spec()
    batch = {name: np.zeros((2, 4, *shape), dtype) for name, (shape, dtype) in spec.items()}
    batch["obs"][:] = rng.standard_normal(batch["obs"].shape)
    batch["reward"][:] = 1.0
    return {**batch, "weights_version": np.zeros(2, np.int64)}


async def test_a_learner_drops_a_batch_holding_non_finite_values_and_goes_on(tmp_path):
    learner, algo = impala_learner(tmp_path)
    rng = np.random.default_rng(0)
    poisoned = fragment_batch(algo, rng)
    poisoned["behaviour_logits"][1, 2] = np.nan  # V-trace's ratio is NaN there: so is the loss
    before = learner.core.get_weights()
    learner.queue.put_nowait((0, Message("samples", {"memory": 0}, poisoned)))
    learner.queue.put_nowait((0, Message("samples", {"memory": 0}, fragment_batch(algo, rng))))
    learner.queue.put_nowait((0, _END))
    async with asyncio.timeout(HANG_S):
        await learner._async_loop()
    assert learner.batches_dropped == 1 and learner.metrics()["batches_dropped"] == 1
    assert learner.counters["learner_steps"] == 1  # the good batch
    credits = [meta for kind, meta in learner.memories[0].sent if kind == "credit"]
    assert len(credits) == 1 + 2  # the first grant, then one back for each batch: none is lost
    assert not learner._fatal.done()
    after = learner.core.get_weights()
    assert all(np.isfinite(v).all() for v in after.values())
    assert any(not np.array_equal(before[k], after[k]) for k in before)


class Diverged(LearnerCore):
    def step(self, batch):
        raise FloatingPointError("loss is NaN")

    def get_weights(self):
        return {"w": np.zeros(1, np.float32)}


class PeerPoisoned(Diverged):
    def step(self, batch):
        raise PeerNotFinite("loss is NaN or infinite on a data-parallel peer learner")


async def test_a_learner_drops_the_step_its_data_parallel_peer_could_not_take(tmp_path):
    """Its own batch is finite; the peer's was not (the peer drops it too): neither applies the
    step, both go on in step."""
    learner, algo = impala_learner(tmp_path)
    learner.core = PeerPoisoned()
    assert await learner._train(0, fragment_batch(algo, np.random.default_rng(0))) is False
    assert learner.batches_dropped == 1 and learner.counters["learner_steps"] == 0


async def test_a_non_finite_loss_on_finite_data_still_fails_the_learner(tmp_path):
    learner, algo = impala_learner(tmp_path)
    learner.core = Diverged()
    with pytest.raises(RuntimeError, match="learner step 1 on a batch from memory-0: loss is NaN"):
        await learner._train(0, fragment_batch(algo, np.random.default_rng(0)))
    assert learner.batches_dropped == 0
