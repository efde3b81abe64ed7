"""What a local run checks before any process starts, then the run directory it claims.

Shared by `aiorl run` and `aiorl.run()`: an unknown env, unsupported spaces, a
missing learner device or a bad token are the user's to fix, so they are
found here, in the launching process, and not by a role that died.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from aiorl.config import Config, ConfigError, check_offline_episodes, check_stops
from aiorl.io.loggers import check_installed
from aiorl.io.rundir import RunDir, claim
from aiorl.launch.placement import MISSING_RAY
from aiorl.launch.spawner import WarmSpawner
from aiorl.offline.dataset import DatasetError
from aiorl.offline.formats import load_dataset
from aiorl.replay.frames import frame_layout
from aiorl.runtime.algorithm import build_algorithm
from aiorl.runtime.memory.build import replay_bytes
from aiorl.runtime.memory.dataset_store import check_dataset
from aiorl.wire import load_token
from aiorl.wire.auth import TOKEN_ENV

#: The share of this machine's memory a local run's replay may take once full.
REPLAY_MEMORY_SHARE = 0.8
# A container's memory limit (cgroup v2, then v1): tighter than the machine's RAM where set.
CGROUP_LIMITS = ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes")


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


def check_eval_dataset(cfg: Config, algo) -> None:
    """offline.eval_dataset, read as the evaluation process will read it: a dataset of the run's
    spaces with Discrete actions (the estimators sum over them), else one line before any start."""
    if cfg.offline.eval_dataset is None:
        return
    from gymnasium.spaces import Discrete  # gymnasium: the algorithm is built already, it is loaded

    spec = algo.env_spec
    if not isinstance(spec.action_space, Discrete):
        raise ConfigError(
            f"offline.eval_dataset: off-policy evaluation takes Discrete actions; this run's are {spec.action_space}"
        )
    try:
        load_dataset(cfg.offline.eval_dataset, observation_space=spec.observation_space, action_space=spec.action_space)
    except DatasetError as exc:
        raise ConfigError(f"offline.eval_dataset: {exc}") from None


def check_algorithm(cfg: Config) -> None:
    """The algorithm built on the env's spaces (an offline run's dataset read and checked, against
    the env's spaces where it names one), and the learner's device (torch ops: a local run does
    this in a child of the warm spawner)."""
    try:
        algo = build_algorithm(cfg)
        if cfg.offline.dataset is not None:
            check_dataset(cfg, algo)
    except DatasetError as exc:
        raise ConfigError(f"offline.dataset: {exc}") from None
    check_eval_dataset(cfg, algo)
    algo.transition_spec()
    frame_layout(cfg, algo)
    if cfg.cluster.launcher != "ray":  # under Ray, the node it places the learner on checks it
        algo.check_learner_host(cfg)
        check_replay_fits(cfg, algo, machine_memory_bytes())


def machine_memory_bytes() -> int | None:
    """This machine's memory: its RAM, or less where a cgroup (a container's limit) holds its
    processes to less; None if neither can be read."""
    try:
        limits = [os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")]
    except (ValueError, OSError):
        limits = []
    for path in CGROUP_LIMITS:
        try:
            text = Path(path).read_text().strip()
        except OSError:
            continue
        if text.isdigit():  # "max": no limit
            limits.append(int(text))
    return min(limits) if limits else None


def check_replay_fits(cfg: Config, algo, memory: int | None) -> None:
    """ConfigError if the replay cannot fit this machine's `memory` (bytes) once full: every memory
    host of a local run is on this machine, so their shards add up. A replay may take
    `REPLAY_MEMORY_SHARE` of it; the roles' processes and the system need the rest. The bytes per
    row are a floor (`Store.bytes_per_row`), so a replay that fits is never refused."""
    per_row, shard = replay_bytes(cfg, algo)
    if memory is None or per_row == 0:
        return
    needed = shard * cfg.cluster.memories
    allowed = int(memory * REPLAY_MEMORY_SHARE)
    if needed <= allowed:
        return
    fit = allowed // per_row // cfg.cluster.memories * cfg.cluster.memories
    hosts = f" over {cfg.cluster.memories} memory hosts" if cfg.cluster.memories > 1 else ""
    raise ConfigError(
        f"agent.buffer_size: {cfg.agent.buffer_size} rows of {per_row} bytes need at least "
        f"{_gib(needed)}{hosts} and this machine has {_gib(memory)} of memory, of which a replay may take "
        f"{REPLAY_MEMORY_SHARE:.0%} ({_gib(allowed)}): at most {fit} rows fit"
    )


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"


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
    check_offline_episodes(cfg)  # before a dataset is read
    if spawner is None:
        check_local_run(cfg)
    else:
        check_in_spawner(cfg, spawner)
    check_stops(cfg)  # last: what is wrong with the config itself reads first
    return claim(cfg, resume, overrides)
