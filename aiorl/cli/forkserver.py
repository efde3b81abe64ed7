"""The fork server: ``python -P -m aiorl.cli.forkserver PATH``, a warm spawner made once and forked
for every local ``aiorl run`` that names it (``AIORL_FORKSERVER=PATH``).

It imports what the warm spawner imports (`aiorl.cli.spawner.preload`), every algorithm's module
and what the evaluation workers' exports need (torch._dynamo, which also brings what a
``run.deterministic`` run needs), then listens on the Unix socket PATH. For each launcher
that connects it forks a spawner that serves that launcher's connection: the run starts with
nothing left to import (a spawner of its own spends 1.5 s of CPU on its imports on a small
machine). The test suite starts one per worker (tests/conftest.py), where most of a short cluster
test's CPU went to its spawner's imports.

It forks only for a client of its own user whose interpreter, import-time environment and aiorl
sources are those it loaded (`aiorl.runtime.warm_fork.forkserver_fingerprint`): any other client
starts its own spawner, as without it. The forked spawner takes the client's environment, working
directory, umask, stdout and stderr and a session of its own; from then on it is the warm spawner
of `aiorl.launch.spawner`, and ends its roles when its launcher goes. Like the spawner, the fork
server runs no torch op and starts no thread before it forks.
"""

from __future__ import annotations

import gc
import os
import signal
import socket
import struct
import sys
import traceback

from aiorl.algos import available_algorithms
from aiorl.cli import spawner
from aiorl.launch.spawner import default_signals, exit_child
from aiorl.runtime.warm_fork import SpawnerGone, forkserver_fingerprint, receive, send


def preload() -> None:
    spawner.preload()
    for algo in available_algorithms():
        spawner.warm(algo)
    # What the evaluation workers' exports import (torch.export: most of a second of CPU each).
    import torch._dynamo  # noqa: F401


def peer_uid(conn: socket.socket) -> int:
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)[2]


def refusal(conn: socket.socket, message: dict, fds: list[int], fingerprint: dict) -> str | None:
    if peer_uid(conn) != os.getuid():
        return "another user"
    if message.get("op") != "spawner" or len(fds) != 2:
        return "not a request for a spawner"
    if message.get("fingerprint") != fingerprint:
        return "another interpreter, import-time environment or aiorl sources"
    return None


def become_spawner(conn: socket.socket, message: dict, fds: list[int]) -> int:
    """In the forked child: take the client's process state, then serve it as its spawner."""
    os.setsid()
    default_signals()
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    for target, fd in zip((1, 2), fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(message["cwd"])
    os.umask(int(message["umask"]))
    os.environ.clear()
    os.environ.update(message["env"])
    sys.argv = [sys.argv[0]]
    spawner.serve(conn)
    return 0


def serve(path: str, fingerprint: dict) -> None:
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps the spawners it forks
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(path)
    os.chmod(path, 0o600)
    listener.listen(16)
    while True:
        conn, _ = listener.accept()
        try:
            message, fds = receive(conn)
        except (SpawnerGone, ValueError):
            conn.close()
            continue
        why = refusal(conn, message, fds, fingerprint)
        reply = {"refused": why} if why is not None else {"pid": fork_spawner(listener, conn, message, fds)}
        for fd in fds:
            os.close(fd)
        try:
            send(conn, {"op": "reply", **reply})
        except SpawnerGone:
            pass
        conn.close()


def fork_spawner(listener: socket.socket, conn: socket.socket, message: dict, fds: list[int]) -> int:
    """Fork the spawner that serves `conn`; its pid."""
    sys.stdout.flush()
    sys.stderr.flush()
    gc.freeze()
    pid = os.fork()
    if pid == 0:  # nothing below returns
        code = 1
        try:
            listener.close()  # the collector stays off, as in a spawner of its own
            code = become_spawner(conn, message, fds)
        except BaseException:
            traceback.print_exc()
        finally:
            exit_child(code)
    return pid


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -P -m aiorl.cli.forkserver SOCKET_PATH", file=sys.stderr)
        return 2
    fingerprint = forkserver_fingerprint()  # what the imports saw (torch sets variables of its own)
    preload()
    serve(argv[0], fingerprint)
    return 0


if __name__ == "__main__":
    exit_child(main())  # as the spawner: nothing to tear down
