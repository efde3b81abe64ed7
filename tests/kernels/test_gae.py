"""GAE: the compiled kernel against the numpy oracle, hand-computed cases and truncation."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aiorl.replay import gae, reference


def rollout(T, E, seed=0, dtype=np.float32):
    rng = np.random.default_rng(seed)
    return dict(
        rewards=rng.normal(size=(T, E)).astype(dtype),
        values=rng.normal(size=(T, E)).astype(dtype),
        bootstrap_value=rng.normal(size=E).astype(dtype),
        terminated=np.zeros((T, E), bool),
        truncated=np.zeros((T, E), bool),
    ), rng.normal(size=(T, E)).astype(dtype)


def loop_gae(r, v, boot, term, trunc, tv, gamma, lam):
    """The definition, one env and one step at a time, in Python floats."""
    T, E = r.shape
    adv = np.zeros((T, E))
    for e in range(E):
        last = 0.0
        for t in reversed(range(T)):
            if term[t, e]:
                next_v, last = 0.0, 0.0
            elif trunc[t, e]:
                next_v, last = float(tv[t, e]), 0.0
            elif t == T - 1:
                next_v, last = float(boot[e]), 0.0
            else:
                next_v = float(v[t + 1, e])
            last = float(r[t, e]) + gamma * next_v - float(v[t, e]) + gamma * lam * last
            adv[t, e] = last
    return adv, adv + v


@pytest.mark.parametrize("kind", ["terminated", "truncated", "both"])
@pytest.mark.parametrize("position", range(6))
def test_every_episode_end_position(position, kind):
    args, tv = rollout(6, 2, seed=position)
    for flag in ("terminated", "truncated") if kind == "both" else (kind,):
        args[flag][position, 0] = True
    adv, targets = gae(**args, gamma=0.9, lam=0.8, truncated_values=tv)
    want_adv, want_targets = reference.gae(**args, gamma=0.9, lam=0.8, truncated_values=tv)
    np.testing.assert_array_equal(adv, want_adv)
    np.testing.assert_array_equal(targets, want_targets)
    loop_adv, loop_targets = loop_gae(
        args["rewards"], args["values"], args["bootstrap_value"], args["terminated"], args["truncated"], tv, 0.9, 0.8
    )
    np.testing.assert_allclose(adv, loop_adv, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(targets, loop_targets, rtol=1e-5, atol=1e-5)


def test_hand_computed():
    gamma, lam = 0.5, 0.5
    r = np.array([[1.0], [1.0], [1.0]])
    v = np.array([[0.0], [0.0], [0.0]])
    term = np.array([[False], [False], [False]])
    trunc = np.zeros_like(term)
    # No episode end: deltas 1, 1, 1 + 0.5 * 2 (bootstrap 2); A2 = 2, A1 = 1 + .25 * 2, A0 = 1 + .25 * 1.5
    adv, targets = gae(r, v, np.array([2.0]), term, trunc, gamma, lam)
    assert adv[:, 0].tolist() == [1.375, 1.5, 2.0] and targets[:, 0].tolist() == [1.375, 1.5, 2.0]
    # Termination at t=1: no bootstrap there, and A1 does not see A2.
    term[1, 0] = True
    adv, _ = gae(r, v, np.array([2.0]), term, trunc, gamma, lam)
    assert adv[:, 0].tolist() == [1.25, 1.0, 2.0]
    # Truncation at t=1 instead: bootstraps from V(final obs) = 4, still cut from A2.
    term[1, 0], trunc[1, 0] = False, True
    tv = np.array([[0.0], [4.0], [0.0]])
    adv, _ = gae(r, v, np.array([2.0]), term, trunc, gamma, lam, truncated_values=tv)
    assert adv[:, 0].tolist() == [1.0 + 0.25 * 3.0, 3.0, 2.0]


@settings(max_examples=80, deadline=None)
@given(
    T=st.integers(1, 40),
    E=st.integers(1, 5),
    gamma=st.sampled_from([0.0, 0.9, 0.99, 1.0]),
    lam=st.sampled_from([0.0, 0.95, 1.0]),
    end_rate=st.sampled_from([0.0, 0.1, 0.5]),
    dtype=st.sampled_from([np.float32, np.float64]),
    seed=st.integers(0, 2**32 - 1),
)
def test_matches_reference(T, E, gamma, lam, end_rate, dtype, seed):
    args, tv = rollout(T, E, seed, dtype)
    rng = np.random.default_rng(seed + 1)
    args["terminated"] = rng.random((T, E)) < end_rate
    args["truncated"] = rng.random((T, E)) < end_rate
    adv, targets = gae(**args, gamma=gamma, lam=lam, truncated_values=tv)
    assert adv.dtype == targets.dtype == dtype and adv.shape == (T, E)
    want_adv, want_targets = reference.gae(**args, gamma=gamma, lam=lam, truncated_values=tv)
    np.testing.assert_array_equal(adv, want_adv)
    np.testing.assert_array_equal(targets, want_targets)


def test_truncation_needs_final_values():
    args, _ = rollout(4, 2)
    args["truncated"][2, 1] = True
    with pytest.raises(ValueError, match=r"truncated\[2, 1\] is set .* truncated_values was not given"):
        gae(**args, gamma=0.9, lam=0.9)
    args["terminated"][2, 1] = True  # terminated wins: nothing to bootstrap
    adv, targets = gae(**args, gamma=0.9, lam=0.9)
    want_adv, want_targets = reference.gae(**args, gamma=0.9, lam=0.9)
    np.testing.assert_array_equal(adv, want_adv)
    np.testing.assert_array_equal(targets, want_targets)
    zeros = np.zeros((4, 2), np.float32)
    loop_adv, _ = loop_gae(
        args["rewards"], args["values"], args["bootstrap_value"], args["terminated"], args["truncated"], zeros, 0.9, 0.9
    )
    np.testing.assert_allclose(adv, loop_adv, rtol=1e-5, atol=1e-5)
    # Final values, when given, are not read where the episode terminated.
    huge, _ = gae(**args, gamma=0.9, lam=0.9, truncated_values=np.full((4, 2), 1e6, np.float32))
    np.testing.assert_array_equal(huge, adv)


def test_mixed_dtypes_promote_and_bad_inputs():
    args, _ = rollout(3, 2)
    adv, _ = gae(**dict(args, values=args["values"].astype(np.float64)), gamma=0.9, lam=0.9)
    assert adv.dtype == np.float64
    with pytest.raises(ValueError, match=r"bootstrap_value: expected shape \(2,\) float, got \(3,\)"):
        gae(**dict(args, bootstrap_value=np.zeros(3)), gamma=0.9, lam=0.9)
    with pytest.raises(ValueError, match=r"rewards: expected shape \(3, 2\) float, got \(2, 3\)"):
        gae(**dict(args, rewards=np.zeros((2, 3))), gamma=0.9, lam=0.9)
    with pytest.raises(ValueError, match=r"values: expected shape \(T, num_envs\), got \(3,\)"):
        gae(**dict(args, values=np.zeros(3)), gamma=0.9, lam=0.9)
    with pytest.raises(ValueError, match=r"truncated: expected shape \(3, 2\) bool"):
        gae(**dict(args, truncated=np.zeros((3, 2), np.float32)), gamma=0.9, lam=0.9)
    with pytest.raises(ValueError, match=r"lam must be in \[0, 1\]"):
        gae(**args, gamma=0.9, lam=1.1)
    with pytest.raises(ValueError, match=r"gamma must be in \[0, 1\]"):
        gae(**args, gamma=-0.1, lam=0.9)
