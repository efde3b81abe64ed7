"""Shared-memory rings (aiorl.wire.shm) against the TCP path: the same frames, checks and
endings, a ring that fills, a peer that dies mid-frame, and a hand-over or ring state a peer
forged."""

from __future__ import annotations

import asyncio
import fcntl
import logging
import mmap
import os
import shutil
import socket
import sys
import tempfile
import textwrap

import numpy as np
import pytest
from test_wire_bad_input import frame, valid_frame

from aiorl.wire import ConnectionClosed, ProtocolError, connect, ring, serve, shm
from aiorl.wire.codec import FrameType

TOKEN = b"shm-test-token-0123456789abcdef0"
HANG_S = 30.0
TRANSPORTS = ["tcp", "shm"]
RING_SMALL = shm.MIN_RING_BYTES


class Recorder:
    def __init__(self) -> None:
        self.messages: list = []
        self.ended: list[BaseException | None] = []
        self.release = asyncio.Event()
        self.release.set()

    async def handler(self, conn) -> None:
        try:
            async for message in conn:
                await self.release.wait()
                self.messages.append(message)
                if message.request_id is not None:
                    await conn.reply(message, "ok", {"n": len(self.messages)})
            self.ended.append(None)
        except ConnectionClosed as exc:
            self.ended.append(exc.cause)


async def server_and_client(tmp_path, transport: str, ring_bytes: int = shm.MIN_RING_BYTES, **client):
    tmp_path.mkdir(parents=True, exist_ok=True)
    recorder = Recorder()
    server = await serve(
        recorder.handler,
        token=TOKEN,
        name="server",
        unix_path=str(tmp_path / "s"),
        rings=True,
        ring_bytes=ring_bytes,
        handshake_timeout_s=HANG_S,
    )
    where = {"ring_path": server.ring_path} if transport == "shm" else {}
    conn = await connect("127.0.0.1", server.port, token=TOKEN, name="client", handshake_timeout_s=HANG_S, **where)
    return server, recorder, conn


async def until(predicate, what: str = "") -> None:
    async with asyncio.timeout(HANG_S):
        while not predicate():
            await asyncio.sleep(0.002)


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_frames_of_every_size_arrive_whole_in_order_and_replies_come_back(tmp_path, transport):
    server, recorder, conn = await server_and_client(tmp_path, transport)
    try:
        if transport == "shm":
            assert conn.peer == f"unix:{tmp_path / 's.ring'}" and conn._proto.unix
            assert type(conn._proto.transport) is shm.RingTransport and not conn._proto._chunked
        rng = np.random.default_rng(0)
        sent = []
        for i, size in enumerate([0, 1, 100, 4095, 65536, 65537, 3 * shm.MIN_RING_BYTES + 17, 1 << 20]):
            array = rng.integers(0, 255, size, dtype=np.uint8)
            sent.append(array)
            await conn.send("x", {"i": i}, {"a": array})
        reply = await conn.request("q", {}, timeout_s=HANG_S)
        assert reply.meta == {"n": len(sent) + 1}
        for message, array in zip(recorder.messages, sent):
            assert np.array_equal(message.arrays["a"], array)
        assert [m.meta.get("i") for m in recorder.messages[:-1]] == list(range(len(sent)))
    finally:
        await conn.close()
        await server.close()
    assert not (tmp_path / "s.ring").exists()


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_ring_that_fills_holds_the_writer_back_and_loses_nothing(tmp_path, transport, monkeypatch):
    # No safety net: a blocked writer must be woken by the reader's "space freed", not by re-checking.
    monkeypatch.setattr(ring, "BLOCKED_RECHECK_S", 3600.0)
    server, recorder, conn = await server_and_client(tmp_path, transport)
    recorder.release.clear()  # the server takes nothing for now
    try:
        payload = np.arange(16 * 1024, dtype=np.uint8)
        count = 0

        async def writer():
            nonlocal count
            while True:
                await conn.send("x", {"i": count}, {"a": payload})
                count += 1

        task = asyncio.create_task(writer())
        # The writer stops on its own: ring, staging and queue are full and send() waits in drain.
        async with asyncio.timeout(HANG_S):
            while True:
                before = count
                await asyncio.sleep(0.2)
                if count == before and count > 0:
                    break
        assert not task.done() and conn._proto._writing_paused
        blocked_at = count
        recorder.release.set()
        await until(lambda: count > blocked_at + 200, "the writer to go on")
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await conn.request("q", {}, timeout_s=HANG_S)
        got = [m.meta["i"] for m in recorder.messages if m.kind == "x"]
        assert got == list(range(len(got))) and len(got) >= count - 1
        assert all(np.array_equal(m.arrays["a"], payload) for m in recorder.messages[:50])
    finally:
        conn.abort()
        await server.close()


# ---------------------------------------------------------------------- wake-ups


def ends(server, conn):
    """(client transport, server transport) of the one connection."""
    return conn._proto.transport, next(iter(server.connections))._proto.transport


def count_signals(transport) -> list:
    """Replace `transport`'s eventfd write with a counting one; the list grows per wake-up sent."""
    sent: list = []
    signal = transport._signal_peer

    def counted() -> None:
        sent.append(1)
        signal()

    transport._signal_peer = counted
    return sent


async def test_a_writer_wakes_its_reader_only_while_the_reader_is_idle(tmp_path):
    """The reader raises `waiting` when it has read everything; a write wakes it only then."""
    server, recorder, conn = await server_and_client(tmp_path, "shm")
    try:
        await conn.request("q", {}, timeout_s=HANG_S)  # both sides idle now, their flags up
        client, served = ends(server, conn)
        assert served._waiting and served._seg.ctl[served._seg.in_waiting] == 1
        sent = count_signals(client)
        await conn.send("x", {"i": 0})
        await until(lambda: len(recorder.messages) == 2, "the first message")
        assert sent == [1]  # the server was idle: one wake-up
        # The server is busy reading (its flag down, as while it drains the ring): no wake-up.
        served._waiting = False
        served._seg.ctl[served._seg.in_waiting] = 0
        await conn.send("x", {"i": 1})
        await asyncio.sleep(0.05)
        assert sent == [1] and len(recorder.messages) == 2  # written, not signalled, not read yet
        served._on_wake()  # ...until the busy reader looks at the ring again
        await until(lambda: len(recorder.messages) == 3, "the second message")
        assert recorder.messages[-1].meta == {"i": 1} and sent == [1]
    finally:
        conn.abort()
        await server.close()


class Racing:
    """The server's fenced control words, with `race` run just before it raises `waiting`:
    a write that lands after the reader found the ring empty, before its flag is up."""

    def __init__(self, seg, race) -> None:
        self.real, self.seg, self.race = seg.fenced, seg, race

    def store_then_load(self, store_at: int, value: int, load_at: int) -> int:
        if store_at == self.seg.in_waiting and value == 1 and self.race is not None:
            race, self.race = self.race, None
            race()
        return self.real.store_then_load(store_at, value, load_at)

    def release(self) -> None:
        self.real.release()


async def test_a_write_racing_the_readers_waiting_flag_is_read_without_a_wake_up(tmp_path):
    """The writer looked at the flag before the reader raised it, so it sent no wake-up: the
    reader's second look at the tail, after raising the flag, must find the write."""
    server, recorder, conn = await server_and_client(tmp_path, "shm")
    try:
        await conn.request("q", {}, timeout_s=HANG_S)
        client, served = ends(server, conn)
        assert served._waiting  # idle, its flag up
        sent = count_signals(client)
        buffers, _ = conn._proto._encoder.encode(FrameType.DATA, "raced", {}, {"a": np.arange(5.0)})
        served._seg.fenced = Racing(served._seg, lambda: client.writelines(buffers))
        # Woken (for anything): its flag goes down while it reads, so the racing write, which
        # comes after it found the ring empty and before its flag is up again, sends nothing.
        served._on_wake()
        await until(lambda: recorder.messages and recorder.messages[-1].kind == "raced", "the raced write")
        assert sent == [] and np.array_equal(recorder.messages[-1].arrays["a"], np.arange(5.0))
        assert served._waiting  # and, with nothing more to read, it waits for a wake-up
    finally:
        conn.abort()
        await server.close()


async def test_a_blocked_writer_is_woken_once_half_the_ring_is_free_not_per_read(tmp_path, monkeypatch):
    monkeypatch.setattr(ring, "BLOCKED_RECHECK_S", 3600.0)  # no safety net: only wake-ups move it
    server, recorder, conn = await server_and_client(tmp_path, "shm", ring_bytes=1 << 20)
    try:
        await conn.request("q", {}, timeout_s=HANG_S)
        client, served = ends(server, conn)
        served.pause_reading()
        payload = np.zeros(8 * 1024, np.uint8)
        for i in range(160):  # 1.3 MiB into a 1 MiB ring
            await conn.send("x", {"i": i}, {"a": payload})
        await until(lambda: client._blocked, "the writer to fill the ring")
        assert client._tail - client._seg.ctl[client._seg.out_head] == client._cap
        sent = count_signals(served)
        # Each read takes one window (at most READ_WINDOW bytes), then reading pauses again.
        reads = []
        updated = served._protocol.buffer_updated

        def one_read(nbytes: int) -> None:
            reads.append(nbytes)
            updated(nbytes)
            served.pause_reading()

        served._protocol.buffer_updated = one_read
        served.resume_reading()
        await until(lambda: reads, "a read")
        assert served._peer_tail - served._head > client._cap // 2 and sent == []  # 3/4 still unread
        while served._peer_tail - served._head > client._cap // 2:
            served.resume_reading()
            count = len(reads)
            await until(lambda: len(reads) > count, "another read")
        assert sent == [1] and len(reads) >= 2  # half free: one wake-up for all those reads
        del served._protocol.buffer_updated
        served.resume_reading()
        await until(lambda: len([m for m in recorder.messages if m.kind == "x"]) == 160, "every message")
        assert [m.meta["i"] for m in recorder.messages if m.kind == "x"] == list(range(160))
    finally:
        conn.abort()
        await server.close()


BAD_FRAMES = {
    "bad magic": frame(magic=b"XX"),
    "bad version": frame(version=99),
    "bad type": frame(ftype=200),
    "huge header": frame(schema_len=1 << 30),
    "huge payload": frame(payload_len=1 << 40),
    "schema garbage": frame(schema=b"\xc1\xc1", payload=b""),
    "payload too short for the arrays": valid_frame(arrays={"a": np.zeros(10, np.float32)})[:-8] + frame()[:0],
}


async def closing_reason(tmp_path, transport: str, data: bytes) -> str:
    server, recorder, conn = await server_and_client(tmp_path, transport)
    try:
        conn._proto.transport.write(data)
        await until(lambda: recorder.ended)
        return str(recorder.ended[0])
    finally:
        conn.abort()
        await server.close()


@pytest.mark.parametrize("case", sorted(BAD_FRAMES))
async def test_bad_frames_close_the_connection_for_the_same_reason_as_over_tcp(tmp_path, case):
    data = BAD_FRAMES[case] + valid_frame(kind="after")  # nothing behind a bad frame is taken
    over_tcp = await closing_reason(tmp_path / "t", transport="tcp", data=data)
    over_ring = await closing_reason(tmp_path / "r", transport="shm", data=data)
    assert over_ring == over_tcp and over_tcp != "None", (over_tcp, over_ring)


CHILD = textwrap.dedent(
    """
    import asyncio, os, sys
    from aiorl.wire import connect
    from test_wire_bad_input import valid_frame
    import numpy as np

    async def main():
        where = {"ring_path": sys.argv[2]} if sys.argv[1] == "shm" else {}
        conn = await connect("127.0.0.1", int(sys.argv[3]), token=sys.argv[4].encode(), name="dying", **where)
        await conn.send("whole", {"i": 1})
        conn._proto._flush()  # ahead of the raw write below
        data = valid_frame(kind="cut", arrays={"a": np.zeros(100_000, np.uint8)})
        conn._proto.transport.write(data[: len(data) // 2])
        await asyncio.sleep(0.3)
        os._exit(0)  # dies mid-frame, nothing closed on its way out

    asyncio.run(main())
    """
)


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_peer_process_that_dies_mid_frame_ends_the_connection_as_over_tcp(tmp_path, transport):
    recorder = Recorder()
    server = await serve(
        recorder.handler,
        token=TOKEN,
        name="server",
        unix_path=str(tmp_path / "s"),
        rings=True,
        handshake_timeout_s=HANG_S,
    )
    try:
        tests = os.path.dirname(__file__)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([tests, *sys.path])}
        child = await asyncio.create_subprocess_exec(
            sys.executable, "-c", CHILD, transport, server.ring_path, str(server.port), TOKEN.decode(), env=env
        )
        assert await asyncio.wait_for(child.wait(), HANG_S) == 0
        await until(lambda: recorder.ended)
        assert [m.kind for m in recorder.messages] == ["whole"], recorder.ended
        assert isinstance(recorder.ended[0], ProtocolError)
        assert "peer closed the connection mid-frame" in str(recorder.ended[0])
        await until(lambda: not server.connections)
    finally:
        await server.close()


STREAMER = textwrap.dedent(
    """
    import asyncio, sys
    import numpy as np
    from aiorl.wire import connect

    async def main():
        conn = await connect("", 0, token=sys.argv[2].encode(), name="streamer", ring_path=sys.argv[1])
        rng = np.random.default_rng(1)
        for i in range(int(sys.argv[3])):
            size = int(rng.integers(0, 3000)) if i % 50 else 70_000  # wraps at every offset
            await conn.send("s", {"i": i}, {"a": np.full(size, i % 251, np.uint8)})
        await conn.close()

    asyncio.run(main())
    """
)


async def test_two_processes_stream_over_a_small_ring_without_a_torn_counter(tmp_path):
    """Counters change under the reader's feet here (another process, another core): a counter
    read or written in pieces shows up as a forged ring state and ends the stream early."""
    count = 200_000
    received = []
    ended = []

    async def handler(conn):
        try:
            async for message in conn:
                i = message.meta["i"]
                a = message.arrays["a"]
                received.append(i if (a.size == 0 or (a[0] == a[-1] == i % 251)) else -1)
            ended.append(None)
        except ConnectionClosed as exc:
            ended.append(exc.cause)

    server = await serve(
        handler, token=TOKEN, name="server", unix_path=str(tmp_path / "s"), rings=True, ring_bytes=RING_SMALL
    )
    try:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
        child = await asyncio.create_subprocess_exec(
            sys.executable, "-c", STREAMER, server.ring_path, TOKEN.decode(), str(count), env=env
        )
        assert await asyncio.wait_for(child.wait(), 4 * HANG_S) == 0
        await until(lambda: ended)
        assert ended == [None] and received == list(range(count))
    finally:
        await server.close()


# ---------------------------------------------------------------------- a forged ring state


@pytest.mark.parametrize("who", ["server", "client"])
@pytest.mark.parametrize("forgery", ["tail past the ring", "tail backwards", "head past the tail"])
async def test_a_forged_ring_counter_closes_that_connection_with_a_reason(tmp_path, caplog, who, forgery):
    """The peer owns one counter per direction; whatever it writes there is checked before use."""
    caplog.set_level(logging.WARNING, logger="aiorl.wire")
    server, recorder, conn = await server_and_client(tmp_path, "shm")
    try:
        await conn.request("q", {}, timeout_s=HANG_S)  # both directions have moved
        client_transport = conn._proto.transport
        server_transport = next(iter(server.connections))._proto.transport
        victim, forger = (
            (server_transport, client_transport) if who == "server" else (client_transport, server_transport)
        )
        seg = forger._seg
        if forgery == "tail past the ring":
            seg.ctl[seg.out_tail] = forger._tail + forger._cap + 1
        elif forgery == "tail backwards":
            seg.ctl[seg.out_tail] = max(0, forger._tail - 5)
            victim._peer_tail = forger._tail  # (the victim saw the old mark)
        else:
            seg.ctl[seg.in_head] = forger._head + 1 + forger._cap
            victim._pending.append(memoryview(b"x"))  # make the victim look at the peer's head
        forger._signal_peer()
        victim._on_wake()
        await until(lambda: victim._finished)
        assert any("bad ring state from the peer" in r.getMessage() for r in caplog.records), caplog.text
    finally:
        conn.abort()
        await server.close()


# ---------------------------------------------------------------------- a forged hand-over


async def fake_listener(tmp_path, offer_fds):
    """A ring listener that hands over whatever `offer_fds()` returns: (bytes, fds)."""
    path = str(tmp_path / "fake.ring")
    listener = shm.listen(path)
    loop = asyncio.get_running_loop()

    def accept():
        for sock in shm.accept_ready(listener):
            data, fds = offer_fds()
            if fds:
                socket.send_fds(sock, [data], fds)
            else:
                sock.send(data)
            for fd in fds:
                os.close(fd)
            sock.close()  # what it sent stays readable

    loop.add_reader(listener.fileno(), accept)
    return path, listener


def sealed(size: int, seals: bool = True) -> int:
    fd = os.memfd_create("x", os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, size)
    if seals:
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
    return fd


def pipe_end() -> int:
    read, write = os.pipe()
    os.close(write)
    return read


def efd() -> int:
    return os.eventfd(0, os.EFD_NONBLOCK)


RING = shm.MIN_RING_BYTES
GOOD_OFFER = shm.OFFER.pack(shm.MAGIC, shm.LAYOUT_VERSION, 0, 0, RING)
HANDOVERS = {
    "no descriptors": (lambda: (GOOD_OFFER, []), "passed 0 descriptors"),
    "four descriptors": (
        lambda: (GOOD_OFFER, [sealed(shm.segment_bytes(RING)), efd(), efd(), efd()]),
        "passed 3 descriptors (or more)",
    ),
    "bad magic": (
        lambda: (shm.OFFER.pack(b"NOTARING", 1, 0, 0, RING), [sealed(shm.segment_bytes(RING)), efd(), efd()]),
        "expected b'AIORLRNG'",
    ),
    "other layout": (
        lambda: (shm.OFFER.pack(shm.MAGIC, 9, 0, 0, RING), [sealed(shm.segment_bytes(RING)), efd(), efd()]),
        "ring layout version 9",
    ),
    "ring too large": (
        lambda: (shm.OFFER.pack(shm.MAGIC, shm.LAYOUT_VERSION, 0, 0, 1 << 40), [sealed(4096), efd(), efd()]),
        "expected 65536..1073741824",
    ),
    "ring too small": (
        lambda: (shm.OFFER.pack(shm.MAGIC, shm.LAYOUT_VERSION, 0, 0, 16), [sealed(4096), efd(), efd()]),
        "expected 65536..1073741824",
    ),
    "memfd smaller than said": (
        lambda: (GOOD_OFFER, [sealed(shm.segment_bytes(RING) - 4096), efd(), efd()]),
        "expected 135168",
    ),
    "memfd not sealed": (
        lambda: (GOOD_OFFER, [sealed(shm.segment_bytes(RING), seals=False), efd(), efd()]),
        "not sealed against shrinking",
    ),
    "a pipe for an eventfd": (
        lambda: (GOOD_OFFER, [sealed(shm.segment_bytes(RING)), efd(), pipe_end()]),
        "not eventfds",
    ),
    "an eventfd for the memfd": (lambda: (GOOD_OFFER, [efd(), efd(), efd()]), "not a memory file"),
    "short description": (lambda: (GOOD_OFFER[:-3], [sealed(shm.segment_bytes(RING)), efd(), efd()]), "of 21 bytes"),
}


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.parametrize("case", sorted(HANDOVERS))
async def test_a_forged_hand_over_is_refused_before_anything_is_mapped(tmp_path, case):
    offer, reason = HANDOVERS[case]
    path, listener = await fake_listener(tmp_path, offer)
    try:
        before = open_fds()
        made = []
        with pytest.raises(ProtocolError, match=reason.replace("(", r"\(").replace(")", r"\)")):
            await asyncio.wait_for(shm.connect_ring(path, lambda: made.append(1)), HANG_S)
        assert not made  # no protocol ever saw it
        await asyncio.sleep(0)
        assert open_fds() <= before  # every descriptor it passed is closed again
    finally:
        asyncio.get_running_loop().remove_reader(listener.fileno())
        listener.close()


def test_a_sealed_segment_cannot_be_shrunk_under_a_mapping():
    fd = shm.create_segment(RING)
    try:
        shm.check_segment(fd, RING)
        with pytest.raises(PermissionError):
            os.ftruncate(fd, 4096)
        with pytest.raises(PermissionError):
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, 0)  # and the seals cannot be taken off or added to
        mm = mmap.mmap(fd, shm.segment_bytes(RING))
        mm.close()
    finally:
        os.close(fd)


async def test_a_flood_of_silent_ring_connections_holds_bounded_descriptors_and_a_good_peer_gets_in(tmp_path):
    recorder = Recorder()
    server = await serve(
        recorder.handler,
        token=TOKEN,
        name="server",
        unix_path=str(tmp_path / "s"),
        rings=True,
        ring_bytes=RING,
        max_handshakes=4,
        max_handshakes_per_host=4,
        first_bytes_timeout_s=0.2,
    )
    socks = []
    try:
        base = open_fds()
        for _ in range(40):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.connect(server.ring_path)
            socks.append(sock)
            await asyncio.sleep(0.005)
        await asyncio.sleep(0.3)
        # Our 40 sockets, plus the server's side of at most the handshake caps (socket + 2 eventfds).
        assert open_fds() - base <= 40 + 4 * 3 + 8
        conn = await connect("", 0, token=TOKEN, name="good", ring_path=server.ring_path, handshake_timeout_s=HANG_S)
        assert (await conn.request("q", {}, timeout_s=HANG_S)).meta == {"n": 1}
        await conn.close()
    finally:
        for sock in socks:
            sock.close()
        await server.close()


# ---------------------------------------------------------------------- cluster.transport


@pytest.mark.parametrize(
    "cluster, message",
    [
        ({"transport": "udp"}, "cluster.transport: expected one of 'auto', 'tcp', 'shm', got 'udp'"),
        (
            {"transport": "shm", "unix_sockets": False},
            "cluster.transport: 'shm' hands rings over on the run's Unix sockets, but cluster.unix_sockets is false "
            "(set transport to 'auto' or 'tcp', or turn unix_sockets on)",
        ),
        ({"shm_ring_bytes": 1024}, "cluster.shm_ring_bytes: expected 65536..1073741824, got 1024"),
        ({"transport": 3}, "cluster.transport: expected str, got int 3"),
    ],
)
def test_a_bad_transport_is_a_one_line_config_error(cluster, message):
    from aiorl.config.schema import ConfigError
    from aiorl.experiment.loading import load_config

    with pytest.raises(ConfigError) as info:
        load_config(data={"algo": "random_agent", "cluster": cluster})
    assert str(info.value) == message


@pytest.mark.parametrize("transport", ["auto", "shm", "tcp"])
def test_every_transport_loads_and_auto_and_tcp_keep_working_without_unix_sockets(transport):
    from aiorl.experiment.loading import load_config

    assert (
        load_config(data={"algo": "random_agent", "cluster": {"transport": transport}}).cluster.transport == transport
    )
    if transport != "shm":  # no Unix sockets: no rings either, TCP as before
        load_config(data={"algo": "random_agent", "cluster": {"transport": transport, "unix_sockets": False}})


@pytest.mark.parametrize("machine, rings", [("x86_64", True), ("AMD64", True), ("aarch64", False), ("ppc64le", False)])
def test_rings_only_on_x86_64_shm_refused_elsewhere_and_auto_keeps_to_sockets(monkeypatch, machine, rings):
    import platform
    import types

    from aiorl.config.checks import rings_supported
    from aiorl.config.schema import ConfigError
    from aiorl.experiment.loading import load_config
    from aiorl.launch.local import LocalLauncher
    from aiorl.runtime import local_sockets
    from aiorl.runtime.transport import transport_of

    monkeypatch.setattr(platform, "machine", lambda: machine)
    assert rings_supported() is rings
    cfg = load_config(data={"algo": "random_agent", "cluster": {"transport": "auto"}})
    # A role the local launcher started: Unix sockets on, and rings only where the machine has them.
    env = LocalLauncher._unix_env(types.SimpleNamespace(cfg=cfg, coordinator_unix=None), {})
    assert env[local_sockets.ENV_ON] == "1"
    transport = transport_of(cfg, env)
    assert transport.unix_sockets and (transport.ring_bytes is not None) is rings
    assert transport.serve_args("/run/sock/memory-0")["rings"] is rings
    if rings:
        load_config(data={"algo": "random_agent", "cluster": {"transport": "shm"}})
    else:
        with pytest.raises(ConfigError) as info:
            load_config(data={"algo": "random_agent", "cluster": {"transport": "shm"}})
        assert str(info.value) == (
            f"cluster.transport: 'shm' needs an x86-64 machine (its rings rely on that store order), this one "
            f"is {machine!r} (set transport to 'auto' or 'tcp')"
        )


async def test_a_byte_on_a_ring_connections_socket_ends_that_connection(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="aiorl.wire")
    server, recorder, conn = await server_and_client(tmp_path, "shm")
    try:
        await conn.request("q", {}, timeout_s=HANG_S)
        conn._proto.transport.get_extra_info("socket").send(b"x")  # the socket is for liveness only
        await until(lambda: recorder.ended)
        assert "unexpected bytes on a ring connection's socket" in str(recorder.ended[0])
    finally:
        conn.abort()
        await server.close()


async def test_a_ring_peer_of_another_uid_gets_no_ring(tmp_path):
    from test_sockets import connect_as

    directory = tempfile.mkdtemp(prefix="aiorl-uid-", dir="/tmp")  # tmp_path's parents are 0700
    try:
        server = await serve(
            Recorder().handler, token=TOKEN, name="s", unix_path=os.path.join(directory, "s"), rings=True
        )
        try:
            os.chmod(directory, 0o755)
            os.chmod(server.ring_path, 0o666)
            # 0: hung up without a byte (no hand-over, no descriptors); 2 would be an offer.
            assert await asyncio.to_thread(connect_as, 65534, server.ring_path) == 0
            assert server.stats["refused_uid"] == 1
            conn = await connect("", 0, token=TOKEN, name="same-uid", ring_path=server.ring_path)
            assert (await conn.request("q", {}, timeout_s=HANG_S)).meta == {"n": 1}
            await conn.close()
        finally:
            await server.close()
    finally:
        shutil.rmtree(directory)
