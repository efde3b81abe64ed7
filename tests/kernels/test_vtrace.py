"""V-trace: the compiled kernel against the numpy oracle, the definition written as sums,
hand-computed cases, episode ends at every position, truncation and clipping."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aiorl.replay import reference, vtrace


def fragments(B, T, seed=0, dtype=np.float32, log_rho_scale=1.0):
    rng = np.random.default_rng(seed)
    args = dict(
        log_rhos=(log_rho_scale * rng.normal(size=(B, T))).astype(dtype),
        rewards=rng.normal(size=(B, T)).astype(dtype),
        values=rng.normal(size=(B, T)).astype(dtype),
        bootstrap_value=rng.normal(size=B).astype(dtype),
        terminated=np.zeros((B, T), bool),
        truncated=np.zeros((B, T), bool),
    )
    return args, rng.normal(size=(B, T)).astype(dtype)


def definition(
    log_rhos,
    rewards,
    values,
    bootstrap_value,
    terminated,
    truncated,
    truncated_values,
    gamma,
    rho_bar,
    c_bar,
    pg_rho_bar,
    lam=1.0,
):
    """The paper's sums, one fragment and one start step at a time, in Python floats:

        vs_s = V(x_s) + sum_{t=s}^{end} gamma^(t-s) (prod_{i=s}^{t-1} c_i) delta_t,  c_i = lam min(c_bar, rho_i)

    where `end` is the first episode end at or after s, or T-1; the state after
    step t is 0 (terminated), V(final obs) (truncated), the bootstrap (t = T-1)
    or V(x_{t+1}); pg advantage_s = rho_s (r_s + gamma * target(x_{s+1}) - V(x_s)) with
    target(x_{s+1}) = vs_{s+1} inside the episode, else that state's value.
    """
    B, T = values.shape
    vs = np.zeros((B, T))
    pg = np.zeros((B, T))
    for b in range(B):
        rho = [math.exp(float(x)) for x in log_rhos[b]]

        def next_value(t):
            if terminated[b, t]:
                return 0.0
            if truncated[b, t]:
                return float(truncated_values[b, t])
            if t == T - 1:
                return float(bootstrap_value[b])
            return float(values[b, t + 1])

        def ends(t):
            return bool(terminated[b, t] or truncated[b, t] or t == T - 1)

        for s in range(T):
            total, weight, t = 0.0, 1.0, s
            while True:
                delta = min(rho_bar, rho[t]) * (float(rewards[b, t]) + gamma * next_value(t) - float(values[b, t]))
                total += weight * delta
                if ends(t):
                    break
                weight *= gamma * lam * min(c_bar, rho[t])
                t += 1
            vs[b, s] = float(values[b, s]) + total
        for s in range(T):
            target = next_value(s) if ends(s) else vs[b, s + 1]
            pg[b, s] = min(pg_rho_bar, rho[s]) * (float(rewards[b, s]) + gamma * target - float(values[b, s]))
    return vs, pg


def check_all(args, tv, gamma=0.9, rho_bar=1.0, c_bar=1.0, pg_rho_bar=None, rtol=1e-5, lam=1.0):
    vs, pg = vtrace(
        **args, gamma=gamma, rho_bar=rho_bar, c_bar=c_bar, pg_rho_bar=pg_rho_bar, truncated_values=tv, lam=lam
    )
    want_vs, want_pg = reference.vtrace(
        **args, gamma=gamma, rho_bar=rho_bar, c_bar=c_bar, pg_rho_bar=pg_rho_bar, truncated_values=tv, lam=lam
    )
    np.testing.assert_array_equal(vs, want_vs)
    np.testing.assert_array_equal(pg, want_pg)
    def_vs, def_pg = definition(
        **args,
        truncated_values=tv,
        gamma=gamma,
        rho_bar=rho_bar,
        c_bar=c_bar,
        pg_rho_bar=rho_bar if pg_rho_bar is None else pg_rho_bar,
        lam=lam,
    )
    np.testing.assert_allclose(vs, def_vs, rtol=rtol, atol=rtol)
    np.testing.assert_allclose(pg, def_pg, rtol=rtol, atol=rtol)
    return vs, pg


@pytest.mark.parametrize("kind", ["terminated", "truncated", "both"])
@pytest.mark.parametrize("position", range(6))
def test_every_episode_end_position(position, kind):
    """An episode end at each step of a fragment, the last step included (a fragment that ends
    exactly on a terminal step); the second fragment of the batch has none."""
    args, tv = fragments(2, 6, seed=position)
    for flag in ("terminated", "truncated") if kind == "both" else (kind,):
        args[flag][0, position] = True
    vs, pg = check_all(args, tv)
    alone, _ = check_all({k: v[1:] for k, v in args.items()}, tv[1:])
    np.testing.assert_array_equal(vs[1:], alone)  # fragments never see each other


def test_hand_computed():
    """gamma 0.5, V = 0, r = 1, on-policy (rho 1): vs is the discounted return with the bootstrap."""
    zeros = np.zeros((1, 3))
    flags = np.zeros((1, 3), bool)
    r = np.ones((1, 3))
    vs, pg = vtrace(zeros, r, zeros, np.array([4.0]), flags, flags, gamma=0.5)
    # vs_2 = 1 + .5 * 4 = 3; vs_1 = 1 + .5 * 3 = 2.5; vs_0 = 1 + .5 * 2.5 = 2.25
    assert vs[0].tolist() == [2.25, 2.5, 3.0] and pg[0].tolist() == [2.25, 2.5, 3.0]
    # Terminated at t=1: vs_1 = 1, and vs_0 = 1 + .5 * 1; the step after starts a new episode.
    term = flags.copy()
    term[0, 1] = True
    vs, pg = vtrace(zeros, r, zeros, np.array([4.0]), term, flags, gamma=0.5)
    assert vs[0].tolist() == [1.5, 1.0, 3.0] and pg[0].tolist() == [1.5, 1.0, 3.0]
    # Truncated at t=1 instead: bootstraps from V(final obs) = 2, still cut from step 2.
    trunc = flags.copy()
    trunc[0, 1] = True
    tv = np.array([[0.0, 2.0, 0.0]])
    vs, pg = vtrace(zeros, r, zeros, np.array([4.0]), flags, trunc, gamma=0.5, truncated_values=tv)
    assert vs[0].tolist() == [1.0 + 0.5 * 2.0, 2.0, 3.0]
    # The fragment ends on a terminal step: no bootstrap at all.
    term = np.array([[False, False, True]])
    vs, _ = vtrace(zeros, r, zeros, np.array([4.0]), term, flags, gamma=0.5)
    assert vs[0].tolist() == [1.75, 1.5, 1.0]


def test_clipping_by_hand():
    """rho = 2 at step 0 and 0.5 at step 1 (gamma 1, V = 0, r = 1, bootstrap 0)."""
    log_rhos = np.log(np.array([[2.0, 0.5]]))
    zeros = np.zeros((1, 2))
    flags = np.zeros((1, 2), bool)
    r = np.ones((1, 2))
    # rho_bar = c_bar = 1: delta_0 = min(1, 2) * 1, c_0 = 1; delta_1 = .5 -> vs = [1 + .5, .5]
    vs, pg = vtrace(log_rhos, r, zeros, np.zeros(1), flags, flags, gamma=1.0)
    np.testing.assert_allclose(vs[0], [1.5, 0.5])
    np.testing.assert_allclose(pg[0], [1.0 * (1 + 0.5), 0.5 * 1.0])
    # No clipping: delta_0 = 2, c_0 = 2 -> vs_0 = 2 + 2 * .5 = 3; pg_0 = 2 * (1 + .5)
    inf = float("inf")
    vs, pg = vtrace(log_rhos, r, zeros, np.zeros(1), flags, flags, gamma=1.0, rho_bar=inf, c_bar=inf)
    np.testing.assert_allclose(vs[0], [3.0, 0.5])
    np.testing.assert_allclose(pg[0], [2.0 * 1.5, 0.5])
    # c_bar alone: rho_bar 1.5 clips delta_0 to 1.5, c_bar 0.25 the trace -> vs_0 = 1.5 + .25 * .5
    vs, pg = vtrace(log_rhos, r, zeros, np.zeros(1), flags, flags, gamma=1.0, rho_bar=1.5, c_bar=0.25, pg_rho_bar=0.1)
    np.testing.assert_allclose(vs[0], [1.625, 0.5])
    np.testing.assert_allclose(pg[0], [0.1 * 1.5, 0.1 * 1.0])


def test_lambda_scales_the_traces():
    """lam 0: vs is the one-step target; lam 0.5 by hand on two steps (gamma 1, rho 1, V = 0, r = 1)."""
    args, _ = fragments(2, 5, seed=9, dtype=np.float64)
    args["log_rhos"][:] = 0.0
    vs, pg = vtrace(**args, gamma=0.9, lam=0.0)
    r, v, boot = args["rewards"], args["values"], args["bootstrap_value"]
    next_v = np.concatenate([v[:, 1:], boot[:, None]], axis=1)
    np.testing.assert_allclose(vs, r + 0.9 * next_v, rtol=1e-12)
    zeros, flags = np.zeros((1, 2)), np.zeros((1, 2), bool)
    vs, _ = vtrace(zeros, np.ones((1, 2)), zeros, np.zeros(1), flags, flags, gamma=1.0, lam=0.5)
    assert vs[0].tolist() == [1.0 + 0.5 * 1.0, 1.0]
    with pytest.raises(ValueError, match=r"lam must be in \[0, 1\]"):
        vtrace(**args, gamma=0.9, lam=1.5)


def test_on_policy_unclipped_is_the_n_step_return():
    args, _ = fragments(3, 7, seed=5, dtype=np.float64)
    args["log_rhos"][:] = 0.0
    gamma = 0.9
    vs, _ = vtrace(**args, gamma=gamma, rho_bar=float("inf"), c_bar=float("inf"))
    r, boot = args["rewards"], args["bootstrap_value"]
    for s in range(7):
        ret = sum(gamma ** (t - s) * r[:, t] for t in range(s, 7)) + gamma ** (7 - s) * boot
        np.testing.assert_allclose(vs[:, s], ret, rtol=1e-12)


@settings(max_examples=80, deadline=None)
@given(
    B=st.sampled_from([1, 2, 3, 8, 16]),
    T=st.sampled_from([1, 2, 5, 20, 32]),
    gamma=st.sampled_from([0.0, 0.9, 0.99, 1.0]),
    end_rate=st.sampled_from([0.0, 0.1, 0.5]),
    bars=st.sampled_from([(1.0, 1.0, None), (2.0, 0.5, 1.0), (float("inf"), float("inf"), None), (0.5, 0.5, 3.0)]),
    lam=st.sampled_from([1.0, 0.95, 0.0]),
    dtype=st.sampled_from([np.float32, np.float64]),
    seed=st.integers(0, 2**32 - 1),
)
def test_matches_reference(B, T, gamma, end_rate, bars, lam, dtype, seed):
    args, tv = fragments(B, T, seed, dtype)
    rng = np.random.default_rng(seed + 1)
    args["terminated"] = rng.random((B, T)) < end_rate
    args["truncated"] = rng.random((B, T)) < end_rate
    rho_bar, c_bar, pg_rho_bar = bars
    vs, pg = vtrace(
        **args, gamma=gamma, rho_bar=rho_bar, c_bar=c_bar, pg_rho_bar=pg_rho_bar, truncated_values=tv, lam=lam
    )
    assert vs.dtype == pg.dtype == dtype and vs.shape == pg.shape == (B, T)
    want_vs, want_pg = reference.vtrace(
        **args, gamma=gamma, rho_bar=rho_bar, c_bar=c_bar, pg_rho_bar=pg_rho_bar, truncated_values=tv, lam=lam
    )
    np.testing.assert_array_equal(vs, want_vs)
    np.testing.assert_array_equal(pg, want_pg)


@settings(max_examples=30, deadline=None)
@given(T=st.integers(1, 12), end_rate=st.sampled_from([0.1, 0.4]), seed=st.integers(0, 2**32 - 1))
def test_matches_the_definition(T, end_rate, seed):
    args, tv = fragments(3, T, seed, np.float64)
    rng = np.random.default_rng(seed + 2)
    args["terminated"] = rng.random((3, T)) < end_rate
    args["truncated"] = rng.random((3, T)) < end_rate
    check_all(args, tv, gamma=0.95, rho_bar=1.2, c_bar=0.9, pg_rho_bar=0.8, rtol=1e-10, lam=0.9)


def test_truncation_needs_final_values_and_bootstraps_from_them():
    args, tv = fragments(2, 4)
    args["truncated"][1, 2] = True
    with pytest.raises(ValueError, match=r"truncated\[1, 2\] is set .* truncated_values was not given"):
        vtrace(**args, gamma=0.9)
    vs_a, _ = vtrace(**args, gamma=0.9, truncated_values=tv)
    tv2 = tv.copy()
    tv2[1, 2] += 1.0
    vs_b, _ = vtrace(**args, gamma=0.9, truncated_values=tv2)
    assert vs_b[1, 2] > vs_a[1, 2]  # V(final obs) is read where truncated ...
    tv2 = tv.copy()
    tv2[0, 2] += 1.0
    np.testing.assert_array_equal(vtrace(**args, gamma=0.9, truncated_values=tv2)[0], vs_a)  # ... only there
    args["terminated"][1, 2] = True  # terminated wins: nothing to bootstrap
    vs, _ = vtrace(**args, gamma=0.9)
    assert vs.shape == (2, 4)


def test_bad_inputs():
    args, _ = fragments(3, 2)
    vs, _ = vtrace(**dict(args, values=args["values"].astype(np.float64)), gamma=0.9)
    assert vs.dtype == np.float64
    with pytest.raises(ValueError, match=r"bootstrap_value: expected shape \(3,\) float, got \(2,\)"):
        vtrace(**dict(args, bootstrap_value=np.zeros(2)), gamma=0.9)
    with pytest.raises(ValueError, match=r"log_rhos: expected shape \(3, 2\) float, got \(2, 3\)"):
        vtrace(**dict(args, log_rhos=np.zeros((2, 3))), gamma=0.9)
    with pytest.raises(ValueError, match=r"values: expected shape \(B, T\), got \(3,\)"):
        vtrace(**dict(args, values=np.zeros(3)), gamma=0.9)
    with pytest.raises(ValueError, match=r"terminated: expected shape \(3, 2\) bool"):
        vtrace(**dict(args, terminated=np.zeros((3, 2), np.float32)), gamma=0.9)
    with pytest.raises(ValueError, match=r"gamma must be in \[0, 1\]"):
        vtrace(**args, gamma=1.5)
    for name in ("rho_bar", "c_bar", "pg_rho_bar"):
        with pytest.raises(ValueError, match=rf"{name} must be > 0 \(inf: no clipping\), got 0.0"):
            vtrace(**args, gamma=0.9, **{name: 0.0})
    empty = {k: v[:0] for k, v in args.items()}
    vs, pg = vtrace(**empty, gamma=0.9)
    assert vs.shape == pg.shape == (0, 2)
