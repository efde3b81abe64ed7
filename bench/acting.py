"""Acting benchmark: an actor's env steps/s with each example's acting policy, beside the same
envs stepped with random actions, in one run.

    python bench/acting.py [--num-envs 8] [--seconds 3] [--repeats 3] [--json out.json] [EXAMPLE ...]

For each example (default: every `examples/*.yaml` whose actors step a vector of envs), the
actor's policy is built as an actor process builds it (`make_actor`, its torch threads and seed)
and drives `EnvRunner.rollout` for ``agent.sample_batch_size`` steps at a time; the reference is
the same runner type on envs of the same config, with actions drawn uniformly by numpy (one call
per step for the whole vector, the least an actor can spend choosing actions). Each policy run
sits between two random runs and is compared with their mean; the median over --repeats is
reported. The rollout is what is timed: turning it into replay rows (n-step, initial priorities,
fragments) is the same work for any action source and is left out. Where the policy acts
through a numpy forward (`aiorl.algos.lib.numpy_forward`), the last column is the same policy
forced onto its torch module, against random actions measured right after it.

ES's actors evaluate whole episodes of perturbed parameters inside their work items (numpy, one
observation at a time); they have no vector to act on, so ES examples are listed as such.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import common
import numpy as np
from common import ROOT

# Acceptance figure of the acting path: the Ape-X DQN CartPole policy at 8 envs per actor.
TARGET = ("apex_dqn_cartpole", 0.5)


def _build(example: Path, num_envs: int, seed: int):
    from aiorl.envs import EnvRunner
    from aiorl.experiment.loading import load_config
    from aiorl.runtime.algorithm import build_algorithm

    cfg = load_config(example)
    algo = build_algorithm(cfg)
    if algo.is_synchronous(cfg) and algo.work_items(cfg) is not None:
        return cfg, None, None
    cfg = load_config(example, [f"env.num_envs={num_envs}"])
    algo = build_algorithm(cfg)
    policy = algo.make_actor(0, cfg.cluster.actors, seed)
    runner = EnvRunner(cfg.env, num_envs, seed)
    return cfg, policy, runner


def _random_actions(space, num_envs: int, seed: int):
    import gymnasium as gym

    rng = np.random.default_rng(seed)
    if isinstance(space, gym.spaces.Discrete):
        n, start = int(space.n), int(space.start)
        return lambda obs: rng.integers(start, start + n, size=num_envs)
    low, high = np.broadcast_to(space.low, space.shape), np.broadcast_to(space.high, space.shape)
    return lambda obs: rng.uniform(low, high, size=(num_envs, *space.shape)).astype(space.dtype)


def _rate(runner, act, steps: int, seconds: float, after=None) -> float:
    start = runner.env_steps
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        runner.rollout(act, steps)
        if after is not None:
            after()
    return (runner.env_steps - start) / (time.perf_counter() - t0)


def measure(example: Path, num_envs: int, seconds: float, repeats: int) -> dict:
    cfg, policy, runner = _build(example, num_envs, seed=0)
    name = example.stem
    if policy is None:
        return {"example": name, "num_envs": num_envs, "note": "work items: no vector of envs to act on"}
    steps = cfg.agent.sample_batch_size
    space = runner.envs.envs[0].action_space if hasattr(runner.envs, "envs") else None
    if space is None:
        return {"example": name, "num_envs": num_envs, "note": "not a Gymnasium vector: skipped"}
    random_act = _random_actions(space, num_envs, seed=1)

    def forget():  # the steps a policy keeps for its fragments are dropped unread
        if hasattr(policy, "steps"):
            policy.steps.clear()

    _rate(runner, policy.act, steps, min(0.5, seconds), forget)  # warm: first calls, allocator
    _rate(runner, random_act, steps, min(0.5, seconds))
    ratios, policy_rates, random_rates = [], [], []
    before = _rate(runner, random_act, steps, seconds)
    for _ in range(repeats):
        rate = _rate(runner, policy.act, steps, seconds, forget)
        after = _rate(runner, random_act, steps, seconds)
        reference = (before + after) / 2
        ratios.append(rate / reference)
        policy_rates.append(rate)
        random_rates.append(reference)
        before = after
    torch_ratio = None
    if getattr(policy, "fast", None) is not None:  # the same policy acting through torch, for comparison
        fast, policy.fast = policy.fast, None
        rate = _rate(runner, policy.act, steps, seconds, forget)
        torch_ratio = rate / _rate(runner, random_act, steps, seconds)
        policy.fast = fast
    runner.close()
    return {
        "numpy_forward": getattr(policy, "fast", None) is not None,
        "torch_ratio": torch_ratio,
        "example": name,
        "num_envs": num_envs,
        "env": cfg.env.id,
        "acting": type(policy).__name__,
        "policy_steps_per_s": statistics.median(policy_rates),
        "random_steps_per_s": statistics.median(random_rates),
        "ratio": statistics.median(ratios),
        "ratios": ratios,
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("examples", nargs="*", type=Path, help="example configs (default: examples/*.yaml)")
    parser.add_argument("--num-envs", type=int, default=8, help="envs per actor (default 8)")
    parser.add_argument("--seconds", type=float, default=3.0, help="seconds per measurement (default 3)")
    parser.add_argument("--repeats", type=int, default=3, help="policy runs per example (default 3)")
    parser.add_argument("--json", type=Path, help="write the rows here")
    args = parser.parse_args(argv)
    examples = args.examples or sorted((ROOT / "examples").glob("*.yaml"))
    rows = []
    for example in examples:
        print(f"measuring {example.stem} ({args.num_envs} envs) ...", file=sys.stderr, flush=True)
        try:
            rows.append(measure(example, args.num_envs, args.seconds, args.repeats))
        except ImportError as exc:  # e.g. Atari examples without the atari extra
            rows.append({"example": example.stem, "num_envs": args.num_envs, "note": f"skipped: {exc}"})
    print(
        f"{'example':<26} {'acting policy':<14} {'forward':<8} {'policy steps/s':>15} {'random steps/s':>15} "
        f"{'ratio':>6}  {'ratios':<15} {'torch path':>10}"
    )
    for r in rows:
        if "note" in r:
            print(f"{r['example']:<26} {r['note']}")
            continue
        spread = " ".join(f"{x:.2f}" for x in r["ratios"])
        forward = "numpy" if r["numpy_forward"] else "torch"
        torch_path = "" if r["torch_ratio"] is None else f"{r['torch_ratio']:.2f}"
        print(
            f"{r['example']:<26} {r['acting']:<14} {forward:<8} {r['policy_steps_per_s']:>15,.0f} "
            f"{r['random_steps_per_s']:>15,.0f} {r['ratio']:>6.2f}  {spread:<15} {torch_path:>10}"
        )
    name, target = TARGET
    hit = [r for r in rows if r["example"] == name and "ratio" in r and r["num_envs"] == 8]
    if hit:
        verdict = "met" if hit[0]["ratio"] >= target else "MISSED"
        print(f"target {name} policy/random >= {target} at 8 envs: {hit[0]['ratio']:.2f} {verdict}")
    if args.json:
        common.write_json(args.json, rows, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
