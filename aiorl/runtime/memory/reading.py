"""The message loop of every memory host connection (`MessageReader`): each
message checked (`aiorl.runtime.messages`) and handed on until the peer's own
end; a message that breaks the protocol closes that connection only, counted
(``bad_messages``) and logged at a bounded rate."""

from __future__ import annotations

from aiorl.core.ratelog import RateLimitedLog
from aiorl.runtime.messages import BadMessage, check
from aiorl.wire import Connection, ConnectionClosed


class MessageReader:
    def __init__(self, log_bad: RateLimitedLog):
        # Bad input from a peer that authenticated: every one is counted, the lines are bounded.
        self._log_bad = log_bad
        self.bad_messages = 0  # connections closed for a message that broke the protocol

    async def read(self, conn: Connection, name: str, done_kind: str, allowed: set[str], handle) -> dict | None:
        """Feed each checked message to `handle` until the peer's `done_kind` message, whose
        fields are returned; None when the connection ended first or sent something bad (logged).
        What `handle` returns, if anything, is awaited before the next message is read."""
        try:
            async for msg in conn:
                fields = check(msg.kind, msg.meta, allowed | {done_kind})
                if msg.kind == done_kind:
                    return fields
                pending = handle(msg, fields)
                if pending is not None:
                    await pending
        except ConnectionClosed:
            pass
        except BadMessage as exc:
            self.bad_messages += 1
            self._log_bad("closing connection of %s: bad message: %s", name, exc)
            conn.abort()
        return None
