"""Config-time checks of the env section's `env.wrappers`, `env.preset`, `env.preset_options`
and `env.backend` (what each means: `aiorl.envs.wrappers`, `aiorl.envs.atari`).

Gymnasium is imported only for the checks that need it: a wrapper's class and keywords, and
the Atari settings (ale-py's ids, its vector env's options). A config without wrappers and
without Atari loads without gymnasium.
"""

from __future__ import annotations

from aiorl.config import ConfigError, EnvConfig
from aiorl.core.suggest import did_you_mean

PRESETS = ("atari",)
BACKENDS = ("gymnasium", "ale_vector")


def check_env_config(env_cfg: EnvConfig) -> None:
    """Config-time checks of env.wrappers, env.preset, env.preset_options and env.backend."""
    if env_cfg.id is None:  # an offline run without an env (aiorl.config.checks allows it only there)
        for key in ("wrappers", "preset", "preset_options"):
            if getattr(env_cfg, key):
                raise ConfigError(f"env.{key}: set, but env.id is null (no env); set env.id or remove it")
        return
    if env_cfg.wrappers:
        from aiorl.envs.mask_velocity import check_mask_velocity  # gymnasium
        from aiorl.envs.wrappers import parse_wrappers, wrapper_names

        parse_wrappers(env_cfg.wrappers)
        check_mask_velocity(env_cfg.id, wrapper_names(env_cfg.wrappers))
    if env_cfg.preset is not None and env_cfg.preset not in PRESETS:
        raise ConfigError(f"env.preset: expected one of {', '.join(PRESETS)} (or null), got {env_cfg.preset!r}")
    if env_cfg.backend not in BACKENDS:
        hint = did_you_mean(str(env_cfg.backend), BACKENDS)
        raise ConfigError(f"env.backend: unknown backend {env_cfg.backend!r}{hint} (expected {', '.join(BACKENDS)})")
    if env_cfg.preset_options and env_cfg.preset is None:
        raise ConfigError("env.preset_options: set env.preset too (the options belong to a preset)")
    if env_cfg.preset == "atari" or env_cfg.id.startswith("ALE/") or env_cfg.backend == "ale_vector":
        from aiorl.envs import atari  # gymnasium, ale-py

        atari.check_config(env_cfg)
