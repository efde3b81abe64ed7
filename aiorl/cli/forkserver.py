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

A client hands the server its environment (a run's token among it) and its terminal, and the
server forks whatever the client asks for: each side trusts only its own user. The server
refuses to serve on a path whose directory (or an existing socket there) another user owns or
may write to, makes its socket 0600, answers only clients of its own uid (SO_PEERCRED) and
removes the socket when it ends (normally, or on SIGTERM, SIGINT or SIGHUP); the client checks
the same of the socket and of the server (`aiorl.runtime.warm_fork.spawner_from_forkserver`).
"""

from __future__ import annotations

import gc
import os
import selectors
import signal
import socket
import sys
import time
import traceback

from aiorl.algos import available_algorithms
from aiorl.cli import spawner
from aiorl.launch.spawner import default_signals, exit_child
from aiorl.runtime.warm_fork import (
    SpawnerGone,
    forkserver_fingerprint,
    forkserver_path_refusal,
    peer_credentials,
    receive,
    send,
)


def preload() -> None:
    spawner.preload()
    for algo in available_algorithms():
        spawner.warm(algo)
    # What the evaluation workers' exports import (torch.export: most of a second of CPU each).
    import torch._dynamo  # noqa: F401


CLIENT_TIMEOUT_S = 5.0  # a client that connected says what it wants within this, or is dropped
MAX_PENDING = 64  # clients connected and not yet answered; the oldest goes beyond this


def peer_uid(conn: socket.socket) -> int:
    return peer_credentials(conn)[1]


def refusal(message: dict, fds: list[int], fingerprint: dict) -> str | None:
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


class ForkServer:
    """The listening socket and the clients it has accepted but not yet answered.

    Clients are served as their requests come, each within CLIENT_TIMEOUT_S of its connection:
    one that connects and says nothing holds up nobody else. No thread: the server forks."""

    def __init__(self, listener: socket.socket, path: str, fingerprint: dict):
        self.listener = listener
        self.path = path
        self.fingerprint = fingerprint
        self.sel = selectors.DefaultSelector()
        self.sel.register(listener, selectors.EVENT_READ)
        self.pending: dict[socket.socket, float] = {}  # client -> the time by which it must have asked

    def serve_forever(self) -> None:
        while True:
            timeout = max(0.0, min(self.pending.values()) - time.monotonic()) if self.pending else None
            for key, _ in self.sel.select(timeout):
                if key.fileobj is self.listener:
                    self.accept()
                else:
                    self.answer(key.fileobj)
            now = time.monotonic()
            for conn in [c for c, deadline in self.pending.items() if deadline <= now]:
                self.drop(conn)

    def accept(self) -> None:
        conn, _ = self.listener.accept()
        uid = peer_uid(conn)
        if uid != os.getuid():
            say(f"aiorl forkserver {self.path}: refused a client of uid {uid}: it serves uid {os.getuid()} only")
            conn.close()
            return
        if len(self.pending) >= MAX_PENDING:
            self.drop(next(iter(self.pending)))
        self.pending[conn] = time.monotonic() + CLIENT_TIMEOUT_S
        self.sel.register(conn, selectors.EVENT_READ)

    def drop(self, conn: socket.socket) -> None:
        self.sel.unregister(conn)
        del self.pending[conn]
        conn.close()

    def answer(self, conn: socket.socket) -> None:
        self.sel.unregister(conn)
        del self.pending[conn]
        try:
            message, fds = receive(conn)
        except (SpawnerGone, ValueError):
            conn.close()
            return
        why = refusal(message, fds, self.fingerprint)
        reply = {"refused": why} if why is not None else {"pid": self.fork_spawner(conn, message, fds)}
        for fd in fds:
            os.close(fd)
        try:
            send(conn, {"op": "reply", **reply})
        except SpawnerGone:
            pass
        conn.close()

    def fork_spawner(self, conn: socket.socket, message: dict, fds: list[int]) -> int:
        """Fork the spawner that serves `conn`; its pid."""
        sys.stdout.flush()
        sys.stderr.flush()
        gc.freeze()
        pid = os.fork()
        if pid == 0:  # nothing below returns
            code = 1
            try:
                # The listener and the other clients are the server's; the collector stays off,
                # as in a spawner of its own.
                for other in (self.listener, *self.pending):
                    other.close()
                self.sel.close()
                code = become_spawner(conn, message, fds)
            except BaseException:
                traceback.print_exc()
            finally:
                exit_child(code)
        return pid


def say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def bind(path: str) -> socket.socket:
    """The listening socket at `path`, made 0600 from the start; a stale socket of ours that
    nobody listens on any more is replaced. OSError where `path` is taken."""
    if os.path.lexists(path) and forkserver_path_refusal(path) is None:
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            probe.connect(path)
        except ConnectionRefusedError:
            os.unlink(path)  # a server that was SIGKILLed left it
        except OSError:
            pass
        finally:
            probe.close()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    umask = os.umask(0o177)
    try:
        listener.bind(path)
    finally:
        os.umask(umask)
    os.chmod(path, 0o600)
    listener.listen(16)
    return listener


def end_on_signals() -> None:
    """SIGTERM and SIGHUP end the server as SIGINT does: through its finally, which removes the socket."""

    def ended(signum, _frame):
        raise SystemExit(128 + signum)

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, ended)


def serve(path: str, fingerprint: dict) -> None:
    """Serve on `path` until a signal ends the server; the socket file goes with it."""
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps the spawners it forks
    end_on_signals()
    listener = bind(path)
    ours = os.stat(path)
    try:
        ForkServer(listener, path, fingerprint).serve_forever()
    finally:
        listener.close()
        remove_socket(path, ours)


def remove_socket(path: str, ours: os.stat_result) -> None:
    """Remove `path` if it is still the socket this server bound (not one bound there since)."""
    try:
        st = os.lstat(path)
        if (st.st_dev, st.st_ino) == (ours.st_dev, ours.st_ino):
            os.unlink(path)
    except OSError:
        pass


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -P -m aiorl.cli.forkserver SOCKET_PATH", file=sys.stderr)
        return 2
    why = forkserver_path_refusal(argv[0], bound=os.path.lexists(argv[0]))
    if why is not None:
        say(f"aiorl forkserver: refusing to serve on {argv[0]}: {why}")
        return 2
    fingerprint = forkserver_fingerprint()  # what the imports saw (torch sets variables of its own)
    preload()
    try:
        serve(argv[0], fingerprint)
    except SystemExit as ended:  # a signal (end_on_signals)
        return ended.code
    except KeyboardInterrupt:
        return 130
    except OSError as exc:
        say(f"aiorl forkserver: cannot serve on {argv[0]}: {exc.strerror or exc}")
        return 2
    return 0


if __name__ == "__main__":
    exit_child(main())  # as the spawner: nothing to tear down
