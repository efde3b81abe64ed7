"""One-way transport throughput over loopback: aiorl.wire against raw blocking sockets.

Two processes per measurement (a receiver and a sender, both spawned fresh);
the sender streams for at most ``--seconds`` and ``--max-messages``, then closes;
the receiver times from its first complete message to its last. Each case is
measured against a raw baseline in the same run: blocking ``socket.sendall``
of each message's bytes and ``recv_into`` until that message is complete
(the same bytes, the same two-process shape). Cases:

- ``cartpole64``: a 64-transition CartPole batch (obs, next_obs float32[64,4],
  actions int64[64], rewards float32[64], dones uint8[64]; 2880 bytes).
- ``1MiB`` / ``16MiB``: one float32 array per frame.

Transports: ``uvloop`` (the default), ``asyncio`` (stock loop), ``uvloop+tls``
and ``asyncio+tls`` (self-signed cert made with the openssl command), and
``raw+tls`` (blocking ``ssl`` sockets) as the TLS floor; ``uvloop+shm``: the same
connection over shared-memory rings (``aiorl.wire.shm``, what roles on one host use),
whose ratio to raw TCP is how much one host gains over the socket floor. Ratios are bytes/s
over the raw TCP baseline's bytes/s, each run against the baseline run just
before it (load on a shared machine drifts), medians over ``--repeat`` runs.
``cpu x raw`` is the same comparison for CPU time per message (user + system,
both processes), which depends less on how a busy machine schedules them.

    python bench/transport.py                 # full table, writes bench-transport.json
    python bench/transport.py --quick         # fewer/shorter runs
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import platform
import socket
import ssl
import statistics
import sys
import tempfile
import time
from pathlib import Path

# Before numpy loads: OpenBLAS worker threads spin for a while after start-up
# and steal CPU from the processes being measured (raw and wire alike).
import blas_one_thread  # noqa: F401
import common
import numpy as np

CASES = {
    "cartpole64": {"max_messages": 2_000_000},
    "1MiB": {"max_messages": 200_000},
    "16MiB": {"max_messages": 20_000},
}
TRANSPORTS = ("raw", "uvloop", "asyncio", "raw+tls", "uvloop+tls", "asyncio+tls", "uvloop+shm")
TARGETS = {
    ("1MiB", "uvloop"): 0.70,
    ("cartpole64", "uvloop"): 0.50,
    ("cartpole64", "uvloop+shm"): 2.0,
    ("1MiB", "uvloop+shm"): 3.0,
}
TOKEN = b"bench-token-0123456789abcdef0123"
PROCESS_TIMEOUT_S = 120.0


def make_arrays(case: str) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    if case == "cartpole64":
        return {
            "obs": rng.standard_normal((64, 4), dtype=np.float32),
            "next_obs": rng.standard_normal((64, 4), dtype=np.float32),
            "actions": rng.integers(0, 2, 64, dtype=np.int64),
            "rewards": np.ones(64, np.float32),
            "dones": (rng.random(64) < 0.05).astype(np.uint8),
        }
    size = {"1MiB": 1 << 20, "16MiB": 16 << 20}[case]
    return {"x": rng.standard_normal(size // 4, dtype=np.float32)}


def message_bytes(case: str) -> bytes:
    return b"".join(a.tobytes() for a in make_arrays(case).values())


# ---------------------------------------------------------------------- TLS


def tls_contexts(cert_dir: str) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    from aiorl.wire.tls import client_context, server_context

    cert, key = Path(cert_dir) / "aiorl.crt", Path(cert_dir) / "aiorl.key"
    return server_context(cert, key), client_context(cert)


# ---------------------------------------------------------------------- raw


def raw_receiver(case: str, tls_dir: str | None, conn) -> None:
    size = len(message_bytes(case))
    with socket.create_server(("127.0.0.1", 0)) as listener:
        conn.send(listener.getsockname()[1])
        sock, _ = listener.accept()
    if tls_dir:
        sock = tls_contexts(tls_dir)[0].wrap_socket(sock, server_side=True)
    buf = bytearray(size)
    view = memoryview(buf)
    count = 0
    first = last = 0.0
    cpu_first = 0.0
    with sock:
        while True:
            got = 0
            while got < size:
                n = sock.recv_into(view[got:])
                if not n:
                    break
                got += n
            if got < size:
                break
            last = time.perf_counter()
            if not count:
                first = last
                cpu_first = os.times()
            count += 1
    cpu_s = tuple(b - a for a, b in zip(cpu_first, os.times()))[:2]
    conn.send({"messages": count, "first": first, "last": last, "message_bytes": size, "cpu_s": cpu_s})


def raw_sender(case: str, tls_dir: str | None, port: int, seconds: float, max_messages: int, conn) -> None:
    data = message_bytes(case)
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if tls_dir:
        sock = tls_contexts(tls_dir)[1].wrap_socket(sock, server_hostname="127.0.0.1")
    deadline = time.perf_counter() + seconds
    cpu_start = os.times()
    with sock:
        for i in range(max_messages):
            sock.sendall(data)
            if not i & 15 and time.perf_counter() > deadline:
                break
    conn.send(tuple(b - a for a, b in zip(cpu_start, os.times()))[:2])


# ---------------------------------------------------------------------- aiorl.wire


def run_loop(loop_name: str, coro) -> None:
    if loop_name == "uvloop":
        import uvloop

        factory = uvloop.new_event_loop
    else:
        factory = asyncio.SelectorEventLoop
    with asyncio.Runner(loop_factory=factory) as runner:
        runner.run(coro)


def wire_receiver(case: str, loop_name: str, tls_dir: str | None, conn, rings: bool = False) -> None:
    from aiorl.wire import serve

    async def main() -> None:
        done = asyncio.get_running_loop().create_future()
        stats = {"messages": 0, "first": 0.0, "last": 0.0, "message_bytes": 0}

        async def handler(c) -> None:
            count = 0
            first = last = 0.0
            cpu_first = 0.0
            nbytes = 0
            async for msg in c:
                last = time.perf_counter()
                if not count:
                    first = last
                    cpu_first = os.times()
                    nbytes = sum(a.nbytes for a in msg.arrays.values())
                count += 1
            cpu_s = tuple(b - a for a, b in zip(cpu_first, os.times()))[:2]
            stats.update(messages=count, first=first, last=last, message_bytes=nbytes, cpu_s=cpu_s)
            done.set_result(None)

        ssl_ctx = tls_contexts(tls_dir)[0] if tls_dir else None
        with tempfile.TemporaryDirectory(prefix="aiorl-bench-shm-") as sock_dir:
            where = {}
            if rings:
                ring_bytes = int(os.environ.get("AIORL_BENCH_RING_BYTES", 0)) or None
                where = {"unix_path": os.path.join(sock_dir, "s"), "rings": True}
                if ring_bytes:
                    where["ring_bytes"] = ring_bytes
            async with await serve(handler, token=TOKEN, name="bench-receiver", ssl=ssl_ctx, **where) as server:
                conn.send(server.ring_path if rings else server.port)
                await asyncio.wait_for(done, PROCESS_TIMEOUT_S)
        conn.send(stats)

    run_loop(loop_name, main())


def wire_sender(
    case: str, loop_name: str, tls_dir: str | None, port: int, seconds: float, max_messages: int, conn
) -> None:
    from aiorl.wire import connect

    async def main() -> None:
        arrays = make_arrays(case)
        ssl_ctx = tls_contexts(tls_dir)[1] if tls_dir else None
        if isinstance(port, str):  # a ring listener's path
            wire = await connect("", 0, token=TOKEN, name="bench-sender", ring_path=port)
        else:
            wire = await connect("127.0.0.1", port, token=TOKEN, name="bench-sender", ssl=ssl_ctx)
        deadline = time.perf_counter() + seconds
        cpu_start = os.times()
        try:
            for i in range(max_messages):
                await wire.send("batch", None, arrays)
                if not i & 15 and time.perf_counter() > deadline:
                    break
        finally:
            await wire.close(timeout_s=30.0)
        conn.send(tuple(b - a for a, b in zip(cpu_start, os.times()))[:2])

    run_loop(loop_name, main())


# ---------------------------------------------------------------------- driver


def _recv_from(pipe, proc, timeout_s: float, what: str):
    """The next object on ``pipe``; fails fast if ``proc`` died, bounded by ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not pipe.poll(0.2):
        if not proc.is_alive() and not pipe.poll(0):
            raise RuntimeError(f"{what}: the process exited with code {proc.exitcode}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: nothing within {timeout_s:g}s")
    return pipe.recv()


def _cpu_per_message(run: dict) -> float:
    return sum(run["receiver_cpu_us_per_message"]) + sum(run["sender_cpu_us_per_message"])


def measure(case: str, transport: str, seconds: float, tls_dir: str) -> dict:
    ctx = mp.get_context("spawn")
    parent_end, child_end = ctx.Pipe()
    sender_parent, sender_child = ctx.Pipe()
    tls = tls_dir if transport.endswith("+tls") else None
    rings = transport.endswith("+shm")
    base = transport.removesuffix("+tls").removesuffix("+shm")
    max_messages = CASES[case]["max_messages"]
    if base == "raw":
        receiver = ctx.Process(target=raw_receiver, args=(case, tls, child_end))
    else:
        receiver = ctx.Process(target=wire_receiver, args=(case, base, tls, child_end, rings))
    receiver.start()
    sender = None
    try:
        port = _recv_from(parent_end, receiver, PROCESS_TIMEOUT_S, f"{case}/{transport}: the receiver's port")
        if base == "raw":
            sender = ctx.Process(target=raw_sender, args=(case, tls, port, seconds, max_messages, sender_child))
        else:
            sender = ctx.Process(target=wire_sender, args=(case, base, tls, port, seconds, max_messages, sender_child))
        sender.start()
        stats = _recv_from(parent_end, receiver, seconds + PROCESS_TIMEOUT_S, f"{case}/{transport}: the result")
        sender_cpu_s = _recv_from(sender_parent, sender, PROCESS_TIMEOUT_S, f"{case}/{transport}: sender CPU")
    finally:
        for proc in (sender, receiver):
            if proc is not None:
                proc.join(timeout=PROCESS_TIMEOUT_S)
                if proc.is_alive():
                    proc.terminate()
                    proc.join(timeout=10)
        for end in (parent_end, child_end, sender_parent, sender_child):
            end.close()
    elapsed = stats["last"] - stats["first"]
    n = stats["messages"] - 1  # rate between the first and the last message
    if n < 1 or elapsed <= 0:
        raise RuntimeError(f"{case}/{transport}: too few messages ({stats['messages']})")
    return {
        "messages": stats["messages"],
        "seconds": elapsed,
        "messages_per_s": n / elapsed,
        "bytes_per_s": n * stats["message_bytes"] / elapsed,
        "message_bytes": stats["message_bytes"],
        # CPU time per message while streaming, (user, system) microseconds
        "receiver_cpu_us_per_message": [t / stats["messages"] * 1e6 for t in stats["cpu_s"]],
        "sender_cpu_us_per_message": [t / stats["messages"] * 1e6 for t in sender_cpu_s],
    }


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, list[str], list[str]]:
    """The options, and the cases and transports to measure (raw first: every ratio is against it)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=2.0, help="streaming time per measurement")
    parser.add_argument("--repeat", type=int, default=3, help="alternating runs per case (median reported)")
    parser.add_argument("--quick", action="store_true", help="1 s runs, 1 repeat")
    parser.add_argument("--cases", default=",".join(CASES), help=f"comma list of {list(CASES)}")
    parser.add_argument("--transports", default=",".join(TRANSPORTS), help=f"comma list of {list(TRANSPORTS)}")
    parser.add_argument("--json", default="bench-transport.json", help="where to write the results")
    parser.add_argument(
        "--ring-bytes", type=int, default=0, help="bytes of each shared-memory ring (uvloop+shm; 0: the default)"
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.seconds, args.repeat = 1.0, 1
    cases = [c for c in args.cases.split(",") if c]
    transports = [t for t in args.transports.split(",") if t]
    for name in cases:
        if name not in CASES:
            parser.error(f"unknown case {name!r}")
    for name in transports:
        if name not in TRANSPORTS:
            parser.error(f"unknown transport {name!r}")
    if "raw" not in transports:
        transports.insert(0, "raw")
    return args, cases, transports


def measure_all(cases: list[str], transports: list[str], seconds: float, repeat: int) -> dict[str, dict[str, list]]:
    """Every case's runs by transport, the transports alternating so that drifting load hits all alike."""
    results: dict[str, dict[str, list[dict]]] = {c: {t: [] for t in transports} for c in cases}
    with tempfile.TemporaryDirectory(prefix="aiorl-bench-") as tls_dir:
        if any(t.endswith("+tls") for t in transports):
            from aiorl.wire.tls import generate_self_signed

            generate_self_signed(tls_dir)
        for case in cases:
            for rep in range(repeat):
                for transport in transports:
                    r = measure(case, transport, seconds, tls_dir)
                    results[case][transport].append(r)
                    print(
                        f"  {case:<11} {transport:<12} run {rep + 1}: {r['bytes_per_s'] / 1e9:7.3f} GB/s "
                        f"{r['messages_per_s']:>11,.0f} msg/s",
                        file=sys.stderr,
                        flush=True,
                    )
    return results


def table_row(case: str, transport: str, runs: list[dict], raw_runs: list[dict], raw_tls_runs) -> dict:
    # Each run is compared with the baseline run measured just before it,
    # so load that drifts over the benchmark cancels out; median over repeats.
    paired = [r["bytes_per_s"] / base["bytes_per_s"] for r, base in zip(runs, raw_runs)]
    paired_tls = (
        [r["bytes_per_s"] / base["bytes_per_s"] for r, base in zip(runs, raw_tls_runs)]
        if raw_tls_runs and transport.endswith("+tls")
        else None
    )
    mps = statistics.median(r["messages_per_s"] for r in runs)
    # CPU efficiency: both processes' CPU time per message, raw over this
    # (a second view that depends less on how the scheduler shares the cores).
    cpu_paired = [_cpu_per_message(base) / _cpu_per_message(r) for r, base in zip(runs, raw_runs)]
    return {
        "case": case,
        "transport": transport,
        "messages_per_s": mps,
        "transitions_per_s": mps * 64 if case == "cartpole64" else None,
        "gb_per_s": statistics.median(r["bytes_per_s"] for r in runs) / 1e9,
        "ratio_vs_raw": statistics.median(paired),
        "ratio_vs_raw_runs": paired,
        "ratio_vs_raw_tls": statistics.median(paired_tls) if paired_tls else None,
        "cpu_ratio_vs_raw": statistics.median(cpu_paired),
        "target": TARGETS.get((case, transport)),
        "runs": runs,
    }


def print_table(rows: list[dict]) -> list[dict]:
    """The table; the rows that missed their target."""
    print()
    header = (
        f"{'case':<11} {'transport':<12} {'msgs/s':>11} {'transitions/s':>14} {'GB/s':>7} {'x raw':>6} "
        f"{'x raw+tls':>9} {'cpu x raw':>9}  target"
    )
    print(header)
    print("-" * len(header))
    missed = []
    for row in rows:
        transitions = f"{row['transitions_per_s']:>14,.0f}" if row["transitions_per_s"] else f"{'':>14}"
        vs_tls = f"{row['ratio_vs_raw_tls']:>9.2f}" if row["ratio_vs_raw_tls"] is not None else f"{'':>9}"
        target = ""
        if row["target"] is not None:
            ok = row["ratio_vs_raw"] >= row["target"]
            target = f">= {row['target']:.2f} {'ok' if ok else 'MISSED'}"
            if not ok:
                missed.append(row)
        print(
            f"{row['case']:<11} {row['transport']:<12} {row['messages_per_s']:>11,.0f} {transitions} "
            f"{row['gb_per_s']:>7.3f} {row['ratio_vs_raw']:>6.2f} {vs_tls} {row['cpu_ratio_vs_raw']:>9.2f}  {target}"
        )
    return missed


def main(argv: list[str] | None = None) -> int:
    args, cases, transports = parse_args(argv)
    if args.ring_bytes:
        os.environ["AIORL_BENCH_RING_BYTES"] = str(args.ring_bytes)  # the spawned receivers read it
    results = measure_all(cases, transports, args.seconds, args.repeat)
    rows = [
        table_row(case, transport, results[case][transport], results[case]["raw"], results[case].get("raw+tls"))
        for case in cases
        for transport in transports
    ]
    missed = print_table(rows)
    report = {
        "benchmark": "transport",
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "seconds_per_run": args.seconds,
        "repeat": args.repeat,
        "rows": rows,
    }
    common.write_json(args.json, report, indent=2)
    print(f"\nwrote {args.json}")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
