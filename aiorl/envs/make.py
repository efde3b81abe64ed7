"""The configured env (preset, then `env.wrappers`), and its spec read once."""

from __future__ import annotations

from dataclasses import dataclass

import gymnasium as gym

from aiorl.config import ConfigError, EnvConfig
from aiorl.envs import atari
from aiorl.envs.gym import gym_make
from aiorl.envs.wrappers import apply_wrappers


@dataclass(frozen=True)
class EnvSpec:
    """What an algorithm needs to know about the environment, read once."""

    id: str
    observation_space: gym.Space
    action_space: gym.Space
    max_episode_steps: int | None


def make_env(env_cfg: EnvConfig, evaluation: bool = False) -> gym.Env:
    """The configured env (preset, then env.wrappers); `evaluation`: the preset's
    evaluation variant (for the Atari preset: full games, raw rewards)."""
    if env_cfg.id is None:  # an offline run may have none (aiorl.config.checks)
        raise ConfigError("env.id: null (an offline run without an env): no env to run episodes in; set env.id")
    if env_cfg.preset == "atari":
        env = atari.make_env(env_cfg, evaluation)
    else:
        if env_cfg.id.startswith("ALE/"):
            atari.require_ale()  # registers the ALE/ ids
        kwargs = dict(env_cfg.kwargs)
        if env_cfg.max_episode_steps is not None:
            kwargs["max_episode_steps"] = env_cfg.max_episode_steps
        env = gym_make(env_cfg.id, kwargs)
    return apply_wrappers(env, env_cfg.wrappers)


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
