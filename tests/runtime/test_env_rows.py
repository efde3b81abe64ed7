"""An actor's account of its env's non-finite values (`aiorl.runtime.env_faults.EnvFaults`): steps
counted, rows dropped before they are sent, NaN returns kept out of heartbeats, and an env with
no finite step in its first FAIL_AFTER_STEPS steps failing the run (by steps, not time)."""

from __future__ import annotations

import numpy as np
import pytest

from aiorl.runtime.env_faults import EnvFaults, EnvNotFinite
from aiorl.runtime.role import FatalToRun


def rollout(T: int = 4, n: int = 2, bad_reward=(), bad_obs=()) -> dict:
    """A [T, n] rollout as EnvRunner makes it; `bad_*`: (t, i) made NaN."""
    out = {
        "obs": np.zeros((T, n, 3), np.float32),
        "action": np.zeros((T, n), np.int64),
        "reward": np.ones((T, n), np.float32),
        "next_obs": np.zeros((T, n, 3), np.float32),
        "terminated": np.zeros((T, n), np.bool_),
        "truncated": np.zeros((T, n), np.bool_),
    }
    for t, i in bad_reward:
        out["reward"][t, i] = np.nan
    for t, i in bad_obs:
        out["next_obs"][t, i, 1] = np.inf
    return out


def test_steps_with_a_non_finite_reward_or_observation_are_counted():
    faults = EnvFaults("nan_env:NanEnv", "actor-0")
    faults.check_rollout(rollout())
    assert faults.steps_nonfinite == 0 and faults.steps == 8
    faults.check_rollout(rollout(bad_reward=[(0, 1), (3, 0)], bad_obs=[(3, 0), (2, 1)]))
    assert faults.steps_nonfinite == 3 and faults.fields == {"reward", "next_obs"}
    assert faults.stats()["env_steps_nonfinite"] == 3


def test_an_env_with_no_finite_step_fails_by_steps_naming_it_and_the_field():
    faults = EnvFaults("nan_env:NanEnv", "actor-1", fail_after_steps=20)
    every = [(t, i) for t in range(4) for i in range(2)]
    faults.check_rollout(rollout(bad_reward=every))  # 8 steps
    faults.check_rollout(rollout(bad_reward=every))  # 16
    with pytest.raises(EnvNotFinite) as failed:
        faults.check_rollout(rollout(bad_reward=every))  # 24 >= 20
    message = str(failed.value)
    assert message.startswith("env nan_env:NanEnv gave no finite reward in the first 24 env steps of actor-1")
    assert "\n" not in message
    assert isinstance(failed.value, FatalToRun)  # not restarted: a new actor gets the same env


def test_one_finite_step_is_enough_to_go_on():
    faults = EnvFaults("nan_env:NanEnv", "actor-0", fail_after_steps=8)
    almost = [(t, i) for t in range(4) for i in range(2)][1:]
    faults.check_rollout(rollout(bad_reward=almost))
    every = [(t, i) for t in range(4) for i in range(2)]
    for _ in range(5):
        faults.check_rollout(rollout(bad_reward=every))
    assert faults.steps_nonfinite == 7 + 40


def test_rows_holding_a_non_finite_float_are_dropped_with_their_priorities():
    faults = EnvFaults("e", "actor-0")
    batch = {
        "obs": np.zeros((5, 3), np.float32),
        "reward": np.array([1, np.nan, 1, 1, np.inf], np.float32),
        "action": np.arange(5),
    }
    priorities = np.arange(5, dtype=np.float64)
    kept, kept_priorities = faults.drop_rows(batch, priorities)
    assert list(kept["action"]) == [0, 2, 3] and list(kept_priorities) == [0, 2, 3]
    assert faults.rows_dropped == 2
    clean = {k: v[[0, 2]] for k, v in batch.items()}
    assert faults.drop_rows(clean, None)[0] is clean  # nothing to drop: the same batch
    bad = {k: v[[1, 4]] for k, v in batch.items()}
    assert faults.drop_rows(bad, priorities[[1, 4]]) == ({}, None)  # nothing left to send
    assert faults.rows_dropped == 4


def test_non_finite_returns_never_reach_a_heartbeat():
    faults = EnvFaults("e", "actor-0")
    returns, lengths = faults.finite_episodes([1.0, float("nan"), 3.0, float("-inf")], [10, 11, 12, 13])
    assert returns == [1.0, 3.0] and lengths == [10, 12]
    assert faults.episodes_nonfinite == 2
