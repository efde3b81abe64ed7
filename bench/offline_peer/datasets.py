"""The datasets of `bench/offline.py`: an aiorl `Dataset` written as the plain .npz that d3rlpy's
worker (`d3rlpy_worker.py`) reads, and small hand-made datasets (a fixed heuristic policy with
random actions mixed in) that test the bench without `aiorl collect`'s behaviour policies."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from aiorl.offline.dataset import Dataset


def export_npz(dataset: Dataset, path: str | Path) -> Path:
    """`dataset` as d3rlpy's MDPDataset arrays: observations, actions, rewards, terminals, timeouts
    (an episode's end that is no termination), action_size, and a Box space's action_low/high.
    d3rlpy takes each next observation from the row after (an episode's last row, when truncated,
    gives no transition there): the same rows, the same episodes."""
    space = dataset.action_space
    discrete = hasattr(space, "n")
    arrays = {
        "observations": np.asarray(dataset.obs, dtype=np.float32),
        "actions": np.asarray(dataset.action, dtype=np.int64 if discrete else np.float32),
        "rewards": np.asarray(dataset.reward, dtype=np.float32),
        "terminals": np.asarray(dataset.terminated, dtype=bool),
        "timeouts": np.asarray(dataset.truncated & ~dataset.terminated, dtype=bool),
        "action_size": np.asarray(int(space.n) if discrete else int(np.prod(space.shape))),
    }
    if not discrete:
        arrays["action_low"] = np.asarray(space.low, dtype=np.float32)
        arrays["action_high"] = np.asarray(space.high, dtype=np.float32)
    path = Path(path)
    np.savez(path, **arrays)
    return path


# ---------------------------------------------------------------------------------------------- hand-made


def cartpole_heuristic(obs: np.ndarray) -> int:
    """Push toward where the pole falls: balances CartPole-v1 for about 200 steps, then the cart drifts out."""
    return int(obs[2] + 0.3 * obs[3] > 0)


def pendulum_heuristic(obs: np.ndarray) -> np.ndarray:
    """Pump energy until near the top, then a PD hold (Pendulum-v1: theta 0 is upright)."""
    cos, sin, velocity = obs
    theta = np.arctan2(sin, cos)
    if cos > 0.85:
        return np.clip([-(8.0 * theta + 1.5 * velocity)], -2.0, 2.0)
    energy = 0.5 * velocity**2 + 10.0 * (cos - 1.0)  # 0 at rest upright
    return np.clip([-2.0 * np.sign(velocity * energy) if velocity else 2.0], -2.0, 2.0)


def heuristic_dataset(env_id: str, rows: int, epsilon: float = 0.3, noise: float = 0.5, seed: int = 0) -> Dataset:
    """`rows` steps of `env_id` (CartPole-v1 or Pendulum-v1) under its heuristic: on CartPole a random
    action with probability `epsilon`, on Pendulum Gaussian noise of scale `noise`; the log ends
    with a truncated row where the rows ran out."""
    import gymnasium as gym

    env = gym.make(env_id)
    rng = np.random.default_rng(seed)
    discrete = hasattr(env.action_space, "n")
    fields: dict[str, list] = {k: [] for k in ("obs", "action", "reward", "next_obs", "terminated", "truncated")}
    obs, _ = env.reset(seed=seed)
    for _ in range(rows):
        if discrete:
            action = int(rng.integers(env.action_space.n)) if rng.random() < epsilon else cartpole_heuristic(obs)
        else:
            action = np.clip(pendulum_heuristic(obs) + noise * rng.normal(size=1), -2.0, 2.0).astype(np.float32)
        next_obs, reward, terminated, truncated, _ = env.step(action)
        for key, value in zip(fields, (obs, action, reward, next_obs, terminated, truncated)):
            fields[key].append(value)
        obs = next_obs
        if terminated or truncated:
            obs, _ = env.reset()
    fields["truncated"][-1] = True
    return Dataset(
        obs=np.asarray(fields["obs"], dtype=np.float32),
        action=np.asarray(fields["action"], dtype=np.int64 if discrete else np.float32),
        reward=np.asarray(fields["reward"], dtype=np.float32),
        next_obs=np.asarray(fields["next_obs"], dtype=np.float32),
        terminated=np.asarray(fields["terminated"], dtype=bool),
        truncated=np.asarray(fields["truncated"], dtype=bool),
        observation_space=env.observation_space,
        action_space=env.action_space,
        env_id=env_id,
        source=f"heuristic {env_id}",
        format="aiorl",
    )
