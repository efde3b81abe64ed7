"""The coordinator's side of a role's registration: a connection's first requests until it
registers (``status`` answered meanwhile, all under a deadline), and who is admitted as what
(first start, rejoin, restart), with the role's record brought up to date.

A mixin of `Coordinator` (`aiorl.runtime.coordinator.service`), whose state it reads and
sets; the decisions are the roster's (`aiorl.runtime.coordinator.roster`).
"""

from __future__ import annotations

import asyncio
import logging
import secrets

from aiorl.runtime import frame_limits
from aiorl.runtime.coordinator.requests import reply_error
from aiorl.runtime.coordinator.roster import RoleRecord
from aiorl.runtime.first_request import first_request
from aiorl.runtime.messages import pack_table
from aiorl.runtime.phase import Phase
from aiorl.wire import Connection, Message

log = logging.getLogger("aiorl.coordinator")


class Registration:
    """Registering roles; mixed into `Coordinator`."""

    async def _until_registered(self, conn: Connection) -> RoleRecord | None:
        """Answer `status` until the peer registers, all within cluster.coordinator_timeout_s: an
        authenticated connection that never registers would hold one of max_connections for ever
        (the memory host gives `attach` the same deadline). None: refused, timed out or closed."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.cfg.cluster.coordinator_timeout_s
        while True:
            try:
                msg, fields = await first_request(conn, deadline - loop.time())
            except TimeoutError as exc:
                self.unregistered_closed += 1
                self._log_refusal("closing the connection of %s from %s: %s", conn.peer_name, conn.peer, exc)
                conn.abort()
                return None
            if msg.kind == "register":
                return await self._register(conn, msg, fields)
            if msg.kind == "child_exit":
                await self._refuse_notice(conn, msg, f"{conn.peer_name} (unregistered)", self.notices.refusal(conn))
                return None
            if msg.kind != "status":
                await reply_error(conn, msg, f"{msg.kind!r} before register")
                return None
            await self._reply_status(conn, msg)

    def _join_iteration(self, record: RoleRecord, admission: str) -> int | None:
        """The iteration a synchronous actor acts in first, one rollout per iteration (DPPO), or None.

        A restarted actor joins the iteration after the newest weights: the one in progress
        completes without it (its memory host and the barrier went on without it when it was lost).
        Before RUNNING no iteration has begun, so it joins the first one.
        """
        if not self.synchronous or self.work is not None or record.kind != "actor" or admission == "rejoin":
            return None
        if admission == "first" or self.phase == Phase.STARTING:
            return 0
        return max(0, self.params.weights_version + 1)

    async def _reply_status(self, conn: Connection, msg: Message) -> None:
        status = self.status()
        roles = pack_table(status.pop("roles"))  # over 64 KiB of header from ~400 roles on
        await conn.reply(msg, meta=status, arrays={"roles": roles})

    async def _register(self, conn: Connection, msg: Message, meta: dict) -> RoleRecord | None:
        name = meta["role"]
        incarnation = meta.get("incarnation", "")
        record = self.roles.get(name)
        reason = self.roster.unknown_role(name)
        if reason is None and name != conn.peer_name:  # the name the token holder proved, not one it claims
            reason = f"{conn.peer_name} cannot register as {name}: a role registers under the name it connected with"
        if reason is None and meta.get("config_hash") != self.config_hash:
            reason = (
                f"config hash mismatch: {name} runs config {meta.get('config_hash')}, the coordinator "
                f"runs {self.config_hash}; start every role with the same config"
            )
        if reason is not None:  # a misconfigured process: the error is the user's to fix
            self.registrations_refused += 1
            self._log_refusal("refused registration from %s: %s", conn.peer, reason)
            await conn.reply_error(msg, reason)
            await conn.close()
            return None
        admission, reason = None, self.notices.exited(name, meta.get("pid"))
        if reason is None:
            if record.status == "running" and record.incarnation != incarnation:
                await self.roster.await_replaced(record)
            admission, reason = self.roster.admission(record, incarnation, self.phase)
        if reason is not None:  # the right process at the wrong time (or an impostor): it exits
            self.registrations_refused += 1
            self._log_refusal("did not admit %s from %s: %s", name, conn.peer, reason)
            await conn.reply(msg, meta={"admitted": False, "reason": reason})
            await conn.close()
            return None
        if record.conn is not None and record.conn is not conn:
            record.conn.abort()  # a half-open connection of the process that just rejoined
        record.conn = conn
        record.pid = meta.get("pid")
        record.host = meta.get("host")
        address = meta.get("address")
        old_address = record.address
        # [host, port], with a local run's Unix socket after them (messages.address checked it).
        record.address = (str(address[0]), int(address[1]), *address[2:]) if address else None
        if admission != "rejoin" or record.session is None:
            record.session = secrets.token_hex(16)  # a rejoin keeps its memory hosts' connections
        if name == "learner-0" and meta.get("rendezvous"):
            self.requests.rendezvous = meta["rendezvous"]  # learner 0 listens there (aiorl.runtime.rendezvous)
        self.liveness.heard(record)
        record.counters_time = asyncio.get_running_loop().time()
        record.disconnected_at = None
        if admission == "restart":
            self.roster.restarted(record, incarnation)
            log.warning(
                "%s restarted (restart %d of %d; pid %s, %s)",
                name,
                record.restarts,
                self.cfg.cluster.max_restarts,
                record.pid,
                conn.peer,
            )
        elif admission == "rejoin":
            log.warning("%s rejoined after its connection dropped (pid %s, %s)", name, record.pid, conn.peer)
        else:
            record.incarnation = incarnation
            log.info("registered %s (pid %s, %s)", name, record.pid, conn.peer)
        if record.status != "done":
            record.status = "running"
            record.reason = None
        joins = self._join_iteration(record, admission)
        if joins is not None:
            record.joins_iteration = joins
        for barrier in self.barriers.values():
            if record.kind == "actor" and record.status == "running" and admission != "rejoin":
                barrier.add(record.name, record.joins_iteration)
        if record.kind == "actor":
            self.liveness.no_actor_since = None
        self.roster.changed.set()
        conn.set_limits(frame_limits.to_coordinator(name, self.algo))
        await conn.reply(
            msg,
            meta={
                "phase": int(self.phase),
                "config_hash": self.config_hash,
                "admission": admission,
                "restarts": record.restarts,
                "session": record.session,
                **({"iteration": joins} if joins is not None else {}),
            },
        )
        if joins is not None and admission == "restart":
            self.push_to_memories("role_back", {"role": name, "iteration": joins})
        if self.started.is_set() and record.kind == "memory" and record.address != old_address:
            await self.broadcast("memories", {"memories": self.roster.memory_addresses()})
        if all(r.status == "running" for r in self.roles.values()):
            self.started.set()
        return record
