"""What a local run checks before any process starts, then the run directory it claims.

Shared by `aiorl run` and `aiorl.run()`: an unknown env, unsupported spaces, a
missing learner device or a bad token are the user's to fix, so they are
found here, in the launching process, and not by a role that died.
"""

from __future__ import annotations

import os
import tempfile

from aiorl.config import Config, ConfigError
from aiorl.io.loggers import check_installed
from aiorl.io.rundir import RunDir, claim
from aiorl.launch.placement import MISSING_RAY
from aiorl.launch.spawner import WarmSpawner
from aiorl.replay.frames import frame_layout
from aiorl.runtime.algorithm import build_algorithm
from aiorl.wire import TokenError, load_token
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


def check_in_spawner(cfg: Config, spawner: WarmSpawner) -> None:
    """`check_local_run` in a child of the warm spawner, which has torch imported already (the
    algorithm's build runs torch ops: never in the spawner itself, nor in this light launcher)."""
    fd, path = tempfile.mkstemp(prefix="aiorl-config-", suffix=".yaml")
    os.close(fd)
    try:
        cfg.dump(path)
        spawner.ready(cfg.algo)
        reply = spawner.check(path)
    finally:
        os.unlink(path)
    if reply.get("crashed"):
        raise RuntimeError(f"aiorl's preflight check crashed: {reply['crashed']} (its traceback is above)")
    if reply.get("mistake") is not None:
        raise (TokenError if reply.get("kind") == "token" else ConfigError)(reply["mistake"])


def prepare_local_run(
    cfg: Config, resume: str | None, overrides: list[str], spawner: WarmSpawner | None = None
) -> RunDir:
    """Check `cfg` (in `spawner`'s child when the run has one), then claim its run directory
    (new, or `resume`d) and write the resolved config."""
    if spawner is None:
        check_local_run(cfg)
    else:
        check_in_spawner(cfg, spawner)
    return claim(cfg, resume, overrides)
