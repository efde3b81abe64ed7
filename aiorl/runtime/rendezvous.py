"""The torch.distributed rendezvous of data-parallel learners.

Exposure: torch's TCPStore (the rendezvous) and gloo's connections between
learners have no authentication and no encryption; they are outside the
cluster token and TLS. Anyone who can reach the learners' address while a
run with ``cluster.learners > 1`` is on can join the store or disturb the
collective. aiorl therefore binds both to one address, the learners'
advertised one (``cluster.advertise_host``, else the coordinator's host:
127.0.0.1 for local runs), never to every interface, and keep that address on
a network only the cluster can reach.

Learner 0 binds and listens on the store's socket before it registers and
hands that very socket to the TCPStore (no bind, close, rebind race with
another process); its ``tcp://host:port`` goes to the coordinator with the
registration and to the other learners with the start. Gloo's connections
go over the interface holding that address (``GLOO_SOCKET_IFNAME``).
"""

from __future__ import annotations

import logging
import os
import socket
from datetime import timedelta
from urllib.parse import urlsplit

from aiorl.wire.connection import is_loopback

log = logging.getLogger("aiorl.rendezvous")

_listening: dict[str, socket.socket] = {}  # tcp://host:port -> bound socket, in learner 0's process


def listen(host: str, port: int = 0) -> str:
    """Bind and listen on ``host:port`` (0: a free port) for the store; returns its ``tcp://`` address."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    bound = sock.getsockname()[1]
    if not is_loopback(host):
        log.warning(
            "the learners' torch.distributed rendezvous listens on %s:%d, unauthenticated and "
            "unencrypted: keep that network to the cluster",
            host,
            bound,
        )
    url = f"tcp://[{host}]:{bound}" if family == socket.AF_INET6 else f"tcp://{host}:{bound}"
    _listening[url] = sock
    return url


def _split(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    if parts.scheme != "tcp" or not parts.hostname or not parts.port:
        raise ValueError(f"rendezvous {url!r}: expected tcp://host:port")
    return parts.hostname, parts.port


def interface_of(host: str) -> str | None:
    """The network interface holding address `host`, if any (for gloo)."""
    import psutil

    try:
        address = socket.getaddrinfo(host, None)[0][4][0]
    except OSError:
        return None
    for name, addresses in psutil.net_if_addrs().items():
        if any(a.address.split("%")[0] == address for a in addresses):
            return name
    return None


def init_process_group(backend: str, url: str, rank: int, world: int, timeout_s: float) -> None:
    """Join the learners' process group through the store at `url` (rank 0 serves it)."""
    import torch.distributed as dist

    host, port = _split(url)
    timeout = timedelta(seconds=timeout_s)
    if rank == 0:
        sock = _listening.pop(url, None)
        if sock is None:  # not bound by this process's role (a direct caller): bind it now, on `host` only
            sock = _listening.pop(listen(host, port))
        store = dist.TCPStore(host, port, world, True, timeout, master_listen_fd=sock.detach())
    else:
        store = dist.TCPStore(host, port, world, False, timeout)
    if backend == "gloo" and "GLOO_SOCKET_IFNAME" not in os.environ:
        interface = interface_of(host)
        if interface is not None:
            os.environ["GLOO_SOCKET_IFNAME"] = interface
        else:
            log.warning("no network interface holds the rendezvous address %s: gloo picks its own", host)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=timeout)
