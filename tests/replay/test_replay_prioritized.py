"""PrioritizedReplayBuffer: distribution, weights, priorities, staleness, snapshots, oracle."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from aiorl.replay import PrioritizedReplayBuffer, reference

SPEC = {"obs": ((3,), "float32"), "action": ((), "int64")}


def make_batch(n, start=0):
    rows = np.arange(start, start + n)
    return {"obs": np.repeat(rows[:, None], 3, axis=1).astype(np.float32), "action": rows.astype(np.int64)}


def test_sampling_frequencies_follow_p_to_the_alpha():
    """Chi-square: slot i is drawn with probability (p_i + eps)^alpha / sum_j (p_j + eps)^alpha."""
    capacity, alpha, eps = 50, 0.7, 1e-6
    rng = np.random.default_rng(1234)
    priorities = rng.uniform(0.0, 2.0, capacity)
    buf = PrioritizedReplayBuffer(capacity, SPEC, alpha=alpha, eps=eps, seed=5678)
    buf.add(make_batch(capacity), priorities)
    counts = np.zeros(capacity)
    for _ in range(2000):
        counts += np.bincount(buf.sample(50, beta=0.4)["indices"], minlength=capacity)
    q = (priorities + eps) ** alpha
    expected = counts.sum() * q / q.sum()
    assert stats.chisquare(counts, expected).pvalue > 1e-3
    # The test can fail: the same counts reject the distribution of a wrong alpha.
    wrong = (priorities + eps) ** 1.0
    assert stats.chisquare(counts, counts.sum() * wrong / wrong.sum()).pvalue < 1e-6


def test_importance_weights():
    """w_i = (N P(i))^-beta / max_j (N P(j))^-beta, the max over the stored rows (min priority)."""
    beta, alpha, eps = 0.6, 0.5, 1e-6
    priorities = np.array([0.1, 1.0, 4.0, 9.0])
    buf = PrioritizedReplayBuffer(8, SPEC, alpha=alpha, eps=eps, seed=0)
    buf.add(make_batch(4), priorities)
    out = buf.sample(400, beta)
    q = (priorities + eps) ** alpha
    prob = q / q.sum()
    raw = (len(buf) * prob) ** -beta
    expected = raw / raw.max()
    assert out["weights"].dtype == np.float32
    np.testing.assert_allclose(out["weights"], expected[out["indices"]], rtol=1e-6)
    assert out["weights"].max() <= 1.0
    assert PrioritizedReplayBuffer(8, SPEC, alpha=alpha, seed=0).max_priority == 1.0
    assert np.all(buf.sample(10, beta=0.0)["weights"] == 1.0)


def test_new_rows_get_the_running_max_priority():
    alpha, eps = 0.5, 1e-6
    buf = PrioritizedReplayBuffer(8, SPEC, alpha=alpha, eps=eps, seed=0)
    buf.add(make_batch(2))  # nothing given yet: priority value 1
    assert buf.tree.get([0, 1]).tolist() == [1.0, 1.0]
    buf.add(make_batch(2, 2), priorities=[3.0, 15.0])
    top = (15.0 + eps) ** alpha
    assert buf.max_priority == top
    buf.add(make_batch(1, 4))
    assert buf.tree.get([4])[0] == top
    buf.update_priorities([4], [0.0])  # the max never goes down
    buf.add(make_batch(1, 5))
    assert buf.tree.get([5])[0] == top and buf.tree.get([4])[0] == eps**alpha


def test_update_uses_p_plus_eps_to_the_alpha_and_last_duplicate_wins():
    buf = PrioritizedReplayBuffer(8, SPEC, alpha=0.7, eps=0.01, seed=0)
    buf.add(make_batch(8))
    assert buf.update_priorities([1, 2, 1, 1], [5.0, 2.0, 7.0, 3.0]) == 0
    assert buf.tree.get([1, 2]).tolist() == [np.power(3.01, 0.7), np.power(2.01, 0.7)]


def test_stale_updates_are_ignored():
    buf = PrioritizedReplayBuffer(4, SPEC, alpha=1.0, eps=1e-6, seed=0)
    buf.add(make_batch(4), priorities=[1.0, 2.0, 3.0, 4.0])
    sampled = buf.sample(8, beta=0.4)
    assert sampled["generations"].dtype == np.uint64
    np.testing.assert_array_equal(sampled["generations"], sampled["indices"])  # first pass: generation = slot
    buf.add(make_batch(2, 100), priorities=[0.5, 0.5])  # overwrites slots 0 and 1
    before = buf.tree.get(np.arange(4))
    fresh = ~np.isin(sampled["indices"], [0, 1])
    stale = buf.update_priorities(sampled["indices"], np.full(8, 50.0), sampled["generations"])
    assert stale == int((~fresh).sum()) > 0
    after = buf.tree.get(np.arange(4))
    assert after[0] == before[0] and after[1] == before[1], "overwritten slots keep their new rows' priority"
    for slot in set(sampled["indices"][fresh].tolist()):
        assert after[slot] == 50.0 + 1e-6
    # Generations of the new rows continue the count: slots 0, 1 now hold rows 4 and 5.
    again = buf.sample(64, beta=0.4)
    np.testing.assert_array_equal(
        again["generations"][again["indices"] < 2], again["indices"][again["indices"] < 2] + 4
    )
    # Without generations nothing is checked.
    assert buf.update_priorities(sampled["indices"], np.full(8, 1.0)) == 0


@pytest.mark.parametrize("capacity", [1, 16])
def test_capacity_one_and_power_of_two_filled_then_wrapped(capacity):
    buf = PrioritizedReplayBuffer(capacity, SPEC, alpha=0.6, seed=0)
    buf.add(make_batch(capacity), np.arange(1, capacity + 1, dtype=float))
    out = buf.sample(capacity * 20, beta=1.0)
    assert set(out["indices"].tolist()) == set(range(capacity))
    np.testing.assert_array_equal(out["action"], out["indices"])
    k = max(1, capacity // 4)
    assert buf.add(make_batch(k, 1000)).tolist() == list(range(k))
    out = buf.sample(capacity * 20, beta=1.0)
    np.testing.assert_array_equal(out["action"], np.where(out["indices"] < k, out["indices"] + 1000, out["indices"]))
    assert buf.update_priorities(out["indices"], np.ones(len(out["indices"])), out["generations"]) == 0


def test_single_element_batches():
    buf = PrioritizedReplayBuffer(3, SPEC, alpha=0.6, seed=0)
    for i in range(4):
        assert buf.add(make_batch(1, i), priorities=[float(i)]).tolist() == [i % 3]
    one = buf.sample(1, beta=0.5)
    assert one["obs"].shape == (1, 3) and one["weights"].shape == (1,)
    assert buf.update_priorities(one["indices"], [2.0], one["generations"]) == 0
    assert buf.update_priorities(np.array([], np.int64), np.array([])) == 0


@pytest.mark.parametrize(
    "priorities, message",
    [
        ([1.0, np.nan], r"priorities\[1\] = nan; priorities must be finite and >= 0"),
        ([-1.0, 1.0], r"priorities\[0\] = -1.0"),
        ([np.inf, 1.0], r"priorities\[0\] = inf"),
        ([1.0], r"priorities: expected shape \(2,\) real numbers, got \(1,\) float64"),
    ],
)
def test_bad_priorities_are_rejected_and_nothing_changes(priorities, message):
    buf = PrioritizedReplayBuffer(4, SPEC, alpha=0.6, seed=0)
    buf.add(make_batch(2))
    total = buf.tree.total
    with pytest.raises(ValueError, match=message):
        buf.add(make_batch(2, 2), priorities)
    assert len(buf) == 2, "add wrote nothing"
    with pytest.raises(ValueError, match=message):
        buf.update_priorities([0, 1], priorities)
    assert buf.tree.total == total


def test_bad_update_indices_and_arguments():
    buf = PrioritizedReplayBuffer(8, SPEC, alpha=0.6, seed=0)
    buf.add(make_batch(3))
    with pytest.raises(ValueError, match=r"indices\[1\] = 3 is out of range \[0, 3\)"):
        buf.update_priorities([0, 3], [1.0, 1.0])
    with pytest.raises(ValueError, match=r"indices\[0\] = -1 is out of range"):
        buf.update_priorities([-1], [1.0])
    with pytest.raises(ValueError, match=r"generations: expected shape \(2,\) non-negative integers, got \(1,\)"):
        buf.update_priorities([0, 1], [1.0, 1.0], [0])
    with pytest.raises(ValueError, match=r"generations: expected shape \(2,\) non-negative integers"):
        buf.update_priorities([0, 1], [1.0, 1.0], [0, -1])
    with pytest.raises(ValueError, match="beta must be finite and >= 0"):
        buf.sample(4, beta=-0.1)
    with pytest.raises(ValueError, match="alpha must be finite and >= 0"):
        PrioritizedReplayBuffer(8, SPEC, alpha=-1.0)
    with pytest.raises(ValueError, match="eps must be finite and > 0"):
        PrioritizedReplayBuffer(8, SPEC, alpha=0.5, eps=0.0)
    with pytest.raises(ValueError, match="the buffer is empty"):
        PrioritizedReplayBuffer(8, SPEC, alpha=0.5).sample(1, 0.4)


def test_snapshot_round_trip(tmp_path):
    buf = PrioritizedReplayBuffer(6, SPEC, alpha=0.6, eps=1e-4, seed=1)
    buf.add(make_batch(5), priorities=np.arange(5.0))
    buf.add(make_batch(3, 10))  # wraps
    sampled = buf.sample(16, beta=0.5)
    buf.update_priorities(sampled["indices"], np.linspace(0, 3, 16), sampled["generations"])
    path = tmp_path / "per.npz"
    buf.save(path)
    restored = PrioritizedReplayBuffer(6, SPEC, alpha=0.6, eps=1e-4, seed=99)
    restored.load(path)
    for key, value in buf.state_dict().items():
        np.testing.assert_array_equal(restored.state_dict()[key], value, err_msg=key)
    assert restored.max_priority == buf.max_priority and restored.tree.total == buf.tree.total
    assert restored.tree.min == buf.tree.min and len(restored) == len(buf)
    # Same draws afterwards, and generations still detect rows overwritten after the snapshot.
    a, b = buf.sample(32, 0.5), restored.sample(32, 0.5)
    for key in a:
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)
    for target in (buf, restored):
        target.add(make_batch(2, 50))
    assert buf.update_priorities(a["indices"], np.ones(32), a["generations"]) == restored.update_priorities(
        b["indices"], np.ones(32), b["generations"]
    )
    np.testing.assert_array_equal(buf.tree.get(np.arange(6)), restored.tree.get(np.arange(6)))


def test_snapshot_checks_alpha_and_priorities():
    buf = PrioritizedReplayBuffer(4, SPEC, alpha=0.6, seed=1)
    buf.add(make_batch(3))
    state = dict(buf.state_dict())
    with pytest.raises(ValueError, match="snapshot alpha is 0.6, this buffer has 0.7"):
        PrioritizedReplayBuffer(4, SPEC, alpha=0.7).load_state_dict(state)
    state["priorities"] = np.array([1.0, -1.0, 1.0])
    with pytest.raises(ValueError, match="priorities must be finite and >= 0"):
        PrioritizedReplayBuffer(4, SPEC, alpha=0.6).load_state_dict(state)


OPS = st.lists(
    st.tuples(st.sampled_from(["add", "add_p", "sample_update", "overwrite_update"]), st.integers(1, 70)),
    min_size=1,
    max_size=12,
)


@settings(max_examples=50, deadline=None)
@given(
    capacity=st.one_of(st.sampled_from([1, 2, 8, 64, 512]), st.integers(1, 600)),
    alpha=st.sampled_from([0.0, 0.6, 1.0]),
    ops=OPS,
    seed=st.integers(0, 2**32 - 1),
)
def test_matches_reference(capacity, alpha, ops, seed):
    """Every returned array, the tree and the stale counts agree bitwise with the numpy oracle."""
    buf = PrioritizedReplayBuffer(capacity, SPEC, alpha=alpha, seed=seed)
    oracle = reference.PrioritizedReplayBuffer(capacity, SPEC, alpha=alpha, seed=seed)
    rng = np.random.default_rng(seed)
    start = 0
    for op, n in ops:
        n = min(n, capacity)
        if op in ("add", "add_p"):
            batch = make_batch(n, start)
            start += n
            priorities = rng.random(n) * 5 if op == "add_p" else None
            np.testing.assert_array_equal(buf.add(batch, priorities), oracle.add(batch, priorities))
        elif len(buf):
            got, want = buf.sample(n, 0.4), oracle.sample(n, 0.4)
            for key in want:
                np.testing.assert_array_equal(got[key], want[key], err_msg=key)
            if op == "overwrite_update":
                batch = make_batch(rng.integers(1, capacity + 1), start)
                start += len(batch["action"])
                buf.add(batch)
                oracle.add(batch)
            priorities = rng.random(n) * 3
            assert buf.update_priorities(got["indices"], priorities, got["generations"]) == oracle.update_priorities(
                want["indices"], priorities, want["generations"]
            )
        assert buf.tree.total == oracle.tree.total and buf.max_priority == oracle.max_priority


def test_huge_priorities_are_clipped_to_max_priority():
    """One absurd |TD| (1e300) must not pin the running max that new rows get."""
    from aiorl.replay import MAX_PRIORITY

    assert MAX_PRIORITY == reference.MAX_PRIORITY == 1e8
    alpha, eps = 0.6, 1e-6
    buf = PrioritizedReplayBuffer(8, SPEC, alpha=alpha, eps=eps, seed=0)
    oracle = reference.PrioritizedReplayBuffer(8, SPEC, alpha=alpha, eps=eps, seed=0)
    priorities = [1e300, 1e9, MAX_PRIORITY, 5.0]
    np.testing.assert_array_equal(buf.add(make_batch(4), priorities), oracle.add(make_batch(4), priorities))
    top = oracle.max_priority
    np.testing.assert_allclose(top, (MAX_PRIORITY + eps) ** alpha, rtol=1e-15)
    assert buf.max_priority == top
    np.testing.assert_array_equal(buf.tree.get(np.arange(4)), oracle.tree.get(np.arange(4)))
    assert buf.tree.get([0, 1, 2]).tolist() == [top] * 3
    buf.add(make_batch(1, 4))  # a new row gets the (clipped) max: as likely as any clipped row
    assert buf.tree.get([4])[0] == top
    assert buf.update_priorities([3], [1e200]) == 0 and buf.tree.get([3])[0] == top
    assert np.isfinite(buf.tree.total)


def test_an_alpha_that_could_overflow_the_total_is_refused():
    with pytest.raises(ValueError, match="alpha 40.0 is too large"):
        PrioritizedReplayBuffer(1000, SPEC, alpha=40.0)
    PrioritizedReplayBuffer(1000, SPEC, alpha=2.0)  # (1e8)**2 * 1000 is fine
