"""What recurrence costs: wire bytes per IMPALA fragment, replay bytes per R2D2 sequence and learner
steps/s, each recurrent example beside its feed-forward twin (the same config with
``model.recurrent: null``), in one run.

    python bench/recurrent_cost.py [--steps 20] [--repeats 3] [--json out.json] [EXAMPLE ...]

For each example (default: the recurrent IMPALA, DPPO and R2D2 examples) both models are built as the
roles build them (`make_actor`, `make_learner`, their torch threads and seed); each actor acts
with its learner's weights on the example's envs, and its rollouts become the learner's batch as
in a run: for IMPALA ``agent.batch_size`` rows of fragments, for DPPO one rollout from each of
``cluster.actors`` actors (one iteration's rows), for R2D2 ``agent.batch_size`` of the sequences its
actor cuts (a replay row each: its bytes are what the replay stores per sequence). The fragment
message is encoded with the wire's `Encoder` exactly as an actor sends it (``"fragment"``, its
meta), and its bytes divided by its fragments. Then each learner steps on its own batch ``--steps`` times (after one
unmeasured step); the two models alternate ``--repeats`` times and the table gives the median
steps/s of each and their ratio. A DPPO learner step is a whole iteration (every epoch over
every minibatch); an IMPALA step is one batch.
"""

from __future__ import annotations

import argparse
import statistics
import time

import common
import numpy as np
from common import ROOT

from aiorl.envs import EnvRunner
from aiorl.experiment.loading import load_config
from aiorl.runtime.algorithm import build_algorithm
from aiorl.wire.codec import Encoder, FrameType, Limits

DEFAULT = [
    "examples/impala_lstm_cartpole_novel.yaml",
    "examples/dppo_lstm_cartpole_novel.yaml",
    "examples/r2d2_cartpole_novel.yaml",
]
SEED = 0


def sequences(algo, cfg, weights) -> dict:
    """`agent.batch_size` R2D2 sequences (replay rows) of one actor acting on the example's envs."""
    actor = algo.make_actor(0, 1, SEED)
    actor.set_weights(weights, 0)
    runner = EnvRunner(cfg.env, cfg.env.num_envs, SEED)
    parts, rows = [], 0
    while rows < cfg.agent.batch_size:
        part = actor.postprocess(runner.rollout(actor.act, cfg.agent.sample_batch_size, actor.begin_episodes))[0]
        if part:
            parts.append(part)
            rows += len(part["reward"])
    runner.close()
    return {k: np.concatenate([p[k] for p in parts])[: cfg.agent.batch_size] for k in parts[0]}


def setup(example: str, recurrent: bool):
    """(learner, batch, fragment bytes or None, replay bytes per row or None) of `example`,
    recurrent or its twin."""
    import torch

    cfg = load_config(example, [] if recurrent else ["model.recurrent=null"])
    torch.set_num_threads(cfg.model.torch_threads)
    algo = build_algorithm(cfg)
    learner = algo.make_learner(0, 1, SEED)
    weights = learner.get_weights()
    if cfg.algo == "r2d2":
        batch = sequences(algo, cfg, weights)
        return learner, batch, None, sum(v.nbytes for v in batch.values()) / len(batch["reward"])
    E, T = cfg.env.num_envs, cfg.agent.sample_batch_size
    impala = algo.fragment_queue(cfg) is not None
    # IMPALA: fragments enough for one learner batch; DPPO: one rollout per actor.
    actors = -(-cfg.agent.batch_size // (E * T)) if impala else cfg.cluster.actors
    parts, per_fragment = [], None
    for a in range(actors):
        actor = algo.make_actor(a, cfg.cluster.actors, SEED + a)
        actor.set_weights(weights, 0)
        runner = EnvRunner(cfg.env, E, SEED + a)
        rows = actor.postprocess(runner.rollout(actor.act, T, actor.begin_episodes))[0]
        runner.close()
        if impala and per_fragment is None:
            meta = {"seq": 0, "weights_version": 0}
            _, total = Encoder(Limits()).encode(FrameType.DATA, "fragment", meta, rows)
            per_fragment = total / len(next(iter(rows.values())))
        parts.append(rows)
    batch = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    if impala:
        batch = {k: v[: cfg.agent.batch_size // T] for k, v in batch.items()}
        batch["weights_version"] = np.zeros(len(batch["obs"]), np.int64)
    return learner, batch, per_fragment, None


def steps_per_s(learner, batch, steps: int) -> float:
    t0 = time.perf_counter()
    for _ in range(steps):
        learner.step(batch)
    return steps / (time.perf_counter() - t0)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("examples", nargs="*", default=DEFAULT)
    parser.add_argument("--steps", type=int, default=20, help="learner steps per measurement")
    parser.add_argument("--repeats", type=int, default=3, help="alternating (recurrent, feed-forward) measurements")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)
    results = []
    print("bytes/item: wire bytes per IMPALA fragment, replay bytes per R2D2 sequence (DPPO: none)")
    print(
        f"{'example':<40} {'bytes/item rec':>18} {'ff':>8} {'ratio':>6} {'steps/s rec':>11} {'ff':>8} {'ratio':>6}",
        flush=True,
    )
    for example in args.examples:
        both = {name: setup(str(ROOT / example), name == "recurrent") for name in ("recurrent", "feed_forward")}
        rates: dict[str, list[float]] = {name: [] for name in both}
        for learner, batch, *_ in both.values():
            learner.step(batch)  # first step: allocations, lazy inits
        for _ in range(args.repeats):
            for name, (learner, batch, *_) in both.items():
                rates[name].append(steps_per_s(learner, batch, args.steps))
        rec, ff = (statistics.median(rates[n]) for n in ("recurrent", "feed_forward"))
        b_rec, b_ff = both["recurrent"][2], both["feed_forward"][2]
        r_rec, r_ff = both["recurrent"][3], both["feed_forward"][3]
        row = {
            "example": example,
            "bytes_per_fragment": {"recurrent": b_rec, "feed_forward": b_ff},
            "replay_bytes_per_sequence": {"recurrent": r_rec, "feed_forward": r_ff},
            "learner_steps_per_s": {"recurrent": rec, "feed_forward": ff},
            "all_steps_per_s": rates,
            "steps_per_s_ratio": rec / ff,
        }
        results.append(row)
        b_rec, b_ff = (b_rec, b_ff) if b_rec else (r_rec, r_ff)  # R2D2: its replay rows' bytes instead
        wire = f"{b_rec:>18.0f} {b_ff:>8.0f} {b_rec / b_ff:>6.2f}" if b_rec else f"{'-':>18} {'-':>8} {'-':>6}"
        print(f"{example:<40} {wire} {rec:>11.2f} {ff:>8.2f} {rec / ff:>6.3f}", flush=True)
    if args.json:
        common.write_json(args.json, results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
