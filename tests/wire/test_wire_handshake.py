"""The handshake state machine without sockets, and the server's connection caps with them.

`Handshake` is driven frame by frame: bytes in, events out. The socket tests
at the end check what only a real connection shows: a client that got a
bogus server MAC sends nothing more, and the caps refuse with a "busy" REJECT.
"""

from __future__ import annotations

import asyncio
import logging

import msgpack
import pytest

from aiorl.core.ratelog import RateLimitedLog
from aiorl.wire import AuthError, Limits, ProtocolError, ServerBusy, connect, generate_token, serve
from aiorl.wire.auth import (
    ClientProved,
    Established,
    Failed,
    Handshake,
    Send,
    State,
    handshake_frame,
    mac,
    new_nonce,
)
from aiorl.wire.codec import FIXED, FIXED_SIZE, PROTOCOL_VERSION, FrameType
from aiorl.wire.names import is_peer_name, safe_text
from aiorl.wire.protocol import WireProtocol

TOKEN = generate_token()
HANG_S = 30.0  # only bounds a hang


def frames(data: bytes) -> list[tuple[int, dict]]:
    """Split handshake bytes into (frame type, meta)."""
    out = []
    while data:
        _, _, ftype, _, _, meta_len, _, _ = FIXED.unpack_from(data)
        out.append((ftype, msgpack.unpackb(data[FIXED_SIZE : FIXED_SIZE + meta_len])))
        data = data[FIXED_SIZE + meta_len :]
    return out


def sent(events) -> bytes:
    return b"".join(e.data for e in events if isinstance(e, Send))


def pair(client_token=TOKEN, server_token=TOKEN):
    return (
        Handshake(client=True, token=client_token, name="actor-0"),
        Handshake(client=False, token=server_token, name="memory-0"),
    )


def run_to_proof(client, server):
    """HELLO -> CHALLENGE -> AUTH; returns the server's events on AUTH."""
    challenge = sent(server.receive(client.start()))
    auth = sent(client.receive(challenge))
    return server.receive(auth)


def test_handshake_completes_and_each_side_learns_the_other():
    client, server = pair()
    events = run_to_proof(client, server)
    assert events == [ClientProved("actor-0")] and server.state is State.DECIDING
    welcome, established = server.accept()
    assert isinstance(welcome, Send) and established == Established("actor-0", b"")
    assert client.receive(welcome.data) == [Established("memory-0", b"")]
    assert client.state is server.state is State.ESTABLISHED


def test_bytes_behind_the_last_frame_come_back_as_rest_and_fragments_are_fine():
    client, server = pair()
    hello = client.start()
    events = []
    for i in range(len(hello)):  # one byte at a time
        events += server.receive(hello[i : i + 1])
    challenge = sent(events)
    assert [f for f, _ in frames(challenge)] == [FrameType.CHALLENGE]
    events = run_to_proof_rest(client, server, challenge)
    welcome, _ = server.accept()
    assert client.receive(welcome.data + b"first frame") == [Established("memory-0", b"first frame")]
    assert events == [ClientProved("actor-0")]


def run_to_proof_rest(client, server, challenge):
    return server.receive(sent(client.receive(challenge)))


def test_the_server_gives_no_mac_before_the_client_proved():
    """An attacker without the token gets nothing computed under it: no offline guessing oracle."""
    server = Handshake(client=False, token=TOKEN, name="memory-0")
    nonce = new_nonce()
    out = sent(server.receive(handshake_frame(FrameType.HELLO, {"name": "spy", "nonce": nonce})))
    ((ftype, meta),) = frames(out)
    assert ftype == FrameType.CHALLENGE and set(meta) == {"name", "nonce"}
    # Whatever MAC it would send later is nowhere in what it sent so far.
    for direction in (b"server", b"client"):
        assert mac(TOKEN, direction, PROTOCOL_VERSION, nonce, meta["nonce"], "spy", "memory-0") not in out
    # A guessed proof is refused, with a REJECT that carries no MAC either.
    events = server.receive(handshake_frame(FrameType.AUTH, {"mac": b"\0" * 32}))
    (failed,) = events
    assert isinstance(failed, Failed) and isinstance(failed.error, AuthError)
    ((ftype, meta),) = frames(failed.reply)
    assert ftype == FrameType.REJECT and meta["code"] == "auth" and set(meta) == {"code", "reason"}
    assert server.receive(b"more") == [] and server.state is State.FAILED


def test_the_client_checks_the_servers_mac_and_then_says_nothing():
    client = Handshake(client=True, token=TOKEN, name="actor-0")
    client.start()
    auth = sent(client.receive(handshake_frame(FrameType.CHALLENGE, {"name": "memory-0", "nonce": new_nonce()})))
    assert [f for f, _ in frames(auth)] == [FrameType.AUTH]
    (failed,) = client.receive(handshake_frame(FrameType.WELCOME, {"mac": b"\1" * 32}))
    assert isinstance(failed, Failed) and isinstance(failed.error, AuthError)
    assert failed.reply == b"" and client.state is State.FAILED


def test_a_wrong_token_is_caught_by_the_server_before_it_proves_anything():
    client, server = pair(client_token=generate_token())
    (failed,) = run_to_proof(client, server)
    assert isinstance(failed, Failed) and "does not hold the cluster token" in str(failed.error)
    (client_failed,) = client.receive(failed.reply)
    assert isinstance(client_failed.error, AuthError) and "authentication failed" in str(client_failed.error)
    # (A server without the token that skips the check is caught by the client: the bogus-MAC tests.)


def test_refuse_sends_busy_and_the_client_raises_server_busy():
    client, server = pair()
    run_to_proof(client, server)
    (failed,) = server.refuse("busy", "server busy: 3 connections open")
    (client_failed,) = client.receive(failed.reply)
    assert isinstance(client_failed.error, ServerBusy) and isinstance(client_failed.error, OSError)
    assert "3 connections open" in str(client_failed.error)


FORGED = "actor-0\n2026-01-01 00:00:00 memory-0 INFO aiorl.coordinator: all good\x1b[2J"


@pytest.mark.parametrize("name", [FORGED, "", "-x", "a" * 65, "a b", "ünï", "name\x00", 7, None, b"actor-0"])
def test_bad_peer_names_are_refused_and_never_echoed_raw(name):
    server = Handshake(client=False, token=TOKEN, name="memory-0")
    (failed,) = server.receive(handshake_frame(FrameType.HELLO, {"name": name, "nonce": new_nonce()}))
    assert isinstance(failed.error, ProtocolError) and "bad peer name" in str(failed.error)
    text = str(failed.error) + frames(failed.reply)[0][1]["reason"]
    assert "\n" not in text and "\x1b" not in text and "\x00" not in text
    assert server.peer_name is None


def test_names_and_safe_text():
    assert all(is_peer_name(n) for n in ("actor-0", "learner-12", "a", "node.b_1", "x" * 64))
    assert not any(is_peer_name(n) for n in ("", "x" * 65, "a\n", "é", " a", "_a"))
    assert safe_text("ok line") == "ok line"
    assert safe_text("a\nb\x1b[0m\u202e") == "a\\nb\\x1b[0m\\u202e"
    assert safe_text("x" * 300, 10) == "x" * 10 + "..."
    with pytest.raises(ValueError, match="not a valid peer name"):
        Handshake(client=True, token=TOKEN, name="bad name")


@pytest.mark.parametrize(
    "data, match",
    [
        (b"GET / HTTP/1.1\r\n\r\n", "bad magic"),
        (FIXED.pack(b"aiRL", PROTOCOL_VERSION + 1, 1, 0, 0, 0, 0, 0), "peer speaks protocol"),
        (FIXED.pack(b"aiRL", PROTOCOL_VERSION, FrameType.DATA, 0, 1, 1, 0, 0), "expected a handshake frame"),
        (FIXED.pack(b"aiRL", PROTOCOL_VERSION, 1, 0, 0, 0, 1 << 40, 0), "expected a handshake frame"),
        (FIXED.pack(b"aiRL", PROTOCOL_VERSION, 1, 0, 0, 5000, 0, 0), "expected a handshake frame"),
        (handshake_frame(FrameType.AUTH, {"mac": b"\0" * 32}), "unexpected handshake frame type 2"),
        (handshake_frame(FrameType.HELLO, {"name": "a", "nonce": b"short"}), "'nonce' must be 32 bytes"),
        (FIXED.pack(b"aiRL", PROTOCOL_VERSION, 1, 0, 0, 1, 0, 0) + b"\xc1", "undecodable"),
    ],
)
def test_server_refuses_malformed_first_frames(data, match):
    server = Handshake(client=False, token=TOKEN, name="memory-0")
    (failed,) = server.receive(data)
    assert isinstance(failed, Failed) and match in str(failed.error)
    assert frames(failed.reply)[0][0] == FrameType.REJECT


def test_rate_limited_log_counts_what_it_drops(caplog):
    now = [0.0]
    log = RateLimitedLog(logging.getLogger("aiorl.test"), burst=3, per_s=1.0, clock=lambda: now[0])
    caplog.set_level(logging.WARNING, logger="aiorl.test")
    results = [log("line %d", i) for i in range(10)]
    assert results == [True] * 3 + [False] * 7
    now[0] = 1.0
    assert log("line %d", 10)
    messages = [r.getMessage() for r in caplog.records]
    assert messages == ["line 0", "line 1", "line 2", "line 10 (and 7 similar lines not logged)"]
    assert log.total_suppressed == 7


# ---------------------------------------------------------------------- over sockets (or a fake transport)


class FakeTransport:
    """Just enough transport to drive a client WireProtocol by hand."""

    def __init__(self):
        self.written = bytearray()

    def get_extra_info(self, key, default=None):
        return {"peername": ("127.0.0.1", 9)}.get(key, default)

    def set_write_buffer_limits(self, high=None, low=None):
        pass

    def write(self, data):
        self.written += data

    def is_closing(self):
        return False

    def close(self):
        pass

    abort = close


async def test_client_sends_nothing_after_a_bogus_server_mac():
    """A client that stopped checking the server's MAC would send its first frame here."""
    received = bytearray()
    after_auth = asyncio.Event()
    closed = asyncio.Event()

    async def fake_server(reader, writer):
        hello = await reader.readexactly(FIXED_SIZE)
        await reader.readexactly(FIXED.unpack_from(hello)[5])
        writer.write(handshake_frame(FrameType.CHALLENGE, {"name": "memory-0", "nonce": new_nonce()}))
        head = await reader.readexactly(FIXED_SIZE)
        assert FIXED.unpack_from(head)[2] == FrameType.AUTH
        await reader.readexactly(FIXED.unpack_from(head)[5])
        writer.write(handshake_frame(FrameType.WELCOME, {"mac": b"\x42" * 32}))  # not under the token
        after_auth.set()
        received.extend(await reader.read())  # everything until the client hangs up
        closed.set()
        writer.close()

    fake = await asyncio.start_server(fake_server, "127.0.0.1", 0)
    try:
        with pytest.raises(AuthError, match="could not prove it holds the cluster token"):
            conn = await connect("127.0.0.1", fake.sockets[0].getsockname()[1], token=TOKEN, name="actor-0")
            await conn.send("batch", {"seq": 0})  # only reached if the check is gone
            await conn.close()
        async with asyncio.timeout(HANG_S):
            await closed.wait()
    finally:
        fake.close()
        await fake.wait_closed()
    assert after_auth.is_set() and bytes(received) == b""


async def test_per_host_handshake_cap_refuses_then_recovers():
    async def handler(conn):
        async for msg in conn:
            await conn.reply(msg)

    # Peers that have talked (a HELLO) and are still young keep their slots; a silent one
    # would give its slot up to the newcomer (tests/wire/test_sockets.py).
    server = await serve(
        handler,
        token=TOKEN,
        name="s",
        max_handshakes_per_host=2,
        handshake_timeout_s=HANG_S,
        first_bytes_timeout_s=HANG_S,
    )
    idle = [await asyncio.open_connection("127.0.0.1", server.port) for _ in range(2)]
    for _, writer in idle:
        writer.write(handshake_frame(FrameType.HELLO, {"name": "idle", "nonce": new_nonce()}))
    try:
        async with asyncio.timeout(HANG_S):
            while len(server._handshaking) < 2 or any(p.silent for p in server._handshaking):
                await asyncio.sleep(0.002)
        with pytest.raises(ServerBusy, match="handshakes in progress from 127.0.0.1"):
            await connect("127.0.0.1", server.port, token=TOKEN, name="c")
        assert server.stats["refused_busy"] == 1
    finally:
        for _, writer in idle:
            writer.close()
    async with asyncio.timeout(HANG_S):
        while server._handshaking:
            await asyncio.sleep(0.002)
    conn = await connect("127.0.0.1", server.port, token=TOKEN, name="c")
    assert (await conn.request("ping", timeout_s=HANG_S)).kind == "ok"
    await conn.close()
    await server.close()


async def test_authenticated_connection_cap():
    async def handler(conn):
        async for _ in conn:
            pass

    server = await serve(handler, token=TOKEN, name="s", max_connections=2)
    conns = [await connect("127.0.0.1", server.port, token=TOKEN, name=f"c{i}") for i in range(2)]
    try:
        with pytest.raises(ServerBusy, match="2 connections open"):
            await connect("127.0.0.1", server.port, token=TOKEN, name="c2")
    finally:
        for conn in conns:
            await conn.close()
    async with asyncio.timeout(HANG_S):
        while server.connections:
            await asyncio.sleep(0.002)
    conn = await connect("127.0.0.1", server.port, token=TOKEN, name="c2")
    await conn.close()
    await server.close()


async def test_forged_name_reaches_no_log_line(caplog):
    caplog.set_level(logging.DEBUG)

    async def handler(conn):
        raise AssertionError("a refused peer reached the handler")

    server = await serve(handler, token=TOKEN, name="s")
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    try:
        writer.write(handshake_frame(FrameType.HELLO, {"name": FORGED, "nonce": new_nonce()}))
        async with asyncio.timeout(HANG_S):
            answer = await reader.read()
    finally:
        writer.close()
        await server.close()
    assert b"bad peer name" in answer
    text = "".join(r.getMessage() for r in caplog.records)
    assert "bad peer name" in text and "\n" not in text and "\x1b" not in text and "all good" not in text.split("'")[0]


@pytest.mark.parametrize("host, warned", [("127.0.0.1", False), ("0.0.0.0", True)])
async def test_listening_beyond_loopback_without_tls_warns(caplog, host, warned):
    caplog.set_level(logging.WARNING, logger="aiorl.wire")

    async def handler(conn):
        pass

    server = await serve(handler, host=host, token=TOKEN, name="s")
    await server.close()
    assert any("without TLS" in r.getMessage() for r in caplog.records) == warned


async def test_bytes_handed_over_after_a_reset_are_ignored(caplog):
    """A transport may hand over a read after it reported the connection lost (a reset):
    the failed handshake must stay failed, with no internal error."""
    caplog.set_level(logging.DEBUG, logger="aiorl.wire")
    proto = WireProtocol(
        server=False, token=TOKEN, name="actor-0", limits=Limits(), recv_queue_size=4, handshake_timeout_s=HANG_S
    )
    proto.connection_made(FakeTransport())
    server = Handshake(client=False, token=TOKEN, name="memory-0")
    (challenge,) = server.receive(bytes(proto.transport.written))

    def feed(data: bytes) -> None:
        buf = proto.get_buffer(-1)
        buf[: len(data)] = data
        proto.buffer_updated(len(data))

    hello_len = len(proto.transport.written)
    feed(challenge.data)  # the client answers with its AUTH...
    assert server.receive(bytes(proto.transport.written[hello_len:])) == [ClientProved("actor-0")]
    welcome, _ = server.accept()
    proto.connection_lost(ConnectionResetError(104, "Connection reset by peer"))  # ...then a reset
    feed(welcome.data)  # a valid WELCOME, read before the reset
    assert isinstance(proto.handshake_done.exception(), ConnectionResetError)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


async def test_a_welcome_after_connect_gave_up_is_ignored(caplog):
    """connect() aborts a handshake that ran past its timeout; a WELCOME read just after must not
    complete it (the future is cancelled) or log an internal error."""
    caplog.set_level(logging.DEBUG, logger="aiorl.wire")
    proto = WireProtocol(
        server=False, token=TOKEN, name="actor-0", limits=Limits(), recv_queue_size=4, handshake_timeout_s=HANG_S
    )
    transport = FakeTransport()
    proto.connection_made(transport)
    server = Handshake(client=False, token=TOKEN, name="memory-0")
    (challenge,) = server.receive(bytes(transport.written))
    hello_len = len(transport.written)
    buf = proto.get_buffer(-1)
    buf[: len(challenge.data)] = challenge.data
    proto.buffer_updated(len(challenge.data))
    server.receive(bytes(transport.written[hello_len:]))
    welcome, _ = server.accept()
    proto.abort()  # what connect() does on its timeout
    buf = proto.get_buffer(-1)
    buf[: len(welcome.data)] = welcome.data
    proto.buffer_updated(len(welcome.data))
    assert proto.handshake_done.cancelled() and not proto._authenticated
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
