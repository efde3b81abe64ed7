"""Gymnasium construction, seeding and the per-actor vector of environments."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import gymnasium as gym
import numpy as np

from aiorl.config import ConfigError, EnvConfig


@dataclass(frozen=True)
class EnvSpec:
    """What an algorithm needs to know about the environment, read once."""

    id: str
    observation_space: gym.Space
    action_space: gym.Space
    max_episode_steps: int | None


def make_env(env_cfg: EnvConfig) -> gym.Env:
    kwargs = dict(env_cfg.kwargs)
    if env_cfg.max_episode_steps is not None:
        kwargs["max_episode_steps"] = env_cfg.max_episode_steps
    try:
        return gym.make(env_cfg.id, **kwargs)
    except gym.error.Error as exc:
        raise ConfigError(f"env.id: Gymnasium cannot make {env_cfg.id!r}: {exc}") from None
    except TypeError as exc:
        raise ConfigError(f"env.kwargs: {env_cfg.id!r} rejected {kwargs}: {exc}") from None


def env_spec(env_cfg: EnvConfig) -> EnvSpec:
    env = make_env(env_cfg)
    try:
        return EnvSpec(
            id=env_cfg.id,
            observation_space=env.observation_space,
            action_space=env.action_space,
            max_episode_steps=env.spec.max_episode_steps if env.spec else None,
        )
    finally:
        env.close()


class EnvRunner:
    """Steps `num_envs` environments in lockstep and records ``[T, num_envs]`` rollouts.

    An env that ends (terminated or truncated) is reset at once; the
    transition keeps the *final* observation as ``next_obs`` so that a
    truncated step can still bootstrap from it, while ``obs`` of the next
    step is the reset observation.
    """

    def __init__(self, env_cfg: EnvConfig, num_envs: int, seed: int):
        self.envs = [make_env(env_cfg) for _ in range(num_envs)]
        first = [env.reset(seed=seed + i)[0] for i, env in enumerate(self.envs)]
        for i, env in enumerate(self.envs):
            env.action_space.seed(seed + 10_007 * (i + 1))
        self.obs = np.stack(first)
        self.episode_return = np.zeros(num_envs, np.float64)
        self.episode_length = np.zeros(num_envs, np.int64)
        self.finished_returns: list[float] = []
        self.finished_lengths: list[int] = []
        self.env_steps = 0

    def rollout(self, act: Callable[[np.ndarray], np.ndarray], steps: int) -> dict[str, np.ndarray]:
        n = len(self.envs)
        obs_buf = np.empty((steps, n) + self.obs.shape[1:], self.obs.dtype)
        next_buf = np.empty_like(obs_buf)
        rewards = np.empty((steps, n), np.float32)
        terminated = np.empty((steps, n), np.bool_)
        truncated = np.empty((steps, n), np.bool_)
        actions = None
        for t in range(steps):
            obs_buf[t] = self.obs
            action = np.asarray(act(self.obs))
            if actions is None:
                actions = np.empty((steps,) + action.shape, action.dtype)
            actions[t] = action
            for i, env in enumerate(self.envs):
                next_obs, reward, term, trunc, _ = env.step(action[i])
                next_buf[t, i] = next_obs
                rewards[t, i] = reward
                terminated[t, i] = term
                truncated[t, i] = trunc
                self.episode_return[i] += reward
                self.episode_length[i] += 1
                if term or trunc:
                    self.finished_returns.append(float(self.episode_return[i]))
                    self.finished_lengths.append(int(self.episode_length[i]))
                    self.episode_return[i] = 0.0
                    self.episode_length[i] = 0
                    next_obs, _ = env.reset()
                self.obs[i] = next_obs
        self.env_steps += steps * n
        return {
            "obs": obs_buf,
            "action": actions,
            "reward": rewards,
            "next_obs": next_buf,
            "terminated": terminated,
            "truncated": truncated,
        }

    def pop_episodes(self) -> tuple[list[float], list[int]]:
        returns, lengths = self.finished_returns, self.finished_lengths
        self.finished_returns, self.finished_lengths = [], []
        return returns, lengths

    def close(self) -> None:
        for env in self.envs:
            env.close()
