"""Offload: a role's work (env steps, learner steps) runs on the loop thread while it is quick,
in a worker thread once it is not; "quick" is measured in the CPU the call spent, unless it
mostly waited."""

from __future__ import annotations

import threading

import pytest

from aiorl.runtime import role


class Clock:
    """Stands in for `time` in aiorl.runtime.role: the calls below move it by hand."""

    def __init__(self):
        self.wall = self.cpu = 0.0

    def perf_counter(self) -> float:
        return self.wall

    def thread_time(self) -> float:
        return self.cpu


@pytest.fixture
def clock(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(role, "time", clock)
    return clock


def work(clock: Clock, wall_s: float, cpu_s: float):
    def call():
        clock.wall += wall_s
        clock.cpu += cpu_s
        return threading.current_thread() is threading.main_thread()

    return call


async def test_a_cheap_call_the_scheduler_stretched_runs_inline(clock):
    """1.5 ms of CPU over 50 ms of wall time (a busy machine): the calls after the first
    (threaded, timed) run on the loop thread, and stay there."""
    offload = role.Offload(inline_below_s=0.010)
    on_loop = [await offload(work(clock, 0.050, 0.0015)) for _ in range(6)]
    assert on_loop == [False, True, True, True, True, True]


async def test_a_call_that_waits_or_computes_long_runs_in_a_thread(clock):
    """Waiting past ten times the bound (I/O, a device) counts whatever the CPU; so does CPU past
    the bound. An inline call that turns slow sends the next one to a thread."""
    waiting = role.Offload(inline_below_s=0.010)
    assert not any([await waiting(work(clock, 0.2, 0.0)) for _ in range(5)])
    computing = role.Offload(inline_below_s=0.010)
    assert not any([await computing(work(clock, 0.02, 0.02)) for _ in range(5)])
    turning = role.Offload(inline_below_s=0.010)
    on_loop = [await turning(work(clock, 0.001, 0.001)) for _ in range(3)]
    on_loop += [await turning(work(clock, 0.02, 0.02)), await turning(work(clock, 0.001, 0.001))]
    assert on_loop == [False, True, True, True, False]


async def test_offload_is_refused_inline_when_not_allowed(clock):
    offload = role.Offload(inline_below_s=0.010, allowed=False)
    assert not any([await offload(work(clock, 0.001, 0.001)) for _ in range(4)])
