"""Every estimate of one target policy on one dataset, each with its bootstrap interval.

`estimate_all` works on arrays (the target's probabilities, the behaviour's, a Q model's values):
what the tests and the evaluations during training call. `evaluate_policy` starts from a policy
aiorl exported and a dataset: it computes those arrays (the behaviour probabilities recorded or
cloned, FQE's Q) and returns the same report, as `aiorl ope` prints it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np

from aiorl.offline.dataset import Dataset
from aiorl.ope.behaviour import behaviour_probabilities
from aiorl.ope.bootstrap import LEVEL, bootstrap_interval
from aiorl.ope.doubly_robust import doubly_robust_per_episode
from aiorl.ope.episodes import Trajectories
from aiorl.ope.fqe import FqeOptions, fitted_q
from aiorl.ope.importance import ImportanceTables
from aiorl.ope.target import OpeError, target_probabilities

IMPORTANCE = ("ips", "sips", "wips", "swips")
MODEL_BASED = ("dr", "fqe")  # need a Q model of the target policy (FQE's)
ESTIMATORS = IMPORTANCE + MODEL_BASED
DEFAULT_FQE = FqeOptions()
NAMES = {
    "ips": "IPS",
    "sips": "step-wise IPS",
    "wips": "weighted IPS",
    "swips": "step-wise weighted IPS",
    "dr": "doubly robust",
    "fqe": "fitted Q evaluation",
}


@dataclass(frozen=True)
class Estimate:
    value: float | None  # None: undefined (a weighted estimate where no episode has weight)
    low: float | None  # the bootstrap interval; None without resamples
    high: float | None


def _mean(counts: np.ndarray, per_episode: np.ndarray) -> np.ndarray:
    return counts @ per_episode / counts.sum(axis=1)


def estimators(
    dataset: Dataset,
    target_probs: np.ndarray,
    behaviour_prob: np.ndarray,
    gamma: float,
    q: np.ndarray | None = None,
) -> dict[str, Callable[[np.ndarray], np.ndarray]]:
    """Each estimator as a function of episode counts [B, E] -> [B] (`aiorl.ope.importance`)."""
    trajectories = Trajectories.of(dataset)
    rows = np.arange(len(dataset))
    ratio = target_probs[rows, dataset.action] / behaviour_prob
    reward = np.asarray(dataset.reward, np.float64)
    tables = ImportanceTables(trajectories, ratio, reward, gamma)
    out = {"ips": tables.ips, "sips": tables.sips, "wips": tables.wips, "swips": tables.swips}
    if q is not None:
        v = (target_probs * q).sum(axis=1)
        dr = doubly_robust_per_episode(trajectories, ratio, reward, q[rows, dataset.action], v, gamma)
        v0 = v[trajectories.first_rows]
        out["dr"] = lambda counts: _mean(counts, dr)
        out["fqe"] = lambda counts: _mean(counts, v0)
    return out


def estimate_all(
    dataset: Dataset,
    target_probs: np.ndarray,
    behaviour_prob: np.ndarray,
    gamma: float,
    q: np.ndarray | None = None,
    *,
    bootstrap: int = 1000,
    seed: int = 0,
) -> dict[str, Estimate]:
    """Every estimate (DR and FQE only with `q`, the target's Q at each row's obs [N, n_actions]),
    each with its `bootstrap`-resample interval (the same resamples for all: seeded by `seed`)."""
    if np.any(behaviour_prob <= 0) or not np.all(np.isfinite(behaviour_prob)):
        row = int(np.flatnonzero(~(behaviour_prob > 0) | ~np.isfinite(behaviour_prob))[0])
        raise OpeError(f"propensity: row {row} has behaviour probability {behaviour_prob[row]}, not > 0")
    episodes = Trajectories.of(dataset).count
    ones = np.ones((1, episodes))
    out = {}
    for name, estimator in estimators(dataset, target_probs, behaviour_prob, gamma, q).items():
        interval = bootstrap_interval(estimator, episodes, bootstrap, seed)
        low, high = interval if interval is not None else (None, None)
        value = float(estimator(ones)[0])
        out[name] = Estimate(value if np.isfinite(value) else None, low, high)
    return out


def effective_episodes(dataset: Dataset, target_probs: np.ndarray, behaviour_prob: np.ndarray) -> float:
    """Kish's effective sample size of the whole-episode weights, (sum W)^2 / sum W^2: how many
    episodes IPS and WIPS effectively average (few: their estimates rest on those few)."""
    ratio = target_probs[np.arange(len(dataset)), dataset.action] / behaviour_prob
    weights = np.cumprod(Trajectories.of(dataset).pad(ratio, 1.0), axis=1)[:, -1]
    total = float((weights**2).sum())
    return 0.0 if total == 0 else float(weights.sum() ** 2 / total)


def n_actions_of(dataset: Dataset) -> int:
    n = getattr(dataset.action_space, "n", None)
    if n is None or np.asarray(dataset.action).ndim != 1:
        raise OpeError(
            f"off-policy evaluation needs a discrete action space; {dataset.source or 'the dataset'} has "
            f"{dataset.action_space}"
        )
    return int(n)


def _acting(policy, obs: np.ndarray, n_actions: int, epsilon: float) -> np.ndarray:
    """`target_probabilities`, a policy that cannot act on these observations one OpeError line."""
    try:
        return target_probabilities(policy, obs, n_actions, epsilon)
    except OpeError:
        raise
    except (RuntimeError, TypeError, ValueError) as exc:  # torch's shape errors: many lines
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise OpeError(f"the policy cannot act on this dataset's observations ({first})") from None


def evaluate_policy(
    dataset: Dataset,
    policy,
    *,
    gamma: float = 0.99,
    target_epsilon: float = 0.0,
    bootstrap: int = 1000,
    seed: int = 0,
    fqe: FqeOptions | None = DEFAULT_FQE,
    progress: Callable[[int, int], None] | None = None,
) -> dict:
    """The report of `policy` (greedy, obs batch -> actions; made `target_epsilon`-greedy) on
    `dataset`: every estimate with its interval, where pi_b came from, the effective episodes.
    `fqe` None: no FQE, hence no DR either."""
    import torch

    if not 0.0 < gamma <= 1.0:
        raise OpeError(f"--gamma: expected 0 < gamma <= 1, got {gamma}")
    n_actions = n_actions_of(dataset)
    torch.set_num_threads(1)  # small networks: more threads only contend (as `aiorl eval` runs its policy)
    target = _acting(policy, dataset.obs, n_actions, target_epsilon)
    behaviour, source = behaviour_probabilities(dataset, n_actions, seed=seed)
    q = None
    if fqe is not None:
        next_target = _acting(policy, dataset.next_obs, n_actions, target_epsilon)
        q = fitted_q(dataset, next_target, gamma, seed=seed, options=fqe, progress=progress)
    estimates = estimate_all(dataset, target, behaviour, gamma, q, bootstrap=bootstrap, seed=seed)
    return {
        "dataset": dataset.source,
        "rows": len(dataset),
        "episodes": Trajectories.of(dataset).count,
        "gamma": gamma,
        "target_epsilon": target_epsilon,
        "behaviour": source,
        "effective_episodes": round(effective_episodes(dataset, target, behaviour), 2),
        "bootstrap": bootstrap,
        "level": LEVEL,
        "seed": seed,
        "estimates": {name: asdict(e) for name, e in estimates.items()},
    }
