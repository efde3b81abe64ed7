"""Replay microbenchmarks: aiorl's compiled replay core against references measured in the same run.

    python bench/replay.py --json bench-replay.json      # full run (a few minutes, ~4 GiB peak)
    python bench/replay.py --quick                       # small sizes, seconds (a smoke test)

Cases (batch 512, adds in chunks of 64):
  small: capacity 2**20, obs (4,) float32 (+ action int64, reward float32, next_obs, done bool)
  large: capacity 2**17, obs (7056,) uint8 (84x84 frames) with the same other fields

Frame layout (Atari transitions: obs and next_obs stacks of 4 84x84 frames, n-step 3, 4 envs
streaming through the actor's FrameSender, episodes of 1000 steps), against the naive layout that
stores both stacks in every row:
  - RSS per stored transition: the memory's growth filling a buffer in a fresh process (frame
    layout with 200k transitions; the naive layout with 20k, as 200k would need 11 GB);
  - learner step (sample B + update B, B = 32, 64, 512) at the same capacity (2**15), same
    transitions and priorities, same interleaved rounds.

Rows: add (transitions/s), prioritized sample(512) (samples/s), update(512)
(updates/s), learner step = sample(512) + update(512) (steps/s), n-step of a
1024-step trajectory with n=3 (transitions/s), GAE of a 1024 x 8 rollout
(steps/s). Each aiorl figure is shown beside:
  - numpy: `aiorl.replay.reference`, the numpy implementation of the same algorithm;
  - cpprb: cpprb's PrioritizedReplayBuffer (when installed, `make bench` or
    `pip install 'aiorl[bench]'`; default options; the run says when it skipped it);
  - floor: a plain uniform-index gather of the same fields
    (rng.integers + np.take per field, from the same storage): the memory
    floor for this layout, which a learner step cannot beat.
Ratios are aiorl / other; higher is better for aiorl. Buffers are filled to
capacity with random priorities first (as after training has run a while:
uniform priorities would make the draws evenly spaced, which hardware
prefetchers turn into an unrealistically easy access pattern).

Timing: implementations run in alternating rounds, measured in the thread's
CPU time (time.thread_time): on a shared machine that leaves out the time
the process is descheduled, but still counts every cache miss, and other
tenants' load on the shared L3 cache comes and goes within seconds. The
table shows each implementation's best round; a ratio is the median over
rounds of the two rates measured back to back in that round (large buffers,
timed one implementation at a time, compare best rounds).
"""

import argparse
import gc
import multiprocessing as mp
import os
import platform
import statistics
import sys
import time

# BLAS threads spin between calls and would steal the (two) cores from the
# code being measured; nothing here uses BLAS: set before numpy loads.
import blas_one_thread  # noqa: F401
import common
import numpy as np

from aiorl import replay
from aiorl.replay import reference
from aiorl.replay.frame_sender import FrameSender
from aiorl.replay.frames import FrameLayout, FrameReplayBuffer

try:
    import cpprb
except ImportError:  # cpprb is optional: its rows are left out
    cpprb = None

BATCH = 512
ADD_CHUNK = 64
ALPHA, BETA = 0.6, 0.4
NSTEP_T, NSTEP_N, GAMMA = 1024, 3, 0.99
GAE_T, GAE_ENVS, LAM = 1024, 8, 0.95

# (name, target ratio, row op, column): checked and printed, never asserted.
TARGETS = [
    ("learner step >= 2x cpprb", 2.0, "learner step", "cpprb"),
    ("learner step >= 0.5x uniform gather", 0.5, "learner step", "floor"),
    ("add >= 1x cpprb", 1.0, "add", "cpprb"),
    ("n-step >= 5x numpy", 5.0, "n-step", "numpy"),
]


def spec_for(obs_shape, obs_dtype):
    return {
        "obs": (obs_shape, obs_dtype),
        "action": ((), "int64"),
        "reward": ((), "float32"),
        "next_obs": (obs_shape, obs_dtype),
        "done": ((), "bool"),
    }


def make_batch(spec, n, rng):
    out = {}
    for name, (shape, dtype) in spec.items():
        dtype = np.dtype(dtype)
        if dtype == np.uint8:
            out[name] = rng.integers(0, 256, (n,) + shape, dtype=np.uint8)
        elif dtype == np.bool_:
            out[name] = rng.random((n,) + shape) < 0.01
        elif dtype.kind == "i":
            out[name] = rng.integers(0, 18, (n,) + shape).astype(dtype)
        else:
            out[name] = rng.random((n,) + shape).astype(dtype)
    return out


class Timer:
    """Interleaved best-of-rounds throughput: items per second of each registered callable."""

    def __init__(self, rounds, round_s):
        self.rounds, self.round_s = rounds, round_s
        self.runs = 0  # labels of one run() are timed in the same, alternating rounds

    def run(self, fns, items):
        """fns: {label: callable}; returns {label: (best items/s, [items/s of each round], run id)}."""
        self.runs += 1
        rates = {label: [] for label in fns}
        # Calls per clock read, so that reading the clock costs nothing measurable.
        chunk = {label: self._chunk(fn) for label, fn in fns.items()}
        for _ in range(self.rounds):
            for label, fn in fns.items():
                calls, start = 0, time.thread_time()
                while True:
                    for _ in range(chunk[label]):
                        fn()
                    calls += chunk[label]
                    elapsed = time.thread_time() - start
                    if elapsed >= self.round_s:
                        break
                rates[label].append(calls * items / elapsed)
        return {label: (max(r), r, self.runs) for label, r in rates.items()}

    def _chunk(self, fn):
        n = 1
        while True:
            start = time.thread_time()
            for _ in range(n):
                fn()
            if time.thread_time() - start >= min(0.002, self.round_s / 4) or n >= 1 << 16:
                return n
            n *= 2


class AiorlPER:
    def __init__(self, capacity, spec, seed):
        self.buf = replay.PrioritizedReplayBuffer(capacity, spec, alpha=ALPHA, seed=seed)

    def add(self, batch, priorities=None):
        self.buf.add(batch, priorities)

    def sample(self):
        return self.buf.sample(BATCH, BETA)

    def update(self, sampled, priorities):
        self.buf.update_priorities(sampled["indices"], priorities, sampled["generations"])

    def fields(self):
        state = self.buf.state_dict()
        return {key[len("field.") :]: arr for key, arr in state.items() if key.startswith("field.")}


class NumpyPER(AiorlPER):
    def __init__(self, capacity, spec, seed):
        self.buf = reference.PrioritizedReplayBuffer(capacity, spec, alpha=ALPHA, seed=seed)


class CpprbPER:
    def __init__(self, capacity, spec, seed):
        env = {}
        for name, (shape, dtype) in spec.items():
            env[name] = {"shape": shape or 1, "dtype": np.dtype(dtype)}
        self.buf = cpprb.PrioritizedReplayBuffer(capacity, env, alpha=ALPHA, eps=1e-6)

    def add(self, batch, priorities=None):
        self.buf.add(**batch, priorities=priorities)

    def sample(self):
        return self.buf.sample(BATCH, BETA)

    def update(self, sampled, priorities):
        self.buf.update_priorities(sampled["indexes"], priorities)


def bench_buffers(case, capacity, spec, timer, rows, rng, impls):
    """add / sample / update / learner step rows for one case; impls built one after another if `serial`."""
    chunk = make_batch(spec, ADD_CHUNK, rng)
    fill = make_batch(spec, min(capacity, 4096), rng)
    priorities = rng.random(BATCH) + 0.01

    def built(cls):
        impl = cls(capacity, spec, seed=0)
        for _ in range(0, capacity, len(fill["reward"])):
            impl.add(fill, rng.random(len(fill["reward"])) + 0.01)
        return impl

    def ops(impl):
        state = {"sampled": impl.sample()}

        def sample():
            state["sampled"] = impl.sample()

        def update():
            impl.update(state["sampled"], priorities)

        def step():
            sampled = impl.sample()
            impl.update(sampled, priorities)

        return {"add": lambda: impl.add(chunk), "sample": sample, "update": update, "learner step": step}

    results = {op: {} for op in ("add", "sample", "update", "learner step")}
    # Small buffers are measured side by side (interleaved rounds); large ones
    # one implementation at a time, so that only one ~2 GiB buffer is alive.
    groups = (
        [impls]
        if capacity * sum(int(np.prod(s or (1,))) * np.dtype(d).itemsize for s, d in spec.values()) < 512 << 20
        else [[i] for i in impls]
    )
    for group in groups:
        built_impls = {label: built(cls) for label, cls in group}
        floor = None
        if "aiorl" in built_impls:
            fields = built_impls["aiorl"].fields()
            size = capacity

            def floor():
                idx = rng.integers(0, size, BATCH)
                return {name: arr.take(idx, axis=0) for name, arr in fields.items()}

        per_impl = {label: ops(impl) for label, impl in built_impls.items()}
        for op, unit_items in (("add", ADD_CHUNK), ("sample", BATCH), ("update", BATCH), ("learner step", 1)):
            fns = {label: impl_ops[op] for label, impl_ops in per_impl.items()}
            if floor is not None and op in ("sample", "learner step"):
                # In the same interleaved rounds as the buffers: this machine's speed
                # drifts, and a floor timed apart would compare different moments.
                fns["floor"] = floor
            results[op].update(timer.run(fns, unit_items))
        del built_impls, per_impl
        gc.collect()
    units = {"add": "transitions/s", "sample": "samples/s", "update": "updates/s", "learner step": "steps/s"}
    for op, res in results.items():
        rows.append(make_row(case, op, units[op], res))


def bench_nstep(timer, rows, rng):
    T, E = NSTEP_T, 1
    obs = rng.random((T + 1, E, 4)).astype(np.float32)
    traj = dict(
        obs=obs[:-1],
        actions=rng.integers(0, 2, (T, E)),
        rewards=rng.random((T, E)).astype(np.float32),
        next_obs=obs[1:],
        terminated=rng.random((T, E)) < 0.01,
        truncated=rng.random((T, E)) < 0.005,
    )
    res = timer.run(
        {
            "aiorl": lambda: replay.n_step_adjustment(**traj, n=NSTEP_N, gamma=GAMMA),
            "numpy": lambda: reference.n_step_adjustment(**traj, n=NSTEP_N, gamma=GAMMA),
        },
        T,
    )
    rows.append(make_row("trajectory 1024 x 1, obs (4,) f32", "n-step", "transitions/s", res))


def bench_gae(timer, rows, rng):
    T, E = GAE_T, GAE_ENVS
    args = (
        rng.random((T, E)).astype(np.float32),
        rng.random((T, E)).astype(np.float32),
        rng.random(E).astype(np.float32),
        rng.random((T, E)) < 0.01,
        rng.random((T, E)) < 0.005,
    )
    tv = rng.random((T, E)).astype(np.float32)
    res = timer.run(
        {
            "aiorl": lambda: replay.gae(*args, GAMMA, LAM, truncated_values=tv),
            "numpy": lambda: reference.gae(*args, GAMMA, LAM, truncated_values=tv),
        },
        T * E,
    )
    rows.append(make_row(f"rollout {T} x {E} f32", "gae", "steps/s", res))


# --------------------------------------------------------------------------- frame layout

FRAME_K, FRAME_HW, FRAME_ENVS, FRAME_T, FRAME_N, EPISODE_STEPS = 4, (84, 84), 4, 50, 3, 1000
ATARI_SPEC = {
    "obs": ((FRAME_K,) + FRAME_HW, "uint8"),
    "action": ((), "int64"),
    "reward": ((), "float32"),
    "next_obs": ((FRAME_K,) + FRAME_HW, "uint8"),
    "done": ((), "bool"),
    "discount": ((), "float32"),
}
FRAME_BATCHES = (32, 64, 512)
FRAME_TARGETS = [("RSS per stored transition <= 8 KB", 8192.0), ("learner step >= 1x naive layout", 1.0)]


def atari_stream(total, seed, decode=False):
    """Batch messages of one actor (FRAME_ENVS envs of random 84x84 frames, episodes of
    EPISODE_STEPS steps) through the real FrameSender and n-step: yields (arrays, keep_from,
    priorities, naive rows or None) until `total` rows were made."""
    layout = FrameLayout.for_spec(ATARI_SPEC, ("obs", "next_obs"), FRAME_ENVS, FRAME_T, FRAME_N - 1)
    sender = FrameSender(layout, FRAME_ENVS, 1, FRAME_N - 1)
    nstep = replay.NStep(FRAME_N, 0.99)
    rng = np.random.default_rng(seed)
    E, k = FRAME_ENVS, FRAME_K
    stacks = np.repeat(rng.integers(0, 256, (E, 1) + FRAME_HW, dtype=np.uint8), k, axis=1)
    refs = np.stack([sender.fresh(s) for s in stacks])
    sender.note_current(refs)
    t, made = 0, 0
    while made < total:
        obs = np.empty((FRAME_T, E, k), np.int64)
        nxt = np.empty_like(obs)
        ended = np.zeros((FRAME_T, E), bool)
        for j in range(FRAME_T):
            obs[j] = refs
            for e in range(E):
                new = np.concatenate([stacks[e, 1:], rng.integers(0, 256, (1,) + FRAME_HW, dtype=np.uint8)])
                nxt[j, e] = sender.advance(refs[e], stacks[e], new)
                if (t + j + 1 + 97 * e) % EPISODE_STEPS == 0:
                    ended[j, e] = True
                    stacks[e] = np.repeat(rng.integers(0, 256, (1,) + FRAME_HW, dtype=np.uint8), k, axis=0)
                    refs[e] = sender.fresh(stacks[e])
                else:
                    stacks[e], refs[e] = new, nxt[j, e]
            sender.note_current(refs)
        t += FRAME_T
        rows = nstep.add(
            obs,
            rng.integers(0, 6, (FRAME_T, E)),
            rng.random((FRAME_T, E)).astype(np.float32),
            nxt,
            ended,
            np.zeros((FRAME_T, E), bool),
        )
        rows = {key: val[: total - made] for key, val in rows.items()}
        made += len(rows["reward"])
        naive = sender.decode(rows) if decode else None
        arrays, keep_from = sender.message(0, rows)
        yield arrays, keep_from, rng.random(len(rows["reward"])) + 0.01, naive


def _frame_buffer(capacity, seed=0):
    layout = FrameLayout.for_spec(ATARI_SPEC, ("obs", "next_obs"), FRAME_ENVS, FRAME_T, FRAME_N - 1)
    return FrameReplayBuffer(capacity, ATARI_SPEC, layout, alpha=ALPHA, seed=seed)


def _rss_child(kind, capacity, out):
    import psutil

    stream = atari_stream(capacity, seed=1, decode=kind == "naive")
    first = next(stream)  # the sender's frame cache is the actor's, not the memory's: before the baseline
    gc.collect()
    base = psutil.Process().memory_info().rss
    if kind == "frames":
        buf = _frame_buffer(capacity)
        stream_state = buf.stream()
    else:
        buf = replay.PrioritizedReplayBuffer(capacity, ATARI_SPEC, alpha=ALPHA, seed=0)
    for arrays, keep_from, priorities, naive in _chain(first, stream):
        if kind == "frames":
            buf.add(arrays, priorities, stream=stream_state, keep_from=keep_from)
        else:
            buf.add(naive, priorities)
        del arrays, naive
    gc.collect()
    grown = psutil.Process().memory_info().rss - base
    frames = len(buf.pool) if kind == "frames" else None
    out.put(
        {
            "layout": kind,
            "capacity": capacity,
            "stored": len(buf),
            "rss_bytes": grown,
            "bytes_per_transition": grown / len(buf),
            "frames_per_transition": frames and frames / len(buf),
        }
    )


def _chain(first, rest):
    yield first
    yield from rest


def rss_per_transition(kind, capacity):
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    proc = ctx.Process(target=_rss_child, args=(kind, capacity, out))
    proc.start()
    try:
        return out.get(timeout=1800)
    finally:
        proc.join(60)


def bench_frames(timer, capacity, frames_cap, naive_cap, quick):
    """RSS rows (each layout in a fresh process) and learner-step rows at one capacity."""
    rss = [rss_per_transition("frames", frames_cap), rss_per_transition("naive", naive_cap)]
    print("measuring learner steps, frame vs naive layout ...", file=sys.stderr, flush=True)
    frames, naive = _frame_buffer(capacity), replay.PrioritizedReplayBuffer(capacity, ATARI_SPEC, alpha=ALPHA, seed=0)
    stream = frames.stream()
    for arrays, keep_from, priorities, rows in atari_stream(capacity, seed=2, decode=True):
        frames.add(arrays, priorities, stream=stream, keep_from=keep_from)
        naive.add(rows, priorities)
    steps = []
    for batch in FRAME_BATCHES:
        if batch > capacity:
            continue
        new = np.random.default_rng(batch).random(batch) + 0.01

        def step(buf=None, batch=batch):
            sampled = buf.sample(batch, BETA)
            buf.update_priorities(sampled["indices"], new, sampled["generations"])

        # The lambdas run inside this iteration, before the `del` below that ruff sees.
        res = timer.run({"frames": lambda: step(frames), "naive": lambda: step(naive)}, 1)  # noqa: F821
        ratio = statistics.median(a / b for a, b in zip(res["frames"][1], res["naive"][1]))
        steps.append(
            {
                "case": f"cap 2^{capacity.bit_length() - 1}, stacks 4x84x84 u8",
                "batch": batch,
                "frames_steps_per_s": res["frames"][0],
                "naive_steps_per_s": res["naive"][0],
                "ratio": ratio,
            }
        )
    del frames, naive
    gc.collect()
    return {"rss": rss, "learner_step": steps}


def print_frames(result):
    print()
    print(f"{'layout':<8} {'stored':>8} {'RSS growth':>12} {'bytes/transition':>17} {'frames/transition':>18}")
    for r in result["rss"]:
        fpt = "-" if r["frames_per_transition"] is None else f"{r['frames_per_transition']:.3f}"
        print(
            f"{r['layout']:<8} {r['stored']:>8,} {r['rss_bytes'] / 2**20:>10,.0f} M "
            f"{r['bytes_per_transition']:>17,.0f} "
            f"{fpt:>18}"
        )
    ratio = result["rss"][1]["bytes_per_transition"] / result["rss"][0]["bytes_per_transition"]
    print(f"naive / frames: {ratio:.1f}x the memory per stored transition")
    print()
    print(f"{'case':<30} {'batch':>5} {'frames steps/s':>15} {'naive steps/s':>14} {'frames/naive':>13}")
    for r in result["learner_step"]:
        print(
            f"{r['case']:<30} {r['batch']:>5} {fmt(r['frames_steps_per_s']):>15} {fmt(r['naive_steps_per_s']):>14} "
            f"{fmt(r['ratio'], True):>13}"
        )
    print()
    bpt = result["rss"][0]["bytes_per_transition"]
    print(f"target {FRAME_TARGETS[0][0]:<40} {bpt:>8,.0f}  {'met' if bpt <= FRAME_TARGETS[0][1] else 'MISSED'}")
    for r in result["learner_step"]:
        met = "met" if r["ratio"] >= FRAME_TARGETS[1][1] else "MISSED"
        print(f"target {FRAME_TARGETS[1][0]:<40} {fmt(r['ratio'], True):>8}  {met}  (batch {r['batch']})")


def make_row(case, op, unit, res):
    """res: {label: (best, rounds, run id)}. A ratio is the median over rounds of aiorl's rate over
    the other's in the same round (measured back to back, so the machine's drift cancels);
    labels timed in separate runs (one large buffer at a time) compare best against best."""
    row = {"case": case, "op": op, "unit": unit}
    for label in ("aiorl", "numpy", "cpprb", "floor"):
        row[label] = res[label][0] if label in res else None
    for label in ("numpy", "cpprb", "floor"):
        ratio = None
        if label in res and "aiorl" in res:
            (_, ours, our_run), (_, theirs, their_run) = res["aiorl"], res[label]
            if our_run == their_run:
                ratio = statistics.median(a / b for a, b in zip(ours, theirs))
            else:
                ratio = res["aiorl"][0] / res[label][0]
        row[f"vs_{label}"] = ratio
    return row


def fmt(x, ratio=False):
    if x is None:
        return "-"
    if ratio:
        return f"{x:.2f}x"
    for div, suffix in ((1e6, "M"), (1e3, "k")):
        if x >= div:
            return f"{x / div:.2f}{suffix}"
    return f"{x:.1f}"


def print_table(rows, targets):
    header = ["case", "op", "unit", "aiorl", "numpy", "aiorl/np", "cpprb", "aiorl/cpprb", "floor", "aiorl/floor"]
    table = [header] + [
        [
            r["case"],
            r["op"],
            r["unit"],
            fmt(r["aiorl"]),
            fmt(r["numpy"]),
            fmt(r["vs_numpy"], True),
            fmt(r["cpprb"]),
            fmt(r["vs_cpprb"], True),
            fmt(r["floor"]),
            fmt(r["vs_floor"], True),
        ]
        for r in rows
    ]
    widths = [max(len(line[i]) for line in table) for i in range(len(header))]
    for i, line in enumerate(table):
        print("  ".join(cell.ljust(w) if j < 3 else cell.rjust(w) for j, (cell, w) in enumerate(zip(line, widths))))
        if i == 0:
            print("  ".join("-" * w for w in widths))
    print()
    for t in targets:
        status = "n/a" if t["ratio"] is None else ("met" if t["met"] else "MISSED")
        print(f"target {t['name']:<40} {fmt(t['ratio'], True):>8}  {status}  ({t['case']})")


def check_targets(rows):
    out = []
    for name, target, op, column in TARGETS:
        for row in rows:
            if row["op"] == op:
                ratio = row.get(f"vs_{column}")
                out.append(
                    {
                        "name": name,
                        "case": row["case"],
                        "target": target,
                        "ratio": ratio,
                        "met": None if ratio is None else ratio >= target,
                    }
                )
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    parser.add_argument("--quick", action="store_true", help="small capacities and short rounds (smoke test)")
    parser.add_argument("--rounds", type=int, default=None, help="timing rounds per implementation (default 7)")
    parser.add_argument("--round-seconds", type=float, default=None, help="seconds per round (default 0.25)")
    parser.add_argument("--no-cpprb", action="store_true", help="leave cpprb out even if installed")
    parser.add_argument("--no-large", action="store_true", help="skip the large-observation case")
    parser.add_argument("--no-frames", action="store_true", help="skip the frame-layout rows")
    parser.add_argument("--frames-only", action="store_true", help="only the frame-layout rows")
    args = parser.parse_args(argv)

    rounds = args.rounds or (1 if args.quick else 7)
    round_s = args.round_seconds or (0.01 if args.quick else 0.25)
    timer = Timer(rounds, round_s)
    rng = np.random.default_rng(0)
    use_cpprb = cpprb is not None and not args.no_cpprb
    impls = [("aiorl", AiorlPER), ("numpy", NumpyPER)] + ([("cpprb", CpprbPER)] if use_cpprb else [])
    skipped = {}  # comparison -> why it was left out
    if not use_cpprb:
        skipped["cpprb"] = (
            "--no-cpprb" if args.no_cpprb else "cpprb is not installed (make bench, or pip install 'aiorl[bench]')"
        )
    small_cap, large_cap = (2**12, 2**10) if args.quick else (2**20, 2**17)
    cases = [(f"cap 2^{small_cap.bit_length() - 1}, obs (4,) f32", small_cap, spec_for((4,), "float32"))]
    if not args.no_large:
        cases.append((f"cap 2^{large_cap.bit_length() - 1}, obs (7056,) u8", large_cap, spec_for((7056,), "uint8")))

    rows = []
    if not args.frames_only:
        for case, capacity, spec in cases:
            print(f"measuring {case} ...", file=sys.stderr, flush=True)
            bench_buffers(case, capacity, spec, timer, rows, rng, impls)
        print("measuring n-step and gae ...", file=sys.stderr, flush=True)
        bench_nstep(timer, rows, rng)
        bench_gae(timer, rows, rng)
    frames = None
    if not args.no_frames:
        print("measuring RSS per transition, frame (fresh process) vs naive layout ...", file=sys.stderr, flush=True)
        sizes = (2**10, 2**12, 2**10) if args.quick else (2**15, 200_000, 20_000)
        frames = bench_frames(timer, *sizes, args.quick)

    targets = check_targets(rows)
    if rows:
        print_table(rows, targets)
    if frames:
        print_frames(frames)
    for name, why in skipped.items():
        print(f"skipped: the {name} comparisons ({why})")
    if args.json:
        result = {
            "benchmark": "replay",
            "quick": args.quick,
            "batch": BATCH,
            "add_chunk": ADD_CHUNK,
            "alpha": ALPHA,
            "beta": BETA,
            "rounds": rounds,
            "round_seconds": round_s,
            "backend": replay.BACKEND,
            "numpy": np.__version__,
            "cpprb": getattr(cpprb, "__version__", "installed") if use_cpprb else None,
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "rows": rows,
            "targets": targets,
            "frames": frames,
            "skipped": skipped,
        }
        common.write_json(args.json, result, indent=2)  # its "machine" block holds the arch
        print(f"wrote {args.json}", file=sys.stderr)
    return rows, targets


if __name__ == "__main__":
    main()
