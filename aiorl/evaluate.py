"""`aiorl eval RUN_DIR`: run a run's exported policy greedily and report its returns.

The policy is the TorchScript file learner 0 exports at shutdown
(``RUN_DIR/policy/policy.pt``), mapping an observation batch to actions; the
environment is the run's own (``RUN_DIR/config.yaml``). Episode k is reset
with seed ``S + k``, so two evaluations with the same seed see the same
episodes.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from pathlib import Path

import numpy as np

from aiorl.config import ConfigError, EnvConfig, load_config

POLICY_PATH = Path("policy") / "policy.pt"


class EvalError(RuntimeError):
    """The run directory has no usable policy or config."""


def load_policy(path: str | Path):
    import torch

    path = Path(path)
    if not path.is_file():
        raise EvalError(f"no exported policy at {path}; learner 0 exports it when a run shuts down")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # TorchScript: see aiorl/algos/_common.py
        return torch.jit.load(str(path), map_location="cpu").eval()


def run_episodes(policy, env_cfg: EnvConfig, episodes: int, seed: int, progress=None) -> dict:
    """Run `episodes` greedy episodes of `policy` (obs batch -> action batch)."""
    import torch

    from aiorl.envs import make_env

    env = make_env(env_cfg, evaluation=True)  # the preset's evaluation variant: full games, raw rewards
    returns, lengths = [], []
    try:
        discrete = hasattr(env.action_space, "n")
        for k in range(episodes):
            obs, _ = env.reset(seed=seed + k)
            total, length, done = 0.0, 0, False
            while not done:
                with torch.no_grad():
                    action = policy(torch.as_tensor(np.asarray(obs)[None]))[0].numpy()
                action = int(action) if discrete else action.reshape(env.action_space.shape)
                obs, reward, terminated, truncated, _ = env.step(action)
                total += float(reward)
                length += 1
                done = terminated or truncated
            returns.append(total)
            lengths.append(length)
            if progress is not None:
                progress(k + 1, episodes, total)
    finally:
        env.close()
    return summarize(returns, lengths)


def summarize(returns: list[float], lengths: list[int]) -> dict:
    r = np.asarray(returns, np.float64)
    return {"episodes": len(returns), "mean": float(r.mean()), "std": float(r.std()), "min": float(r.min()),
            "max": float(r.max()), "length_mean": float(np.mean(lengths)), "returns": returns,
            "lengths": lengths}


def evaluate_run(run_dir: str | Path, episodes: int = 20, seed: int = 0, policy_path: str | Path | None = None,
                 progress=None) -> dict:
    import torch

    torch.set_num_threads(1)  # one observation at a time: extra threads only cost
    run_dir = Path(run_dir)
    config_path = run_dir / "config.yaml"
    if not config_path.is_file():
        raise EvalError(f"{run_dir} is not a run directory (no config.yaml)")
    cfg = load_config(config_path)
    path = Path(policy_path) if policy_path else run_dir / POLICY_PATH
    from aiorl.policy_check import load_checked

    policy = load_checked(path, cfg.env)
    t0 = time.perf_counter()
    result = run_episodes(policy, cfg.env, episodes, seed, progress)
    return {"run_dir": str(run_dir), "policy": str(path), "algo": cfg.algo, "env": cfg.env.id, "seed": seed,
            **result, "seconds": round(time.perf_counter() - t0, 3)}


def format_result(result: dict) -> str:
    return (f"{result['env']}: {result['episodes']} episodes (seed {result['seed']}) with {result['policy']}\n"
            f"return mean {result['mean']:.2f}  std {result['std']:.2f}  "
            f"min {result['min']:.2f}  max {result['max']:.2f}  (episode length mean {result['length_mean']:.1f})")


def cmd_eval(args: argparse.Namespace) -> int:
    if args.episodes < 1:
        print(f"aiorl eval: --episodes must be at least 1, got {args.episodes}", file=sys.stderr)
        return 2

    def progress(done, total, ret):
        print(f"\repisode {done}/{total}: return {ret:.1f}", end="" if done < total else "\n",
              file=sys.stderr, flush=True)

    try:
        result = evaluate_run(args.run_dir, args.episodes, args.seed, args.policy,
                              progress if not args.json and sys.stderr.isatty() else None)
    except (EvalError, ConfigError) as exc:
        print(f"aiorl eval: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(result) if args.json else format_result(result))
    return 0


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("eval", help="run a run's exported policy greedily and report returns")
    parser.add_argument("run_dir", help="run directory (holds config.yaml and policy/policy.pt)")
    parser.add_argument("--episodes", type=int, default=20, help="episodes to run (default 20)")
    parser.add_argument("--seed", type=int, default=0, help="episode k is reset with seed SEED + k")
    parser.add_argument("--policy", help="TorchScript policy to use instead of RUN_DIR/policy/policy.pt")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(func=cmd_eval)
    return parser
