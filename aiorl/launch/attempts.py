"""A run that restarts itself: the launch of a run as one or more attempts.

Actors and memory hosts other than 0 are restarted in place (`aiorl.runtime.restart`).
The others cannot be: learners (a data-parallel group cannot take a new member
mid-run, and learner 0 holds the only live copy of the weights) and memory host 0
(it runs the coordinator), and a synchronous run's memory hosts (their rounds die with them).
When one of them is lost, the attempt ends through its
bounded shutdown (the coordinator's phases, or the launcher's wait for the roles that
lost the coordinator, in which learner 0 writes a last checkpoint if it still can),
and the launcher starts the whole run again from its newest good checkpoint, in the
same run directory, as one more attempt (`RunDir.next_attempt`), with the same warm
spawner: up to ``cluster.max_run_restarts`` times. With ``run.snapshot_replay`` the
memory hosts come back with their replay; without it the next attempt starts with
empty replay, and says so.

Each attempt and its cause go to ``run.json`` (its ``attempts``), a
``{"event": "run_restart", ...}`` row in ``metrics.jsonl`` and, at the end,
``summary.json``'s ``attempts`` and ``run_restarts``. The exit code is the last
attempt's: 0 when the run finished (after N run restarts, said in one line), 1 when
it failed, naming every cause when the budget was spent; an interrupted run (Ctrl-C,
SIGTERM) is never restarted.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable

from aiorl.config import Config
from aiorl.io.rundir import RunDir
from aiorl.launch import launcher_for
from aiorl.launch.spawner import WarmSpawner


def run_attempts(
    cfg: Config,
    run_dir: RunDir,
    quiet: bool,
    spawner: WarmSpawner | None,
    on_metrics: Callable[[dict], object] | None = None,
) -> int:
    """Launch the run until an attempt ends for a reason a restart cannot help; its exit code.
    `on_metrics` is called with each metrics row (`aiorl.run`)."""
    budget = cfg.cluster.max_run_restarts
    attempts: list[dict] = []
    try:
        while True:
            launcher = launcher_for(cfg)(cfg, run_dir, quiet=quiet, spawner=spawner, on_metrics=on_metrics)
            code = launcher.run()
            cause = launcher.run_restart_cause()  # None unless the attempt failed
            attempts.append(
                {
                    "attempt": run_dir.identity.attempt,
                    "resume_from": run_dir.identity.resume_from,
                    "exit_code": code,
                    "cause": cause,
                }
            )
            if cause is None or len(attempts) > budget:
                break
            print(
                f"aiorl: {cause}; restarting the whole run (run restart {len(attempts)} of {budget}, "
                "cluster.max_run_restarts)",
                file=sys.stderr,
                flush=True,
            )
            try:
                run_dir.next_attempt(cause)
                _metrics_row(run_dir, cause)
            except OSError as exc:  # a full disk, the run directory gone: one line, no traceback
                print(f"aiorl: cannot restart the run: {exc.strerror or exc}: {exc.filename}", file=sys.stderr)
                return code
            _say_where_from(cfg, run_dir)
        return _conclude(cfg, run_dir, attempts, code)
    finally:
        if spawner is not None:
            spawner.end()
        run_dir.close()


def _say_where_from(cfg: Config, run_dir: RunDir) -> None:
    """Where the next attempt starts; the launcher names the checkpoints set aside on the way."""
    if run_dir.starting_over:
        print(f"aiorl: {run_dir.starting_over}", file=sys.stderr, flush=True)
    origin = run_dir.identity.resume_from or "the beginning"
    replay = (
        "with its replay snapshots" if cfg.run.snapshot_replay else "with empty replay (run.snapshot_replay is off)"
    )
    print(f"aiorl: attempt {run_dir.identity.attempt} continues from {origin}, {replay}", file=sys.stderr, flush=True)


def _metrics_row(run_dir: RunDir, cause: str) -> None:
    row = {
        "event": "run_restart",
        "time": time.time(),
        "attempt": run_dir.identity.attempt,
        "cause": cause,
        "resume_from": run_dir.identity.resume_from,
    }
    with open(run_dir.path / "metrics.jsonl", "a") as f:
        f.write(json.dumps(row) + "\n")


def _conclude(cfg: Config, run_dir: RunDir, attempts: list[dict], code: int) -> int:
    """Record the attempts in summary.json and say how the run ended when it took more than one."""
    causes = [f"attempt {a['attempt']}: {a['cause']}" for a in attempts if a["cause"]]
    budget = cfg.cluster.max_run_restarts
    # The last attempt would have been restarted but for the budget (none at all: restarts are off).
    unrestarted = attempts[-1]["cause"] is not None
    spent = unrestarted and budget > 0
    summary = run_dir.read_owned("summary.json")
    if summary is not None:
        summary["run_restarts"] = len(attempts) - 1
        summary["attempts"] = attempts
        summary["run_restart_budget_spent"] = spent
        if spent:
            summary["failures"] = [*summary.get("failures", []), *causes]
        try:
            run_dir.write_owned("summary.json", summary)
        except OSError as exc:
            print(f"aiorl: could not write {run_dir.path / 'summary.json'}: {exc.strerror or exc}", file=sys.stderr)
    if unrestarted and budget == 0:
        print("aiorl: the run was not restarted: cluster.max_run_restarts is 0", file=sys.stderr, flush=True)
    elif spent:
        print(
            f"aiorl: run failed: its restart budget is spent (cluster.max_run_restarts={budget}); "
            f"causes: {'; '.join(causes)}",
            file=sys.stderr,
            flush=True,
        )
    elif len(attempts) > 1:
        print(
            f"aiorl: run {'finished' if code == 0 else 'ended'} after {len(attempts) - 1} run restart(s) "
            f"({'; '.join(causes)})",
            flush=True,
        )
    return code
