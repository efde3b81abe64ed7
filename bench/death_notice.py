"""How soon does the coordinator act on a dead role? Seconds from an actor's SIGKILL to what the
coordinator logs, for this tree and a reference tree (e.g. one without the launcher's exit
notices), measured in one run.

    python bench/death_notice.py [--reference /path/to/other/tree] [--trials 3] [--json out.json]

Each trial is a real local run (`python -m aiorl run`, every role a process of this machine)
with the tree on PYTHONPATH, so the roles run that tree too. Scenarios:

- ``apex-restart``: examples/apex_dqn_cartpole.yaml with 2 actors and ``cluster.max_restarts=2``;
  actor-1 is killed once learning has begun. Reported: its "actor-1 lost" line, and its
  "actor-1 restarted" line (the new process registered). A tree without notices may admit the
  restart before it ever declares the old process lost (it was only "disconnected"): then there
  is no "lost" time.
- ``apex-no-restart``: the same without restarts: the "lost" line alone.
- ``dppo``: examples/dppo_cartpole.yaml (2 actors, synchronous); actor-1 is killed after 3
  iterations. Reported: "lost", "barrier 'iteration' goes on without actor-1", and the first
  iteration learner 0 trains after that barrier let actor-0 through (the first whole round
  without actor-1; the round in flight at the kill may already end on actor-0's rollout, its
  memory host having seen actor-1's data connection drop, and is not counted).

Times come from the log lines' timestamps (milliseconds) against the clock read at the kill;
the launcher sees a child's exit at once (the warm spawner reports it; without the spawner,
within its 0.1 s poll). Medians over the trials; "-" where the event never came within
``--wait`` seconds.
"""

from __future__ import annotations

import argparse
import datetime
import os
import re
import shutil
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

import common
from common import ROOT

APEX = "examples/apex_dqn_cartpole.yaml"
# scenario: (config, its --sets, the metrics counter that must pass a value before the kill)
SCENARIOS = {
    "apex-restart": (APEX, ["cluster.actors=2", "cluster.max_restarts=2"], "learner_steps", 100),
    "apex-no-restart": (APEX, ["cluster.actors=2", "cluster.max_restarts=0"], "learner_steps", 100),
    "dppo": ("examples/dppo_cartpole.yaml", [], "learner_steps", 3),
}
STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")


def stamped(path: Path, pattern: str, after: float) -> float | None:
    """Epoch seconds of the first line of `path` matching `pattern` logged at or after `after`."""
    if not path.exists():
        return None
    regex = re.compile(pattern)
    for line in path.read_text(errors="replace").splitlines():
        match = STAMP.match(line)
        if not match or not regex.search(line):
            continue
        at = datetime.datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
        if at >= after - 0.001:
            return at
    return None


def trial(tree: Path, scenario: str, wait_s: float) -> dict:
    config, sets, key, above = SCENARIOS[scenario]
    scratch = Path(tempfile.mkdtemp(prefix="aiorl-bench-", dir="/tmp"))  # short: socket paths
    run_dir = scratch / "run"
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out: dict = {}
    try:
        with common.Launch(config, run_dir, sets, env=env) as launch:
            if not common.wait_for(lambda: common.last_metrics_row(run_dir).get(key, 0) >= above, 300):
                raise RuntimeError(f"{scenario}: the run did not reach {key} {above}")
            out = events_after_kill(run_dir, scenario, launch.pids()["actor-1"], wait_s)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return out


def events_after_kill(run_dir: Path, scenario: str, pid: int, wait_s: float) -> dict:
    """SIGKILL `pid`; the seconds until each of the coordinator's lines on it (None: never came)."""
    out: dict = {}
    killed = time.time()
    os.kill(pid, signal.SIGKILL)
    coordinator = run_dir / "logs" / "memory-0.log"
    events = {"lost": (coordinator, r"actor-1 lost: ")}
    if scenario == "apex-restart":
        events["restarted"] = (coordinator, r"actor-1 restarted \(")
    if scenario == "dppo":
        events["barrier"] = (coordinator, r"barrier 'iteration' goes on without actor-1")
    common.wait_for(lambda: all(stamped(path, p, killed) for path, p in events.values()), wait_s)
    for name, (path, pattern) in events.items():
        at = stamped(path, pattern, killed)
        out[name] = None if at is None else round(at - killed, 3)
    if out.get("barrier") is not None:
        # The iteration in flight at the kill may train on actor-0's rollout alone (its memory
        # host saw actor-1's data connection drop); the first round without actor-1 is the one
        # after the barrier let actor-0 through. 8 envs x 32 steps: one actor's 256 rows.
        learner, pattern = run_dir / "logs" / "learner-0.log", r"iteration \d+: 256 rows"
        released = killed + out["barrier"]
        at = common.wait_for(lambda: stamped(learner, pattern, released), wait_s)
        out["round"] = None if at is None else round(at - killed, 3)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reference", type=Path, default=None, help="another aiorl tree to measure the same way")
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--wait", type=float, default=40.0, help="seconds to wait for the events after a kill")
    parser.add_argument("--scenarios", nargs="+", default=list(SCENARIOS), choices=list(SCENARIOS))
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    trees = {"this tree": ROOT}
    if args.reference is not None:
        trees["reference"] = args.reference.resolve()
    results: dict = {}
    for scenario in args.scenarios:
        for label, tree in trees.items():
            runs = [trial(tree, scenario, args.wait) for _ in range(args.trials)]
            results.setdefault(scenario, {})[label] = {"tree": str(tree), "trials": runs}
            print(f"{scenario:<16} {label:<10} {runs}", file=sys.stderr, flush=True)
    print(f"{'scenario':<16} {'tree':<10} {'event':<10} {'median s':>9}  trials (s after the SIGKILL)")
    for scenario, by_tree in results.items():
        for label, data in by_tree.items():
            for event in data["trials"][0]:
                values = [run.get(event) for run in data["trials"]]
                seen = [v for v in values if v is not None]
                median = f"{statistics.median(seen):.2f}" if len(seen) == len(values) else "-"
                shown = ", ".join("-" if v is None else f"{v:.2f}" for v in values)
                print(f"{scenario:<16} {label:<10} {event:<10} {median:>9}  {shown}")
    if args.json:
        common.write_json(args.json, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
