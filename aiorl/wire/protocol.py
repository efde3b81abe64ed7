"""The asyncio protocol under every :class:`~aiorl.wire.Connection`.

It owns the bytes: framing and flow control in both directions; the
handshake's states live in :class:`aiorl.wire.auth.Handshake`, which this
protocol only feeds and whose bytes it writes. :mod:`aiorl.wire.stream` puts
the message API on top (:class:`~aiorl.wire.Connection`), :mod:`aiorl.wire.connection`
the clients and servers that start it.

Receiving (``BufferedProtocol``, so the loop reads straight into our memory):

- Small frames are read in windows of up to ``READ_WINDOW`` bytes into one
  staging buffer and parsed in place; a window usually holds many frames, so
  small messages cost one read syscall per window, not per message. Each
  small payload is copied once out of staging (it must outlive the window).
- A frame whose payload is over ``SMALL_PAYLOAD`` gets its own buffer as soon as
  its header is in and checked; the loop then reads the rest of the payload
  straight into it (``get_buffer`` returns exactly the bytes still missing), so a
  1 GiB frame is never copied after the kernel hands it over.
- Complete messages go into a bounded queue (``_MessageQueue``: asyncio.Queue
  semantics, less bookkeeping). When it is full the protocol stops parsing;
  bytes keep arriving into staging until it is full as well, and then it calls
  ``transport.pause_reading()``, so the peer's sends back up through TCP.
  ``recv()`` resumes parsing once the queue is half empty, and reading once
  staging is half empty. (Pausing the socket only when staging is full, not
  every time the queue fills, saves two epoll_ctl calls per queue's worth of
  small messages.) Nothing here grows without bound.
- Large payload buffers are page-aligned and recycled per connection (``BufferPool``) once no received array
  refers to them any more: the kernel's copy into a cold, freshly faulted,
  misaligned buffer cost twice as much as the copy itself.

Sending: frames are appended to an outgoing list and handed to the transport
once per loop iteration (or at once past ``COALESCE_BYTES``), so bursts of small
messages become one ``writelines`` (one ``writev``, zero-copy on uvloop). A
connection with a ``flush_delay_s`` holds them up to that long instead, so
steady streams of small messages also go out several to a write (and wake
the peer once).
Senders wait in ``drain()`` while the transport is over its high-water mark.
Appending a frame never awaits, which makes every frame atomic however many
tasks send at once. The stock loop's socket transport joins ``writelines``
and copies whatever the kernel does not take at once, so there we feed it
``STOCK_CHUNK`` pieces, and only when its buffer has drained.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from aiorl._ext.wire import array_views as _array_views
from aiorl.core.buffer_pool import BufferPool

from . import auth, unix
from .codec import (
    FIXED,
    FIXED_SIZE,
    HANDSHAKE_MAX_HEADER_BYTES,
    MAGIC,
    PROTOCOL_VERSION,
    Decoder,
    Encoder,
    FrameType,
    Limits,
)
from .errors import AuthError, ConnectionClosed, ProtocolError, RemoteError
from .message import _EOF, Message
from .stream import Connection

logger = logging.getLogger("aiorl.wire")

#: Payloads up to this size are completed in the staging buffer and copied out.
SMALL_PAYLOAD = 64 * 1024
#: Most bytes one read may put into the staging buffer: large while frames are
#: small (fewer reads per message), small right after a large frame, because
#: the head of the next large frame lands in staging and is copied out once.
READ_WINDOW = 256 * 1024
READ_WINDOW_AFTER_LARGE = 64 * 1024
#: Staging size before authentication: room for a few handshake frames.
HANDSHAKE_STAGE = 4 * (FIXED_SIZE + HANDSHAKE_MAX_HEADER_BYTES)
#: Outgoing bytes that trigger an immediate hand-over to the transport instead
#: of waiting for the end of the loop iteration.
COALESCE_BYTES = 64 * 1024
#: The stock (non-uvloop) socket transport copies whatever the kernel does not
#: take at once into one bytearray; we feed it in pieces of this size, and only
#: when it is empty, so a 16 MiB frame is not copied whole.
STOCK_CHUNK = 256 * 1024

_NO_ARRAYS = ((), 0)
_MESSAGE_TYPES = FrameType.MESSAGES
_unpack_fixed = FIXED.unpack_from


class _MessageQueue:
    """The bounded FIFO between a connection's reader and ``recv()``.

    ``asyncio.Queue`` semantics (FIFO, any number of waiting getters,
    cancellation-safe ``get``) without its ``task_done``/``join`` bookkeeping,
    which costs more per small message than parsing the frame. Boundedness is
    the protocol's job: it stops parsing at ``maxsize``.
    """

    __slots__ = ("maxsize", "_items", "_getters", "_loop")

    def __init__(self, maxsize: int, loop: asyncio.AbstractEventLoop) -> None:
        self.maxsize = maxsize
        self._items: collections.deque = collections.deque()
        self._getters: collections.deque[asyncio.Future] = collections.deque()
        self._loop = loop

    def __len__(self) -> int:
        return len(self._items)

    def qsize(self) -> int:
        return len(self._items)

    def full(self) -> bool:
        return len(self._items) >= self.maxsize

    def put_nowait(self, item: Any) -> None:
        self._items.append(item)
        self._wake_next()

    def _wake_next(self) -> None:
        getters = self._getters
        while getters:
            getter = getters.popleft()
            if not getter.done():
                getter.set_result(None)
                return

    async def get(self) -> Any:
        items = self._items
        while not items:
            getter = self._loop.create_future()
            self._getters.append(getter)
            try:
                await getter
            except BaseException:
                getter.cancel()
                try:
                    self._getters.remove(getter)
                except ValueError:
                    pass
                if items and not getter.cancelled():
                    self._wake_next()  # we were woken but are leaving: pass it on
                raise
        return items.popleft()


@dataclass(slots=True)
class _Direct:
    """A large frame being read straight into its own payload buffer."""

    ftype: int
    request_id: int
    kind: str
    layout: tuple
    meta: dict
    payload: np.ndarray
    pos: int  # bytes of the payload received so far
    view: memoryview = field(init=False)

    def __post_init__(self) -> None:
        self.view = memoryview(self.payload)


def _format_address(address: Any) -> str:
    if isinstance(address, tuple) and len(address) >= 2:
        host, port = address[0], address[1]
        return f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"
    return str(address)


class WireProtocol(asyncio.BufferedProtocol):
    """One end of one connection. Not public: use ``connect()`` / ``serve()``."""

    def __init__(
        self,
        *,
        server: bool,
        token: bytes,
        name: str,
        limits: Limits,
        recv_queue_size: int,
        handshake_timeout_s: float,
        first_bytes_timeout_s: float | None = None,
        on_ready: Callable[[WireProtocol], None] | None = None,
        on_lost: Callable[[WireProtocol], None] | None = None,
        admit: Callable[[WireProtocol], str | None] | None = None,
        admit_proved: Callable[[WireProtocol], str | None] | None = None,
        screen: Callable[[WireProtocol], str | None] | None = None,
        log_failure: Callable[..., Any] | None = None,
        version: int = PROTOCOL_VERSION,
    ) -> None:
        self._loop = asyncio.get_running_loop()
        self._server = server
        self._token = token
        self._name = name
        self._limits = limits
        self._version = version
        self._handshake_timeout_s = handshake_timeout_s
        # Server side: a peer that has sent no byte this long is not an aiorl role (a role's
        # HELLO leaves as soon as it connects), so it loses its handshake slot long before
        # the handshake's own deadline.
        self._first_bytes_timeout_s = first_bytes_timeout_s
        self._on_ready = on_ready
        self._on_lost = on_lost
        # Server side: `admit` may refuse a new connection and `admit_proved` one whose
        # client just proved itself (a reason string: refused as busy); failures
        # before authentication are logged through `log_failure` (rate-limited).
        self._admit = admit
        self._admit_proved = admit_proved
        # Server side: `screen` may refuse a new connection outright (a Unix peer of another
        # uid): no byte is written to it, and nothing of the handshake starts.
        self._screen = screen
        self._log_failure = log_failure
        # `limits` are what this side accepts; what it sends only has to fit the wire's own
        # maxima (the peer enforces its limits), with the header cap both sides share.
        self._encoder = Encoder(Limits(max_header_bytes=limits.max_header_bytes), version)
        self._decoder = Decoder(limits)
        self.transport: asyncio.Transport | None = None
        self.peer = "?"
        self.peer_host = "?"
        self.peer_name: str | None = None
        self.unix = False  # over a Unix socket (a local run), not TCP
        self.peer_pid: int | None = None  # a Unix peer's pid, as the kernel saw it connect

        # receiving
        self._queue = _MessageQueue(recv_queue_size, self._loop)
        self._resume_at = recv_queue_size // 2
        self._overflow: collections.deque = collections.deque()
        self._parsing_paused = False  # the queue is full: complete frames wait in staging
        self._reading_paused = False  # ...and staging is full too: transport.pause_reading()
        # Until the peer is authenticated it can only send tiny handshake
        # frames, so it gets a tiny buffer: a flood of unauthenticated
        # connections costs little memory (and each lives at most the
        # handshake timeout). The full staging buffer comes with the handshake.
        self._stage = bytearray(HANDSHAKE_STAGE)
        self._stage_view = memoryview(self._stage)
        self._start = 0  # first unparsed byte in staging
        self._end = 0  # end of received bytes in staging
        self._direct: _Direct | None = None
        self._window = READ_WINDOW
        self._pool = BufferPool()
        self._last_schema = b""  # the previous frame's schema bytes and decoded layout
        self._last_layout: tuple = ("", _NO_ARRAYS)

        # sending
        self._out: list = []
        self._out_bytes = 0
        self._flush_handle: asyncio.Handle | None = None
        self.flush_delay_s = 0.0  # see Connection.flush_delay_s
        self._writing_paused = False
        self._drain_waiters: list[asyncio.Future] = []
        self._chunked = False

        # handshake
        self._authenticated = False
        self._handshake = auth.Handshake(client=not server, token=token, name=name, version=version)
        self._handshake_timer: asyncio.TimerHandle | None = None
        self._silent_timer: asyncio.TimerHandle | None = None
        self.connected_at = self._loop.time()
        self.silent = True  # nothing received yet (the server's handshake slots go to others first)
        self.handshake_done: asyncio.Future | None = None if server else self._loop.create_future()

        # requests awaiting a reply: request id -> future
        self._pending: dict[int, asyncio.Future] = {}
        self._next_request_id = 1

        # lifecycle
        self._closing = False  # close()/abort() was called here
        self._failed = False  # bad input: stop reading anything more
        self._lost = False  # connection_lost has run
        self._cause: BaseException | None = None  # what ended the connection; None = clean
        self._closed = self._loop.create_future()
        self.connection: Connection = Connection(self)

    def __repr__(self) -> str:
        return f"<WireProtocol {self.connection!r}>"

    # ------------------------------------------------------------------ lifecycle

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        self.unix = unix.is_unix(sock)
        if self.unix:  # a client's end has no name: say which socket it came in on
            self.peer = f"unix:{transport.get_extra_info('sockname' if self._server else 'peername')}"
            self.peer_host = "unix"  # one source for the per-host handshake cap, as 127.0.0.1 is
            self.peer_pid = unix.peer_pid(sock)
        else:
            address = transport.get_extra_info("peername")
            self.peer = _format_address(address)
            self.peer_host = str(address[0]) if isinstance(address, tuple) and address else self.peer
        if self._screen is not None:
            refusal = self._screen(self)
            if refusal is not None:
                self._failed = True
                self._cause = PermissionError(refusal)
                transport.abort()
                return
        if self._admit is not None:
            refusal = self._admit(self)
            if refusal is not None:  # at a connection limit: say so and hang up, before any work
                self._failed = True
                self._cause = ConnectionRefusedError(refusal)
                transport.write(auth.reject_frame("busy", refusal, self._version))
                transport.close()
                return
        if sock is not None and not self.unix:
            try:  # frames are coalesced by us; never wait for Nagle
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except (OSError, AttributeError):
                pass
        # uvloop's transports and the ring transport keep the views writelines hands them.
        is_uvloop = type(transport).__module__.startswith("uvloop") or getattr(transport, "zero_copy_writelines", False)
        tls = transport.get_extra_info("sslcontext") is not None
        self._chunked = not is_uvloop and not tls
        if self._chunked:
            transport.set_write_buffer_limits(high=STOCK_CHUNK // 4, low=0)  # type: ignore[attr-defined]
        else:
            transport.set_write_buffer_limits(  # type: ignore[attr-defined]
                high=self._limits.write_buffer_high_bytes, low=self._limits.write_buffer_low_bytes
            )
        self._handshake_timer = self._loop.call_later(self._handshake_timeout_s, self._handshake_timed_out)
        first = self._first_bytes_timeout_s
        if self._server and first is not None and first < self._handshake_timeout_s:
            self._silent_timer = self._loop.call_later(first, self._silent_timed_out)
        if not self._server:
            transport.write(self._handshake.start())

    def eof_received(self) -> bool:
        return False  # let the transport close; connection_lost sorts out clean vs mid-frame

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = True
        self._writing_paused = False
        for handle in (self._handshake_timer, self._silent_timer, self._flush_handle):
            if handle is not None:
                handle.cancel()
        self._out.clear()
        self._out_bytes = 0
        if not self._failed and self._authenticated:
            # Frames that arrived while reading was paused are still in staging:
            # deliver them (the queue overflows into the bounded staging-sized
            # backlog) before telling anyone the connection is gone.
            try:
                self._parse()
            except (ProtocolError, AuthError) as bad:
                self._cause = bad
                logger.warning("%s: %s", self._who(), bad)
            except Exception as bug:
                self._bad_input(bug)
            else:
                partial = self._end - self._start
                if self._direct is not None:
                    partial = FIXED_SIZE + self._direct.pos
                if partial and exc is None and not self._closing:
                    self._cause = ProtocolError(
                        f"peer closed the connection mid-frame ({partial} bytes of an unfinished frame)"
                    )
                    logger.warning("%s: %s", self._who(), self._cause)
        if exc is not None and self._cause is None:
            self._cause = exc
            if not self._closing:
                logger.warning("%s: connection lost: %r", self._who(), exc)
        if self._authenticated or self._cause is None:
            logger.debug("%s: closed (%s)", self._who(), self._cause or "clean")
        self._direct = None
        if self.handshake_done is not None and not self.handshake_done.done():
            self.handshake_done.set_exception(
                self._cause or ConnectionClosed(f"{self.peer} closed the connection during the handshake")
            )
        if self._pending:
            pending, self._pending = self._pending, {}
            for future in pending.values():
                if not future.done():
                    future.set_exception(self.closed_error())
        self._wake_drain_waiters(self.closed_error())
        self._push(_EOF)
        if not self._closed.done():
            self._closed.set_result(None)
        if self._on_lost is not None:
            self._on_lost(self)

    def closed_error(self) -> ConnectionClosed:
        """A fresh ConnectionClosed describing why this connection ended."""
        cause = self._cause
        if cause is not None:
            why = f"ended: {type(cause).__name__}: {cause}"
        elif self._closing:
            why = "was closed by this side"
        elif self._lost:
            why = "was closed by the peer"
        else:
            why = "is closing"
        return ConnectionClosed(f"connection {self._who()} {why}", cause)

    def _who(self) -> str:
        name = f" ({self.peer_name})" if self.peer_name else ""
        return f"{'from' if self._server else 'to'} {self.peer}{name}"

    def fail(self, exc: BaseException, reply: bytes = b"") -> None:
        """Bad input or a failed handshake: log why, and drop this connection only.

        ``reply`` (a REJECT frame from the handshake) is written before hanging up.
        """
        if self._failed or self._lost:
            return
        self._failed = True
        self._cause = exc
        self._direct = None
        if self._log_failure is not None and not self._authenticated:
            self._log_failure("closing connection %s: %s", self._who(), exc)
        else:
            logger.warning("closing connection %s: %s", self._who(), exc)
        if self.handshake_done is not None and not self.handshake_done.done():
            self.handshake_done.set_exception(exc)
        transport = self.transport
        if transport is None:
            return
        if reply and not transport.is_closing():
            # Tell the peer why before hanging up (tiny, fits the socket buffer).
            transport.write(reply)
            transport.close()
        else:
            transport.abort()

    def close_transport(self) -> None:
        self._closing = True
        if self.transport is not None and not self._lost:
            self.transport.close()

    def abort(self) -> None:
        self._closing = True
        if self.handshake_done is not None and not self.handshake_done.done():
            self.handshake_done.cancel()
        if self.transport is not None and not self._lost:
            self.transport.abort()

    # ------------------------------------------------------------------ receiving

    def get_buffer(self, sizehint: int) -> memoryview:
        direct = self._direct
        if direct is not None:
            return direct.view[direct.pos :]
        start, end = self._start, self._end
        if start == end:
            self._start = self._end = end = 0
        elif len(self._stage) - end < self._window:
            # Move the unfinished frame to the front. (A temporary copy: the
            # regions may overlap.)
            kept = end - start
            self._stage[:kept] = bytes(self._stage_view[start:end])
            self._start, self._end = 0, kept
            end = kept
            if end == len(self._stage):
                # Only reachable if a transport reads while paused; grow rather than fail.
                self._stage = self._stage + bytearray(READ_WINDOW)
                self._stage_view = memoryview(self._stage)
        return self._stage_view[end : end + self._window]

    def buffer_updated(self, nbytes: int) -> None:
        if self._failed:
            return
        try:
            if not self._authenticated:
                if self.silent:
                    self.silent = False
                    if self._silent_timer is not None:
                        self._silent_timer.cancel()
                        self._silent_timer = None
                self._end += nbytes
                data = bytes(self._stage_view[self._start : self._end])
                self._start = self._end = 0
                if not (self._lost or self._closing):  # after a reset or abort() the handshake has ended
                    self._handshake_events(self._handshake.receive(data))
                return
            direct = self._direct
            if direct is not None:
                direct.pos += nbytes
                if direct.pos == len(direct.payload):
                    self._direct = None
                    self._frame(
                        direct.ftype, direct.request_id, direct.kind, direct.layout, direct.meta, direct.payload
                    )
                return
            self._end += nbytes
            self._parse()
            if self._parsing_paused and not self._reading_paused and self._staging_room() < READ_WINDOW:
                # Queue full and staging full: stop reading, TCP pushes back.
                self._reading_paused = True
                self.transport.pause_reading()
        except Exception as exc:
            self._bad_input(exc)

    def _bad_input(self, exc: Exception) -> None:
        """Bad bytes (or, never expected, a bug of ours) end this connection and only this one."""
        if isinstance(exc, (ProtocolError, AuthError)):
            self.fail(exc)
            return
        logger.error("internal error reading from %s", self.peer, exc_info=exc)
        exc = ProtocolError(f"internal error: {exc!r}")
        if self._lost:
            self._cause = self._cause or exc
        else:
            self.fail(exc)

    def _parse(self) -> None:
        """Handle every complete frame in staging, until the queue is full or input is bad.

        The hot loop for small messages: the fixed header is one struct unpack,
        the schema is usually the previous frame's (compared in place, no copy),
        empty meta skips msgpack, and data messages go straight to the queue.
        """
        stage = self._stage
        view = self._stage_view
        queue = self._queue
        items = queue._items
        maxsize = queue.maxsize
        max_header = self._limits.max_header_bytes
        max_payload = self._limits.max_payload_bytes
        while not self._failed and (not self._parsing_paused or self._lost):
            start = self._start
            end = self._end
            if end - start < FIXED_SIZE:
                return
            magic, version, ftype, flags, schema_len, meta_len, payload_len, request_id = _unpack_fixed(stage, start)
            header_len = schema_len + meta_len
            if magic != MAGIC or version != self._version or flags:
                self._check_early_header(magic, version, flags)
            elif ftype not in _MESSAGE_TYPES or not schema_len or header_len > max_header or payload_len > max_payload:
                self._bad_message_header(ftype, schema_len, header_len, payload_len)
            header_end = start + FIXED_SIZE + header_len
            if header_end > end:
                return  # header incomplete; staging always has room for a whole one
            if schema_len:
                schema_start = start + FIXED_SIZE
                last = self._last_schema
                if schema_len == len(last) and stage.startswith(last, schema_start):
                    kind, layout = self._last_layout
                else:
                    last = bytes(view[schema_start : schema_start + schema_len])
                    kind, layout = self._last_layout = self._decoder.schema(last)
                    self._last_schema = last
                if layout[1] != payload_len:
                    raise ProtocolError(f"arrays need {layout[1]} payload bytes, frame declares {payload_len}")
            else:
                kind, layout = "", _NO_ARRAYS
            if meta_len == 1 and stage[header_end - 1] == 0x80:
                meta = {}  # the common empty map, without msgpack
            else:
                meta = self._decoder.meta(bytes(view[header_end - meta_len : header_end]))
            frame_end = header_end + payload_len
            if frame_end <= end:
                self._start = frame_end
                self._window = READ_WINDOW
                if ftype == FrameType.DATA:  # fast path: a small data message
                    if request_id:
                        raise ProtocolError("data frame carries a request id")
                    payload = stage[header_end:frame_end]  # one copy: it must outlive staging
                    message = Message(kind, meta, _array_views(layout[0], payload))
                    if self._overflow or len(items) >= maxsize:
                        self._push(message)
                    else:
                        items.append(message)  # (queue.put_nowait, inlined)
                        if queue._getters:
                            queue._wake_next()
                        if len(items) >= maxsize:
                            self._parsing_paused = True
                else:
                    self._frame(
                        ftype, request_id, kind, layout, meta, stage[header_end:frame_end] if payload_len else None
                    )
            elif payload_len <= SMALL_PAYLOAD or self._lost:
                return
            else:
                # Large frame: everything is checked, so allocate it now and let
                # the loop read the rest straight into it.
                payload = self._pool.take(payload_len)
                have = end - header_end
                payload[:have] = np.frombuffer(stage, np.uint8, have, header_end)
                self._direct = _Direct(ftype, request_id, kind, layout, meta, payload, have)
                self._start = self._end = 0
                self._window = READ_WINDOW_AFTER_LARGE
                return

    def _check_early_header(self, magic: bytes, version: int, flags: int) -> None:
        """Checks that only fail on garbage (off the hot path)."""
        if magic != MAGIC:
            raise ProtocolError(f"bad magic {magic!r}: not an aiorl peer")
        if version != self._version:
            raise ProtocolError(f"peer speaks protocol {version}, this is {self._version}")
        raise ProtocolError(f"unknown frame flags 0x{flags:04x}")

    def _bad_message_header(self, ftype: int, schema_len: int, header_len: int, payload_len: int) -> None:
        limits = self._limits
        if ftype not in _MESSAGE_TYPES:
            raise ProtocolError(f"unexpected frame type {ftype} after the handshake")
        if not schema_len:
            raise ProtocolError("message frame without a schema")
        if header_len > limits.max_header_bytes:
            raise ProtocolError(f"header of {header_len} bytes exceeds max_header_bytes={limits.max_header_bytes}")
        raise ProtocolError(f"payload of {payload_len} bytes exceeds max_payload_bytes={limits.max_payload_bytes}")

    def _frame(self, ftype: int, request_id: int, kind: str, layout, meta: dict, payload) -> None:
        arrays = self._decoder.arrays(layout, payload) if layout[0] else {}
        if ftype == FrameType.DATA:
            if request_id:
                raise ProtocolError("data frame carries a request id")
            self._push(Message(kind, meta, arrays))
        elif ftype == FrameType.REQUEST:
            if not request_id:
                raise ProtocolError("request frame without a request id")
            self._push(Message(kind, meta, arrays, request_id))
        else:  # RESPONSE or ERROR
            future = self._pending.pop(request_id, None)
            if future is None or future.done():
                logger.debug("%s: dropping reply to request %d (timed out or cancelled)", self._who(), request_id)
                return
            if ftype == FrameType.RESPONSE:
                future.set_result(Message(kind, meta, arrays, request_id))
            else:
                future.set_exception(RemoteError(str(meta.get("reason", "error"))))

    def _push(self, item: Any) -> None:
        queue = self._queue
        if self._overflow or queue.full():
            # Only after connection loss (staged frames are drained) or from
            # a transport that read while paused; bounded by the staging buffer.
            self._overflow.append(item)
        else:
            queue.put_nowait(item)
        if not self._parsing_paused and queue.full():
            self._parsing_paused = True

    def refill(self) -> None:
        """Called by recv() after taking a message: move backlog in; parse and read again when half empty."""
        queue = self._queue
        overflow = self._overflow
        while overflow and not queue.full():
            queue.put_nowait(overflow.popleft())
        if not self._parsing_paused or overflow or queue.qsize() > self._resume_at:
            return
        self._parsing_paused = False
        # Frames already in staging go first; they may fill the queue again.
        try:
            self._parse()
        except Exception as exc:
            self._bad_input(exc)
            return
        if (
            self._reading_paused
            and not self._lost
            and not self._failed
            and self._staging_room() >= len(self._stage) // 2
        ):
            self._reading_paused = False
            self.transport.resume_reading()

    def _staging_room(self) -> int:
        """Bytes staging can still take (after moving the unparsed rest to the front)."""
        return len(self._stage) - (self._end - self._start)

    # ------------------------------------------------------------------ handshake

    def _handshake_timed_out(self) -> None:
        self._handshake_timer = None
        if not self._authenticated:
            self.fail(TimeoutError(f"no completed handshake within {self._handshake_timeout_s:g}s"))

    def _silent_timed_out(self) -> None:
        self._silent_timer = None
        if self.silent and not self._authenticated:
            self.fail(TimeoutError(f"no byte received within {self._first_bytes_timeout_s:g}s of connecting"))

    def evict(self, reason: str) -> None:
        """Give up this handshake's slot to a newcomer: a "busy" REJECT, then hang up.

        Counted by the server as a refusal, not as a failed handshake: the peer did nothing wrong
        yet, it was only slower than the one that takes its slot."""
        if self._failed or self._lost or self.transport is None:
            return
        self._failed = True
        self._cause = ConnectionRefusedError(reason)
        if self.handshake_done is not None and not self.handshake_done.done():
            self.handshake_done.set_exception(self._cause)
        if not self.transport.is_closing():
            self.transport.write(auth.reject_frame("busy", reason, self._version))
            self.transport.close()

    def _handshake_events(self, events: list) -> None:
        """Carry out what the handshake state machine asks for."""
        self.peer_name = self._handshake.peer_name  # only ever a validated name
        for event in events:
            if isinstance(event, auth.Send):
                self.transport.write(event.data)
            elif isinstance(event, auth.ClientProved):
                refusal = self._admit_proved(self) if self._admit_proved is not None else None
                self._handshake_events(
                    self._handshake.accept() if refusal is None else self._handshake.refuse("busy", refusal)
                )
            elif isinstance(event, auth.Established):
                self._authenticated_now(event.rest)
                if self._server:
                    if self._on_ready is not None:
                        self._on_ready(self)
                elif not self.handshake_done.done():  # (connect() may have given up on it)
                    self.handshake_done.set_result(None)
                if event.rest:
                    self._parse()  # frames the peer sent right behind its last handshake frame
            elif isinstance(event, auth.Failed):
                self.fail(event.error, event.reply)

    def _authenticated_now(self, rest: bytes = b"") -> None:
        self._authenticated = True
        size = 2 * (FIXED_SIZE + self._limits.max_header_bytes + SMALL_PAYLOAD) + READ_WINDOW
        stage = bytearray(size)
        stage[: len(rest)] = rest
        self._stage, self._stage_view = stage, memoryview(stage)
        self._start, self._end = 0, len(rest)
        if self._handshake_timer is not None:
            self._handshake_timer.cancel()
            self._handshake_timer = None
        logger.debug("%s: authenticated", self._who())

    # ------------------------------------------------------------------ sending

    def write_frame(self, buffers: list, nbytes: int) -> None:
        """Queue one encoded frame. Never awaits, so frames never interleave."""
        if self._closing or self._lost or self._failed:
            raise self.closed_error()
        self._out += buffers
        self._out_bytes += nbytes
        if self._out_bytes >= COALESCE_BYTES:
            self._flush()
        elif self._flush_handle is None:
            if self.flush_delay_s > 0:
                self._flush_handle = self._loop.call_later(self.flush_delay_s, self._flush)
            else:
                self._flush_handle = self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        if self._flush_handle is not None:
            self._flush_handle.cancel()
            self._flush_handle = None
        if self._writing_paused or not self._out or self._lost:
            return
        transport = self.transport
        if not self._chunked:
            # uvloop: writelines keeps memoryviews and writev()s them (zero-copy).
            out, self._out = self._out, []
            self._out_bytes = 0
            transport.writelines(out)
            return
        out = self._out
        i = 0
        while i < len(out) and not self._writing_paused:
            buf = out[i]
            if len(buf) > STOCK_CHUNK:
                view = buf if isinstance(buf, memoryview) else memoryview(buf)
                piece, out[i] = view[:STOCK_CHUNK], view[STOCK_CHUNK:]
            else:
                j, size = i + 1, len(buf)
                while j < len(out) and size + len(out[j]) <= STOCK_CHUNK:
                    size += len(out[j])
                    j += 1
                piece = buf if j == i + 1 else b"".join(out[i:j])
                i = j
            self._out_bytes -= len(piece)
            transport.write(piece)
        del out[:i]

    def pause_writing(self) -> None:
        self._writing_paused = True

    def resume_writing(self) -> None:
        self._writing_paused = False
        self._flush()
        if not self._writing_paused and not self._out:
            self._wake_drain_waiters(None)

    def _wake_drain_waiters(self, exc: BaseException | None) -> None:
        waiters, self._drain_waiters = self._drain_waiters, []
        for waiter in waiters:
            if not waiter.done():
                if exc is None:
                    waiter.set_result(None)
                else:
                    waiter.set_exception(exc)

    async def drain(self) -> None:
        """Wait until the transport is below its low-water mark again (or the connection ends)."""
        while self._writing_paused:
            if self._lost:
                raise self.closed_error()
            waiter = self._loop.create_future()
            self._drain_waiters.append(waiter)
            await waiter

    async def flush_out(self) -> None:
        """Hand everything queued here to the transport (before closing)."""
        self._flush()
        while self._out and not self._lost:
            waiter = self._loop.create_future()
            self._drain_waiters.append(waiter)
            await waiter

    def next_request_id(self) -> int:
        request_id = self._next_request_id
        self._next_request_id += 1
        return request_id
