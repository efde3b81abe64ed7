"""d3rlpy's side of `bench/offline.py`, run by it in the d3rlpy venv (d3rlpy pins a gymnasium that
aiorl's venv does not have): ``python bench/offline_peer/d3rlpy_worker.py JOB.json RESULT.json``.

The job names the dataset (a .npz with observations, actions, rewards, terminals, timeouts, and
the action bounds of a Box space), the d3rlpy algorithm and its config, the gradient steps, the
evaluation grid and the threshold. Training is d3rlpy's own `update` on its own
`sample_transition_batch`, `eval_every` steps at a time; after each chunk the greedy policy plays
`episodes.greedy_returns` (the same episodes and seeds as aiorl's side). Times are seconds since
the parent launched this process (``job["launched"]``, time.time()), the evaluations' own time left
out, so that they count the interpreter, the imports and the dataset load as aiorl's launch does.

Only numpy, torch, gymnasium and d3rlpy are imported (no aiorl)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np
from episodes import greedy_returns


def load_dataset(path: str):
    """The .npz as a d3rlpy MDPDataset, and the action bounds (None: Discrete)."""
    from d3rlpy.constants import ActionSpace
    from d3rlpy.dataset import MDPDataset

    data = np.load(path)
    discrete = data["actions"].ndim == 1
    bounds = None if discrete else (data["action_low"], data["action_high"])
    dataset = MDPDataset(
        observations=data["observations"],
        actions=data["actions"].reshape(-1, 1) if discrete else data["actions"],
        rewards=data["rewards"].astype(np.float32),
        terminals=data["terminals"].astype(np.float32),
        timeouts=data["timeouts"].astype(np.float32),
        action_space=ActionSpace.DISCRETE if discrete else ActionSpace.CONTINUOUS,
        action_size=int(data["action_size"]),
    )
    return dataset, bounds


def build(job: dict, bounds):
    """The d3rlpy algorithm of the job: its config class with the job's params, an MLP of the job's
    hidden units (per encoder field, or "default") for every encoder it has, its optimizers (Adam
    with the job's fields) and reward scale, and a min-max action scaler for a Box space (d3rlpy's
    policies act in [-1, 1])."""
    import dataclasses

    import d3rlpy

    config_cls = getattr(d3rlpy.algos, job["algo"] + "Config")
    kwargs = dict(job["params"])
    for key, value in job["params"].items():
        if key.endswith("optim_factory"):
            kwargs[key] = d3rlpy.optimizers.AdamFactory(**value)
        elif key == "reward_scaler":
            kwargs[key] = d3rlpy.preprocessing.MultiplyRewardScaler(value["multiply"])
    hidden = job["hidden"]  # {encoder field: units}, "default" for the fields not named
    for field in dataclasses.fields(config_cls):
        if field.name.endswith("encoder_factory"):
            units = list(hidden.get(field.name, hidden["default"]))
            kwargs[field.name] = d3rlpy.models.VectorEncoderFactory(hidden_units=units, activation="relu")
    if bounds is not None:
        kwargs["action_scaler"] = d3rlpy.preprocessing.MinMaxActionScaler(minimum=bounds[0], maximum=bounds[1])
    return config_cls(**kwargs).create(device=False)


def train(job: dict) -> dict:
    import d3rlpy
    import torch

    torch.set_num_threads(int(job["threads"]))
    d3rlpy.seed(int(job["seed"]))
    launched = float(job["launched"])
    dataset, bounds = load_dataset(job["data"])
    algo = build(job, bounds)
    algo.build_with_dataset(dataset)
    batch_size = int(job["params"]["batch_size"])
    eval_spent = 0.0  # seconds spent evaluating: left out of every time below
    points, reached, steps = [], None, 0
    print(f"d3rlpy {d3rlpy.__version__} {job['algo']}: {len(dataset.episodes)} episodes", flush=True)
    while steps < job["steps"]:
        for _ in range(min(job["eval_every"], job["steps"] - steps)):
            algo.update(dataset.sample_transition_batch(batch_size))
            steps += 1
        now = time.time()
        seconds = now - launched - eval_spent
        score = greedy_returns(job["env"], algo.predict, job["eval_episodes"], job["eval_seed"])
        eval_spent += time.time() - now
        point = {"steps": steps, "seconds": round(seconds, 3), "eval_mean": score["mean"], "eval_std": score["std"]}
        points.append(point)
        print(f"  {steps:>8} {seconds:>8.1f} s {score['mean']:>9.1f} +- {score['std']:.1f}", flush=True)
        if reached is None and job["threshold"] is not None and score["mean"] >= job["threshold"]:
            reached = point
            if job.get("stop_at_threshold"):
                break
    return {
        "library": "d3rlpy",
        "version": d3rlpy.__version__,
        "algo": job["algo"],
        "steps": steps,
        "points": points,
        "reached": reached,
        "final": points[-1] if points else None,
        "total_s": round(points[-1]["seconds"], 3) if points else None,
        "eval_s": round(eval_spent, 3),
    }


def main(argv: list[str]) -> int:
    job = json.loads(Path(argv[0]).read_text())
    Path(argv[1]).write_text(json.dumps(train(job), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
