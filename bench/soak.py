"""Soak: a long Ape-X run with every role local; each role's resident memory over time.

Runs ``aiorl run CONFIG`` for ``--minutes`` (``run.max_seconds``, no other stop
criterion; checkpoints on as by default), samples the RSS of every role
process (from the run's ``pids.json``) every ``--every-s`` seconds, and fits
a line to each role's samples after ``--warmup-s`` (replay filling up, first
checkpoints, allocator arenas settling). A role whose slope is 1 MB per
minute or more fails the soak. The reference in the same run is each role's
RSS at the end of the warm-up: the table shows how far it moved since.

    python bench/soak.py --minutes 10 --json soak.json
"""

from __future__ import annotations

import argparse
import subprocess
import tempfile
import time
from pathlib import Path

import common
import numpy as np
import psutil
from common import ROOT

LIMIT_MB_PER_MIN = 1.0


def rss_mb(pid: int) -> float | None:
    try:
        process = psutil.Process(pid)
        if process.status() == psutil.STATUS_ZOMBIE:
            return None
        return process.memory_info().rss / 2**20
    except psutil.Error:
        return None


def slope_mb_per_min(samples: list[tuple[float, float]]) -> float | None:
    if len(samples) < 3:
        return None
    t, m = np.array(samples).T
    return float(np.polyfit(t / 60.0, m, 1)[0])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=str(ROOT / "examples" / "apex_dqn_cartpole.yaml"))
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--warmup-s", type=float, default=120.0)
    parser.add_argument("--every-s", type=float, default=10.0)
    parser.add_argument("--set", action="append", default=[], metavar="KEY.PATH=VALUE")
    parser.add_argument("--run-dir", help="run directory (default: a fresh temporary one)")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)
    run_dir = Path(args.run_dir) if args.run_dir else Path(tempfile.mkdtemp(prefix="aiorl-soak-")) / "run"
    seconds = args.minutes * 60
    sets = [
        f"run.dir={run_dir}",
        f"run.max_seconds={seconds}",
        "agent.scheduled_global_steps=null",
        "agent.scheduled_timesteps=null",
        *args.set,
    ]
    print(f"$ {' '.join(common.aiorl_run_command(args.config, sets))}", flush=True)
    samples: dict[str, list[tuple[float, float]]] = {}
    t0 = time.monotonic()
    with common.Launch(args.config, run_dir, sets, output=subprocess.PIPE) as launch:
        proc = launch.proc
        while proc.poll() is None:
            now = time.monotonic() - t0
            # RSS is sampled while the run is RUNNING only
            if (run_dir / "pids.json").exists() and common.last_metrics_row(run_dir).get("phase") == "RUNNING":
                for name, pid in {**launch.pids(), "launcher": proc.pid}.items():
                    mb = rss_mb(pid)
                    if mb is not None:
                        samples.setdefault(name, []).append((now, mb))
                if samples and int(now) % 60 < args.every_s:
                    line = "  ".join(f"{n} {s[-1][1]:.0f}" for n, s in sorted(samples.items()))
                    print(f"[{now:6.0f} s] RSS MB: {line}", flush=True)
            time.sleep(args.every_s)
        out = proc.stdout.read()
    print(out.strip().splitlines()[-1] if out.strip() else "(no output)")
    rows = []
    for name, points in sorted(samples.items()):
        after = [(t, m) for t, m in points if t >= args.warmup_s]
        slope = slope_mb_per_min(after)
        rows.append(
            {
                "role": name,
                "samples": len(after),
                "rss_at_warmup_mb": round(after[0][1], 1) if after else None,
                "rss_end_mb": round(after[-1][1], 1) if after else None,
                "slope_mb_per_min": None if slope is None else round(slope, 3),
                "points": points,
            }
        )
    ok = proc.returncode == 0 and all(
        r["slope_mb_per_min"] is not None and r["slope_mb_per_min"] < LIMIT_MB_PER_MIN for r in rows
    )
    print(f"{'role':<11} {'samples':>7} {'RSS at warm-up MB':>18} {'RSS end MB':>11} {'slope MB/min':>13}")
    for r in rows:
        print(
            f"{r['role']:<11} {r['samples']:>7} {r['rss_at_warmup_mb']!s:>18} {r['rss_end_mb']!s:>11} "
            f"{r['slope_mb_per_min']!s:>13}"
        )
    print(
        f"soak {'passed' if ok else 'FAILED'}: every role under {LIMIT_MB_PER_MIN} MB/min after "
        f"{args.warmup_s:g} s of warm-up (run exit code {proc.returncode}, run directory {run_dir})"
    )
    if args.json:
        result = {
            "minutes": args.minutes,
            "warmup_s": args.warmup_s,
            "ok": ok,
            "exit_code": proc.returncode,
            "run_dir": str(run_dir),
            "rows": rows,
        }
        common.write_json(args.json, result)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
