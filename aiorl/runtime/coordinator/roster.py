"""The roster: every role of the run, its record, and who is admitted when.

Registration carries the role process's ``incarnation`` (a nonce per
process). The same incarnation registering again is a role whose control
connection dropped and came back: it *rejoins* with its counters and its
session. A new incarnation of a lost role is a *restart* (`aiorl.runtime.restart`):
accepted within ``cluster.max_restarts`` while STARTING or RUNNING, its
predecessor's counters kept, with a new session (memory hosts then drop the
old one's connections). A role whose connection closes is ``disconnected`` (still
live) for ``cluster.coordinator_timeout_s`` plus two heartbeats, its time to
rejoin, before it is declared lost.

The roster decides (admission, verdicts) and records; what a verdict means for
the run (barriers, work items, the stop) is the service's to act on.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
from dataclasses import dataclass, field

from aiorl.config import Config
from aiorl.runtime.phase import Phase, role_name
from aiorl.runtime.restart import restartable
from aiorl.wire import Connection

log = logging.getLogger("aiorl.coordinator")


@dataclass
class RoleRecord:
    name: str
    kind: str
    index: int
    conn: Connection | None = None
    pid: int | None = None
    host: str | None = None
    address: tuple[str, int] | None = None  # memory hosts: where actors and learners connect
    status: str = "expected"  # expected, running, disconnected, done, lost, failed
    reason: str | None = None
    session: str | None = None  # id of its current registration
    last_heartbeat: float = 0.0
    stall_at_heartbeat_s: float = 0.0  # the coordinator's own stalled time when that heartbeat came
    done_phase: str | None = None  # the phase in which the role reported done
    counters: dict[str, int] = field(default_factory=dict)
    metrics: dict = field(default_factory=dict)
    stats: dict = field(default_factory=dict)
    incarnation: str | None = None  # the registered process's nonce
    restarts: int = 0
    joins_iteration: int = 0  # synchronous actors: the first iteration this incarnation acts in
    retired: dict[str, int] = field(default_factory=dict)  # counters of its earlier incarnations
    disconnected_at: float | None = None
    counters_time: float = 0.0  # loop time its counters were last accepted (or it registered)

    @property
    def live(self) -> bool:
        return self.status in ("expected", "running", "disconnected", "done")

    def total(self, key: str) -> int:
        return self.retired.get(key, 0) + self.counters.get(key, 0)

    def public(self, now: float) -> dict:
        return {
            "status": self.status,
            "reason": self.reason,
            "pid": self.pid,
            "host": self.host,
            "address": list(self.address) if self.address else None,
            "heartbeat_age_s": round(now - self.last_heartbeat, 3) if self.last_heartbeat else None,
            "restarts": self.restarts,
            "counters": self.counters,
            "metrics": self.metrics,
        }


class Roster:
    """The run's roles by name; `changed` is set on any status change (phase waits re-check)."""

    def __init__(self, cfg: Config, synchronous: bool):
        self.cfg = cfg
        self.synchronous = synchronous
        c = cfg.cluster
        self.roles: dict[str, RoleRecord] = {}
        for kind, count in (("memory", c.memories), ("learner", c.learners), ("actor", c.actors)):
            for i in range(count):
                self.roles[role_name(kind, i)] = RoleRecord(role_name(kind, i), kind, i)
        self.changed = asyncio.Event()

    def __len__(self) -> int:
        return len(self.roles)

    @property
    def restarts(self) -> int:
        return sum(r.restarts for r in self.roles.values())

    def unknown_role(self, name: str) -> str | None:
        """Why `name` cannot register in this cluster, or None."""
        if name in self.roles:
            return None
        c = self.cfg.cluster
        return (
            f"unknown role {name!r}: this cluster has {c.actors} actors, {c.memories} memories, {c.learners} learners"
        )

    def admission(self, record: RoleRecord, incarnation: str, phase: Phase) -> tuple[str | None, str | None]:
        """("first" | "rejoin" | "restart", None), or (None, why the registration is refused)."""
        name, status = record.name, record.status
        if status == "expected" or record.session is None:  # it never registered (lost at the start)
            if phase != Phase.STARTING:
                return None, f"{name} registered too late: the run is in phase {phase.name}"
            return "first", None
        if incarnation and incarnation == record.incarnation:
            if status == "failed" or phase >= Phase.EXITED:
                return None, f"{name} cannot rejoin: it is {status} and the run is in phase {phase.name}"
            if status == "lost":  # given up (silent too long): its work and rounds went on without it
                return None, f"{name} cannot rejoin: it was declared lost ({record.reason})"
            return "rejoin", None
        if status in ("running", "done"):
            return None, f"{name} is already registered (status {status})"
        c = self.cfg.cluster
        if not restartable(record.kind, record.index, self.synchronous):
            return None, f"{name} is {status} and is not restarted (see aiorl/runtime/restart.py)"
        if record.restarts >= c.max_restarts:
            return None, f"{name} used its {c.max_restarts} restart(s) (cluster.max_restarts)"
        if phase > Phase.RUNNING:
            return None, f"{name} cannot restart: the run is in phase {phase.name}"
        return "restart", None

    def restarted(self, record: RoleRecord, incarnation: str) -> None:
        """A new incarnation of `record` was admitted: its predecessor's counters are retired, kept."""
        for key, value in record.counters.items():
            record.retired[key] = record.retired.get(key, 0) + value
        record.counters = {}
        record.restarts += 1
        record.incarnation = incarnation

    async def await_replaced(self, record: RoleRecord) -> None:
        """A new process for a role whose old one still looks alive: give the heartbeat monitor
        its time to find the old one lost (a restart after a crash the coordinator missed)."""
        deadline = self.cfg.cluster.heartbeat_timeout_s + self.cfg.cluster.heartbeat_interval_s
        try:
            async with asyncio.timeout(deadline):
                while record.status == "running":
                    self.changed.clear()
                    await self.changed.wait()
        except TimeoutError:
            pass

    def check_session(self, name: str, session: str) -> str | None:
        """None when `session` is the id of `name`'s live registration, else why not."""
        record = self.roles.get(name)
        if record is None or record.session is None:
            return f"{name} is not registered in this run"
        if not hmac.compare_digest(record.session, session):
            return f"not the session of {name}'s current registration"
        if not record.live:
            return f"{name}'s registration has ended ({record.status})"
        return None

    def memory_addresses(self) -> list:
        """Where each memory host serves, None for one that is away (it may be restarting)."""
        out = []
        for i in range(self.cfg.cluster.memories):
            record = self.roles[role_name("memory", i)]
            up = record.address is not None and record.status in ("running", "done")
            out.append(list(record.address) if up else None)
        return out

    @property
    def rejoin_grace_s(self) -> float:
        c = self.cfg.cluster
        return c.coordinator_timeout_s + 2 * c.heartbeat_interval_s

    def may_return(self, record: RoleRecord, phase: Phase) -> bool:
        """Whether a lost `record` may still come back: a restart is admitted (`admission`) before
        STOPPING, within its budget."""
        return phase <= Phase.RUNNING and self.restart_left(record)

    def restart_left(self, record: RoleRecord) -> bool:
        return (
            restartable(record.kind, record.index, self.synchronous) and record.restarts < self.cfg.cluster.max_restarts
        )

    def connection_lost(self, record: RoleRecord, now: float) -> None:
        record.conn = None
        if record.status == "running":
            record.status = "disconnected"
            record.disconnected_at = now
            log.warning(
                "%s: its connection to the coordinator closed; waiting %.1f s for it to rejoin",
                record.name,
                self.rejoin_grace_s,
            )
            self.changed.set()

    def mark(self, record: RoleRecord, status: str, reason: str) -> bool:
        """Record a verdict; False when the role already had one (the first explains the run)."""
        if record.status in ("lost", "failed"):
            # A hung role that wakes after it was given up finds its links cut and reports that:
            # the first verdict is the one that explains the run.
            log.info("%s, already %s (%s), also reports: %s", record.name, record.status, record.reason, reason)
            return False
        record.status = status
        record.reason = reason
        log.warning("%s %s: %s", record.name, status, reason)
        self.changed.set()
        return True

    def pending(self, kind: str | None) -> list[RoleRecord]:
        """The roles of `kind` (None: all) that have not reported done and are not given up."""
        return [
            r
            for r in self.roles.values()
            if (kind is None or r.kind == kind) and r.status in ("running", "disconnected")
        ]

    def alive(self, kind: str) -> list[RoleRecord]:
        return [r for r in self.roles.values() if r.kind == kind and r.live]
