"""Idle sockets lock nobody out (issue 29, point 4), over real sockets on 127.0.0.1.

A socket that sends nothing, or a handshake that stalls, holds a server's handshake
slot only until a peer that completes quickly needs it, and a silent one is closed
after ``first_bytes_timeout_s`` in any case. An authenticated connection that never
registers with the coordinator is closed after ``cluster.coordinator_timeout_s``,
as the memory host already closes one that never attaches.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import types

import pytest
from cluster_helpers import cluster, finish, live_status, read_json, wait_for
from hostile_helpers import Memory0

from aiorl.cli.status import fetch_status
from aiorl.config import ConfigError
from aiorl.config.checks import rings_supported
from aiorl.experiment.loading import load_config
from aiorl.launch.local import LocalLauncher
from aiorl.runtime import local_sockets
from aiorl.runtime.transport import transport_of
from aiorl.wire import ConnectionClosed, ServerBusy, connect, generate_token, serve, unix, write_token_file
from aiorl.wire.auth import handshake_frame, new_nonce
from aiorl.wire.codec import FrameType

TOKEN = generate_token()
HANG_S = 30.0  # only bounds a hang


async def echo(conn):
    async for msg in conn:
        await conn.reply(msg)


async def raw(port: int, hello: bool = False):
    """A bare TCP connection: silent, or one that sends a HELLO and then stalls."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    if hello:
        writer.write(handshake_frame(FrameType.HELLO, {"name": "stall", "nonce": new_nonce()}))
        await writer.drain()
    return reader, writer


async def until(predicate) -> None:
    async with asyncio.timeout(HANG_S):
        while not predicate():
            await asyncio.sleep(0.002)


async def test_a_silent_connection_is_closed_after_first_bytes_timeout_not_the_handshake_deadline(caplog):
    caplog.set_level(logging.WARNING, logger="aiorl.wire")
    # The handshake deadline is far off: only the first-bytes deadline (default 1.5 s) ends it.
    server = await serve(echo, token=TOKEN, name="s", handshake_timeout_s=HANG_S)
    stalled = await raw(server.port, hello=True)  # connected first: its timer would fire first
    silent = await raw(server.port)
    try:
        await until(lambda: len(server._handshaking) == 2)
        async with asyncio.timeout(HANG_S):
            assert await silent[0].read() == b""  # the server hung up on the silent one
        assert server.stats["handshake_failures"] == 1
        assert any("no byte received within 1.5s" in r.getMessage() for r in caplog.records)
        # The one that sent its HELLO is not cut by that deadline (only by the handshake's own).
        assert len(server._handshaking) == 1 and not next(iter(server._handshaking)).silent
    finally:
        for _, writer in (stalled, silent):
            writer.close()
        await server.close()


async def test_silent_sockets_held_and_reopened_cannot_hold_the_per_host_slots():
    server = await serve(echo, token=TOKEN, name="s", max_handshakes_per_host=4, handshake_timeout_s=HANG_S)
    held: list = []
    busy_replies = 0
    stop = asyncio.Event()

    async def flood(slot: int) -> None:
        """Keep one silent socket open at all times, re-opened the moment the server drops it."""
        nonlocal busy_replies
        while not stop.is_set():
            reader, writer = await raw(server.port)
            held.append(writer)
            try:
                answer = await reader.read()
            except ConnectionError:
                answer = b""
            busy_replies += b"busy" in answer
            writer.close()

    floods = [asyncio.create_task(flood(i)) for i in range(6)]  # more than the cap, as in the issue
    try:
        await until(lambda: len(server._handshaking) == 4 and len(held) >= 6)
        for i in range(5):
            conn = await connect("127.0.0.1", server.port, token=TOKEN, name=f"role-{i}")
            assert (await conn.request("ping", timeout_s=HANG_S)).kind == "ok"
            await conn.close()
        assert server.stats["evicted"] >= 5
    finally:
        stop.set()
        for writer in held:
            writer.close()
        await asyncio.gather(*floods, return_exceptions=True)
        await server.close()
    assert busy_replies >= 1  # an evicted socket is told why: a "busy" REJECT


async def test_a_stalled_handshake_keeps_its_slot_while_young_and_gives_it_up_when_slow():
    server = await serve(
        echo, token=TOKEN, name="s", max_handshakes_per_host=2, handshake_timeout_s=HANG_S, first_bytes_timeout_s=0.3
    )
    stalled = [await raw(server.port, hello=True) for _ in range(2)]
    try:
        await until(lambda: len(server._handshaking) == 2 and not any(p.silent for p in server._handshaking))
        # Both have just talked: the newcomer waits its turn (refused busy, it retries)...
        with pytest.raises(ServerBusy, match="handshakes in progress from 127.0.0.1"):
            await connect("127.0.0.1", server.port, token=TOKEN, name="early")
        assert server.stats["evicted"] == 0
        # ...and once they have stalled past first_bytes_timeout_s, a newcomer takes the oldest's slot.
        await until(lambda: all(asyncio.get_running_loop().time() - p.connected_at > 0.3 for p in server._handshaking))
        conn = await connect("127.0.0.1", server.port, token=TOKEN, name="late")
        assert (await conn.request("ping", timeout_s=HANG_S)).kind == "ok"
        await conn.close()
        async with asyncio.timeout(HANG_S):
            answer = await stalled[0][0].read()
        assert b"busy" in answer and b"a newer one took its slot" in answer
        assert server.stats["evicted"] == 1
    finally:
        for _, writer in stalled:
            writer.close()
        await server.close()


@pytest.mark.parametrize("value", [0, -1, 61])
def test_first_bytes_timeout_out_of_range_is_a_one_line_config_error(value):
    with pytest.raises(ConfigError) as info:
        load_config(data={"algo": "random_agent", "cluster": {"first_bytes_timeout_s": value}})
    message = str(info.value)
    assert "cluster.first_bytes_timeout_s" in message and str(value) in message and "\n" not in message


async def test_aiorl_status_waits_out_a_busy_refusal():
    """`aiorl status` retries while every slot is held by a young handshake; they turn slow and yield."""
    server = await serve(
        echo, token=TOKEN, name="s", max_handshakes_per_host=2, handshake_timeout_s=HANG_S, first_bytes_timeout_s=0.3
    )
    stalled = [await raw(server.port, hello=True) for _ in range(2)]
    try:
        await until(lambda: len(server._handshaking) == 2 and not any(p.silent for p in server._handshaking))
        assert await fetch_status("127.0.0.1", server.port, TOKEN, timeout_s=HANG_S) == {}  # echo's empty reply
        assert server.stats["refused_busy"] > server.stats["evicted"] == 1  # it was refused, then got in
    finally:
        for _, writer in stalled:
            writer.close()
        await server.close()


async def test_authenticated_connections_that_never_register_or_attach_are_closed(tmp_path):
    """A leaking client with the token fills the coordinator's max_connections; the register
    deadline (cluster.coordinator_timeout_s) empties it again, and `attach` has the same one."""
    async with Memory0(tmp_path, ["cluster.coordinator_timeout_s=0.5"]) as m:
        coordinator = ("127.0.0.1", m.cfg.cluster.port)
        asking = await m.connect(coordinator, "status")  # status is answered, but is no registration
        answers = []

        async def keep_asking() -> None:  # the deadline runs from the handshake, not from the last request
            while True:
                try:
                    answers.append((await asking.request("status", timeout_s=HANG_S)).meta["phase"])
                except ConnectionClosed:
                    return
                await asyncio.sleep(0.05)

        asker = asyncio.create_task(keep_asking())
        leaked = []
        with pytest.raises(ServerBusy, match="connections open"):
            while len(leaked) < 100:
                leaked.append(await m.connect(coordinator, f"leak-{len(leaked)}"))
        idle_at_memory = await m.connect(m.memory_address, "actor-0")
        await m.until(lambda: all(c.closed for c in [asking, *leaked, idle_at_memory]), "idle connections closed")
        async with asyncio.timeout(HANG_S):
            await asker
        assert answers and m.coordinator.unregistered_closed == 1 + len(leaked)
        assert m.memory.peers_refused["no_attach"] == 1
        conn, session = await m.register("actor-0")  # room again
        assert await m.attach("actor-0", session)


async def test_the_coordinator_and_memory_host_serve_with_the_configured_first_bytes_timeout(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="aiorl.wire")
    async with Memory0(tmp_path, ["cluster.first_bytes_timeout_s=0.2"]) as m:
        silent = [await raw(m.cfg.cluster.port), await raw(m.memory_address[1])]
        async with asyncio.timeout(HANG_S):
            for reader, _ in silent:
                assert await reader.read() == b""
        for _, writer in silent:
            writer.close()
        assert m.coordinator.server.stats["handshake_failures"] == m.memory.server.stats["handshake_failures"] == 1
    assert sum("no byte received within 0.2s" in r.getMessage() for r in caplog.records) == 2


class SilentFlood:
    """`count` silent sockets to 127.0.0.1:`port`, each re-opened shortly after the server drops
    it, from a thread of their own (the test's main thread runs the cluster's clock)."""

    REOPEN_S = 0.1  # at once, as an attacker would, but no busy loop on a shared 2-core machine

    def __init__(self, port: int, count: int) -> None:
        self.port, self.count = port, count
        self.opened = self.dropped = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)

    def __enter__(self) -> SilentFlood:
        self._thread.start()
        self._ready.wait(HANG_S)
        return self

    def __exit__(self, *exc) -> None:
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(HANG_S)

    async def _main(self) -> None:
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        self._ready.set()
        holders = [asyncio.create_task(self._hold()) for _ in range(self.count)]
        await self._stop.wait()
        for task in holders:
            task.cancel()
        await asyncio.gather(*holders, return_exceptions=True)

    async def _hold(self) -> None:
        while True:
            try:
                reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
            except OSError:
                await asyncio.sleep(self.REOPEN_S)
                continue
            self.opened += 1
            try:
                await reader.read()  # until the server hangs up
            except ConnectionError:
                pass
            finally:
                writer.close()
            self.dropped += 1
            await asyncio.sleep(self.REOPEN_S)


def coordinator_port(run_dir) -> int | None:
    try:
        return read_json(run_dir / "coordinator.json")["port"]
    except (OSError, ValueError, KeyError):
        return None  # not written yet (or half)


@pytest.mark.cluster
def test_a_run_with_40_silent_sockets_held_at_its_coordinator_starts_restarts_finishes_and_answers_status(launch):
    """Issue 29's acceptance: every role connects from 127.0.0.1, where 40 silent sockets (more than
    max_handshakes_per_host) are held and re-opened from the coordinator's first moment on; the
    roles start, `aiorl status` answers, a SIGKILLed actor's restart registers, the run ends 0."""
    config = cluster(2, 2, 1, scheduled_timesteps=10**9)
    config["cluster"].update(max_restarts=1, restart_backoff_s=0.2)
    proc, run_dir = launch(config)
    port = wait_for(lambda: coordinator_port(run_dir), 60, "coordinator.json")
    with SilentFlood(port, 40) as flood:
        wait_for(lambda: flood.opened >= 40, 60, "40 silent sockets at the coordinator")
        status = subprocess.run(
            [sys.executable, "-m", "aiorl", "status", str(run_dir), "--json"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        actor = wait_for(lambda: stepping(run_dir, "actor-0"), 60, "actor-0 stepping")
        os.kill(actor, signal.SIGKILL)
        wait_for(lambda: stepping(run_dir, "actor-0") not in (None, actor), 60, "actor-0's restart stepping")
        wait_for(lambda: flood.dropped > 40, 60, "the server dropping the silent sockets again and again")
        # It ends when the test is done (SIGINT: the same phases as a stop criterion), still flooded.
        proc.send_signal(signal.SIGINT)
        code, out = finish(proc, timeout_s=240)
        dropped = flood.dropped
    assert status.returncode == 0, status.stdout + status.stderr
    assert json.loads(status.stdout)["live"] is True  # the coordinator answered, during the run
    assert code == 130, out  # interrupted, after a clean shutdown
    summary = read_json(run_dir / "summary.json")
    assert summary["ok"] and summary["outcome"] == "interrupted" and not summary["failures"], summary
    assert summary["restarts"] == 1 and summary["roles"]["actor-0"]["restarts"] == 1
    assert all(role["status"] == "done" for role in summary["roles"].values())
    assert dropped > 40  # the server kept dropping them, and they kept coming back
    assert summary["connections_refused_busy"] > 0  # they did fill the slots the roles needed


def stepping(run_dir, name: str) -> int | None:
    """`name`'s pid once the coordinator has it running and stepping."""
    role = (live_status(run_dir) or {}).get("roles", {}).get(name, {})
    if role.get("status") == "running" and (role.get("counters") or {}).get("env_steps", 0) > 0:
        return role.get("pid")
    return None


# ---------------------------------------------------------------------------------------------
# Issue 29, point 4d: a local run's servers also listen on Unix sockets in the run directory;
# a peer there of another uid is refused before the handshake.


def log_of(run_dir, name: str) -> str:
    return (run_dir / "logs" / f"{name}.log").read_text()


@pytest.mark.cluster
@pytest.mark.parametrize("transport", ["tcp", "shm"])
def test_a_local_runs_roles_and_restarts_connect_over_unix_sockets_and_status_answers_there(launch, transport):
    config = cluster(1, 2, 1, scheduled_timesteps=10**9)
    config["cluster"].update(max_restarts=1, restart_backoff_s=0.2, transport=transport)
    proc, run_dir = launch(config)
    actor = wait_for(lambda: stepping(run_dir, "actor-0"), 60, "actor-0 stepping")
    status = subprocess.run(
        [sys.executable, "-m", "aiorl", "status", str(run_dir), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    os.kill(actor, signal.SIGKILL)
    wait_for(lambda: (live_status(run_dir) or {}).get("restarts") == 1, 60, "actor-0's restart")
    # It ends once the restart stepped (SIGINT: the same phases as a stop criterion).
    wait_for(lambda: stepping(run_dir, "actor-0") not in (None, actor), 60, "actor-0's restart stepping")
    proc.send_signal(signal.SIGINT)
    code, out = finish(proc, timeout_s=240)
    assert code == 130, out  # interrupted, after a clean shutdown
    assert status.returncode == 0 and json.loads(status.stdout)["live"] is True, status.stdout + status.stderr
    address = read_json(run_dir / "coordinator.json")
    assert address["unix"] == str(run_dir / "sock" / "coordinator")
    sock = run_dir / "sock"
    if transport == "tcp":  # the Unix sockets carry everything
        coordinator = f"connected to the coordinator over unix:{sock / 'coordinator'}"
    else:  # the data moves through rings handed over beside them
        coordinator = f"connected to the coordinator over shared memory (unix:{sock / 'coordinator.ring'})"
    for name in ("memory-0", "memory-1", "learner-0"):
        assert log_of(run_dir, name).count(coordinator) == 1, name
    assert log_of(run_dir, "actor-0").count(coordinator) == 2  # the restart too
    for name, incarnations in (("learner-0", 1), ("actor-0", 2)):
        for m in range(2):
            if transport == "tcp":
                line = f"over unix:{sock / f'memory-{m}'}"
            else:
                line = f"over shared memory (ring:{sock / f'memory-{m}.ring'})"
            assert log_of(run_dir, name).count(line) == incarnations, (name, m)
            assert ("shared memory" in log_of(run_dir, name)) == (transport == "shm"), name
    summary = read_json(run_dir / "summary.json")
    assert summary["ok"] and summary["outcome"] == "interrupted" and not summary["failures"], summary
    assert summary["roles"]["actor-0"]["restarts"] == 1
    # Four roles, the restart and `aiorl status` (a rejoin would add one), none refused.
    assert summary["unix_connections"] >= 6 and summary["connections_refused_uid"] == 0


def connect_as(uid: int, path: str) -> int:
    """Connect to Unix socket `path` from a child running as `uid`: 0 when the server hung up
    without a byte, else what went wrong (the child only uses blocking sockets, then _exits)."""
    pid = os.fork()
    if pid == 0:
        code = 3
        try:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(HANG_S)
            sock.connect(path)
            try:
                code = 0 if sock.recv(4096) == b"" else 2
            except ConnectionResetError:
                code = 0
        except BaseException:
            code = 4
        os._exit(code)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


@pytest.mark.skipif(os.getuid() != 0, reason="changing uid needs root (the CI runs as root)")
async def test_a_unix_peer_of_another_uid_is_refused_before_the_handshake(tmp_path):
    # A directory another uid can enter, as root or a widened mode would make it: only the uid
    # check stands between that peer and the handshake.
    directory = tempfile.mkdtemp(prefix="aiorl-uid-", dir="/tmp")  # tmp_path's parents are 0700
    path = os.path.join(directory, "s")
    try:
        server = await serve(echo, token=TOKEN, name="s", unix_path=path)
        try:
            os.chmod(directory, 0o755)
            os.chmod(path, 0o666)
            assert await asyncio.to_thread(connect_as, 65534, path) == 0
            conn = await connect("127.0.0.1", server.port, token=TOKEN, name="same-uid", unix_path=path)
            assert (await conn.request("ping", timeout_s=HANG_S)).kind == "ok"
            assert conn.peer == f"unix:{path}"
            await conn.close()
            assert server.stats["refused_uid"] == 1 and server.stats["unix_connections"] == 1
            assert server.stats["handshake_failures"] == 0  # refused before any handshake began
        finally:
            await server.close()
        assert not os.path.exists(path)  # the server removes its socket when it closes
    finally:
        shutil.rmtree(directory)


def test_the_uid_check_reads_the_peers_credentials():
    a, b = socket.socketpair(socket.AF_UNIX)
    tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        assert unix.peer_uid(a) == os.getuid()
        assert unix.check_peer(a, os.getuid()) is None
        me = os.getuid()
        assert unix.check_peer(a, me + 1) == f"peer uid {me} is not this server's uid {me + 1}"
        assert unix.check_peer(tcp, os.getuid()) is not None  # no credentials: refused, not trusted
    finally:
        for sock in (a, b, tcp):
            sock.close()


async def test_aiorl_status_of_a_run_directory_asks_over_its_unix_socket_on_this_host_only(tmp_path):
    run_dir = tmp_path / "run"
    (run_dir / "sock").mkdir(parents=True)
    write_token_file(run_dir / "token", TOKEN)
    path = str(run_dir / "sock" / "coordinator")
    server = await serve(echo, token=TOKEN, name="s", unix_path=path)
    try:
        for hostname, over_unix in ((socket.gethostname(), 1), ("another-host", 0)):
            address = {"host": "127.0.0.1", "port": server.port, "unix": path, "hostname": hostname}
            (run_dir / "coordinator.json").write_text(json.dumps(address))
            before = server.stats["unix_connections"]
            status = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "aiorl", "status", str(run_dir), "--json", stdout=subprocess.PIPE
            )
            async with asyncio.timeout(120):
                out, _ = await status.communicate()
            assert status.returncode == 0 and json.loads(out) == {"live": True}  # echo's empty reply
            assert server.stats["unix_connections"] - before == over_unix, hostname
    finally:
        await server.close()


@pytest.mark.cluster
def test_a_run_directory_too_deep_for_a_socket_path_falls_back_to_tcp_and_says_so_once(tmp_path, launch):
    deep = tmp_path / ("d" * 100)  # run/sock/coordinator under it is past sun_path's 107 bytes
    deep.mkdir()
    config = cluster(1, 1, 1, scheduled_timesteps=10**9)
    config["run"] = {"max_seconds": 3.0}
    proc, run_dir = launch(config, where=deep)
    code, out = finish(proc, timeout_s=240)
    assert code == 0, out
    assert "unix" not in read_json(run_dir / "coordinator.json")
    summary = read_json(run_dir / "summary.json")
    assert summary["ok"] and summary["unix_connections"] == 0
    assert log_of(run_dir, "memory-0").count("too long for a Unix socket") == 1
    assert not any("over unix:" in log_of(run_dir, name) for name in ("memory-0", "learner-0", "actor-0"))


@pytest.mark.parametrize("value", ["yes", 1])
def test_unix_sockets_not_a_bool_is_a_one_line_config_error(value):
    with pytest.raises(ConfigError) as info:
        load_config(data={"algo": "random_agent", "cluster": {"unix_sockets": value}})
    assert str(info.value) == f"cluster.unix_sockets: expected bool, got {type(value).__name__} {value!r}"


@pytest.mark.parametrize("transport", ["auto", "tcp"])
@pytest.mark.parametrize("on", [True, False])
def test_only_the_local_launcher_turns_unix_sockets_on_and_cluster_unix_sockets_turns_them_off(on, transport):
    cfg = load_config(data={"algo": "random_agent", "cluster": {"unix_sockets": on, "transport": transport}})
    launcher = types.SimpleNamespace(cfg=cfg, coordinator_unix="/run/sock/coordinator")
    inherited = {
        local_sockets.ENV_ON: "1",
        local_sockets.ENV_COORDINATOR: "/elsewhere",
        "PATH": "/bin",
    }
    env = LocalLauncher._unix_env(launcher, inherited)
    expected = {local_sockets.ENV_ON: "1", local_sockets.ENV_COORDINATOR: "/run/sock/coordinator"} if on else {}
    assert env == {"PATH": "/bin", **expected}
    # Shared memory on one host (x86-64); 'tcp' keeps the sockets alone.
    rings = transport_of(cfg, env).ring_bytes
    assert rings == (cfg.cluster.shm_ring_bytes if on and transport == "auto" and rings_supported() else None)
    # A role started by hand (or by Ray) has neither: it serves and connects over TCP only.
    assert transport_of(cfg, {}).socket_path("/run", "memory-1") is None
    assert transport_of(cfg, {}).peer_socket("/") is None
    assert transport_of(cfg, env).peer_socket("/") == ("/" if on else None)
