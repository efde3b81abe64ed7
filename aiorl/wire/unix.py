"""Unix sockets: the path limit, a stale socket's removal, and who the peer is.

A local run's servers also listen on a Unix socket in the run directory (0700), so a role on
the same host reaches them without a TCP port any local user could connect to; the kernel
tells the server the peer's uid (``SO_PEERCRED``), and a peer of another uid (root reaching
past the directory's mode, or a directory whose mode was widened) is refused before the
handshake. It also tells the peer's pid, which the coordinator checks where only one process
may send a message (the local launcher's exit notices).
"""

from __future__ import annotations

import os
import socket
import stat
import struct

#: Bytes of ``sun_path`` a path may take (108 with the closing NUL on Linux).
MAX_UNIX_PATH = 107
_UCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


def fits(path: str) -> bool:
    """Whether `path` can name a Unix socket (``bind`` fails past ``MAX_UNIX_PATH`` bytes)."""
    return len(os.fsencode(path)) <= MAX_UNIX_PATH


def is_unix(sock) -> bool:
    return sock is not None and getattr(sock, "family", None) == socket.AF_UNIX


def _peer_credentials(sock) -> tuple[int, int, int] | None:
    try:
        return _UCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))
    except (OSError, AttributeError, struct.error):
        return None


def peer_uid(sock) -> int | None:
    """The uid of the process at the other end of Unix socket `sock` (None where the kernel
    cannot say: then the caller refuses, it does not trust)."""
    credentials = _peer_credentials(sock)
    return None if credentials is None else credentials[1]


def peer_pid(sock) -> int | None:
    """The pid of the process that connected Unix socket `sock` (the kernel records it at
    connect time: a peer cannot claim another's), None where the kernel cannot say (TCP)."""
    credentials = _peer_credentials(sock)
    return None if credentials is None or credentials[0] <= 0 else credentials[0]


def check_peer(sock, expected_uid: int) -> str | None:
    """None when the peer of Unix socket `sock` runs as `expected_uid`, else why it is refused."""
    uid = peer_uid(sock)
    if uid == expected_uid:
        return None
    who = "unknown" if uid is None else str(uid)
    return f"peer uid {who} is not this server's uid {expected_uid}"


def remove_stale(path: str) -> None:
    """Remove a socket left at `path` by an earlier process (a restart binds where it did);
    anything that is not a socket is left alone, and bind then fails on it."""
    try:
        if stat.S_ISSOCK(os.lstat(path).st_mode):
            os.unlink(path)
    except FileNotFoundError:
        pass
