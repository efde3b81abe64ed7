"""Shared-memory rings between two processes of one host, under the same framing as TCP.

A connection over rings is an asyncio transport like any other: :class:`RingTransport`
(:mod:`aiorl.wire.ring`) feeds the same :class:`~aiorl.wire.protocol.WireProtocol` (handshake,
frame checks, limits, flow control) that a socket transport feeds, so nothing above the byte
stream knows the difference.

This module holds the hand-over. A server of a local run listens on a second Unix socket beside
its own, ``<its socket>.ring`` (`ring_path`); to a peer of its uid (``SO_PEERCRED``) it passes
one sealed memfd with a ring per direction and two eventfds (``SCM_RIGHTS``, with a fixed
24-byte description). The client checks all of it before mapping anything (magic, ring size in
``[MIN_RING_BYTES, MAX_RING_BYTES]``, three descriptors, a sealed memfd of exactly the
layout's size, two eventfds); then the usual HMAC handshake runs over the rings, and the Unix
socket stays open, silent, so that either side sees the other's death as EOF.

What the rings guarantee: each counter is written by its owner only, and a peer's counter that
went backwards or past the ring's capacity ends the connection before any length read from the
ring is used; bytes are copied out before the protocol parses them (a peer cannot change a
checked frame); a full ring holds its writer back (``drain()``), nothing is dropped; a wake-up
(an eventfd write) goes only to a side that waits, and none is lost. The rules, the wake-up
protocol and why it needs x86-64's store order: docs/concepts/transports.md.
"""

from __future__ import annotations

import asyncio
import errno
import fcntl
import logging
import os
import socket
import stat
import struct
from collections.abc import Callable

from .errors import ProtocolError
from .ring import RingTransport, segment_bytes
from .unix import check_peer, remove_stale

__all__ = [
    "DEFAULT_RING_BYTES",
    "MAX_RING_BYTES",
    "MIN_RING_BYTES",
    "RingTransport",
    "accept_ring",
    "connect_ring",
    "ring_path",
    "segment_bytes",
]

logger = logging.getLogger("aiorl.wire")

#: Bytes of each direction's ring unless the server says otherwise.
DEFAULT_RING_BYTES = 4 << 20
MIN_RING_BYTES = 64 * 1024
MAX_RING_BYTES = 1 << 30
#: Where a server's ring listener sits: beside its Unix socket, this suffix appended.
RING_SUFFIX = ".ring"

MAGIC = b"AIORLRNG"
#: The hand-over message: magic, layout version, reserved, ring bytes per direction.
OFFER = struct.Struct("<8sHHIQ")
LAYOUT_VERSION = 2  # 2: the reader's `waiting` flag in the control page
_SEALS = getattr(fcntl, "F_SEAL_SHRINK", 2) | getattr(fcntl, "F_SEAL_GROW", 4)
_SEAL_SEAL = getattr(fcntl, "F_SEAL_SEAL", 1)


def ring_path(unix_path: str) -> str:
    """The ring listener of the server listening on Unix socket `unix_path`."""
    return unix_path + RING_SUFFIX


def _check_ring_bytes(ring_bytes: object) -> int:
    if type(ring_bytes) is not int or not MIN_RING_BYTES <= ring_bytes <= MAX_RING_BYTES:
        raise ProtocolError(f"ring of {ring_bytes!r} bytes, expected {MIN_RING_BYTES}..{MAX_RING_BYTES}")
    return ring_bytes


def _is_eventfd(fd: int) -> bool:
    try:
        return os.readlink(f"/proc/self/fd/{fd}") == "anon_inode:[eventfd]"
    except OSError:
        return False


def create_segment(ring_bytes: int) -> int:
    """A sealed memfd for two rings of `ring_bytes` (the server's side of the hand-over)."""
    fd = os.memfd_create("aiorl-ring", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.ftruncate(fd, segment_bytes(ring_bytes))
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _SEALS | _SEAL_SEAL)
    except BaseException:
        os.close(fd)
        raise
    return fd


def check_segment(fd: int, ring_bytes: int) -> None:
    """Raise ProtocolError unless `fd` is a sealed memfd of exactly the layout's size."""
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        raise ProtocolError("the ring's descriptor is not a memory file")
    if info.st_size != segment_bytes(ring_bytes):
        raise ProtocolError(f"the ring's memory file has {info.st_size} bytes, expected {segment_bytes(ring_bytes)}")
    try:
        seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
    except OSError as exc:
        raise ProtocolError(f"the ring's memory file has no seals ({exc.strerror})") from None
    if seals & _SEALS != _SEALS:
        raise ProtocolError("the ring's memory file is not sealed against shrinking and growing")


# ---------------------------------------------------------------------- hand-over


def _close_all(fds) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


def accept_ring(
    loop: asyncio.AbstractEventLoop,
    sock: socket.socket,
    protocol: asyncio.BufferedProtocol,
    ring_bytes: int = DEFAULT_RING_BYTES,
) -> RingTransport:
    """Server side, for an accepted connection on the ring listener (its peer's uid already
    checked): create the rings, pass them over `sock`, and start `protocol` on them."""
    _check_ring_bytes(ring_bytes)
    memfd = create_segment(ring_bytes)
    server_wake = client_wake = -1
    try:
        server_wake = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        client_wake = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        offer = OFFER.pack(MAGIC, LAYOUT_VERSION, 0, 0, ring_bytes)
        sent = socket.send_fds(sock, [offer], [memfd, server_wake, client_wake])
        if sent != OFFER.size:
            raise ConnectionError(f"the ring's description went out short ({sent} of {OFFER.size} bytes)")
    except BaseException:
        _close_all(fd for fd in (memfd, server_wake, client_wake) if fd >= 0)
        raise
    transport = RingTransport(loop, sock, memfd, server_wake, client_wake, ring_bytes, server=True)
    transport.start(protocol)
    return transport


async def connect_ring(
    path: str, protocol_factory: Callable[[], asyncio.BufferedProtocol]
) -> tuple[RingTransport, asyncio.BufferedProtocol]:
    """Client side: connect to the ring listener at `path`, check what it hands over, map it,
    and start a protocol on it. Raises ProtocolError for a bad hand-over, OSError if nothing
    listens there. The caller bounds the time (the peer could stay silent)."""
    loop = asyncio.get_running_loop()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    fds: list[int] = []
    try:
        sock.setblocking(False)
        await loop.sock_connect(sock, path)
        refusal = check_peer(sock, os.getuid())
        if refusal is not None:
            raise PermissionError(f"ring listener {path}: {refusal}")
        ready = loop.create_future()
        loop.add_reader(sock.fileno(), lambda: ready.done() or ready.set_result(None))
        try:
            while True:
                await ready
                try:
                    data, fds, flags, _ = socket.recv_fds(sock, OFFER.size, 3, socket.MSG_CMSG_CLOEXEC)
                    break
                except (BlockingIOError, InterruptedError):
                    ready = loop.create_future()
                    loop.remove_reader(sock.fileno())
                    loop.add_reader(sock.fileno(), lambda: ready.done() or ready.set_result(None))
        finally:
            loop.remove_reader(sock.fileno())
        if not data:
            raise ConnectionError(f"ring listener {path} closed the connection before handing over a ring")
        if flags & getattr(socket, "MSG_CTRUNC", 8) or len(fds) != 3:
            raise ProtocolError(f"ring listener {path} passed {len(fds)} descriptors (or more), expected 3")
        if len(data) != OFFER.size:
            raise ProtocolError(f"ring hand-over of {len(data)} bytes, expected {OFFER.size}")
        magic, version, _, _, ring_bytes = OFFER.unpack(data)
        if magic != MAGIC:
            raise ProtocolError(f"ring hand-over starts with {magic!r}, expected {MAGIC!r}")
        if version != LAYOUT_VERSION:
            raise ProtocolError(f"ring layout version {version}, this side speaks {LAYOUT_VERSION}")
        _check_ring_bytes(ring_bytes)
        memfd, server_wake, client_wake = fds
        check_segment(memfd, ring_bytes)
        if not (_is_eventfd(server_wake) and _is_eventfd(client_wake)):
            raise ProtocolError("the ring's wake-up descriptors are not eventfds")
        os.set_blocking(server_wake, False)
        os.set_blocking(client_wake, False)
        transport = RingTransport(loop, sock, memfd, client_wake, server_wake, ring_bytes, server=False)
    except BaseException:
        _close_all(fds)
        sock.close()
        raise
    protocol = protocol_factory()
    transport.start(protocol)
    return transport, protocol


def listen(path: str, backlog: int = 128) -> socket.socket:
    """A non-blocking Unix listener at `path` (0600), replacing a stale socket left there."""
    remove_stale(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(path)
        os.chmod(path, 0o600)
        sock.listen(backlog)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


#: Seconds a ring listener stops accepting after running out of descriptors (as asyncio's own).
ACCEPT_PAUSE_S = 1.0


def accept_ready(listener: socket.socket, out_of_descriptors: Callable[[], None] | None = None) -> list[socket.socket]:
    """Every connection waiting on `listener` (non-blocking); `out_of_descriptors()` when the
    process (or the system) has none left for the next one."""
    accepted = []
    while True:
        try:
            conn, _ = listener.accept()
        except (BlockingIOError, InterruptedError, ConnectionAbortedError):
            return accepted
        except OSError as exc:
            if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                logger.warning("ring listener: accept failed: %s; pausing for %gs", exc, ACCEPT_PAUSE_S)
                if out_of_descriptors is not None:
                    out_of_descriptors()
                return accepted
            raise
        conn.setblocking(False)
        accepted.append(conn)
