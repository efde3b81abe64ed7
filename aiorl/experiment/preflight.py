"""What a local run checks before any process starts, then the run directory it claims.

Shared by `aiorl run` and `aiorl.run()`: an unknown env, unsupported spaces, a
missing learner device or a bad token are the user's to fix, so they are
found here, in the launching process, and not by a role that died.
"""

from __future__ import annotations

import os
import tempfile

from aiorl.config import Config, ConfigError, check_stops
from aiorl.io.loggers import check_installed
from aiorl.io.rundir import RunDir, claim
from aiorl.launch.placement import MISSING_RAY
from aiorl.launch.spawner import WarmSpawner
from aiorl.replay.frames import frame_layout
from aiorl.runtime.algorithm import build_algorithm
from aiorl.wire import load_token
from aiorl.wire.auth import TOKEN_ENV


def check_local_run(cfg: Config) -> None:
    """Raise ConfigError / TokenError for what would make a local run's roles fail at start."""
    check_packages_and_token(cfg)
    check_algorithm(cfg)


def check_packages_and_token(cfg: Config) -> None:
    """What the launcher checks itself, without torch: the extras the config asks for and the token."""
    if cfg.cluster.launcher == "ray":
        _check_ray()
    if (missing := check_installed(cfg.run.loggers)) is not None:
        raise ConfigError(missing)
    if cfg.run.token_file is not None or os.environ.get(TOKEN_ENV):
        load_token(cfg.run.token_file)  # else the launcher makes one


def check_algorithm(cfg: Config) -> None:
    """The algorithm built on the env's spaces, and the learner's device (torch ops: a local run
    does this in a child of the warm spawner)."""
    algo = build_algorithm(cfg)
    algo.transition_spec()
    frame_layout(cfg, algo)
    if cfg.cluster.launcher != "ray":  # under Ray, the node it places the learner on checks it
        algo.check_learner_host(cfg)


def _check_ray() -> None:
    try:
        import ray  # noqa: F401
    except ImportError:
        raise ConfigError(MISSING_RAY) from None


def check_in_spawner(cfg: Config, spawner: WarmSpawner) -> None:
    """`check_local_run`: its light half here, while the spawner imports, then `check_algorithm` in
    a child of the warm spawner, which has torch imported already (the algorithm's build runs torch
    ops: never in the spawner itself, nor in this light launcher)."""
    check_packages_and_token(cfg)
    fd, path = tempfile.mkstemp(prefix="aiorl-config-", suffix=".yaml")
    os.close(fd)
    try:
        cfg.dump(path)
        spawner.ready(cfg.algo, deterministic=cfg.run.deterministic)
        reply = spawner.check(path)
    finally:
        os.unlink(path)
    if reply.get("crashed"):
        raise RuntimeError(f"aiorl's preflight check crashed: {reply['crashed']} (its traceback is above)")
    if reply.get("mistake") is not None:
        raise ConfigError(reply["mistake"])


def prepare_local_run(
    cfg: Config, resume: str | None, overrides: list[str], spawner: WarmSpawner | None = None
) -> RunDir:
    """Check `cfg` (in `spawner`'s child when the run has one), then claim its run directory
    (new, or `resume`d) and write the resolved config."""
    if spawner is None:
        check_local_run(cfg)
    else:
        check_in_spawner(cfg, spawner)
    check_stops(cfg)  # last: what is wrong with the config itself reads first
    return claim(cfg, resume, overrides)
