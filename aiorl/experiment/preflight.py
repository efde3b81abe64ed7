"""What a local run checks before any process starts, then the run directory it claims.

Shared by `aiorl run` and `aiorl.run()`: an unknown env, unsupported spaces, a
missing learner device or a bad token are the user's to fix, so they are
found here, in the launching process, and not by a role that died.
"""

from __future__ import annotations

import os

from aiorl.config import Config, ConfigError
from aiorl.io.loggers import check_installed
from aiorl.io.rundir import RunDir, claim
from aiorl.launch.placement import MISSING_RAY
from aiorl.replay.frames import frame_layout
from aiorl.runtime.algorithm import build_algorithm
from aiorl.wire import load_token
from aiorl.wire.auth import TOKEN_ENV


def check_local_run(cfg: Config) -> None:
    """Raise ConfigError / TokenError for what would make a local run's roles fail at start."""

    algo = build_algorithm(cfg)
    algo.transition_spec()
    frame_layout(cfg, algo)
    if cfg.cluster.launcher == "ray":
        _check_ray()  # the learner's device is checked on the node Ray places it on
    else:
        algo.check_learner_host(cfg)

    if (missing := check_installed(cfg.run.loggers)) is not None:
        raise ConfigError(missing)
    if cfg.run.token_file is not None or os.environ.get(TOKEN_ENV):
        load_token(cfg.run.token_file)  # else the launcher makes one


def _check_ray() -> None:
    try:
        import ray  # noqa: F401
    except ImportError:
        raise ConfigError(MISSING_RAY) from None


def prepare_local_run(cfg: Config, resume: str | None, overrides: list[str]) -> RunDir:
    """Check `cfg`, then claim its run directory (new, or `resume`d) and write the resolved config."""
    check_local_run(cfg)
    return claim(cfg, resume, overrides)
