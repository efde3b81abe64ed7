"""The process that evaluations during training run in, beside learner 0.

Why a process of its own, not a thread of the learner's: the episodes are
Python (env steps, one policy call per step), and a thread running them
holds the GIL in the learner's process. Every small torch op of a learner
step releases and re-takes the GIL, so the step waits for the evaluation at
each one: DQN CartPole trained at 0.85x its learner steps/s with a
10-episode evaluation every 1,000 steps in a thread. In a process of its own
the evaluation costs only the CPU time it uses (``bench/learning.py
eval-cost`` measures it), and it runs ``run.eval_nice`` (10) nicer than the
learner: where actors, memories and learners keep every core busy, as they do
on a small machine, the evaluation takes the CPU they leave rather than an
equal share.

The learner (`EvalWorker`) starts ``python -m aiorl.runtime.eval_worker`` when
it registers and talks to it over the child's stdin and stdout, one JSON
line each way per evaluation. The policy travels as its ``state_dict`` in an
``.npz`` file of plain arrays (read with ``allow_pickle=False``) in a private
directory of the run's (``RUN_DIR/.evaluation-*``, removed at the end); the
worker builds the same module once, from the learner's config, as ``aiorl
eval --checkpoint`` builds one (`aiorl.eval_options.cpu_learner`), and loads
each state into it. An
evaluation that beats the best so far is exported by the worker, off the
learner's process too.

Ending: SIGTERM ends an evaluation in flight at its next env step (the
reply says ``stopped``); a closed stdin ends the worker; and the worker
dies with the learner (``PR_SET_PDEATHSIG``), so a learner killed outright
leaves no worker behind.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from aiorl.config import Config

STATE_FILE = "state.npz"
WORK_DIR_PREFIX = ".evaluation-"  # RUN_DIR/.evaluation-XXXX: the config and the state sent; removed at close
CLOSE_TIMEOUT_S = 10.0


class EvalWorkerDied(RuntimeError):
    """The evaluation process ended without answering: an aiorl bug, reported with its exit code."""


class EvalWorker:
    """Learner 0's side: start the worker, send it a policy state, read back its evaluation."""

    def __init__(self, cfg: Config, policy_dir: Path):
        # In the run directory, beside the checkpoints that hold the same weights (mkdtemp: 0700).
        policy_dir.parent.mkdir(parents=True, exist_ok=True)
        self.dir = Path(tempfile.mkdtemp(prefix=WORK_DIR_PREFIX, dir=policy_dir.parent))
        cfg.dump(self.dir / "config.yaml")
        # Started from the thread that outlives it (the loop's): PR_SET_PDEATHSIG fires when the
        # creating thread ends, not the process.
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "aiorl.runtime.eval_worker",
                "--parent",
                str(os.getpid()),
                "--nice",
                str(cfg.run.eval_nice),
                str(self.dir / "config.yaml"),
                str(policy_dir),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            close_fds=True,
        )
        self.stopping = False

    def evaluate(self, state: dict[str, np.ndarray], request: dict) -> dict | None:
        """Score `state` (a state_dict as numpy arrays); None: stopped before its episodes ended."""
        path = self.dir / STATE_FILE  # read only once the request line below arrives: no torn file
        with open(path, "wb") as f:
            np.savez(f, **state)
        try:
            self.proc.stdin.write((json.dumps({**request, "state": str(path)}) + "\n").encode())
            self.proc.stdin.flush()
            line = self.proc.stdout.readline()
        except (BrokenPipeError, ValueError):  # ValueError: stdin closed by close() meanwhile
            line = b""
        if not line:
            if self.stopping:
                return None
            raise EvalWorkerDied(
                f"the evaluation worker (pid {self.proc.pid}) exited with code "
                f"{self.proc.wait()} without answering; its errors are in this log above"
            )
        reply = json.loads(line)
        return None if reply.get("stopped") else reply

    def interrupt(self) -> None:
        """End an evaluation in flight at its next env step (the worker then exits)."""
        self.stopping = True
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)

    def close(self) -> None:
        """End the worker (bounded) and remove its directory; idempotent."""
        self.interrupt()
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=CLOSE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc.stdout.close()
        shutil.rmtree(self.dir, ignore_errors=True)


# --------------------------------------------------------------------------
# The worker process


class _Stop:
    """Set by SIGTERM; read by run_episodes_together between env steps (an Event's set() takes a lock,
    which a signal handler must not)."""

    def __init__(self):
        self.flag = False

    def is_set(self) -> bool:
        return self.flag


def _die_with_parent(parent: int) -> None:
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass  # not Linux: the learner's closed stdin still ends the worker
    if os.getppid() != parent:  # the learner died before prctl took effect
        os._exit(0)


def score(policy, cfg: Config, request: dict, policy_dir: Path, stop) -> dict:
    """One evaluation of `policy` (its state loaded); the best so far is exported to policy/best/."""
    from aiorl.evaluate import run_episodes_together
    from aiorl.export import save_policy
    from aiorl.runtime.evaluator import BEST_DIR, eval_seed

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
    if kept:
        # save_policy writes the program, then the record: a crash between the two leaves the older
        # (lower) record, and a resumed run at worst keeps a better policy than it records.
        save_policy(policy, policy_dir / BEST_DIR, {**request["meta"], "evaluation": evaluation})
    return {"evaluation": evaluation, "kept": kept}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m aiorl.runtime.eval_worker")
    parser.add_argument("--parent", type=int, required=True)
    parser.add_argument("--nice", type=int, default=0)
    parser.add_argument("config")
    parser.add_argument("policy_dir")
    args = parser.parse_args(argv)
    _die_with_parent(args.parent)
    os.nice(args.nice)  # before the imports: the start-up's seconds of CPU yield to training too
    stop = _Stop()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group: the learner ends us
    signal.signal(signal.SIGTERM, lambda *_: setattr(stop, "flag", True))
    replies = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # a library's print cannot corrupt the replies

    import torch

    from aiorl.config import load_config
    from aiorl.eval_options import cpu_learner

    torch.set_num_threads(1)  # ten observations a call: extra threads only take the learner's cores
    cfg = load_config(args.config)
    policy, _ = cpu_learner(cfg).acting_policy()
    policy = policy.train(False).requires_grad_(False)
    for line in sys.stdin:
        if stop.is_set():
            break
        request = json.loads(line)
        with np.load(request["state"], allow_pickle=False) as arrays:
            policy.load_state_dict({k: torch.from_numpy(arrays[k]) for k in arrays.files})
        replies.write(json.dumps(score(policy, cfg, request, Path(args.policy_dir), stop)) + "\n")
        if stop.is_set():
            break
    return 0


if __name__ == "__main__":
    sys.exit(main())
