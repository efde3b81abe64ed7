"""Bootstrap confidence intervals over episodes: an estimate recomputed on datasets of the same
number of episodes drawn with replacement from the dataset's, and the interval between the
percentiles that leave (1 - level) / 2 out on each side (Efron's percentile interval).

Episodes, not rows, are resampled: an episode's steps share its weight, so rows are not
independent draws. The resamples come from `numpy.random.default_rng(seed)`: one seed, one
interval.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

LEVEL = 0.95
_CHUNK = 256  # resamples per matrix product: [chunk, episodes] counts at a time


def resample_counts(rng: np.random.Generator, episodes: int, resamples: int) -> np.ndarray:
    """[resamples, episodes]: how often each episode is drawn in each resample."""
    return rng.multinomial(episodes, np.full(episodes, 1.0 / episodes), size=resamples).astype(np.float64)


def bootstrap_interval(
    estimator: Callable[[np.ndarray], np.ndarray],
    episodes: int,
    resamples: int,
    seed: int,
    level: float = LEVEL,
) -> tuple[float, float] | None:
    """The percentile interval of `estimator` (episode counts [B, E] -> estimates [B]) over
    `resamples` resamples of `episodes` episodes; None with no resamples."""
    if resamples <= 0 or episodes == 0:
        return None
    rng = np.random.default_rng(seed)
    values = []
    for start in range(0, resamples, _CHUNK):
        values.append(estimator(resample_counts(rng, episodes, min(_CHUNK, resamples - start))))
    values = np.concatenate(values)
    values = values[np.isfinite(values)]
    if len(values) == 0:
        return None
    tail = 100 * (1 - level) / 2
    lo, hi = np.percentile(values, [tail, 100 - tail])
    return float(lo), float(hi)
