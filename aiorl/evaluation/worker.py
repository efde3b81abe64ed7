"""The evaluation process: `python -m aiorl.evaluation.worker`, started by learner 0
(`aiorl.runtime.eval_worker.EvalWorker`, which says why a process and how they talk).

It builds the learner's acting policy once, from the learner's config, as ``aiorl eval
--checkpoint`` builds one (`aiorl.evaluation.options.cpu_learner`), loads each state the
learner sends into it, scores it and answers. A new best is exported to ``policy/best/``
when no request waits (and before the worker ends): an export takes a tenth of a second
or more of CPU, seconds at ``run.eval_nice`` on a busy machine, and the evaluations due
meanwhile would wait for it; a newer best replaces one not exported yet.

It takes ``run.eval_nice`` only once it is warm: its policy built and one export traced
(the first export in a process costs several times the later ones), the trace when no
request waits. Both happen at the run's start, where the first evaluations would
otherwise wait for them at the lower priority.
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import os
import select
import signal
import sys
import time
from pathlib import Path

import numpy as np

from aiorl.config import Config
from aiorl.evaluation.episodes import run_episodes_together
from aiorl.evaluation.options import cpu_learner
from aiorl.experiment.loading import load_config
from aiorl.io.export import example_inputs, save_policy
from aiorl.ope.training import TrainingOpe
from aiorl.runtime.evaluator import BEST_DIR, eval_seed


class _Woken(Exception):
    """SIGTERM while the worker waits for a request with a best policy still to export."""


class _Stop:
    """Set by SIGTERM; read by run_episodes_together between env steps (an Event's set() takes a lock,
    which a signal handler must not). While the worker waits for a request, SIGTERM ends it at once
    (one still building its policy has nothing to finish either, and the learner's shutdown waits
    for it), unless a best policy is still to be exported: then the wait ends and the export is made
    first. In an evaluation or an export it only sets the flag: the evaluation ends at its next env
    step, the export is finished (the learner was told that policy is kept); so it does in the
    warm-up while a best waits (an exception raised in the middle of an import leaves torch half
    imported, and that export would fail)."""

    def __init__(self):
        self.flag = False
        self.evaluating = False  # in an evaluation or an export (or a warm-up a best export waits on)
        self.exporting_later = False  # a best policy waits for its export

    def is_set(self) -> bool:
        return self.flag

    def on_sigterm(self, *_) -> None:
        self.flag = True
        if self.evaluating:
            return
        if self.exporting_later:
            raise _Woken
        os._exit(0)


class _Requests:
    """The learner's requests, one JSON line each, read from a file descriptor without a read-ahead
    buffer that `waiting` could not see."""

    def __init__(self, fd: int):
        self.fd = fd
        self.buffer = b""

    def waiting(self) -> bool:
        """A request (or the end of the input) can be read without waiting."""
        return b"\n" in self.buffer or bool(select.select([self.fd], [], [], 0)[0])

    def next(self) -> dict | None:
        """The next request; None at the end of the input."""
        while b"\n" not in self.buffer:
            chunk = os.read(self.fd, 1 << 16)
            if not chunk:
                return None
            self.buffer += chunk
        line, _, self.buffer = self.buffer.partition(b"\n")
        return json.loads(line)


def _die_with_parent(parent: int) -> None:
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass  # not Linux: the learner's closed stdin still ends the worker
    if os.getppid() != parent:  # the learner died before prctl took effect
        os._exit(0)


def score(policy, cfg: Config, request: dict, stop, ope: TrainingOpe | None = None) -> dict:
    """One evaluation of `policy` (its state loaded): the answer, and whether it is the best so far
    (`keep` exports it). `ope` (with offline.eval_dataset) adds its off-policy estimates; an offline
    run without an env has those alone (no episodes, no return, no best kept)."""
    t0 = time.perf_counter()
    seed = eval_seed(cfg)
    result = {"mean": None, "std": None, "min": None, "episodes": 0, "length_mean": None}
    if cfg.env.id is not None:
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
    if ope is not None:
        evaluation.update(ope.score(policy))
    best = request.get("best")
    kept = evaluation["return_mean"] is not None and (best is None or evaluation["return_mean"] > best)
    return {"evaluation": evaluation, "kept": kept}


def keep(policy, request: dict, reply: dict, policy_dir: Path) -> None:
    """Export the policy scored to policy/best/ (`reply` said it is the best so far)."""
    # save_policy writes the program, then the record: a crash between the two leaves the older
    # (lower) record, and a resumed run at worst keeps a better policy than it records.
    save_policy(policy, policy_dir / BEST_DIR, {**request["meta"], "evaluation": reply["evaluation"]})


def _warm_export(policy, meta: dict) -> None:
    """Trace one export of `policy` (not saved): the first export in a process costs several times
    the later ones (about 2 s of CPU on a small machine, torch._dynamo's import included, which
    nothing before it imports: the spawner leaves it out of every run's path to RUNNING)."""
    import torch

    inputs, dynamic = example_inputs(meta)
    with torch.no_grad():
        torch.export.export(policy, inputs, dynamic_shapes=dynamic)


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
    policy, meta = cpu_learner(cfg).acting_policy()
    policy = policy.train(False).requires_grad_(False)
    # On stderr, which is learner 0's log: when evaluations could start (bench/startup.py reads it).
    logging.basicConfig(stream=sys.stderr, format="%(asctime)s eval-worker %(levelname)s %(name)s: %(message)s")
    log = logging.getLogger("aiorl.evaluation")
    log.setLevel(logging.INFO)
    log.info("evaluation worker ready (pid %d)", os.getpid())
    ope = TrainingOpe.from_config(cfg)  # offline.eval_dataset read, its behaviour probabilities found, once
    serve(
        policy,
        cfg,
        _Requests(0),
        replies,
        Path(args.policy_dir),
        stop,
        lambda: _warm(policy, meta, args.nice, log),
        ope,
    )
    return 0


def _warm(policy, meta: dict, nice: int, log) -> None:
    """Trace one export of the policy, then take `nice` (run.eval_nice)."""
    t0 = time.perf_counter()
    try:
        _warm_export(policy, meta)
    except Exception as exc:  # the real export says what is wrong, where it matters
        log.warning("could not trace an export of the policy ahead: %s", exc)
    os.nice(nice)
    log.info("evaluation worker warm (an export traced in %.2f s); nice %d from now", time.perf_counter() - t0, nice)


def serve(
    policy,
    cfg: Config,
    requests: _Requests,
    replies,
    policy_dir: Path,
    stop: _Stop,
    warm,
    ope: TrainingOpe | None = None,
) -> None:
    """Answer each request in turn (`ope`: off-policy estimates too); when none waits, `warm()` once,
    then export the newest best (and before the end)."""
    import torch

    best = None  # (policy copy, request, reply) of a best not exported yet
    try:
        while not stop.is_set():
            if warm is not None and not requests.waiting():
                # A best waiting for its export: a SIGTERM now must not end the warm-up half-way
                # through its imports (torch._dynamo's), which would break that export.
                stop.evaluating = best is not None
                warm()
                stop.evaluating = False
                warm = None
                continue
            if best is not None and not requests.waiting():
                stop.evaluating = True
                keep(*best, policy_dir)
                best = None
                stop.exporting_later = False
                stop.evaluating = False
                continue
            request = requests.next()
            if request is None:
                break
            stop.evaluating = True
            with np.load(request["state"], allow_pickle=False) as arrays:
                policy.load_state_dict({k: torch.from_numpy(arrays[k]) for k in arrays.files})
            reply = score(policy, cfg, request, stop, ope)
            replies.write(json.dumps(reply) + "\n")  # the learner has its result before any export
            if reply.get("kept"):
                best = (copy.deepcopy(policy), request, reply)
                stop.exporting_later = True
            stop.evaluating = False
    except _Woken:  # SIGTERM while waiting, with a best to export
        pass
    stop.evaluating = True  # a SIGTERM now lets the export finish
    if best is not None:
        keep(*best, policy_dir)


if __name__ == "__main__":
    sys.exit(main())
