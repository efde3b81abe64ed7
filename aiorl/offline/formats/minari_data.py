"""Minari datasets (the Farama standard), read and written with the `minari` package (the
``aiorl[offline]`` extra): a local dataset by its id in the Minari root (``MINARI_DATASETS_PATH``,
else ``~/.minari/datasets``) or by path (the dataset's directory or its ``data`` directory).
Nothing is downloaded.

Episodes are concatenated in Minari's episode order: step t of an episode is row (obs_t,
action_t, reward_t, obs_{t+1}, terminated_t, truncated_t). A dataset written by `aiorl collect
--format minari` keeps each step's propensity in the episode's ``infos["propensity"]``.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np

from aiorl.offline.dataset import Dataset, DatasetError
from aiorl.offline.formats.checks import finish

EXTRA = "aiorl[offline]"
ID_RE = re.compile(r"^(?:[\w:.-]+/)*[\w:.-]+-v\d+$")


def require_minari():
    try:
        import minari
    except ImportError:
        raise DatasetError(f"Minari datasets need the minari package: pip install '{EXTRA}'") from None
    return minari


def minari_root() -> Path:
    return Path(os.environ.get("MINARI_DATASETS_PATH") or Path.home() / ".minari" / "datasets")


def data_dir_of(source: str) -> Path | None:
    """The ``data`` directory of a Minari dataset named by path or id, or None."""
    path = Path(source)
    for candidate in (path, path / "data"):
        if (candidate / "metadata.json").is_file():
            return candidate
    if ID_RE.match(source) and not path.is_absolute():
        data = minari_root() / source / "data"
        if (data / "metadata.json").is_file():
            return data
    return None


def _episode_rows(ep, where: str) -> dict[str, np.ndarray]:
    obs = np.asarray(ep.observations)
    if not isinstance(ep.observations, np.ndarray):
        raise DatasetError(f"{where}: field 'obs': only Box observations are read (not dict or tuple spaces)")
    steps = len(ep.rewards)
    if len(obs) != steps + 1:
        raise DatasetError(f"{where}: field 'obs': {len(obs)} observations for {steps} steps ({steps + 1} expected)")
    rows = {
        "obs": obs[:-1],
        "next_obs": obs[1:],
        "action": np.asarray(ep.actions),
        "reward": np.asarray(ep.rewards, np.float32),
        "terminated": np.asarray(ep.terminations, bool),
        "truncated": np.asarray(ep.truncations, bool),
    }
    infos = getattr(ep, "infos", None) or {}
    if isinstance(infos, dict) and "propensity" in infos:
        rows["propensity"] = np.asarray(infos["propensity"], np.float64).reshape(-1)[:steps]
    return rows


def read_minari(source: str) -> Dataset:
    data = data_dir_of(source)
    if data is None:
        raise DatasetError(f"{source}: not a Minari dataset path, nor an id in the Minari root {minari_root()}")
    minari = require_minari()
    try:
        md = minari.MinariDataset(str(data))
        parts = [_episode_rows(ep, f"{source} episode {ep.id}") for ep in md.iterate_episodes()]
    except DatasetError:
        raise
    except Exception as exc:  # h5py and minari say what is wrong in their own words
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise DatasetError(f"{source}: not a readable Minari dataset ({type(exc).__name__}: {first})") from None
    if not parts:
        raise DatasetError(f"{source}: field 'obs': the Minari dataset holds no episodes")
    arrays = {name: np.concatenate([p[name] for p in parts]) for name in parts[0] if name != "propensity"}
    propensity = np.concatenate([p["propensity"] for p in parts]) if all("propensity" in p for p in parts) else None
    spec = md.spec
    env_spec = getattr(spec, "env_spec", None)
    return finish(
        Dataset(
            **arrays,
            observation_space=spec.observation_space,
            action_space=spec.action_space,
            propensity=propensity,
            env_id=getattr(env_spec, "id", None),
            source=str(source),
            format="minari",
        )
    )


def write_minari(dataset: Dataset, directory: Path) -> Path:
    """`dataset` as a Minari dataset in `directory` (its ``data`` directory inside), named after the
    directory: with `directory` in the Minari root, ``minari.load_dataset(directory.name)`` opens it.
    The name must be a Minari id (``NAME-vN``)."""
    minari = require_minari()
    from minari.dataset.minari_storage import MinariStorage

    if not ID_RE.match(directory.name):
        raise DatasetError(f"{directory}: a Minari dataset's directory is named as its id, NAME-vN (e.g. cartpole-v0)")
    directory.mkdir(parents=True, exist_ok=True)
    env_spec = None
    if dataset.env_id:
        import gymnasium as gym

        try:
            env_spec = gym.spec(dataset.env_id)
        except gym.error.Error:
            env_spec = None
    storage = MinariStorage.new(
        directory / "data",
        observation_space=dataset.observation_space,
        action_space=dataset.action_space,
        env_spec=env_spec,
    )
    storage.update_metadata(
        {
            "dataset_id": directory.name,
            "algorithm_name": "aiorl collect",
            "minari_version": minari.__version__,
            "author": {"aiorl"},
        }
    )
    storage.update_episodes(list(_buffers(dataset)))
    return directory


def _buffers(dataset: Dataset):
    from minari.data_collector.episode_buffer import EpisodeBuffer

    start = 0
    for k, end in enumerate(dataset.episode_ends):
        sl = slice(start, int(end) + 1)
        obs = np.concatenate([dataset.obs[sl], dataset.next_obs[int(end)][None]])
        infos = {} if dataset.propensity is None else {"propensity": np.append(dataset.propensity[sl], np.nan)}
        yield EpisodeBuffer(
            id=k,
            observations=obs,
            actions=dataset.action[sl],
            rewards=dataset.reward[sl],
            terminations=dataset.terminated[sl],
            truncations=dataset.truncated[sl],
            infos=infos,
        )
        start = int(end) + 1
