"""A role started by hand (`aiorl run CFG --role KIND --index N`): its checks and its run directory.

The local launcher starts its roles the same way, but with the launch's
identity in the environment (`aiorl.io.rundir.Identity.env`) and a run directory
it has claimed; a role without that identity was started by a person, on
some host of a cluster, and gets:

- every check a user's mistake can fail, before anything is made: the role
  index, the coordinator's port, the cluster token, the learner's device;
- a run directory that is complete for what this role produces: the resolved
  ``config.yaml`` (so `aiorl eval`, `plot` and `status` take the directory),
  ``logs/<role>.log``, and the role's own results (learner 0: checkpoints and
  the policy; memory 0: ``coordinator.json``, ``metrics.jsonl``,
  ``summary.json``). Without ``run.dir`` it is
  ``runs/<algo>-<env>-<timestamp>-<role>``; with one, every role of the
  cluster may share it (shared storage): each writes only files of its own,
  and ``config.yaml`` is written once, by whichever role comes first, and
  must match the config every later role brings (the config hash);
- short lines on stdout when it connects, when the phase changes and when it
  exits (`console_records`).
"""

from __future__ import annotations

import os
from pathlib import Path

from aiorl.config import Config, ConfigError
from aiorl.experiment.loading import load_config
from aiorl.io.rundir import ENV_LAUNCH_ID, OWNER_FILE, Identity, RunDirError, default_path, make_run_dir, read_json
from aiorl.runtime.phase import role_name


def started_by_hand(environ=os.environ) -> bool:
    return not environ.get(ENV_LAUNCH_ID)


def check_launched(run_dir: Path, environ=os.environ) -> None:
    """A role that says a launcher started it (its identity in the environment) writes into
    `run_dir` only if that directory's own record names this launch as its newest (RunDirError
    otherwise): the environment alone is anybody's to set. A directory without a record (a
    Ray node's own, where the run directory is not shared) is the role's to make."""
    owner = read_json(run_dir / OWNER_FILE)
    if owner is None:
        return
    identity = Identity.from_env(environ)
    attempts = owner.get("attempts") or [{}]
    if owner.get("run_id") != identity.run_id or attempts[-1].get("launch_id") != identity.launch_id:
        raise RunDirError(
            f"run directory {run_dir} belongs to launch {attempts[-1].get('launch_id')} of run "
            f"{owner.get('run_id')} ({OWNER_FILE}), not to the launch this role names ({ENV_LAUNCH_ID}="
            f"{identity.launch_id}); a role started by hand needs a run.dir of its own"
        )


def run_dir_path(cfg: Config, kind: str, index: int) -> Path:
    """Where a role started by hand writes: ``run.dir``, else a new directory named after the role."""

    if cfg.run.dir:
        return Path(cfg.run.dir)
    base = default_path(cfg.algo, cfg.subject)
    return base.with_name(f"{base.name}-{role_name(kind, index)}")


def check_role(cfg: Config, kind: str, index: int, run_dir: Path) -> None:
    """Refuse, before anything is made, a role that could never run (ConfigError, TokenError)."""
    from aiorl.runtime.process import cluster_token

    c = cfg.cluster
    limit = {"actor": c.actors, "memory": c.memories, "learner": c.learners}[kind]
    if not 0 <= index < limit:
        raise ConfigError(f"--index {index}: this cluster has {limit} {kind} role(s) (indices 0..{limit - 1})")
    if kind == "learner":
        cfg.algorithm.check_learner_host(cfg)
    if c.port == 0 and not (kind == "memory" and index == 0):
        raise ConfigError(
            f"cluster.port is 0: {kind} {index} started on its own must be told the coordinator's "
            "port (--set cluster.port=PORT, the port memory 0 listens on)"
        )
    cluster_token(cfg, run_dir)  # AIORL_TOKEN, run.token_file or the directory's token: says what to do if none


# What a role's run writes that a later run of the same role must not write over.
RESULTS = {"memory-0": ("summary.json", "metrics.jsonl"), "learner-0": ("policy", "checkpoints")}


def make_role_run_dir(cfg: Config, run_dir: Path, kind: str, index: int) -> Path:
    """Make the run directory of a role started by hand, holding the resolved config."""

    name = role_name(kind, index)
    if (run_dir / OWNER_FILE).exists():
        raise RunDirError(
            f"run directory {run_dir} belongs to a local run ({OWNER_FILE}); a role started by "
            "hand needs a run.dir of its own, or one shared only by its cluster's roles"
        )
    earlier = [f for f in RESULTS.get(name, ()) if (run_dir / f).exists()]
    if earlier:
        raise RunDirError(
            f"run directory {run_dir} already holds an earlier run's {name} results "
            f"({', '.join(earlier)}); give a new run.dir"
        )
    try:
        make_run_dir(run_dir)
    except OSError as exc:
        raise RunDirError(f"cannot make run directory {run_dir}: {exc.strerror or exc}") from None
    cfg.run.dir = str(run_dir.resolve())
    _write_config_once(cfg, run_dir / "config.yaml")
    return run_dir


def _write_config_once(cfg: Config, target: Path) -> None:
    """Write the resolved config unless a role of the same cluster already has; refuse another cluster's."""
    tmp = target.with_name(f".config.yaml.{os.getpid()}.tmp")
    cfg.dump(tmp)
    try:
        os.link(tmp, target)  # atomic and exclusive, also on shared storage (NFS)
        return
    except FileExistsError:
        pass
    finally:
        tmp.unlink(missing_ok=True)
    try:
        theirs = load_config(target).config_hash()
    except ConfigError as exc:
        raise RunDirError(
            f"run directory {target.parent} holds a config.yaml that does not load ({exc}); give a new run.dir"
        ) from None
    if theirs != cfg.config_hash():
        raise RunDirError(
            f"run directory {target.parent} holds the config of another cluster (config hash "
            f"mismatch: {theirs}, this role's {cfg.config_hash()}); give every role the same "
            "config, or a new run.dir"
        )
