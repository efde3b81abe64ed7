"""Per-decision doubly robust estimation (Jiang & Li 2016, "Doubly Robust Off-policy Value
Evaluation for Reinforcement Learning", eq. 10 unrolled):

    DR_e = sum_t gamma^t ( W_{e,t} r_t - W_{e,t} Q(s_t, a_t) + W_{e,t-1} V(s_t) ),  W_{e,-1} = 1,
    V(s) = sum_a pi_e(a|s) Q(s, a),       DR = mean_e DR_e

Q is any model of the target policy's action values (fitted Q evaluation's, `aiorl.ope.fqe`):
with the true behaviour probabilities each correction term has mean zero whatever Q is, so DR
is unbiased; a good Q only lowers its variance. With Q = 0 it is step-wise IPS.
"""

from __future__ import annotations

import numpy as np

from aiorl.ope.episodes import Trajectories


def doubly_robust_per_episode(
    trajectories: Trajectories,
    ratio: np.ndarray,
    reward: np.ndarray,
    q_taken: np.ndarray,
    v: np.ndarray,
    gamma: float,
) -> np.ndarray:
    """[E]: DR_e. `ratio`, `reward`, `q_taken` (Q(s_t, a_t)), `v` (V(s_t)): per dataset row."""
    weights = np.cumprod(trajectories.pad(ratio, 1.0), axis=1)
    previous = np.concatenate([np.ones((weights.shape[0], 1)), weights[:, :-1]], axis=1)
    terms = weights * (trajectories.pad(reward, 0.0) - trajectories.pad(q_taken, 0.0)) + previous * trajectories.pad(
        v, 0.0
    )
    return (terms * trajectories.discounts(gamma)[None, :]).sum(axis=1)
