"""`Connection`: the message API of one authenticated peer (send, request, reply, iterate), over
the protocol that owns its bytes (`aiorl.wire.protocol`)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Mapping
from typing import Any

import numpy as np

from .codec import Decoder, FrameType, Limits
from .errors import ConnectionClosed
from .message import _EOF, Message

__all__ = ["Connection"]

logger = logging.getLogger("aiorl.wire")


class Connection:
    """An authenticated, message-framed connection to one peer."""

    __slots__ = ("_proto", "__weakref__")

    def __init__(self, proto) -> None:
        self._proto = proto

    @property
    def peer(self) -> str:
        """The peer's address: ``"host:port"``, or ``"unix:PATH"`` over a Unix socket (the ring
        listener's path, ending ``.ring``, over shared-memory rings)."""
        return self._proto.peer

    @property
    def peer_name(self) -> str | None:
        """The name the peer gave in the handshake, e.g. ``"actor-3"``."""
        return self._proto.peer_name

    @property
    def peer_pid(self) -> int | None:
        """The peer process's pid over a Unix socket, from the kernel (``SO_PEERCRED``); None over TCP."""
        return self._proto.peer_pid

    @property
    def limits(self) -> Limits:
        """What this side accepts from the peer (checked before anything is allocated)."""
        return self._proto._limits

    def set_limits(self, limits: Limits) -> None:
        """Accept frames up to `limits` from now on, e.g. once the peer's role is known.

        A server accepts little from a peer it does not know yet and widens the
        limits to what that peer may legitimately send.
        """
        if not isinstance(limits, Limits):
            raise TypeError(f"limits must be a Limits, got {type(limits).__name__}")
        proto = self._proto
        if limits.max_header_bytes > proto._limits.max_header_bytes:
            # The staging buffer was sized for the old maximum header.
            raise ValueError(
                f"set_limits cannot raise max_header_bytes ({proto._limits.max_header_bytes} -> "
                f"{limits.max_header_bytes}) on a live connection"
            )
        proto._limits = limits
        proto._decoder = Decoder(limits)
        proto._last_schema, proto._last_layout = b"", ("", ((), 0))  # re-check layouts against the new limits

    @property
    def flush_delay_s(self) -> float:
        """Seconds a sent message may wait to share a write with the next ones (0: this loop iteration).

        For steady streams of small messages where a few milliseconds do not
        matter: each write is a syscall on this side and a wake-up on the
        peer's. A message that brings the queued data to ``COALESCE_BYTES``,
        and ``close()``, still flush at once.
        """
        return self._proto.flush_delay_s

    @flush_delay_s.setter
    def flush_delay_s(self, seconds: float) -> None:
        if not (seconds >= 0 and seconds < float("inf")):
            raise ValueError(f"flush_delay_s must be a finite number >= 0, got {seconds!r}")
        self._proto.flush_delay_s = float(seconds)

    @property
    def closed(self) -> bool:
        """True once ``close()``/``abort()`` was called or the connection ended."""
        proto = self._proto
        return proto._closing or proto._lost or proto._failed

    def __repr__(self) -> str:
        proto = self._proto
        if proto._lost:
            state = f"closed ({proto._cause or 'clean'})"
        elif self.closed:
            state = "closing"
        else:
            state = "open"
        return (
            f"<Connection {proto._who()} {state} queued={sum(m is not _EOF for m in proto._queue._items)} "
            f"pending_requests={len(proto._pending)} reading_paused={proto._reading_paused} "
            f"writing_paused={proto._writing_paused}>"
        )

    # ------------------------------------------------------------------ sending

    async def send(
        self, kind: str, meta: Mapping[str, Any] | None = None, arrays: Mapping[str, np.ndarray] | None = None
    ) -> None:
        """Send one data message; waits while the write buffer is over its high-water mark.

        The frame is queued whole before anything awaits, so concurrent senders
        never interleave. Arrays of 32 KiB or more are sent from your memory
        without a copy, possibly after this returns: never modify an array
        after passing it here (see the buffer contract in :mod:`aiorl.wire.connection`).
        """
        proto = self._proto
        if proto._closing or proto._lost or proto._failed:
            raise proto.closed_error()
        buffers, nbytes = proto._encoder.encode(FrameType.DATA, kind, meta, arrays)
        proto.write_frame(buffers, nbytes)
        if proto._writing_paused:
            await proto.drain()

    async def request(
        self,
        kind: str,
        meta: Mapping[str, Any] | None = None,
        arrays: Mapping[str, np.ndarray] | None = None,
        *,
        timeout_s: float,
    ) -> Message:
        """Send a request and wait for its reply, all within ``timeout_s``.

        Raises ``TimeoutError`` (a late reply is dropped), :class:`RemoteError`
        if the peer answered with ``reply_error``, :class:`ConnectionClosed` if
        the connection ends first.
        """
        proto = self._proto
        if proto._closing or proto._lost or proto._failed:
            raise proto.closed_error()
        buffers, nbytes = proto._encoder.encode(
            FrameType.REQUEST, kind, meta, arrays, request_id := proto.next_request_id()
        )
        reply = proto._loop.create_future()
        proto._pending[request_id] = reply
        try:
            async with asyncio.timeout(timeout_s):
                proto.write_frame(buffers, nbytes)
                if proto._writing_paused:
                    await proto.drain()
                return await reply
        except TimeoutError:
            raise TimeoutError(f"request {kind!r} to {proto.peer} got no reply within {timeout_s:g}s") from None
        finally:
            proto._pending.pop(request_id, None)

    async def reply(
        self,
        request: Message,
        kind: str = "ok",
        meta: Mapping[str, Any] | None = None,
        arrays: Mapping[str, np.ndarray] | None = None,
    ) -> None:
        """Answer ``request`` (a received message with a ``request_id``)."""
        await self._reply(FrameType.RESPONSE, request, kind, meta, arrays)

    async def reply_error(self, request: Message, reason: str) -> None:
        """Answer ``request`` with an error; the requester's ``request()`` raises ``RemoteError(reason)``."""
        await self._reply(FrameType.ERROR, request, "error", {"reason": str(reason)}, None)

    async def _reply(self, ftype: int, request: Message, kind: str, meta, arrays) -> None:
        if request.request_id is None:
            raise ValueError(f"cannot reply to {request!r}: it is not a request (no request_id)")
        proto = self._proto
        if proto._closing or proto._lost or proto._failed:
            raise proto.closed_error()
        buffers, nbytes = proto._encoder.encode(ftype, kind, meta, arrays, request.request_id)
        proto.write_frame(buffers, nbytes)
        if proto._writing_paused:
            await proto.drain()

    # ------------------------------------------------------------------ receiving

    async def recv(self) -> Message:
        """The next data message or request, in arrival order.

        Raises :class:`ConnectionClosed` (``.cause`` says why, ``None`` if clean)
        once the connection has ended and every message that arrived before
        has been returned.
        """
        return await self._next(False)

    def __aiter__(self) -> AsyncIterator[Message]:
        return self

    def __anext__(self) -> Awaitable[Message]:
        # One coroutine per message instead of two (this is the hot path).
        return self._next(True)

    async def _next(self, iterating: bool) -> Message:
        proto = self._proto
        queue = proto._queue
        item = queue._items.popleft() if queue._items else await queue.get()
        if item is _EOF:
            queue._items.appendleft(item)  # it stays last: every later call ends the same way
            queue._wake_next()  # ...including the other tasks waiting in recv() right now
            error = proto.closed_error()
            if iterating and error.cause is None:
                raise StopAsyncIteration
            raise error
        if proto._parsing_paused or proto._overflow:
            proto.refill()
        return item

    # ------------------------------------------------------------------ closing

    async def close(self, timeout_s: float = 5.0) -> None:
        """Flush what is queued, then close; past ``timeout_s`` drop the connection instead."""
        proto = self._proto
        if not proto._lost:
            try:
                async with asyncio.timeout(timeout_s):
                    if not proto._closing:
                        try:
                            await proto.flush_out()
                        except ConnectionClosed:
                            pass  # it ended while flushing; nothing left to flush
                        proto.close_transport()
                    await asyncio.shield(proto._closed)
            except TimeoutError:
                logger.warning("%s: close() did not finish within %gs; aborting", proto._who(), timeout_s)
                proto.abort()
        await asyncio.shield(proto._closed)

    def abort(self) -> None:
        """Drop the connection now; anything not yet written is lost."""
        self._proto.abort()

    async def wait_closed(self) -> None:
        """Wait until the connection has ended (either side, any reason)."""
        await asyncio.shield(self._proto._closed)
