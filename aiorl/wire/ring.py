"""The ring transport: an asyncio transport over two single-producer single-consumer byte rings
in one shared mapping, with a Unix socket kept open for liveness. How the mapping is handed
over and checked is :mod:`aiorl.wire.shm`; the ring's rules and its wake-ups are in
docs/concepts/transports.md.

A writer copies bytes into the ring, then stores the new tail; a reader loads the tail, then
reads the bytes before it. Both are plain stores and loads (Python has no fence), which is
enough on x86-64, where other cores see stores in program order; on a weaker order a reader
could see the tail before the bytes. So rings are used on x86-64 only
(``aiorl.config.checks.RING_MACHINES``): there ``cluster.transport: auto`` picks them, elsewhere
it keeps to sockets and ``shm`` is refused."""

from __future__ import annotations

import asyncio
import collections
import logging
import mmap
import os
import socket

from aiorl._ext.wire import Control

from .errors import ProtocolError

__all__ = ["CONTROL_BYTES", "RingTransport", "segment_bytes"]

logger = logging.getLogger("aiorl.wire")

#: Pieces a writer hands over below this size are joined before they are copied into the ring
#: (one copy in C instead of a Python step per piece); larger ones are copied from where they are.
JOIN_BELOW = 16 * 1024
#: While a producer waits for room, it re-reads the consumer's head this often anyway.
BLOCKED_RECHECK_S = 0.01
#: A reader that freed room for a blocked writer wakes it only once at most this many bytes
#: stay unread (or none): the writer then refills half a ring at once instead of waking for
#: every read.
WAKE_WRITER_UNREAD_FRACTION = 2  # at most ring_bytes // this unread
#: Shared page: per direction (0: client->server, 1: server->client) tail, head, blocked,
#: waiting, each on its own cache line.
CONTROL_BYTES = 4096
# Indices of 8-byte words in the control page (each counter on a cache line of its own).
# tail: the writer's; head: the reader's; blocked: the writer's, "wake me when you free
# room"; waiting: the reader's, "wake me when you write" (raised only while it is idle).
_TAIL, _HEAD, _BLOCKED, _WAITING = 0, 8, 16, 24
_DIRECTION_STRIDE = 32


def segment_bytes(ring_bytes: int) -> int:
    return CONTROL_BYTES + 2 * ring_bytes


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
        # The same words for a store that must be seen before the next load (see aiorl._ext.wire).
        self.fenced = Control(self.ctl)
        out_dir, in_dir = side, 1 - side
        self.out_data = view[CONTROL_BYTES + out_dir * ring_bytes : CONTROL_BYTES + (out_dir + 1) * ring_bytes]
        self.in_data = view[CONTROL_BYTES + in_dir * ring_bytes : CONTROL_BYTES + (in_dir + 1) * ring_bytes]
        self.out_tail = out_dir * _DIRECTION_STRIDE + _TAIL  # ours to write
        self.out_head = out_dir * _DIRECTION_STRIDE + _HEAD  # the peer's
        self.out_blocked = out_dir * _DIRECTION_STRIDE + _BLOCKED  # ours
        self.out_waiting = out_dir * _DIRECTION_STRIDE + _WAITING  # the peer's
        self.in_tail = in_dir * _DIRECTION_STRIDE + _TAIL  # the peer's
        self.in_head = in_dir * _DIRECTION_STRIDE + _HEAD  # ours
        self.in_blocked = in_dir * _DIRECTION_STRIDE + _BLOCKED  # the peer's
        self.in_waiting = in_dir * _DIRECTION_STRIDE + _WAITING  # ours

    def close(self) -> None:
        self.fenced.release()
        for view in (self.out_data, self.in_data, self.ctl, self.view):
            view.release()
        try:
            self.mm.close()
        except BufferError:  # a view still alive somewhere: the mapping goes with it
            pass


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
        self._waiting = False  # our `waiting` flag is up: the peer wakes us when it writes
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
        self._loop.add_reader(self._wake_fd, self._on_wake_fd)
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

    def _on_wake_fd(self) -> None:
        """The peer wrote our eventfd: clear it (it stays readable until read), then read the ring."""
        if self._finished:
            return
        try:
            os.eventfd_read(self._wake_fd)
        except BlockingIOError:
            pass
        except OSError as exc:
            self._fatal(exc)
            return
        self._on_wake()

    def _on_wake(self) -> None:
        """Read what the ring holds and write what waits (also called without a wake-up)."""
        if self._finished:
            return
        try:
            self._pump_in()
            if self._pending:
                self._pump_out()
        except ProtocolError as exc:
            self._fatal(exc)

    def _pump_in(self) -> None:
        """Copy what the peer wrote into the protocol's buffers, checking the peer's counter first.

        Reads until the ring is empty (or reading pauses); then raises our `waiting` flag and
        looks at the tail once more, so that a write the peer made meanwhile is read now, and
        any later one comes with a wake-up."""
        seg, cap = self._seg, self._cap
        freed = False
        budget = cap  # at most a ring's worth per turn of the loop: a busy peer cannot starve it
        if self._waiting:  # awake: the peer need not signal writes until we are idle again
            self._waiting = False
            seg.ctl[seg.in_waiting] = 0
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
                if seg.fenced.store_then_load(seg.in_waiting, 1, seg.in_tail) == tail:
                    self._waiting = True
                    break
                seg.ctl[seg.in_waiting] = 0  # it wrote meanwhile: read that first (checked above)
                continue
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
        if (
            freed
            and seg.fenced.store_then_load(seg.in_head, self._head, seg.in_blocked)
            and self._peer_tail - self._head <= cap // WAKE_WRITER_UNREAD_FRACTION
        ):
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
        if wrote and seg.fenced.store_then_load(seg.out_tail, self._tail, seg.out_waiting):
            self._signal_peer()  # the peer is idle; otherwise it reads on without a wake-up
        if self._protocol_paused and self._pending_bytes <= self._low and not self._finished:
            self._protocol_paused = False
            self._protocol.resume_writing()
        if self._closing and not pending and not self._finished:
            self._loop.call_soon(self._finish, None)

    def _set_blocked(self, blocked: bool) -> bool:
        """Raise or lower our `blocked` flag; True when raising it found room after all."""
        seg = self._seg
        self._blocked = blocked
        if not blocked:
            seg.ctl[seg.out_blocked] = 0
            if self._recheck is not None:
                self._recheck.cancel()
                self._recheck = None
            return False
        if self._recheck is None:
            self._recheck = self._loop.call_later(BLOCKED_RECHECK_S, self._recheck_room)
        return seg.fenced.store_then_load(seg.out_blocked, 1, seg.out_head) != self._peer_head

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
