"""Run metrics: the rows of ``metrics.jsonl`` and their optional TensorBoard copy.

Roles report their counters and gauges with every heartbeat (one small
message per ``cluster.heartbeat_interval_s``, nothing per step); the
coordinator folds them into one row every ``run.metrics_interval_s``.

Keys of a row (stable; counters are monotonic):

==========================  ===========================================================
time_s                      seconds since the run started (a resumed run goes on from its checkpoint's)
attempt                     launch of the run that wrote the row (1, then one more per --resume)
phase                       STARTING, RUNNING, STOPPING, DRAINING, CLOSING, EXITED
env_steps                   env steps taken by all actors (exact; monotonic within a launch)
learner_steps               learner steps of all learners (exact; monotonic within a launch)
episodes                    episodes finished by all actors (monotonic)
env_steps_per_s             env steps per second since the previous row
learner_steps_per_s         learner steps per second since the previous row
return_mean_100             mean return of the last 100 finished episodes
episode_length_mean_100     mean length of the last 100 finished episodes
weights_version             newest published weights version
weights_lag_max             worst actor lag behind the newest weights (versions)
replay_size                 transitions held by all memories
replay_fill                 replay_size / total capacity
insert_per_s, sample_per_s  transitions inserted into / sampled from replay per second
samples_per_insert          sampled / inserted transitions since the start
learner_wait_fraction       share of learner time spent waiting for batches
actor_blocked_s             seconds actors spent waiting for the rate limiter's credits (all actors): the
                            ratio's upper bound, or credits' round trips (then limiter/held_ratio_upper_s
                            stays near 0)
sample_blocked_s            seconds learners' requests waited on the rate limiter's ratio (all memories)
limiter/<bound>             only with agent.samples_per_insert, summed over memories: seconds a side was
                            held back by each bound: held_min_size_s (a learner asked, the shard was under
                            its share of learning_starts), held_ratio_lower_s (learners ahead of the ratio;
                            = sample_blocked_s), held_ratio_upper_s (an actor out of credits, actors ahead)
restarts                    role restarts so far (cluster.max_restarts)
learner/<name>              an algorithm metric (e.g. learner/losses/td_loss), mean over learners
actor_idle_fraction         mean over actors of the share of their loop's wall time spent waiting
                            (credits, writes, barriers, weights), as each actor measures it
queue/<name>                trajectory queues of the memories (IMPALA), summed: fragments, capacity,
                            pushed, taken, dropped_full, dropped_lag, throttled (credit grants to an
                            actor that had run out of credits and waited for room)
eval/<name>                 only in rows written after an evaluation during training (run.eval_every),
                            one row per evaluation (two heard of between two rows: two rows, the same
                            but for their eval/* keys): return_mean, return_std, episodes,
                            learner_steps, env_steps and time_s (of the policy scored: when it was
                            copied; older runs have no env_steps, time_s), seed (of its first episode),
                            best_return_mean (best evaluation so far), lag_s (seconds from when it was
                            due until its result was in), skipped (evaluations due and not scored so
                            far in this launch)
ope/<name>                  only in the rows of an evaluation during training of a run with
                            offline.eval_dataset: the greedy policy's off-policy estimates on that
                            held-out data (aiorl.ope.training): ips, sips, wips, swips (importance
                            sampling; null when no episode has weight), dr (doubly robust), fqe
                            (fitted Q evaluation), effective_episodes (Kish's size of the
                            whole-episode weights), seconds (the time the estimates took)
epochs                      offline runs only: the run's learner steps x agent.batch_size over the
                            dataset's rows (env_steps stay 0)
dataset/<name>              offline runs only, summed over memory hosts: shard_rows, rows_outside_shard
                            (rows sampled outside a host's own shard: always 0)
loop_lag_max_s              worst event-loop lag of any role (timer lateness)
rss_bytes                   resident memory of all role processes together
roles_alive                 roles registered and not lost or failed
roles_late                  names of roles whose last heartbeat is over 2 intervals old
roles_lost                  names of roles lost or failed
==========================  ===========================================================

A run that restarts itself (`aiorl.launch.attempts`) writes one more kind of row between two
attempts, with no counters: ``{"event": "run_restart", "time": <unix time>, "attempt": <the
attempt it starts>, "cause": "<the role lost and how>", "resume_from": <checkpoint or null>}``.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from aiorl.io.loggers import make_loggers
from aiorl.io.rundir import RunDirWatch

log = logging.getLogger("aiorl.metrics")

ROW_KEYS = (
    "time_s",
    "attempt",
    "phase",
    "env_steps",
    "learner_steps",
    "episodes",
    "env_steps_per_s",
    "learner_steps_per_s",
    "return_mean_100",
    "episode_length_mean_100",
    "weights_version",
    "weights_lag_max",
    "replay_size",
    "replay_fill",
    "insert_per_s",
    "sample_per_s",
    "samples_per_insert",
    "learner_wait_fraction",
    "actor_blocked_s",
    "sample_blocked_s",
    "restarts",
    "actor_idle_fraction",
    "loop_lag_max_s",
    "rss_bytes",
    "roles_alive",
    "roles_late",
    "roles_lost",
)


class MetricsWriter:
    """Appends rows to ``metrics.jsonl``; mirrors their numbers to the loggers of ``run.loggers``."""

    def __init__(
        self,
        run_dir: Path,
        tensorboard: bool = True,
        purge_step: int | None = None,
        loggers: list[str] | None = None,
        config: dict | None = None,
    ):
        # A file kept open goes on taking rows after its directory is deleted: each row checks first.
        self.watch = RunDirWatch(run_dir)
        self.path = Path(run_dir) / "metrics.jsonl"
        self.file = open(self.path, "a", buffering=1)
        names = ["tensorboard"] if loggers is None else list(loggers)
        if not tensorboard:
            names = [n for n in names if n != "tensorboard"]
        self.loggers = make_loggers(names, Path(run_dir), config or {}, purge_step)
        # An offline run takes no env step: its loggers step by learner steps.
        self.step_key = "learner_steps" if ((config or {}).get("offline") or {}).get("dataset") else "env_steps"

    def write(self, row: dict, evaluations: list[dict] = ()) -> None:
        """One row; with `evaluations` (the ``eval/*`` keys of each evaluation heard of since the last
        row), one row per evaluation, the same but for them. The loggers get the row's numbers once,
        at its env steps, and each evaluation's at the env steps of the policy it scored.
        RunDirDeleted (an OSError) once the run directory is gone, and nothing written."""
        self.watch.check()
        self.file.write("".join(json.dumps({**row, **e}) + "\n" for e in evaluations or [{}]))
        step = int(row.get(self.step_key) or 0)
        for logger in list(self.loggers):
            try:
                logger.log_row(row, step)
                for evaluation in evaluations:
                    at = evaluation.get(f"eval/{self.step_key}")
                    logger.log_evaluation(evaluation, step if at is None else int(at))
            except Exception as exc:  # a logging service must not end the run: drop it, say so once
                log.warning(
                    "%s failed (%s: %s); metrics go on without it", type(logger).__name__, type(exc).__name__, exc
                )
                self.loggers.remove(logger)

    def close(self) -> None:
        self.file.close()
        self.watch.close()
        for logger in self.loggers:
            try:
                logger.close()
            except Exception as exc:
                log.warning("%s did not close cleanly (%s: %s)", type(logger).__name__, type(exc).__name__, exc)


def mean_or_none(values) -> float | None:
    values = list(values)
    return round(sum(values) / len(values), 6) if values else None
