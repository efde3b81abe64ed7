"""Shared-memory rings between two processes of one host, under the same framing as TCP.

A connection over rings is an asyncio transport like any other: :class:`RingTransport` feeds
the same :class:`~aiorl.wire.protocol.WireProtocol` (handshake, frame checks, limits, flow
control) that a socket transport feeds, so nothing above the byte stream knows the difference.

Hand-over. A server of a local run listens on a second Unix socket in the run directory (0700;
the socket itself 0600), ``<its socket>.ring``. When a peer connects there, the server checks
the peer's uid (``SO_PEERCRED``, as on its other Unix socket), then creates one memfd holding a
ring per direction, sealed against shrinking and growing (``F_SEAL_SHRINK | F_SEAL_GROW |
F_SEAL_SEAL``: a peer cannot truncate the pages under the server's mapping), and two eventfds,
and passes the three descriptors over the socket (``SCM_RIGHTS``) with a fixed 24-byte
description. The client checks all of it before mapping anything: the magic, the ring size
against ``[MIN_RING_BYTES, MAX_RING_BYTES]``, exactly three descriptors, a memfd whose size is
exactly the layout's and whose seals are set, two eventfds. Then the usual HMAC handshake runs
*over the rings*: nothing is accepted from a ring before it, exactly as on TCP. The Unix
socket stays open, silent, for the connection's life: the kernel closes it when either process
dies, which is how the other side sees EOF (a byte arriving on it is bad input).

Rings. Each direction is a single-producer single-consumer byte ring: the producer owns
``tail`` (bytes written since the start), the consumer owns ``head`` (bytes read), both
monotonic 64-bit counters in the shared page, each written only by its owner. Each side keeps
its own counter privately and only *reads* the peer's; a peer's counter that went backwards or
claims more than the ring's capacity is bad input and ends the connection, and a length read
from the ring is never used before that check. The consumer copies bytes out into the
protocol's own buffers (``get_buffer``/``buffer_updated``) before the protocol parses them, so
a peer cannot change a frame after it was checked; nothing from a ring is unpickled or eval'ed.

Wake-ups. A producer writes its eventfd's peer ("data written") after every batch of writes;
a consumer writes it ("space freed") after reading when the producer has raised its
``blocked`` flag. A producer whose ring is full keeps its frames (zero-copy views, as uvloop's
transport does) and reports its write buffer to the protocol, whose ``drain()`` then waits, as
over TCP; nothing is dropped. Counters are read and stored whole, as aligned 8-byte words (a
native ``memoryview`` of ``Q``, never byte by byte: a torn read would look like a forged
counter), in order on x86-64 (TSO); a lost "space freed" wake-up (store-load reordering of the
flag) is covered by re-checking every ``BLOCKED_RECHECK_S`` while blocked.
"""

from __future__ import annotations

import asyncio
import collections
import errno
import fcntl
import logging
import mmap
import os
import socket
import stat
import struct
from collections.abc import Callable

from .errors import ProtocolError
from .unix import check_peer, remove_stale

__all__ = [
    "DEFAULT_RING_BYTES",
    "MAX_RING_BYTES",
    "MIN_RING_BYTES",
    "RingTransport",
    "accept_ring",
    "connect_ring",
    "ring_path",
]

logger = logging.getLogger("aiorl.wire")

#: Bytes of each direction's ring unless the server says otherwise.
DEFAULT_RING_BYTES = 4 << 20
MIN_RING_BYTES = 64 * 1024
MAX_RING_BYTES = 1 << 30
#: Where a server's ring listener sits: beside its Unix socket, this suffix appended.
RING_SUFFIX = ".ring"
#: Pieces a writer hands over below this size are joined before they are copied into the ring
#: (one copy in C instead of a Python step per piece); larger ones are copied from where they are.
JOIN_BELOW = 16 * 1024
#: While a producer waits for room, it re-reads the consumer's head this often anyway.
BLOCKED_RECHECK_S = 0.01

MAGIC = b"AIORLRNG"
#: The hand-over message: magic, layout version, reserved, ring bytes per direction.
OFFER = struct.Struct("<8sHHIQ")
LAYOUT_VERSION = 1
#: Shared page: per direction (0: client->server, 1: server->client) tail, head, blocked,
#: each on its own cache line.
CONTROL_BYTES = 4096
# Indices of 8-byte words in the control page (each counter on a cache line of its own).
_TAIL, _HEAD, _BLOCKED = 0, 8, 16
_DIRECTION_STRIDE = 32
_SEALS = getattr(fcntl, "F_SEAL_SHRINK", 2) | getattr(fcntl, "F_SEAL_GROW", 4)
_SEAL_SEAL = getattr(fcntl, "F_SEAL_SEAL", 1)


def ring_path(unix_path: str) -> str:
    """The ring listener of the server listening on Unix socket `unix_path`."""
    return unix_path + RING_SUFFIX


def segment_bytes(ring_bytes: int) -> int:
    return CONTROL_BYTES + 2 * ring_bytes


def _check_ring_bytes(ring_bytes: object) -> int:
    if type(ring_bytes) is not int or not MIN_RING_BYTES <= ring_bytes <= MAX_RING_BYTES:
        raise ProtocolError(f"ring of {ring_bytes!r} bytes, expected {MIN_RING_BYTES}..{MAX_RING_BYTES}")
    return ring_bytes


def _is_eventfd(fd: int) -> bool:
    try:
        return os.readlink(f"/proc/self/fd/{fd}") == "anon_inode:[eventfd]"
    except OSError:
        return False


class _Segment:
    """One mapped memfd: the control page and both rings; `side` 0 is the client."""

    def __init__(self, fd: int, ring_bytes: int, side: int) -> None:
        self.ring_bytes = ring_bytes
        self.mm = mmap.mmap(fd, segment_bytes(ring_bytes), mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        view = memoryview(self.mm)
        self.view = view
        # Counters are read and written through a native 'Q' view: one aligned 8-byte load or
        # store each (struct's '<Q' goes byte by byte, and a reader could see half an update).
        self.ctl = view[:CONTROL_BYTES].cast("Q")
        out_dir, in_dir = side, 1 - side
        self.out_data = view[CONTROL_BYTES + out_dir * ring_bytes : CONTROL_BYTES + (out_dir + 1) * ring_bytes]
        self.in_data = view[CONTROL_BYTES + in_dir * ring_bytes : CONTROL_BYTES + (in_dir + 1) * ring_bytes]
        self.out_tail = out_dir * _DIRECTION_STRIDE + _TAIL  # ours to write
        self.out_head = out_dir * _DIRECTION_STRIDE + _HEAD  # the peer's
        self.out_blocked = out_dir * _DIRECTION_STRIDE + _BLOCKED  # ours
        self.in_tail = in_dir * _DIRECTION_STRIDE + _TAIL  # the peer's
        self.in_head = in_dir * _DIRECTION_STRIDE + _HEAD  # ours
        self.in_blocked = in_dir * _DIRECTION_STRIDE + _BLOCKED  # the peer's

    def close(self) -> None:
        for view in (self.out_data, self.in_data, self.ctl, self.view):
            view.release()
        try:
            self.mm.close()
        except BufferError:  # a view still alive somewhere: the mapping goes with it
            pass


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


class RingTransport(asyncio.Transport):
    """An asyncio transport over one memfd's two rings, with a Unix socket for liveness."""

    #: The protocol may hand us memoryviews and forget them (we keep what does not fit, as
    #: uvloop's writelines does): no need to feed us in pieces.
    zero_copy_writelines = True

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        sock: socket.socket,
        memfd: int,
        wake_fd: int,
        peer_wake_fd: int,
        ring_bytes: int,
        *,
        server: bool,
    ) -> None:
        super().__init__()
        self._loop = loop
        self._sock = sock
        self._seg = _Segment(memfd, ring_bytes, 1 if server else 0)
        os.close(memfd)  # the mapping keeps the pages
        self._wake_fd = wake_fd
        self._peer_wake_fd = peer_wake_fd
        self._cap = ring_bytes
        self._server = server
        self._protocol: asyncio.BufferedProtocol | None = None
        self._head = 0  # bytes read from the inbound ring (ours)
        self._tail = 0  # bytes written to the outbound ring (ours)
        self._peer_tail = 0  # last inbound tail seen: it may only grow
        self._peer_head = 0  # last outbound head seen: it may only grow
        self._pending: collections.deque[memoryview] = collections.deque()
        self._pending_bytes = 0
        self._high, self._low = 4 << 20, 1 << 20
        self._protocol_paused = False
        self._reading_paused = False
        self._blocked = False
        self._recheck: asyncio.TimerHandle | None = None
        self._closing = False
        self._peer_eof = False
        self._finished = False
        self._extra = {
            "socket": sock,
            "sockname": sock.getsockname(),
            "peername": sock.getpeername() if not server else sock.getsockname(),
            "sslcontext": None,
            "ring_bytes": ring_bytes,
        }

    # ------------------------------------------------------------------ set-up

    def start(self, protocol: asyncio.BufferedProtocol) -> None:
        """Attach `protocol` and start reading; the protocol's ``connection_made`` runs here."""
        self._protocol = protocol
        self._loop.add_reader(self._wake_fd, self._on_wake)
        self._loop.add_reader(self._sock.fileno(), self._on_socket)
        try:
            protocol.connection_made(self)
        except BaseException:
            self._finish(None)
            raise
        self._loop.call_soon(self._on_wake)  # anything written before we listened

    # ------------------------------------------------------------------ transport API

    def get_extra_info(self, name, default=None):
        return self._extra.get(name, default)

    def is_closing(self) -> bool:
        return self._closing or self._finished

    def set_protocol(self, protocol) -> None:
        self._protocol = protocol

    def get_protocol(self):
        return self._protocol

    def is_reading(self) -> bool:
        return not self._reading_paused and not self._finished

    def pause_reading(self) -> None:
        self._reading_paused = True

    def resume_reading(self) -> None:
        if self._reading_paused:
            self._reading_paused = False
            if not self._finished:
                self._loop.call_soon(self._on_wake)

    def set_write_buffer_limits(self, high=None, low=None) -> None:
        high = 4 << 20 if high is None else high
        low = high // 4 if low is None else low
        if not 0 <= low <= high:
            raise ValueError(f"high ({high!r}) must be >= low ({low!r}) must be >= 0")
        self._high, self._low = high, low

    def get_write_buffer_size(self) -> int:
        return self._pending_bytes

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self._low, self._high

    def can_write_eof(self) -> bool:
        return False

    def write(self, data) -> None:
        self.writelines((data,))

    def writelines(self, list_of_data) -> None:
        if self._closing or self._finished:
            return  # as asyncio's transports: writes after close() go nowhere
        pending = self._pending
        small: list = []  # runs of small pieces are joined (in C) and copied in once
        for data in list_of_data:
            view = data if type(data) is memoryview else memoryview(data)
            nbytes = view.nbytes
            if nbytes < JOIN_BELOW:
                if nbytes:
                    small.append(view)
                continue
            if small:
                joined = b"".join(small)
                small = []
                pending.append(memoryview(joined))
                self._pending_bytes += len(joined)
            if view.format != "B" or view.ndim != 1:
                view = view.cast("B")
            pending.append(view)
            self._pending_bytes += nbytes
        if small:
            joined = small[0] if len(small) == 1 else b"".join(small)
            view = memoryview(joined)
            if view.format != "B" or view.ndim != 1:
                view = view.cast("B")
            pending.append(view)
            self._pending_bytes += view.nbytes
        self._pump_out()
        if not self._finished and not self._protocol_paused and self._pending_bytes > self._high:
            self._protocol_paused = True
            self._protocol.pause_writing()

    def close(self) -> None:
        if self._closing or self._finished:
            return
        self._closing = True
        self._reading_paused = True  # nothing more is received after close(), as on a socket
        if not self._pending:
            self._loop.call_soon(self._finish, None)

    def abort(self) -> None:
        if self._finished:
            return
        self._closing = True
        self._reading_paused = True
        self._pending.clear()
        self._pending_bytes = 0
        self._loop.call_soon(self._finish, None)
        self._stop_io()

    # ------------------------------------------------------------------ the rings

    def _read_peer(self, index: int) -> int:
        return self._seg.ctl[index]

    def _on_wake(self) -> None:
        if self._finished:
            return
        try:
            os.eventfd_read(self._wake_fd)
        except BlockingIOError:
            pass
        except OSError as exc:
            self._fatal(exc)
            return
        try:
            self._pump_in()
            if self._pending:
                self._pump_out()
        except ProtocolError as exc:
            self._fatal(exc)

    def _pump_in(self) -> None:
        """Copy what the peer wrote into the protocol's buffers, checking the peer's counter first."""
        seg, cap = self._seg, self._cap
        freed = False
        budget = cap  # at most a ring's worth per turn of the loop: a busy peer cannot starve it
        while not self._reading_paused and not self._finished:
            if budget <= 0:
                self._loop.call_soon(self._on_wake)
                break
            tail = self._read_peer(seg.in_tail)
            if tail < self._peer_tail or tail - self._head > cap:
                raise ProtocolError(
                    f"bad ring state from the peer: it claims {tail - self._head} unread bytes "
                    f"(ring of {cap}, previous mark {self._peer_tail - self._head})"
                )
            self._peer_tail = tail
            available = tail - self._head
            if not available:
                break
            buf = self._protocol.get_buffer(available)
            pos = self._head % cap
            n = min(len(buf), available, cap - pos)
            if n <= 0:
                break
            buf[:n] = seg.in_data[pos : pos + n]  # the protocol checks this copy, never the ring
            self._head += n
            budget -= n
            seg.ctl[seg.in_head] = self._head
            freed = True
            self._protocol.buffer_updated(n)
        if freed and self._read_peer(seg.in_blocked):
            self._signal_peer()
        if self._peer_eof and not self._reading_paused and not self._finished and self._head == self._peer_tail:
            self._end_of_input()

    def _pump_out(self) -> None:
        seg, cap = self._seg, self._cap
        pending = self._pending
        wrote = False
        while pending:
            head = self._read_peer(seg.out_head)
            if head < self._peer_head or head > self._tail:
                raise ProtocolError(
                    f"bad ring state from the peer: its read mark moved from {self._peer_head} to {head} "
                    f"(written {self._tail})"
                )
            self._peer_head = head
            room = cap - (self._tail - head)
            if not room:
                if self._set_blocked(True):  # room may have appeared meanwhile: look again
                    continue
                break
            view = pending[0]
            pos = self._tail % cap
            n = min(view.nbytes, room, cap - pos)
            seg.out_data[pos : pos + n] = view[:n]
            if n == view.nbytes:
                pending.popleft()
            else:
                pending[0] = view[n:]
            self._pending_bytes -= n
            self._tail += n
            seg.ctl[seg.out_tail] = self._tail
            wrote = True
        if not pending and self._blocked:
            self._set_blocked(False)
        if wrote:
            self._signal_peer()
        if self._protocol_paused and self._pending_bytes <= self._low and not self._finished:
            self._protocol_paused = False
            self._protocol.resume_writing()
        if self._closing and not pending and not self._finished:
            self._loop.call_soon(self._finish, None)

    def _set_blocked(self, blocked: bool) -> bool:
        """Raise or lower our `blocked` flag; True when raising it found room after all."""
        seg = self._seg
        self._blocked = blocked
        seg.ctl[seg.out_blocked] = 1 if blocked else 0
        if not blocked:
            if self._recheck is not None:
                self._recheck.cancel()
                self._recheck = None
            return False
        if self._recheck is None:
            self._recheck = self._loop.call_later(BLOCKED_RECHECK_S, self._recheck_room)
        return self._read_peer(seg.out_head) != self._peer_head

    def _recheck_room(self) -> None:
        self._recheck = None
        if self._finished:
            return
        try:
            self._pump_out()
        except ProtocolError as exc:
            self._fatal(exc)
            return
        if self._blocked and self._recheck is None and not self._finished:
            self._recheck = self._loop.call_later(BLOCKED_RECHECK_S, self._recheck_room)

    def _signal_peer(self) -> None:
        try:
            os.eventfd_write(self._peer_wake_fd, 1)
        except BlockingIOError:
            pass  # the counter is near its maximum: the peer has a wake-up pending anyway

    # ------------------------------------------------------------------ the socket: liveness

    def _on_socket(self) -> None:
        try:
            data = self._sock.recv(1)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if data:
            self._fatal(ProtocolError("unexpected bytes on a ring connection's socket"))
            return
        self._loop.remove_reader(self._sock.fileno())
        self._peer_eof = True
        if self._closing:
            self._loop.call_soon(self._finish, None)  # we were flushing to a peer that is gone
            return
        try:
            self._pump_in()  # whatever the peer wrote before it went is delivered first
        except ProtocolError as exc:
            self._fatal(exc)

    def _end_of_input(self) -> None:
        keep_open = False
        try:
            keep_open = bool(self._protocol.eof_received())
        finally:
            if not keep_open:
                self._closing = True
                self._finish(None)

    # ------------------------------------------------------------------ ending

    def _fatal(self, exc: BaseException) -> None:
        if self._finished:
            return
        logger.debug("ring transport %s: %r", self._extra["peername"], exc)
        self._closing = True
        self._reading_paused = True
        self._pending.clear()
        self._pending_bytes = 0
        self._stop_io()
        self._loop.call_soon(self._finish, exc)

    def _stop_io(self) -> None:
        for fd in (self._wake_fd, self._sock.fileno()):
            if fd >= 0:
                self._loop.remove_reader(fd)
        if self._recheck is not None:
            self._recheck.cancel()
            self._recheck = None

    def _finish(self, exc: BaseException | None) -> None:
        if self._finished:
            return
        self._finished = True
        self._closing = True
        self._stop_io()
        self._pending.clear()
        self._pending_bytes = 0
        protocol = self._protocol
        try:
            if protocol is not None:
                protocol.connection_lost(exc)
        finally:
            self._sock.close()  # the peer sees EOF
            for fd in (self._wake_fd, self._peer_wake_fd):
                try:
                    os.close(fd)
                except OSError:
                    pass
            self._seg.close()
            self._protocol = None


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
