"""`aiorl ope TARGET --data DATASET`: what a policy would score, estimated from logged data alone.

TARGET is a run directory (its best policy when the evaluations during training kept one, else
its final one, as `aiorl eval` chooses; ``--best`` / ``--final`` choose) or a policy file or
directory. The dataset is read by `aiorl.offline.formats.load_dataset` (``--format`` names its
format; default: detected). Every estimator of `aiorl.ope` runs: IPS, step-wise IPS, weighted
IPS, step-wise weighted IPS, doubly robust and fitted Q evaluation (``--no-fqe``: neither of the
last two, which need FQE's model), each with a bootstrap interval over episodes. The output
says where the behaviour probabilities came from: the dataset's recorded propensities, or a
behaviour-cloning model fitted to the dataset. docs/guides/off-policy-evaluation.md says what
each estimator assumes.
"""

from __future__ import annotations

import argparse
import json
import sys

from aiorl.config import ConfigError
from aiorl.evaluation.policies import EvalError
from aiorl.offline.dataset import DatasetError
from aiorl.offline.formats import load_dataset
from aiorl.ope.behaviour import RECORDED
from aiorl.ope.bootstrap import LEVEL
from aiorl.ope.loading import load_target, policy_path_of
from aiorl.ope.report import DEFAULT_FQE, NAMES, evaluate_policy
from aiorl.ope.target import OpeError

USER_ERRORS = (OpeError, EvalError, DatasetError, ConfigError)


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def render(report: dict) -> str:
    behaviour = (
        "recorded in the dataset (propensity)"
        if report["behaviour"] == RECORDED
        else "estimated by a behaviour-cloning model (the dataset records no propensity)"
    )
    epsilon = report["target_epsilon"]
    lines = [
        f"policy    {report['policy']} ({report['which']})",
        f"dataset   {report['dataset']} ({report['rows']:,} rows, {report['episodes']:,} episodes)",
        f"target    {'greedy' if epsilon == 0 else f'epsilon-greedy, epsilon {epsilon}'}; gamma {report['gamma']}",
        f"behaviour probabilities {behaviour}",
        f"effective episodes (whole-episode weights) {report['effective_episodes']}",
        "",
        f"{'estimator':<24} {'estimate':>10}   {int(report['level'] * 100)}% interval "
        f"({report['bootstrap']} bootstrap resamples, seed {report['seed']})",
    ]
    for name, e in report["estimates"].items():
        interval = "" if e["low"] is None else f"[{_number(e['low'])}, {_number(e['high'])}]"
        lines.append(f"{NAMES[name]:<24} {_number(e['value']):>10}   {interval}")
    if any(e["value"] is None for e in report["estimates"].values()):
        lines.append(
            "- : undefined: no episode has weight under the target policy (it would never take every action "
            "of any logged episode); --target-epsilon above 0 gives every episode some"
        )
    return "\n".join(lines)


def _check_args(args: argparse.Namespace) -> None:
    if not 0.0 < args.gamma <= 1.0:
        raise OpeError(f"--gamma: expected 0 < G <= 1, got {args.gamma}")
    if not 0.0 <= args.target_epsilon <= 1.0:
        raise OpeError(f"--target-epsilon: expected 0..1, got {args.target_epsilon}")
    if args.bootstrap < 0:
        raise OpeError(f"--bootstrap: expected 0 or more resamples, got {args.bootstrap}")


def cmd_ope(args: argparse.Namespace) -> int:
    def progress(done: int, total: int) -> None:
        if done == total or done % max(1, total // 10) == 0:
            print(f"fitted Q evaluation: iteration {done}/{total}", file=sys.stderr, flush=True)

    try:
        _check_args(args)
        path, which = policy_path_of(args.target, args.which)
        dataset = load_dataset(args.data, args.format)
        policy = load_target(path, dataset, args.trust_program)
        if dataset.propensity is None:
            print("the dataset records no propensity: fitting a behaviour-cloning model", file=sys.stderr, flush=True)
        report = evaluate_policy(
            dataset,
            policy,
            gamma=args.gamma,
            target_epsilon=args.target_epsilon,
            bootstrap=args.bootstrap,
            seed=args.seed,
            fqe=None if args.no_fqe else DEFAULT_FQE,
            progress=progress,
        )
    except USER_ERRORS as exc:
        print(f"aiorl ope: {exc}", file=sys.stderr)
        return 2
    report = {"policy": str(path), "which": which, **report, "level": LEVEL}
    print(json.dumps(report) if args.json else render(report))
    return 0


def add_parser(sub) -> None:
    p = sub.add_parser("ope", help="estimate a policy's return from logged data (off-policy evaluation)")
    p.add_argument("target", help="run directory (its best or final policy), or a policy file or directory")
    p.add_argument(
        "--data",
        required=True,
        metavar="DATASET",
        help="the dataset: a path or a Minari dataset id (as offline.dataset)",
    )
    p.add_argument(
        "--format", default=None, help="the dataset's format (aiorl, easyrl, minari, snapshot); default: detected"
    )
    chosen = p.add_mutually_exclusive_group()
    chosen.add_argument("--best", dest="which", action="store_const", const="best", help="the run's best policy")
    chosen.add_argument("--final", dest="which", action="store_const", const="final", help="the run's final policy")
    p.add_argument(
        "--trust-program",
        action="store_true",
        help="allow a policy that is a program (.pt2, .pt) when no weights are beside it: RUNS CODE FROM THE FILE",
    )
    p.add_argument(
        "--gamma", type=float, metavar="G", default=0.99, help="discount of the return estimated (default 0.99)"
    )
    p.add_argument(
        "--target-epsilon",
        type=float,
        metavar="E",
        default=0.0,
        help="evaluate the policy epsilon-greedy: a uniformly random action with probability E (default 0: greedy)",
    )
    p.add_argument(
        "--bootstrap",
        type=int,
        default=1000,
        help="bootstrap resamples of the episodes (default 1000; 0: no intervals)",
    )
    p.add_argument("--seed", type=int, metavar="S", default=0, help="seed of the resamples and of the models fitted")
    p.add_argument(
        "--no-fqe", action="store_true", help="skip fitted Q evaluation, and doubly robust, which uses its model"
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=cmd_ope)
