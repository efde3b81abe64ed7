"""The `aiorl` command: run a config (every role locally, or one role of a cluster)."""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from aiorl.config import ConfigError, load_config
from aiorl.rundir import RunDirError, check_resumable
from aiorl.runtime.process import cluster_token
from aiorl.wire import TokenError, load_token
from aiorl.wire.auth import TOKEN_ENV


def _config_source(args: argparse.Namespace) -> tuple[str, list[str]]:
    """The config file and overrides of `aiorl run`: CONFIG, or the run directory's own with --resume."""
    if args.resume is None:
        if args.config is None:
            raise ConfigError("aiorl run needs a CONFIG file, or --resume RUN_DIR")
        return args.config, args.set
    if args.config is not None:
        raise ConfigError(f"give either CONFIG ({args.config}) or --resume RUN_DIR, not both "
                          "(a resumed run keeps its config; change values with --set)")
    if args.role is not None:
        raise ConfigError("--resume continues a whole local run; it does not combine with --role")
    run_dir = Path(args.resume)
    check_resumable(run_dir)
    return str(run_dir / "config.yaml"), [*args.set, f"run.dir={run_dir.resolve()}"]


def cmd_run(args: argparse.Namespace) -> int:
    try:
        config_path, overrides = _config_source(args)
        cfg = load_config(config_path, overrides)
        if args.role is not None:
            from aiorl.rundir import role_run_dir
            from aiorl.runtime.process import run_role

            limit = {"actor": cfg.cluster.actors, "memory": cfg.cluster.memories,
                     "learner": cfg.cluster.learners}[args.role]
            if not 0 <= args.index < limit:
                raise ConfigError(f"--index {args.index}: this cluster has {limit} {args.role} role(s) "
                                  f"(indices 0..{limit - 1})")
            if args.role == "learner":
                from aiorl.runtime.algorithm import get_algorithm

                get_algorithm(cfg.algo).check_learner_host(cfg)
            run_dir = role_run_dir(cfg.run.dir, cfg.algo, cfg.env.id)
            cluster_token(cfg, run_dir)  # a bad token is the user's to fix: one line, before the role starts
            return run_role(cfg, args.role, args.index, run_dir)
        from aiorl.replay.frames import frame_layout
        from aiorl.rundir import claim
        from aiorl.runtime.algorithm import build_algorithm

        # Fail on an unknown env, unsupported spaces, a missing learner device or a bad
        # token before any process starts.
        algo = build_algorithm(cfg)
        algo.transition_spec()
        frame_layout(cfg, algo)
        algo.check_learner_host(cfg)
        if cfg.run.token_file is not None or os.environ.get(TOKEN_ENV):
            load_token(cfg.run.token_file)  # else the launcher makes one

        run_dir = claim(cfg, args.resume, args.set)
    except ConfigError as exc:
        print(f"aiorl: config error: {exc}", file=sys.stderr)
        return 2
    except RunDirError as exc:
        print(f"aiorl: {exc}", file=sys.stderr)
        return 2
    except TokenError as exc:
        print(f"aiorl: token error: {exc}", file=sys.stderr)
        return 2
    from aiorl.launch import LocalLauncher

    if not args.quiet:
        c = cfg.cluster
        what = (f"resuming attempt {run_dir.identity.attempt}" if args.resume else "run directory")
        print(f"aiorl: {cfg.algo} on {cfg.env.id}: {c.actors} actor(s), {c.memories} memory host(s), "
              f"{c.learners} learner(s); {what} {run_dir.path}", flush=True)
    return LocalLauncher(cfg, run_dir, quiet=args.quiet).run()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="aiorl", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run a config: every role locally, or one role with --role/--index")
    run.add_argument("config", nargs="?", help="run config (YAML or JSON)")
    run.add_argument("--resume", metavar="RUN_DIR",
                     help="continue a stopped, interrupted or crashed run from its newest good checkpoint")
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
