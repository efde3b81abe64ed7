"""Replay snapshots of Ape-X runs (``RUN_DIR/replay-memory-<i>.npz``, `aiorl.runtime.snapshot`)
read as a dataset, as far as they can be: a snapshot file, or a run directory (every memory
host's snapshot, in memory-host order).

A snapshot holds the replay's rows in slot order, each an n-step transition (obs, action, the
n-step discounted reward, the observation n steps on, done, discount): no episode order, no
single-step rewards, no propensities. Each row is read as an episode of its own (terminated when
done, else truncated), so n-step windows and Monte Carlo returns over it are the row's own. The
spaces are the run's env's when its config.yaml names one that can be made here, else inferred
from the rows (Discrete(max action + 1) for integer actions).
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import numpy as np

from aiorl.config import EnvConfig
from aiorl.offline.dataset import Dataset, DatasetError
from aiorl.offline.formats.checks import finish

SNAPSHOT_FORMAT = "aiorl.replay"
GLOB = "replay-memory-*.npz"


def snapshot_files(path: Path) -> list[Path]:
    if path.is_dir():
        return sorted(path.glob(GLOB), key=lambda p: (len(p.name), p.name))
    return [path]


def is_snapshot(path: Path) -> bool:
    if path.is_dir():
        return bool(snapshot_files(path)) and not (path / "dataset.json").exists()
    return path.suffix == ".npz"


def _read_one(path: Path) -> dict[str, np.ndarray]:
    try:
        with np.load(path, allow_pickle=False) as z:
            state = {k: z[k] for k in z.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
        raise DatasetError(f"{path}: not a readable replay snapshot ({type(exc).__name__}: {exc})") from None
    try:
        meta = json.loads(bytes(state["meta"]).decode())
    except (KeyError, ValueError, TypeError):
        raise DatasetError(f"{path}: field 'meta': missing or not JSON (not an aiorl replay snapshot)") from None
    if not isinstance(meta, dict) or meta.get("format") != SNAPSHOT_FORMAT:
        raise DatasetError(f"{path}: field 'meta': not an aiorl replay snapshot (format {SNAPSHOT_FORMAT!r})")
    fields = {k[len("field.") :]: v for k, v in state.items() if k.startswith("field.")}
    for name in ("obs", "action", "reward", "next_obs", "done"):
        if name not in fields:
            raise DatasetError(
                f"{path}: field {name!r} is missing (a snapshot of observation frames, or not of an Ape-X run)"
            )
    return fields


def _run_spaces(run_dir: Path):
    """The run's env's spaces from its config.yaml, or (None, None)."""
    try:
        import yaml

        from aiorl.envs import env_spec

        env = (yaml.safe_load((run_dir / "config.yaml").read_text()) or {}).get("env") or {}
        if not env.get("id"):
            return None, None, None
        cfg = EnvConfig(id=env["id"], kwargs=env.get("kwargs") or {}, wrappers=env.get("wrappers") or [])
        spec = env_spec(cfg)
        return spec.observation_space, spec.action_space, env["id"]
    except Exception:  # no config, an env not installed here: the spaces are inferred instead
        return None, None, None


def _inferred(arrays: dict[str, np.ndarray]):
    import gymnasium as gym

    obs = arrays["obs"]
    observation_space = gym.spaces.Box(-np.inf, np.inf, shape=obs.shape[1:], dtype=obs.dtype)
    action = arrays["action"]
    if action.dtype.kind in "iu":
        return observation_space, gym.spaces.Discrete(max(int(action.max()) + 1, 1))
    return observation_space, gym.spaces.Box(action.min(axis=0), action.max(axis=0), dtype=action.dtype)


def read_snapshot(path: Path, observation_space=None, action_space=None) -> Dataset:
    files = snapshot_files(path)
    if not files:
        raise DatasetError(f"{path}: no replay snapshots ({GLOB}) in this directory")
    parts = [_read_one(f) for f in files]
    arrays = {k: np.concatenate([p[k] for p in parts]) for k in ("obs", "action", "reward", "next_obs", "done")}
    if len(arrays["reward"]) == 0:
        raise DatasetError(f"{path}: field 'reward': the snapshot holds no rows")
    env_id = None
    if observation_space is None or action_space is None:
        run_dir = path if path.is_dir() else path.parent
        obs_space, act_space, env_id = _run_spaces(run_dir)
        if obs_space is None:
            obs_space, act_space = _inferred(arrays)
        observation_space = observation_space or obs_space
        action_space = action_space or act_space
    done = arrays["done"].astype(bool)
    return finish(
        Dataset(
            obs=arrays["obs"],
            action=arrays["action"],
            reward=arrays["reward"],
            next_obs=arrays["next_obs"],
            terminated=done,
            truncated=~done,
            observation_space=observation_space,
            action_space=action_space,
            env_id=env_id,
            source=str(path),
            format="snapshot",
        )
    )
