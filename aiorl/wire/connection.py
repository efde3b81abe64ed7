"""Clients and servers: `connect`, `serve` and its `Server`, which start a protocol
(:mod:`aiorl.wire.protocol`) per connection and hand out its message API
(:class:`~aiorl.wire.Connection`, :mod:`aiorl.wire.stream`).

Buffer contract for senders
---------------------------
``send()`` (and ``request()``/``reply()``) is zero-copy for large arrays: an
array of at least 32 KiB goes to the transport as a memoryview of *your*
memory, and on uvloop the transport may still read from it after ``send()``
returns, until the kernel has taken the bytes (the stock loop and TLS copy, but
do not rely on that). Smaller arrays are copied into the frame at once.

So: treat an array passed to ``send()`` as handed over; never write to it
again. To reuse a buffer, send ``array.copy()``. What you send is whatever the
memory holds when the transport writes it; ``send()`` returning means the
frame is queued and the write buffer is under its high-water mark, not that
the peer has it. ``close()`` flushes everything queued (within its deadline).

Flow control
------------
Receivers put messages into a bounded queue (``recv_queue_size`` messages).
When it is full the reader stops parsing; frames that already arrived wait in
the connection's fixed-size staging buffer (about 512 KiB), and once that is
full too the transport stops reading, so TCP pushes back on the sender, whose
``send()`` then waits in drain. A connection therefore never holds more than
its queue plus one staging buffer plus at most one large frame being
received. Replies to ``request()`` travel on the same connection behind
data messages, so keep a task consuming ``recv()`` on every connection that
receives data; otherwise a full queue also holds back the replies.
"""

from __future__ import annotations

import asyncio
import collections
import ipaddress
import logging
import os
import socket
import ssl as ssl_module
from collections.abc import Awaitable, Callable
from typing import Any

from aiorl.core.ratelog import RateLimitedLog

from . import shm
from .codec import Limits
from .errors import ConnectionClosed
from .names import MAX_PEER_NAME, PEER_NAME_CHARS, is_peer_name, safe_text
from .protocol import WireProtocol
from .stream import Connection
from .unix import check_peer, fits, remove_stale

__all__ = ["Connection", "Server", "connect", "serve"]

logger = logging.getLogger("aiorl.wire")

#: Seconds a server waits for a new connection's first byte. A role's HELLO leaves the moment
#: it connects, so only a socket that is not an aiorl peer (or one behind a stalled machine)
#: stays silent this long; it is also how long a handshake may take before a newcomer may take
#: its slot when the slots are full.
FIRST_BYTES_TIMEOUT_S = 1.5


def _check_common(token: bytes, name: str, recv_queue_size: int, handshake_timeout_s: float) -> None:
    if not isinstance(token, bytes) or not token:
        raise TypeError("token must be non-empty bytes (see aiorl.wire.load_token)")
    if not isinstance(name, str) or not name:
        raise TypeError(f"name must be a non-empty str, got {name!r}")
    if not is_peer_name(name):
        raise ValueError(
            f"name {safe_text(name, 80)!r} is not a valid peer name (1-{MAX_PEER_NAME} characters of {PEER_NAME_CHARS})"
        )
    if type(recv_queue_size) is not int or recv_queue_size < 1:
        raise ValueError(f"recv_queue_size must be an int >= 1, got {recv_queue_size!r}")
    if not handshake_timeout_s > 0:
        raise ValueError(f"handshake_timeout_s must be > 0, got {handshake_timeout_s!r}")


async def connect(
    host: str,
    port: int,
    *,
    token: bytes,
    name: str,
    limits: Limits | None = None,
    ssl: ssl_module.SSLContext | None = None,
    handshake_timeout_s: float = 10.0,
    recv_queue_size: int = 64,
    server_hostname: str | None = None,
    unix_path: str | None = None,
    ring_path: str | None = None,
) -> Connection:
    """Connect to an aiorl server and authenticate, all within ``handshake_timeout_s``.

    With ``unix_path``, over that Unix socket instead of ``host:port`` (a server of a local
    run, see :func:`serve`); the handshake is the same, TLS is not used there. With
    ``ring_path`` (a server's ring listener, :func:`aiorl.wire.shm.ring_path`), over
    shared-memory rings handed over there (:mod:`aiorl.wire.shm`): the same handshake, frames
    and checks, only the bytes move through memory.

    Raises :class:`AuthError` (wrong token on either side), :class:`ProtocolError`
    (e.g. "peer speaks protocol 2, this is 1"), ``TimeoutError``, or ``OSError``.
    With ``ssl``, the server certificate is checked against ``server_hostname``
    (default: ``host``).
    """
    _check_common(token, name, recv_queue_size, handshake_timeout_s)
    limits = limits or Limits()
    loop = asyncio.get_running_loop()
    proto = WireProtocol(
        server=False,
        token=token,
        name=name,
        limits=limits,
        recv_queue_size=recv_queue_size,
        handshake_timeout_s=handshake_timeout_s,
    )
    extra: dict[str, Any] = {}
    if ssl is not None and unix_path is None and ring_path is None:
        extra = {"ssl": ssl, "server_hostname": server_hostname or host, "ssl_handshake_timeout": handshake_timeout_s}
    try:
        async with asyncio.timeout(handshake_timeout_s):
            if ring_path is not None:
                await shm.connect_ring(ring_path, lambda: proto)
            elif unix_path is not None:
                await loop.create_unix_connection(lambda: proto, unix_path)
            else:
                await loop.create_connection(lambda: proto, host, port, **extra)
            await proto.handshake_done
    except TimeoutError:
        proto.abort()
        where = f"unix:{ring_path or unix_path}" if (ring_path or unix_path) is not None else f"{host}:{port}"
        raise TimeoutError(f"connecting to {where}: no completed handshake within {handshake_timeout_s:g}s") from None
    except BaseException:
        proto.abort()
        raise
    return proto.connection


class Server:
    """A listening aiorl endpoint. ``port`` is the bound port (so ``port=0`` works).

    Connections that have not finished the handshake are capped globally
    (``max_handshakes``) and per source address (``max_handshakes_per_host``);
    authenticated ones at ``max_connections``. A connection that has sent no byte
    within ``first_bytes_timeout_s`` is closed. At a handshake cap the slots are kept
    for peers that complete quickly: the newcomer takes the slot of the oldest
    connection in that cap that has sent nothing yet, else of the oldest one whose
    handshake has lasted ``first_bytes_timeout_s`` or more; that one gets a REJECT
    frame with code "busy" (its client raises :class:`ServerBusy` and may retry).
    Only when every handshake in the cap is talking and younger is the newcomer
    refused so. A connection over ``max_connections`` is refused the same way.
    Either way a flood of bare connections holds at most the caps' worth of file
    descriptors, and cannot hold the slots against a peer with the token.
    ``stats`` counts refusals (``refused_busy``, evictions included), evictions
    (``evicted``) and failed handshakes.

    With a Unix socket too (``unix_path``), a peer there whose uid is not ``expected_uid``
    (this process's) is refused before the handshake, without a word (``refused_uid``);
    authenticated connections over it are counted in ``unix_connections``.
    """

    def __init__(
        self,
        on_connection: Callable[[Connection], Awaitable[None]],
        name: str,
        protocol_options: dict[str, Any],
        *,
        max_handshakes: int,
        max_handshakes_per_host: int,
        max_connections: int | None,
        first_bytes_timeout_s: float = FIRST_BYTES_TIMEOUT_S,
    ) -> None:
        self.host = ""
        self.port = 0
        self.connections: set[Connection] = set()
        self.max_handshakes = max_handshakes
        self.max_handshakes_per_host = max_handshakes_per_host
        self.max_connections = max_connections
        self.first_bytes_timeout_s = first_bytes_timeout_s
        self.unix_path: str | None = None  # also listening there (a local run)
        self.expected_uid = os.getuid()
        self.stats = {"refused_busy": 0, "evicted": 0, "handshake_failures": 0, "refused_uid": 0, "unix_connections": 0}
        self._on_connection = on_connection
        self._name = name
        self._protocol_options = protocol_options
        self._server: asyncio.base_events.Server | None = None
        self._unix_server: asyncio.base_events.Server | None = None
        self.ring_path: str | None = None  # also handing out shared-memory rings there
        self.ring_bytes = shm.DEFAULT_RING_BYTES
        self._ring_listener: socket.socket | None = None
        self._protocols: set[WireProtocol] = set()  # every live one, handshaking too
        # In the order they connected (a dict as an ordered set): the oldest is found first.
        self._handshaking: dict[WireProtocol, None] = {}
        self._handshaking_per_host: collections.Counter[str] = collections.Counter()
        self._tasks: set[asyncio.Task] = set()
        self._closing = False
        # A peer without the token decides how often these happen: log them at a bounded rate.
        self._log_refusal = RateLimitedLog(logger, logging.WARNING, burst=10, per_s=0.2)
        self._log_handshake = RateLimitedLog(logger, logging.WARNING, burst=20, per_s=1.0)

    def __repr__(self) -> str:
        state = "closing" if self._closing else "serving"
        return (
            f"<Server {self._name!r} {self.host}:{self.port} {state} connections={len(self.connections)} "
            f"handshaking={len(self._handshaking)} refused={self.stats['refused_busy']}>"
        )

    def _make_protocol(self) -> WireProtocol:
        proto = WireProtocol(
            server=True,
            on_ready=self._on_ready,
            on_lost=self._on_lost,
            admit=self._admit,
            admit_proved=self._admit_proved,
            screen=self._screen,
            log_failure=self._handshake_failed,
            **self._protocol_options,
        )
        self._protocols.add(proto)
        return proto

    def _accept_rings(self) -> None:
        """Connections on the ring listener: the peer's uid first, then the rings, then the
        same protocol (handshake, caps, checks) as any other connection."""
        listener = self._ring_listener
        if listener is None:
            return
        loop = asyncio.get_running_loop()
        for sock in shm.accept_ready(listener, self._pause_rings):
            refusal = check_peer(sock, self.expected_uid)
            if refusal is not None or self._closing:
                if refusal is not None:
                    self.stats["refused_uid"] += 1
                    self._log_refusal("%r: refusing a connection on %s: %s", self, self.ring_path, refusal)
                sock.close()
                continue
            try:
                shm.accept_ring(loop, sock, self._make_protocol(), self.ring_bytes)
            except OSError as exc:
                sock.close()
                self._log_refusal("%r: could not hand over a ring on %s: %s", self, self.ring_path, exc)

    def _pause_rings(self) -> None:
        """Out of descriptors: stop accepting on the ring listener for a while (else its
        readiness would spin the loop), as asyncio does for the other listeners."""
        listener = self._ring_listener
        if listener is None:
            return
        loop = asyncio.get_running_loop()
        loop.remove_reader(listener.fileno())

        def resume() -> None:
            if self._ring_listener is listener:
                loop.add_reader(listener.fileno(), self._accept_rings)

        loop.call_later(shm.ACCEPT_PAUSE_S, resume)

    def _screen(self, proto: WireProtocol) -> str | None:
        """A Unix peer must run as this server's uid; TCP peers are screened by the token alone."""
        if not proto.unix:
            return None
        refusal = check_peer(proto.transport.get_extra_info("socket"), self.expected_uid)
        if refusal is not None:
            self.stats["refused_uid"] += 1
            self._log_refusal("%r: refusing a connection on %s: %s", self, proto.peer, refusal)
        return refusal

    def _admit(self, proto: WireProtocol) -> str | None:
        """A new connection: None to start its handshake, else why it is refused."""
        host = proto.peer_host
        # The host's cap first: a slot freed there is a global one too.
        if self._handshaking_per_host[host] >= self.max_handshakes_per_host:
            scope = [p for p in self._handshaking if p.peer_host == host]
            reason = f"{len(scope)} handshakes in progress from {host}, the limit (max_handshakes_per_host)"
        elif len(self._handshaking) >= self.max_handshakes:
            scope = list(self._handshaking)
            reason = f"{len(scope)} handshakes in progress, the limit (max_handshakes)"
        else:
            scope = None
        if scope is not None:
            victim = self._slowest(scope)
            if victim is None:  # every one is talking and still young: the newcomer waits its turn
                self.stats["refused_busy"] += 1
                self._log_refusal("%r: refusing a connection from %s: %s", self, proto.peer, reason)
                return f"server busy: {reason}"
            self._evict(victim, reason)
        self._handshaking[proto] = None
        self._handshaking_per_host[host] += 1
        return None

    def _slowest(self, scope: list[WireProtocol]) -> WireProtocol | None:
        """Whose slot a newcomer takes: the oldest that has sent nothing, else the oldest whose
        handshake has lasted `first_bytes_timeout_s` (a peer with the token needs a round trip)."""
        for proto in scope:
            if proto.silent:
                return proto
        now = asyncio.get_running_loop().time()
        for proto in scope:
            if now - proto.connected_at >= self.first_bytes_timeout_s:
                return proto
        return None

    def _evict(self, victim: WireProtocol, reason: str) -> None:
        how = "sent nothing" if victim.silent else "not finished its handshake"
        self.stats["refused_busy"] += 1
        self.stats["evicted"] += 1
        self._log_refusal("%r: %s: closing %s (%s), a newer connection takes its slot", self, reason, victim.peer, how)
        self._end_handshake(victim)  # its slot is free now, not when its socket has closed
        victim.evict(f"server busy: {reason}; this connection had {how}, a newer one took its slot")

    def _admit_proved(self, proto: WireProtocol) -> str | None:
        if self.max_connections is not None and len(self.connections) >= self.max_connections:
            self.stats["refused_busy"] += 1
            reason = f"{len(self.connections)} connections open, the limit (max_connections)"
            self._log_refusal("%r: refusing %s (%s): %s", self, proto.peer, proto.peer_name, reason)
            return f"server busy: {reason}"
        return None

    def _handshake_failed(self, msg: str, *args) -> None:
        self.stats["handshake_failures"] += 1
        self._log_handshake(msg, *args)

    def _end_handshake(self, proto: WireProtocol) -> None:
        if proto in self._handshaking:
            del self._handshaking[proto]
            host = proto.peer_host
            self._handshaking_per_host[host] -= 1
            if self._handshaking_per_host[host] <= 0:
                del self._handshaking_per_host[host]

    def _on_ready(self, proto: WireProtocol) -> None:
        self._end_handshake(proto)
        conn = proto.connection
        self.connections.add(conn)
        self.stats["unix_connections"] += proto.unix
        task = asyncio.get_running_loop().create_task(self._handle(conn), name=f"aiorl.wire handler {conn.peer}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _on_lost(self, proto: WireProtocol) -> None:
        self._end_handshake(proto)
        self._protocols.discard(proto)
        self.connections.discard(proto.connection)

    async def _handle(self, conn: Connection) -> None:
        try:
            await self._on_connection(conn)
        except asyncio.CancelledError:
            conn.abort()
            raise
        except ConnectionClosed as exc:
            logger.debug("handler for %s (%s) ended: %s", conn.peer, conn.peer_name, exc)
        except Exception:
            logger.error("connection handler for %s (%s) failed", conn.peer, conn.peer_name, exc_info=True)
        await conn.close()

    async def close(self, timeout_s: float = 5.0) -> None:
        """Stop listening, close every connection (flushing within ``timeout_s``), end the handlers."""
        self._closing = True
        for listening in (self._server, self._unix_server):
            if listening is not None:
                listening.close()
        if self._ring_listener is not None:
            asyncio.get_running_loop().remove_reader(self._ring_listener.fileno())
            self._ring_listener.close()
            self._ring_listener = None
            remove_stale(self.ring_path)
        for proto in list(self._protocols):
            if not proto._authenticated:
                proto.abort()
        connections = list(self.connections)
        if connections:
            await asyncio.gather(*(conn.close(timeout_s) for conn in connections))
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        for listening in (self._server, self._unix_server):
            if listening is not None:
                await listening.wait_closed()
        if self.unix_path is not None:
            remove_stale(self.unix_path)  # nobody connects to a socket nobody serves

    async def __aenter__(self) -> Server:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()


async def serve(
    on_connection: Callable[[Connection], Awaitable[None]],
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    token: bytes,
    name: str,
    limits: Limits | None = None,
    ssl: ssl_module.SSLContext | None = None,
    handshake_timeout_s: float = 10.0,
    recv_queue_size: int = 64,
    backlog: int = 128,
    max_handshakes: int = 128,
    max_handshakes_per_host: int = 32,
    max_connections: int | None = None,
    first_bytes_timeout_s: float = FIRST_BYTES_TIMEOUT_S,
    unix_path: str | None = None,
    rings: bool = False,
    ring_bytes: int = shm.DEFAULT_RING_BYTES,
) -> Server:
    """Listen on ``host:port`` (default 127.0.0.1, an ephemeral port), and on the Unix socket
    ``unix_path`` too when given (a socket left there is replaced; put it in a directory only
    this user can enter: the socket itself is 0600). The caps count both together. With
    ``rings`` as well, a third listener beside it (``shm.ring_path(unix_path)``) hands each
    peer of this uid shared-memory rings of ``ring_bytes`` per direction (:mod:`aiorl.wire.shm`).

    ``on_connection(conn)`` runs as its own task for each authenticated
    connection; when it returns or raises (the exception is logged with the
    peer), the connection is closed. Failed handshakes never reach it.
    ``limits`` apply to every connection until its handler widens them
    (``Connection.set_limits``); see :class:`Server` for the connection caps.
    Listening on an address other than loopback without ``ssl`` logs a
    warning: the handshake still needs the token, but frames after it are
    neither encrypted nor authenticated.
    """
    _check_common(token, name, recv_queue_size, handshake_timeout_s)
    if not first_bytes_timeout_s > 0:
        raise ValueError(f"first_bytes_timeout_s must be > 0, got {first_bytes_timeout_s!r}")
    for key, value in (
        ("max_handshakes", max_handshakes),
        ("max_handshakes_per_host", max_handshakes_per_host),
        ("max_connections", 1 if max_connections is None else max_connections),
    ):
        if type(value) is not int or value < 1:
            raise ValueError(f"{key} must be an int >= 1, got {value!r}")
    server = Server(
        on_connection,
        name,
        {
            "token": token,
            "name": name,
            "limits": limits or Limits(),
            "handshake_timeout_s": handshake_timeout_s,
            "first_bytes_timeout_s": first_bytes_timeout_s,
            "recv_queue_size": recv_queue_size,
        },
        max_handshakes=max_handshakes,
        max_handshakes_per_host=max_handshakes_per_host,
        max_connections=max_connections,
        first_bytes_timeout_s=first_bytes_timeout_s,
    )
    if ssl is None and not is_loopback(host):
        logger.warning(
            "%s listens on %s without TLS: frames after the handshake are neither encrypted nor "
            "authenticated, so anyone on that network path can read or alter them (use TLS: "
            "cluster.tls_cert and cluster.tls_key)",
            name,
            host or "every interface",
        )
    extra: dict[str, Any] = {}
    if ssl is not None:
        extra = {"ssl": ssl, "ssl_handshake_timeout": handshake_timeout_s}
    loop = asyncio.get_running_loop()
    server._server = await loop.create_server(server._make_protocol, host, port, backlog=backlog, **extra)
    server.host, server.port = server._server.sockets[0].getsockname()[:2]
    if unix_path is not None:
        if not fits(unix_path):
            server._server.close()
            raise ValueError(f"unix_path {unix_path!r} is longer than a Unix socket's path may be")
        remove_stale(unix_path)
        server._unix_server = await loop.create_unix_server(server._make_protocol, unix_path, backlog=backlog)
        os.chmod(unix_path, 0o600)
        server.unix_path = unix_path
        if rings:
            shm._check_ring_bytes(ring_bytes)
            path = shm.ring_path(unix_path)
            if not fits(path):
                raise ValueError(f"ring path {path!r} is longer than a Unix socket's path may be")
            server.ring_bytes = ring_bytes
            server._ring_listener = shm.listen(path, backlog)
            server.ring_path = path
            loop.add_reader(server._ring_listener.fileno(), server._accept_rings)
    logger.debug("%r listening", server)
    return server


def is_loopback(host: str) -> bool:
    """True when `host` only reaches this machine (127.0.0.0/8, ::1, localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
