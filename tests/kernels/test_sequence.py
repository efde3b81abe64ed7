"""R2D2's sequence adder: the compiled kernel against the numpy oracle, the episode edges by
hand, and the properties every batch must have (episodes never mixed, overlap, padding)."""

import importlib.machinery

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aiorl._ext import sequence
from aiorl.replay import SequenceAdder, reference

KEYS = ("obs", "action", "reward", "mask", "terminal", "state", "env")


def test_the_adder_is_the_compiled_one():
    assert sequence.__file__.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES)), sequence.__file__
    assert SequenceAdder is sequence.SequenceAdder


def stream(T, E, state_size=3, seed=0, ends=(), kind="terminated"):
    """obs[t, e] = (t, e) + 1 (so 0 is padding), next_obs = obs + 0.5 (the final obs at an episode
    end tells itself apart from the next step's obs); states encode (t, e) too."""
    rng = np.random.default_rng(seed)
    t, e = np.meshgrid(np.arange(T), np.arange(E), indexing="ij")
    obs = np.stack([t + 1, e + 1], axis=-1).astype(np.float32)
    next_obs = np.concatenate([obs[1:], obs[-1:] + 1], axis=0).copy()
    terminated, truncated = np.zeros((T, E), bool), np.zeros((T, E), bool)
    flags = {"terminated": terminated, "truncated": truncated}
    for step, env in ends:
        flags[kind][step, env] = True
        next_obs[step, env] = obs[step, env] + 0.5
    return dict(
        obs=obs,
        actions=rng.integers(0, 4, (T, E)),
        rewards=rng.normal(size=(T, E)).astype(np.float32),
        next_obs=next_obs,
        terminated=terminated,
        truncated=truncated,
        states=(t[..., None] * 10 + e[..., None] + np.arange(state_size)).astype(np.float32),
    )


def chunk(data, a, b):
    return {k: v[a:b] for k, v in data.items()}


def assert_same(got, want):
    assert set(got) == set(KEYS) == set(want)
    for key in KEYS:
        assert got[key].dtype == want[key].dtype, key
        np.testing.assert_array_equal(got[key], want[key], err_msg=key)


def concat(batches):
    batches = [b for b in batches if b]
    return {k: np.concatenate([b[k] for b in batches]) for k in KEYS}


# --------------------------------------------------------------------------
# Named edge cases, by hand


def test_full_sequences_overlap_by_half_and_carry_their_start_state():
    data = stream(10, 1)
    batch = SequenceAdder(4, 2).add(**data)
    # Starts 0, 2, 4, 6: each closes once it holds 4 steps; 8 is still open.
    assert batch["obs"][:, 0, 0].tolist() == [1, 3, 5, 7]
    assert batch["mask"].all() and not batch["terminal"].any()
    assert batch["state"][:, 0].tolist() == [0, 20, 40, 60]  # the state at each first step
    # obs[m] is the observation after the last step: the bootstrap.
    assert batch["obs"][:, 4, 0].tolist() == [5, 7, 9, 11]
    np.testing.assert_array_equal(batch["action"][1], data["actions"][2:6, 0])


def test_no_overlap_and_overlap_off_by_one_give_different_starts():
    data = stream(9, 1)
    assert SequenceAdder(3, 0).add(**data)["obs"][:, 0, 0].tolist() == [1, 4, 7]
    assert SequenceAdder(3, 1).add(**data)["obs"][:, 0, 0].tolist() == [1, 3, 5, 7]
    assert SequenceAdder(3, 2).add(**data)["obs"][:, 0, 0].tolist() == [1, 2, 3, 4, 5, 6, 7]


def test_an_episode_shorter_than_m_gives_one_padded_sequence():
    data = stream(3, 1, ends=[(2, 0)])
    batch = SequenceAdder(5, 2).add(**data)
    assert len(batch["env"]) == 1
    assert batch["mask"][0].tolist() == [True, True, True, False, False]
    assert batch["obs"][0, :, 0].tolist() == [1, 2, 3, 3.5, 0, 0]  # the final obs, then zeros
    assert batch["reward"][0, 3:].tolist() == [0, 0] and batch["action"][0, 3:].tolist() == [0, 0]
    assert batch["terminal"].tolist() == [True]


@pytest.mark.parametrize("kind", ["terminated", "truncated"])
def test_termination_is_terminal_and_truncation_is_not(kind):
    batch = SequenceAdder(4, 2).add(**stream(6, 1, ends=[(4, 0)], kind=kind))
    # Starts 0 (full at step 3) and 2 (cut at the end, step 4); start 4 is a suffix of 2's.
    assert batch["obs"][:, 0, 0].tolist() == [1, 3]
    assert batch["mask"][1].tolist() == [True, True, True, False]
    assert batch["obs"][1, 3, 0] == 5.5  # the true final observation: the bootstrap on truncation
    assert batch["terminal"].tolist() == [False, kind == "terminated"]


def test_sequences_never_mix_episodes_and_restart_at_episode_start():
    data = stream(8, 1, ends=[(2, 0)])
    data["states"][3, 0] = 0.0  # the actor zeroes the state at an episode start
    batch = SequenceAdder(4, 2).add(**data)
    # Episode 1: steps 0-2 (one padded sequence). Episode 2 starts at step 3: start 3 closes
    # full at step 6, start 5 is still open.
    assert batch["obs"][:, 0, 0].tolist() == [1, 4]
    assert batch["obs"][0, :, 0].tolist() == [1, 2, 3, 3.5, 0]
    assert batch["state"][1].tolist() == [0, 0, 0]


def test_flush_emits_the_earliest_open_sequence_per_env_not_terminal():
    adder = SequenceAdder(4, 2)
    adder.add(**stream(5, 2))
    assert adder.held.tolist() == [3, 3]  # starts 2 (steps 2-4) and 4 are open; 2 is the earliest
    batch = adder.flush()
    assert batch["env"].tolist() == [0, 1]
    assert batch["obs"][:, 0, 0].tolist() == [3, 3]
    assert batch["mask"].sum(axis=1).tolist() == [3, 3] and not batch["terminal"].any()
    assert adder.flush() == {}


def test_state_width_zero_for_a_feed_forward_network():
    data = stream(5, 2, state_size=0)
    batch = SequenceAdder(2, 0).add(**data)
    assert batch["state"].shape == (len(batch["env"]), 0)


def test_bad_input_is_refused_naming_it():
    with pytest.raises(ValueError, match="overlap"):
        SequenceAdder(4, 4)
    adder = SequenceAdder(4, 2)
    data = stream(3, 2)
    with pytest.raises(ValueError, match="states"):
        adder.add(**{**data, "states": data["states"].astype(np.float64)})
    adder.add(**data)
    with pytest.raises(ValueError, match="obs"):
        adder.add(**chunk(stream(3, 3), 0, 3))


# --------------------------------------------------------------------------
# Against the oracle, over random streams


@st.composite
def streams(draw):
    T = draw(st.integers(1, 30))
    E = draw(st.sampled_from([1, 2, 3]))
    m = draw(st.integers(1, 9))
    overlap = draw(st.integers(0, m - 1))
    ends = draw(st.lists(st.tuples(st.integers(0, T - 1), st.integers(0, E - 1)), max_size=8))
    data = stream(T, E, state_size=draw(st.sampled_from([0, 2])), seed=draw(st.integers(0, 99)))
    for step, env in ends:
        data[draw(st.sampled_from(["terminated", "truncated"]))][step, env] = True
    cuts = sorted(draw(st.lists(st.integers(0, T), max_size=4)))
    return data, m, overlap, cuts


@settings(max_examples=150, deadline=None)
@given(streams())
def test_matches_the_oracle_and_carry_across_calls_equals_one_call(case):
    data, m, overlap, cuts = case
    T = len(data["obs"])
    one = SequenceAdder(m, overlap)
    oracle = reference.SequenceAdder(m, overlap)
    whole = one.add(**data)
    assert_same(whole, oracle.add(**data))
    assert_same(one.flush(), oracle.flush())

    split = SequenceAdder(m, overlap)
    bounds = [0, *cuts, T]
    parts = [split.add(**chunk(data, a, b)) for a, b in zip(bounds, bounds[1:]) if b > a]
    assert_same(concat(parts), whole)


@settings(max_examples=100, deadline=None)
@given(streams())
def test_every_step_is_in_a_sequence_of_its_own_episode(case):
    data, m, overlap, _ = case
    T, E = data["rewards"].shape
    adder = SequenceAdder(m, overlap)
    batch = concat([adder.add(**data), adder.flush()])
    end = data["terminated"] | data["truncated"]
    episode = np.cumsum(end, axis=0) - end  # episode index of each step, per env
    covered = np.zeros((T, E), bool)
    for row in range(len(batch["env"])):
        e, L = batch["env"][row], int(batch["mask"][row].sum())
        assert batch["mask"][row].tolist() == [k < L for k in range(m)]  # a prefix
        steps = batch["obs"][row, :L, 0].astype(int) - 1
        assert (batch["obs"][row, :L, 1] == e + 1).all()
        assert (np.diff(steps) == 1).all() and len(set(episode[steps, e])) == 1  # one episode, in order
        start_in_episode = steps[0] - np.flatnonzero(episode[:, e] == episode[steps[0], e])[0]
        assert start_in_episode % (m - overlap) == 0
        np.testing.assert_array_equal(batch["obs"][row, L], data["next_obs"][steps[-1], e])
        assert (batch["obs"][row, L + 1 :] == 0).all() and (batch["reward"][row, L:] == 0).all()
        assert batch["terminal"][row] == data["terminated"][steps[-1], e]
        assert L == m or end[steps[-1], e] or row >= len(batch["env"]) - E  # short: an end or the flush
        covered[steps, e] = True
    assert covered.all()
