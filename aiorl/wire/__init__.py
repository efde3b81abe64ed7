"""aiorl.wire: the only code that touches sockets.

Authenticated (mutual HMAC-SHA256 over a cluster token, the connecting side
proving first), pickle-free framing of
named numpy arrays plus small msgpack metadata, over asyncio (uvloop by
default) TCP, optionally TLS, and between processes of one host over Unix
sockets (:mod:`aiorl.wire.unix`) and shared-memory rings (:mod:`aiorl.wire.shm`).
See :mod:`aiorl.wire.codec` for the frame format, :mod:`aiorl.wire.auth` for the
handshake, :mod:`aiorl.wire.stream` for the message API, :mod:`aiorl.wire.connection`
for clients, servers, the buffer contract and flow control.
"""

from .auth import generate_token, load_token, write_token_file
from .codec import ALLOWED_DTYPES, PROTOCOL_VERSION, Limits
from .connection import Connection, Server, connect, serve
from .errors import AuthError, ConnectionClosed, ProtocolError, RemoteError, ServerBusy, TokenError, WireError
from .message import Message

__all__ = [
    "ALLOWED_DTYPES",
    "PROTOCOL_VERSION",
    "AuthError",
    "Connection",
    "ConnectionClosed",
    "Limits",
    "Message",
    "ProtocolError",
    "RemoteError",
    "Server",
    "ServerBusy",
    "TokenError",
    "WireError",
    "connect",
    "generate_token",
    "load_token",
    "serve",
    "write_token_file",
]
