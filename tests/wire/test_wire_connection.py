"""Connection behaviour over real loopback sockets: messages, requests, flow control, closing, TLS."""

from __future__ import annotations

import asyncio
import logging
import socket
import struct

import numpy as np
import pytest

from aiorl.wire import (
    PROTOCOL_VERSION,
    AuthError,
    ConnectionClosed,
    Limits,
    ProtocolError,
    RemoteError,
    connect,
    generate_token,
    serve,
)
from aiorl.wire.codec import Encoder, FrameType
from aiorl.wire.tls import client_context, generate_self_signed, server_context

TOKEN = generate_token()
HANG_S = 20.0  # only bounds a hang; nothing asserts on time


async def answer(conn, msg) -> None:
    try:
        if msg.kind == "fail":
            await conn.reply_error(msg, f"cannot {msg.meta['what']}")
        elif msg.kind == "slow":
            await asyncio.sleep(msg.meta["delay_s"])
            await conn.reply(msg, "late", msg.meta)
        elif msg.kind == "mute":
            pass  # never answered
        else:
            await conn.reply(msg, "echo", msg.meta, msg.arrays)
    except ConnectionClosed:
        pass


class EchoServer:
    """Answers requests (concurrently) and records data messages per peer name."""

    def __init__(self) -> None:
        self.data: dict[str, list] = {}
        self.handled = 0

    async def handler(self, conn) -> None:
        self.handled += 1
        async with asyncio.TaskGroup() as tasks:
            async for msg in conn:
                if msg.request_id is None:
                    self.data.setdefault(conn.peer_name, []).append(msg)
                else:
                    tasks.create_task(answer(conn, msg))


@pytest.fixture
async def echo():
    state = EchoServer()
    server = await serve(state.handler, token=TOKEN, name="echo")
    try:
        yield server, state
    finally:
        await server.close()


@pytest.fixture
async def client(echo):
    server, _ = echo
    conn = await connect("127.0.0.1", server.port, token=TOKEN, name="client-0")
    try:
        yield conn
    finally:
        conn.abort()
        await conn.wait_closed()


async def wait_until(predicate, what: str) -> None:
    async with asyncio.timeout(HANG_S):
        while not predicate():
            await asyncio.sleep(0.005)


async def test_messages_and_requests_round_trip(echo, client):
    server, state = echo
    assert server.host == "127.0.0.1" and server.port > 0
    assert client.peer == f"127.0.0.1:{server.port}" and client.peer_name == "echo"
    sent = []
    for i in range(20):
        arrays = {"obs": np.full((i, 4), i, np.float32), "big": np.full(40_000, i, np.int64)}
        sent.append(arrays)
        await client.send("batch", {"seq": i, "actor": "a"}, arrays)
    reply = await client.request("ping", {"x": [1, 2.5, None, b"\x00"]}, {"v": np.arange(7)}, timeout_s=HANG_S)
    assert reply.kind == "echo" and reply.meta == {"x": [1, 2.5, None, b"\x00"]}
    np.testing.assert_array_equal(reply.arrays["v"], np.arange(7))
    assert reply.request_id is not None and "echo" in repr(reply) and "v:int64[7]" in repr(reply)
    await wait_until(lambda: len(state.data.get("client-0", ())) == 20, "data messages")
    got = state.data["client-0"]
    assert [m.meta["seq"] for m in got] == list(range(20))
    for msg, arrays in zip(got, sent):
        assert msg.kind == "batch" and msg.request_id is None
        for name in arrays:
            np.testing.assert_array_equal(msg.arrays[name], arrays[name])
    (peer,) = server.connections
    assert (
        peer.peer_name == "client-0"
        and peer.peer == "127.0.0.1:%d" % client._proto.transport.get_extra_info("sockname")[1]
    )


async def test_concurrent_requests_get_their_own_replies(client):
    delays = np.random.default_rng(1).uniform(0, 0.05, 40)

    async def one(i):
        reply = await client.request("slow", {"i": i, "delay_s": float(delays[i])}, timeout_s=HANG_S)
        return reply.meta["i"]

    assert await asyncio.gather(*(one(i) for i in range(40))) == list(range(40))


async def test_timeout_then_late_reply_is_dropped(client):
    with pytest.raises(TimeoutError, match="'slow'.*no reply within"):
        await client.request("slow", {"delay_s": 0.2}, timeout_s=0.01)
    # A later request whose reply comes after the late one: the late reply went nowhere.
    reply = await client.request("slow", {"delay_s": 0.4, "n": 2}, timeout_s=HANG_S)
    assert reply.meta["n"] == 2
    assert len(client._proto._queue) == 0 and not client._proto._pending


async def test_remote_error(client):
    with pytest.raises(RemoteError, match="cannot fly") as info:
        await client.request("fail", {"what": "fly"}, timeout_s=HANG_S)
    assert info.value.reason == "cannot fly"
    assert (await client.request("ok", timeout_s=HANG_S)).kind == "echo"


async def test_reply_needs_a_request(echo):
    server, _ = echo
    seen = asyncio.get_running_loop().create_future()

    async def handler(conn):
        msg = await conn.recv()
        try:
            await conn.reply(msg)
        except ValueError as exc:
            seen.set_result(str(exc))

    async with await serve(handler, token=TOKEN, name="s") as other:
        conn = await connect("127.0.0.1", other.port, token=TOKEN, name="c")
        await conn.send("data")
        assert "not a request" in await asyncio.wait_for(seen, HANG_S)
        await conn.close()


@pytest.mark.parametrize("how", ["close", "reset"])
async def test_losing_the_connection_fails_every_pending_request(how):
    got = asyncio.Event()

    async def handler(conn):
        for _ in range(5):
            await conn.recv()
        got.set()
        if how == "reset":  # RST instead of FIN
            sock = conn._proto.transport.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            conn.abort()
        else:
            await conn.close()

    async with await serve(handler, token=TOKEN, name="s") as server:
        conn = await connect("127.0.0.1", server.port, token=TOKEN, name="c")
        pending = [asyncio.create_task(conn.request("mute", {"i": i}, timeout_s=HANG_S)) for i in range(5)]
        results = await asyncio.gather(*pending, return_exceptions=True)
        assert got.is_set()
        assert all(isinstance(r, ConnectionClosed) for r in results), results
        if how == "reset":
            assert all(isinstance(r.cause, ConnectionResetError) for r in results)
        else:
            assert all(r.cause is None for r in results)
        with pytest.raises(ConnectionClosed):
            await conn.request("late", timeout_s=HANG_S)
        with pytest.raises(ConnectionClosed):
            await conn.send("late")
        assert conn.closed


async def test_async_for_ends_quietly_on_clean_close_and_recv_keeps_raising(echo):
    server, _ = echo
    done = asyncio.get_running_loop().create_future()

    async def handler(conn):
        got = [msg.meta["i"] async for msg in conn]
        with pytest.raises(ConnectionClosed) as first:
            await conn.recv()
        with pytest.raises(ConnectionClosed):
            await conn.recv()
        done.set_result((got, first.value.cause))

    async with await serve(handler, token=TOKEN, name="s") as other:
        conn = await connect("127.0.0.1", other.port, token=TOKEN, name="c")
        for i in range(3):
            await conn.send("x", {"i": i})
        await conn.close()
        assert conn.closed
        assert await asyncio.wait_for(done, HANG_S) == ([0, 1, 2], None)


async def test_close_flushes_everything_queued():
    got = []
    finished = asyncio.Event()

    async def handler(conn):
        async for msg in conn:
            got.append((msg.meta["i"], int(msg.arrays["x"][0]), int(msg.arrays["x"][-1])))
        finished.set()

    async with await serve(handler, token=TOKEN, name="s") as server:
        conn = await connect("127.0.0.1", server.port, token=TOKEN, name="c")
        for i in range(100):
            await conn.send("x", {"i": i}, {"x": np.full(64 * 1024, i, np.int32)})
        await conn.close()
        async with asyncio.timeout(HANG_S):
            await finished.wait()
    assert got == [(i, i, i) for i in range(100)]


async def test_flush_delay_holds_small_messages_for_one_write_and_close_flushes_them():
    got = []
    finished = asyncio.Event()

    async def handler(conn):
        async for msg in conn:
            got.append(msg.meta["i"])
        finished.set()

    async with await serve(handler, token=TOKEN, name="s") as server:
        conn = await connect("127.0.0.1", server.port, token=TOKEN, name="c")
        conn.flush_delay_s = 3600.0  # far longer than the test: only close() can send them
        for i in range(5):
            await conn.send("x", {"i": i}, {"x": np.arange(16)})
        await asyncio.sleep(0.05)  # loop iterations that would have flushed without the delay
        proto = conn._proto
        assert len(proto._out) >= 5 and proto._out_bytes > 0 and proto._flush_handle is not None
        await conn.close()
        async with asyncio.timeout(HANG_S):
            await finished.wait()
    assert got == [0, 1, 2, 3, 4]


async def test_flush_delay_sends_after_the_delay(echo, client):
    server, state = echo
    client.flush_delay_s = 0.001
    for i in range(3):
        await client.send("x", {"i": i})
    async with asyncio.timeout(HANG_S):
        while len(state.data.get("client-0", [])) < 3:
            await asyncio.sleep(0.001)
    assert [m.meta["i"] for m in state.data["client-0"]] == [0, 1, 2]


@pytest.mark.parametrize("bad", [-0.1, float("inf"), float("nan")])
async def test_flush_delay_rejects_bad_values(client, bad):
    with pytest.raises(ValueError, match="flush_delay_s"):
        client.flush_delay_s = bad


async def test_abort_and_wait_closed(client):
    assert not client.closed
    client.abort()
    await client.wait_closed()
    assert client.closed
    with pytest.raises(ConnectionClosed):
        await client.recv()


async def test_concurrent_senders_never_interleave_frames(echo, client):
    server, state = echo
    sizes = [3, 100, 5000, 40_000, 300_000]

    async def sender(k):
        for i in range(30):
            n = sizes[(k + i) % len(sizes)]
            await client.send(
                "part", {"k": k, "i": i}, {"a": np.full(n, k * 1000 + i, np.int32), "b": np.full(7, k, np.uint8)}
            )

    await asyncio.gather(*(sender(k) for k in range(8)))
    await wait_until(lambda: len(state.data.get("client-0", ())) == 240, "all parts")
    order: dict[int, list[int]] = {}
    for msg in state.data["client-0"]:
        k, i = msg.meta["k"], msg.meta["i"]
        order.setdefault(k, []).append(i)
        assert len(msg.arrays["a"]) == sizes[(k + i) % len(sizes)]
        assert (msg.arrays["a"] == k * 1000 + i).all() and (msg.arrays["b"] == k).all()
    assert order == {k: list(range(30)) for k in range(8)}


async def test_backpressure_pauses_reading_and_blocks_the_sender():
    release = asyncio.Event()
    received = []
    server_conn = []

    async def handler(conn):
        server_conn.append(conn)
        await release.wait()
        async for msg in conn:
            received.append((msg.meta["i"], int(msg.arrays["x"][0])))

    async with await serve(handler, token=TOKEN, name="s", recv_queue_size=2) as server:
        conn = await connect("127.0.0.1", server.port, token=TOKEN, name="c")
        sent = []

        async def produce():
            for i in range(64):
                await conn.send("x", {"i": i}, {"x": np.full(1 << 18, i, np.float32)})  # 1 MiB each
                sent.append(i)

        producer = asyncio.create_task(produce())
        try:
            await wait_until(lambda: server_conn and server_conn[0]._proto._reading_paused, "reader paused")
            await wait_until(lambda: conn._proto._writing_paused, "sender blocked in drain")
            assert not producer.done()
            proto = server_conn[0]._proto
            assert len(proto._queue) == 2 and not proto._overflow
            assert len(proto._stage) < 2 << 20  # all the reader holds besides the queue
            assert len(sent) < 64
            release.set()
            async with asyncio.timeout(HANG_S):
                await producer
            await conn.close()
            await wait_until(lambda: len(received) == 64, "everything")
        finally:
            producer.cancel()
            conn.abort()
    assert received == [(i, i) for i in range(64)]


async def test_cancelled_recv_loses_nothing_and_concurrent_recv_splits_messages():
    peers = []
    done = asyncio.Event()

    async def handler(conn):  # the test drives this connection's recv() itself
        peers.append(conn)
        await done.wait()

    async with await serve(handler, token=TOKEN, name="s") as server:
        client = await connect("127.0.0.1", server.port, token=TOKEN, name="c")
        await wait_until(lambda: peers, "handler")
        peer = peers[0]
        waiter = asyncio.create_task(peer.recv())
        await asyncio.sleep(0)
        waiter.cancel()
        await client.send("one")
        assert (await asyncio.wait_for(peer.recv(), HANG_S)).kind == "one"
        receivers = [asyncio.create_task(peer.recv()) for _ in range(3)]
        await asyncio.sleep(0)
        for k in ("a", "b", "c"):
            await client.send(k)
        kinds = sorted(m.kind for m in await asyncio.wait_for(asyncio.gather(*receivers), HANG_S))
        assert kinds == ["a", "b", "c"]
        # Every task waiting in recv() learns that the connection ended.
        receivers = [asyncio.create_task(peer.recv()) for _ in range(3)]
        await asyncio.sleep(0)
        await client.close()
        results = await asyncio.wait_for(asyncio.gather(*receivers, return_exceptions=True), HANG_S)
        assert all(isinstance(r, ConnectionClosed) and r.cause is None for r in results), results
        done.set()


async def test_handler_errors_are_logged_and_close_only_that_connection(caplog):
    async def handler(conn):
        msg = await conn.recv()
        if msg.kind == "boom":
            raise ValueError("handler exploded")
        await conn.reply(await conn.recv(), "fine")

    caplog.set_level(logging.WARNING, logger="aiorl.wire")
    async with await serve(handler, token=TOKEN, name="s") as server:
        good = await connect("127.0.0.1", server.port, token=TOKEN, name="good")
        bad = await connect("127.0.0.1", server.port, token=TOKEN, name="bad")
        await bad.send("boom")
        async with asyncio.timeout(HANG_S):
            assert [m async for m in bad] == []  # closed by the server after the handler raised
        await good.send("hello")
        assert (await good.request("q", timeout_s=HANG_S)).kind == "fine"
        await good.close()
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "(bad) failed" in errors[0].getMessage()
    assert errors[0].exc_info[0] is ValueError


async def test_server_close_ends_connections_and_handlers():
    started = asyncio.Event()
    handler_done = asyncio.Event()

    async def handler(conn):
        started.set()
        try:
            async for _ in conn:
                pass
        finally:
            handler_done.set()

    server = await serve(handler, token=TOKEN, name="s")
    conn = await connect("127.0.0.1", server.port, token=TOKEN, name="c")
    async with asyncio.timeout(HANG_S):
        await started.wait()
        await server.close()
        await conn.wait_closed()
    assert handler_done.is_set() and not server.connections and not server._tasks
    with pytest.raises(OSError):
        await connect("127.0.0.1", server.port, token=TOKEN, name="c2", handshake_timeout_s=2)


async def test_wrong_token_is_refused_and_never_reaches_the_handler(echo, caplog):
    server, state = echo
    caplog.set_level(logging.DEBUG, logger="aiorl.wire")
    other = generate_token()
    with pytest.raises(AuthError, match="wrong token"):
        await connect("127.0.0.1", server.port, token=other, name="intruder")
    await wait_until(
        lambda: any("authentication failed" in r.getMessage() and "intruder" in r.getMessage() for r in caplog.records),
        "server-side log line",
    )
    assert state.handled == 0 and not server.connections
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert TOKEN.decode() not in text and other.decode() not in text


async def test_protocol_version_mismatch_is_clear_on_both_sides(echo, caplog):
    server, state = echo
    caplog.set_level(logging.WARNING, logger="aiorl.wire")
    # A client from the future talks to this server.
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    try:
        writer.write(
            Encoder(Limits(), version=PROTOCOL_VERSION + 1).handshake(
                FrameType.HELLO, {"name": "future", "nonce": b"n" * 32}
            )
        )
        async with asyncio.timeout(HANG_S):
            answer_bytes = await reader.read()  # a REJECT frame, then EOF
    finally:
        writer.close()
    assert f"peer speaks protocol {PROTOCOL_VERSION + 1}, this is {PROTOCOL_VERSION}".encode() in answer_bytes
    assert any(
        f"peer speaks protocol {PROTOCOL_VERSION + 1}, this is {PROTOCOL_VERSION}" in r.getMessage()
        for r in caplog.records
    )

    # This client talks to a server from the future.
    async def future_server(reader, writer):
        await reader.read(100)
        writer.write(
            Encoder(Limits(), version=PROTOCOL_VERSION + 1).handshake(
                FrameType.HELLO, {"name": "future", "nonce": b"n" * 32, "mac": b"m" * 32}
            )
        )
        await reader.read()
        writer.close()

    fake = await asyncio.start_server(future_server, "127.0.0.1", 0)
    try:
        with pytest.raises(
            ProtocolError, match=f"peer speaks protocol {PROTOCOL_VERSION + 1}, this is {PROTOCOL_VERSION}"
        ):
            await connect("127.0.0.1", fake.sockets[0].getsockname()[1], token=TOKEN, name="c")
    finally:
        fake.close()
        await fake.wait_closed()
    assert state.handled == 0


async def test_client_handshake_timeout():
    async def silent(reader, writer):
        await reader.read()
        writer.close()

    fake = await asyncio.start_server(silent, "127.0.0.1", 0)
    try:
        with pytest.raises(TimeoutError, match="no completed handshake"):
            await connect("127.0.0.1", fake.sockets[0].getsockname()[1], token=TOKEN, name="c", handshake_timeout_s=0.2)
    finally:
        fake.close()
        await fake.wait_closed()


def test_stock_asyncio_loop_works_too():
    async def main():
        state = EchoServer()
        async with await serve(state.handler, token=TOKEN, name="echo") as server:
            conn = await connect("127.0.0.1", server.port, token=TOKEN, name="c")
            big = np.arange(5 << 20, dtype=np.uint8)  # 5 MiB: the chunked write path
            for i in range(3):
                await conn.send("big", {"i": i}, {"x": big})
            reply = await conn.request("echo", {}, {"x": big[:1000]}, timeout_s=HANG_S)
            np.testing.assert_array_equal(reply.arrays["x"], big[:1000])
            await conn.close()
            await wait_until(lambda: len(state.data.get("c", ())) == 3, "big messages")
            for msg in state.data["c"]:
                np.testing.assert_array_equal(msg.arrays["x"], big)
        return type(asyncio.get_running_loop()).__module__

    with asyncio.Runner(loop_factory=asyncio.SelectorEventLoop) as runner:
        assert runner.run(main()).startswith("asyncio")


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    directory = tmp_path_factory.mktemp("tls")
    return generate_self_signed(directory, "server"), generate_self_signed(directory, "client")


async def test_tls_round_trip(certs):
    (cert, key), _ = certs
    state = EchoServer()
    async with await serve(state.handler, token=TOKEN, name="echo", ssl=server_context(cert, key)) as server:
        conn = await connect("127.0.0.1", server.port, token=TOKEN, name="c", ssl=client_context(cert))
        assert conn._proto.transport.get_extra_info("ssl_object") is not None
        big = np.random.default_rng(0).integers(0, 255, 3 << 20, dtype=np.uint8)
        reply = await conn.request("echo", {"k": 1}, {"x": big}, timeout_s=HANG_S)
        np.testing.assert_array_equal(reply.arrays["x"], big)
        await conn.close()
    # A client that does not trust the certificate never gets to the handshake.
    async with await serve(state.handler, token=TOKEN, name="echo", ssl=server_context(cert, key)) as server:
        with pytest.raises(OSError):
            await connect("127.0.0.1", server.port, token=TOKEN, name="c", ssl=client_context(certs[1][0]))
    assert state.handled == 1


async def test_tls_client_certificates_when_required(certs):
    (cert, key), (client_cert, client_key) = certs
    state = EchoServer()
    context = server_context(cert, key, client_cafile=client_cert)
    async with await serve(state.handler, token=TOKEN, name="echo", ssl=context) as server:
        conn = await connect(
            "127.0.0.1",
            server.port,
            token=TOKEN,
            name="c",
            ssl=client_context(cert, certfile=client_cert, keyfile=client_key),
        )
        assert (await conn.request("ping", timeout_s=HANG_S)).kind == "echo"
        await conn.close()
        with pytest.raises((OSError, ConnectionClosed)):
            await connect(
                "127.0.0.1", server.port, token=TOKEN, name="anonymous", ssl=client_context(cert), handshake_timeout_s=5
            )
    assert state.handled == 1


async def test_repr_shows_live_state(client, echo):
    server, _ = echo
    text = repr(client)
    assert "127.0.0.1" in text and "(echo)" in text and "open" in text
    assert "connections=1" in repr(server)
    client.abort()
    await client.wait_closed()
    assert "closed" in repr(client)


async def test_argument_checks():
    with pytest.raises(TypeError, match="token"):
        await connect("127.0.0.1", 1, token="text", name="c")
    with pytest.raises(ValueError, match="recv_queue_size"):
        await serve(lambda c: None, token=TOKEN, name="s", recv_queue_size=0)
