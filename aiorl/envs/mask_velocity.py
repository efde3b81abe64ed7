"""`mask_velocity`: an env made partially observable by removing the velocity entries of
its observation, as RL Zoo's ``CartPoleNoVel-v1`` (a task a policy needs memory for).

RL Zoo's ``MaskVelocityWrapper`` zeroes the entries; this wrapper removes them, so
CartPole's observation becomes ``(x, theta)``. The entries are known per env (the
env id without its version); any other env is a config error, raised when the config
loads (`check_mask_velocity`), before any process starts.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np

from aiorl.config import ConfigError

#: Observation entries kept, per env id without its ``-vN``: the velocities are left out.
KEPT = {
    "CartPole": (0, 2),  # x, x_dot, theta, theta_dot -> x, theta
    "Pendulum": (0, 1),  # cos, sin, theta_dot -> cos, sin
    "MountainCar": (0,),  # position, velocity -> position
    "MountainCarContinuous": (0,),
    "LunarLander": (0, 1, 4, 6, 7),  # x, y, vx, vy, angle, angular velocity, legs -> x, y, angle, legs
    "LunarLanderContinuous": (0, 1, 4, 6, 7),
}

NAME = "mask_velocity"


def kept_entries(env_id: str, where: str = f"env.wrappers.{NAME}") -> tuple[int, ...]:
    """The observation entries `mask_velocity` keeps for `env_id`; ConfigError for an env it does not know."""
    base = env_id.rsplit("/", 1)[-1].split("-v")[0]
    if base not in KEPT:
        raise ConfigError(f"{where}: knows the velocity entries of {', '.join(sorted(KEPT))}, not of env {env_id!r}")
    return KEPT[base]


def check_mask_velocity(env_id: str, names: list[str], key: str = "env.wrappers") -> None:
    """Config-time check: `mask_velocity` only on an env whose velocities it knows."""
    for i, name in enumerate(names):
        if name == NAME:
            kept_entries(env_id, f"{key}[{i}].{NAME}")


class MaskVelocity(gym.ObservationWrapper):
    """The observation without its velocity entries (see `KEPT`)."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        env_id = env.spec.id if env.spec is not None else type(env.unwrapped).__name__
        self.kept = np.asarray(kept_entries(env_id), np.int64)
        space = env.observation_space
        if not (isinstance(space, gym.spaces.Box) and len(space.shape) == 1):
            raise ConfigError(f"env.wrappers.{NAME}: needs a vector Box observation, the env has {space}")
        self.observation_space = gym.spaces.Box(space.low[self.kept], space.high[self.kept], dtype=space.dtype)

    def observation(self, observation):
        return np.asarray(observation)[self.kept]
