"""EasyRL's offline format, as its BCQ demo reads it (``demo/run_bcq_on_batchdata.py``,
``offline_env.parse_tuple_data``) and its CartPole log (``demo/train_catpole.offline_data``) is
written: one transition a line,

    obs \\t action \\t reward \\t done \\t next_obs

vectors comma-separated, ``done`` 0 or 1 (an ended episode: EasyRL does not tell a time limit
from a terminal state, so ``done`` is read as terminated). The spaces are the env's when given;
else inferred: observations Box(-inf, inf) of the vectors' length, actions Discrete(max + 1) when
every action is an integer, else a Box of the vectors' length bounded by the smallest and
largest value logged.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from aiorl.offline.dataset import Dataset, DatasetError
from aiorl.offline.formats.checks import finish

COLUMNS = ("obs", "action", "reward", "done", "next_obs")
MAX_LINE_BYTES = 1 << 20


def looks_like_easyrl(path: Path) -> bool:
    """A text file whose first line has EasyRL's five tab-separated columns."""
    try:
        with open(path, "rb") as f:
            head = f.readline(MAX_LINE_BYTES)
    except OSError:
        return False
    try:
        line = head.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return line.rstrip("\r\n").count("\t") == len(COLUMNS) - 1


def _numbers(text: str, where: str, field: str) -> list[float]:
    try:
        return [float(v) for v in text.split(",")]
    except ValueError:
        raise DatasetError(f"{where}: field {field!r}: {text[:40]!r} is not comma-separated numbers") from None


def _parse(path: Path) -> tuple[list, list, list, list, list, bool]:
    obs, action, reward, done, next_obs = [], [], [], [], []
    integer_actions = True
    with open(path, encoding="utf-8", errors="strict") as f:
        try:
            lines = f.read().splitlines()
        except UnicodeDecodeError as exc:
            raise DatasetError(f"{path}: not a text file of EasyRL transitions ({exc.reason})") from None
    for row, line in enumerate(lines):
        if not line.strip():
            continue
        where = f"{path} row {row} (line {row + 1})"
        parts = line.strip().split("\t")
        if len(parts) != len(COLUMNS):
            field = COLUMNS[min(len(parts), len(COLUMNS) - 1)]
            raise DatasetError(
                f"{where}: field {field!r}: {len(parts)} tab-separated columns, EasyRL's format has "
                f"{len(COLUMNS)} ({' '.join(COLUMNS)})"
            )
        obs.append(_numbers(parts[0], where, "obs"))
        a = _numbers(parts[1], where, "action")
        integer_actions = integer_actions and len(a) == 1 and "." not in parts[1] and "e" not in parts[1].lower()
        action.append(a)
        r = _numbers(parts[2], where, "reward")
        if len(r) != 1:
            raise DatasetError(f"{where}: field 'reward': {len(r)} values, one number expected")
        reward.append(r[0])
        d = parts[3].strip()
        if d not in ("0", "1", "0.0", "1.0", "True", "False", "true", "false"):
            raise DatasetError(f"{where}: field 'done': {d[:20]!r}, 0 or 1 expected")
        done.append(d in ("1", "1.0", "True", "true"))
        next_obs.append(_numbers(parts[4], where, "next_obs"))
    return obs, action, reward, done, next_obs, integer_actions


def _stack(values: list[list[float]], path: Path, field: str) -> np.ndarray:
    width = len(values[0])
    for row, v in enumerate(values):
        if len(v) != width:
            raise DatasetError(
                f"{path} row {row} (line {row + 1}): field {field!r}: {len(v)} values, row 0 has {width} (ragged)"
            )
    return np.asarray(values, np.float64)


def read_easyrl(path: Path, observation_space=None, action_space=None) -> Dataset:
    import gymnasium as gym

    obs, action, reward, done, next_obs, integer_actions = _parse(path)
    if not reward:
        raise DatasetError(f"{path}: field 'obs': no transitions (an empty file)")
    obs_a, next_a = _stack(obs, path, "obs"), _stack(next_obs, path, "next_obs")
    if obs_a.shape[1] != next_a.shape[1]:
        raise DatasetError(
            f"{path} row 0 (line 1): field 'next_obs': {next_a.shape[1]} values, obs has {obs_a.shape[1]}"
        )
    act = _stack(action, path, "action")
    discrete = hasattr(action_space, "n") if action_space is not None else integer_actions
    if discrete:
        act = act[:, 0].astype(np.int64) if integer_actions else act[:, 0]
    if observation_space is None:
        observation_space = gym.spaces.Box(-np.inf, np.inf, shape=(obs_a.shape[1],), dtype=np.float32)
    if action_space is None:
        if discrete:
            action_space = gym.spaces.Discrete(int(act.max()) + 1 if act.max() >= 0 else 1)
        else:
            low, high = act.min(axis=0), act.max(axis=0)
            action_space = gym.spaces.Box(low.astype(np.float32), high.astype(np.float32), dtype=np.float32)
    dtype = np.dtype(getattr(observation_space, "dtype", None) or np.float32)
    return finish(
        Dataset(
            obs=obs_a.astype(dtype),
            action=act,
            reward=np.asarray(reward, np.float32),
            next_obs=next_a.astype(dtype),
            terminated=np.asarray(done, bool),
            truncated=np.zeros(len(done), bool),
            observation_space=observation_space,
            action_space=action_space,
            source=str(path),
            format="easyrl",
        )
    )


def write_easyrl(dataset: Dataset, path: Path) -> Path:
    """`dataset` as EasyRL's lines (propensities and the terminated/truncated split are lost)."""

    def vec(v) -> str:
        return ",".join(repr(float(x)) for x in np.ravel(v))

    discrete = hasattr(dataset.action_space, "n")
    with open(path, "w") as f:
        for i in range(len(dataset)):
            a = str(int(dataset.action[i])) if discrete else vec(dataset.action[i])
            done = int(bool(dataset.terminated[i] or dataset.truncated[i]))
            f.write(f"{vec(dataset.obs[i])}\t{a}\t{float(dataset.reward[i])!r}\t{done}\t{vec(dataset.next_obs[i])}\n")
    return path
