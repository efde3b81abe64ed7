"""SumTree: the compiled tree against the numpy oracle, edge sizes, drift and bad input."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aiorl.replay import SumTree, reference

# Sizes the layout treats specially: 1, one group (8), a group boundary, powers of two.
EDGE_CAPACITIES = [1, 2, 7, 8, 9, 63, 64, 65, 512, 4096, 4097]
capacities = st.one_of(st.sampled_from(EDGE_CAPACITIES), st.integers(1, 5000), st.integers(0, 14).map(lambda k: 2**k))


def build(capacity, indices, values):
    tree, oracle = SumTree(capacity), reference.SumTree(capacity)
    tree.update(indices, values)
    oracle.update(indices, values)
    return tree, oracle


@settings(max_examples=120, deadline=None)
@given(capacity=capacities, data=st.data())
def test_matches_reference(capacity, data):
    """Totals, minimum, leaves and stratified draws agree bitwise with the oracle."""
    n = data.draw(st.integers(1, 3 * capacity))
    seed = data.draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    indices = rng.integers(0, capacity, n)
    values = rng.random(n) * 10 ** rng.uniform(-6, 6, n)
    values[rng.random(n) < 0.2] = 0.0  # zero leaves must never be drawn
    tree, oracle = build(capacity, indices, values)

    assert tree.total == oracle.total
    assert tree.min == oracle.min
    assert np.array_equal(tree.get(np.arange(capacity)), oracle.get(np.arange(capacity)))
    assert tree._max_parent_error() == 0.0
    if tree.total > 0:
        batch = data.draw(st.sampled_from([1, 2, 7, 64, 513]))
        drawn = tree.sample(batch, np.random.default_rng(seed))
        assert np.array_equal(drawn, oracle.sample(batch, np.random.default_rng(seed)))
        assert drawn.dtype == np.int64
        assert (np.diff(drawn) >= 0).all(), "stratified draws come out sorted"
        assert (tree.get(drawn) > 0).all()


@settings(max_examples=60, deadline=None)
@given(capacity=capacities, seed=st.integers(0, 2**32 - 1))
def test_draws_fall_in_their_stratum(capacity, seed):
    """With dyadic values (exact sums) draw j is the leaf whose cumulative interval holds its target."""
    rng = np.random.default_rng(seed)
    values = rng.integers(0, 9, capacity) / 8.0
    values[rng.integers(0, capacity)] = 1.0
    tree = SumTree(capacity)
    tree.update(np.arange(capacity), values)
    batch = 97
    # sample() takes its uniforms as the generator's next `batch` random() values.
    u = np.random.default_rng(seed + 1).random(batch)
    targets = (np.arange(batch) + u) * (tree.total / batch)
    expected = np.searchsorted(np.cumsum(values), targets, side="right")
    assert np.array_equal(tree.sample(batch, np.random.default_rng(seed + 1)), expected)


def test_duplicate_indices_last_wins():
    tree = SumTree(16)
    tree.update([3, 5, 3, 3, 5], [1.0, 2.0, 4.0, 8.0, 0.5])
    assert tree.get([3, 5]).tolist() == [8.0, 0.5]
    assert tree.total == 8.5
    oracle = reference.SumTree(16)
    oracle.update([3, 5, 3, 3, 5], [1.0, 2.0, 4.0, 8.0, 0.5])
    assert oracle.get([3, 5]).tolist() == [8.0, 0.5]


def test_capacity_one():
    tree = SumTree(1)
    assert tree.total == 0.0 and tree.min == np.inf
    tree.update([0], [2.5])
    assert tree.total == 2.5 and tree.min == 2.5
    assert tree.sample(5, np.random.default_rng(0)).tolist() == [0] * 5


@pytest.mark.parametrize("capacity", [8, 64, 512, 2**15])
def test_power_of_two_filled_exactly(capacity):
    """Every leaf of a full power-of-two tree is reachable, the last one included."""
    tree = SumTree(capacity)
    tree.update(np.arange(capacity), np.ones(capacity))
    assert tree.total == capacity
    drawn = tree.sample(capacity, np.random.default_rng(1))
    # One draw per leaf-wide stratum: each leaf exactly once.
    assert np.array_equal(drawn, np.arange(capacity))


def test_min_ignores_zero_leaves_and_follows_updates():
    tree = SumTree(10)
    tree.update([0, 1, 2], [3.0, 0.0, 5.0])
    assert tree.min == 3.0
    tree.update([0], [7.0])  # the minimum can go up
    assert tree.min == 5.0
    tree.update([2, 0], [0.0, 0.0])
    assert tree.min == np.inf and tree.total == 0.0
    with pytest.raises(ValueError, match="nothing to sample"):
        tree.sample(1, np.random.default_rng(0))


@settings(max_examples=60, deadline=None)
@given(capacity=st.sampled_from([1, 8, 9, 700, 4096, 40_000]), seed=st.integers(0, 2**32 - 1))
def test_min_stays_exact_through_lazy_min_tree(capacity, seed):
    """The min tree is refreshed lazily: raising or zeroing the minimum leaf, lowering others,
    and queues that overflow (over a quarter of the leaf groups written) all keep `min` exact."""
    rng = np.random.default_rng(seed)
    tree, leaves = SumTree(capacity), np.zeros(capacity)
    for _ in range(40):
        op = rng.integers(4)
        if op == 0 and leaves.max() > 0:  # raise or zero the current minimum leaf
            i = int(np.flatnonzero(leaves == leaves[leaves > 0].min())[0])
            idx, vals = np.array([i]), np.array([0.0 if rng.random() < 0.3 else leaves[i] * 3])
        elif op == 1:  # many scattered writes: overflows the queue of written groups
            n = int(rng.integers(1, 3 * capacity + 2))
            idx, vals = rng.integers(0, capacity, n), rng.random(n) * 10
        else:
            n = int(rng.integers(1, 64))
            idx, vals = rng.integers(0, capacity, n), rng.random(n) * 10 ** rng.uniform(-3, 3)
            vals[rng.random(n) < 0.2] = 0.0
        tree.update(idx, vals)
        leaves[idx] = vals  # numpy: the last duplicate wins too
        positive = leaves[leaves > 0]
        assert tree.min == (positive.min() if positive.size else np.inf)
    assert tree._max_parent_error() == 0.0


def test_no_drift_after_two_million_updates():
    """The root is recomputed from children, never patched: it equals a tree built fresh."""
    capacity = 1000
    tree = SumTree(capacity)
    rng = np.random.default_rng(7)
    for _ in range(2000):
        tree.update(rng.integers(0, capacity, 1000), rng.random(1000) * 10 ** rng.uniform(-8, 8))
    leaves = tree.get(np.arange(capacity))
    fresh = SumTree(capacity)
    fresh.update(np.arange(capacity), leaves)
    assert tree.total == fresh.total
    assert tree.min == fresh.min == leaves[leaves > 0].min()
    assert tree._max_parent_error() == 0.0
    assert tree.total == pytest.approx(np.sum(leaves), rel=1e-12)


@pytest.mark.parametrize(
    "indices, values, message",
    [
        ([0, 10], [1.0, 1.0], r"indices\[1\] = 10 is out of range \[0, 10\)"),
        ([-1], [1.0], r"indices\[0\] = -1 is out of range"),
        ([0, 1], [1.0, np.nan], r"values\[1\] = nan"),
        ([0], [-0.5], r"values\[0\] = -0.5"),
        ([0], [np.inf], r"values\[0\] = inf"),
        ([0, 1], [1.0], r"values: expected shape \(2,\) real numbers, got \(1,\) float64"),
        ([0.5], [1.0], r"indices: expected shape \(n,\) integers, got \(1,\) float64"),
        ([[0, 1]], [1.0, 1.0], r"indices: expected shape \(n,\) integers, got \(1, 2\) int64"),
    ],
)
def test_bad_update_is_rejected_untouched(indices, values, message):
    tree = SumTree(10)
    tree.update([2], [1.0])
    with pytest.raises(ValueError, match=message):
        tree.update(indices, values)
    assert tree.total == 1.0 and tree.get([0, 1]).tolist() == [0.0, 0.0]


def test_bad_arguments():
    with pytest.raises(ValueError, match="capacity must be in"):
        SumTree(0)
    tree = SumTree(4)
    tree.update([0], [1.0])
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        tree.sample(0, np.random.default_rng(0))
    with pytest.raises(ValueError, match=r"indices\[0\] = 4 is out of range"):
        tree.get([4])


@pytest.mark.parametrize("capacity", [2, 9, 4096])
def test_finite_values_whose_sum_overflows_are_refused_untouched(capacity):
    """Every leaf finite but the total inf: each draw would then land on the same leaf."""
    tree = SumTree(capacity)
    tree.update([0, 1], [1.0, 3.0])
    before = (tree.total, tree.min, tree.get(np.arange(capacity)).tolist())
    big = np.finfo(np.float64).max / 2
    with pytest.raises(ValueError, match="would make the total inf.*nothing was written"):
        tree.update([0, capacity - 1, 0], [big, big * 1.5, big * 1.5])  # with a duplicate
    assert (tree.total, tree.min, tree.get(np.arange(capacity)).tolist()) == before
    tree.update([capacity - 1], [big])  # alone it fits
    assert np.isfinite(tree.total)
    counts = np.bincount(tree.sample(64, np.random.default_rng(0)), minlength=capacity)
    assert counts[capacity - 1] == 64
