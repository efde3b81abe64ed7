"""A dataset's episodes as a padded table (`Trajectories`): what every estimator sums over.

Row ``rows[e, t]`` is the dataset row of step t of episode e (-1 past the episode's end), so a
per-row array becomes an [episodes, steps] table with `pad` and an estimator is a few
vectorised sums, resampled over episodes by the bootstrap (`aiorl.ope.bootstrap`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from aiorl.offline.dataset import Dataset


@dataclass(frozen=True)
class Trajectories:
    rows: np.ndarray  # [E, T] int64: dataset row of step t of episode e, -1 past its end

    @classmethod
    def of(cls, dataset: Dataset) -> Trajectories:
        """The dataset's episodes: each ends at a terminated or truncated row (the last row always does)."""
        ends = dataset.episode_ends
        if len(dataset) and (len(ends) == 0 or ends[-1] != len(dataset) - 1):
            ends = np.append(ends, len(dataset) - 1)  # a log that stops mid-episode (a slice of one)
        starts = np.concatenate([[0], ends[:-1] + 1])
        lengths = ends - starts + 1
        steps = np.arange(int(lengths.max()) if len(lengths) else 0)
        rows = starts[:, None] + steps[None, :]
        return cls(np.where(steps[None, :] < lengths[:, None], rows, -1).astype(np.int64))

    @property
    def mask(self) -> np.ndarray:
        """[E, T] bool: step t is in episode e."""
        return self.rows >= 0

    @property
    def count(self) -> int:
        return self.rows.shape[0]

    @property
    def first_rows(self) -> np.ndarray:
        """[E]: each episode's first row."""
        return self.rows[:, 0]

    def pad(self, values: np.ndarray, fill: float) -> np.ndarray:
        """[E, T, ...] of a per-row array, `fill` past each episode's end."""
        values = np.asarray(values, np.float64)
        out = values[np.maximum(self.rows, 0)]
        out[~self.mask] = fill
        return out

    def discounts(self, gamma: float) -> np.ndarray:
        """[T]: gamma^t."""
        return np.power(gamma, np.arange(self.rows.shape[1], dtype=np.float64))
