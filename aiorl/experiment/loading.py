"""Loading a run config with its algorithm: the file, the `--set` overrides, the algorithm's
`agent` defaults, the shared sections, the algorithm's model section, each subsystem's check
and the algorithm's own checks, all from the algorithm's settings (no torch). The loaded
`Config` carries its algorithm class (`Config.algorithm`, imported when first asked), which
the runtime takes from there.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
from pathlib import Path

from aiorl import algos
from aiorl.config import (
    Config,
    ConfigError,
    apply_overrides,
    build_dataclass,
    check_agent_and_run,
    check_cluster_and_env,
    check_deterministic,
    check_offline,
    check_synchronous,
    coerce,
    read_config_file,
)
from aiorl.envs.checks import check_env_config
from aiorl.io.loggers import check_names
from aiorl.launch.placement import check_launcher
from aiorl.replay.frames import check_compression


def load_config(path: str | Path | None = None, overrides: list[str] | None = None, data: dict | None = None) -> Config:
    """Read, override, type-check and validate a run config; raise ConfigError on any problem."""
    # A deep copy: overrides must not change the caller's nested mappings (aiorl.run(dict) twice).
    raw = copy.deepcopy(dict(data)) if data is not None else read_config_file(path)
    raw = apply_overrides(raw, list(overrides or []))
    _agent_defaults(raw)
    _offline_defaults(raw)
    model_raw = raw.pop("model", None)
    cfg = build_dataclass(Config, raw, "")
    if cfg.algo is None:
        raise ConfigError(
            f"algo: required; set one of {', '.join(algos.available_algorithms())} "
            "(e.g. `algo: apex_dqn`; `aiorl config ALGO` prints a full config)"
        )
    settings = algos.get_settings(cfg.algo)  # the algorithm owns the model section
    _check_recurrent_supported(cfg.algo, settings, model_raw)
    cfg.model = coerce(model_raw, settings.model_config, "model")
    cfg.bind_algorithm(functools.partial(algos.get_algorithm, cfg.algo))
    check_config(cfg)
    check_offline(cfg, offline_only=settings.offline_only, keeps_replay=settings.keeps_replay(cfg))
    settings.validate(cfg)
    synchronous = settings.is_synchronous(cfg)
    if synchronous:
        check_synchronous(cfg)
    check_deterministic(cfg, synchronous)
    return cfg


def _check_recurrent_supported(name: str, settings, model_raw) -> None:
    """``model.recurrent`` for an algorithm without recurrent policies: one line saying which have them."""
    if not isinstance(model_raw, dict) or model_raw.get("recurrent") is None:
        return
    if _has_recurrent(settings):
        return
    supported = [n for n in algos.available_algorithms() if _has_recurrent(algos.get_settings(n))]
    raise ConfigError(
        f"model.recurrent: {name} has no recurrent policies, got {model_raw['recurrent']!r} "
        f"(expected null, or an algorithm that has them: {', '.join(supported)})"
    )


def _has_recurrent(settings) -> bool:
    model = settings.model_config
    return dataclasses.is_dataclass(model) and "recurrent" in {f.name for f in dataclasses.fields(model)}


def check_config(cfg: Config) -> None:
    """The shared sections and each subsystem's keys, in the order a config reads."""
    check_cluster_and_env(cfg)
    check_env_config(cfg.env)
    check_compression(cfg.cluster.frame_compression)
    check_launcher(cfg.cluster)
    check_agent_and_run(cfg)
    bad_loggers = check_names(cfg.run.loggers)
    if bad_loggers is not None:
        raise ConfigError(bad_loggers)


def _offline_defaults(raw: dict) -> None:
    """An offline run (offline.dataset given) has no actors, and no env unless it names one:
    ``cluster.actors`` and ``env.id`` it leaves out are 0 and null, not the online defaults."""
    offline = raw.get("offline")
    if not isinstance(offline, dict) or offline.get("dataset") is None:
        return
    for section, key, value in (("cluster", "actors", 0), ("env", "id", None)):
        part = raw[section] = {} if raw.get(section) is None else raw[section]
        if isinstance(part, dict):  # else the section's own check names it
            part.setdefault(key, value)


def _agent_defaults(raw: dict) -> None:
    """Fill in the algorithm's own `agent` defaults (`AlgorithmSettings.agent_defaults`) the config leaves out."""
    name, agent = raw.get("algo"), raw.get("agent") or {}
    if not isinstance(name, str) or name not in algos.available_algorithms() or not isinstance(agent, dict):
        return  # the checks that follow name what is wrong
    defaults = algos.get_settings(name).agent_defaults
    if defaults:
        raw["agent"] = {**defaults, **agent}
