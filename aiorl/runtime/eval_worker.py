"""The process that evaluations during training run in, beside learner 0.

Why a process of its own, not a thread of the learner's: the episodes are
Python (env steps, one policy call per step), and a thread running them
holds the GIL in the learner's process. Every small torch op of a learner
step releases and re-takes the GIL, so the step waits for the evaluation at
each one: DQN CartPole trained at 0.85x its learner steps/s with a
10-episode evaluation every 1,000 steps in a thread. In a process of its own
the evaluation costs only the CPU time it uses (``bench/learning.py
eval-cost`` measures it), and it runs ``run.eval_nice`` (10) nicer than the
learner once it is warm (its policy built and one export traced, at the run's
start): where actors, memories and learners keep every core busy, as they do
on a small machine, the evaluation takes the CPU they leave rather than an
equal share. What it does is small (ten CartPole episodes side by side are a
few tenths of a second of CPU; a new best's export waits until no evaluation
does), so under a busy neighbour its results still come within a second of
being due (``bench/learning.py eval-lag``).

The learner (`EvalWorker`) starts ``python -m aiorl.evaluation.worker`` when
it registers and talks to it over the child's stdin and stdout, one JSON
line each way per evaluation. The policy travels as its ``state_dict`` in an
``.npz`` file of plain arrays (read with ``allow_pickle=False``) in a private
directory of the run's (``RUN_DIR/.evaluation-*``, removed at the end); the
worker builds the same module once, from the learner's config, as ``aiorl
eval --checkpoint`` builds one (`aiorl.evaluation.options.cpu_learner`), and loads
each state into it. An
evaluation that beats the best so far is exported by the worker, off the
learner's process too.

Ending: SIGTERM ends an evaluation in flight at its next env step (the
reply says ``stopped``); a closed stdin ends the worker; and the worker
dies with the learner (``PR_SET_PDEATHSIG``), so a learner killed outright
leaves no worker behind.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from aiorl.config import Config
from aiorl.io.rundir import make_subdir
from aiorl.runtime.warm_fork import ForkedProcess, SpawnerChannel

STATE_FILE = "state.npz"
WORK_DIR_PREFIX = ".evaluation-"  # RUN_DIR/.evaluation-XXXX: the config and the state sent; removed at close
CLOSE_TIMEOUT_S = 10.0

log = logging.getLogger("aiorl.evaluation")


class EvalWorkerDied(RuntimeError):
    """The evaluation process ended without answering: an aiorl bug, reported with its exit code."""


class EvalWorker:
    """Learner 0's side: start the worker, send it a policy state, read back its evaluation."""

    def __init__(self, cfg: Config, policy_dir: Path):
        # In the run directory, beside the checkpoints that hold the same weights (mkdtemp: 0700).
        make_subdir(policy_dir.parent)  # the run directory, checked: a deleted one is never made again
        self.dir = Path(tempfile.mkdtemp(prefix=WORK_DIR_PREFIX, dir=policy_dir.parent))
        cfg.dump(self.dir / "config.yaml")
        args = [
            "--nice",
            str(cfg.run.eval_nice),
            str(self.dir / "config.yaml"),
            str(policy_dir),
        ]
        channel = SpawnerChannel.from_env()
        if channel is not None:
            self.proc = _fork_worker(channel, args)
        else:
            # Started from the thread that outlives it (the loop's): PR_SET_PDEATHSIG fires when the
            # creating thread ends, not the process.
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-P",  # nothing from the working directory (see aiorl.launch.local)
                    "-m",
                    "aiorl.evaluation.worker",
                    "--parent",
                    str(os.getpid()),
                    *args,
                ],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                close_fds=True,
            )
        log.info("evaluation worker started (pid %d, %s)", self.proc.pid, "forked" if channel else "started")
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


def _fork_worker(channel: SpawnerChannel, args: list[str]) -> ForkedProcess:
    """The worker forked by the warm spawner (it has torch imported: ready at once), talking over
    pipes this process made; it is the spawner's child, and the spawner ends it with this learner."""
    stdin_r, stdin_w = os.pipe()
    stdout_r, stdout_w = os.pipe()
    try:
        # Its parent is the spawner, ours too: the worker checks that parent, not this learner.
        proc = channel.spawn(
            "eval_worker", ["--parent", str(os.getppid()), *args], fds=[stdin_r, stdout_w, sys.stderr.fileno()]
        )
    except BaseException:
        for fd in (stdin_w, stdout_r):
            os.close(fd)
        raise
    finally:
        os.close(stdin_r)
        os.close(stdout_w)
    proc.stdin = os.fdopen(stdin_w, "wb")
    proc.stdout = os.fdopen(stdout_r, "rb")
    return proc
