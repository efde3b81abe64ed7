"""A role's control connection to the coordinator, kept across drops.

A role registers once with its process's *incarnation* (a nonce). When the
connection drops (a network blip, a coordinator briefly unreachable), the
channel reconnects with backoff and registers again as the same incarnation,
which the coordinator takes as a rejoin (counters kept), all within
``cluster.coordinator_timeout_s`` of the drop; past that, or if the
coordinator refuses, the role has lost the coordinator (`CoordinatorLost`).
A request caught by a drop is sent again once the channel is back (every
control request is safe to repeat: heartbeats, weights, publish, done, stop).
Pushed messages (phase, memories, exit) keep coming from `messages`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable

from aiorl.runtime.transport import SOCKETS_ONLY, Transport
from aiorl.wire import Connection, ConnectionClosed, Limits, Message, RemoteError, connect, shm
from aiorl.wire.names import safe_text


class CoordinatorLost(Exception):
    """The coordinator is gone: its connection closed for good or it stopped answering."""


class Refused(Exception):
    """The coordinator refused this role (config mismatch, unknown role): a user error."""


class NotAdmitted(Exception):
    """The coordinator turned this registration away (too late, restart budget spent, ...)."""


class ControlChannel:
    def __init__(
        self,
        name: str,
        address: tuple[str, int],
        token: bytes,
        ssl,
        register_meta: Callable[[], dict],
        timeout_s: float,
        start_timeout_s: float,
        log: logging.Logger,
        limits: Limits | None = None,
        unix_path: str | None = None,
        transport: Transport | None = None,
    ):
        self.name = name
        self.address = address
        self.token = token
        self.ssl = ssl
        self.register_meta = register_meta
        self.timeout_s = timeout_s
        self.start_timeout_s = start_timeout_s
        self.log = log
        self.limits = limits  # what the coordinator may send this role (weights at most)
        self.unix_path = unix_path  # a local run's: the coordinator's Unix socket, else TCP
        self.transport = transport or SOCKETS_ONLY  # whether rings go beside that socket
        self.session: str | None = None  # of the current registration, from the coordinator's reply
        self.conn: Connection | None = None
        self.rejoins = 0
        self._reconnecting: asyncio.Task | None = None
        self._lost: CoordinatorLost | None = None  # once lost, lost for good
        self._closed = False

    def __repr__(self) -> str:
        state = "reconnecting" if self._reconnecting and not self._reconnecting.done() else "open"
        return f"<ControlChannel {self.name} -> {self.address[0]}:{self.address[1]} {state} rejoins={self.rejoins}>"

    async def _connect(self, deadline: float) -> Connection:
        host, port = self.address
        loop = asyncio.get_running_loop()
        delay = 0.05
        while True:
            remaining = deadline - loop.time()
            try:
                return await connect(
                    host,
                    port,
                    token=self.token,
                    name=self.name,
                    ssl=self.ssl,
                    limits=self.limits,
                    handshake_timeout_s=max(0.1, min(self.timeout_s, remaining)),
                    **self.transport.connect_args(self.unix_path),
                )
            except (OSError, TimeoutError) as exc:  # refused, unreachable, or busy (ServerBusy)
                if loop.time() + delay > deadline:
                    raise CoordinatorLost(f"cannot reach the coordinator at {host}:{port}: {exc}") from None
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)

    async def _register(self, conn: Connection, rejoin: bool) -> dict:
        try:
            reply = await conn.request("register", {**self.register_meta(), "rejoin": rejoin}, timeout_s=self.timeout_s)
        except RemoteError as exc:
            conn.abort()
            raise Refused(f"the coordinator refused registration: {exc}") from None
        except (ConnectionClosed, TimeoutError) as exc:
            conn.abort()
            raise CoordinatorLost(f"registration got no answer: {exc!r}") from None
        if reply.meta.get("admitted") is False:
            conn.abort()
            raise NotAdmitted(safe_text(str(reply.meta.get("reason"))))
        session = reply.meta.get("session")
        if type(session) is not str:
            conn.abort()
            raise CoordinatorLost("the coordinator's registration reply has no session id")
        self.session = session
        return reply.meta

    async def open(self) -> dict:
        """Connect (retrying for ``start_timeout_s``) and register; the coordinator's reply meta."""
        deadline = asyncio.get_running_loop().time() + self.start_timeout_s
        conn = await self._connect(deadline)
        if conn.peer.endswith(shm.RING_SUFFIX):
            self.log.info("connected to the coordinator over shared memory (%s)", conn.peer)
        elif self.unix_path is not None:
            self.log.info("connected to the coordinator over unix:%s", self.unix_path)
        meta = await self._register(conn, rejoin=False)
        self.conn = conn
        return meta

    async def _reconnect(self, dropped: Connection) -> None:
        """Once per drop (concurrent callers share it): reconnect and rejoin, or CoordinatorLost."""
        if self._lost is not None:
            raise self._lost
        if self.conn is not dropped:
            return  # someone already replaced it
        if self._reconnecting is None or self._reconnecting.done():
            self._reconnecting = asyncio.get_running_loop().create_task(self._rejoin(dropped))
        await asyncio.shield(self._reconnecting)

    async def _rejoin(self, dropped: Connection) -> None:
        try:
            if self._closed:
                raise CoordinatorLost("the control connection is closed")
            self.log.warning("connection to the coordinator dropped; reconnecting for up to %g s", self.timeout_s)
            dropped.abort()
            deadline = asyncio.get_running_loop().time() + self.timeout_s
            conn = await self._connect(deadline)
            try:
                await self._register(conn, rejoin=True)
            except (Refused, NotAdmitted) as exc:
                raise CoordinatorLost(f"the coordinator did not take this role back: {exc}") from None
        except CoordinatorLost as exc:
            self._lost = exc
            raise
        self.conn = conn
        self.rejoins += 1
        self.log.warning("rejoined the coordinator (rejoin %d)", self.rejoins)

    async def request(self, kind: str, meta: dict | None = None, arrays=None, *, timeout_s: float) -> Message:
        """`Connection.request` that rides out a dropped connection (see the module docstring)."""
        while True:
            conn = self.conn
            try:
                return await conn.request(kind, meta, arrays, timeout_s=timeout_s)
            except ConnectionClosed:
                if self._closed:
                    raise
                await self._reconnect(conn)

    async def send(self, kind: str, meta: dict | None = None, arrays=None) -> None:
        await self.conn.send(kind, meta, arrays)

    async def messages(self) -> AsyncIterator[Message]:
        """Messages the coordinator pushes, across reconnects; ends after ``exit``."""
        while True:
            conn = self.conn
            try:
                async for msg in conn:
                    yield msg
                    if msg.kind == "exit":
                        return
            except ConnectionClosed:
                pass
            if self._closed:
                raise CoordinatorLost("the control connection is closed")
            await self._reconnect(conn)

    def abort(self) -> None:
        self._closed = True
        if self._reconnecting is not None:
            self._reconnecting.cancel()
        if self.conn is not None:
            self.conn.abort()
