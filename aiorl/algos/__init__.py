"""The algorithm registry: one module per algorithm under `aiorl.algos`, each exposing
``ALGORITHM`` (a subclass of `aiorl.runtime.algorithm.Algorithm`); shared pieces live in
`aiorl.algos.lib`. An algorithm's module is imported only when its name is asked for, so
listing the names imports no torch.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import pkgutil

from aiorl.config import ConfigError
from aiorl.runtime.algorithm import Algorithm


def available_algorithms() -> list[str]:
    return sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.ispkg and not m.name.startswith("_"))


def get_algorithm(name: str) -> type[Algorithm]:
    """The `Algorithm` class registered as module `aiorl.algos.<name>`."""
    names = available_algorithms()
    if name not in names:
        close = difflib.get_close_matches(name, names, n=1)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        raise ConfigError(f"algo: unknown algorithm {name!r}{hint} (available: {', '.join(names)})")
    module = importlib.import_module(f"aiorl.algos.{name}")
    algo = getattr(module, "ALGORITHM", None)
    if not (isinstance(algo, type) and issubclass(algo, Algorithm)):
        raise ConfigError(f"algo: module aiorl.algos.{name} does not define ALGORITHM")
    if not dataclasses.is_dataclass(algo.model_config) and algo.model_config is not dict:
        raise TypeError(f"{algo.__name__}.model_config must be a dataclass")
    return algo
