"""What the coordinator tells the outside: `aiorl status`'s answer, the rows of
metrics.jsonl (keys documented in aiorl.io.metrics) and summary.json. Read-only over
the other parts; the rates between two rows are the one state it keeps.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

from aiorl.config import Config
from aiorl.io.metrics import mean_or_none
from aiorl.io.rundir import Identity, write_json_atomic
from aiorl.runtime.coordinator.counters import RunCounters, Stop
from aiorl.runtime.coordinator.liveness import Liveness
from aiorl.runtime.coordinator.params import ParameterStore
from aiorl.runtime.coordinator.phases import PhaseClock
from aiorl.runtime.coordinator.roster import Roster
from aiorl.runtime.evaluator import evaluation_row
from aiorl.runtime.phase import INTERRUPTED
from aiorl.runtime.work import WorkQueue

log = logging.getLogger("aiorl.coordinator")

# Learner gauges the runtime itself reports; the rest are the algorithm's (learner/<name>).
LEARNER_RUNTIME_KEYS = {"wait_s", "train_s", "loop_lag_s", "rss_bytes", "queue_depth"}


class Report:
    def __init__(
        self,
        cfg: Config,
        identity: Identity,
        phases: PhaseClock,
        roster: Roster,
        counters: RunCounters,
        params: ParameterStore,
        liveness: Liveness,
        stop: Stop,
        work: WorkQueue | None,
    ):
        self.cfg = cfg
        self.identity = identity
        self.phases = phases
        self.roster = roster
        self.counters = counters
        self.params = params
        self.liveness = liveness
        self.stop = stop
        self.work = work
        self._last_metrics: tuple | None = None

    def status(self, metrics: dict) -> dict:
        """`aiorl status`'s answer; `metrics` is the last metrics row."""
        now = asyncio.get_running_loop().time()
        counters, work = self.counters, self.work
        return {
            "phase": self.phases.phase.name,
            "stop_reason": self.stop.reason,
            "run_id": self.identity.run_id,
            "launch_id": self.identity.launch_id,
            "attempt": self.identity.attempt,
            "restarts": self.roster.restarts,
            "elapsed_s": round(time.time() - counters.t_start, 3),
            "env_steps": counters.env_steps,
            "learner_steps": counters.learner_steps,
            "episodes": counters.episodes,
            "return_mean_100": counters.return_mean(),
            "weights_version": self.params.weights_version,
            "loop_lag_max_s": round(self.liveness.loop_lag_max_s, 6),
            "loop_lag": self.liveness.lag_probe.snapshot(),
            "work": None
            if work is None
            else {
                "iteration": work.iteration,
                "pending": list(work.pending),
                "leases": {str(item): worker for item, worker in work.leases.items()},
                "released": work.released,
            },
            "metrics": metrics,
            "roles": {name: r.public(now) for name, r in self.roster.roles.items()},
            **self._epochs(),
        }

    def _epochs(self) -> dict:
        """An offline run's passes over its dataset (``epochs``; its env steps stay 0); {} online."""
        epochs = self.counters.epochs(self.cfg)
        return {} if epochs is None else {"epochs": round(epochs, 6)}

    def metrics_row(self) -> dict:
        """One row of metrics.jsonl (keys documented in aiorl.io.metrics)."""
        now = time.time()
        loop_now = asyncio.get_running_loop().time()
        counters = self.counters
        roles = list(self.roster.roles.values())
        memories = [r.metrics for r in roles if r.kind == "memory" and r.metrics]
        learners = [r.metrics for r in roles if r.kind == "learner" and r.metrics]
        actors = [r.metrics for r in roles if r.kind == "actor" and r.metrics]
        env_steps, learner_steps = counters.env_steps, counters.learner_steps
        inserted = sum(m.get("inserted", 0) for m in memories)
        sampled = sum(m.get("sampled", 0) for m in memories)
        capacity = sum(m.get("replay_capacity", 0) for m in memories)
        replay_size = sum(m.get("replay_size", 0) for m in memories)
        wait_s = sum(m.get("wait_s", 0.0) for m in learners)
        train_s = sum(m.get("train_s", 0.0) for m in learners)
        late_after = 2 * self.cfg.cluster.heartbeat_interval_s
        row = {
            "time_s": round(now - counters.t_start, 3),
            "attempt": self.identity.attempt,
            "phase": self.phases.phase.name,
            "env_steps": env_steps,
            "learner_steps": learner_steps,
            "episodes": counters.episodes,
            "env_steps_per_s": None,
            "learner_steps_per_s": None,
            "return_mean_100": mean_or_none(counters.returns),
            "episode_length_mean_100": mean_or_none(counters.lengths),
            "weights_version": self.params.weights_version,
            "weights_lag_max": max((m.get("weights_lag", 0) for m in actors), default=None),
            "replay_size": replay_size,
            "replay_fill": round(replay_size / capacity, 6) if capacity else None,
            "insert_per_s": None,
            "sample_per_s": None,
            "samples_per_insert": round(sampled / inserted, 6) if inserted else None,
            "learner_wait_fraction": round(wait_s / (wait_s + train_s), 6) if wait_s + train_s > 0 else None,
            "actor_blocked_s": round(sum(m.get("blocked_s", 0.0) for m in actors), 3),
            "sample_blocked_s": round(sum(m.get("sample_blocked_s", 0.0) for m in memories), 3),
            "restarts": self.roster.restarts,
            "loop_lag_max_s": max(
                [m.get("loop_lag_s", 0.0) for r in roles for m in [r.metrics] if m] + [self.liveness.loop_lag_max_s]
            ),
            "rss_bytes": sum(r.metrics.get("rss_bytes", 0) for r in roles if r.live),
            "roles_alive": sum(r.status in ("running", "disconnected", "done") for r in roles),
            "roles_late": [
                r.name
                for r in roles
                if r.status == "disconnected"
                or (r.status == "running" and self.liveness.silence_s(r, loop_now) > late_after)
            ],
            "roles_lost": [r.name for r in roles if r.status in ("lost", "failed")],
        }
        row.update(self._epochs())
        for key in sorted({k for m in memories for k in m if k.startswith("dataset/")}):
            row[key] = sum(m.get(key, 0) for m in memories)
        idle = [m["idle_fraction"] for m in actors if isinstance(m.get("idle_fraction"), (int, float))]
        row["actor_idle_fraction"] = mean_or_none(idle)
        for key in sorted({k for m in memories for k in m if k.startswith(("queue/", "limiter/"))}):
            row[key] = sum(m.get(key, 0) for m in memories)
        algo_keys = sorted({k for m in learners for k in m} - LEARNER_RUNTIME_KEYS)
        for key in algo_keys:
            row[f"learner/{key}"] = mean_or_none(m[key] for m in learners if isinstance(m.get(key), (int, float)))
        if self._last_metrics is not None:
            t0, e0, l0, i0, s0 = self._last_metrics
            dt = max(now - t0, 1e-9)
            row["env_steps_per_s"] = round((env_steps - e0) / dt, 2)
            row["learner_steps_per_s"] = round((learner_steps - l0) / dt, 2)
            row["insert_per_s"] = round((inserted - i0) / dt, 2)
            row["sample_per_s"] = round((sampled - s0) / dt, 2)
        self._last_metrics = (now, env_steps, learner_steps, inserted, sampled)
        return row

    def evaluation_rows(self) -> list[dict]:
        """The ``eval/*`` keys of each evaluation heard of since the last call, oldest first: each goes
        into a metrics row of its own (`MetricsWriter.write`), so a plot or TensorBoard gets every one."""
        counters = self.counters
        best = (counters.evaluation or {}).get("best")
        return [evaluation_row(e, best, counters.t_start) for e in counters.take_evaluation_rows()]

    def write_summary(self, run_dir: Path, ok: bool, outcome: str, lost_restartable: list[str], refusals: dict) -> None:
        """summary.json; `refusals`: the service's counts of what it refused (registrations, bad
        messages, connections and handshakes)."""
        counters, stop = self.counters, self.stop
        interrupted = outcome == INTERRUPTED
        summary = {
            "ok": ok,
            "outcome": outcome,
            "stop_reason": "interrupted" if interrupted else stop.reason,
            "stop_detail": stop.reason,
            "signal": stop.interrupted_by if interrupted else None,
            "written_by": "coordinator",
            "resumed_from": counters.resumed_from,
            "restarts": self.roster.restarts,
            "lost_with_restarts_left": lost_restartable,
            "failures": stop.failures,
            "phases": self.phases.times,
            "stopped_at": stop.at,
            "env_steps": counters.env_steps,
            "learner_steps": counters.learner_steps,
            "episodes": counters.episodes,
            "return_mean_100": counters.return_mean(),
            **self._epochs(),
            "evaluation": counters.evaluation,
            "weights_version": self.params.weights_version,
            "weights_published_monotonic": self.params.weights_published,
            **refusals,
            "roles": {
                name: {
                    "status": r.status,
                    "reason": r.reason,
                    "pid": r.pid,
                    "restarts": r.restarts,
                    "done_phase": r.done_phase,
                    "counters": r.counters,
                    "retired_counters": r.retired,
                    "stats": r.stats,
                }
                for name, r in self.roster.roles.items()
            },
        }
        try:
            write_json_atomic(run_dir / "summary.json", self.identity.stamp(summary), indent=1)
        except OSError as exc:  # a full disk or a deleted run directory: the run still ends, and says why
            log.error("could not write summary.json: %s", exc)
