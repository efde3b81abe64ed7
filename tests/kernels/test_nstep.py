"""n-step adjustment: the compiled kernel against the numpy oracle and a per-transition loop."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aiorl.replay import NStep, NStepCarry, n_step_adjustment, n_step_flush, reference

KEYS = ("obs", "action", "reward", "next_obs", "done", "discount")


def trajectory(T, E, seed=0, obs_dtype=np.uint8, action_shape=()):
    """obs[t, e] encodes (t, e) so a transition's origin can be read back from its obs."""
    rng = np.random.default_rng(seed)
    ids = np.arange(T * E).reshape(T, E)
    obs = np.stack([ids, ids // 7], axis=-1).astype(obs_dtype)
    return dict(
        obs=obs,
        actions=rng.integers(0, 5, (T, E) + action_shape),
        rewards=rng.normal(size=(T, E)).astype(np.float32),
        next_obs=(obs + 100).astype(obs_dtype),
        terminated=np.zeros((T, E), bool),
        truncated=np.zeros((T, E), bool),
    )


def naive(traj, n, gamma):
    """One transition per step, straight from the definition; windows never cut by the input end are
    the complete ones (n steps or an episode end), the rest are reported as pending."""
    T, E = traj["rewards"].shape
    out, pending = [], 0
    for t in range(T):
        for e in range(E):
            ret, m, done, closed = 0.0, 0, False, False
            while t + m < T:
                ret += gamma**m * float(traj["rewards"][t + m, e])
                m += 1
                if traj["terminated"][t + m - 1, e] or traj["truncated"][t + m - 1, e]:
                    done, closed = bool(traj["terminated"][t + m - 1, e]), True
                    break
                if m == n:
                    closed = True
                    break
            if not closed:
                pending += 1
                continue
            out.append(
                (
                    traj["obs"][t, e],
                    traj["actions"][t, e],
                    ret,
                    traj["next_obs"][t + m - 1, e],
                    done,
                    0.0 if done else gamma**m,
                )
            )
    return out, pending


def assert_same_batch(got, want):
    assert set(got) == set(KEYS)
    for key in KEYS:
        assert got[key].dtype == want[key].dtype, key
        np.testing.assert_array_equal(got[key], want[key], err_msg=key)


def assert_matches_naive(batch, rows):
    assert len(batch["reward"]) == len(rows)
    for i, (obs, action, ret, next_obs, done, discount) in enumerate(rows):
        np.testing.assert_array_equal(batch["obs"][i], obs)
        np.testing.assert_array_equal(batch["action"][i], action)
        np.testing.assert_array_equal(batch["next_obs"][i], next_obs)
        assert batch["reward"][i] == pytest.approx(ret, rel=1e-6, abs=1e-6)
        assert batch["done"][i] == done
        assert batch["discount"][i] == pytest.approx(discount, rel=1e-6)


@pytest.mark.parametrize("kind", ["terminated", "truncated", "both"])
@pytest.mark.parametrize("position", range(7))
def test_every_episode_end_position(position, kind):
    T, n, gamma = 7, 3, 0.9
    traj = trajectory(T, 2, seed=position)
    for flag in ("terminated", "truncated") if kind == "both" else (kind,):
        traj[flag][position, 0] = True
    traj["terminated"][(position + 3) % T, 1] = True  # the second env ends elsewhere
    batch, carry = n_step_adjustment(**traj, n=n, gamma=gamma)
    want, oracle_carry = reference.n_step_adjustment(**traj, n=n, gamma=gamma)
    assert_same_batch(batch, want)
    rows, pending = naive(traj, n, gamma)
    assert_matches_naive(batch, rows)
    assert len(carry) == pending == int(oracle_carry["pending"].sum())
    assert_same_batch(n_step_flush(carry, gamma), reference.n_step_flush(oracle_carry, gamma))


def test_hand_computed_cases():
    g = 0.5
    # Episode shorter than n: terminates at t=1 (n=3).
    traj = trajectory(2, 1)
    traj["rewards"][:, 0] = [1.0, 2.0]
    traj["terminated"][1, 0] = True
    batch, carry = n_step_adjustment(**traj, n=3, gamma=g)
    assert batch["reward"].tolist() == [1.0 + g * 2.0, 2.0]
    assert batch["done"].tolist() == [True, True] and batch["discount"].tolist() == [0.0, 0.0]
    assert batch["next_obs"][:, 0].tolist() == [101, 101] and len(carry) == 0
    # Single-transition episode.
    traj = trajectory(1, 1)
    traj["rewards"][0, 0] = 3.0
    traj["terminated"][0, 0] = True
    batch, _ = n_step_adjustment(**traj, n=5, gamma=g)
    assert batch["reward"].tolist() == [3.0] and batch["done"].tolist() == [True]
    # Truncation ends the window but bootstraps: discount gamma^m, done False.
    traj = trajectory(4, 1)
    traj["rewards"][:, 0] = [1.0, 1.0, 1.0, 1.0]
    traj["truncated"][1, 0] = True
    batch, carry = n_step_adjustment(**traj, n=3, gamma=g)
    assert batch["reward"].tolist() == [1.5, 1.0]  # t=2, 3 still open
    assert batch["done"].tolist() == [False, False] and batch["discount"].tolist() == [0.25, 0.5]
    assert batch["next_obs"][:, 0].tolist() == [101, 101] and carry.pending.tolist() == [2]
    # Full windows: gamma^n and the observation n steps later.
    traj = trajectory(5, 1)
    traj["rewards"][:, 0] = 1.0
    batch, _ = n_step_adjustment(**traj, n=3, gamma=g)
    assert batch["reward"].tolist() == [1.75, 1.75, 1.75] and batch["discount"].tolist() == [0.125] * 3
    assert batch["next_obs"][:, 0].tolist() == [102, 103, 104]
    # n = 1 is the identity.
    traj = trajectory(3, 2)
    batch, carry = n_step_adjustment(**traj, n=1, gamma=g)
    np.testing.assert_array_equal(batch["obs"], traj["obs"].reshape(6, 2))
    np.testing.assert_array_equal(batch["reward"], traj["rewards"].reshape(6))
    assert batch["discount"].tolist() == [0.5] * 6 and len(carry) == 0


def test_windows_span_calls_and_flush_cuts_them():
    g = 0.5
    traj = trajectory(4, 1)
    traj["rewards"][:, 0] = [1.0, 2.0, 4.0, 8.0]
    steps = [{k: v[t : t + 1] for k, v in traj.items()} for t in range(4)]
    batch, carry = n_step_adjustment(**steps[0], n=3, gamma=g)
    assert len(batch["reward"]) == 0 and len(carry) == 1 and isinstance(carry, NStepCarry)
    batch, carry = n_step_adjustment(**steps[1], n=3, gamma=g, carry=carry)
    assert len(batch["reward"]) == 0 and carry.pending.tolist() == [2]
    batch, carry = n_step_adjustment(**steps[2], n=3, gamma=g, carry=carry)
    assert batch["reward"].tolist() == [1 + 1 + 1] and batch["next_obs"][:, 0].tolist() == [102]
    flushed = n_step_flush(carry, g)  # windows from t=1 and t=2, cut at t=2
    assert flushed["reward"].tolist() == [2 + 2, 4.0] and flushed["discount"].tolist() == [0.25, 0.5]
    assert flushed["next_obs"][:, 0].tolist() == [102, 102] and flushed["done"].tolist() == [False, False]
    # The carry is not consumed: the stream can go on from it instead.
    batch, carry = n_step_adjustment(**steps[3], n=3, gamma=g, carry=carry)
    assert batch["reward"].tolist() == [2 + 2 + 2] and carry.pending.tolist() == [2]


CHUNKS = st.lists(st.integers(0, 6), min_size=1, max_size=6)


@settings(max_examples=150, deadline=None)
@given(
    T=st.integers(0, 16),
    E=st.integers(1, 4),
    n=st.integers(1, 5),
    gamma=st.sampled_from([0.0, 0.5, 0.99, 1.0]),
    end_rate=st.sampled_from([0.0, 0.2, 0.6]),
    chunks=CHUNKS,
    seed=st.integers(0, 2**32 - 1),
    obs_dtype=st.sampled_from([np.uint8, np.float32]),
    action_shape=st.sampled_from([(), (2,)]),
)
def test_chunked_stream_matches_reference_and_loses_nothing(
    T, E, n, gamma, end_rate, chunks, seed, obs_dtype, action_shape
):
    traj = trajectory(T, E, seed, obs_dtype, action_shape)
    rng = np.random.default_rng(seed)
    traj["terminated"] = rng.random((T, E)) < end_rate / 2
    traj["truncated"] = rng.random((T, E)) < end_rate / 2
    # Split the time axis into calls (some empty), carrying between them.
    bounds = np.minimum(np.cumsum([0] + chunks), T).tolist() + [T]
    carry = oracle_carry = None
    got = []
    for a, b in zip(bounds[:-1], bounds[1:]):
        part = {k: v[a:b] for k, v in traj.items()}
        batch, carry = n_step_adjustment(**part, n=n, gamma=gamma, carry=carry)
        want, oracle_carry = reference.n_step_adjustment(**part, n=n, gamma=gamma, carry=oracle_carry)
        assert_same_batch(batch, want)
        got.append(batch)
    flushed = n_step_flush(carry, gamma)
    assert_same_batch(flushed, reference.n_step_flush(oracle_carry, gamma))
    # Nothing lost or duplicated at call boundaries: the calls emit exactly the one-shot transitions.
    rows, pending = naive(traj, n, gamma)
    assert len(carry) == pending
    # Calls emit in (start step, env) order within each call; across calls a
    # later call can close an earlier-started window, so compare in start order.
    chunked = {k: np.concatenate([b[k] for b in got]) for k in KEYS}
    order = np.argsort(chunked["obs"][:, 0].astype(np.int64), kind="stable")  # obs[t, e, 0] = t * E + e
    chunked = {k: v[order] for k, v in chunked.items()}
    assert_matches_naive(chunked, rows)
    assert len(flushed["reward"]) == pending


def test_nstep_class_and_dtypes():
    adder = NStep(3, 0.9)
    assert adder.flush() == {} and adder.pending == 0
    traj = trajectory(5, 2, obs_dtype=np.uint8)
    first = adder.add(**{k: v[:2] for k, v in traj.items()})
    assert len(first["reward"]) == 0 and adder.pending == 4
    second = adder.add(**{k: v[2:] for k, v in traj.items()})
    assert second["obs"].dtype == np.uint8 and second["next_obs"].dtype == np.uint8
    assert second["action"].dtype == traj["actions"].dtype and second["reward"].dtype == np.float32
    assert second["done"].dtype == np.bool_ and second["discount"].dtype == np.float32
    assert len(second["reward"]) == 6 and adder.pending == 4
    rest = adder.flush()
    assert len(rest["reward"]) == 4 and adder.pending == 0
    assert "NStep(n=3" in repr(adder)


def test_bad_inputs():
    traj = trajectory(4, 2)
    with pytest.raises(ValueError, match="n must be >= 1, got 0"):
        n_step_adjustment(**traj, n=0, gamma=0.9)
    with pytest.raises(ValueError, match=r"gamma must be in \[0, 1\], got 1.5"):
        n_step_adjustment(**traj, n=2, gamma=1.5)
    with pytest.raises(ValueError, match=r"next_obs: expected \(4, 2, 2\) uint8 like obs, got \(4, 2, 3\) uint8"):
        n_step_adjustment(**dict(traj, next_obs=np.zeros((4, 2, 3), np.uint8)), n=2, gamma=0.9)
    with pytest.raises(ValueError, match=r"rewards: expected shape \(4, 2\) float, got \(4,\)"):
        n_step_adjustment(**dict(traj, rewards=np.zeros(4)), n=2, gamma=0.9)
    with pytest.raises(ValueError, match=r"terminated: expected shape \(4, 2\) bool, got \(4, 2\) float64"):
        n_step_adjustment(**dict(traj, terminated=np.zeros((4, 2))), n=2, gamma=0.9)
    with pytest.raises(ValueError, match=r"actions: expected shape \(4, 2, ...\)"):
        n_step_adjustment(**dict(traj, actions=np.zeros((3, 2))), n=2, gamma=0.9)
    _, carry = n_step_adjustment(**traj, n=2, gamma=0.9)
    with pytest.raises(ValueError, match="carry was made with n=2, gamma=0.9; this call has n=3"):
        n_step_adjustment(**traj, n=3, gamma=0.9, carry=carry)
    with pytest.raises(ValueError, match="carry holds 2 envs; this call has 1"):
        n_step_adjustment(**trajectory(4, 1), n=2, gamma=0.9, carry=carry)
    with pytest.raises(ValueError, match=r"obs: carry holds rows \(2,\) uint8"):
        n_step_adjustment(**trajectory(4, 2, obs_dtype=np.float32), n=2, gamma=0.9, carry=carry)
    with pytest.raises(ValueError, match="expected the NStepCarry"):
        n_step_adjustment(**traj, n=2, gamma=0.9, carry={})
    with pytest.raises(ValueError, match="carry was made with gamma=0.9; this call has gamma=0.5"):
        n_step_flush(carry, 0.5)
    # Integer flags are accepted as != 0.
    batch, _ = n_step_adjustment(**dict(traj, terminated=np.ones((4, 2), np.int8)), n=2, gamma=0.9)
    assert batch["done"].all() and len(batch["done"]) == 8
