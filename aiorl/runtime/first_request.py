"""A server's wait for an authenticated peer's first request, under a deadline.

The token only says a peer may talk; a peer that authenticated and then says nothing would
hold one of the server's ``max_connections`` for as long as it likes, and a leaking client
fills them. So the coordinator (``register``) and the memory host (``attach``) both give the
first request ``cluster.coordinator_timeout_s`` and close a connection that sends none.
"""

from __future__ import annotations

import asyncio

from aiorl.runtime.messages import BadMessage, check
from aiorl.wire import Connection, Message


async def first_request(conn: Connection, timeout_s: float, allowed: set[str] | None = None) -> tuple[Message, dict]:
    """The next message on `conn` and its checked fields, within `timeout_s`; it must be a request
    (of a kind in `allowed`, when given). Raises TimeoutError, ConnectionClosed or BadMessage."""
    try:
        async with asyncio.timeout(timeout_s):
            msg = await conn.recv()
    except TimeoutError:
        raise TimeoutError(f"no request within {timeout_s:g}s of authenticating") from None
    fields = check(msg.kind, msg.meta, allowed)
    if msg.request_id is None:
        raise BadMessage(f"{msg.kind} must be a request")
    return msg, fields
