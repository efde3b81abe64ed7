"""Environments: `gymnasium.make` of an id (`aiorl.envs.gym`), the Atari preset
(`aiorl.envs.atari`), `env.wrappers` (`aiorl.envs.wrappers`), the configured env
(`aiorl.envs.make`) and an actor's vector of envs (`aiorl.envs.vector`)."""

from aiorl.envs.make import EnvSpec, env_spec, make_env
from aiorl.envs.vector import EnvRunner

__all__ = ["EnvRunner", "EnvSpec", "env_spec", "make_env"]
