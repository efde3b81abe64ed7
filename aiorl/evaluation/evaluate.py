"""`aiorl eval RUN_DIR`: run a run's exported policy greedily and report its returns.

The policy is data: its network rebuilt by aiorl's own code from ``policy.json`` and its weights
read from ``policy.safetensors`` (see `aiorl.io.policy_data`): by default the best one the
evaluations during training kept (``RUN_DIR/policy/best/``, `aiorl.runtime.evaluator`) when the
run has one, else the final one learner 0 exports at shutdown (``RUN_DIR/policy/``). A run written
before policies were data holds only a program (``policy.pt2``, an older run's TorchScript
``policy.pt``), which runs code from the file when loaded: ``--trust-program`` allows that, for
files the user trusts. ``--best`` / ``--final`` choose; ``--policy FILE`` names a
file; ``--checkpoint N`` rebuilds the policy of a checkpoint. The best is
the default because it is the policy chosen by evaluation: the final one is
whatever the last learner step left, and a DQN's greedy policy can swing
between two learner steps. The environment is the
run's own (``RUN_DIR/config.yaml``). Episode k is reset with seed ``S + k``,
so two evaluations with the same seed see the same episodes. ``--video DIR``
records every episode with Gymnasium's RecordVideo (the encoder is the
``video`` extra), ``--render`` shows them in a window.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from aiorl.config import ConfigError
from aiorl.evaluation.episodes import run_episodes
from aiorl.evaluation.options import EvalOptionError, checkpoint_path, checkpoint_policy
from aiorl.evaluation.policies import EvalError, choose_policy, load_checked
from aiorl.experiment.loading import load_config


def evaluate_run(
    run_dir: str | Path,
    episodes: int = 20,
    seed: int = 0,
    policy_path: str | Path | None = None,
    progress=None,
    checkpoint: str | None = None,
    video_dir: str | None = None,
    render: bool = False,
    which: str | None = None,
    trust_program: bool = False,
) -> dict:
    run_dir = Path(run_dir)
    config_path = run_dir / "config.yaml"
    if not run_dir.exists():
        raise EvalError(f"{run_dir} does not exist (a run directory, such as runs/latest, was expected)")
    if not config_path.is_file():
        raise EvalError(f"{run_dir} is not a run directory (no config.yaml)")
    import torch

    torch.set_num_threads(1)  # one observation at a time: extra threads only cost
    cfg = load_config(config_path)
    given = [
        name
        for name, value in (("--policy", policy_path), ("--checkpoint", checkpoint), (f"--{which}", which))
        if value is not None
    ]
    if len(given) > 1:
        raise EvalError(f"give one of --best, --final, --policy, --checkpoint, not {' and '.join(given)}")
    chosen_by = None
    if checkpoint is not None:
        which = "checkpoint"

        path = checkpoint_path(run_dir, checkpoint)
        policy = checkpoint_policy(cfg, path)
    else:
        if policy_path is not None:
            path, which = Path(policy_path), "file"
        else:
            path, which, chosen_by = choose_policy(run_dir, which)
        policy = load_checked(path, cfg.env, trust_program)
    t0 = time.perf_counter()
    result = run_episodes(policy, cfg.env, episodes, seed, progress, video_dir, render)
    return {
        "run_dir": str(run_dir),
        "policy": str(path),
        "which": which,
        "chosen_by": chosen_by,
        "algo": cfg.algo,
        "env": cfg.env.id,
        "seed": seed,
        **result,
        "seconds": round(time.perf_counter() - t0, 3),
    }


def describe_policy(result: dict) -> str:
    """Which policy an evaluation used, in words."""
    if result.get("which") == "best" and result.get("chosen_by"):
        e = result["chosen_by"]
        return (
            f"the best policy {result['policy']} (chosen by evaluation {e.get('n')} at learner step "
            f"{e.get('learner_steps')}: mean return {e['return_mean']:.2f}; --final for the final one)"
        )
    if result.get("which") == "final":
        return f"the final policy {result['policy']}"
    return result["policy"]


def format_result(result: dict) -> str:
    return (
        f"{result['env']}: {result['episodes']} episodes (seed {result['seed']}) with {describe_policy(result)}\n"
        f"return mean {result['mean']:.2f}  std {result['std']:.2f}  "
        f"min {result['min']:.2f}  max {result['max']:.2f}  (episode length mean {result['length_mean']:.1f})"
    )


def cmd_eval(args: argparse.Namespace) -> int:
    import gymnasium as gym

    if args.episodes < 1:
        print(f"aiorl eval: --episodes must be at least 1, got {args.episodes}", file=sys.stderr)
        return 2

    def progress(done, total, ret):
        print(
            f"\repisode {done}/{total}: return {ret:.1f}", end="" if done < total else "\n", file=sys.stderr, flush=True
        )

    try:
        result = evaluate_run(
            args.run_dir,
            args.episodes,
            args.seed,
            args.policy,
            progress if not args.json and sys.stderr.isatty() else None,
            args.checkpoint,
            args.video,
            args.render,
            args.which,
            args.trust_program,
        )
    except (EvalError, EvalOptionError, ConfigError) as exc:
        print(f"aiorl eval: {exc}", file=sys.stderr)
        return 2
    except gym.error.DependencyNotInstalled as exc:  # the env's renderer (--video, --render)
        print(f"aiorl eval: rendering needs a package: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(result) if args.json else format_result(result))
    return 0


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("eval", help="run a run's exported policy greedily and report returns")
    parser.add_argument("run_dir", help="run directory (holds config.yaml and policy/)")
    parser.add_argument("--episodes", type=int, default=20, help="episodes to run (default 20)")
    parser.add_argument("--seed", type=int, default=0, help="episode k is reset with seed SEED + k")
    chosen = parser.add_mutually_exclusive_group()
    chosen.add_argument(
        "--best",
        dest="which",
        action="store_const",
        const="best",
        help="the best policy the evaluations during training kept (RUN_DIR/policy/best/; "
        "the default when the run has one)",
    )
    chosen.add_argument(
        "--final",
        dest="which",
        action="store_const",
        const="final",
        help="the final policy, exported at shutdown (RUN_DIR/policy/)",
    )
    parser.add_argument(
        "--policy",
        help="policy file (policy.safetensors, with its policy.json beside it) to use instead of the run's "
        "best or final policy",
    )
    parser.add_argument(
        "--trust-program",
        action="store_true",
        help="allow loading a policy that is a program (a .pt2 or an older run's .pt) when there are no "
        "weights (policy.safetensors) beside it: this RUNS CODE FROM THE FILE; use it only on files you trust",
    )
    parser.add_argument(
        "--checkpoint",
        metavar="N",
        help="evaluate the checkpoint of learner step N (in RUN_DIR/checkpoints) or a checkpoint "
        "file, instead of the exported policy",
    )
    parser.add_argument(
        "--video", metavar="DIR", help="record every episode as an mp4 in DIR (needs: pip install 'aiorl[video]')"
    )
    parser.add_argument("--render", action="store_true", help="show the episodes in a window (human rendering)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(func=cmd_eval)
    return parser
