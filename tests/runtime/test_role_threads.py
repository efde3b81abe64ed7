"""An actor's worker threads run torch on the thread count the process set (model.torch_threads);
a learner's keep MKL's own.

torch.set_num_threads sets it for the calling thread only as far as MKL is concerned: a new
thread's gemm or tanh ran with a second MKL thread that spun beside it, and an actor runs its
slow env steps in worker threads (`aiorl.runtime.role.Offload`). On two busy cores that made an
IMPALA-LSTM actor ten times slower. A learner's steps are what a run waits for, and its gemms
measured faster with MKL's second thread (`aiorl.runtime.process.role_loop`)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

# In a fresh process (the suite's torch settings are its own): the process sets 1 thread, then
# a worker thread runs small torch ops and counts the process's threads before and after them.
# A role kind: the worker thread of that role run by `run_role` (its work replaced by this);
# "plain": of a plain uvloop loop, the control.
SCRIPT = """
import asyncio, os, sys
import torch, uvloop
from aiorl.experiment.loading import load_config
from aiorl.runtime import process

torch.set_num_threads(1)


def threads_added_by_torch_ops():
    before = len(os.listdir("/proc/self/task"))
    x, w = torch.ones(8, 64), torch.ones(64, 64)
    for _ in range(50):
        torch.tanh(x @ w)
    return len(os.listdir("/proc/self/task")) - before


async def role(cfg, kind, index, run_dir):
    print(await asyncio.to_thread(threads_added_by_torch_ops))
    return 0


if sys.argv[1] != "plain":
    process._run_role = role
    cfg = load_config(data={"algo": "random_agent", "env": {"id": "CartPole-v1"}}, overrides=[f"run.dir={sys.argv[2]}"])
    sys.exit(process.run_role(cfg, sys.argv[1], 0, sys.argv[2]))
loop = uvloop.new_event_loop()
print(loop.run_until_complete(asyncio.to_thread(threads_added_by_torch_ops)))
"""


def threads_added(which: str, run_dir) -> int:
    cmd = [sys.executable, "-c", SCRIPT, which, str(run_dir)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return int(out.stdout.split()[0])


ONE_CORE = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="one core: MKL starts no second thread")


@ONE_CORE
def test_an_actors_worker_threads_keep_the_processs_torch_thread_count(tmp_path):
    # The control shows the test sees the difference on this machine: a plain loop's worker
    # thread gets an MKL thread of its own.
    assert threads_added("plain", tmp_path) >= 1
    assert threads_added("actor", tmp_path) == 0


@ONE_CORE
def test_a_learners_worker_threads_keep_mkls_own_thread_count(tmp_path):
    assert threads_added("learner", tmp_path) >= 1
