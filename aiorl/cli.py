"""The `aiorl` command: run a config (every role locally, or one role of a cluster)."""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from aiorl.config import Config, ConfigError, load_config
from aiorl.rundir import make_run_dir
from aiorl.runtime.process import cluster_token
from aiorl.wire import TokenError, load_token
from aiorl.wire.auth import TOKEN_ENV


def _make_run_dir(cfg: Config) -> Path:
    """`run.dir`, or runs/<algo>-<env>-<timestamp>; created."""
    if cfg.run.dir:
        run_dir = Path(cfg.run.dir)
    else:
        env = cfg.env.id.replace("/", "-")  # ALE/Pong-v5: one directory, not two
        run_dir = Path("runs") / f"{cfg.algo}-{env}-{time.strftime('%Y%m%d-%H%M%S')}"
    return make_run_dir(run_dir)


def cmd_run(args: argparse.Namespace) -> int:
    try:
        cfg = load_config(args.config, args.set)
        if args.role is not None:
            from aiorl.runtime.process import run_role

            limit = {"actor": cfg.cluster.actors, "memory": cfg.cluster.memories,
                     "learner": cfg.cluster.learners}[args.role]
            if not 0 <= args.index < limit:
                raise ConfigError(f"--index {args.index}: this cluster has {limit} {args.role} role(s) "
                                  f"(indices 0..{limit - 1})")
            if args.role == "learner":
                from aiorl.runtime.algorithm import get_algorithm

                get_algorithm(cfg.algo).check_learner_host(cfg)
            run_dir = _make_run_dir(cfg)
            cluster_token(cfg, run_dir)  # a bad token is the user's to fix: one line, before the role starts
            return run_role(cfg, args.role, args.index, run_dir)
        from aiorl.replay.frames import frame_layout
        from aiorl.runtime.algorithm import build_algorithm

        # Fail on an unknown env, unsupported spaces, a missing learner device or a bad
        # token before any process starts.
        algo = build_algorithm(cfg)
        algo.transition_spec()
        frame_layout(cfg, algo)
        algo.check_learner_host(cfg)
        if cfg.run.token_file is not None or os.environ.get(TOKEN_ENV):
            load_token(cfg.run.token_file)  # else the launcher makes one
    except ConfigError as exc:
        print(f"aiorl: config error: {exc}", file=sys.stderr)
        return 2
    except TokenError as exc:
        print(f"aiorl: token error: {exc}", file=sys.stderr)
        return 2
    from aiorl.launch import LocalLauncher

    run_dir = _make_run_dir(cfg)
    cfg.run.dir = str(run_dir.resolve())
    cfg.dump(run_dir / "config.yaml")
    if not args.quiet:
        c = cfg.cluster
        print(f"aiorl: {cfg.algo} on {cfg.env.id}: {c.actors} actor(s), {c.memories} memory host(s), "
              f"{c.learners} learner(s); run directory {run_dir}", flush=True)
    return LocalLauncher(cfg, run_dir, quiet=args.quiet).run()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="aiorl", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run a config: every role locally, or one role with --role/--index")
    run.add_argument("config", help="run config (YAML or JSON)")
    run.add_argument("--set", action="append", default=[], metavar="KEY.PATH=VALUE",
                     help="override a config value (parsed as a YAML scalar); repeatable")
    run.add_argument("--role", choices=("actor", "memory", "learner"),
                     help="run only this role (one-role-per-host deployments)")
    run.add_argument("--index", type=int, default=0, help="index of the role given with --role")
    run.add_argument("--quiet", action="store_true", help="no progress display")
    run.set_defaults(func=cmd_run)
    from aiorl import plot, status

    plot.add_parser(sub)
    status.add_parser(sub)
    from aiorl import evaluate

    evaluate.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)
