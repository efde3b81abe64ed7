"""The shutdown phases: the current phase and its history, the wait for a phase's roles,
and the outcome a run ended with.

RUNNING until a stop criterion holds; STOPPING (actors deliver their last batch and
report done), DRAINING (learners finish and report done), CLOSING (memories apply the
last updates and report done), each with `cluster.phase_timeout_s`; then EXITED.
"""

from __future__ import annotations

import asyncio
import logging
import time

from aiorl.runtime.coordinator.counters import Stop
from aiorl.runtime.coordinator.roster import RoleRecord, Roster
from aiorl.runtime.phase import FAILED, FINISHED, INTERRUPTED, Phase

log = logging.getLogger("aiorl.coordinator")


class PhaseClock:
    """The run's phase; `changed` is a fresh Event per phase, set when it ends."""

    def __init__(self):
        self.phase = Phase.STARTING
        self.changed = asyncio.Event()
        self.times: list[dict] = []

    def enter(self, phase: Phase) -> None:
        self.phase = phase
        self.times.append({"phase": phase.name, "time": time.time()})
        log.info("phase %s", phase.name)
        self.changed.set()
        self.changed = asyncio.Event()

    def exited(self) -> None:
        self.phase = Phase.EXITED
        self.times.append({"phase": "EXITED", "time": time.time()})


async def wait_done(roster: Roster, kind: str | None, deadline_s: float) -> list[RoleRecord]:
    """Wait until every live role of `kind` reported done; return the ones still pending at the deadline."""
    try:
        async with asyncio.timeout(deadline_s):
            while roster.pending(kind):
                roster.changed.clear()
                await roster.changed.wait()
    except TimeoutError:
        return roster.pending(kind)
    return []


def settle_outcome(roster: Roster, stop: Stop) -> tuple[str, list[str]]:
    """(failed | interrupted | finished, the roles lost with restarts left); lost and failed
    roles are added to `stop.failures`.

    A role lost while it still had restarts left is not a failure: it was on its way back
    when the run ended (its restart arrives too late to be admitted)."""
    lost_restartable = []
    for record in roster.roles.values():
        if record.status == "lost" and roster.restart_left(record):
            lost_restartable.append(record.name)
        elif record.status in ("lost", "failed"):
            line = f"{record.name} {record.status}: {record.reason}"
            if line not in stop.failures:
                stop.failures.append(line)
    if (
        stop.failures
        or stop.by_failure
        or not all(r.status == "done" or r.name in lost_restartable for r in roster.roles.values())
    ):
        return FAILED, lost_restartable
    if stop.interrupted_by is not None:
        return INTERRUPTED, lost_restartable
    return FINISHED, lost_restartable


async def first_done(*awaitables) -> None:
    """Until the first of `awaitables` is done; the others are cancelled."""
    tasks = [asyncio.ensure_future(a) for a in awaitables]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
