"""The cluster token and the handshake built on it, as a sans-I/O state machine.

Every connection starts with a mutual proof that both ends hold the same
cluster token, before any other frame is accepted. The side that connects
proves first, so a peer that has not proved anything never gets a MAC under
the token (no offline oracle for guessing a weak token)::

    client -> server  HELLO     {name, nonce_c}
    server -> client  CHALLENGE {name, nonce_s}
    client -> server  AUTH      {mac_c}    mac_c = HMAC(token, "client" transcript)
    server -> client  WELCOME   {mac_s}    mac_s = HMAC(token, "server" transcript)
                      (or REJECT {code, reason}, code "auth", "protocol" or "busy")

The transcript binds the protocol version, the direction, both fresh 32-byte
nonces and both names, so a MAC can be replayed neither on another connection
nor in the other direction. MACs are compared with ``hmac.compare_digest``.
The client sends nothing after AUTH until it has checked ``mac_s``. A client
only connects to addresses it was given (the coordinator's, and the memory
hosts' the coordinator announced), and its MAC goes to whatever listens
there: that is why tokens must be long and random (``generate_token``;
at least ``MIN_TOKEN_BYTES`` characters). The token never leaves the process
and is never logged.

`Handshake` holds the states: bytes in (`receive`), events out (`Send`,
`ClientProved`, `Established`, `Failed`); it never touches a socket, so tests
drive it frame by frame (see ``tests/wire/test_wire_handshake.py``) and
:mod:`aiorl.wire.protocol` only moves its bytes.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import os
import secrets
import stat
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack

from .codec import FIXED, FIXED_SIZE, HANDSHAKE_MAX_HEADER_BYTES, MAGIC, PROTOCOL_VERSION, FrameType
from .errors import AuthError, ProtocolError, ServerBusy, TokenError, WireError
from .names import MAX_PEER_NAME, PEER_NAME_CHARS, is_peer_name, safe_text

__all__ = [
    "TOKEN_ENV",
    "NONCE_BYTES",
    "MIN_TOKEN_BYTES",
    "load_token",
    "generate_token",
    "write_token_file",
    "new_nonce",
    "mac",
    "Handshake",
    "Send",
    "ClientProved",
    "Established",
    "Failed",
    "reject_frame",
]

TOKEN_ENV = "AIORL_TOKEN"
NONCE_BYTES = 32
MAC_BYTES = 32
#: Shortest token accepted: what `generate_token` makes is 64.
MIN_TOKEN_BYTES = 32


def generate_token() -> bytes:
    """A fresh random cluster token: 64 hex characters (256 bits), safe in an env var."""
    return secrets.token_hex(32).encode("ascii")


def write_token_file(path: str | os.PathLike, token: bytes) -> None:
    """Write ``token`` to ``path`` readable by its owner only (0600), creating parents (0700).

    Never writes through a symbolic link: a ``path`` that is one is refused,
    and the token goes into a fresh file (``O_EXCL | O_NOFOLLOW``) that is
    fsynced and renamed over ``path``, so no other file is ever truncated.
    """
    _check_token(token, f"token for {path}")
    path = Path(path)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    if path.is_symlink():
        raise TokenError(f"token file {path} is a symbolic link; refusing to write the token through it")
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        os.fchmod(fd, 0o600)  # whatever the umask
        os.write(fd, token + b"\n")
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        tmp.unlink(missing_ok=True)
        raise
    os.close(fd)
    os.replace(tmp, path)


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
            f"token file {path} has mode {mode:04o}; it must be 0600 (readable by its owner only): chmod 600 {path}"
        )
    return _check_token(path.read_bytes().strip(), f"token file {path}")


def _check_token(token: bytes, where: str) -> bytes:
    if not isinstance(token, bytes):
        raise TypeError(f"{where}: the token must be bytes, got {type(token).__name__}")
    if len(token) < MIN_TOKEN_BYTES:
        raise TokenError(
            f"{where} is {len(token)} characters; a cluster token needs at least {MIN_TOKEN_BYTES} random ones "
            "(make one with: python -c 'import secrets; print(secrets.token_hex(32))')"
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
    transcript = b"".join(
        (
            b"aiorl-handshake\0",
            direction,
            b"\0",
            struct.pack("<BHH", version, len(client), len(server)),
            client_nonce,
            server_nonce,
            client,
            server,
        )
    )
    return hmac.new(token, transcript, hashlib.sha256).digest()


# ---------------------------------------------------------------------- frames


def handshake_frame(ftype: int, meta: dict, version: int = PROTOCOL_VERSION) -> bytes:
    """A meta-only handshake frame."""
    body = msgpack.packb(meta, use_bin_type=True)
    return FIXED.pack(MAGIC, version, ftype, 0, 0, len(body), 0, 0) + body


def reject_frame(code: str, reason: str, version: int = PROTOCOL_VERSION) -> bytes:
    """What a server sends before hanging up on a handshake it refuses."""
    return handshake_frame(FrameType.REJECT, {"code": code, "reason": reason[:200]}, version)


_REJECT_ERRORS = {"auth": AuthError, "busy": ServerBusy}


# ---------------------------------------------------------------------- events


@dataclass(frozen=True, slots=True)
class Send:
    """Write these bytes to the peer."""

    data: bytes


@dataclass(frozen=True, slots=True)
class ClientProved:
    """Server side: the client proved it holds the token. Answer with `accept()` or `refuse()`."""

    peer_name: str


@dataclass(frozen=True, slots=True)
class Established:
    """Both sides proved; ``rest`` are bytes that followed the last handshake frame (already frames)."""

    peer_name: str
    rest: bytes


@dataclass(frozen=True, slots=True)
class Failed:
    """The handshake failed; ``reply`` (possibly empty) goes to the peer before hanging up."""

    error: WireError
    reply: bytes = b""


class State(enum.Enum):
    START = "start"  # client: start() not called yet
    AWAIT_HELLO = "await HELLO"  # server
    AWAIT_CHALLENGE = "await CHALLENGE"  # client
    AWAIT_AUTH = "await AUTH"  # server
    DECIDING = "deciding"  # server: the client proved; accept() or refuse()
    AWAIT_WELCOME = "await WELCOME"  # client
    ESTABLISHED = "established"
    FAILED = "failed"


_EXPECTED = {
    State.AWAIT_HELLO: FrameType.HELLO,
    State.AWAIT_CHALLENGE: FrameType.CHALLENGE,
    State.AWAIT_AUTH: FrameType.AUTH,
    State.AWAIT_WELCOME: FrameType.WELCOME,
}


class Handshake:
    """One side of one handshake: ``Handshake(client=True, token=..., name=...)``.

    Client: ``start()`` gives the HELLO bytes; then feed every received
    chunk to ``receive()`` until it returns `Established` or `Failed`.
    Server: feed ``receive()`` from the first byte; on `ClientProved` call
    ``accept()`` (which returns `Send` and `Established`) or ``refuse()``.
    Any bad input returns `Failed`, after which every call returns nothing.
    """

    def __init__(self, *, client: bool, token: bytes, name: str, version: int = PROTOCOL_VERSION) -> None:
        if not is_peer_name(name):
            raise ValueError(
                f"name {safe_text(name, 80)!r} is not a valid peer name "
                f"(1-{MAX_PEER_NAME} characters of {PEER_NAME_CHARS})"
            )
        self.client = client
        self.name = name
        self.version = version
        self.peer_name: str | None = None
        self.state = State.START if client else State.AWAIT_HELLO
        self._token = token
        self._nonce = new_nonce()
        self._peer_nonce = b""
        self._buffer = bytearray()

    def __repr__(self) -> str:
        side = "client" if self.client else "server"
        return f"<Handshake {side} {self.name} state={self.state.value} peer={self.peer_name}>"

    @property
    def done(self) -> bool:
        return self.state in (State.ESTABLISHED, State.FAILED)

    def start(self) -> bytes:
        """Client: the HELLO to send first."""
        if not self.client or self.state is not State.START:
            raise RuntimeError(f"{self!r}: start() is the client's first call")
        self.state = State.AWAIT_CHALLENGE
        return self._frame(FrameType.HELLO, {"name": self.name, "nonce": self._nonce})

    def receive(self, data: bytes) -> list:
        """Feed bytes from the peer; returns the events they cause, in order."""
        if self.done or self.state is State.START:
            return []
        self._buffer += data
        events: list = []
        try:
            while self.state in _EXPECTED:
                frame = self._next_frame()
                if frame is None:
                    break
                events += self._on_frame(*frame)
        except WireError as error:
            return events + [self._fail(error)]
        if self.state is State.ESTABLISHED:
            events.append(self._established())
        return events

    def accept(self) -> list:
        """Server, after `ClientProved`: welcome the client (with our own proof)."""
        if self.state is not State.DECIDING:
            raise RuntimeError(f"{self!r}: accept() answers ClientProved")
        welcome = self._frame(FrameType.WELCOME, {"mac": self._mac(b"server")})
        self.state = State.ESTABLISHED
        return [Send(welcome), self._established()]

    def refuse(self, code: str, reason: str) -> list:
        """Server, after `ClientProved`: turn the client away (e.g. ``"busy"``)."""
        if self.state is not State.DECIDING:
            raise RuntimeError(f"{self!r}: refuse() answers ClientProved")
        error = _REJECT_ERRORS.get(code, ProtocolError)(f"refused {self.peer_name}: {reason}")
        self.state = State.FAILED
        return [Failed(error, reject_frame(code, reason, self.version))]

    # ------------------------------------------------------------------ internals

    def _frame(self, ftype: int, meta: dict) -> bytes:
        return handshake_frame(ftype, meta, self.version)

    def _next_frame(self) -> tuple[int, dict] | None:
        buf = self._buffer
        if len(buf) < FIXED_SIZE:
            if len(buf) >= len(MAGIC) and buf[: len(MAGIC)] != MAGIC:  # not aiorl (an HTTP probe...): say so now
                raise ProtocolError(f"bad magic {bytes(buf[: len(MAGIC)])!r}: not an aiorl peer")
            return None
        magic, version, ftype, flags, schema_len, meta_len, payload_len, request_id = FIXED.unpack_from(buf)
        if magic != MAGIC:
            raise ProtocolError(f"bad magic {bytes(magic)!r}: not an aiorl peer")
        if version != self.version:
            raise ProtocolError(f"peer speaks protocol {version}, this is {self.version}")
        if flags:
            raise ProtocolError(f"unknown frame flags 0x{flags:04x}")
        header_len = schema_len + meta_len
        if (
            ftype not in FrameType.HANDSHAKE
            or schema_len
            or payload_len
            or request_id
            or header_len > HANDSHAKE_MAX_HEADER_BYTES
        ):
            raise ProtocolError(
                f"expected a handshake frame, got type {ftype} with {header_len} header and {payload_len} payload bytes"
            )
        end = FIXED_SIZE + meta_len
        if len(buf) < end:
            return None
        try:
            meta = msgpack.unpackb(bytes(buf[FIXED_SIZE:end]), raw=False, strict_map_key=True, max_ext_len=0)
        except Exception as exc:  # msgpack raises many kinds
            raise ProtocolError(f"undecodable handshake frame: {type(exc).__name__}") from None
        if type(meta) is not dict:
            raise ProtocolError("handshake frame meta is not a map")
        del buf[:end]
        return ftype, meta

    def _on_frame(self, ftype: int, meta: dict) -> list:
        if ftype == FrameType.REJECT:
            reason = meta.get("reason")
            reason = safe_text(reason) if type(reason) is str else "no reason given"
            error = _REJECT_ERRORS.get(meta.get("code"), ProtocolError)(f"peer refused the connection: {reason}")
            raise error
        expected = _EXPECTED[self.state]
        if ftype != expected:
            raise ProtocolError(f"unexpected handshake frame type {ftype} in state {self.state.value}")
        if self.state is State.AWAIT_HELLO:  # server: the client's name and nonce
            self.peer_name = _peer_name(meta)
            self._peer_nonce = _field(meta, "nonce", NONCE_BYTES)
            self.state = State.AWAIT_AUTH
            return [Send(self._frame(FrameType.CHALLENGE, {"name": self.name, "nonce": self._nonce}))]
        if self.state is State.AWAIT_CHALLENGE:  # client: prove first
            self.peer_name = _peer_name(meta)
            self._peer_nonce = _field(meta, "nonce", NONCE_BYTES)
            self.state = State.AWAIT_WELCOME
            return [Send(self._frame(FrameType.AUTH, {"mac": self._mac(b"client")}))]
        if self.state is State.AWAIT_AUTH:  # server: check the client's proof
            if not hmac.compare_digest(_field(meta, "mac", MAC_BYTES), self._mac(b"client")):
                raise AuthError(
                    f"authentication failed: {self.peer_name} does not hold the cluster token (wrong token?)"
                )
            self.state = State.DECIDING
            return [ClientProved(self.peer_name)]
        # client: the server's proof, checked before anything else is sent
        if not hmac.compare_digest(_field(meta, "mac", MAC_BYTES), self._mac(b"server")):
            raise AuthError(f"server {self.peer_name} could not prove it holds the cluster token (wrong token?)")
        self.state = State.ESTABLISHED
        return []

    def _established(self) -> Established:
        rest, self._buffer = bytes(self._buffer), bytearray()
        return Established(self.peer_name, rest)

    def _fail(self, error: WireError) -> Failed:
        self.state = State.FAILED
        self._buffer = bytearray()
        if self.client:
            return Failed(error)  # a client just hangs up
        code = "auth" if isinstance(error, AuthError) else "protocol"
        reason = "authentication failed (wrong token?)" if code == "auth" else str(error)
        return Failed(error, reject_frame(code, reason, self.version))

    def _mac(self, direction: bytes) -> bytes:
        if self.client:
            nonces, names = (self._nonce, self._peer_nonce), (self.name, self.peer_name)
        else:
            nonces, names = (self._peer_nonce, self._nonce), (self.peer_name, self.name)
        return mac(self._token, direction, self.version, *nonces, *names)


def _peer_name(meta: dict) -> str:
    name = meta.get("name")
    if not is_peer_name(name):
        shown = safe_text(name, 40) if type(name) is str else type(name).__name__
        raise ProtocolError(f"bad peer name {shown!r}: expected 1-{MAX_PEER_NAME} characters of {PEER_NAME_CHARS}")
    return name


def _field(meta: dict, key: str, size: int) -> Any:
    value = meta.get(key)
    if type(value) is not bytes or len(value) != size:
        raise ProtocolError(f"handshake field {key!r} must be {size} bytes")
    return value
