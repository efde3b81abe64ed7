"""Exit notices: the local launcher, the parent of every role process, sees a child exit at once
and says so (``child_exit``, sent by `aiorl.launch.notices`); this part decides who may send
one and what it means, and the coordinator acts on it exactly as on a role whose heartbeats
stopped.

Who: the launcher alone. Every role holds the cluster token, so the token says nothing here;
the launcher's connection carries the handshake name no role has (`LAUNCHER_PEER`), comes over
the run's Unix socket, and the kernel says the process that opened it is the pid run.json
records for this launch (read when the coordinator is made, before any other role process
exists). A notice from any other peer is refused and counted (``exit_notices_refused``); a
role that sends one keeps its connection, as with the other requests it may not make.

`ExitNotices` decides who may send one and what each notice does, serves the launcher's
connection once the service found it is the launcher's, and refuses the others (the error, a
count, a line in the log the service hands it, shared with its other refusals). A verdict is
the service's, which acts on it as on any other (`Coordinator._lose`, handed in).

What: a notice names a role and a pid. Only the pid of the role's registered incarnation, while
it is live and has not reported done, makes a verdict: lost, the exit in the reason. Any other
pid is an earlier incarnation's (a late notice: its successor must not pay for it) or one that
never registered; nothing registered changes, and the pid is remembered, so that a registration
it sent before it died is refused instead of admitting a dead process, whose successor would
then wait out its silence. Only for ``cluster.coordinator_timeout_s``: a connection registers
within that of authenticating, and the dead process authenticated before it died, so no
registration of it comes later; forgotten by then, the pid cannot refuse a new process the
kernel gave it again (pids wrap, at 32768 by default).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from aiorl.core.ratelog import RateLimitedLog
from aiorl.runtime.coordinator.requests import reply_error
from aiorl.runtime.coordinator.roster import RoleRecord
from aiorl.runtime.messages import BadMessage, check
from aiorl.runtime.restart import LAUNCHER_PEER, describe_notice
from aiorl.wire import Connection, ConnectionClosed, Message

log = logging.getLogger("aiorl.coordinator")

WATCH_S = 0.25  # how often the launcher's connection looks for roles newly given up


class ExitNotices:
    def __init__(
        self,
        launcher_pid: int | None,
        remember_s: float,
        clock=time.monotonic,
        log_refusal: RateLimitedLog | None = None,
        watch_s: float = WATCH_S,
    ):
        self.launcher_pid = launcher_pid  # None: no local launcher started this launch
        self.remember_s = remember_s  # how long a pid that exited unregistered is remembered
        self.clock = clock
        self.watch_s = watch_s
        self.accepted = 0
        self.refused = 0
        self.log_refusal = log_refusal or RateLimitedLog(log, logging.WARNING, burst=10, per_s=0.5)
        self._exited: dict[tuple[str, int], float] = {}  # (role, pid) -> when the launcher saw it exit

    def refusal(self, conn: Connection) -> str | None:
        """None when `conn` is the launcher's, else why its notices are refused."""
        if conn.peer_name != LAUNCHER_PEER:
            return f"only the launcher reports exits, not {conn.peer_name}"
        if self.launcher_pid is None:
            return "no local launcher started this launch of the run"
        if conn.peer_pid is None:
            return "the launcher reports exits over the run's Unix socket only"
        if conn.peer_pid != self.launcher_pid:
            # The launcher's pid stays unsaid: it would tell an impostor whom to imitate.
            return f"peer pid {conn.peer_pid} is not the launcher of this launch"
        return None

    async def serve(self, conn: Connection, roles: dict[str, RoleRecord], lose: Callable[..., None]) -> None:
        """The launcher's connection: ``child_exit`` notices about `roles`, each answered with what
        it did; a verdict is the service's `lose` (its consequences, the dead process's connection cut)."""
        log.info("the launcher (pid %d) reports its children's exits on %s", conn.peer_pid, conn.peer)
        telling = asyncio.get_running_loop().create_task(self.tell_given_up(conn, roles))
        try:
            async for msg in conn:
                fields = check(msg.kind, msg.meta, {"child_exit"})
                if msg.request_id is None:
                    raise BadMessage(f"{msg.kind} must be a request")
                record = roles.get(fields["role"])
                outcome, reason = self.heard(record, fields)
                if reason is not None:
                    lose(record, reason, abort=True)
                await conn.reply(msg, meta={"outcome": outcome})
        finally:
            telling.cancel()
            await asyncio.gather(telling, return_exceptions=True)

    async def tell_given_up(self, conn: Connection, roles: dict[str, RoleRecord]) -> None:
        """Name to the launcher, once per connection, every registered process of `roles` declared lost."""
        told: set[tuple[str, int]] = set()
        try:
            while True:
                for record in list(roles.values()):
                    key = (record.name, record.pid)
                    if record.status != "lost" or type(record.pid) is not int or key in told:
                        continue
                    told.add(key)
                    meta = {"role": record.name, "pid": record.pid, "reason": record.reason or "lost"}
                    await conn.send("end_role", meta)
                await asyncio.sleep(self.watch_s)
        except ConnectionClosed:
            pass

    async def refuse_request(self, conn: Connection, msg: Message, who: str, reason: str) -> None:
        """Refuse the notice `msg` from `who` (not the launcher) with `reason`, and count it."""
        self.refused += 1
        self.log_refusal("refused an exit notice from %s (%s): %s", who, conn.peer, reason)
        await reply_error(conn, msg, f"exit notice refused: {reason}")

    def heard(self, record: RoleRecord | None, fields: dict) -> tuple[str, str | None]:
        """(what a notice about `record`, None for a role this run does not have, did; why
        `record` is lost now or None)."""
        if record is None:
            return "unknown role", None
        return self.decide(record, fields)

    def decide(self, record: RoleRecord, fields: dict) -> tuple[str, str | None]:
        """(what the notice did, why `record` is lost now or None)."""
        self.accepted += 1
        pid = fields["pid"]
        how = describe_notice(fields)
        if record.pid != pid:
            now = self.clock()
            self._exited = {key: at for key, at in self._exited.items() if now - at <= self.remember_s}
            self._exited[record.name, pid] = now
            log.info(
                "%s: the launcher saw pid %d exit (%s); not its registered process (pid %s): nothing changes",
                record.name,
                pid,
                how,
                record.pid,
            )
            return "not registered", None
        if record.status not in ("running", "disconnected"):
            return record.status, None  # done, or it already has a verdict: the first one stands
        return "lost", f"{record.name} exited: {how} (seen by the launcher)"

    def exited(self, name: str, pid: object) -> str | None:
        """Why a registration of `name` from `pid` is refused (the launcher saw that process exit), or None."""
        at = self._exited.get((name, pid)) if type(pid) is int else None
        if at is not None and self.clock() - at <= self.remember_s:
            return f"{name}'s process (pid {pid}) has already exited (seen by the launcher)"
        return None
