"""A memory host against peers that hold the token but break the runtime's rules.

Memory host 0 runs in the test's loop (`hostile_helpers.Memory0`) behind real
TCP; the test registers fake roles with the coordinator and sends what a
real actor or learner never would. Each case checks the memory host's
answer (refuse, drop rows, close that one connection) and that it keeps
serving, or, for its own failures, that it fails loudly through the phases.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import numpy as np
import pytest
from hostile_helpers import HANG_S, Memory0, batch

from aiorl.wire import ConnectionClosed, RemoteError

MEMORY_LOG = "aiorl.memory-0"


@contextlib.asynccontextmanager
async def registered_memory0(tmp_path, caplog, transport: str, overrides=()):
    """Coordinator and memory host 0 in this loop, actor-0 and learner-0 registered, RUNNING."""
    caplog.set_level(logging.INFO)
    async with Memory0(tmp_path, overrides, transport=transport) as m:
        m.actor, m.actor_session = await m.register("actor-0")
        m.learner, m.learner_session = await m.register("learner-0")
        await m.running()
        yield m


@pytest.fixture(params=["tcp", "shm"])
async def memory0(tmp_path, caplog, request):
    async with registered_memory0(tmp_path, caplog, request.param) as m:
        yield m


# A role whose connection the coordinator cut is lost once its time to rejoin is out
# (cluster.coordinator_timeout_s plus two heartbeats): 5.4 s of waiting in each test that waits
# for that verdict with the helpers' settings, 1.4 s with these.
SHORT_REJOIN_GRACE = ("cluster.coordinator_timeout_s=1.0",)


@pytest.fixture(params=["tcp", "shm"])
async def memory0_short_grace(tmp_path, caplog, request):
    async with registered_memory0(tmp_path, caplog, request.param, SHORT_REJOIN_GRACE) as m:
        yield m


def warnings(caplog, needle: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and needle in r.getMessage()]


async def test_phantom_and_duplicate_names_are_refused_and_counted(memory0, caplog):
    m = memory0
    # Names this run does not have, with any session.
    for name in ("actor-99", "learner-9", "memory-0", "intruder"):
        with pytest.raises((RemoteError, ConnectionClosed)):
            await m.attach(name, "0" * 32)
    # A live name without its registration's session.
    with pytest.raises(RemoteError, match="not the session"):
        await m.attach("actor-0", "f" * 32)
    assert m.memory.peers_refused["unknown"] == 4 and m.memory.peers_refused["session"] == 1
    # The real registration attaches, once: a second connection with the same session is refused.
    real = await m.attach("actor-0", m.actor_session)
    with pytest.raises(RemoteError, match="already attached"):
        await m.attach("actor-0", m.actor_session)
    assert m.memory.peers_refused["duplicate"] == 1
    await real.send("batch", {"actor": 0, "seq": 0}, {**batch(5), "priorities": np.ones(5)})
    await m.until(lambda: m.memory.inserted == 5, "the real actor's batch")
    assert {link.name for link in m.memory.actor_links} == {"actor-0"}  # no phantom ever got a link
    assert m.memory.metrics()["peers_refused"] == 6
    assert warnings(caplog, "refused actor-99")


async def test_a_new_registration_of_a_name_replaces_the_old_connection(memory0):
    """A restarted role registers again (new session); its predecessor's connection is dropped."""
    m = memory0
    old = await m.attach("actor-0", m.actor_session)
    record = m.coordinator.roles["actor-0"]
    record.session = "a" * 32  # what a re-registration of actor-0 would hand out
    with pytest.raises(RemoteError, match="not the session"):
        await m.attach("actor-0", m.actor_session)  # the old session no longer attaches
    new = await m.attach("actor-0", "a" * 32)
    async with asyncio.timeout(HANG_S):
        await old.wait_closed()
    await new.send("batch", {"actor": 0, "seq": 0}, {**batch(3), "priorities": np.ones(3)})
    await m.until(lambda: m.memory.inserted == 3, "the new connection's batch")


async def test_a_bad_credit_closes_that_connection_and_the_memory_host_keeps_serving(memory0, caplog):
    m = memory0
    learner = await m.attach("learner-0", m.learner_session)
    await learner.send("credit", {"n": 1, "beta": -1.0})
    async with asyncio.timeout(HANG_S):
        await learner.wait_closed()
    assert warnings(caplog, "credit.beta must be a finite number in [0, 1], got -1.0")
    assert m.memory.bad_messages == 1 and m.memory.metrics()["bad_messages"] == 1
    assert "learner-0 went away without finishing" in caplog.text
    # Nothing of the memory host died: its sampler was not left broken, the run is not failing...
    assert not m.coordinator.failures and not m.coordinator.stop_event.is_set()
    assert not m.memory._fatal.done()
    # ...and an actor still gets its batches in.
    actor = await m.attach("actor-0", m.actor_session)
    await actor.send("batch", {"actor": 0, "seq": 0}, {**batch(4), "priorities": np.ones(4)})
    await m.until(lambda: m.memory.inserted == 4, "a batch after the bad credit")


@pytest.mark.parametrize("meta", [{"n": 2**40}, {"n": 0}, {"n": "1"}, {"n": 1, "iteration": -3}, {"n": 3}])
async def test_credits_out_of_range_are_protocol_errors(memory0, caplog, meta):
    m = memory0
    learner = await m.attach("learner-0", m.learner_session)
    await learner.send("credit", meta)  # n: 3 is over cluster.learner_credits (2)
    async with asyncio.timeout(HANG_S):
        await learner.wait_closed()
    assert warnings(caplog, "closing connection of learner-0: bad message:")
    assert not m.memory._fatal.done()


async def test_a_rollout_on_an_asynchronous_run_closes_only_that_connection(memory0, caplog):
    m = memory0
    actor = await m.attach("actor-0", m.actor_session)
    await actor.send("rollout", {"actor": 0, "iteration": 0}, batch(4))
    async with asyncio.timeout(HANG_S):
        await actor.wait_closed()
    assert warnings(caplog, "unexpected message 'rollout' (expected actor_done, batch)")
    assert not any(r.levelno >= logging.ERROR and "Traceback" in r.getMessage() for r in caplog.records)
    assert not m.memory._fatal.done()


@pytest.mark.parametrize(
    "arrays, match",
    [
        ({**batch(4), "extra": np.zeros(4)}, "unexpected \\['extra'\\]"),
        ({k: v for k, v in batch(4).items() if k != "reward"}, "missing \\['reward'\\]"),
        ({**batch(4), "obs": np.zeros((4, 5), np.float32)}, "batch.obs is float32\\[4, 5\\]"),
        ({**batch(4), "reward": np.ones(3, np.float32)}, "has 3 rows"),
        ({**batch(4), "priorities": np.ones(4, np.float32)}, "batch.priorities is float32"),
    ],
)
async def test_batches_that_do_not_match_the_replay_spec_are_protocol_errors(memory0, caplog, arrays, match):
    m = memory0
    actor = await m.attach("actor-0", m.actor_session)
    await actor.send("batch", {"actor": 0, "seq": 0}, arrays)
    async with asyncio.timeout(HANG_S):
        await actor.wait_closed()
    assert any(
        r.levelno >= logging.WARNING and __import__("re").search(match, r.getMessage()) for r in caplog.records
    ), caplog.text[-2000:]
    assert m.memory.inserted == 0 and not m.memory._fatal.done()


async def test_non_finite_priorities_drop_those_rows_and_keep_the_connection(memory0):
    m = memory0
    actor = await m.attach("actor-0", m.actor_session)
    priorities = np.array([1.0, np.nan, 2.0, np.inf, -1.0, 3.0])
    await actor.send("batch", {"actor": 0, "seq": 0}, {**batch(6), "priorities": priorities})
    await actor.send("batch", {"actor": 0, "seq": 1}, {**batch(2), "priorities": np.ones(2)})
    await m.until(lambda: m.memory.inserted == 5, "the good rows of both batches")
    (link,) = m.memory.actor_links
    assert link.rows_rejected == 3 and m.memory.rows_rejected == 3 and link.batches == 2
    assert not actor.closed and link.seq_errors == 0


async def test_huge_priorities_are_clipped_so_new_rows_stay_sampleable(memory0):
    m = memory0
    from aiorl.replay import MAX_PRIORITY

    actor = await m.attach("actor-0", m.actor_session)
    await actor.send("batch", {"actor": 0, "seq": 0}, {**batch(4), "priorities": np.array([1e300, 1, 1, 1.0])})
    await m.until(lambda: m.memory.inserted == 4, "the batch")
    alpha = m.cfg.agent.prioritized_replay_alpha
    assert m.memory.store.replay.max_priority <= (MAX_PRIORITY + 1e-6) ** alpha * (1 + 1e-12)


async def test_a_dead_sampler_fails_the_memory_host_and_the_run_through_the_phases(memory0, caplog):
    m = memory0

    class Broken:
        """The replay the sampler draws from, broken: a bug of ours, not a peer's input."""

        def __init__(self, replay):
            self.replay = replay

        def __len__(self):
            return len(self.replay)

        def add(self, arrays, priorities=None):
            return self.replay.add(arrays, priorities)

        def sample(self, batch_size, beta=None):
            raise RuntimeError("replay broke")

    m.memory.store.replay = Broken(m.memory.store.replay)
    actor = await m.attach("actor-0", m.actor_session)
    learner = await m.attach("learner-0", m.learner_session)
    await actor.send("batch", {"actor": 0, "seq": 0}, {**batch(16), "priorities": np.ones(16)})
    await learner.send("credit", {"n": 1})
    await m.until(lambda: m.coordinator.stop_event.is_set(), "the run to stop")
    record = m.coordinator.roles["memory-0"]  # the run lists failed roles in its summary at the end
    assert record.status == "failed" and "sampler for learner-0" in record.reason and "replay broke" in record.reason
    assert m.coordinator.stopped_by_failure
    assert any("sampler for learner-0 failed" in r.getMessage() and r.levelno == logging.ERROR for r in caplog.records)


@pytest.mark.parametrize(
    "kind, meta, match",
    [
        ("heartbeat", {"counters": {"env_steps": "lots"}}, "heartbeat.counters[env_steps] must be an integer"),
        ("heartbeat", {"episode_returns": [1.0, float("nan")]}, "heartbeat.episode_returns[1] must be a finite"),
        ("barrier", {"generation": -1}, "barrier.generation must be an integer"),
        ("get_weights", {"have": 1.5}, "get_weights.have must be an integer"),
        ("nonsense", {}, "unexpected message 'nonsense'"),
    ],
)
async def test_a_registered_role_sending_a_bad_control_message_is_cut_off_loudly(
    memory0_short_grace, caplog, kind, meta, match
):
    m = memory0_short_grace
    with pytest.raises((RemoteError, ConnectionClosed, TimeoutError)):
        await m.actor.request(kind, meta, timeout_s=HANG_S)
    await m.until(lambda: m.coordinator.roles["actor-0"].status == "lost", "actor-0 to be lost")
    assert warnings(caplog, match) and m.coordinator.bad_messages == 1
    assert m.coordinator.roles["learner-0"].status == "running"  # the others carry on


async def test_a_learners_non_finite_priorities_are_ignored_and_out_of_range_indices_cut_it_off(memory0):
    m = memory0
    actor = await m.attach("actor-0", m.actor_session)
    learner = await m.attach("learner-0", m.learner_session)
    await actor.send("batch", {"actor": 0, "seq": 0}, {**batch(16), "priorities": np.ones(16)})
    await learner.send("credit", {"n": 1, "beta": 0.4})
    async with asyncio.timeout(HANG_S):
        sample = await learner.recv()
    assert sample.kind == "samples"
    indices, generations = sample.arrays["indices"], sample.arrays["generations"]
    priorities = np.full(len(indices), 2.0)
    priorities[:3] = [np.nan, np.inf, -1.0]
    await learner.send(
        "priorities",
        {"credit": 1, "beta": 0.4},
        {"indices": indices, "generations": generations, "priorities": priorities},
    )
    link = m.memory.learners["learner-0"]
    await m.until(lambda: link.priority_messages == 1, "the update")
    assert link.priorities_rejected == 3 and link.priorities_applied == len(indices) - 3
    await m.until(lambda: link.batches_sent == 2, "the credit that came with it spent on a new batch")
    assert not learner.closed
    bad = indices.copy()
    bad[0] = 10**6
    await learner.send("priorities", {}, {"indices": bad, "generations": generations, "priorities": np.ones(len(bad))})
    async with asyncio.timeout(HANG_S):
        await learner.wait_closed()
    assert m.memory.bad_messages == 1 and not m.memory._fatal.done()
