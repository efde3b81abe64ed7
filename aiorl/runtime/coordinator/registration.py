"""Who is admitted as what when a role registers: the decision is a value (`Admission`), which
the coordinator's service acts on (its reply or refusal, the memory hosts told of a restarted
synchronous actor, the logs); once it is admitted, the role's record is brought up to date here.

What a registration must carry is checked first: a role of this cluster, under the name it
authenticated with, running the coordinator's config (a refusal for the user to fix). Then
when it came: a process the launcher saw exit is refused, and the roster's rules say whether
it is a first start, a rejoin or a restart (`Roster.admission`). A synchronous actor also
learns the iteration it joins, and a restarted one's memory hosts hear it is back.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Callable
from dataclasses import dataclass

from aiorl.runtime.coordinator.notices import ExitNotices
from aiorl.runtime.coordinator.params import ParameterStore
from aiorl.runtime.coordinator.phases import PhaseClock
from aiorl.runtime.coordinator.roster import RoleRecord, Roster
from aiorl.runtime.phase import Phase
from aiorl.wire import Connection


@dataclass(frozen=True)
class Admission:
    """What `Admissions.admit` decided about one registration."""

    role: str
    admitted_as: str | None = None  # "first", "rejoin" or "restart"; None: refused
    reason: str | None = None  # why it was refused
    misconfigured: bool = False  # refused for the user to fix (an error), not for when it came
    incarnation: str = ""
    joins_iteration: int | None = None  # a synchronous actor's first iteration, one rollout each
    address: tuple | None = None  # where a memory host serves: [host, port], a local run's socket after
    moved: bool = False  # a memory host now serves elsewhere: every role must hear the new addresses

    @property
    def admitted(self) -> bool:
        return self.admitted_as is not None

    @property
    def role_back(self) -> dict | None:
        """What the memory hosts must hear of it (``role_back``: the iteration a restarted
        synchronous actor's rollouts count from), or None."""
        if self.admitted_as != "restart" or self.joins_iteration is None:
            return None
        return {"role": self.role, "iteration": self.joins_iteration}


def registered_address(address) -> tuple | None:
    # [host, port], with a local run's Unix socket after them (messages.address checked it).
    return (str(address[0]), int(address[1]), *address[2:]) if address else None


def _loop_time() -> float:
    return asyncio.get_running_loop().time()


class Admissions:
    """Registrations decided against the roster, the phase, the exits the launcher saw and the
    config; `rollouts_by_iteration`: a synchronous run without work items (DPPO), whose actors
    each send one rollout per iteration."""

    def __init__(
        self,
        roster: Roster,
        phases: PhaseClock,
        params: ParameterStore,
        notices: ExitNotices,
        config_hash: str,
        rollouts_by_iteration: bool,
        clock: Callable[[], float] = _loop_time,
    ):
        self.roster = roster
        self.phases = phases
        self.params = params
        self.notices = notices
        self.config_hash = config_hash
        self.rollouts_by_iteration = rollouts_by_iteration
        self.clock = clock

    async def admit(self, peer_name: str, meta: dict) -> Admission:
        """The decision on a ``register`` request's `meta` from a connection authenticated as
        `peer_name`. It waits only where a new process's predecessor still looks alive."""
        name = meta["role"]
        reason = self.misconfigured(peer_name, name, meta.get("config_hash"))
        if reason is not None:
            return Admission(name, reason=reason, misconfigured=True)
        record = self.roster.roles[name]
        incarnation = meta.get("incarnation", "")
        reason = self.notices.exited(name, meta.get("pid"))
        if reason is not None:
            return Admission(name, reason=reason)
        if record.status == "running" and record.incarnation != incarnation:
            await self.roster.await_replaced(record)
        admitted_as, reason = self.roster.admission(record, incarnation, self.phases.phase)
        if reason is not None:
            return Admission(name, reason=reason)
        address = registered_address(meta.get("address"))
        return Admission(
            name,
            admitted_as,
            incarnation=incarnation,
            joins_iteration=self.join_iteration(record, admitted_as),
            address=address,
            moved=record.kind == "memory" and address != record.address,
        )

    def misconfigured(self, peer_name: str, name: str, config_hash: object) -> str | None:
        """Why a process cannot register as `name` whenever it comes, or None."""
        reason = self.roster.unknown_role(name)
        if reason is None and name != peer_name:  # the name the token holder proved, not one it claims
            reason = f"{peer_name} cannot register as {name}: a role registers under the name it connected with"
        if reason is None and config_hash != self.config_hash:
            reason = (
                f"config hash mismatch: {name} runs config {config_hash}, the coordinator "
                f"runs {self.config_hash}; start every role with the same config"
            )
        return reason

    def join_iteration(self, record: RoleRecord, admitted_as: str) -> int | None:
        """The iteration a synchronous actor acts in first, one rollout per iteration (DPPO), or None.

        A restarted actor joins the iteration after the newest weights: the one in progress
        completes without it (its memory host and the barrier went on without it when it was lost).
        Before RUNNING no iteration has begun, so it joins the first one.
        """
        if not self.rollouts_by_iteration or record.kind != "actor" or admitted_as == "rejoin":
            return None
        if admitted_as == "first" or self.phases.phase == Phase.STARTING:
            return 0
        return max(0, self.params.weights_version + 1)

    def enter(self, record: RoleRecord, admission: Admission, conn: Connection, meta: dict) -> None:
        """Bring `record` up to date with its admitted registration over `conn`."""
        record.conn = conn
        record.pid = meta.get("pid")
        record.host = meta.get("host")
        record.address = admission.address
        if admission.admitted_as != "rejoin" or record.session is None:
            record.session = secrets.token_hex(16)  # a rejoin keeps its memory hosts' connections
        record.counters_time = self.clock()
        record.disconnected_at = None
        if admission.admitted_as == "restart":
            self.roster.restarted(record, admission.incarnation)
        elif admission.admitted_as == "first":
            record.incarnation = admission.incarnation
        if record.status != "done":
            record.status = "running"
            record.reason = None
        if admission.joins_iteration is not None:
            record.joins_iteration = admission.joins_iteration
