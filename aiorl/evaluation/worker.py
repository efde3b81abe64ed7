"""The evaluation process: `python -m aiorl.evaluation.worker`, started by learner 0
(`aiorl.runtime.eval_worker.EvalWorker`, which says why a process and how they talk).

It builds the learner's acting policy once, from the learner's config, as ``aiorl eval
--checkpoint`` builds one (`aiorl.evaluation.options.cpu_learner`), loads each state the
learner sends into it, scores it, answers, and then exports a new best to ``policy/best/``
(the answer does not wait for the export: a few tenths of a second, seconds on a busy
machine). It takes ``run.eval_nice`` once its policy is built: the build, at the run's
start, is what the first evaluation would otherwise wait for.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import time
from pathlib import Path

import numpy as np

from aiorl.config import Config
from aiorl.evaluation.episodes import run_episodes_together
from aiorl.evaluation.options import cpu_learner
from aiorl.experiment.loading import load_config
from aiorl.io.export import save_policy
from aiorl.runtime.evaluator import BEST_DIR, eval_seed


class _Stop:
    """Set by SIGTERM; read by run_episodes_together between env steps (an Event's set() takes a lock,
    which a signal handler must not). Outside an evaluation or an export SIGTERM ends the worker at
    once: one still building its policy, or idle, has nothing to finish, and the learner's shutdown
    waits for it. An export in flight is finished first (the learner was told that policy is kept)."""

    def __init__(self):
        self.flag = False
        self.evaluating = False

    def is_set(self) -> bool:
        return self.flag

    def on_sigterm(self, *_) -> None:
        self.flag = True
        if not self.evaluating:
            os._exit(0)


def _die_with_parent(parent: int) -> None:
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass  # not Linux: the learner's closed stdin still ends the worker
    if os.getppid() != parent:  # the learner died before prctl took effect
        os._exit(0)


def score(policy, cfg: Config, request: dict, stop) -> dict:
    """One evaluation of `policy` (its state loaded): the answer, and whether it is the best so far
    (`keep` exports it)."""
    t0 = time.perf_counter()
    seed = eval_seed(cfg)
    result = run_episodes_together(policy, cfg.env, cfg.run.eval_episodes, seed, stop=stop)
    if result is None:
        return {"stopped": True}
    evaluation = {
        "n": request["n"],
        "learner_steps": request["learner_steps"],
        "env_steps": request["env_steps"],
        "return_mean": result["mean"],
        "return_std": result["std"],
        "return_min": result["min"],
        "episodes": result["episodes"],
        "seed": seed,
        "length_mean": result["length_mean"],
        "seconds": round(time.perf_counter() - t0, 3),
        "copy_s": request["copy_s"],
        "time": time.time(),
        # this process's CPU so far, its start-up included: what evaluation has cost the run
        "worker_cpu_s": round(time.process_time(), 2),
    }
    best = request.get("best")
    kept = best is None or evaluation["return_mean"] > best
    return {"evaluation": evaluation, "kept": kept}


def keep(policy, request: dict, reply: dict, policy_dir: Path) -> None:
    """Export the policy scored to policy/best/ when `reply` says it is the best so far."""
    if reply.get("kept"):
        # save_policy writes the program, then the record: a crash between the two leaves the older
        # (lower) record, and a resumed run at worst keeps a better policy than it records.
        save_policy(policy, policy_dir / BEST_DIR, {**request["meta"], "evaluation": reply["evaluation"]})


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m aiorl.evaluation.worker")
    parser.add_argument("--parent", type=int, required=True)
    parser.add_argument("--nice", type=int, default=0)
    parser.add_argument("config")
    parser.add_argument("policy_dir")
    args = parser.parse_args(argv)
    _die_with_parent(args.parent)
    stop = _Stop()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group: the learner ends us
    signal.signal(signal.SIGTERM, stop.on_sigterm)
    replies = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # a library's print cannot corrupt the replies

    import torch

    torch.set_num_threads(1)  # ten observations a call: extra threads only take the learner's cores
    cfg = load_config(args.config)
    policy, _ = cpu_learner(cfg).acting_policy()
    policy = policy.train(False).requires_grad_(False)
    # On stderr, which is learner 0's log: when evaluations could start (bench/startup.py reads it).
    logging.basicConfig(stream=sys.stderr, format="%(asctime)s eval-worker %(levelname)s %(name)s: %(message)s")
    log = logging.getLogger("aiorl.evaluation")
    log.setLevel(logging.INFO)
    # Nicer only now: the build above is the run's start-up's (training has not begun), and the
    # first evaluation waits for it.
    os.nice(args.nice)
    log.info("evaluation worker ready (pid %d, nice %d)", os.getpid(), os.nice(0))
    for line in sys.stdin:
        if stop.is_set():
            break
        stop.evaluating = True
        request = json.loads(line)
        with np.load(request["state"], allow_pickle=False) as arrays:
            policy.load_state_dict({k: torch.from_numpy(arrays[k]) for k in arrays.files})
        reply = score(policy, cfg, request, stop)
        replies.write(json.dumps(reply) + "\n")  # the learner has its result before the export
        keep(policy, request, reply, Path(args.policy_dir))
        stop.evaluating = False
        if stop.is_set():
            break
    return 0


if __name__ == "__main__":
    sys.exit(main())
