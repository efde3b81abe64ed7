"""How this process's servers listen and its clients connect: TCP, Unix sockets, shared memory.

One value, `Transport`, made by one function, `transport_of`, from the config
(``cluster.unix_sockets``, ``cluster.transport``, ``cluster.shm_ring_bytes``) and the one fact
only the local launcher knows: that it started this process on its own host
(`local_sockets.ENV_ON`). Every ``serve()`` and ``connect()`` of a run takes its transport
arguments from it (`Transport.serve_args`, `Transport.connect_args`), so a new transport is
this module and :mod:`aiorl.wire`.

What it guarantees, as before it was one value:

- TCP always: servers listen on TCP in any case (a Ray role, ``aiorl status HOST:PORT``).
- Unix sockets in a local run with ``cluster.unix_sockets``: servers listen in the run
  directory too, and clients use a peer's socket where it exists on this host. A role placed
  by Ray or started by hand keeps to TCP.
- Shared-memory rings beside those sockets unless ``cluster.transport`` is 'tcp', and only on
  a machine whose store order the rings rely on (`aiorl.config.checks.rings_supported`;
  elsewhere 'auto' keeps to sockets and 'shm' was refused when the config loaded).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from aiorl.config import Config
from aiorl.config.checks import rings_supported
from aiorl.runtime import local_sockets
from aiorl.wire import shm


@dataclass(frozen=True)
class Transport:
    #: Servers listen on Unix sockets in the run directory too, and clients use a peer's socket.
    unix_sockets: bool
    #: Bytes of each shared-memory ring beside those sockets; None: sockets only.
    ring_bytes: int | None = None

    def socket_path(self, run_dir: str | Path, name: str) -> str | None:
        """Where server `name` of this run listens besides TCP; None: TCP only (see
        `local_sockets.path_in` for a run directory too deep for a socket's path)."""
        return local_sockets.path_in(run_dir, name) if self.unix_sockets else None

    def serve_args(self, unix_path: str | None) -> dict:
        """``serve()``'s transport arguments for a server listening on `unix_path` besides TCP."""
        return {
            "unix_path": unix_path,
            "rings": unix_path is not None and self.ring_bytes is not None,
            "ring_bytes": self.ring_bytes or shm.DEFAULT_RING_BYTES,
        }

    def server_args(self, run_dir: str | Path, name: str) -> dict:
        """``serve()``'s transport arguments for server `name` of the run in `run_dir`."""
        return self.serve_args(self.socket_path(run_dir, name))

    def peer_socket(self, path: object) -> str | None:
        """`path` (a peer's Unix socket, as advertised) when this process connects through it:
        Unix sockets on, and the socket is there on this host; else None (TCP)."""
        if not self.unix_sockets or not isinstance(path, str) or not path:
            return None
        return path if os.path.exists(path) else None

    def connect_args(self, unix_path: str | None) -> dict:
        """``connect()``'s transport arguments for a peer whose socket here is `unix_path` (None:
        TCP): its ring listener as well when rings are on and it hands them out."""
        ring = None
        if unix_path is not None and self.ring_bytes is not None:
            ring = shm.ring_path(unix_path)
            ring = ring if os.path.exists(ring) else None
        return {"unix_path": unix_path, "ring_path": ring}


#: The launcher's own connection to its coordinator (exit notices) and ``aiorl status`` of a run
#: directory on this host: the socket read from coordinator.json, never rings (they move no data).
SOCKETS_ONLY = Transport(unix_sockets=True)


def transport_of(cfg: Config, environ=os.environ) -> Transport:
    """This process's transport: Unix sockets when the local launcher started it on its host
    with ``cluster.unix_sockets``; rings beside them unless ``cluster.transport`` is 'tcp' or
    this machine cannot have them (auto or shm: every role of a local run is on this host)."""
    unix = cfg.cluster.unix_sockets and local_sockets.enabled(environ)
    rings = unix and cfg.cluster.transport != "tcp" and rings_supported()
    return Transport(unix_sockets=unix, ring_bytes=cfg.cluster.shm_ring_bytes if rings else None)
