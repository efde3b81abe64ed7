"""Helpers for the Ape-X tests: configs, tiny registered envs, constant networks."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch

from aiorl.experiment.loading import load_config
from aiorl.runtime.algorithm import build_algorithm

IMAGE_ENV = "AiorlTestImage-v0"
DISCRETE_OBS_ENV = "AiorlTestDiscreteObs-v0"


class ImageEnv(gym.Env):
    """uint8 HWC frames, 3 actions, reward 1 for action 1; 20-step episodes."""

    observation_space = gym.spaces.Box(0, 255, (36, 36, 3), np.uint8)
    action_space = gym.spaces.Discrete(3)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self.np_random.integers(0, 256, (36, 36, 3), dtype=np.uint8), {}

    def step(self, action):
        self.t += 1
        obs = self.np_random.integers(0, 256, (36, 36, 3), dtype=np.uint8)
        return obs, float(action == 1), False, self.t >= 20, {}


class DiscreteObsEnv(gym.Env):
    """A 5-state chain with Discrete observations; Box actions are not needed."""

    observation_space = gym.spaces.Discrete(5)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.s = 0
        return self.s, {}

    def step(self, action):
        self.s = min(4, max(0, self.s + (1 if action == 1 else -1)))
        return self.s, float(self.s == 4), self.s == 4, False, {}


def register_test_envs() -> None:
    if IMAGE_ENV not in gym.registry:
        gym.register(IMAGE_ENV, entry_point=ImageEnv)
    if DISCRETE_OBS_ENV not in gym.registry:
        gym.register(DISCRETE_OBS_ENV, entry_point=DiscreteObsEnv)


def make_config(algo: str, env_id: str, model: dict | None = None, **sections):
    data = {
        "algo": algo,
        "env": {"id": env_id},
        "agent": {"batch_size": 8, "buffer_size": 1000, "learning_starts": 10, "sample_batch_size": 8},
        "model": dict(model or {}),
    }
    for key, value in sections.items():
        data.setdefault(key, {}).update(value)
    return load_config(data=data)


def make_algo(algo: str, env_id: str, model: dict | None = None, **sections):
    register_test_envs()
    cfg = make_config(algo, env_id, model, **sections)
    return build_algorithm(cfg)


@torch.no_grad()
def make_constant(linear: torch.nn.Linear, value: float) -> None:
    """An output layer that ignores its input and returns `value` everywhere."""
    linear.weight.zero_()
    linear.bias.fill_(value)


def episode_rollout(rewards, terminated_at=None, truncated_at=None, obs_dim=4, action=None):
    """A one-env rollout [T, 1, ...] with distinct observations obs[t] = t."""
    T = len(rewards)
    obs = np.repeat(np.arange(T, dtype=np.float32)[:, None, None], obs_dim, axis=2)
    rollout = {
        "obs": obs,
        "action": np.zeros((T, 1), np.int64) if action is None else action,
        "reward": np.asarray(rewards, np.float32).reshape(T, 1),
        "next_obs": obs + 1,
        "terminated": np.zeros((T, 1), bool),
        "truncated": np.zeros((T, 1), bool),
    }
    if terminated_at is not None:
        rollout["terminated"][terminated_at, 0] = True
    if truncated_at is not None:
        rollout["truncated"][truncated_at, 0] = True
    return rollout


def replay_batch(rows: dict[str, np.ndarray], weights=None) -> dict[str, np.ndarray]:
    """Rows as a learner receives them: + indices, IS weights, generations; read-only like wire views."""
    n = len(rows["reward"])
    batch = {
        **rows,
        "indices": np.arange(n, dtype=np.int64),
        "weights": np.ones(n, np.float32) if weights is None else np.asarray(weights, np.float32),
        "generations": np.ones(n, np.uint64),
    }
    for value in batch.values():
        value.flags.writeable = False
    return batch


def build_example(cfg):
    """The algorithm of an example's config, built for its env's spaces: an offline example's
    dataset is one its comment says how to collect, not a file the tests have."""
    from aiorl.envs import env_spec

    if cfg.offline.dataset is not None and cfg.env.id is not None:
        return cfg.algorithm(cfg, env_spec(cfg.env))
    return build_algorithm(cfg)
