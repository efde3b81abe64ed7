"""Ray launcher overhead: the same config launched locally and with `--launcher ray`, in one run.

    python bench/ray_launcher.py [--seconds 12] [--repeats 2] [--actors 2] [--memories 2] [--json out.json]

Starts a 3-node Ray cluster on loopback (`ray.cluster_utils.Cluster`: a head and two worker
nodes on this machine), then runs `aiorl run` of one config (random_agent on CartPole-v1, the
pipeline bench's Ape-X shape: learner batch 512, samples_per_insert 1) alternately with the local
launcher and with the Ray launcher, each Ray run between two local runs. Per run it measures

- start-up: seconds from starting `aiorl run` to the first metrics row in phase RUNNING (the
  coordinator writes one every 0.2 s, so this is good to about 0.2 s), and
- throughput: env steps/s over the RUNNING rows but the first (as bench/pipeline.py does).

It prints a table and the median over repeats of ray / mean(local before, local after) for
each; writes JSON. The Ray cluster is shut down at the end, whatever happens. Needs the ray extra.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import common
from pipeline import LEARNER_BATCH, SAMPLE_BATCH

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # loopback only


def config(run_dir: Path, actors: int, memories: int, seconds: float, ray_address: str | None) -> dict:
    cluster = {"actors": actors, "memories": memories, "learners": 1}
    if ray_address is not None:
        cluster.update(launcher="ray", ray_address=ray_address)
    return {
        "algo": "random_agent",
        "env": {"id": "CartPole-v1", "num_envs": 1},
        "cluster": cluster,
        "agent": {
            "sample_batch_size": SAMPLE_BATCH,
            "batch_size": LEARNER_BATCH,
            "buffer_size": 100_000,
            "learning_starts": 1000,
            "samples_per_insert": 1.0,
        },
        "model": {"n_step": 3},
        "run": {"dir": str(run_dir), "max_seconds": seconds, "metrics_interval_s": 0.2},
    }


def measure(name: str, cfg: dict, seconds: float) -> dict:
    run_dir = Path(cfg["run"]["dir"])
    shutil.rmtree(run_dir, ignore_errors=True)
    started = time.monotonic()
    with common.Launch(cfg, run_dir, output=subprocess.PIPE) as launch:
        common.wait_for(lambda: not launch.running() or common.metrics_rows(run_dir, "RUNNING"), seconds + 300, 0.02)
        startup = time.monotonic() - started
        output, _ = launch.proc.communicate(timeout=seconds + 300)
    if launch.proc.returncode != 0:
        raise RuntimeError(f"{name}: aiorl run failed ({launch.proc.returncode}):\n{output}")
    running = common.metrics_rows(run_dir, "RUNNING")
    first, last = running[1], running[-1]
    rate = (last["env_steps"] - first["env_steps"]) / (last["time_s"] - first["time_s"])
    return {"startup_s": startup, "env_steps_per_s": rate}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=12.0, help="run.max_seconds of each run")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--actors", type=int, default=2)
    parser.add_argument("--memories", type=int, default=2)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    try:
        import ray
        from ray.cluster_utils import Cluster
    except ImportError:
        print("bench/ray_launcher.py needs Ray: pip install 'aiorl[ray]'", file=sys.stderr)
        return 2
    workdir = Path(tempfile.mkdtemp(prefix="aiorl-bench-ray-"))
    cluster = Cluster(
        initialize_head=True, head_node_args={"num_cpus": 4, "node_ip_address": "127.0.0.1", "include_dashboard": False}
    )
    try:
        for _ in range(2):
            cluster.add_node(num_cpus=4, node_ip_address="127.0.0.1")
        cluster.wait_for_nodes()
        n = [0]

        def run(kind: str) -> dict:
            n[0] += 1
            address = cluster.address if kind == "ray" else None
            cfg = config(workdir / f"run-{n[0]}", args.actors, args.memories, args.seconds, address)
            result = measure(f"{kind}-{n[0]}", cfg, args.seconds)
            print(
                f"  {kind:5s} start-up {result['startup_s']:6.2f} s   {result['env_steps_per_s']:9.0f} env steps/s",
                flush=True,
            )
            return {"launcher": kind, **result}

        print(
            f"aiorl run, random_agent CartPole-v1, {args.actors} actor(s), {args.memories} memory host(s), "
            f"1 learner, {args.seconds:g} s per run; Ray: 3 nodes on loopback"
        )
        locals_, rays = [run("local")], []
        for _ in range(args.repeats):
            rays.append(run("ray"))
            locals_.append(run("local"))
    finally:
        ray.shutdown()
        cluster.shutdown()
        shutil.rmtree(workdir, ignore_errors=True)
    ratios = {}
    for key in ("startup_s", "env_steps_per_s"):
        per = [r[key] / ((locals_[i][key] + locals_[i + 1][key]) / 2) for i, r in enumerate(rays)]
        ratios[key] = {"median": statistics.median(per), "each": per}
    print(f"\n{'':24s}{'local (median)':>16s}{'ray (median)':>14s}{'ray / local':>13s}")
    for key, label, fmt in (
        ("startup_s", "start-up to RUNNING, s", "{:.2f}"),
        ("env_steps_per_s", "env steps/s", "{:.0f}"),
    ):
        local = statistics.median(r[key] for r in locals_)
        ray_ = statistics.median(r[key] for r in rays)
        print(f"{label:24s}{fmt.format(local):>16s}{fmt.format(ray_):>14s}{ratios[key]['median']:>13.2f}")
    if args.json:
        common.write_json(args.json, {"local": locals_, "ray": rays, "ratios": ratios})
    return 0


if __name__ == "__main__":
    sys.exit(main())
