"""An IMPALA memory host against a hand-played actor, in the test's loop over real TCP: credits
go out as the trajectory queue has room (throttle) or always (drop_oldest), and a fragment
message without a credit closes that connection."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from hostile_helpers import HANG_S, Memory0

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

T, CAPACITY = 4, 4
IMPALA = [
    "algo=impala",
    f"agent.sample_batch_size={T}",
    f"agent.batch_size={2 * T}",
    f"model.queue_capacity={CAPACITY}",
    "model.network=[linear:8]",
]


def fragment(seed: int) -> dict[str, np.ndarray]:
    """One env's fragment of T CartPole steps in IMPALA's spec ([1, T, ...])."""
    rng = np.random.default_rng(seed)
    obs = rng.standard_normal((1, T, 4)).astype(np.float32)
    return {
        "obs": obs,
        "next_obs": obs + 1,
        "action": rng.integers(0, 2, (1, T)),
        "reward": np.ones((1, T), np.float32),
        "terminated": np.zeros((1, T), np.bool_),
        "truncated": np.zeros((1, T), np.bool_),
        "behaviour_logits": rng.standard_normal((1, T, 2)).astype(np.float32),
    }


async def actor_attached(m: Memory0):
    _, session = await m.register("actor-0")
    learner0, _ = await m.register("learner-0")  # registered, never attached: nothing takes from the queue
    await m.running()
    await m.publish(learner0)  # version 0, the one the fragments are acted with
    return await m.attach("actor-0", session)


async def test_throttle_grants_credits_as_the_queue_has_room_and_refuses_a_message_without_one(tmp_path, caplog):
    async with Memory0(tmp_path, IMPALA) as m:
        conn = await actor_attached(m)
        hub = m.memory.store.hub
        for seq in range(CAPACITY + 1):  # the last one: the queue is full and no credit is out
            await conn.send("fragment", {"seq": seq, "weights_version": 0}, fragment(seq))
        async with asyncio.timeout(HANG_S):
            await conn.wait_closed()
    assert "actor-0 sent a fragment message without a credit" in caplog.text
    assert m.memory.bad_messages == 1
    assert len(hub.queue) == CAPACITY and hub.queue.dropped_full == 0
    (link,) = m.memory.actor_links
    assert link.granted == CAPACITY and hub.room.throttled == 0 and hub.room.reserved == 0


async def test_drop_oldest_grants_credits_and_drops_the_oldest_fragments(tmp_path):
    async with Memory0(tmp_path, [*IMPALA, "model.queue_full=drop_oldest"]) as m:
        conn = await actor_attached(m)
        hub = m.memory.store.hub
        credits = 0
        for seq in range(CAPACITY + 3):
            while credits == 0:  # an actor sends only against a credit
                msg = await asyncio.wait_for(conn.recv(), HANG_S)
                credits += msg.meta["n"]
            credits -= 1
            await conn.send("fragment", {"seq": seq, "weights_version": 0}, fragment(seq))
        await m.until(lambda: hub.queue.pushed == CAPACITY + 3, "every fragment queued")
        assert len(hub.queue) == CAPACITY and hub.queue.dropped_full == 3 and m.memory.bad_messages == 0
        np.testing.assert_array_equal(hub.queue.take(1)["obs"], fragment(3)["obs"])  # the oldest left


RECURRENT = [*IMPALA, "model.recurrent={type: gru, hidden: 4}"]
BAD_STATES = {
    "at every step": lambda s: np.repeat(s[:, None], T, axis=1),
    "float64": lambda s: s.astype(np.float64),
    "two for one fragment": lambda s: np.concatenate([s, s]),
    "too narrow": lambda s: s[:, :-1],
    "missing": None,
}


@pytest.mark.parametrize("bad", list(BAD_STATES))
async def test_a_recurrent_fragments_state_is_once_per_fragment_or_the_connection_is_closed(tmp_path, caplog, bad):
    """Recurrent IMPALA: a fragment carries its first step's state once, ``[1, state_size]``. A
    non-finite state drops that fragment, counted, the connection kept; a state of the wrong
    shape, dtype or count, or none, closes the connection (the protocol error of any malformed
    message) and leaves what was queued as it was."""
    async with Memory0(tmp_path, RECURRENT) as m:
        ((size,), _) = m.memory.algorithm().per_fragment_spec()["state"]
        state = np.arange(size, dtype=np.float32)[None] + 1
        conn = await actor_attached(m)
        hub = m.memory.store.hub
        await conn.send("fragment", {"seq": 0, "weights_version": 0}, {**fragment(0), "state": state})
        nan = state.copy()
        nan[0, 1] = np.nan
        await conn.send("fragment", {"seq": 1, "weights_version": 0}, {**fragment(1), "state": nan})
        await m.until(lambda: m.memory.rows_rejected == T, "the fragment with a NaN state dropped")
        arrays = fragment(2) if BAD_STATES[bad] is None else {**fragment(2), "state": BAD_STATES[bad](state)}
        await conn.send("fragment", {"seq": 2, "weights_version": 0}, arrays)
        async with asyncio.timeout(HANG_S):
            await conn.wait_closed()
        assert m.memory.bad_messages == 1
        assert "missing ['state']" in caplog.text if bad == "missing" else "fragment field 'state'" in caplog.text
        assert len(hub.queue) == 1 and hub.queue.pushed == 1
        batch = hub.queue.take(1)
        np.testing.assert_array_equal(batch["state"], state)
        np.testing.assert_array_equal(batch["obs"], fragment(0)["obs"])
