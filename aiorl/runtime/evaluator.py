"""Evaluation during training: learner 0 scores its current policy and keeps the best one.

Every ``run.eval_every`` learner steps (iterations for dppo/es) and/or
``run.eval_interval_s`` seconds, learner 0 exports its policy between two
steps (the same `export_policy` that writes the final ``policy/policy.pt2``)
and a worker thread runs ``run.eval_episodes`` greedy episodes of that file
side by side (one policy call per step for all of them) on environments of
its own: episode k is reset with seed
``EVAL_SEED_BASE + run.seed + k``, so every evaluation of a run sees the same
episodes (evaluations compare fairly) and none is a training env's episode.
One evaluation at a time: one that is due while another runs is skipped.

An evaluation whose mean return beats every earlier one (of this run,
earlier launches included) has its policy file moved to ``policy/best/``,
with the evaluation in ``policy/best/policy.json``. That file is the record
a resumed run reads back, so a resume never replaces a better best with a
worse one. The coordinator gets the last and best evaluations with learner
0's heartbeats: it writes them to metrics.jsonl (``eval/*`` keys) and
summary.json, and stops on ``agent.target_return`` against the evaluation's
mean return when evaluation is on.

Why exported files rather than a copy of the network: the best policy kept is
then exactly the program that was scored, and the evaluation needs nothing
of the algorithm but its export.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import threading
import time
from pathlib import Path

from aiorl.config import Config

EVAL_SEED_BASE = 1_000_000_000  # actors seed from run.seed + 10_000 x (index + 1) + ...: far below
BEST_DIR = "best"  # under the run's policy/ directory, beside the final policy
SCRATCH_DIR = ".eval"  # policy/.eval: the export being evaluated

log = logging.getLogger("aiorl.eval")


def evaluation_on(cfg: Config) -> bool:
    return cfg.run.eval_every is not None or cfg.run.eval_interval_s is not None


def eval_seed(cfg: Config) -> int:
    return EVAL_SEED_BASE + cfg.run.seed


def read_best(policy_dir: Path) -> dict | None:
    """The evaluation that chose ``policy_dir/best`` (None: no best policy there yet)."""
    from aiorl.export import POLICY_META

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
        self.stop = threading.Event()  # set at shutdown: an evaluation in flight ends after its episode
        if self.best is not None:
            log.info("best evaluation so far: mean return %.2f at learner step %d",
                     self.best["return_mean"], self.best["learner_steps"])

    def due(self, learner_steps: int) -> bool:
        r = self.cfg.run
        by_steps = r.eval_every is not None and learner_steps - self.last_step >= r.eval_every
        by_time = r.eval_interval_s is not None and time.monotonic() - self.last_t >= r.eval_interval_s
        return by_steps or by_time

    def mark(self, learner_steps: int) -> None:
        """An evaluation of the policy at `learner_steps` starts now."""
        self.last_step = learner_steps
        self.last_t = time.monotonic()

    def scratch(self) -> Path:
        return self.policy_dir / SCRATCH_DIR

    def run(self, policy_path: str, learner_steps: int, env_steps: int, export_s: float = 0.0) -> dict | None:
        """Score the exported policy at `policy_path` (a worker thread); keep it if it is the best.

        None: stopped at shutdown before its episodes were done (not recorded).
        """
        from aiorl.evaluate import run_episodes_together
        from aiorl.export import load_policy_file

        t0 = time.perf_counter()
        policy = load_policy_file(policy_path)
        seed = eval_seed(self.cfg)
        result = run_episodes_together(policy, self.cfg.env, self.cfg.run.eval_episodes, seed, stop=self.stop)
        if result is None:
            return None
        self.count += 1
        evaluation = {"n": self.count, "learner_steps": learner_steps, "env_steps": env_steps,
                      "return_mean": result["mean"], "return_std": result["std"], "return_min": result["min"],
                      "episodes": result["episodes"], "seed": seed, "length_mean": result["length_mean"],
                      "seconds": round(time.perf_counter() - t0, 3), "export_s": round(export_s, 3),
                      "time": time.time()}
        self.last = evaluation
        if self.best is None or evaluation["return_mean"] > self.best["return_mean"]:
            self._keep_best(Path(policy_path), evaluation)
            self.best = evaluation
        log.info("evaluation %d at learner step %d: mean return %.2f (std %.2f, %d episodes); best %.2f",
                 self.count, learner_steps, evaluation["return_mean"], evaluation["return_std"],
                 evaluation["episodes"], self.best["return_mean"])
        return evaluation

    def _keep_best(self, policy_path: Path, evaluation: dict) -> None:
        """Move the scored export to policy/best/, its policy.json recording the evaluation."""
        from aiorl.export import POLICY_META, read_meta

        best = self.policy_dir / BEST_DIR
        best.mkdir(parents=True, exist_ok=True)
        meta = {**(read_meta(policy_path) or {}), "evaluation": evaluation}
        # The program first, then the record naming it: a crash between the two leaves the older
        # (lower) record, and a resumed run at worst keeps a better policy than it records.
        os.replace(policy_path, best / policy_path.name)
        tmp = best / f".{POLICY_META}.tmp"
        tmp.write_text(json.dumps(meta, indent=1) + "\n")
        os.replace(tmp, best / POLICY_META)

    def summary(self) -> dict:
        """What the heartbeats carry to the coordinator."""
        return {"count": self.count, "last": self.last, "best": self.best}

    def close(self) -> None:
        shutil.rmtree(self.scratch(), ignore_errors=True)


def evaluation_metrics(summary: dict) -> dict:
    """The metrics.jsonl keys of the last evaluation (documented in aiorl.metrics)."""
    last, best = summary["last"], summary["best"]
    return {"eval/return_mean": last["return_mean"], "eval/return_std": last.get("return_std"),
            "eval/episodes": last.get("episodes"), "eval/learner_steps": last["learner_steps"],
            "eval/seed": last.get("seed"),
            "eval/best_return_mean": best["return_mean"] if best is not None else None}
