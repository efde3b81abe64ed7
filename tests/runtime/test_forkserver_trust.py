"""Who the fork server and its clients trust (`aiorl.cli.forkserver`, `aiorl.runtime.warm_fork`).

A client hands the fork server its environment (the run's token among it) and its terminal, and
the server forks what a client asks for: the client sends nothing to a socket another user owns,
may write to, or serves from another uid; the server serves on no such path, answers only its own
uid, lets no silent client hold up the others, and removes its socket when it ends. The "another
user" cases run as root with a socket or directory given to nobody, or under a patched uid. The
servers here skip the preload (torch and the algorithms): what is checked is who talks to whom.
"""

from __future__ import annotations

import os
import select
import signal
import socket
import subprocess
import sys
import threading

import pytest
from cluster_helpers import wait_for

from aiorl.cli import forkserver
from aiorl.runtime import warm_fork
from aiorl.runtime.warm_fork import receive, send, spawner_from_forkserver

NOBODY = 65534
as_root = pytest.mark.skipif(os.getuid() != 0, reason="giving a file to another user needs root")


def listening(path, mode: int = 0o600) -> socket.socket:
    """A stand-in server at `path`: it listens and never accepts on its own."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    sock.bind(str(path))
    os.chmod(path, mode)
    sock.listen(4)
    sock.setblocking(False)
    return sock


def nobody_connected(listener: socket.socket) -> bool:
    try:
        listener.accept()[0].close()
    except BlockingIOError:
        return True
    return False


def one_refusal(capfd, path, why: str) -> None:
    err = capfd.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert str(path) in err[0] and why in err[0], err


@pytest.fixture
def private(tmp_path):
    where = tmp_path / "fs"
    where.mkdir(mode=0o700)
    return where


def test_the_client_sends_nothing_to_a_socket_of_another_uid(private, capfd, monkeypatch):
    path = private / "sock"
    listener = listening(path)
    other = os.getuid() + 1
    monkeypatch.setattr(os, "getuid", lambda: other)  # the socket is now another user's
    assert spawner_from_forkserver(str(path)) is None
    monkeypatch.undo()
    assert nobody_connected(listener)
    one_refusal(capfd, path, "the socket belongs to uid")


@as_root
def test_the_client_sends_nothing_to_a_socket_given_to_nobody(private, capfd):
    path = private / "sock"
    listener = listening(path)
    os.chown(path, NOBODY, NOBODY)
    assert spawner_from_forkserver(str(path)) is None
    assert nobody_connected(listener)
    one_refusal(capfd, path, f"the socket belongs to uid {NOBODY}")


@as_root
def test_the_client_sends_nothing_through_a_directory_of_another_uid(private, capfd):
    listener = listening(private / "sock")
    os.chown(private, NOBODY, NOBODY)
    assert spawner_from_forkserver(str(private / "sock")) is None
    assert nobody_connected(listener)
    one_refusal(capfd, private / "sock", f"its directory belongs to uid {NOBODY}")


@pytest.mark.parametrize("wide", ["socket", "directory"])
def test_the_client_sends_nothing_to_a_socket_others_may_write_to(private, capfd, wide):
    path = private / "sock"
    listener = listening(path, 0o666 if wide == "socket" else 0o600)
    if wide == "directory":
        os.chmod(private, 0o777)
    assert spawner_from_forkserver(str(path)) is None
    assert nobody_connected(listener)
    one_refusal(capfd, path, "mode 0666" if wide == "socket" else "its directory has mode 0777")


def test_the_client_sends_nothing_to_a_server_running_as_another_uid(private, capfd, monkeypatch):
    path = private / "sock"
    listener = listening(path)
    real = warm_fork.peer_credentials
    monkeypatch.setattr(warm_fork, "peer_credentials", lambda s: (real(s)[0], os.getuid() + 1, 0))
    assert spawner_from_forkserver(str(path)) is None
    listener.setblocking(True)
    conn, _ = listener.accept()  # it connected, to ask the kernel who listens, and closed at once
    assert conn.recv(1 << 16) == b""  # having sent nothing
    one_refusal(capfd, path, f"its server runs as uid {os.getuid() + 1}")


def test_the_client_never_takes_a_pid_that_is_not_the_servers_child(private, capfd):
    # A server that answers with a process it did not fork (pid 1 here) would have the launcher
    # signal that process: the client refuses the answer and starts a spawner of its own.
    path = private / "sock"
    listener = listening(path)
    listener.setblocking(True)

    def answer_with_pid_1():
        conn, _ = listener.accept()
        _, fds = receive(conn)
        for fd in fds:
            os.close(fd)
        send(conn, {"op": "reply", "pid": 1})
        conn.recv(1)  # until the client closes
        conn.close()

    server = threading.Thread(target=answer_with_pid_1, daemon=True)
    server.start()
    assert spawner_from_forkserver(str(path)) is None
    server.join(30)
    assert not server.is_alive()


# --------------------------------------------------------------------------- the server


def start_server(path, client_timeout_s: float = 600.0) -> subprocess.Popen:
    script = (
        "import sys\n"
        "from aiorl.cli import forkserver as f\n"
        "f.preload = lambda: None\n"
        f"f.CLIENT_TIMEOUT_S = {client_timeout_s!r}\n"
        f"sys.exit(f.main([{str(path)!r}]))\n"
    )
    return subprocess.Popen(
        [sys.executable, "-P", "-c", script], stdin=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )


def connected(path) -> socket.socket:
    def attempt():
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            sock.connect(str(path))
            return sock
        except OSError:
            sock.close()
            return None

    return wait_for(attempt, 60, f"the fork server at {path}")


@pytest.fixture
def served(private):
    started = []

    def start(**kwargs):
        proc = start_server(private / "sock", **kwargs)
        started.append(proc)
        connected(private / "sock").close()
        return proc

    yield start
    for proc in started:
        proc.kill()
        proc.wait()
        proc.stderr.close()


def refused_to_serve(path) -> list[str]:
    """The server's stderr lines, once it ended with exit 2 (in a process of its own: a server that
    did not refuse would serve for ever)."""
    proc = start_server(path)
    try:
        assert proc.wait(60) == 2
        return proc.stderr.read().strip().splitlines()
    finally:
        proc.kill()
        proc.wait()
        proc.stderr.close()


@pytest.mark.parametrize("wide", ["directory", "existing socket"])
def test_the_server_refuses_a_path_others_may_write_to(private, wide):
    path = private / "sock"
    if wide == "directory":
        os.chmod(private, 0o777)
    else:
        listening(path, 0o666)
    err = refused_to_serve(path)
    assert len(err) == 1 and str(path) in err[0] and "mode 0" in err[0], err


@as_root
@pytest.mark.parametrize("theirs", ["directory", "existing socket"])
def test_the_server_refuses_a_path_of_another_uid(private, theirs):
    path = private / "sock"
    if theirs == "directory":
        os.chown(private, NOBODY, NOBODY)
    else:
        listening(path)
        os.chown(path, NOBODY, NOBODY)
    err = refused_to_serve(path)
    assert len(err) == 1 and str(path) in err[0] and f"belongs to uid {NOBODY}" in err[0], err


def test_the_server_answers_no_client_of_another_uid(private, capsys, monkeypatch):
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(str(private / "sock"))
    listener.listen(4)
    server = forkserver.ForkServer(listener, str(private / "sock"), {})
    client = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    client.connect(str(private / "sock"))
    monkeypatch.setattr(forkserver, "peer_uid", lambda conn: os.getuid() + 1)
    server.accept()
    assert not server.pending  # never read, nor answered
    assert client.recv(1 << 16) == b""  # closed on it
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"refused a client of uid {os.getuid() + 1}" in err[0], err
    client.close()
    listener.close()


def test_the_servers_socket_is_private_to_its_user(private, served):
    served()
    assert os.stat(private / "sock").st_mode & 0o777 == 0o600


def test_a_silent_client_holds_up_no_other(private, served):
    served()
    silent = connected(private / "sock")  # connects and says nothing
    asking = connected(private / "sock")
    asking.settimeout(60)  # bounds a hang only
    send(asking, {"op": "not-a-spawner"})
    reply, _ = receive(asking)
    assert reply == {"op": "reply", "refused": "not a request for a spawner"}
    # ... answered while the silent one is still connected: the server did not wait for it.
    assert not select.select([silent], [], [], 0)[0]
    silent.close()
    asking.close()


def test_a_silent_client_is_dropped_after_its_time(private, served):
    served(client_timeout_s=0.2)
    silent = connected(private / "sock")
    silent.settimeout(60)  # bounds a hang only
    assert silent.recv(1 << 16) == b""
    silent.close()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_the_socket_goes_when_the_server_ends(private, served, sig):
    proc = served()
    proc.send_signal(sig)
    assert proc.wait(60) in (128 + sig, 130)
    assert not os.path.lexists(private / "sock")
    assert proc.stderr.read() == ""  # no traceback


def test_a_socket_left_by_a_killed_server_is_taken_over(private, served):
    first = served()
    first.kill()
    first.wait()
    assert os.path.lexists(private / "sock")  # SIGKILL leaves it
    served()
    send(asking := connected(private / "sock"), {"op": "not-a-spawner"})
    assert receive(asking)[0]["refused"] == "not a request for a spawner"
    asking.close()
