"""EasyRL's four importance-sampling estimators (``easy_rl/utils/inverse_propensity_score.py``,
``ips_eval``), on a dataset's episodes.

With rho_t = pi_e(a_t|s_t) / pi_b(a_t|s_t), W_{e,t} = prod_{k<=t} rho_k (the weight of episode
e's first t+1 steps), W_e its whole-episode weight and G_e = sum_t gamma^t r_t its return:

    IPS    = mean_e  W_e G_e
    SIPS   = mean_e  sum_t W_{e,t} gamma^t r_t                 (step-wise, per-decision)
    WIPS   = mean_e  W_e G_e / mean_e W_e                       (weighted: self-normalised)
    SWIPS  = mean_e  sum_t W_{e,t} gamma^t r_t / mean_{e'} W_{e',t}

Two departures from EasyRL, both for consistency. SWIPS's mean over e' at step t is over every
episode, one that ended before t keeping its last weight (and reward 0 from then on: the
absorbing state of Precup et al. 2000's per-decision weighted estimator); EasyRL's ``nanmean``
takes only the episodes that reach step t, which normalises away how likely the target is to
reach t at all: with a reward constant per step (CartPole's) it returns the behaviour policy's
value whatever the target. And EasyRL clips each ratio to [0.01, 100]; these do not (a clipped
ratio biases IPS and SIPS).

Each estimator is a function of episode multiplicities ``counts`` [B, E] (ones: the dataset
itself; a bootstrap resample: how often each episode was drawn) returning [B] estimates, so
that the bootstrap resamples thousands of times in a few matrix products.
"""

from __future__ import annotations

import numpy as np

from aiorl.ope.episodes import Trajectories


def _mean_over(counts: np.ndarray, per_episode: np.ndarray) -> np.ndarray:
    return counts @ per_episode / counts.sum(axis=1)


def _ratio(num: np.ndarray, den: np.ndarray, empty: float) -> np.ndarray:
    """num / den, `empty` where den is 0 (no weight at all: nothing the target would do was logged)."""
    out = np.full(np.broadcast_shapes(num.shape, den.shape), empty)
    np.divide(num, den, out=out, where=den != 0)
    return out


class ImportanceTables:
    """The [E, T] tables the four estimators share: cumulative weights and discounted rewards."""

    def __init__(self, trajectories: Trajectories, ratio: np.ndarray, reward: np.ndarray, gamma: float):
        # Past an episode's end its weight stays its last and its reward is 0: sums over t need no mask.
        self.weights = np.cumprod(trajectories.pad(ratio, 1.0), axis=1)
        self.discounted = trajectories.pad(reward, 0.0) * trajectories.discounts(gamma)[None, :]
        self.episode_weight = self.weights[:, -1]
        self.episode_return = self.discounted.sum(axis=1)
        self.stepwise = (self.weights * self.discounted).sum(axis=1)  # sum_t W_{e,t} gamma^t r_t

    def ips(self, counts: np.ndarray) -> np.ndarray:
        return _mean_over(counts, self.episode_weight * self.episode_return)

    def sips(self, counts: np.ndarray) -> np.ndarray:
        return _mean_over(counts, self.stepwise)

    def wips(self, counts: np.ndarray) -> np.ndarray:
        # nan (undefined) when no episode has weight: the target never takes all of any episode's actions.
        return _ratio(counts @ (self.episode_weight * self.episode_return), counts @ self.episode_weight, np.nan)

    def swips(self, counts: np.ndarray) -> np.ndarray:
        # sum_t (sum_e W_{e,t} gamma^t r_{e,t}) / (sum_e W_{e,t}): the 1/E of both means cancels.
        # A step no episode has weight at adds nothing; undefined when that is the first step.
        total = counts @ self.weights
        per_step = _ratio(counts @ (self.weights * self.discounted), total, 0.0).sum(axis=1)
        return np.where(total[:, 0] > 0, per_step, np.nan)
