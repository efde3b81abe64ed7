"""Samples-per-insert limiter: the band holds, neither side can be stuck, and through the
real runtime it holds actors back by credits without dropping anything."""

import json

import pytest
from cluster_helpers import read_json, run
from configs import RANDOM_CARTPOLE_SMALL
from hypothesis import given, settings
from hypothesis import strategies as st

from aiorl.config import ConfigError
from aiorl.experiment.loading import load_config
from aiorl.runtime.ratelimit import SampleToInsertRatio

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@settings(max_examples=200, deadline=None)
@given(
    spi=st.floats(0.25, 16),
    min_size=st.integers(1, 2000),
    learner_batch=st.integers(1, 256),
    batch_rows=st.integers(1, 128),
    tolerance=st.floats(0, 0.5),
    actors=st.integers(1, 4),
    depth=st.integers(1, 8),
    learner_credits=st.integers(1, 4),
    seed=st.integers(0, 2**32 - 1),
    steps=st.integers(50, 400),
)
def test_the_band_holds_and_someone_can_always_move(
    spi, min_size, learner_batch, batch_rows, tolerance, actors, depth, learner_credits, seed, steps
):
    """Every band and batch size the limiter accepts, with credits of any depth on both sides:
    never outside the band, and never a state where no side may move (a deadlock)."""
    import random

    rng = random.Random(seed)
    limiter = SampleToInsertRatio(
        spi,
        min_size,
        learner_batch,
        batch_rows,
        tolerance,
        actors=actors,
        actor_credits=depth,
        learner_credits=learner_credits,
    )
    held = [0] * actors  # credits each actor holds, as FlowControl grants them
    asked = learner_credits  # learner requests at the memory (they come back after each step)
    training = 0  # batches handed out and not yet trained on
    entered = False
    for _ in range(steps):
        moves = []
        if limiter.can_grant() and min(held) < depth:
            moves.append("grant")
        if any(held):
            moves.append("insert")
        if asked and limiter.can_sample(limiter.inserted):
            moves.append("sample")
        if training:
            moves.append("train")
        assert moves, f"stuck: {limiter!r} with {held} credits out"  # deadlock freedom
        move = rng.choice(moves)
        if move == "grant":
            held[held.index(min(held))] += 1
            limiter.grant()
            assert (limiter.inserted + limiter.reserved) * spi - limiter.sampled <= limiter.max_diff + 1e-6
        elif move == "insert":
            a = rng.choice([i for i, c in enumerate(held) if c])
            held[a] -= 1
            limiter.inserted_rows(rng.randint(0, batch_rows), with_credit=True)  # batches may be short
        elif move == "sample":
            asked -= 1
            training += 1
            limiter.sampled_rows(learner_batch)
            assert limiter.diff >= limiter.min_diff - 1e-6
        else:
            training -= 1
            asked += 1
        # Never above the band; below it only while filling up to min_size (as Reverb starts), and
        # never again once it reached it.
        assert limiter.diff <= limiter.max_diff + 1e-6
        entered = entered or limiter.diff >= limiter.min_diff
        assert not entered or limiter.diff >= limiter.min_diff - 1e-6


@settings(max_examples=200, deadline=None)
@given(
    spi=st.floats(0.25, 16),
    min_size=st.integers(1, 5000),
    learner_batch=st.integers(1, 512),
    batch_rows=st.integers(1, 256),
    tolerance=st.floats(0, 0.5),
    actors=st.integers(1, 8),
    depth=st.integers(1, 32),
    learner_credits=st.integers(1, 8),
)
def test_from_the_middle_of_the_band_neither_side_waits_for_its_whole_window(
    spi, min_size, learner_batch, batch_rows, tolerance, actors, depth, learner_credits
):
    """The band is what pipelining needs: from its middle every actor gets all its credits, and
    the learners get every batch they asked for, without either side touching a bound."""
    kw = {"actors": actors, "actor_credits": depth, "learner_credits": learner_credits}
    limiter = SampleToInsertRatio(spi, min_size, learner_batch, batch_rows, tolerance, **kw)
    limiter.restore(10 * min_size + 10_000)
    for _ in range(actors * depth):
        assert limiter.can_grant(), limiter
        limiter.grant()
    limiter = SampleToInsertRatio(spi, min_size, learner_batch, batch_rows, tolerance, **kw)
    limiter.restore(10 * min_size + 10_000)
    for _ in range(learner_credits):
        assert limiter.sample_bound(limiter.inserted) is None, limiter
        limiter.sampled_rows(learner_batch)


def _steady(limiter, actors, depth, learner_batch, batch_rows, learner_every, ticks=3000):
    """Credits as FlowControl grants them; each tick every actor holding a credit inserts a batch,
    and every `learner_every` ticks the learner takes all its requests (an eager learner: 1).
    Returns (ticks an actor had no credit, learner requests refused by the ratio, requests)."""
    held = [0] * actors
    starved = refused = asked = 0

    def top_up():
        while min(held) < depth and limiter.can_grant():
            held[held.index(min(held))] += 1
            limiter.grant()

    top_up()
    for tick in range(ticks):
        for a in range(actors):
            if held[a]:
                held[a] -= 1
                limiter.inserted_rows(batch_rows, with_credit=True)
            else:
                starved += 1
        top_up()
        if tick % learner_every == 0:
            for _ in range(limiter.learner_window // learner_batch):
                if limiter.inserted < limiter.min_size:
                    break
                asked += 1
                if limiter.can_sample(limiter.inserted):
                    limiter.sampled_rows(learner_batch)
                else:
                    refused += 1
            top_up()
    return starved, refused, asked


@pytest.mark.parametrize("actors,depth", [(1, 16), (2, 16), (4, 4)])
def test_an_eager_learner_is_held_by_the_ratio_and_never_starves_the_actors(actors, depth):
    """Actors the slower side (the learner asks for more than the ratio allows): the learner waits,
    every actor always holds a credit, and the ratio converges to samples_per_insert."""
    limiter = SampleToInsertRatio(1.0, 1000, 512, 64, 0.1, actors=actors, actor_credits=depth, learner_credits=2)
    starved, refused, asked = _steady(limiter, actors, depth, 512, 64, learner_every=1)
    assert starved == 0  # the actors never waited for a credit
    assert refused > asked / 2  # the learner was the side held back
    assert limiter.sampled / limiter.inserted == pytest.approx(1.0, abs=limiter.error_buffer / limiter.inserted + 0.01)


def test_a_slow_learner_gets_every_batch_it_asks_for_and_holds_the_actors():
    """The learner the slower side: actors run out of credits (ratio_upper holds them), and none of
    the learner's requests waits, all its prefetch included."""
    limiter = SampleToInsertRatio(1.0, 1000, 512, 64, 0.1, actors=2, actor_credits=16, learner_credits=2)
    starved, refused, asked = _steady(limiter, 2, 16, 512, 64, learner_every=16)
    assert refused == 0 and asked > 100
    assert starved > 0  # actors ahead of the ratio waited


def test_the_error_buffer_follows_acme_with_a_floor_of_both_sides_credits():
    wide = SampleToInsertRatio(8, min_size=10_000, learner_batch=64, batch_rows=32, tolerance=0.1)
    assert wide.error_buffer == pytest.approx(0.1 * 8 * 10_000)
    narrow = SampleToInsertRatio(
        8, min_size=10, learner_batch=64, batch_rows=32, tolerance=0.1, actors=3, actor_credits=4, learner_credits=2
    )
    assert narrow.error_buffer == 2 * 64 + 8 * 3 * 4 * 32
    assert narrow.sample_bound(9) == "min_size" and narrow.can_grant()  # below the minimum size: actors only
    with pytest.raises(ValueError, match="at least 1"):
        SampleToInsertRatio(1, 10, 64, 32, 0.1, actor_credits=0)


def test_a_restored_shard_starts_in_the_middle_of_the_band():
    limiter = SampleToInsertRatio(4, min_size=100, learner_batch=32, batch_rows=16, tolerance=0.1)
    limiter.restore(5000)
    assert limiter.diff == pytest.approx(4 * 100) and limiter.can_sample(5000) and limiter.can_grant()
    assert limiter.reserved == 0


def test_each_bound_is_named():
    limiter = SampleToInsertRatio(1, min_size=100, learner_batch=32, batch_rows=16, tolerance=0, actor_credits=1)
    assert limiter.sample_bound(99) == "min_size"
    limiter.inserted_rows(100, with_credit=False)
    limiter.sampled_rows(int(limiter.diff - limiter.min_diff))  # the lower bound reached
    assert limiter.sample_bound(100) == "ratio_lower"
    limiter.sampled = 0
    limiter.inserted = int(limiter.max_diff)  # the upper bound reached
    assert limiter.sample_bound(limiter.inserted) is None and not limiter.can_grant()


# ---------------------------------------------------------------- the memory host's credits


class _Link:
    """An actor connection as FlowControl sees it."""

    def __init__(self, name):
        import asyncio

        from aiorl.runtime.memory.links import ActorLink

        self.link = ActorLink(name)
        self.link.credit_ready = asyncio.Event()


def _flow(limiter, names):
    from aiorl.runtime.memory.flow import FlowControl
    from aiorl.runtime.phase import Phase

    links = [_Link(n).link for n in names]
    return FlowControl(limiter, 2, links, lambda: Phase.RUNNING), links


def test_credits_go_out_deep_and_evenly_and_come_back_when_an_actor_goes_away():
    limiter = SampleToInsertRatio(1.0, 1000, 512, 64, 0.1, actors=2, actor_credits=4, learner_credits=2)
    flow, (a, b) = _flow(limiter, ["actor-0", "actor-1"])
    flow.grant_actor_credits()
    assert (a.credits, b.credits) == (4, 4) and limiter.reserved == 8 * 64
    flow.inserted(a, 64)
    assert a.credits == 4 and a.granted == 5  # the used credit was replaced at once
    # Fill the band up to its top: the actors are now ahead and held by ratio_upper.
    limiter.inserted += int(limiter.max_diff - limiter.diff - limiter.reserved)
    flow.inserted(a, 64)
    flow.inserted(b, 64)
    assert (a.credits, b.credits) == (3, 3) and flow.holds["ratio_upper"] == 0  # not out of credits yet
    for _ in range(3):
        flow.inserted(a, 64)
    assert a.credits == 0 and flow.holds["ratio_upper"] == 1  # an actor starved by the ratio
    reserved = limiter.reserved
    b.closed = True
    flow.actor_closed(b)  # b's 3 credits will bring nothing: released, and they go to a
    assert b.credits == 0 and a.credits == 3 and limiter.reserved == reserved
    assert flow.holds["ratio_upper"] == 1 and flow.held_metrics()["limiter/held_ratio_upper_s"] >= 0
    c = _Link("actor-1").link  # b restarted
    flow.actor_links.append(c)
    flow.grant_actor_credits()
    assert c.credits == 0 and flow.holds["ratio_upper"] == 2  # the newcomer waits for the ratio
    flow.sampled(4 * 512)  # the learner catches up: credits flow again, the neediest first
    assert (a.credits, c.credits) == (4, 4) and flow.holds["ratio_upper"] == 2


def test_a_fast_actor_does_not_take_every_credit_from_a_slow_one():
    """The band full, room for one batch at a time: a fast actor spends each credit at once, a slow
    one holds what it gets. Ties go to the actor granted the fewest, so the slow one gets its turn."""
    limiter = SampleToInsertRatio(1.0, 1000, 512, 64, 0.1, actors=2, actor_credits=4, learner_credits=2)
    flow, (fast, slow) = _flow(limiter, ["actor-0", "actor-1"])
    limiter.inserted = int(limiter.max_diff) - 63  # one more batch would cross the top
    flow.grant_actor_credits()
    assert fast.credits == slow.credits == 0
    for _ in range(10):
        flow.sampled(64)  # room for one batch
        if fast.credits:
            flow.inserted(fast, 64)
    assert slow.credits >= 1 and fast.granted + slow.granted == 10


def test_a_learner_held_back_is_counted_by_its_bound():
    limiter = SampleToInsertRatio(1.0, 100, 32, 16, 0.1)
    flow, _ = _flow(limiter, [])
    assert flow.sample_bound(10) == "min_size"
    flow.held("min_size", 0.5, "learner-0")
    flow.held("ratio_lower", 0.25, "learner-0")
    assert flow.holds == {"min_size": 1, "ratio_lower": 1, "ratio_upper": 0}
    assert flow.held_metrics()["limiter/held_ratio_lower_s"] == 0.25


BASE = RANDOM_CARTPOLE_SMALL


def test_a_memory_host_sizes_its_band_for_every_actor_and_learner_credit(tmp_path):
    from aiorl.runtime.memory import MemoryRole

    cfg = load_config(
        data={
            **BASE,
            "env": {"id": "CartPole-v1", "num_envs": 2},
            "agent": {**BASE["agent"], "samples_per_insert": 2.0, "sample_batch_size": 8},
            "cluster": {"actors": 3, "memories": 2, "learners": 2, "learner_credits": 3, "actor_credits": 5},
        }
    )
    limiter = MemoryRole(cfg, 0, tmp_path, b"t" * 32).flow.limiter
    assert limiter.min_size == 50 and limiter.actor_credits == 5
    assert limiter.error_buffer == 2 * 3 * 16 + 2.0 * 3 * 5 * (8 * 2)
    with pytest.raises(ConfigError, match=r"cluster.actor_credits: expected 1..1024 batches, got 0"):
        load_config(data={**BASE, "cluster": {"actor_credits": 0}})


def test_config_errors_name_the_new_key_and_the_synchronous_case():
    with pytest.raises(ConfigError, match="max_samples_per_insert was replaced by agent.samples_per_insert"):
        load_config(data={**BASE, "agent": {**BASE["agent"], "max_samples_per_insert": 2.0}})
    with pytest.raises(ConfigError, match="synchronous .* nothing to rate limit"):
        load_config(
            data={**BASE, "agent": {**BASE["agent"], "samples_per_insert": 2.0}, "model": {"synchronous": True}}
        )
    # Restarts are for every algorithm now (a restarted actor joins the next iteration).
    assert load_config(data={**BASE, "cluster": {"max_restarts": 1}, "model": {"synchronous": True}})


@pytest.mark.cluster
def test_a_slow_learner_holds_the_actors_back_by_credits_and_nothing_is_dropped(tmp_path):
    spi = 4.0
    config = {
        "algo": "random_agent",
        "env": {"id": "CartPole-v1", "num_envs": 2},
        "cluster": {"actors": 2, "memories": 2, "learners": 1},
        "agent": {
            "sample_batch_size": 8,
            "batch_size": 32,
            "buffer_size": 20_000,
            "learning_starts": 200,
            "samples_per_insert": spi,
            "scheduled_global_steps": 400,  # long enough for a late-starting actor to spend its credits
        },
        "model": {"learner_step_sleep_s": 0.01},
    }
    code, out, run_dir = run(tmp_path, config)
    assert code == 0, out
    summary = read_json(run_dir / "summary.json")
    roles = summary["roles"]
    blocked = [roles[f"actor-{i}"]["stats"]["blocked_s"] for i in range(2)]
    assert all(b > 0 for b in blocked), blocked  # actors waited for credits
    steps = [roles[f"actor-{i}"]["stats"]["env_steps"] for i in range(2)]
    assert min(steps) >= max(steps) / 3, steps  # credits are shared: neither actor is starved
    rows = 8 * 2
    for m in range(2):
        stats = roles[f"memory-{m}"]["stats"]
        limiter = SampleToInsertRatio(spi, 100, 32, rows, 0.1, actors=2, actor_credits=16, learner_credits=2)
        assert stats["limiter"]["holds"]["ratio_upper"] > 0  # the memory names the bound that held the actors
        diff = stats["inserted"] * spi - stats["sampled"]
        # Within the band, give or take the batches the last phases move without credit.
        slack = 2 * 2 * rows * spi + 2 * 32
        assert limiter.min_diff - slack <= diff <= limiter.max_diff + slack, (m, stats["inserted"], stats["sampled"])
    for i in range(2):  # every batch an actor sent was stored
        sent = roles[f"actor-{i}"]["stats"]["memories"]
        for m in range(2):
            got = roles[f"memory-{m}"]["stats"]["actors"][f"actor-{i}"]
            assert got["transitions"] == sent[m]["transitions"] and got["seq_errors"] == 0


@pytest.mark.cluster
def test_a_limited_run_keeps_the_ratio_and_the_slower_side_never_waits_on_round_trips(tmp_path):
    """Real processes, random actions, a learner far faster than the actor: the learner is the side
    ahead and the ratio holds it (ratio_lower), while the actor's credits, pipelined, keep it
    stepping: it almost never finds itself without a credit. Counters only, no clock."""
    config = {
        "algo": "random_agent",
        "env": {"id": "CartPole-v1", "num_envs": 2},
        "cluster": {"actors": 1, "memories": 1, "learners": 1},
        "agent": {
            "sample_batch_size": 64,
            "batch_size": 128,
            "buffer_size": 50_000,
            "learning_starts": 500,
            "samples_per_insert": 1.0,
            "scheduled_global_steps": 250,
        },
    }
    code, out, run_dir = run(tmp_path, config)
    assert code == 0, out
    roles = read_json(run_dir / "summary.json")["roles"]
    actor, memory = roles["actor-0"]["stats"], roles["memory-0"]["stats"]
    assert actor["batches"] >= 200, actor["batches"]
    # Pipelined credits: with two (the old depth) the actor waited for nearly every batch.
    assert actor["credit_waits"] <= 0.1 * actor["batches"], (actor["credit_waits"], actor["batches"])
    holds = memory["limiter"]["holds"]
    assert holds["ratio_upper"] <= 0.02 * actor["batches"], holds  # the actor was never the side ahead
    assert holds["ratio_lower"] >= 10, holds  # the learner was, and the ratio held it
    assert memory["sample_blocked_s"] == memory["limiter"]["limiter/held_ratio_lower_s"] > 0  # one account
    limiter = SampleToInsertRatio(1.0, 500, 128, 128, 0.1, actors=1, actor_credits=16, learner_credits=2)
    diff = memory["inserted"] - memory["sampled"]
    slack = 2 * 128  # the last batches, sent without credit while stopping
    assert limiter.min_diff <= diff <= limiter.max_diff + slack, (memory["inserted"], memory["sampled"])
    assert memory["sampled"] / memory["inserted"] == pytest.approx(1.0, abs=0.3)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert any("limiter/held_ratio_lower_s" in r for r in rows)
