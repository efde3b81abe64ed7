"""Checks every reader runs on the dataset it built (`check_dataset`), so that a bad dataset is
one `DatasetError` line naming the file, the field and the first bad row, whatever its format.
"""

from __future__ import annotations

import numpy as np

from aiorl.offline.dataset import Dataset, DatasetError

ROW_FIELDS = ("obs", "action", "reward", "next_obs", "terminated", "truncated")


def first_bad(mask: np.ndarray) -> int | None:
    """The first row where `mask` (any entry of the row) holds, or None."""
    rows = mask.reshape(len(mask), -1).any(axis=1) if mask.ndim > 1 else mask
    hit = np.flatnonzero(rows)
    return int(hit[0]) if hit.size else None


def _check_lengths(dataset: Dataset, where: str) -> int:
    rows = len(dataset.reward)
    if rows == 0:
        raise DatasetError(f"{where}: field 'reward': the dataset holds no rows")
    fields = ROW_FIELDS + (("propensity",) if dataset.propensity is not None else ())
    for name in fields:
        value = getattr(dataset, name)
        if value is None:
            raise DatasetError(f"{where}: field {name!r} is missing")
        if len(value) != rows:
            raise DatasetError(f"{where}: field {name!r} has {len(value)} rows, 'reward' has {rows} (ragged fields)")
    return rows


def _check_finite(dataset: Dataset, where: str) -> None:
    for name in ("obs", "next_obs", "reward", "action", "propensity"):
        value = getattr(dataset, name)
        if value is None or value.dtype.kind != "f":
            continue
        row = first_bad(~np.isfinite(value))
        if row is not None:
            raise DatasetError(f"{where}: field {name!r} row {row}: {_entry(value[row])} (NaN or inf)")


def _entry(value) -> str:
    return np.array2string(np.asarray(value), precision=4, threshold=8)


def _check_observations(dataset: Dataset, where: str) -> None:
    shape = tuple(getattr(dataset.observation_space, "shape", None) or ())
    for name in ("obs", "next_obs"):
        have = tuple(getattr(dataset, name).shape[1:])
        if have != shape:
            raise DatasetError(
                f"{where}: field {name!r} row 0: shape {list(have)}, the observation space has {list(shape)}"
            )


def _check_actions(dataset: Dataset, where: str) -> None:
    space, action = dataset.action_space, dataset.action
    if hasattr(space, "n"):
        if action.ndim != 1 or action.dtype.kind not in "iu":
            raise DatasetError(
                f"{where}: field 'action' row 0: {action.dtype} of shape {list(action.shape[1:])}, "
                f"Discrete({int(space.n)}) takes one integer per row"
            )
        start = int(getattr(space, "start", 0))
        row = first_bad((action < start) | (action >= start + int(space.n)))
        if row is not None:
            raise DatasetError(
                f"{where}: field 'action' row {row}: {int(action[row])} is outside Discrete({int(space.n)})"
            )
        return
    shape = tuple(space.shape)
    if tuple(action.shape[1:]) != shape:
        raise DatasetError(
            f"{where}: field 'action' row 0: shape {list(action.shape[1:])}, the action space has {list(shape)}"
        )
    # float32 rounding of the bounds is not a violation
    slack = 1e-5 * np.maximum(1.0, np.abs(np.where(np.isfinite(space.high), space.high, 0.0)))
    row = first_bad((action < space.low - slack) | (action > space.high + slack))
    if row is not None:
        raise DatasetError(f"{where}: field 'action' row {row}: {_entry(action[row])} is outside the action space")


def check_dataset(dataset: Dataset) -> Dataset:
    """`dataset` if every field has one row per step, finite numbers, observations of the space's
    shape and actions inside its action space; else DatasetError (one line)."""
    where = dataset.source or "the dataset"
    _check_lengths(dataset, where)
    _check_observations(dataset, where)
    _check_actions(dataset, where)
    _check_finite(dataset, where)
    if dataset.propensity is not None:
        row = first_bad(dataset.propensity <= 0)
        if row is not None:
            raise DatasetError(
                f"{where}: field 'propensity' row {row}: {float(dataset.propensity[row])} (the behaviour's "
                "probability of the action it took must be > 0)"
            )
    return dataset


def check_spaces_match(dataset: Dataset, observation_space, action_space) -> None:
    """DatasetError where the dataset's spaces are not the given env's (shape, kind, size)."""
    where = dataset.source or "the dataset"
    for what, ours, theirs in (
        ("observation", dataset.observation_space, observation_space),
        ("action", dataset.action_space, action_space),
    ):
        if theirs is None:
            continue
        mine, env = space_text(ours), space_text(theirs)
        if mine != env:
            field = "obs" if what == "observation" else "action"
            raise DatasetError(f"{where}: field {field!r}: the dataset's {what} space is {mine}, the env's is {env}")


def space_text(space) -> str:
    if hasattr(space, "n"):
        return f"Discrete({int(space.n)})"
    return f"{type(space).__name__}{tuple(getattr(space, 'shape', None) or ())}"


def finish(dataset: Dataset) -> Dataset:
    """A reader's arrays in the dtypes every consumer takes; the last row ends an episode."""
    dataset.reward = np.asarray(dataset.reward, np.float32)
    dataset.terminated = np.asarray(dataset.terminated, bool)
    dataset.truncated = np.asarray(dataset.truncated, bool).copy()
    if len(dataset.truncated) and not (dataset.terminated[-1] or dataset.truncated[-1]):
        dataset.truncated[-1] = True  # the log stopped, the episode did not end
    if hasattr(dataset.action_space, "n"):
        if dataset.action.dtype.kind in "iu":
            dataset.action = dataset.action.astype(np.int64, copy=False)
    elif dataset.action.dtype.kind == "f":
        dataset.action = dataset.action.astype(np.float32, copy=False)
    if dataset.propensity is not None:
        dataset.propensity = np.asarray(dataset.propensity, np.float64)
    return dataset
