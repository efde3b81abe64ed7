"""Evaluation during training: learner 0 scores its current policy and keeps the best one.

Every ``run.eval_every`` learner steps (iterations for dppo/es) and/or
``run.eval_interval_s`` seconds, learner 0 copies its acting policy between
two steps (`LearnerCore.acting_policy`, the module the final
``policy/policy.pt2`` is exported from) and the evaluation process
(`aiorl.runtime.eval_worker`: a process, not a thread, so that the episodes'
Python does not hold the learner's GIL) runs ``run.eval_episodes`` greedy
episodes of it side by side (one policy
call per step for all of them) on environments of its own: episode k is
reset with seed
``EVAL_SEED_BASE + run.seed + k``, so every evaluation of a run sees the same
episodes (evaluations compare fairly) and none is a training env's episode.
Evaluations are due on a grid: at every multiple of ``run.eval_every`` learner
steps (and/or every ``run.eval_interval_s`` seconds). The policy is copied the
moment one is due, so each evaluation scores the policy of the step it is
recorded at; the process scores one at a time, and copies that come due while
another is being scored wait, a few at most (`learner_outputs.MAX_WAITING`:
past it the oldest is dropped and counted skipped, as is one ended unscored by
a signal).
Each evaluation records how late it was (``lag_s``: from when it was due until
its result was in). At a run's end by its criterion (not a signal), learner 0
scores the copies waiting, then the final policy too (`LearnerOutputs.finish`).

With ``offline.eval_dataset`` the evaluation process also scores the policy by off-policy
evaluation on that held-out dataset (`aiorl.ope.training`): the record gains its estimates as
``ope_<name>`` keys (`OPE_PREFIX`), written as ``ope/<name>`` metrics beside ``eval/*``. An offline
run without an env has no episodes to run: its evaluations are those estimates alone (no
``return_mean``, and no best policy kept).

An evaluation whose mean return beats every earlier one (of this run,
earlier launches included) has that policy exported (its weights as data and the
`torch.export` program, in the evaluation process, once no evaluation waits for it, and before
it ends) to ``policy/best/``, with the evaluation in ``policy/best/policy.json``. That file is the record
a resumed run reads back, so a resume never replaces a better best with a
worse one. The coordinator gets the evaluations with learner 0's heartbeats: each one
until a heartbeat's reply says it arrived (two that end between two
heartbeats both arrive). It writes each to metrics.jsonl (``eval/*`` keys, one
row per evaluation, at the steps of the policy scored) and TensorBoard, the
last and best to summary.json, and stops on ``agent.target_return`` against
the evaluations' mean return when evaluation is on.

Why the network's state, not an exported file: an export (torch.export
tracing) takes a few tenths of a second and a call of the exported program
about 30x a call of the module, where the copy takes microseconds under the
learner's lock and scores fast; measured with ``bench/learning.py eval-cost``,
exporting every evaluation cost DQN CartPole training 19% of its learner
steps/s. The best policy kept is exported from the very module that was
scored, by the one export every policy goes through (`aiorl.io.export.save_policy`).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path

from aiorl.config import Config
from aiorl.io.export import POLICY_META
from aiorl.runtime.eval_worker import EvalWorker

#: An evaluation record's off-policy estimates: ``ope_<name>`` (aiorl.ope.training), metrics ``ope/<name>``.
OPE_PREFIX = "ope_"
EVAL_SEED_BASE = 1_000_000_000  # actors seed from run.seed + 10_000 x (index + 1) + ...: far below
BEST_DIR = "best"  # under the run's policy/ directory, beside the final policy

log = logging.getLogger("aiorl.eval")


def evaluation_on(cfg: Config) -> bool:
    return cfg.run.eval_every is not None or cfg.run.eval_interval_s is not None


def eval_seed(cfg: Config) -> int:
    return EVAL_SEED_BASE + cfg.run.seed


def read_best(policy_dir: Path) -> dict | None:
    """The evaluation that chose ``policy_dir/best`` (None: no best policy there yet)."""

    try:
        evaluation = json.loads((policy_dir / BEST_DIR / POLICY_META).read_text()).get("evaluation")
    except (OSError, ValueError):
        return None
    return evaluation if isinstance(evaluation, dict) and "return_mean" in evaluation else None


# Evaluations kept for the coordinator until a heartbeat's reply says they arrived: far more than
# end between two heartbeats (each takes a policy copy and episodes), and at ~0.5 KB each well
# inside a heartbeat's header (64 KiB); past it the oldest are dropped.
MAX_UNREPORTED = 32


class Evaluator:
    """Learner 0's evaluations: when one is due, running one, recording last and best."""

    def __init__(self, cfg: Config, policy_dir: Path):
        self.cfg = cfg
        self.policy_dir = policy_dir
        self.best = read_best(policy_dir)  # a resumed run goes on from its best
        self.last: dict | None = None
        self.count = 0
        self.skipped = 0  # due and not scored: replaced by a newer one while waiting, or ended by a signal
        self.last_step: int | None = None  # the grid's start: this launch's first learner step seen
        self.last_t = time.monotonic()
        self.due_t: float | None = None  # when the evaluation now due came due (monotonic)
        self.unreported: list[dict] = []  # scored, not yet acknowledged by the coordinator
        self.lock = threading.Lock()  # run() records from a worker thread; heartbeats read in the loop's
        self.stop = threading.Event()  # set at shutdown: no evaluation starts
        self.worker = None  # aiorl.runtime.eval_worker.EvalWorker, from start() (learner 0's registration)
        if self.best is not None:
            log.info(
                "best evaluation so far: mean return %.2f at learner step %d",
                self.best["return_mean"],
                self.best["learner_steps"],
            )

    def due(self, learner_steps: int) -> bool:
        """Whether an evaluation is due at `learner_steps`: a multiple of run.eval_every was reached
        since the last one (the first call starts the grid: a resumed run's first is at the next
        multiple), or run.eval_interval_s passed. Notes when it came due, for its lag."""
        r = self.cfg.run
        if self.last_step is None:
            self.last_step = learner_steps - learner_steps % r.eval_every if r.eval_every else learner_steps
        by_steps = r.eval_every is not None and learner_steps // r.eval_every > self.last_step // r.eval_every
        by_time = r.eval_interval_s is not None and time.monotonic() - self.last_t >= r.eval_interval_s
        if (by_steps or by_time) and self.due_t is None:
            # Due by time at last_t + eval_interval_s exactly; by steps now (checked after every step).
            self.due_t = self.last_t + r.eval_interval_s if by_time and not by_steps else time.monotonic()
        return by_steps or by_time

    def mark(self, learner_steps: int) -> float:
        """An evaluation of the policy at `learner_steps` is taken now; when it came due (monotonic).
        Grid points passed over in one step (more than one multiple of run.eval_every) count skipped."""
        r = self.cfg.run
        if r.eval_every is not None and self.last_step is not None:
            self.skipped += max(0, learner_steps // r.eval_every - self.last_step // r.eval_every - 1)
        now = time.monotonic()
        due_t = now if self.due_t is None else self.due_t
        self.last_step, self.last_t, self.due_t = learner_steps, now, None
        return due_t

    def start(self) -> None:
        """Start the evaluation process (from the loop's thread, when learner 0 registers: its imports
        overlap the run's start-up, and it is ready for the first evaluation even of a short run)."""
        if self.worker is None and not self.stop.is_set():
            self.worker = EvalWorker(self.cfg, self.policy_dir)

    def run(
        self,
        policy,
        meta: dict,
        learner_steps: int,
        env_steps: int,
        copy_s: float = 0.0,
        due_t: float | None = None,
        policy_time: float | None = None,
    ) -> dict | None:
        """Score `policy` (a module from `LearnerCore.acting_policy`, with its policy.json `meta`) in the
        evaluation process, which exports it to policy/best/ if it is the best so far. Blocks: call it
        in a worker thread. `due_t`: when it came due (monotonic; default now), `policy_time`: when the
        policy was copied (unix time; default now).

        None: stopped at shutdown before its episodes were done (not recorded; counted skipped).
        """
        due_t = time.monotonic() if due_t is None else due_t
        policy_time = time.time() if policy_time is None else policy_time
        if self.stop.is_set():
            self.skip()
            return None
        self.start()
        state = {k: v.detach().cpu().numpy() for k, v in policy.state_dict().items()}
        request = {
            "n": self.count + 1,
            "learner_steps": learner_steps,
            "env_steps": env_steps,
            "copy_s": round(copy_s, 4),
            "meta": meta,
            "best": None if self.best is None else self.best["return_mean"],
        }
        reply = self.worker.evaluate(state, request)
        if reply is None:
            self.skip()
            return None
        return self.record(reply, due_t, policy_time)

    def record(self, reply: dict, due_t: float, policy_time: float) -> dict:
        """Record the evaluation process's `reply` (``{evaluation, kept}``) of an evaluation that came
        due at `due_t` (monotonic), of the policy copied at `policy_time` (unix time): last, best, and
        one more for the coordinator. Its record: the evaluation, with its lag, the best so far and
        the skipped count."""
        evaluation = reply["evaluation"]  # as policy/best/policy.json records it when kept
        done_t = time.monotonic()
        record = {
            **evaluation,
            "lag_s": round(done_t - due_t, 3),  # from due to the result in: waiting, copy, episodes
            "due_time": round(time.time() - (done_t - due_t), 3),
            "policy_time": round(policy_time, 3),
        }
        with self.lock:  # a heartbeat (the loop's thread) sees all of it or none
            if reply["kept"]:
                self.best = evaluation
            record["best_return_mean"] = None if self.best is None else self.best["return_mean"]
            record["skipped"] = self.skipped
            self.last = record
            self.count += 1
            self.unreported = [*self.unreported, record][-MAX_UNREPORTED:]
        log.info("evaluation %d at learner step %d: %s", self.count, evaluation["learner_steps"], describe(record))
        return record

    def skip(self) -> None:
        """An evaluation that was due is not scored."""
        with self.lock:
            self.skipped += 1

    def interrupt(self) -> None:
        """Shutdown: an evaluation in flight ends at its next env step, unrecorded; none starts."""
        self.stop.set()
        if self.worker is not None:
            self.worker.interrupt()

    def close(self) -> None:
        """End the evaluation process (bounded); blocks: call it in a worker thread."""
        self.stop.set()
        if self.worker is not None:
            self.worker.close()

    def summary(self) -> dict:
        """What the heartbeats carry to the coordinator: the evaluations it has not acknowledged yet
        (``new``), the last and best, how many were scored and skipped."""
        with self.lock:
            return {
                "count": self.count,
                "skipped": self.skipped,
                "last": self.last,
                "best": self.best,
                "new": list(self.unreported),
            }

    def reported(self, summary: dict | None) -> None:
        """A heartbeat carrying `summary` (from `summary()`) was answered: its evaluations arrived."""
        if not summary or not summary.get("new"):
            return
        arrived = max(e["n"] for e in summary["new"])
        with self.lock:
            self.unreported = [e for e in self.unreported if e["n"] > arrived]


def describe(record: dict) -> str:
    """An evaluation's log line: its episodes' return (with an env), its off-policy estimates (with
    offline.eval_dataset)."""
    parts = []
    if record.get("return_mean") is not None:
        parts.append(
            f"mean return {record['return_mean']:.2f} (std {record['return_std']:.2f}, {record['episodes']} "
            f"episodes, {record['seconds']:.2f} s, {record['lag_s']:.2f} s after it was due); "
            f"best {record['best_return_mean']:.2f}"
        )
    estimates = {k[len(OPE_PREFIX) :]: v for k, v in record.items() if k.startswith(OPE_PREFIX)}
    if estimates:
        parts.append("off-policy " + " ".join(f"{k} {'-' if v is None else f'{v:.2f}'}" for k, v in estimates.items()))
    return "; ".join(parts) or "no episodes, no estimates"


def evaluation_metrics(summary: dict) -> dict:
    """The metrics.jsonl keys of the last evaluation of a `summary()` (documented in aiorl.io.metrics)."""
    return evaluation_row(summary["last"], summary.get("best"))


def evaluation_row(evaluation: dict, best: dict | None = None, t_start: float | None = None) -> dict:
    """The metrics.jsonl keys of one evaluation (documented in aiorl.io.metrics); `best`: the best
    evaluation, for one that does not record the best as of itself (an older learner's); `t_start`:
    the run's clock (unix time at time_s 0), for ``eval/time_s``."""
    best_return = evaluation.get("best_return_mean", best["return_mean"] if best is not None else None)
    policy_time = evaluation.get("policy_time")
    return {
        "eval/return_mean": evaluation["return_mean"],
        "eval/return_std": evaluation.get("return_std"),
        "eval/episodes": evaluation.get("episodes"),
        "eval/learner_steps": evaluation["learner_steps"],
        "eval/env_steps": evaluation.get("env_steps"),
        "eval/time_s": None if policy_time is None or t_start is None else round(policy_time - t_start, 3),
        "eval/seed": evaluation.get("seed"),
        "eval/best_return_mean": best_return,
        "eval/lag_s": evaluation.get("lag_s"),
        "eval/skipped": evaluation.get("skipped"),
        **{f"ope/{k[len(OPE_PREFIX) :]}": v for k, v in evaluation.items() if k.startswith(OPE_PREFIX)},
    }
