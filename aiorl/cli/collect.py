"""`aiorl collect SOURCE -o DIR --episodes N`: log a behaviour policy's episodes as a dataset,
with each step's behaviour probability (`aiorl.evaluation.collect`)."""

from __future__ import annotations

import argparse
import json
import sys

from aiorl.config import ConfigError
from aiorl.evaluation.collect import CollectError, EvalError, collect, format_summary, progress_printer
from aiorl.offline.dataset import DatasetError


def cmd_collect(args: argparse.Namespace) -> int:
    try:
        summary = collect(
            args.source,
            args.out,
            args.episodes,
            epsilon=args.epsilon,
            env_id=args.env,
            seed=args.seed,
            fmt=args.format,
            noise=args.noise,
            progress=None if args.json else progress_printer(args.episodes),
        )
    except (CollectError, EvalError, ConfigError, DatasetError) as exc:
        print(f"aiorl collect: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(summary) if args.json else format_summary(summary))
    return 0


def add_parser(sub) -> None:
    p = sub.add_parser("collect", help="log a policy's (or random) episodes as an offline dataset")
    p.add_argument(
        "source", help="a run directory (its best policy), a policy file or directory, or 'random' (with --env)"
    )
    p.add_argument("-o", "--out", required=True, help="directory to write the dataset to (new or empty)")
    p.add_argument("--episodes", type=int, required=True, help="episodes to collect")
    p.add_argument("--epsilon", type=float, default=0.0, help="probability of a uniformly random action (default 0)")
    p.add_argument("--env", default=None, help="env id (default: the run's or the policy's; required for random)")
    p.add_argument(
        "--seed", type=int, default=0, help="episode k is reset with seed SEED + k (seeds the behaviour too)"
    )
    p.add_argument("--format", choices=("aiorl", "minari"), default="aiorl", help="dataset format (default aiorl)")
    p.add_argument("--noise", type=float, default=0.0, help="Gaussian noise SIGMA added to Box actions (then clipped)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(func=cmd_collect)
