"""Environments: `gymnasium.make` of an id (`aiorl.envs.gym`), the Atari preset
(`aiorl.envs.atari`), `env.wrappers` (`aiorl.envs.wrappers`), the configured env
(`aiorl.envs.make`), an actor's vector of envs (`aiorl.envs.vector`) and the config-time
checks of the env section (`aiorl.envs.checks`).

The names below are imported on first use (PEP 562): loading a config imports the package
for its checks, which need gymnasium only for wrappers and Atari.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from aiorl.envs.make import EnvSpec, env_spec, make_env
    from aiorl.envs.vector import EnvRunner

__all__ = ["EnvRunner", "EnvSpec", "env_spec", "make_env"]


def __getattr__(name: str):
    if name == "EnvRunner":
        from aiorl.envs.vector import EnvRunner

        return EnvRunner
    if name in ("EnvSpec", "env_spec", "make_env"):
        from aiorl.envs.make import EnvSpec, env_spec, make_env

        return {"EnvSpec": EnvSpec, "env_spec": env_spec, "make_env": make_env}[name]
    raise AttributeError(f"module 'aiorl.envs' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
