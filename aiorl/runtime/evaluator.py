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
One evaluation at a time: one that is due while another runs is skipped.
At a run's end by its criterion (not a signal), learner 0 lets the one in
flight finish and scores the final policy too (`LearnerRole._final_evaluation`).

An evaluation whose mean return beats every earlier one (of this run,
earlier launches included) has that policy exported (`torch.export`, in the
evaluation process) to ``policy/best/``, with the evaluation in
``policy/best/policy.json``. That file is the record
a resumed run reads back, so a resume never replaces a better best with a
worse one. The coordinator gets the last and best evaluations with learner
0's heartbeats: it writes them to metrics.jsonl (``eval/*`` keys) and
summary.json, and stops on ``agent.target_return`` against the evaluation's
mean return when evaluation is on.

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


class Evaluator:
    """Learner 0's evaluations: when one is due, running one, recording last and best."""

    def __init__(self, cfg: Config, policy_dir: Path):
        self.cfg = cfg
        self.policy_dir = policy_dir
        self.best = read_best(policy_dir)  # a resumed run goes on from its best
        self.last: dict | None = None
        self.count = 0
        self.last_step = 0
        self.last_t = time.monotonic()
        self.stop = threading.Event()  # set at shutdown: no evaluation starts
        self.worker = None  # aiorl.runtime.eval_worker.EvalWorker, from start() (learner 0's registration)
        if self.best is not None:
            log.info(
                "best evaluation so far: mean return %.2f at learner step %d",
                self.best["return_mean"],
                self.best["learner_steps"],
            )

    def due(self, learner_steps: int) -> bool:
        r = self.cfg.run
        by_steps = r.eval_every is not None and learner_steps - self.last_step >= r.eval_every
        by_time = r.eval_interval_s is not None and time.monotonic() - self.last_t >= r.eval_interval_s
        return by_steps or by_time

    def mark(self, learner_steps: int) -> None:
        """An evaluation of the policy at `learner_steps` starts now."""
        self.last_step = learner_steps
        self.last_t = time.monotonic()

    def start(self) -> None:
        """Start the evaluation process (from the loop's thread, when learner 0 registers: its imports
        overlap the run's start-up, and it is ready for the first evaluation even of a short run)."""
        if self.worker is None and not self.stop.is_set():
            self.worker = EvalWorker(self.cfg, self.policy_dir)

    def run(self, policy, meta: dict, learner_steps: int, env_steps: int, copy_s: float = 0.0) -> dict | None:
        """Score `policy` (a module from `LearnerCore.acting_policy`, with its policy.json `meta`) in the
        evaluation process, which exports it to policy/best/ if it is the best so far. Blocks: call it
        in a worker thread.

        None: stopped at shutdown before its episodes were done (not recorded).
        """
        if self.stop.is_set():
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
            return None
        evaluation = reply["evaluation"]
        if reply["kept"]:
            self.best = evaluation
        # Best, last, then count: a heartbeat (another thread) that sees the new count sees both;
        # the coordinator takes an evaluation once per count.
        self.last = evaluation
        self.count += 1
        log.info(
            "evaluation %d at learner step %d: mean return %.2f (std %.2f, %d episodes, %.2f s); best %.2f",
            self.count,
            learner_steps,
            evaluation["return_mean"],
            evaluation["return_std"],
            evaluation["episodes"],
            evaluation["seconds"],
            self.best["return_mean"],
        )
        return evaluation

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
        """What the heartbeats carry to the coordinator."""
        return {"count": self.count, "last": self.last, "best": self.best}


def evaluation_metrics(summary: dict) -> dict:
    """The metrics.jsonl keys of the last evaluation (documented in aiorl.io.metrics)."""
    last, best = summary["last"], summary["best"]
    return {
        "eval/return_mean": last["return_mean"],
        "eval/return_std": last.get("return_std"),
        "eval/episodes": last.get("episodes"),
        "eval/learner_steps": last["learner_steps"],
        "eval/seed": last.get("seed"),
        "eval/best_return_mean": best["return_mean"] if best is not None else None,
    }
