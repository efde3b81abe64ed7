"""The synchronous path's state machines without sockets: a memory's rounds and the coordinator's work items."""

import logging

import numpy as np
import pytest

from aiorl.runtime.rounds import Rounds
from aiorl.runtime.work import WorkQueue

SPEC = {"x": ((), "<i8")}
log = logging.getLogger("test")


def rows(value, n):
    return {"x": np.full(n, value, np.int64)}


def per_actor(actors=3, memories=1, index=0, learners=1):
    return Rounds(SPEC, index, memories, actors, learners, None, log)


def test_a_round_completes_when_every_live_actor_delivered_and_a_dropped_one_owes_nothing():
    r = per_actor(actors=3)
    r.add(2, {"iteration": 0, "weights_version": 0}, rows(2, 2))
    r.add(0, {"iteration": 0, "weights_version": 0}, rows(0, 2))
    assert not r.ready(0)
    r.drop_actor(1)  # lost mid-iteration: the round goes on with the others
    assert r.ready(0)
    batch, meta = r.take(0, 0)
    assert batch["x"].tolist() == [0, 0, 2, 2] and meta == {"versions": [0, 0], "empty": False, "final": False}
    assert not r.ready(0)  # the only learner took it
    # Iteration 1 waits only for actors 0 and 2.
    r.add(0, {"iteration": 1, "weights_version": 1}, rows(0, 1))
    assert not r.ready(1)
    r.add(2, {"iteration": 1, "weights_version": 1}, rows(2, 1))
    assert r.ready(1)


def test_a_restarted_actor_is_expected_again_from_the_iteration_it_joins():
    r = per_actor(actors=2)
    r.add(0, {"iteration": 0, "weights_version": 0}, rows(0, 1))
    r.drop_actor(1)  # away (its process died) in iteration 0: round 0 goes on without it
    assert r.ready(0)
    r.rejoin(1, 1)  # restarted, joining iteration 1
    r.add(0, {"iteration": 1, "weights_version": 1}, rows(0, 1))
    assert not r.ready(1)  # round 1 waits for the restarted actor
    assert r.add(1, {"iteration": 1, "weights_version": 1}, rows(1, 1)) == "added"
    assert r.ready(1) and r.take(1, 0)[0]["x"].tolist() == [0, 1]


def test_a_part_of_an_away_actor_for_a_round_that_went_on_without_it_is_stale():
    r = per_actor(actors=2)
    r.drop_actor(1)
    assert r.add(1, {"iteration": 0, "weights_version": 0}, rows(1, 1)) == "stale"
    r.add(0, {"iteration": 0, "weights_version": 0}, rows(0, 1))
    assert r.take(0, 0)[0]["x"].tolist() == [0]
    r.rejoin(1, 1)
    assert r.add(1, {"iteration": 0, "weights_version": 0}, rows(1, 1)) == "stale"  # late for round 0
    assert r.stale == 2


def test_a_round_every_actor_is_away_from_waits_then_closes_empty_when_one_joins_a_later_one():
    r = per_actor(actors=1)
    r.drop_actor(0)  # the only actor died in iteration 0
    assert not r.ready(0)  # not the end: it may come back
    r.rejoin(0, 1)  # restarted, joining iteration 1: round 0 closes empty, so the learners step past it
    assert r.ready(0) and r.take(0, 0) == ({}, {"versions": None, "final": False, "empty": True})
    assert not r.ready(1)
    r.add(0, {"iteration": 1, "weights_version": 1}, rows(0, 2))
    assert r.ready(1) and r.take(1, 0)[0]["x"].tolist() == [0, 0]


def test_an_away_actor_that_never_comes_back_is_gone_and_the_end_comes():
    r = per_actor(actors=1)
    r.drop_actor(0)
    assert not r.ready(0) and not r.exhausted(0)
    r.actor_gone(0)  # no restart left, or the run stopped
    r.rejoin(0, 1)  # too late: a gone actor is not expected again
    assert r.ready(0) and r.take(0, 0)[1]["final"]
    r.finalize()
    assert r.exhausted(1) and not r.ready(1)


def test_parts_out_of_turn_are_protocol_errors():
    r = per_actor(actors=2, memories=2, index=0)
    with pytest.raises(ValueError, match="sends its rollouts to memory 1, not memory 0"):
        r.add(1, {"iteration": 0}, rows(1, 1))
    with pytest.raises(ValueError, match="sent iteration 3, this memory is gathering iteration 0"):
        r.add(0, {"iteration": 3}, rows(0, 1))


def test_each_learner_gets_an_even_share_and_the_round_goes_once_all_took_it():
    r = per_actor(actors=2, learners=3)
    r.add(0, {"iteration": 0, "weights_version": 0}, rows(0, 4))
    r.add(1, {"iteration": 0, "weights_version": 0}, rows(1, 3))
    shares = [r.take(0, j)[0]["x"].tolist() for j in (2, 0, 1)]
    assert shares == [[1, 1, 1], [0, 0], [0, 0]]  # rows [j*7//3, (j+1)*7//3)
    assert sorted(sum(shares, [])) == [0] * 4 + [1] * 3 and 0 not in r.completed
    with pytest.raises(ValueError, match="asked twice"):
        r2 = per_actor(actors=1, learners=2)
        r2.add(0, {"iteration": 0}, rows(0, 2))
        r2.take(0, 1)
        r2.take(0, 1)


def test_a_memory_whose_actors_are_all_gone_hands_out_empty_shares_until_the_end():
    r = per_actor(actors=2, memories=2, index=1, learners=2)  # only actor 1 is assigned here
    r.actor_gone(1)
    assert r.ready(5) and r.take(5, 0) == ({}, {"empty": True, "versions": None, "final": True})
    r.finalize()
    # Learner 1 gets the answer learner 0 got for iteration 5, then both get the end.
    assert r.ready(5) and r.take(5, 1) == ({}, {"empty": True, "versions": None, "final": True})
    assert not r.exhausted(5) and r.exhausted(6) and not r.ready(6)


def test_the_last_partial_round_is_kept_and_the_end_adds_one_empty_round():
    r = per_actor(actors=3)
    r.add(0, {"iteration": 0, "weights_version": 0}, rows(0, 2))
    for actor in range(3):
        r.actor_gone(actor)  # every actor reported done; actor 0 had delivered
    # The last drop completed round 0; the end closes round 1 empty, so that another memory
    # whose actors did deliver round 1 is not left without an answer for it.
    r.finalize()
    assert r.ready(0) and r.take(0, 0)[0]["x"].tolist() == [0, 0]
    assert not r.exhausted(1) and r.take(1, 0) == ({}, {"versions": None, "final": True, "empty": True})
    assert r.exhausted(2) and not r.ready(2)
    with pytest.raises(ValueError, match="after this memory's last round"):
        r.add(0, {"iteration": 1}, rows(0, 1))


def test_work_items_complete_a_round_ignore_copies_and_an_incomplete_round_is_discarded():
    r = Rounds(SPEC, 1, 2, 5, 1, 6, log)  # items 1, 3, 5 of each iteration come here
    assert r.producers == [1, 3, 5]
    with pytest.raises(ValueError, match="work item 2 does not belong to memory 1"):
        r.add(0, {"iteration": 0, "item": 2}, rows(2, 1))
    assert r.add(0, {"iteration": 0, "item": 5}, rows(5, 1)) == "added"
    assert r.add(1, {"iteration": 0, "item": 5}, rows(50, 1)) == "duplicate"  # a re-issued item's copy
    r.add(1, {"iteration": 0, "item": 1}, rows(1, 1))
    r.drop_actor(0)  # actors do not own work items: nothing changes
    assert not r.ready(0)
    r.add(4, {"iteration": 0, "item": 3}, rows(3, 1))
    assert r.take(0, 0)[0]["x"].tolist() == [1, 3, 5]
    assert r.add(0, {"iteration": 0, "item": 1}, rows(1, 1)) == "stale"  # its round is over
    r.add(0, {"iteration": 1, "item": 1}, rows(1, 1))
    r.finalize()
    assert r.discarded_rows == 1 and not r.ready(1) and r.exhausted(1)


def test_work_queue_hands_out_each_item_once_and_a_lost_workers_items_go_first():
    q = WorkQueue(4)
    assert q.take("a") is None  # no iteration open yet
    q.start(0)
    assert [q.take("a"), q.take("b"), q.take("a")] == [0, 1, 2]
    assert q.finish("a", 0, 0) and not q.finish("b", 0, 0) and not q.finish("a", 7, 2)
    assert q.release("a") == [2]
    assert [q.take("b"), q.take("b"), q.take("b")] == [2, 3, None]
    q.start(1)
    assert q.take("a") == 0 and q.leases == {0: "a"} and q.finished == 0
    with pytest.raises(ValueError):
        q.start(1)


# --------------------------------------------------------------------------
# The learner's side of the end of a run


class ScriptedMemory:
    """Answers each credit of a learner the way a memory's sync sampler would, from a
    script of ``{iteration: rows | None (an empty share)}``; any other iteration: the end."""

    def __init__(self, m, learner, script):
        self.m, self.learner, self.script, self.asked = m, learner, script, []

    async def send(self, kind, meta, arrays=None):
        from aiorl.runtime.learner import _END
        from aiorl.wire.message import Message

        assert kind == "credit"
        it = meta["iteration"]
        self.asked.append(it)
        if it not in self.script:
            self.learner.queue.put_nowait((self.m, _END))
            return
        part = self.script[it]
        self.learner.queue.put_nowait(
            (
                self.m,
                Message(
                    "samples",
                    {"iteration": it, "empty": part is None, "versions": [it, it]},
                    {} if part is None else rows(it, part),
                ),
            )
        )


async def test_a_learner_asks_on_until_every_memory_ended_when_one_ends_first(tmp_path):
    """Memory 1 ends at iteration 1 while memory 0 still holds rounds (data for 1, a final
    empty 2): the learner discards iteration 1 and keeps asking memory 0 until its end,
    instead of waiting for an end that memory 0 only sends when asked."""
    import asyncio

    from aiorl.experiment.loading import load_config
    from aiorl.runtime.algorithm import LearnerResult
    from aiorl.runtime.learner import LearnerRole

    cfg = load_config(
        data={"algo": "random_agent", "cluster": {"memories": 2, "learners": 2}, "model": {"synchronous": True}}
    )
    learner = LearnerRole(cfg, 1, tmp_path, b"t" * 32)  # not learner 0: it publishes nothing

    class Core:
        steps = []

        def step(self, batch):
            self.steps.append(batch["x"].tolist())
            return LearnerResult()

        def get_weights(self):
            return {}

    learner.core = Core()
    learner.per_memory = [{"batches": 0} for _ in range(2)]
    learner.memories = [ScriptedMemory(0, learner, {0: 2, 1: 2, 2: None}), ScriptedMemory(1, learner, {0: 1})]
    await asyncio.wait_for(learner._sync_loop(), 10)
    assert Core.steps == [[0, 0, 0]]  # iteration 0 from both memories; iteration 1 discarded whole
    assert learner.memories[0].asked == [0, 1, 2, 3] and learner.memories[1].asked == [0, 1]
