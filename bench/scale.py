"""How far one coordinator and a few memory hosts go: N simulated actors against real role processes.

For each N in ``--actors``, starts memory host 0 (which runs the coordinator)
and memory hosts 1..M-1 as real role processes (``aiorl run --role memory``,
an Ape-X DQN CartPole config), then ``--workers`` processes of simulated
roles: N actors and learner 0, coroutines on one uvloop loop per process.
A simulated actor is the real `ActorRole` (its control channel, registration,
heartbeat loop, memory attach, batch sender and wire) with the env and the
policy taken out: every ``--batch-every-s`` (uniform in LO:HI) it sends one
synthetic CartPole-size batch (``--rows`` transitions plus priorities) to the
next memory host. The simulated learner registers and heartbeats only, and
ends the run after the window (one learner step, ``agent.scheduled_global_steps``
1). The measured window is ``--duration-s`` long and starts ``--warmup-s``
after every actor has attached to every memory host.

Per N the table shows:
- heartbeat round trip p50/p99/max, as the actors' heartbeat loops see it;
- the coordinator's loop lag p50/p99/max (`aiorl.runtime.looplag`, read from
  its ``status`` reply; bucket edges, at most 10% high), and the simulated
  actors' processes' own loop lag p99, so a slow simulator is not taken for a
  slow coordinator;
- registration: seconds from the first actor's connect to the last actor's
  registration reply, and connections the servers turned away as busy;
- ingest: transitions per second the memory hosts accepted, and its ratio to
  N times the 1-actor rate in the same bench (1.0: the memory hosts keep up);
- RSS and file descriptors of memory host 0's process per connection it holds,
  over its own baseline before the actors came;
- false "lost" verdicts (roles the coordinator declared lost or failed), which
  must be 0, and heartbeats that failed (timed out, connection closed).

The bench exits 1 when a role was declared lost, a heartbeat failed, or a
role did not exit 0.

    python bench/scale.py --actors 1,8,64,256,512 --memories 2 --json scale.json
    python bench/scale.py --actors 512 --batch-every-s 0  # heartbeats only

Hard limits met on the way (fixed)
----------------------------------
- The status reply passed the 64 KiB frame header at ~400 roles (``aiorl status``
  failed): its roles table now travels packed in an array.
- Memory host 0's ``done`` stats (an account per actor) passed it at 256 actors
  per memory host and memory 0 crashed at the end of the run: final stats
  travel packed too (``frame_limits.STATS_BYTES``).
- Heartbeat replies summed every role's counters: O(N) per heartbeat, a third
  of the coordinator's time at 512 actors. Totals are now kept as counters change.
- A phase broadcast read ``record.conn`` a loop turn after choosing its targets
  and crashed the coordinator when a connection closed in between (512 actors).
- Listen backlog 128 with 512 actors attaching at once: handshakes past the
  10 s timeout, actors failed. Servers listen with a backlog for every role,
  and a timed-out handshake is retried like a busy refusal.
- RLIMIT_NOFILE: role processes already raise the soft limit to the hard one
  (`aiorl.runtime.resources`); 512 actors need ~800 descriptors in memory host 0.

What 4,096 actors would need
----------------------------
Grounded in this bench on the 2-core machine (shared, load 12-22; numbers in
the closing note of issue 14):
- Heartbeats relayed and batched by memory hosts. With heartbeats only, memory
  host 0's process used 0.015 of a core at 64 actors and 0.074 at 512: about
  66 us of CPU per extra heartbeat (wire, check, reply), so 4,096 actors at
  two heartbeats a second cost some 0.55 of a core before memory 0 ingests
  anything, and a stall of the loop delays all 8,192 heartbeats a second; with
  the coordinator sharing memory 0's loop, ingest delays heartbeats (loop lag
  p99 36 ms at 64 actors with data, 389 ms at 256). Actors would heartbeat to
  a memory host they already hold a connection to, each memory host would send
  the coordinator one batched heartbeat per interval (counter deltas, returns,
  its actors' liveness), and the coordinator would handle M messages per
  interval instead of N. Or: the coordinator in its own process, off memory
  0's loop.
- Less memory per connection. An authenticated connection holds a 512 KiB
  staging buffer (``aiorl.wire.protocol``): measured 540-580 KB of RSS per
  connection in memory host 0; 4,096 control connections plus 4,096/M data
  connections would be 3-4 GB there. Control connections need a staging buffer
  sized to what they carry (a few KiB, grown on demand).
- Sharded, staggered registration. 512 actors from one host met the per-host
  handshake cap (32) 1,665 times and took 15.6 s to register (load 18): actors
  should register with jitter, or through their host's memory host, and hosts
  with many actors need a higher ``cluster.max_handshakes_per_host``.
- Weight fan-out. Every actor pulls weights from the coordinator; 4,096 actors
  pulling a 6.5 MB Atari network is 27 GB per publication through one
  process. Memory hosts (or a tree of them) should cache each version and
  serve their actors.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import common
import numpy as np
import psutil

from aiorl.io.rundir import ENV_ATTEMPT, ENV_LAUNCH_ID, ENV_RUN_ID, new_id
from aiorl.runtime.looplag import LoopLagProbe, quantile_s, window
from aiorl.wire import generate_token, write_token_file

LOST = ("lost", "failed")


def bench_config(run_dir: Path, actors: int, memories: int, args) -> dict:
    return {
        "algo": "apex_dqn",
        "env": {"id": "CartPole-v1", "num_envs": 1},
        "cluster": {
            "actors": actors,
            "memories": memories,
            "learners": 1,
            "heartbeat_interval_s": args.heartbeat_interval_s,
            "heartbeat_timeout_s": args.heartbeat_timeout_s,
            "coordinator_timeout_s": 10.0,
            "start_timeout_s": 120.0,
            "phase_timeout_s": 30.0,
        },
        "agent": {
            "sample_batch_size": args.rows,
            "batch_size": 64,
            "buffer_size": 200_000,
            "learning_starts": 1000,
            "prioritized_replay_alpha": 0.6,
            "prioritized_replay_beta": 0.4,
            "scheduled_global_steps": 1,
        },  # the simulated learner's one step, after the window
        "model": {"network": ["linear:64", "relu"], "n_step": 3, "gamma": 0.99},
        "run": {
            "dir": str(run_dir),
            "max_seconds": 600.0,  # the bench asks for the stop after its window
            "tensorboard": False,
            "log_level": "WARNING",
            "metrics_interval_s": 0.5,
        },
    }


# ---------------------------------------------------------------------- simulated roles (worker processes)


def _sim_classes():
    from aiorl.runtime.actor import ActorRole
    from aiorl.runtime.phase import Phase
    from aiorl.runtime.role import Role

    class SimActor(ActorRole):
        """The real actor with env stepping and the policy replaced by synthetic batches on a timer."""

        def __init__(self, *args, every_s: tuple[float, float], **kwargs):
            super().__init__(*args, **kwargs)
            self.every_s = every_s
            self.heartbeats: list[tuple[float, float]] = []  # (monotonic send time, round trip s)
            self.heartbeats_failed = 0
            self.t_connect = self.t_registered = self.t_running = None

        async def _request_or_lost(self, kind, meta=None, **kwargs):
            if kind != "heartbeat":
                return await super()._request_or_lost(kind, meta, **kwargs)
            t0 = time.monotonic()
            try:
                reply = await super()._request_or_lost(kind, meta, **kwargs)
            except asyncio.CancelledError:
                raise  # the run's exit came while it was in flight: not a failure
            except BaseException:
                self.heartbeats_failed += 1
                raise
            self.heartbeats.append((t0, time.monotonic() - t0))
            return reply

        async def _run(self):
            self.t_connect = time.monotonic()
            return await super()._run()

        def _set_phase(self, phase):
            if self.t_registered is None:
                self.t_registered = time.monotonic()  # the registration reply sets the first phase
            if phase == Phase.RUNNING and self.t_running is None:
                self.t_running = time.monotonic()
            super()._set_phase(phase)

        async def main(self) -> dict:
            self.synchronous = False
            spec = self.algorithm().transition_spec()
            rows = self.cfg.agent.sample_batch_size
            batch = {name: np.zeros((rows, *shape), dtype) for name, (shape, dtype) in spec.items()}
            rng = random.Random(self.index)
            priorities = np.array([rng.uniform(0.1, 2.0) for _ in range(rows)])
            addresses = self.start_info["memories"]
            self.memories = [None] * len(addresses)
            self.sent = [{"batches": 0, "transitions": 0} for _ in addresses]
            for m, address in enumerate(addresses):
                await self._connect_memory(m, address)
            await self.wait_phase(Phase.RUNNING)
            lo, hi = self.every_s
            while self.phase == Phase.RUNNING:
                if hi > 0:
                    await asyncio.sleep(rng.uniform(lo, hi))
                    if self.phase != Phase.RUNNING:
                        break
                    await self._send(batch, priorities)
                    self.counters["env_steps"] += rows
                else:
                    await self.wait_phase(Phase.STOPPING)
            for i, conn in enumerate(self.memories):
                if conn is not None:
                    await conn.send("actor_done", {"actor": self.index, **self.sent[i]})
            return {"env_steps": self.counters["env_steps"], "memories": self.sent}

    class SimLearner(Role):
        """Registers and heartbeats; ends the run (agent.scheduled_global_steps 1) once the window is over."""

        kind = "learner"

        async def main(self) -> dict:
            self.counters = {"learner_steps": 0}
            while not (self.run_dir / "window_end").exists() and self.phase == Phase.RUNNING:
                await asyncio.sleep(0.05)
            self.counters["learner_steps"] = 1  # its next heartbeat meets the stop criterion
            await self.wait_phase(Phase.DRAINING)
            return {}

    return SimActor, SimLearner


async def _worker_main(args) -> dict:
    from aiorl.experiment.loading import load_config
    from aiorl.runtime.process import cluster_token

    SimActor, SimLearner = _sim_classes()
    cfg = load_config(args.config, [f"cluster.port={args.port}"])
    run_dir = Path(cfg.run.dir)
    token = cluster_token(cfg, run_dir)
    lo, hi = (
        (float(x) for x in args.batch_every_s.split(":"))
        if ":" in args.batch_every_s
        else (float(args.batch_every_s),) * 2
    )
    actors = [
        SimActor(cfg, i, run_dir, token, every_s=(lo, hi)) for i in range(args.worker, cfg.cluster.actors, args.workers)
    ]
    roles = [*actors, *([SimLearner(cfg, 0, run_dir, token)] if args.worker == 0 else [])]
    probe = LoopLagProbe(0.01)
    probe_task = asyncio.get_running_loop().create_task(probe.run())
    me = psutil.Process()
    cpu0 = me.cpu_times()
    snapshots = []

    async def snapshot_probe():  # the window's edges come from the parent, as files
        for name in ("window_start", "window_end"):
            path = run_dir / name
            while not path.exists():
                await asyncio.sleep(0.05)
            snapshots.append(probe.snapshot())

    snap_task = asyncio.get_running_loop().create_task(snapshot_probe())
    codes = await asyncio.gather(*(role.run() for role in roles), return_exceptions=True)
    probe_task.cancel()
    snap_task.cancel()
    cpu1 = me.cpu_times()
    return {
        "codes": {role.name: (c if isinstance(c, int) else repr(c)) for role, c in zip(roles, codes)},
        "heartbeats": [hb for a in actors for hb in a.heartbeats],
        "heartbeats_failed": sum(a.heartbeats_failed for a in actors),
        "t_connect": [a.t_connect for a in actors if a.t_connect is not None],
        "t_registered": [a.t_registered for a in actors],
        "t_running": [a.t_running for a in actors],
        "batches": sum(a.batches for a in actors),
        "loop_lag": snapshots,
        "cpu_s": (cpu1.user + cpu1.system) - (cpu0.user + cpu0.system),
    }


def worker(args) -> int:
    import uvloop

    from aiorl.runtime.resources import raise_open_file_limit

    logging.basicConfig(
        filename=args.log,
        level=logging.WARNING,
        format=f"%(asctime)s sim-{args.worker} %(levelname)s %(name)s: %(message)s",
    )
    raise_open_file_limit()
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        result = runner.run(_worker_main(args))
    Path(args.out).write_text(json.dumps(result))
    return 0


# ---------------------------------------------------------------------- the driver


def _status(port: int, token: bytes) -> dict:
    """The coordinator's status reply; retried while its handshake slots are taken by the actors."""
    from aiorl.cli.status import fetch_status
    from aiorl.wire import ServerBusy

    for _ in range(200):
        try:
            return asyncio.run(fetch_status("127.0.0.1", port, token, timeout_s=30.0))
        except ServerBusy:
            time.sleep(0.05)
    raise RuntimeError("the coordinator stayed busy for 200 status requests in a row")


def _proc_usage(pid: int) -> dict:
    p = psutil.Process(pid)
    conns = [c for c in p.net_connections(kind="tcp") if c.status == psutil.CONN_ESTABLISHED]
    return {"rss_bytes": p.memory_info().rss, "fds": p.num_fds(), "connections": len(conns)}


def _wait(predicate, timeout_s: float, what: str, procs=()):
    def ready():
        value = predicate()
        if not value:
            for p in procs:
                if p.poll() is not None:
                    raise RuntimeError(f"{what}: a process exited early with code {p.returncode}")
        return value

    value = common.wait_for(ready, timeout_s)
    if not value:
        raise RuntimeError(f"timed out after {timeout_s} s waiting for {what}")
    return value


def _pct(values, q) -> float | None:
    return float(np.percentile(values, q)) if len(values) else None


class ScaleRun:
    """One N: the memory hosts started as `aiorl run --role memory` processes, the simulated actors
    in worker processes; every process it starts is its own to end (`end`)."""

    def __init__(self, n: int, args, tmp: Path):
        self.n, self.args, self.tmp = n, args, tmp
        self.run_dir = tmp / f"n{n}"
        self.run_dir.mkdir()
        self.config_path = tmp / f"n{n}.json"
        self.config_path.write_text(json.dumps(bench_config(self.run_dir, n, args.memories, args)))
        self.token = generate_token()
        write_token_file(self.run_dir / "token", self.token)
        launch = new_id()
        self.env = {**os.environ, ENV_RUN_ID: launch, ENV_LAUNCH_ID: launch, ENV_ATTEMPT: "1"}
        self.logs = self.run_dir / "logs"
        self.logs.mkdir(exist_ok=True)
        self.procs: list[subprocess.Popen] = []
        self.port: int | None = None

    def spawn(self, cmd, log_name) -> subprocess.Popen:
        with open(self.logs / log_name, "ab") as log_file:
            proc = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=log_file, stderr=log_file, env=self.env, cwd=self.tmp
            )
        self.procs.append(proc)
        return proc

    def wait(self, predicate, timeout_s: float, what: str):
        return _wait(predicate, timeout_s, what, self.procs)

    def status(self) -> dict:
        return _status(self.port, self.token)

    def memory_sum(self, status: dict, key: str) -> int:
        return sum(r["metrics"].get(key, 0) for name, r in status["roles"].items() if name.startswith("memory"))

    def start_memories(self) -> list[subprocess.Popen]:
        """Memory host 0 (the coordinator) and the others, once all have registered."""
        role_cmd = [sys.executable, "-m", "aiorl", "run", str(self.config_path), "--role", "memory"]
        memory0 = self.spawn([*role_cmd, "--index", "0"], "memory-0.out")
        self.port = self.wait(
            lambda: (common.read_json(self.run_dir / "coordinator.json") or {}).get("port"),
            60,
            "the coordinator's address",
        )
        memories = [memory0] + [
            self.spawn([*role_cmd, "--index", str(i), "--set", f"cluster.port={self.port}"], f"memory-{i}.out")
            for i in range(1, self.args.memories)
        ]
        self.wait(
            lambda: all(r["status"] == "running" for name, r in self.status()["roles"].items() if name[:6] == "memory"),
            60,
            "the memory hosts' registration",
        )
        return memories

    def start_workers(self) -> list[Path]:
        """The worker processes of simulated actors; where each writes its results."""
        workers = min(self.args.workers, self.n)
        outs = []
        for k in range(workers):
            out = self.tmp / f"n{self.n}-worker{k}.json"
            outs.append(out)
            self.spawn(
                [
                    sys.executable,
                    str(Path(__file__).resolve()),
                    "--worker",
                    str(k),
                    "--workers",
                    str(workers),
                    "--config",
                    str(self.config_path),
                    "--port",
                    str(self.port),
                    "--out",
                    str(out),
                    "--log",
                    str(self.logs / f"sim-{k}.log"),
                    "--batch-every-s",
                    self.args.batch_every_s,
                ],
                f"sim-{k}.out",
            )
        return outs

    def attach_s(self) -> float:
        """Seconds from RUNNING until every actor has attached to every memory host."""
        self.wait(lambda: self.status()["phase"] == "RUNNING", 180, "the run to start")
        t_running = time.monotonic()
        # Every actor attaches to every memory host once the run starts: the window is steady state.
        self.wait(
            lambda: self.memory_sum(self.status(), "actor_connections") >= self.n * self.args.memories,
            180,
            "every actor's attach",
        )
        return time.monotonic() - t_running

    def profile(self, pid: int) -> None:
        """Where memory host 0's process spends the window (py-spy is not a dependency)."""
        self.procs.append(
            subprocess.Popen(
                [
                    self.args.py_spy,
                    "record",
                    "--pid",
                    str(pid),
                    "--format",
                    "raw",
                    "--duration",
                    str(int(self.args.duration_s)),
                    "--rate",
                    "200",
                    "--nonblocking",
                    "--output",
                    str(self.tmp / f"n{self.n}-memory-0.stacks"),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )

    def window(self, memory0: int) -> dict:
        """The measured window: status and memory host 0's CPU at its start and end."""
        (self.run_dir / "window_start").touch()
        cpu_before = psutil.Process(memory0).cpu_times()
        t_start, before = time.monotonic(), self.status()
        time.sleep(self.args.duration_s)
        (self.run_dir / "window_end").touch()
        t_end, after = time.monotonic(), self.status()
        cpu_after = psutil.Process(memory0).cpu_times()
        cpu = cpu_after.user + cpu_after.system - cpu_before.user - cpu_before.system
        return {"t_start": t_start, "t_end": t_end, "before": before, "after": after, "cpu_s": cpu}

    def end(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def measure(n: int, args, tmp: Path) -> dict:
    run = ScaleRun(n, args, tmp)
    try:
        memories = run.start_memories()
        base = [_proc_usage(p.pid) for p in memories]
        outs = run.start_workers()
        attach_s = run.attach_s()
        time.sleep(args.warmup_s)
        if args.py_spy:
            run.profile(memories[0].pid)
        win = run.window(memories[0].pid)
        usage = [_proc_usage(p.pid) for p in memories]
        for p in run.procs:
            p.wait(timeout=120)
        codes = {"memory-%d" % i: p.returncode for i, p in enumerate(memories)}
        results = [json.loads(out.read_text()) for out in outs]
    finally:
        run.end()
    summary = json.loads((run.run_dir / "summary.json").read_text())
    for r in results:
        codes.update(r["codes"])
    dt = win["t_end"] - win["t_start"]
    inserted = run.memory_sum(win["after"], "inserted") - run.memory_sum(win["before"], "inserted")
    return {
        "actors": n,
        "memories": args.memories,
        "window_s": round(dt, 3),
        **heartbeat_figures(results, win),
        "registration_s": registration_s(results),
        "refused_busy": summary.get("connections_refused_busy"),
        "attach_s": round(attach_s, 3),
        "ingest_per_s": round(inserted / dt, 1),
        "memory0_cpu": round(win["cpu_s"] / dt, 3),
        **memory_figures(usage, base),
        **lost_figures(summary, codes),
        "load_avg_1m": round(os.getloadavg()[0], 2),
    }


def heartbeat_figures(results: list[dict], win: dict) -> dict:
    """The heartbeats' round trips in the window, the coordinator's and the simulators' loop lag."""
    rtts = [rtt for r in results for t, rtt in r["heartbeats"] if win["t_start"] <= t <= win["t_end"]]
    lag = window(win["before"]["loop_lag"], win["after"]["loop_lag"])
    sim_lags = [window(*r["loop_lag"]) for r in results if len(r["loop_lag"]) == 2]
    sim_lag = [sum(c) for c in zip(*sim_lags)] if sim_lags else []
    return {
        "heartbeats": len(rtts),
        "heartbeat_p50_ms": _ms(_pct(rtts, 50)),
        "heartbeat_p99_ms": _ms(_pct(rtts, 99)),
        "heartbeat_max_ms": _ms(max(rtts) if rtts else None),
        "heartbeats_failed": sum(r["heartbeats_failed"] for r in results),
        "coordinator_lag_p50_ms": _ms(quantile_s(lag, 0.5)),
        "coordinator_lag_p99_ms": _ms(quantile_s(lag, 0.99)),
        "coordinator_lag_max_ms": _ms(quantile_s(lag, 1.0)),
        "coordinator_lag_samples": sum(lag),
        "sim_lag_p50_ms": _ms(quantile_s(sim_lag, 0.5)),
        "sim_lag_p99_ms": _ms(quantile_s(sim_lag, 0.99)),
        "sim_cpu_s": round(sum(r["cpu_s"] for r in results), 2),
    }


def registration_s(results: list[dict]) -> float | None:
    registered = [t for r in results for t in r["t_registered"] if t is not None]
    connect = [t for r in results for t in r["t_connect"]]
    return round(max(registered) - min(connect), 3) if registered and connect else None


def memory_figures(usage: list[dict], base: list[dict]) -> dict:
    """Memory host 0's size after the window, and what each actor connection cost it."""
    conns = usage[0]["connections"] - base[0]["connections"]
    return {
        "memory0_rss_mb": round(usage[0]["rss_bytes"] / 2**20, 1),
        "memory0_connections": usage[0]["connections"],
        "rss_kb_per_connection": round((usage[0]["rss_bytes"] - base[0]["rss_bytes"]) / 1024 / conns, 1)
        if conns > 0
        else None,
        "fds_per_connection": round((usage[0]["fds"] - base[0]["fds"]) / conns, 2) if conns > 0 else None,
        "memory_usage": usage,
        "memory_baseline": base,
    }


def lost_figures(summary: dict, codes: dict) -> dict:
    lost = sorted(name for name, r in summary["roles"].items() if r["status"] in LOST)
    return {
        "lost": lost,
        "lost_count": len(lost),
        "outcome": summary.get("outcome"),
        "exit_codes_nonzero": {k: v for k, v in codes.items() if v != 0},
    }


def _ms(seconds):
    return None if seconds is None else round(seconds * 1000, 2)


COLUMNS = [
    ("actors", "N", 5),
    ("heartbeat_p50_ms", "hb p50", 7),
    ("heartbeat_p99_ms", "hb p99", 7),
    ("heartbeat_max_ms", "hb max", 7),
    ("coordinator_lag_p50_ms", "lag p50", 7),
    ("coordinator_lag_p99_ms", "lag p99", 7),
    ("coordinator_lag_max_ms", "lag max", 7),
    ("sim_lag_p99_ms", "sim p99", 7),
    ("registration_s", "reg s", 6),
    ("attach_s", "att s", 6),
    ("refused_busy", "busy", 5),
    ("ingest_per_s", "ingest/s", 9),
    ("ingest_ratio", "ratio", 6),
    ("memory0_cpu", "m0 cpu", 6),
    ("memory0_rss_mb", "rss MB", 7),
    ("rss_kb_per_connection", "KB/conn", 7),
    ("fds_per_connection", "fd/conn", 7),
    ("lost_count", "lost", 4),
    ("heartbeats_failed", "hbfail", 6),
    ("load_avg_1m", "load", 5),
]


def print_table(rows: list[dict]) -> None:
    print(" ".join(f"{title:>{width}}" for _, title, width in COLUMNS))
    for row in rows:
        cells = []
        for key, _, width in COLUMNS:
            value = row.get(key)
            cells.append(f"{'-' if value is None else value:>{width}}")
        print(" ".join(cells))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--actors", default="1,8,64,256,512", help="comma-separated N (default %(default)s)")
    parser.add_argument("--memories", type=int, default=2, help="memory hosts, memory 0 included (default 2)")
    parser.add_argument("--workers", type=int, default=2, help="processes of simulated actors (default 2)")
    parser.add_argument(
        "--batch-every-s",
        default="0.02:0.05",
        help="seconds between an actor's batches, LO:HI uniform; 0: heartbeats only",
    )
    parser.add_argument("--rows", type=int, default=64, help="transitions per batch (default 64)")
    parser.add_argument("--heartbeat-interval-s", type=float, default=0.5)
    parser.add_argument("--heartbeat-timeout-s", type=float, default=10.0)
    parser.add_argument("--warmup-s", type=float, default=3.0)
    parser.add_argument("--duration-s", type=float, default=10.0)
    parser.add_argument("--json", help="write every number here")
    parser.add_argument("--py-spy", help="path of py-spy: profile memory host 0 over the window (with --keep)")
    parser.add_argument("--keep", help="keep the run directories under this (new or empty) directory")
    parser.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    for hidden in ("--config", "--port", "--out", "--log"):
        parser.add_argument(hidden, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    # The status client's own lines (refused while the actors' handshakes fill the slots) are noise here.
    logging.basicConfig(level=logging.ERROR)
    if args.worker is not None:
        args.port = int(args.port)
        return worker(args)
    try:
        counts = [int(x) for x in args.actors.split(",")]
        if any(n < 1 for n in counts) or args.memories < 1 or args.workers < 1:
            raise ValueError
    except ValueError:
        print(
            f"scale.py: --actors expects positive integers like 1,8,64 (got {args.actors!r}); "
            "--memories and --workers at least 1",
            file=sys.stderr,
        )
        return 2
    rows = []
    with tempfile.TemporaryDirectory(prefix="aiorl-scale-") as tmp:
        if args.keep:  # the run directories (logs, summaries) stay there to be read
            tmp = Path(args.keep)
            tmp.mkdir(parents=True, exist_ok=True)
        for n in counts:
            print(f"N={n} ...", file=sys.stderr, flush=True)
            try:
                rows.append(measure(n, args, Path(tmp)))
            except Exception as exc:  # the run itself broke (a role crashed): say so, go on with the next N
                print(f"N={n}: the run broke: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
                rows.append(
                    {
                        "actors": n,
                        "error": f"{type(exc).__name__}: {exc}",
                        "ingest_per_s": 0,
                        "lost_count": None,
                        "heartbeats_failed": None,
                        "exit_codes_nonzero": None,
                    }
                )
    one = next((r["ingest_per_s"] for r in rows if r["actors"] == 1), None)
    for row in rows:
        row["ingest_ratio"] = (
            round(row["ingest_per_s"] / (one * row["actors"]), 3) if one and not row.get("error") else None
        )
    print_table(rows)
    if args.json:
        common.write_json(args.json, {"args": vars(args), "rows": rows})
    bad = [r for r in rows if r.get("error") or r["lost_count"] or r["heartbeats_failed"] or r["exit_codes_nonzero"]]
    for r in bad:
        if r.get("error"):
            print(f"N={r['actors']}: {r['error']}", file=sys.stderr)
            continue
        print(
            f"N={r['actors']}: lost {len(r['lost'])} ({', '.join(r['lost'][:5])}...), heartbeats failed "
            f"{r['heartbeats_failed']}, non-zero exits {len(r['exit_codes_nonzero'])}",
            file=sys.stderr,
        )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
