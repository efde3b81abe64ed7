"""The rows a learner samples from a dataset (`offline_rows`): n-step transitions with the
fields replay rows have, plus what offline algorithms need beside them.

Row t of a dataset becomes the window of m = min(n, steps left in its episode) steps from t:

    reward    = sum_{k<m} gamma^k r_{t+k}
    next_obs  = next_obs_{t+m-1}
    done      = the episode terminated inside the window (a truncation bootstraps, as online)
    discount  = 0 if done else gamma^m
    mc_return = sum_{k>=0} gamma^k r_{t+k} to the episode's end (MARWIL's return; a truncated
                episode's tail is what the log holds)
    row       = t, the dataset's own index (a shard's rows say where they came from)

`OFFLINE_FIELDS` are the names a dataset store can give; an algorithm's transition spec
takes the ones it names.
"""

from __future__ import annotations

import numpy as np

from aiorl.offline.dataset import Dataset

OFFLINE_FIELDS = ("obs", "action", "reward", "next_obs", "done", "discount", "mc_return", "row", "propensity")


def episode_end_of(dataset: Dataset) -> np.ndarray:
    """For each row, the index of the row that ends its episode."""
    ends = dataset.episode_ends
    return ends[np.searchsorted(ends, np.arange(len(dataset)))]


def discounted_returns(reward: np.ndarray, ends_here: np.ndarray, gamma: float) -> np.ndarray:
    """sum_{k>=0} gamma^k r_{t+k} up to and including the next row where `ends_here` holds."""
    out = np.empty(len(reward), np.float64)
    acc = 0.0
    for t in range(len(reward) - 1, -1, -1):
        if ends_here[t]:
            acc = 0.0
        acc = float(reward[t]) + gamma * acc
        out[t] = acc
    return out


def offline_rows(dataset: Dataset, lo: int, hi: int, *, n_step: int, gamma: float) -> dict[str, np.ndarray]:
    """Rows [lo, hi) of `dataset` as n-step rows (windows may read past `hi`, up to their
    episode's end, so that a shard's rows are what the whole dataset's would be)."""
    if n_step < 1:
        raise ValueError(f"n_step must be >= 1, got {n_step}")
    end_of = episode_end_of(dataset)
    t = np.arange(lo, hi)
    m = np.minimum(n_step, end_of[t] - t + 1)
    reward = np.zeros(len(t), np.float64)
    for k in range(n_step):
        inside = k < m
        reward[inside] += gamma**k * dataset.reward[t[inside] + k]
    last = t + m - 1
    done = dataset.terminated[last] & (last == end_of[t])
    discount = np.where(done, 0.0, np.power(gamma, m)).astype(np.float32)
    ends_here = dataset.terminated | dataset.truncated
    stop = int(end_of[hi - 1]) + 1 if hi > lo else lo
    mc = discounted_returns(dataset.reward[lo:stop], ends_here[lo:stop], gamma)[: hi - lo]
    rows = {
        "obs": dataset.obs[lo:hi],
        "action": dataset.action[lo:hi],
        "reward": reward.astype(np.float32),
        "next_obs": dataset.next_obs[last],
        "done": done.astype(bool),
        "discount": discount,
        "mc_return": mc.astype(np.float32),
        "row": t.astype(np.int64),
    }
    if dataset.propensity is not None:
        rows["propensity"] = dataset.propensity[lo:hi].astype(np.float64)
    return rows
