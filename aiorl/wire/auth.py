"""The cluster token and the HMAC-SHA256 challenge-response built on it.

Every connection starts with a mutual proof that both ends hold the same
cluster token, before any other frame is accepted::

    client -> server  HELLO   {name, nonce_c}
    server -> client  HELLO   {name, nonce_s, mac_s}   mac_s = HMAC(token, "server" transcript)
    client -> server  AUTH    {mac_c}                  mac_c = HMAC(token, "client" transcript)
    server -> client  WELCOME {}                       (or REJECT {reason, code})

The transcript binds the protocol version, the direction, both fresh 32-byte
nonces and both names, so a MAC can be replayed neither on another connection
nor in the other direction. MACs are compared with ``hmac.compare_digest``.
The token itself never leaves the process and is never logged.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import stat
import struct
from pathlib import Path

from .errors import TokenError

__all__ = [
    "TOKEN_ENV",
    "NONCE_BYTES",
    "MIN_TOKEN_BYTES",
    "load_token",
    "generate_token",
    "write_token_file",
    "new_nonce",
    "mac",
]

TOKEN_ENV = "AIORL_TOKEN"
NONCE_BYTES = 32
MIN_TOKEN_BYTES = 16


def generate_token() -> bytes:
    """A fresh random cluster token: 64 hex characters (256 bits), safe in an env var."""
    return secrets.token_hex(32).encode("ascii")


def write_token_file(path: str | os.PathLike, token: bytes) -> None:
    """Write ``token`` to ``path`` readable by its owner only (0600), creating parents (0700)."""
    _check_token(token, f"token for {path}")
    path = Path(path)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)  # O_CREAT's mode does not apply to a file that already existed
        os.write(fd, token + b"\n")
    finally:
        os.close(fd)


def load_token(path: str | os.PathLike | None = None) -> bytes:
    """The cluster token: ``$AIORL_TOKEN`` if set, else the contents of ``path``.

    The file must not be readable or writable by group or others (mode 0600 or
    0400); surrounding whitespace is stripped. Raises :class:`TokenError` with
    what to do when there is no usable token.
    """
    env = os.environ.get(TOKEN_ENV)
    if env is not None and env.strip():
        return _check_token(env.strip().encode(), f"${TOKEN_ENV}")
    if path is None:
        raise TokenError(f"no cluster token: set ${TOKEN_ENV} or give a token file (mode 0600)")
    path = Path(path)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise TokenError(f"token file {path} does not exist") from None
    if not stat.S_ISREG(st.st_mode):
        raise TokenError(f"token file {path} is not a regular file")
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o077:
        raise TokenError(
            f"token file {path} has mode {mode:04o}; it must be 0600 (readable by its owner only): "
            f"chmod 600 {path}"
        )
    return _check_token(path.read_bytes().strip(), f"token file {path}")


def _check_token(token: bytes, where: str) -> bytes:
    if not isinstance(token, bytes):
        raise TypeError(f"{where}: the token must be bytes, got {type(token).__name__}")
    if len(token) < MIN_TOKEN_BYTES:
        raise TokenError(
            f"{where} is {len(token)} bytes, shorter than {MIN_TOKEN_BYTES}; "
            "use aiorl.wire.generate_token()"
        )
    return token


def new_nonce() -> bytes:
    return secrets.token_bytes(NONCE_BYTES)


def mac(
    token: bytes,
    direction: bytes,
    version: int,
    client_nonce: bytes,
    server_nonce: bytes,
    client_name: str,
    server_name: str,
) -> bytes:
    """HMAC-SHA256 over the handshake transcript, for ``direction`` b"client" or b"server"."""
    client = client_name.encode()
    server = server_name.encode()
    transcript = b"".join((
        b"aiorl-handshake\0", direction, b"\0",
        struct.pack("<BHH", version, len(client), len(server)),
        client_nonce, server_nonce, client, server,
    ))
    return hmac.new(token, transcript, hashlib.sha256).digest()
