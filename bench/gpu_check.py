"""GPU check: the Pong learner (Ape-X DQN, Nature CNN) on CUDA for a fixed number of steps.

    bash bench/gpu_check.sh                       # on a machine with an NVIDIA GPU (exit 0: passed)
    python bench/gpu_check.py --device cpu --steps 20 --batch 8 --transitions 400   # a dry run of the logic

Fills a frame-layout replay with Pong transitions (atari preset, random actions, through
the actor's real FrameSender and n-step), then runs `--steps` learner steps with
`model.device` set to `--device`, prioritized sampling and priority updates as a memory
host and learner do. The target network is not synced during the check, so the TD loss
on a fixed batch (measured every `--steps // 10` steps) must fall: the check fails unless
every loss is finite and the last is below `--max-final-ratio` times the first. Prints
learner steps/s and samples/s (after `--warmup` steps; CUDA synchronised around the
timing). Fails loudly, exit 1, when `--device` asks for CUDA and torch sees none.
"""

from __future__ import annotations

import argparse
import sys
import time

import common


class CheckFailed(Exception):
    """The check failed: the message says why."""


def fail(message: str) -> int:
    print(f"gpu_check: FAILED: {message}", file=sys.stderr, flush=True)
    return 1


def parse_args(argv) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda", help="learner device (default cuda)")
    parser.add_argument("--steps", type=int, default=1000, help="learner steps (default 1000)")
    parser.add_argument("--batch", type=int, default=512, help="learner batch (default 512, the Ape-X paper's)")
    parser.add_argument("--transitions", type=int, default=20000, help="transitions in replay (default 20000)")
    parser.add_argument("--warmup", type=int, default=20, help="steps left out of the timing")
    parser.add_argument(
        "--max-final-ratio",
        type=float,
        default=0.9,
        help="the last fixed-batch loss must be below this times the first",
    )
    parser.add_argument("--json", default=None, help="also write the results here")
    return parser.parse_args(argv)


def pong_learner(args, envs: int):
    """The Ape-X DQN Pong config on `--device` and its algorithm; CheckFailed when the host cannot run it."""
    from aiorl.config import ConfigError
    from aiorl.experiment.loading import load_config
    from aiorl.runtime.algorithm import build_algorithm

    try:
        cfg = load_config(
            data={
                "algo": "apex_dqn",
                "env": {"id": "ALE/Pong-v5", "preset": "atari", "num_envs": envs},
                "agent": {
                    "sample_batch_size": 50,
                    "batch_size": args.batch,
                    "buffer_size": args.transitions,
                    "learning_starts": min(1000, args.transitions),
                },
                "model": {"device": args.device, "sync_target_frequency": args.steps + 1, "torch_threads": 1},
            }
        )
        algo = build_algorithm(cfg)
        algo.check_learner_host(cfg)
    except ConfigError as exc:
        raise CheckFailed(str(exc)) from exc
    return cfg, algo


def filled_replay(args, cfg, algo, envs: int):
    """A frame-layout replay of `--transitions` Pong transitions, through the actor's FrameSender and n-step."""
    from aiorl.envs import EnvRunner
    from aiorl.replay.frame_sender import FrameSender
    from aiorl.replay.frames import FrameReplayBuffer, frame_layout

    t0 = time.perf_counter()
    layout = frame_layout(cfg, algo)
    sender = FrameSender(layout, envs, 1, algo.lookback_steps())
    actor = algo.make_actor(0, 1, seed=0)
    actor.decode_observations = sender.decode
    runner = EnvRunner(cfg.env, envs, seed=0, frames=sender)
    replay = FrameReplayBuffer(args.transitions, algo.transition_spec(), layout, alpha=0.6, seed=0)
    stream = replay.stream()
    while len(replay) < args.transitions:
        rows, priorities = actor.postprocess(runner.rollout(actor.act, 50))
        rows = {k: v[: args.transitions - len(replay)] for k, v in rows.items()}
        arrays, keep_from = sender.message(0, rows)
        replay.add(arrays, priorities[: len(rows["reward"])], stream=stream, keep_from=keep_from)
    runner.close()
    fill_s = time.perf_counter() - t0
    print(f"gpu_check: {len(replay)} Pong transitions in replay ({fill_s:.0f} s); learner on {args.device}", flush=True)
    return replay


def train(args, algo, replay) -> tuple[list, float, str]:
    """`--steps` learner steps: the fixed-batch losses by step, learner steps/s after the warm-up,
    the device's name. CheckFailed on a loss that is not finite."""
    import numpy as np
    import torch

    from aiorl.algos.apex_dqn import n_step_q_target
    from aiorl.algos.lib.common import td_loss

    learner = algo.make_learner(0, 1, seed=0)
    device = learner.device
    fixed_batch = replay.sample(min(len(replay), 1024), 0.4)  # the same rows at every measurement

    @torch.no_grad()
    def fixed_loss() -> float:
        obs, next_obs, action, reward, discount, _ = learner.tensors(fixed_batch, torch.int64)
        q = learner.online(obs).gather(1, action[:, None]).squeeze(1)
        y = n_step_q_target(reward, discount, learner.target(next_obs), learner.online(next_obs))
        return float(td_loss(y - q, torch.ones_like(q), algo.cfg.model.loss, algo.cfg.model.huber_delta))

    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    losses = [(0, fixed_loss())]
    every = max(1, args.steps // 10)
    start = None
    for step in range(1, args.steps + 1):
        if step == args.warmup + 1:
            sync()
            start = time.perf_counter()
        sampled = replay.sample(args.batch, 0.4)
        result = learner.step(sampled)
        replay.update_priorities(sampled["indices"], result.priorities, sampled["generations"])
        if not np.isfinite(result.metrics["losses/td_loss"]):
            raise CheckFailed(f"learner step {step}: loss {result.metrics['losses/td_loss']} is not finite")
        if step % every == 0:
            losses.append((step, fixed_loss()))
    sync()
    timed = args.steps - args.warmup
    elapsed = time.perf_counter() - start if start is not None else float("nan")
    steps_per_s = timed / elapsed if timed > 0 else float("nan")
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(
        f"gpu_check: {name}: {steps_per_s:.2f} learner steps/s, {steps_per_s * args.batch:,.0f} samples/s "
        f"(batch {args.batch}, {timed} timed steps)"
    )
    return losses, steps_per_s, name


def check_losses(losses: list, max_final_ratio: float) -> None:
    """CheckFailed unless every fixed-batch loss is finite and the last below `max_final_ratio` x the first."""
    import numpy as np

    values = [v for _, v in losses]
    if not all(np.isfinite(values)):
        raise CheckFailed(f"a fixed-batch loss is not finite: {values}")
    if not values[-1] < max_final_ratio * values[0]:
        raise CheckFailed(
            f"the fixed-batch loss did not fall: {values[0]:.5f} -> {values[-1]:.5f} "
            f"(needed below {max_final_ratio} x the first)"
        )


def main(argv=None) -> int:
    args = parse_args(argv)

    import torch

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        return fail(
            f"--device {args.device}: torch {torch.__version__} sees no CUDA device "
            f"(CUDA build: {torch.version.cuda or 'none'}); this check needs an NVIDIA GPU"
        )
    envs = 8
    try:
        cfg, algo = pong_learner(args, envs)
        replay = filled_replay(args, cfg, algo, envs)
        losses, steps_per_s, name = train(args, algo, replay)
    except CheckFailed as exc:
        return fail(str(exc))
    print("gpu_check: fixed-batch TD loss by step: " + ", ".join(f"{s}: {v:.5f}" for s, v in losses))
    result = {
        "device": name,
        "batch": args.batch,
        "steps": args.steps,
        "steps_per_s": steps_per_s,
        "samples_per_s": steps_per_s * args.batch,
        "fixed_batch_loss": losses,
    }
    if args.json:
        common.write_json(args.json, result)
    try:
        check_losses(losses, args.max_final_ratio)
    except CheckFailed as exc:
        return fail(str(exc))
    values = [v for _, v in losses]
    print(f"gpu_check: passed (loss {values[0]:.5f} -> {values[-1]:.5f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
