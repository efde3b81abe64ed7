"""The algorithm registry. Each algorithm is two modules under `aiorl.algos`:

- ``<name>_config`` exposes ``SETTINGS``, its `AlgorithmSettings`: the model section's
  dataclass, the `agent` defaults and the checks, in a module that imports no torch, so
  that loading a config (and every `aiorl config` command) stays fast;
- ``<name>`` exposes ``ALGORITHM``, the `Algorithm` built on those settings (torch).

Shared pieces live in `aiorl.algos.lib`. Listing the names imports neither; `get_settings`
imports an algorithm's config side only, `get_algorithm` the whole algorithm.
"""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil

from aiorl.config import ConfigError
from aiorl.core.suggest import did_you_mean
from aiorl.runtime.algorithm import Algorithm, AlgorithmSettings

CONFIG_SUFFIX = "_config"


def available_algorithms() -> list[str]:
    return sorted(
        m.name.removesuffix(CONFIG_SUFFIX)
        for m in pkgutil.iter_modules(__path__)
        if not m.ispkg and not m.name.startswith("_") and m.name.endswith(CONFIG_SUFFIX)
    )


def get_settings(name: str) -> type[AlgorithmSettings]:
    """The `AlgorithmSettings` class registered as module `aiorl.algos.<name>_config` (no torch)."""
    names = available_algorithms()
    if name not in names:
        hint = did_you_mean(name, names)
        raise ConfigError(f"algo: unknown algorithm {name!r}{hint} (available: {', '.join(names)})")
    module = importlib.import_module(f"aiorl.algos.{name}{CONFIG_SUFFIX}")
    settings = getattr(module, "SETTINGS", None)
    if not (isinstance(settings, type) and issubclass(settings, AlgorithmSettings)):
        raise ConfigError(f"algo: module aiorl.algos.{name}{CONFIG_SUFFIX} does not define SETTINGS")
    if not dataclasses.is_dataclass(settings.model_config) and settings.model_config is not dict:
        raise TypeError(f"{settings.__name__}.model_config must be a dataclass")
    return settings


def get_algorithm(name: str) -> type[Algorithm]:
    """The `Algorithm` class registered as module `aiorl.algos.<name>`, on its settings (imports torch)."""
    settings = get_settings(name)
    algo = getattr(importlib.import_module(f"aiorl.algos.{name}"), "ALGORITHM", None)
    if not (isinstance(algo, type) and issubclass(algo, Algorithm) and issubclass(algo, settings)):
        raise TypeError(f"aiorl.algos.{name}.ALGORITHM must be an Algorithm built on {settings.__name__}")
    return algo
