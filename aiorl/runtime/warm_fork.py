"""Talking to the warm spawner (`aiorl.launch.spawner`): the channel and the handle of a forked process.

The spawner is one process that imported numpy, torch, gymnasium and the runtime once and
forks every role, the evaluation worker and every restart of a local run on request. Its
clients are the launcher and learner 0 (which asks for its evaluation worker); each talks to
it over its own ``AF_UNIX`` ``SOCK_SEQPACKET`` socket, one JSON object per packet, with file
descriptors beside it (``SCM_RIGHTS``) where a child's stdio comes from the client. No
listening socket exists: the launcher's end is a socketpair made before the spawner started,
learner 0's one the spawner made before forking it (its number in ``AIORL_SPAWNER_FD``).

A child of the spawner is not its client's child, so the client cannot ``waitpid`` it: the
spawner, its parent, reaps it at once (SIGCHLD) and sends ``{"op": "exited", "pid", "code"}``
to the client that asked for it; `ForkedProcess` turns those into the calls of a
``subprocess.Popen`` (``poll``, ``wait``, ``send_signal``, ``kill``), so the launcher's
supervision is the same code for both process models. Signals go through the spawner too:
it signals only a child it has not reaped, so a pid is never reused under a signal.
"""

from __future__ import annotations

import ctypes
import json
import os
import select
import selectors
import signal
import socket
import stat
import struct
import subprocess
import sys
import threading
import time

ENV_SPAWNER_FD = "AIORL_SPAWNER_FD"
MAX_PACKET = 1 << 20  # a request holds an argv and an environment diff: far below this
MAX_FDS = 4


class SpawnerGone(RuntimeError):
    """The spawner closed its end: it died, or is ending (its clients end with it)."""


def send(sock: socket.socket, message: dict, fds: list[int] = ()) -> None:
    data = json.dumps(message).encode()
    if len(data) > MAX_PACKET:
        raise ValueError(f"spawner message of {len(data)} bytes, over {MAX_PACKET}")
    try:
        socket.send_fds(sock, [data], list(fds)) if fds else sock.send(data)
    except (BrokenPipeError, ConnectionResetError):
        raise SpawnerGone("the warm spawner has gone") from None


def receive(sock: socket.socket) -> tuple[dict, list[int]]:
    """One message and the descriptors that came with it; SpawnerGone at the end of the stream."""
    try:
        data, fds, _flags, _addr = socket.recv_fds(sock, MAX_PACKET, MAX_FDS)
    except ConnectionResetError:
        data, fds = b"", []
    if not data:
        for fd in fds:
            os.close(fd)
        raise SpawnerGone("the warm spawner has gone")
    message = json.loads(data)
    if not isinstance(message, dict) or not isinstance(message.get("op"), str):
        for fd in fds:
            os.close(fd)
        raise ValueError(f"malformed spawner message: {data[:200]!r}")
    return message, fds


def seqpacket_pair() -> tuple[socket.socket, socket.socket]:
    return socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)


class SpawnerChannel:
    """A client's end: requests with replies, and the exits of the children it asked for.

    Thread-safe: learner 0 asks from its evaluation thread and polls from others.
    """

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.lock = threading.RLock()
        self.exits: dict[int, int] = {}  # pid -> exit code (negative: killed by that signal)
        self.replies: dict[int, dict] = {}
        self.next_id = 0
        self.gone = False
        self.spawned = 0

    @classmethod
    def from_env(cls, environ=os.environ) -> SpawnerChannel | None:
        """Learner 0's channel, when the spawner forked it with one."""
        fd = environ.get(ENV_SPAWNER_FD)
        if not fd:
            return None
        return cls(socket.socket(fileno=int(fd)))

    def _handle(self, message: dict) -> None:
        if message["op"] == "exited":
            self.exits[int(message["pid"])] = int(message["code"])
        elif "id" in message:
            self.replies[int(message["id"])] = message

    def pump(self, timeout: float | None) -> bool:
        """Read what the spawner sent, waiting up to `timeout` s for the first message; True if any came."""
        with self.lock:
            if self.gone:
                if timeout:
                    time.sleep(timeout)
                return False
            got = False
            with selectors.DefaultSelector() as sel:
                sel.register(self.sock, selectors.EVENT_READ)
                wait = timeout
                while sel.select(wait):
                    try:
                        message, fds = receive(self.sock)
                    except SpawnerGone:
                        self.gone = True
                        break
                    for fd in fds:
                        os.close(fd)
                    self._handle(message)
                    got, wait = True, 0
            return got

    def request(self, message: dict, fds: list[int] = (), timeout: float | None = None) -> dict:
        """Send `message` and return the spawner's reply to it (exits that come meanwhile are kept)."""
        with self.lock:
            self.next_id += 1
            rid = self.next_id
            send(self.sock, {**message, "id": rid}, fds)
            deadline = None if timeout is None else time.monotonic() + timeout
            while rid not in self.replies:
                if self.gone:
                    raise SpawnerGone("the warm spawner has gone")
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise TimeoutError(f"the warm spawner did not answer {message['op']!r} within {timeout:g} s")
                self.pump(left)
            reply = self.replies.pop(rid)
        if reply.get("error"):
            raise RuntimeError(f"warm spawner: {reply['error']}")
        return reply

    def spawn(self, module: str, argv: list[str], **options) -> ForkedProcess:
        fds = options.pop("fds", ())
        self.spawned += 1  # counted before the reply: a fork may have happened even if the reply is lost
        reply = self.request({"op": "spawn", "module": module, "argv": argv, **options}, fds)
        return ForkedProcess(self, int(reply["pid"]))

    def signal(self, pid: int, signum: int) -> None:
        with self.lock:
            if pid in self.exits or self.gone:
                return
            send(self.sock, {"op": "signal", "pid": pid, "signal": int(signum)})

    def close(self) -> None:
        with self.lock:
            self.gone = True
            self.sock.close()


class ForkedProcess:
    """A child of the spawner, seen through the channel with the calls the launcher makes of a Popen."""

    def __init__(self, channel: SpawnerChannel, pid: int):
        self.channel = channel
        self.pid = pid

    def __repr__(self) -> str:
        return f"<ForkedProcess pid={self.pid} returncode={self.returncode}>"

    @property
    def returncode(self) -> int | None:
        return self.channel.exits.get(self.pid)

    def poll(self) -> int | None:
        if self.returncode is None:
            self.channel.pump(0)
            if self.channel.gone and not _alive(self.pid):
                # The spawner died (its children got their parent-death signal) and nobody can
                # reap this one for us: it is gone, and counted as killed.
                self.channel.exits[self.pid] = -signal.SIGKILL
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout)
            step = left
            if self.channel.gone:  # no exit report will wake the wait: look again shortly
                step = 0.05 if left is None else min(left, 0.05)
            self.channel.pump(step)
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if self.channel.gone:
            if _alive(self.pid):
                os.kill(self.pid, signum)
            return
        self.channel.signal(self.pid, signum)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


PR_SET_PDEATHSIG = 1
ENV_SWITCH = "AIORL_WARM_SPAWNER"  # 0/false/no/off: each role a process of its own


def switch_from_env(environ=os.environ) -> bool | None:
    """The environment's word on the warm spawner (it overrides ``cluster.warm_spawner``); None: unset."""
    value = environ.get(ENV_SWITCH, "").strip().lower()
    if not value:
        return None
    return value not in ("0", "false", "no", "off")


def set_parent_death_signal(signum: int) -> None:
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signum)


def start_spawner_process(module: str) -> tuple[SpawnerChannel, subprocess.Popen | ForkedSpawner]:
    """Start ``python -P -m MODULE FD``, the spawner, with our end of its channel, or have the fork
    server named by ``AIORL_FORKSERVER`` fork one ready. Here, with the standard library only, so
    that `aiorl run` starts it before it imports anything else (`aiorl.cli.entry`)."""
    path = os.environ.get(ENV_FORKSERVER)
    forked = spawner_from_forkserver(path) if path else None
    if forked is not None:
        return forked
    ours, theirs = seqpacket_pair()
    proc = subprocess.Popen(
        [sys.executable, "-P", "-m", module, str(theirs.fileno())],
        stdin=subprocess.DEVNULL,
        pass_fds=[theirs.fileno()],
        start_new_session=True,  # Ctrl-C is the launcher's to forward, not the terminal's to send
        preexec_fn=lambda: set_parent_death_signal(signal.SIGTERM),
    )
    theirs.close()
    return SpawnerChannel(ours), proc


# --------------------------------------------------------------------------- the fork server's clients

ENV_FORKSERVER = "AIORL_FORKSERVER"  # the Unix socket of a fork server (`aiorl.cli.forkserver`)
FORKSERVER_TIMEOUT_S = 10.0
# Variables read while numpy, torch and their libraries load (threads, allocators, paths): a fork
# server that loaded them under other values cannot stand in for a fresh spawner.
IMPORT_TIME_PREFIXES = (
    "PYTHON",
    "LD_",
    "OMP_",
    "MKL_",
    "OPENBLAS_",
    "GOTO",
    "KMP_",
    "TORCH",
    "CUDA",
    "NUMEXPR",
    "NPY_",
)


def forkserver_fingerprint(environ=os.environ) -> dict:
    """What a forked spawner must share with a fresh one: the interpreter, the import-time
    environment and aiorl's sources (the newest modification among them)."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    newest = 0
    for root, dirs, files in os.walk(package):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for name in files:
            if name.endswith((".py", ".so")):
                newest = max(newest, os.stat(os.path.join(root, name)).st_mtime_ns)
    return {
        "python": [sys.executable, sys.version],
        "environment": {k: v for k, v in sorted(environ.items()) if k.startswith(IMPORT_TIME_PREFIXES)},
        "sources": [package, newest],
    }


def peer_credentials(sock: socket.socket) -> tuple[int, int, int]:
    """The pid, uid and gid of the process at the other end of a connected Unix socket (SO_PEERCRED)."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)


def forkserver_path_refusal(path: str, bound: bool = True) -> str | None:
    """Why the fork server's socket `path` cannot be trusted, or None: the socket (when `bound`)
    and the directory it is in must be this user's (the directory may be root's) and writable by
    no group or other user. Another user who owns either could stand in for the server, or
    connect to it, and a fork server's client hands it its environment (the run's token) and its
    terminal."""
    uid = os.getuid()
    where = os.path.dirname(os.path.abspath(path))
    checks = [(where, "its directory", (uid, 0))]
    if bound:
        checks.insert(0, (path, "the socket", (uid,)))
    for name, what, owners in checks:
        try:
            st = os.lstat(name) if name == path else os.stat(name)  # the directory itself, not a link to it
        except OSError as exc:
            return f"cannot read {what} ({exc.strerror})"
        if name == path and not stat.S_ISSOCK(st.st_mode):
            return "not a socket"
        if st.st_uid not in owners:
            return f"{what} belongs to uid {st.st_uid}, not to this user (uid {uid})"
        if st.st_mode & 0o022:
            return f"{what} has mode {stat.S_IMODE(st.st_mode):04o}: group or others may write to it"
    return None


def spawner_from_forkserver(path: str) -> tuple[SpawnerChannel, ForkedSpawner] | None:
    """A spawner forked for this process by the fork server at `path`, serving our end of the
    connection; None where there is none, it refuses (another interpreter, environment or
    sources) or this system has no pidfd: the caller then starts a spawner of its own.

    Nothing is sent to a server this user does not own (the socket file's owner and mode, then
    the connected peer's uid): another user's socket there is refused in one line on stderr."""
    if not hasattr(os, "pidfd_open") or not os.path.lexists(path):
        return None
    why = forkserver_path_refusal(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        if why is None:
            sock.settimeout(FORKSERVER_TIMEOUT_S)
            sock.connect(path)
            server_pid, server_uid, _ = peer_credentials(sock)
            if server_uid != os.getuid():
                why = f"its server runs as uid {server_uid}, not as this user (uid {os.getuid()})"
        if why is not None:
            print(f"aiorl: not using the fork server {path}: {why}; starting a spawner of its own", file=sys.stderr)
            sock.close()
            return None
        return _ask_forkserver(sock, server_pid)
    except (OSError, ValueError, SpawnerGone):
        sock.close()
        return None


def _ask_forkserver(sock: socket.socket, server_pid: int) -> tuple[SpawnerChannel, ForkedSpawner] | None:
    umask = os.umask(0o22)
    os.umask(umask)
    request = {
        "op": "spawner",
        "env": dict(os.environ),
        "cwd": os.getcwd(),
        "umask": umask,
        "fingerprint": forkserver_fingerprint(),
    }
    send(sock, request, [sys.stdout.fileno(), sys.stderr.fileno()])
    reply, fds = receive(sock)
    for fd in fds:
        os.close(fd)
    sock.settimeout(None)
    if type(reply.get("pid")) is not int:
        sock.close()
        return None
    forked = ForkedSpawner(reply["pid"])
    if _parent_of(forked.pid) != server_pid:  # the server's own child, or no process we signal
        forked.close()
        sock.close()
        return None
    return SpawnerChannel(sock), forked


def _parent_of(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


class ForkedSpawner:
    """A spawner the fork server forked: not our child, so its end is watched through a pidfd and
    its exit code is the fork server's (0 here, or -SIGKILL once we killed it). The calls of a
    ``subprocess.Popen`` that `aiorl.launch.spawner.WarmSpawner` makes."""

    def __init__(self, pid: int):
        self.pid = pid
        self.returncode: int | None = None
        self._fd = os.pidfd_open(pid)
        self._killed = False

    def __repr__(self) -> str:
        return f"<ForkedSpawner pid={self.pid} returncode={self.returncode}>"

    def _ended(self) -> None:
        self.returncode = -signal.SIGKILL if self._killed else 0
        self.close()

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def poll(self) -> int | None:
        if self.returncode is None and select.select([self._fd], [], [], 0)[0]:
            self._ended()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            if not select.select([self._fd], [], [], timeout)[0]:
                raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout)
            self._ended()
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            signal.pidfd_send_signal(self._fd, signum)

    def kill(self) -> None:
        self._killed = True
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)
