"""`gymnasium.make` for an env id: a registered one, or a `module:Name` of the user's, with what
Gymnasium refuses turned into a config error naming the key."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import gymnasium as gym

from aiorl.config import ConfigError
from aiorl.core.suggest import did_you_mean


def gym_make(env_id: str, kwargs: dict) -> gym.Env:
    """`gym.make`, with what it refuses turned into a config error naming the key."""
    try:
        if ":" not in env_id:
            return gym.make(env_id, **kwargs)
        with working_directory_on_path():  # the user's module may import its neighbours as it makes the env
            return gym.make(custom_env(env_id), **kwargs)
    except gym.error.Error as exc:
        raise ConfigError(f"env.id: Gymnasium cannot make {env_id!r}: {exc}") from None
    except TypeError as exc:
        raise ConfigError(f"env.kwargs: {env_id!r} rejected {kwargs}: {exc}") from None


def custom_env(env_id: str) -> str | gym.envs.registration.EnvSpec:
    """A ``module:Name`` env id, its module imported: the id itself when the module registers
    ``Name`` with Gymnasium, else a spec whose entry point is ``module.Name`` (an Env class or
    a function returning an env).

    The module is looked up on sys.path and in the current directory, which is appended after
    every installed package while the module is imported (`working_directory_on_path`): it can
    add the user's module, never shadow a package (role processes start with ``-P`` and inherit
    the launcher's directory).
    """
    import importlib

    module_name, _, name = env_id.partition(":")
    if not module_name or not name:
        raise ConfigError(f"env.id: {env_id!r}: expected 'module:EnvId' or 'module:EnvClass'")
    cwd = os.getcwd()
    try:
        with working_directory_on_path():
            module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(
            f"env.id: cannot import module {module_name!r} of {env_id!r} ({exc}); it is looked "
            f"up in the current directory ({cwd}) and on sys.path"
        ) from None
    except Exception as exc:  # the user's module failed while importing: say where, in one line
        raise ConfigError(
            f"env.id: importing module {module_name!r} of {env_id!r} failed: {type(exc).__name__}: {exc}"
        ) from None
    entry = getattr(module, name, None)
    if name in gym.registry:
        return env_id
    if not callable(entry):
        # Gymnasium's own hint knows only registered ids; a user who wrote module:Name may as
        # well have meant one of the module's classes or functions.
        own = [k for k, v in vars(module).items() if callable(v) and not k.startswith("_")]
        hint = did_you_mean(name, own + list(gym.registry), prefix=f"{module_name}:")
        raise ConfigError(
            f"env.id: module {module_name!r} has no env class or function {name!r} and registers no env "
            f"id {name!r}{hint}"
        )
    return gym.envs.registration.EnvSpec(id=name, entry_point=entry)


@contextmanager
def working_directory_on_path() -> Iterator[None]:
    """The current directory at the end of sys.path for the block, and off it again after.

    Left there, any later import of a module the process has not loaded yet (torch's triton,
    gmpy2, tabulate...) would run a file of that name planted in the run's working directory,
    in learner 0, the evaluation worker and `aiorl eval`."""
    cwd = os.getcwd()
    added = cwd not in sys.path and "" not in sys.path
    if added:
        sys.path.append(cwd)
    try:
        yield
    finally:
        if added and cwd in sys.path:
            sys.path.remove(cwd)
