"""Does lz4 compression of Atari frames pay on the actor -> memory wire? Measured, in one run.

    python bench/frame_compression.py [--games pong breakout] [--messages 400] [--repeats 3] [--json out.json]

Frames are real: each game is stepped through the atari preset with random actions. A message is
one actor batch's worth of new frames (50 steps x 4 envs = 200 84x84 frames, 1.4 MB), as the
frame layout sends them. Rows:

- lz4 alone (one thread, CPU time): compression ratio, compress and decompress MB/s of raw frames,
  per frame (each compressed on its own) and per message (the message's frames as one block);
- loopback through aiorl.wire, two processes: the sender streams `--messages` messages raw, or
  lz4-compressed per message; the receiver copies (raw) or decompresses (lz4) every frame into
  its own array, as a memory host would write frames into its pool. Reported: frames/s and the
  CPU microseconds per frame of both processes together (user + system), raw and lz4
  alternated `--repeats` times, medians;
- a 10 Gbit/s link (1.25 GB/s), computed from the rows above: the frames/s the link carries
  raw and compressed, beside what one core compresses (at the actor) and decompresses (at the
  memory host).

lz4 is a bench dependency (`pip install 'aiorl[bench]'`); the games need `aiorl[atari]`.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import statistics
import sys
import time

import blas_one_thread  # noqa: F401  (before numpy: its BLAS threads would spin beside the timed loops)
import common
import numpy as np

TOKEN = b"bench-token-0123456789abcdef0123"
FRAMES_PER_MESSAGE = 200  # 50 steps x 4 envs: one actor batch of the Pong example
LINK_BYTES_PER_S = 10e9 / 8
TIMEOUT_S = 300.0


def game_frames(game: str, count: int, seed: int = 0) -> np.ndarray:
    """`count` consecutive preprocessed 84x84 frames of `game` under random actions."""
    from aiorl.config import EnvConfig
    from aiorl.envs import make_env

    env = make_env(EnvConfig(id=f"ALE/{game.capitalize()}-v5", preset="atari"))
    rng = np.random.default_rng(seed)
    obs, _ = env.reset(seed=seed)
    frames = np.empty((count,) + obs.shape[1:], obs.dtype)
    for i in range(count):
        obs, _, terminated, truncated, _ = env.step(int(rng.integers(env.action_space.n)))
        frames[i] = obs[-1]
        if terminated or truncated:
            obs, _ = env.reset()
    env.close()
    return frames


def lz4_speed(frames: np.ndarray) -> dict:
    import lz4.block

    out = {}
    for unit, group in (("frame", 1), ("message", FRAMES_PER_MESSAGE)):
        blobs = [frames[i : i + group].tobytes() for i in range(0, len(frames), group)]
        t0 = time.thread_time()
        packed = [lz4.block.compress(b) for b in blobs]
        t1 = time.thread_time()
        for b in packed:
            lz4.block.decompress(b)
        t2 = time.thread_time()
        raw = sum(map(len, blobs))
        out[unit] = {
            "ratio": raw / sum(map(len, packed)),
            "compress_MB_per_s": raw / (t1 - t0) / 1e6,
            "decompress_MB_per_s": raw / (t2 - t1) / 1e6,
        }
    return out


def _loop(coro) -> None:
    import uvloop

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(coro)


def receiver(compressed: bool, frame_shape, conn) -> None:
    import lz4.block

    from aiorl.wire import serve

    async def main() -> None:
        done = asyncio.get_running_loop().create_future()
        dest = np.empty((FRAMES_PER_MESSAGE,) + tuple(frame_shape), np.uint8)
        stats = {}

        async def handler(c) -> None:
            count, cpu0, t0 = 0, None, 0.0
            async for msg in c:
                if cpu0 is None:
                    cpu0, t0 = os.times(), time.perf_counter()
                if compressed:
                    dest.reshape(-1)[:] = np.frombuffer(lz4.block.decompress(msg.arrays["lz4"]), np.uint8)
                else:
                    dest[:] = msg.arrays["frames"]
                count += 1
            t1, cpu1 = time.perf_counter(), os.times()
            stats.update(messages=count, seconds=t1 - t0, cpu_s=(cpu1[0] - cpu0[0]) + (cpu1[1] - cpu0[1]))
            done.set_result(None)

        async with await serve(handler, token=TOKEN, name="bench-receiver") as server:
            conn.send(server.port)
            await asyncio.wait_for(done, TIMEOUT_S)
        conn.send(stats)

    _loop(main())


def sender(compressed: bool, frames: np.ndarray, port: int, messages: int, conn) -> None:
    import lz4.block

    from aiorl.wire import connect

    async def main() -> None:
        wire = await connect("127.0.0.1", port, token=TOKEN, name="bench-sender")
        chunks = [
            frames[i : i + FRAMES_PER_MESSAGE]
            for i in range(0, len(frames) - FRAMES_PER_MESSAGE + 1, FRAMES_PER_MESSAGE)
        ]
        cpu0 = os.times()
        for i in range(messages):
            chunk = chunks[i % len(chunks)]
            if compressed:
                arrays = {"lz4": np.frombuffer(lz4.block.compress(chunk.tobytes()), np.uint8)}
            else:
                arrays = {"frames": chunk}
            await wire.send("batch", None, arrays)
        await wire.close(timeout_s=60.0)
        cpu1 = os.times()
        conn.send((cpu1[0] - cpu0[0]) + (cpu1[1] - cpu0[1]))

    _loop(main())


def loopback(compressed: bool, frames: np.ndarray, messages: int) -> dict:
    ctx = mp.get_context("spawn")
    r_parent, r_child = ctx.Pipe()
    s_parent, s_child = ctx.Pipe()
    recv = ctx.Process(target=receiver, args=(compressed, frames.shape[1:], r_child))
    recv.start()
    send = None
    try:
        port = r_parent.recv() if r_parent.poll(TIMEOUT_S) else None
        send = ctx.Process(target=sender, args=(compressed, frames, port, messages, s_child))
        send.start()
        stats = r_parent.recv() if r_parent.poll(TIMEOUT_S) else None
        sender_cpu = s_parent.recv() if s_parent.poll(TIMEOUT_S) else None
    finally:
        for proc in (send, recv):
            if proc is not None:
                proc.join(60)
                if proc.is_alive():
                    proc.kill()
                    proc.join()
    if not stats or sender_cpu is None:
        raise RuntimeError("a loopback process did not report")
    n = stats["messages"] * FRAMES_PER_MESSAGE
    return {
        "frames_per_s": n / stats["seconds"],
        "cpu_us_per_frame": 1e6 * (stats["cpu_s"] + sender_cpu) / n,
        "receiver_cpu_us_per_frame": 1e6 * stats["cpu_s"] / n,
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--games", nargs="+", default=["pong", "breakout"])
    parser.add_argument("--messages", type=int, default=400, help="messages per loopback run")
    parser.add_argument("--repeats", type=int, default=3, help="raw/lz4 loopback pairs per game (medians)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    try:
        import lz4.block  # noqa: F401
    except ImportError:
        print("bench/frame_compression.py needs lz4: pip install 'aiorl[bench]'", file=sys.stderr)
        return 2

    results = []
    for game in args.games:
        print(f"measuring {game} ...", file=sys.stderr, flush=True)
        frames = game_frames(game, 10 * FRAMES_PER_MESSAGE)
        speed = lz4_speed(frames)
        raw_runs, lz4_runs = [], []
        for _ in range(args.repeats):
            raw_runs.append(loopback(False, frames, args.messages))
            lz4_runs.append(loopback(True, frames, args.messages))
        med = lambda runs, key: statistics.median(r[key] for r in runs)  # noqa: E731
        frame_bytes = frames[0].nbytes
        row = {
            "game": game,
            "frame_bytes": frame_bytes,
            "lz4": speed,
            "loopback": {
                kind: {key: med(runs, key) for key in runs[0]} for kind, runs in (("raw", raw_runs), ("lz4", lz4_runs))
            },
        }
        ratio = speed["message"]["ratio"]
        row["link_10gbit"] = {
            "raw_frames_per_s": LINK_BYTES_PER_S / frame_bytes,
            "lz4_frames_per_s": LINK_BYTES_PER_S * ratio / frame_bytes,
            "compress_frames_per_s_per_core": speed["message"]["compress_MB_per_s"] * 1e6 / frame_bytes,
            "decompress_frames_per_s_per_core": speed["message"]["decompress_MB_per_s"] * 1e6 / frame_bytes,
        }
        results.append(row)

    print(f"{'game':<9} {'unit':<8} {'ratio':>6} {'compress MB/s':>14} {'decompress MB/s':>16}")
    for r in results:
        for unit, s in r["lz4"].items():
            print(
                f"{r['game']:<9} {unit:<8} {s['ratio']:>6.1f} {s['compress_MB_per_s']:>14,.0f} "
                f"{s['decompress_MB_per_s']:>16,.0f}"
            )
    print(f"\n{'game':<9} {'loopback':<8} {'frames/s':>10} {'CPU us/frame (both)':>20} {'receiver us/frame':>18}")
    for r in results:
        for kind, s in r["loopback"].items():
            print(
                f"{r['game']:<9} {kind:<8} {s['frames_per_s']:>10,.0f} {s['cpu_us_per_frame']:>20.2f} "
                f"{s['receiver_cpu_us_per_frame']:>18.2f}"
            )
        raw, packed = r["loopback"]["raw"], r["loopback"]["lz4"]
        pays = packed["cpu_us_per_frame"] < raw["cpu_us_per_frame"] and packed["frames_per_s"] > raw["frames_per_s"]
        print(
            f"{r['game']:<9} lz4 on loopback: {packed['frames_per_s'] / raw['frames_per_s']:.2f}x the frames/s at "
            f"{packed['cpu_us_per_frame'] / raw['cpu_us_per_frame']:.2f}x the CPU per frame: "
            f"{'pays' if pays else 'does not pay'}"
        )
    print(
        f"\n{'game':<9} {'10 Gbit/s link: raw frames/s':>29} {'lz4 frames/s':>13} {'compress/core':>14} "
        f"{'decompress/core':>16}"
    )
    for r in results:
        link = r["link_10gbit"]
        print(
            f"{r['game']:<9} {link['raw_frames_per_s']:>29,.0f} {link['lz4_frames_per_s']:>13,.0f} "
            f"{link['compress_frames_per_s_per_core']:>14,.0f} {link['decompress_frames_per_s_per_core']:>16,.0f}"
        )
    if args.json:
        common.write_json(args.json, results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
