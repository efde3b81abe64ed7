"""The `aiorl` command: run a config (every role locally, or one role of a cluster)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from aiorl import __version__
from aiorl.cli import collect, ope, plot, status
from aiorl.cli.help import add_examples
from aiorl.config import ConfigError
from aiorl.evaluation import evaluate
from aiorl.experiment import by_hand
from aiorl.experiment import reference as config_reference
from aiorl.experiment.loading import load_config
from aiorl.experiment.preflight import prepare_local_run
from aiorl.io.rundir import RunDirError, check_resumable, role_run_dir
from aiorl.launch import spawner
from aiorl.launch.attempts import run_attempts
from aiorl.wire import TokenError


def _config_source(args: argparse.Namespace) -> tuple[str, list[str]]:
    """The config file and overrides of `aiorl run`: CONFIG, or the run directory's own with --resume."""
    if args.resume is None:
        if args.config is None:
            raise ConfigError("aiorl run needs a CONFIG file, or --resume RUN_DIR")
        return args.config, args.set
    if args.config is not None:
        raise ConfigError(
            f"give either CONFIG ({args.config}) or --resume RUN_DIR, not both "
            "(a resumed run keeps its config; change values with --set)"
        )
    if args.role is not None:
        raise ConfigError("--resume continues a whole local run; it does not combine with --role")
    run_dir = Path(args.resume)
    check_resumable(run_dir)
    return str(run_dir / "config.yaml"), [*args.set, f"run.dir={run_dir.resolve()}"]


def _run_role(cfg, kind: str, index: int) -> int:
    """One role in this process: started by the local launcher, or by hand (aiorl/experiment/by_hand.py)."""
    from aiorl.runtime.process import run_role

    if by_hand.started_by_hand():
        run_dir = by_hand.run_dir_path(cfg, kind, index)
        by_hand.check_role(cfg, kind, index, run_dir)
        by_hand.make_role_run_dir(cfg, run_dir, kind, index)
        return run_role(cfg, kind, index, run_dir, console=True)

    run_dir = role_run_dir(cfg.run.dir, cfg.algo, cfg.subject)
    by_hand.check_launched(run_dir)
    by_hand.check_role(cfg, kind, index, run_dir)
    return run_role(cfg, kind, index, run_dir)


def cmd_run(args: argparse.Namespace) -> int:
    # Started first: its imports of torch and the runtime overlap the reading of the config.
    early = getattr(args, "early_spawner", None)
    if early is None and args.role is None:
        early = spawner.start_early(args.launcher)
    try:
        return _cmd_run(args, early)
    finally:
        if early is not None:
            early.end()  # the launcher ended it already, unless the run never got that far


def _cmd_run(args: argparse.Namespace, early) -> int:
    try:
        if args.launcher is not None:
            args.set.append(f"cluster.launcher={args.launcher}")
        if args.address is not None:
            args.set.append(f"cluster.ray_address={args.address}")
        config_path, overrides = _config_source(args)
        cfg = load_config(config_path, overrides)
        if args.role is not None:
            return _run_role(cfg, args.role, args.index)

        warm = spawner.for_run(cfg, early)
        run_dir = prepare_local_run(cfg, args.resume, args.set, warm)
    except ConfigError as exc:
        print(f"aiorl: config error: {exc}", file=sys.stderr)
        return 2
    except RunDirError as exc:
        print(f"aiorl: {exc}", file=sys.stderr)
        return 2
    except TokenError as exc:
        print(f"aiorl: token error: {exc}", file=sys.stderr)
        return 2

    if run_dir.starting_over:  # a requeued run pre-empted before its first checkpoint: not a mistake
        print(f"aiorl: {run_dir.starting_over}", file=sys.stderr, flush=True)
    if not args.quiet:
        c = cfg.cluster
        what = f"resuming attempt {run_dir.identity.attempt}" if args.resume else "run directory"
        print(
            f"aiorl: {cfg.algo} on {cfg.subject}: {c.actors} actor(s), {c.memories} memory host(s), "
            f"{c.learners} learner(s); {what} {run_dir.path}",
            flush=True,
        )
    return run_attempts(cfg, run_dir, args.quiet, warm)


class OneLineErrors(argparse.ArgumentParser):
    """argparse that reports a bad command line as one line on stderr (exit 2), like every other user
    mistake; the usage it would print first is a `--help` away. Subcommands inherit the class."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineErrors(prog="aiorl", description=__doc__)
    parser.add_argument("--version", action="version", version=f"aiorl {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run a config: every role locally, or one role with --role/--index")
    run.add_argument("config", nargs="?", help="run config (YAML or JSON)")
    run.add_argument(
        "--resume",
        metavar="RUN_DIR",
        help="continue a stopped, interrupted or crashed run from its newest good checkpoint "
        "(from the beginning again when it has none yet)",
    )
    run.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY.PATH=VALUE",
        help="override a config value (parsed as a YAML scalar); repeatable",
    )
    run.add_argument(
        "--role", choices=("actor", "memory", "learner"), help="run only this role (one-role-per-host deployments)"
    )
    run.add_argument("--index", type=int, default=0, help="index of the role given with --role")
    run.add_argument("--quiet", action="store_true", help="no progress display")
    run.add_argument(
        "--launcher",
        choices=("local", "ray"),
        help="where the roles run: this machine (default) or a Ray cluster (cluster.launcher)",
    )
    run.add_argument(
        "--address",
        metavar="ADDR",
        help="Ray cluster of --launcher ray: 'auto' (default) or HOST:PORT (cluster.ray_address)",
    )
    run.set_defaults(func=cmd_run)

    plot.add_parser(sub)
    status.add_parser(sub)

    evaluate.add_parser(sub)
    collect.add_parser(sub)
    ope.add_parser(sub)

    config_reference.add_parser(sub)

    add_examples(parser, sub)
    return parser


def main(argv: list[str] | None = None, early=None) -> int:
    """`early`: (channel, process) of a warm spawner `aiorl.cli.entry` started for a run."""
    early_spawner = None if early is None else spawner.WarmSpawner(*early)
    try:
        args = build_parser().parse_args(argv)
        args.early_spawner = early_spawner
        return args.func(args)
    except KeyboardInterrupt:
        # Ctrl-C before a launcher took over the signal (torch's import takes seconds): not a crash.
        print("\naiorl: interrupted", file=sys.stderr)
        return 130
    finally:
        if early_spawner is not None:
            early_spawner.end()  # the run ended it already, unless the words were no run after all
