"""Replay snapshot benchmark: the longest pause in sampling that a snapshot causes.

A memory host's loop samples a prioritized CartPole replay (Ape-X DQN's
transition spec) as fast as it can and updates priorities, as it does for a
learner; meanwhile `aiorl.runtime.snapshot.ReplaySnapshots` saves the shard
(copy on the loop, write in a worker thread). The figure is the longest gap
between two samples while snapshots run, against the longest gap of the same
loop without snapshots, measured in the same run (alternating rounds).

    python bench/snapshot.py --size 1000000 --json out.json
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import tempfile
import time
from pathlib import Path

import common
import numpy as np

from aiorl.replay import PrioritizedReplayBuffer
from aiorl.runtime.snapshot import ReplaySnapshots

SPEC = {
    "obs": ((4,), "<f4"),
    "action": ((), "<i8"),
    "reward": ((), "<f4"),
    "next_obs": ((4,), "<f4"),
    "done": ((), "|b1"),
    "discount": ((), "<f4"),
}


def filled(size: int, seed: int = 0) -> PrioritizedReplayBuffer:
    rng = np.random.default_rng(seed)
    replay = PrioritizedReplayBuffer(size, SPEC, alpha=0.6, seed=seed)
    chunk = 65_536
    for start in range(0, size, chunk):
        n = min(chunk, size - start)
        replay.add(
            {
                "obs": rng.standard_normal((n, 4), np.float32),
                "action": rng.integers(0, 2, n),
                "reward": np.ones(n, np.float32),
                "next_obs": rng.standard_normal((n, 4), np.float32),
                "done": rng.random(n) < 0.01,
                "discount": np.full(n, 0.97, np.float32),
            },
            rng.random(n) + 0.1,
        )
    return replay


async def sample_gaps(replay, seconds: float, batch: int, during=None) -> tuple[float, int]:
    """Sample (and update priorities) for `seconds`; the longest gap between samples and the count.
    `during` (a coroutine function) runs alongside, e.g. snapshots."""
    rng = np.random.default_rng(1)
    stop = time.perf_counter() + seconds
    task = asyncio.create_task(during()) if during else None
    gap_max, count, last = 0.0, 0, time.perf_counter()
    while time.perf_counter() < stop or (task is not None and not task.done()):
        out = replay.sample(batch, 0.4)
        replay.update_priorities(out["indices"], rng.random(batch) + 0.1, out["generations"])
        await asyncio.sleep(0)  # a loop serving connections yields between batches
        now = time.perf_counter()
        gap_max, last, count = max(gap_max, now - last), now, count + 1
    if task is not None:
        await task
    return gap_max, count


async def main_async(args) -> dict:
    logging.basicConfig(level=logging.WARNING)
    t0 = time.perf_counter()
    replay = filled(args.size)
    fill_s = time.perf_counter() - t0
    rows = []
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        snapshots = ReplaySnapshots(Path(tmp) / "replay-memory-0.npz", logging.getLogger("bench"))
        for r in range(args.rounds):
            ref_gap, ref_n = await sample_gaps(replay, args.seconds, args.batch)
            before = snapshots.pause_max_s
            snapshots.pause_max_s = 0.0
            t_snap = time.perf_counter()

            async def snapshot():
                await snapshots.save(replay)

            snap_gap, snap_n = await sample_gaps(replay, args.seconds, args.batch, during=snapshot)
            rows.append(
                {
                    "round": r,
                    "reference_gap_max_s": ref_gap,
                    "snapshot_gap_max_s": snap_gap,
                    "copy_pause_s": snapshots.pause_max_s,
                    "reference_samples": ref_n,
                    "snapshot_samples": snap_n,
                    "snapshot_wall_s": time.perf_counter() - t_snap,
                }
            )
            snapshots.pause_max_s = max(before, snapshots.pause_max_s)
        size_mb = (Path(tmp) / "replay-memory-0.npz").stat().st_size / 1e6
    return {
        "size": args.size,
        "batch": args.batch,
        "fill_s": round(fill_s, 2),
        "file_mb": round(size_mb, 1),
        "rows": rows,
        "snapshot_gap_max_s": max(r["snapshot_gap_max_s"] for r in rows),
        "reference_gap_max_s": max(r["reference_gap_max_s"] for r in rows),
        "copy_pause_max_s": max(r["copy_pause_s"] for r in rows),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", type=int, default=1_000_000, help="transitions in the replay")
    parser.add_argument("--batch", type=int, default=64, help="rows per sample")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds (reference, snapshot)")
    parser.add_argument("--seconds", type=float, default=3.0, help="sampling time per half round")
    parser.add_argument("--dir", default=None, help="where to write the snapshots (default: the temp dir)")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)
    result = asyncio.run(main_async(args))
    print(
        f"replay of {result['size']:,} CartPole transitions (filled in {result['fill_s']} s); "
        f"snapshot file {result['file_mb']} MB"
    )
    print(f"{'round':>5} {'ref gap max s':>14} {'snapshot gap max s':>19} {'copy pause s':>13} {'snapshot s':>11}")
    for row in result["rows"]:
        print(
            f"{row['round']:>5} {row['reference_gap_max_s']:>14.4f} {row['snapshot_gap_max_s']:>19.4f} "
            f"{row['copy_pause_s']:>13.4f} {row['snapshot_wall_s']:>11.2f}"
        )
    ratio = result["snapshot_gap_max_s"] / max(result["reference_gap_max_s"], 1e-9)
    print(
        f"longest pause in sampling during a snapshot: {result['snapshot_gap_max_s']:.3f} s "
        f"({ratio:.1f}x the longest gap without one); the copy itself: {result['copy_pause_max_s']:.3f} s"
    )
    if args.json:
        common.write_json(args.json, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
