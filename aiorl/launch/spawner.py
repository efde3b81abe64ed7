"""The warm spawner: one process that imports the heavy modules once and forks every role.

A role started as ``python -m aiorl run CONFIG --role ...`` pays its own imports of numpy,
torch, gymnasium and the runtime (1.5-2 s of CPU each on a small machine), then the
launcher's preflight paid them once more, the evaluation worker once more, and every
restart again. The local launcher instead starts this process first; it imports them
(`aiorl.cli.spawner` says what) while the launcher reads the config, and forks on request:
the preflight check, each role, the evaluation worker (for learner 0) and each restart.

Fork safety is the point. Before any fork the spawner has run no torch op (torch starts its
thread pools on first use), made no event loop, opened no network socket and started no
thread; the one thread besides its main one is OpenBLAS's worker pool (numpy's import
starts it), which OpenBLAS itself stops and restarts around a fork (pthread_atfork). Work
that does run torch ops, the preflight's algorithm build, runs in a forked child too, and so does
what every role of the run would compute alike (`Algorithm.prefork`: ES's noise table), into a
memfd the spawner maps before it forks the roles. Nothing on that path imports torch._dynamo
(most of a second of CPU): the learners' optimizers are aiorl's own (`aiorl.algos.lib.optimizers`).

A child sets up what a freshly started role would have: its own session (no terminal
signals), a parent-death signal (the spawner's death; the spawner dies with the launcher),
default signal handlers, stdio on its log, the environment the launcher gives it, a fresh
seed for numpy's legacy global generator (`random` reseeds itself after a fork), and only
its own descriptors. Then it runs exactly what ``python -m aiorl run --role`` runs, and ends
with ``os._exit`` so nothing of the spawner's (atexit handlers, buffers) runs twice.

Roles other than memory 0 are forked at once with it and wait for ``coordinator.json``
themselves (`wait_for_coordinator`), so their start overlaps the coordinator's.

``cluster.warm_spawner: false`` (or ``AIORL_WARM_SPAWNER=0``) starts each role as its own
``python -P -m aiorl`` process instead, as before the spawner existed: for comparison and
for debugging.
"""

from __future__ import annotations

import fcntl
import gc
import json
import mmap
import os
import selectors
import signal
import socket
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from aiorl.io.rundir import Identity, read_json
from aiorl.runtime import local_sockets
from aiorl.runtime.warm_fork import (
    ENV_SPAWNER_FD,
    ForkedProcess,
    SpawnerChannel,
    SpawnerGone,
    receive,
    send,
    seqpacket_pair,
    set_parent_death_signal,
    start_spawner_process,
    switch_from_env,
)

if TYPE_CHECKING:
    import numpy as np

ENTRY_MODULE = "aiorl.cli.spawner"  # the process: preloads, then `serve`
COORDINATOR_POLL_S = 0.01
CLOSE_GRACE_S = 2.0


def enabled(cfg, environ=os.environ) -> bool:
    """Whether this launch forks its roles from a warm spawner (config, overridden by the environment)."""
    switch = switch_from_env(environ)
    return bool(cfg.cluster.warm_spawner) if switch is None else switch


# --------------------------------------------------------------------------- the launcher's side


def start_early(launcher: str | None = None, environ=os.environ) -> WarmSpawner | None:
    """A spawner started before the config is read, so that its imports overlap the launcher's;
    None when the environment turns it off or the command line asks for Ray."""
    if launcher == "ray" or switch_from_env(environ) is False:
        return None
    return WarmSpawner.start()


def for_run(cfg, early: WarmSpawner | None) -> WarmSpawner | None:
    """The spawner this run forks its roles from: `early`, or a new one; None (and `early` ended)
    when the run does not use one (Ray places its roles; ``cluster.warm_spawner: false``)."""
    if cfg.cluster.launcher != "local" or not enabled(cfg):
        if early is not None:
            early.end()
        return None
    return early or WarmSpawner.start()


class WarmSpawner:
    """The launcher's handle: start the spawner process, then check, spawn and signal through it."""

    def __init__(self, channel: SpawnerChannel, proc: subprocess.Popen):
        self.channel = channel
        self.proc = proc

    @classmethod
    def start(cls) -> WarmSpawner:
        return cls(*start_spawner_process(ENTRY_MODULE))

    def ready(
        self,
        algo: str | None = None,
        timeout: float | None = None,
        modules: tuple[str, ...] = (),
        deterministic: bool = False,
    ) -> dict:
        """Wait until its imports are done (`algo`'s module too, and for a `deterministic` run what
        torch's deterministic mode imports); returns what it reports of itself: its pid, its
        threads, and which of `modules` it has imported."""
        message = {"op": "ready", "algo": algo, "modules": list(modules), "deterministic": deterministic}
        return self.channel.request(message, timeout=timeout)

    def check(self, config_path: str | Path, timeout: float | None = None) -> dict:
        """The preflight of a config file, in a forked child: {"mistake": None} or the user's mistake."""
        return self.channel.request({"op": "check", "config": str(config_path)}, timeout=timeout)

    def spawn_role(self, argv: list[str], env: dict[str, str], log_path: Path, wait_coordinator: dict | None):
        """Fork a role running ``aiorl ARGV`` with `env`, its stdio on `log_path`.

        `wait_coordinator` ({"run_dir", "timeout_s"}): the role finds the coordinator's address
        in ``coordinator.json`` itself (it was forked before memory 0 listened)."""
        return self.channel.spawn(
            "role",
            argv,
            env=_env_diff(env),
            log=str(log_path),
            wait_coordinator=wait_coordinator,
            channel=_is_learner0(argv),
        )

    def pump(self, timeout: float) -> None:
        """Wait up to `timeout` s for news of the children (an exit), handling what comes."""
        self.channel.pump(timeout)

    def end(self, timeout: float = CLOSE_GRACE_S + 1.0) -> None:
        """End the spawner and reap it; idempotent. One that forked roles ends what it still has
        (bounded); one that forked none may still be importing and is simply killed."""
        if self.proc.returncode is not None:
            return
        self.channel.close()
        if not self.channel.spawned:
            self.proc.kill()
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _before_fork() -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    # What exists now is shared with the child, copy-on-write: frozen, the child's collections
    # skip it (`aiorl.cli.spawner.preload` says why the spawner collects nothing itself).
    gc.freeze()


def _is_learner0(argv: list[str]) -> bool:
    return "--role" in argv and argv[argv.index("--role") + 1] == "learner" and argv[argv.index("--index") + 1] == "0"


def _env_diff(env: dict[str, str]) -> dict:
    """`env` as a change of the spawner's own environment (it has the launcher's): a few entries."""
    return {
        "set": {k: v for k, v in env.items() if os.environ.get(k) != v},
        "unset": [k for k in os.environ if k not in env],
    }


# --------------------------------------------------------------------------- the spawner's side


def wait_for_coordinator(run_dir: str, timeout_s: float) -> dict | None:
    """The coordinator's address once this launch's memory 0 has written it; None after `timeout_s`."""
    identity = Identity.from_env()
    path = Path(run_dir) / "coordinator.json"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        data = read_json(path)
        if data is not None and identity.owns(data):
            return data
        time.sleep(COORDINATOR_POLL_S)
    return None


class Spawner:
    """The serving loop. `run_child(kind, argv) -> exit code` runs a child's program; `check(path)`
    returns the reply to a preflight; `warm(algo, deterministic)` imports an algorithm's module (and
    what torch's deterministic mode imports);
    `prefork(config_path) -> (algo, arrays) | None` computes what the roles of that config share
    (`Algorithm.prefork`) in a child of its own, while the preflight checks it in another, and
    `adopt(algo, arrays)` keeps them, as shared memory, for the roles forked after."""

    def __init__(
        self,
        sock: socket.socket,
        run_child: Callable,
        check: Callable,
        warm: Callable,
        prefork: Callable | None = None,
        adopt: Callable | None = None,
    ):
        self.launcher = sock
        self.run_child, self.check, self.warm = run_child, check, warm
        self.prefork, self.adopt = prefork, adopt
        self.sel = selectors.DefaultSelector()
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_w, False)
        os.set_blocking(self.wake_r, False)
        self.children: dict[int, socket.socket] = {}  # pid -> the channel to report its exit on
        self.owned: dict[int, list[int]] = {}  # a client's pid -> the pids it asked for (ended with it)
        self.client_socks: dict[int, socket.socket] = {}  # a child's pid -> our end of its channel

    def serve(self) -> None:
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.set_wakeup_fd(self.wake_w)
        self.sel.register(self.launcher, selectors.EVENT_READ)
        self.sel.register(self.wake_r, selectors.EVENT_READ)
        try:
            while True:
                for key, _ in self.sel.select():
                    if key.fileobj == self.wake_r:
                        self._drain_wakeups()
                        self._reap()
                    elif not self._serve_one(key.fileobj):
                        if key.fileobj is self.launcher:
                            return
        finally:
            self._end_children()

    def _drain_wakeups(self) -> None:
        try:
            while os.read(self.wake_r, 512):
                pass
        except BlockingIOError:
            pass

    def _serve_one(self, sock: socket.socket) -> bool:
        try:
            message, fds = receive(sock)
        except (SpawnerGone, ValueError):
            self._drop_client(sock)
            return False
        try:
            reply = self._handle(sock, message, fds)
        except Exception as exc:  # a bad request is the client's error, never the spawner's end
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        finally:
            for fd in fds:
                os.close(fd)
        if reply is not None:
            try:
                send(sock, {"op": "reply", "id": message.get("id"), **reply})
            except SpawnerGone:
                self._drop_client(sock)
        return True

    def _drop_client(self, sock: socket.socket) -> None:
        self.sel.unregister(sock)
        if sock is not self.launcher:
            self.client_socks = {pid: s for pid, s in self.client_socks.items() if s is not sock}
            sock.close()

    def _handle(self, sock: socket.socket, message: dict, fds: list[int]) -> dict | None:
        op = message["op"]
        if op == "ready" and sock is self.launcher:
            if message.get("algo"):
                self.warm(message["algo"], bool(message.get("deterministic")))
            return {
                "pid": os.getpid(),
                "threads": len(os.listdir("/proc/self/task")),
                "imported": [name for name in message.get("modules", ()) if name in sys.modules],
            }
        if op == "check" and sock is self.launcher:
            return self._fork_check(message["config"])
        if op == "spawn":
            kind = message["module"]
            # Roles only for the launcher; learner 0 may ask for its evaluation worker alone.
            allowed = ("role",) if sock is self.launcher else ("eval_worker",)
            if kind not in allowed:
                raise ValueError(f"{kind!r} is not for this client to spawn")
            return {"pid": self._fork(sock, message, fds)}
        if op == "signal":
            pid = int(message["pid"])
            if self.children.get(pid) is sock:  # only its own, only before it was reaped
                signum = int(message["signal"])
                # A kill ends the child's whole process group (its session: `_child` calls
                # setsid), whatever it started itself; other signals are the child's to handle.
                (os.killpg if signum == signal.SIGKILL else os.kill)(pid, signum)
            return None
        raise ValueError(f"unknown request {op!r}")

    def _fork_replying(self, work: Callable[[], object]) -> tuple[int, int]:
        """Fork a child that runs `work()` and writes its result, as JSON, to a pipe; (pid, the
        pipe's read end) for `_read_to_end`. A child that fails writes nothing."""
        r, w = os.pipe()
        _before_fork()
        pid = os.fork()
        if pid == 0:
            gc.enable()
            code = 1
            try:
                os.close(r)
                self._close_inherited(keep=())
                os.write(w, json.dumps(work()).encode())
                code = 0
            except BaseException:
                traceback.print_exc()
            finally:
                exit_child(code)
        os.close(w)
        return pid, r

    def _fork_check(self, config: str) -> dict:
        pid, r = self._fork_replying(lambda: self.check(config))
        shared = self._fork_prefork(config) if self.prefork is not None else None
        data, status = _read_to_end(r, pid)
        if shared is not None:
            self._adopt_prefork(*shared)
        if not data:
            code = os.waitstatus_to_exitcode(status)
            return {"mistake": None, "crashed": f"the preflight check exited with code {code}"}
        return json.loads(data)

    def _fork_prefork(self, config: str) -> tuple[int, int, int] | None:
        """`prefork` in a child that writes its arrays into a memfd; (pid, pipe, memfd) to collect.
        Where there is no memfd (not Linux) it runs here instead: the roles share it all the same."""
        if not hasattr(os, "memfd_create"):
            result = self.prefork(config)
            if result is not None:
                self.adopt(*result)
            return None
        memfd = prefork_memfd()

        def work():
            result = self.prefork(config)
            return None if result is None else {"algo": result[0], "layout": write_arrays(memfd, result[1])}

        return (*self._fork_replying(work), memfd)

    def _adopt_prefork(self, pid: int, r: int, memfd: int) -> None:
        """The prefork child's arrays, mapped read-only; nothing when it found the config refused or
        failed (then each role computes its own, as without the spawner)."""
        data, status = _read_to_end(r, pid)
        try:
            reply = json.loads(data) if data and status == 0 else None
            if reply is not None:
                self.adopt(reply["algo"], map_arrays(memfd, reply["layout"]))
        finally:
            os.close(memfd)

    def _fork(self, client: socket.socket, message: dict, fds: list[int]) -> int:
        ours = channel = None
        if message.get("channel"):
            ours, channel = seqpacket_pair()
        spawner_pid = os.getpid()
        _before_fork()
        pid = os.fork()
        if pid == 0:  # the child: nothing below returns
            gc.enable()
            code = 1
            try:
                if ours is not None:
                    ours.close()
                code = self._child(message, fds, channel, spawner_pid)
            except SystemExit as exc:
                code = _exit_code(exc.code)
            except BaseException:
                traceback.print_exc()
            finally:
                exit_child(code)
        self.children[pid] = client
        if client is not self.launcher:
            self.owned.setdefault(self._client_pid(client), []).append(pid)
        if channel is not None:
            channel.close()
            self.client_socks[pid] = ours
            self.sel.register(ours, selectors.EVENT_READ)
        return pid

    def _client_pid(self, client: socket.socket) -> int:
        return next(pid for pid, sock in self.client_socks.items() if sock is client)

    def _close_inherited(self, keep) -> None:
        """In a child: close every descriptor of the spawner's (its clients' channels, its selector)."""
        signal.set_wakeup_fd(-1)
        self.sel.close()
        for fd in (self.wake_r, self.wake_w):
            os.close(fd)
        for sock in [self.launcher, *self.client_socks.values()]:
            if sock not in keep:
                sock.close()

    def _child(self, message: dict, fds: list[int], channel, spawner_pid: int) -> int:
        os.setsid()
        set_parent_death_signal(signal.SIGTERM)
        if os.getppid() != spawner_pid:  # the spawner died before the signal was set
            return 1
        default_signals()
        self._close_inherited(keep=(channel,))
        _stdio(message, fds)
        env = message.get("env") or {}
        for key in env.get("unset", ()):
            os.environ.pop(key, None)
        os.environ.update(env.get("set", {}))
        if channel is not None:
            os.set_inheritable(channel.fileno(), False)
            os.environ[ENV_SPAWNER_FD] = str(channel.fileno())
        _reseed()
        argv = list(message["argv"])
        wait = message.get("wait_coordinator")
        if wait:
            address = wait_for_coordinator(wait["run_dir"], float(wait["timeout_s"]))
            if address is None:
                print(f"the coordinator did not write coordinator.json within {wait['timeout_s']:g} s", file=sys.stderr)
                return 1
            argv += ["--set", f"cluster.port={int(address['port'])}"]
            unix = address.get("unix")
            if isinstance(unix, str) and local_sockets.enabled():
                os.environ[local_sockets.ENV_COORDINATOR] = unix
        sys.argv = ["aiorl", *argv]  # as the program would see them had it been started for this
        return self.run_child(message["module"], argv)

    def _reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            code = os.waitstatus_to_exitcode(status)
            client = self.children.pop(pid, None)
            if client is not None and client.fileno() != -1:
                try:
                    send(client, {"op": "exited", "pid": pid, "code": code})
                except SpawnerGone:
                    pass
            sock = self.client_socks.get(pid)
            if sock is not None:
                self._drop_client(sock)
            for orphan in self.owned.pop(pid, ()):  # an evaluation worker dies with its learner
                if orphan in self.children:
                    os.kill(orphan, signal.SIGKILL)

    def _end_children(self) -> None:
        """The launcher has gone: end what is left (SIGTERM, then SIGKILL after a grace)."""
        for pid in self.children:
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + CLOSE_GRACE_S
        while self.children and time.monotonic() < deadline:
            self._reap()
            time.sleep(0.01)
        for pid in list(self.children):
            os.kill(pid, signal.SIGKILL)
        while self.children:
            pid, _ = os.waitpid(-1, 0)
            self.children.pop(pid, None)


def exit_child(code: int) -> None:
    """End a forked child: flush what it printed, then `os._exit` (nothing of its parent's, such as
    atexit handlers or buffers, runs twice)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    os._exit(code)


def default_signals() -> None:
    """A forked child's signal handling as a freshly started process has it."""
    for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)


def _read_to_end(r: int, pid: int) -> tuple[bytes, int]:
    """Everything child `pid` writes to pipe `r`, and its wait status once it ended."""
    chunks = []
    while chunk := os.read(r, 65536):
        chunks.append(chunk)
    os.close(r)
    _, status = os.waitpid(pid, 0)
    return b"".join(chunks), status


PREFORK_ALIGN = 64
# Linux's values where fcntl lacks them (memfds are Linux's alone: elsewhere the spawner makes none).
PREFORK_SEALS = (
    getattr(fcntl, "F_SEAL_WRITE", 8)
    | getattr(fcntl, "F_SEAL_SHRINK", 2)
    | getattr(fcntl, "F_SEAL_GROW", 4)
    | getattr(fcntl, "F_SEAL_SEAL", 1)
)


def write_arrays(fd: int, arrays: dict[str, np.ndarray]) -> list[dict]:
    """Copy `arrays` into the file `fd` (a memfd), each at an aligned offset; their layout."""
    import numpy as np

    layout, end = [], 0
    for name, array in arrays.items():
        array = np.ascontiguousarray(array)
        layout.append({"name": name, "offset": end, "shape": list(array.shape), "dtype": array.dtype.str})
        end += -(-array.nbytes // PREFORK_ALIGN) * PREFORK_ALIGN
    if end == 0:
        return layout
    os.ftruncate(fd, end)
    with mmap.mmap(fd, end) as mm:
        for entry, array in zip(layout, arrays.values()):
            view = np.ndarray(entry["shape"], np.dtype(entry["dtype"]), buffer=mm, offset=entry["offset"])
            view[...] = array
            del view
    return layout


def prefork_memfd() -> int:
    """The memfd the prefork child writes its arrays into, made to be sealed (`map_arrays`)."""
    return os.memfd_create("aiorl-prefork", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)


def seal(fd: int) -> None:
    """Seal memfd `fd` as it is: no write, no resize, no seal removed, by any process holding it."""
    fcntl.fcntl(fd, getattr(fcntl, "F_ADD_SEALS", 1033), PREFORK_SEALS)


def map_arrays(fd: int, layout: list[dict]) -> dict[str, np.ndarray]:
    """`write_arrays`'s arrays, as read-only views of one shared mapping of `fd` (it may be closed after).

    The memfd is sealed first: a read-only mapping of a file opened for writing could still be made
    writable (mprotect) by a role that holds it, and the file written or resized through any copy of
    the descriptor; sealed, every role reads the same table the child drew, whatever one of them does."""
    import numpy as np

    seal(fd)
    size = os.fstat(fd).st_size
    if size == 0:  # only empty arrays (a mapping cannot be empty), read-only as the others
        arrays = {entry["name"]: np.empty(entry["shape"], entry["dtype"]) for entry in layout}
        for array in arrays.values():
            array.flags.writeable = False
        return arrays
    mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ)
    arrays = {}
    for entry in layout:
        dtype = np.dtype(entry["dtype"])
        count = int(np.prod(entry["shape"], dtype=np.int64))
        if entry["offset"] + count * dtype.itemsize > size:
            raise ValueError(f"prefork array {entry['name']!r} reaches past the {size}-byte memfd")
        arrays[entry["name"]] = np.frombuffer(mm, dtype, count, entry["offset"]).reshape(entry["shape"])
    return arrays


def _stdio(message: dict, fds: list[int]) -> None:
    """The child's fds 0, 1, 2: the client's pipes (the evaluation worker), or /dev/null and a log."""
    if fds:
        for target, fd in zip((0, 1, 2), fds):
            os.dup2(fd, target)
        for fd in fds:
            if fd > 2:
                os.close(fd)
        return
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    log = os.open(message["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)


def _reseed() -> None:
    """A fresh process would seed numpy's legacy global generator from the OS; a fork copies it."""
    import numpy as np

    np.random.seed()


def _exit_code(code) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def is_forked(proc) -> bool:
    return isinstance(proc, ForkedProcess)
