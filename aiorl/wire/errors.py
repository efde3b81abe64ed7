"""Exceptions raised by :mod:`aiorl.wire`.

Every error the wire layer raises is a :class:`WireError`, so a role can catch
the whole family in one place and still tell the causes apart.
"""

from __future__ import annotations

__all__ = [
    "WireError",
    "ProtocolError",
    "AuthError",
    "TokenError",
    "ServerBusy",
    "ConnectionClosed",
    "RemoteError",
]


class WireError(Exception):
    """Base class of every error raised by the wire layer."""


class ProtocolError(WireError):
    """The peer sent bytes that are not a valid aiorl frame, or broke the protocol.

    The connection that carried them is closed; other connections are unaffected.
    """


class AuthError(WireError):
    """The handshake failed: wrong cluster token, or the peer refused ours."""


class TokenError(WireError):
    """The cluster token could not be loaded (missing, too short, or an unsafe file)."""


class ServerBusy(WireError, ConnectionRefusedError):
    """The server refused this connection at one of its caps (connections, handshakes), or gave
    its handshake's slot to a newcomer; try again later.

    An ``OSError`` (``ConnectionRefusedError``), so code that retries a refused
    connect retries this too.
    """


class ConnectionClosed(WireError, ConnectionError):
    """The connection has ended.

    ``cause`` is the exception that ended it, or ``None`` for a clean close (the
    peer closed at a frame boundary, or this side called ``close()``/``abort()``).
    """

    def __init__(self, message: str, cause: BaseException | None = None) -> None:
        super().__init__(message)
        self.cause = cause

    @property
    def clean(self) -> bool:
        """True when nothing went wrong: a close at a frame boundary."""
        return self.cause is None


class RemoteError(WireError):
    """The peer answered a request with an error (``Connection.reply_error``)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason
