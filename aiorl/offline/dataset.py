"""A dataset of logged transitions (`Dataset`), as every reader returns it and every
consumer (the dataset store, the offline algorithms, off-policy evaluation, `aiorl collect`)
takes it, whatever format it was read from (`aiorl.offline.formats`).

Rows are env steps in episode order: row i is (obs_i, action_i, reward_i, next_obs_i,
terminated_i, truncated_i). An episode ends at a row that is terminated or truncated; the
next row starts the next one. A dataset whose last row ends no episode is read with that row
marked truncated (the log stopped, the episode did not end).

``propensity`` is the behaviour policy's probability of the action it took (Discrete), or
its density at that action (Box), when the log records it; off-policy evaluation uses it
instead of estimating the behaviour policy.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


class DatasetError(ValueError):
    """A dataset that cannot be used: the message is one line naming the file, the field and
    the row (a user's mistake: the CLI prints it and exits 2)."""


@dataclass
class Dataset:
    obs: np.ndarray  # [N, *observation_shape], the observation space's dtype
    action: np.ndarray  # [N] int64 (Discrete) or [N, action_dim] float32 (Box)
    reward: np.ndarray  # [N] float32
    next_obs: np.ndarray  # [N, *observation_shape]
    terminated: np.ndarray  # [N] bool
    truncated: np.ndarray  # [N] bool
    observation_space: object  # gymnasium.spaces.Space
    action_space: object  # gymnasium.spaces.Space
    propensity: np.ndarray | None = None  # [N] float64: behaviour prob (density) of the action taken
    env_id: str | None = None  # the env it was logged on, when known
    source: str = ""  # what it was read from, for messages
    format: str = ""  # "aiorl", "easyrl", "minari", "snapshot"

    def __len__(self) -> int:
        return len(self.reward)

    @property
    def episode_ends(self) -> np.ndarray:
        """Row indices that end an episode (ascending; the last row always is one)."""
        return np.flatnonzero(self.terminated | self.truncated)

    def slice(self, lo: int, hi: int) -> Dataset:
        """Rows [lo, hi) as a dataset of their own (views, not copies)."""
        part = {k: getattr(self, k)[lo:hi] for k in ("obs", "action", "reward", "next_obs", "terminated", "truncated")}
        propensity = None if self.propensity is None else self.propensity[lo:hi]
        return Dataset(
            **part,
            observation_space=self.observation_space,
            action_space=self.action_space,
            propensity=propensity,
            env_id=self.env_id,
            source=self.source,
            format=self.format,
        )


def shard_range(rows: int, shards: int, index: int) -> tuple[int, int]:
    """Rows [lo, hi) of shard `index` of `shards`: contiguous, every row in exactly one shard,
    sizes differing by at most one."""
    if not 0 <= index < shards:
        raise ValueError(f"shard {index} of {shards}")
    base, extra = divmod(rows, shards)
    lo = index * base + min(index, extra)
    return lo, lo + base + (1 if index < extra else 0)
