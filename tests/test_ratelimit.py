"""Samples-per-insert limiter: the band holds, neither side can be stuck, and through the
real runtime it holds actors back by credits without dropping anything."""

import pytest
from cluster_helpers import read_json, run
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
    seed=st.integers(0, 2**32 - 1),
    steps=st.integers(50, 400),
)
def test_the_band_holds_and_someone_can_always_move(spi, min_size, learner_batch, batch_rows, tolerance, seed, steps):
    import random

    rng = random.Random(seed)
    limiter = SampleToInsertRatio(spi, min_size, learner_batch, batch_rows, tolerance)
    credits = 0  # granted to actors, not yet used
    for _ in range(steps):
        moves = []
        if limiter.can_grant():
            moves.append("grant")
        if credits:
            moves.append("insert")
        if limiter.can_sample(limiter.inserted):
            moves.append("sample")
        assert moves, f"stuck: {limiter!r} with {credits} credits out"  # deadlock freedom
        move = rng.choice(moves)
        if move == "grant":
            limiter.grant()
            credits += 1
            assert (limiter.inserted + limiter.reserved) * spi - limiter.sampled <= limiter.max_diff + 1e-6
        elif move == "insert":
            credits -= 1
            limiter.inserted_rows(rng.randint(0, batch_rows), with_credit=True)  # batches may be short
        else:
            limiter.sampled_rows(learner_batch)
            assert limiter.diff >= limiter.min_diff - 1e-6
        assert limiter.diff <= limiter.max_diff + 1e-6  # inserts never run past the band's top


def test_the_error_buffer_follows_acme_with_a_floor_of_one_batch_each():
    wide = SampleToInsertRatio(8, min_size=10_000, learner_batch=64, batch_rows=32, tolerance=0.1)
    assert wide.error_buffer == pytest.approx(0.1 * 8 * 10_000)
    narrow = SampleToInsertRatio(8, min_size=10, learner_batch=64, batch_rows=32, tolerance=0.1)
    assert narrow.error_buffer == 64 + 8 * 32
    assert not narrow.can_sample(9) and narrow.can_grant()  # below the minimum size: actors only


def test_a_restored_shard_starts_in_the_middle_of_the_band():
    limiter = SampleToInsertRatio(4, min_size=100, learner_batch=32, batch_rows=16, tolerance=0.1)
    limiter.restore(5000)
    assert limiter.diff == pytest.approx(4 * 100) and limiter.can_sample(5000) and limiter.can_grant()


BASE = {
    "algo": "random_agent",
    "env": {"id": "CartPole-v1"},
    "agent": {"batch_size": 16, "buffer_size": 1000, "learning_starts": 100},
}


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
            "scheduled_global_steps": 150,
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
        limiter = SampleToInsertRatio(spi, 100, 32, rows, 0.1)
        diff = stats["inserted"] * spi - stats["sampled"]
        # Within the band, give or take the batches the last phases move without credit.
        slack = 2 * 2 * rows * spi + 2 * 32
        assert limiter.min_diff - slack <= diff <= limiter.max_diff + slack, (m, stats["inserted"], stats["sampled"])
    for i in range(2):  # every batch an actor sent was stored
        sent = roles[f"actor-{i}"]["stats"]["memories"]
        for m in range(2):
            got = roles[f"memory-{m}"]["stats"]["actors"][f"actor-{i}"]
            assert got["transitions"] == sent[m]["transitions"] and got["seq_errors"] == 0
