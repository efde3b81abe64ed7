"""The coordinator: registration, heartbeats, counters, stop criteria, barriers,
the parameter store and the shutdown phases. It lives in memory host 0.

Every role keeps one control connection to it. Requests (register, heartbeat,
publish, get_weights, barrier, work, done, stop) are answered on that
connection; phase changes, ``role_lost`` (to memories) and the final ``exit``
are pushed to roles on it.
"""
from __future__ import annotations

import asyncio
import collections
import logging
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from aiorl.config import Config
from aiorl.metrics import MetricsWriter, mean_or_none
from aiorl.rundir import write_json_atomic
from aiorl.runtime.algorithm import get_algorithm
from aiorl.runtime.barrier import Barrier, BarrierAborted
from aiorl.runtime.phase import PHASE_OWNER, Phase, role_name
from aiorl.runtime.work import WorkQueue
from aiorl.wire import Connection, ConnectionClosed, Message, Server, serve

log = logging.getLogger("aiorl.coordinator")

# Learner gauges the runtime itself reports; the rest are the algorithm's (learner/<name>).
LEARNER_RUNTIME_KEYS = {"wait_s", "train_s", "loop_lag_s", "rss_bytes", "queue_depth"}


@dataclass
class RoleRecord:
    name: str
    kind: str
    index: int
    conn: Connection | None = None
    pid: int | None = None
    host: str | None = None
    address: tuple[str, int] | None = None  # memory hosts: where actors and learners connect
    status: str = "expected"  # expected, running, done, lost, failed
    reason: str | None = None
    last_heartbeat: float = 0.0
    counters: dict[str, int] = field(default_factory=dict)
    metrics: dict = field(default_factory=dict)
    stats: dict = field(default_factory=dict)

    @property
    def live(self) -> bool:
        return self.status in ("expected", "running", "done")

    def public(self, now: float) -> dict:
        return {
            "status": self.status,
            "reason": self.reason,
            "pid": self.pid,
            "host": self.host,
            "heartbeat_age_s": round(now - self.last_heartbeat, 3) if self.last_heartbeat else None,
            "counters": self.counters,
            "metrics": self.metrics,
        }


class Coordinator:
    """Owns the run's global state; one instance, inside memory host 0."""

    def __init__(self, cfg: Config, run_dir: str | Path, token: bytes, ssl=None):
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.token = token
        self.ssl = ssl
        self.config_hash = cfg.config_hash()
        c = cfg.cluster
        self.roles: dict[str, RoleRecord] = {}
        for kind, count in (("memory", c.memories), ("learner", c.learners), ("actor", c.actors)):
            for i in range(count):
                self.roles[role_name(kind, i)] = RoleRecord(role_name(kind, i), kind, i)
        self.phase = Phase.STARTING
        self.phase_changed = asyncio.Event()
        self.phase_times: list[dict] = []
        self.started = asyncio.Event()
        self.stop_reason: str | None = None
        self.stop_event = asyncio.Event()
        self.failures: list[str] = []
        self.role_changed = asyncio.Event()  # any status change: phase waits re-check
        self.weights: dict[str, np.ndarray] = {}
        self.weights_version = -1
        self.weights_changed = asyncio.Condition()
        self.weights_published: list[tuple[int, float]] = []  # (version, time.monotonic()), bounded
        self.barriers: dict[str, Barrier] = {}
        algo = get_algorithm(cfg.algo)
        items = algo.work_items(cfg) if algo.is_synchronous(cfg) else None
        self.work = WorkQueue(items) if items else None  # work items of the current iteration
        self.work_changed = asyncio.Event()
        self._pushes: set[asyncio.Task] = set()
        self.returns = collections.deque(maxlen=100)
        self.lengths = collections.deque(maxlen=100)
        self.episodes = 0
        self.server: Server | None = None
        self.rendezvous: str | None = None
        self.loop_lag_max_s = 0.0  # how late the coordinator's own timer fired, worst case
        self.t_start = time.time()
        self.t_running: float | None = None
        # Made now, before serving: importing TensorBoard's writer takes a while.
        self._metrics = MetricsWriter(self.run_dir, tensorboard=cfg.run.tensorboard)
        self.last_row: dict = {}
        self._last_metrics: tuple | None = None

    def __repr__(self) -> str:
        alive = sum(r.live for r in self.roles.values())
        return f"<Coordinator phase={self.phase.name} roles={alive}/{len(self.roles)} weights_v={self.weights_version}>"

    # ------------------------------------------------------------------ counters

    @property
    def env_steps(self) -> int:
        return sum(r.counters.get("env_steps", 0) for r in self.roles.values())

    @property
    def learner_steps(self) -> int:
        return sum(r.counters.get("learner_steps", 0) for r in self.roles.values())

    def _check_stop_criteria(self) -> None:
        if self.phase != Phase.RUNNING or self.stop_event.is_set():
            return
        a = self.cfg.agent
        if a.scheduled_timesteps is not None and self.env_steps >= a.scheduled_timesteps:
            self.begin_stop(f"reached scheduled_timesteps ({self.env_steps} >= {a.scheduled_timesteps})")
        elif a.scheduled_global_steps is not None and self.learner_steps >= a.scheduled_global_steps:
            self.begin_stop(
                f"reached scheduled_global_steps ({self.learner_steps} >= {a.scheduled_global_steps})"
            )
        elif a.target_return is not None and len(self.returns) >= min(100, self.returns.maxlen):
            mean = float(np.mean(self.returns))
            if mean >= a.target_return:
                self.begin_stop(f"mean return of the last {len(self.returns)} episodes {mean:.1f} "
                                f">= target_return {a.target_return}")

    def begin_stop(self, reason: str, failed: bool = False) -> None:
        if failed:
            self.failures.append(reason)
        if self.stop_event.is_set():
            return
        log.info("stopping: %s", reason)
        self.stop_reason = reason
        self.stop_event.set()

    # ------------------------------------------------------------------ serving

    def _pick_rendezvous(self, host: str) -> str | None:
        """A tcp:// address for torch.distributed among data-parallel learners."""
        c = self.cfg.cluster
        if c.learners < 2:
            return None
        if c.rendezvous_port:
            port = c.rendezvous_port
        else:
            with socket.socket() as s:  # a free port now; learner 0 binds it moments later
                s.bind((host, 0))
                port = s.getsockname()[1]
        return f"tcp://{c.advertise_host or host}:{port}"

    async def start(self, host: str, port: int) -> int:
        self.rendezvous = self._pick_rendezvous(host)
        self.server = await serve(self._on_connection, host=host, port=port, token=self.token,
                                  name="coordinator", ssl=self.ssl)
        return self.server.port

    async def _on_connection(self, conn: Connection) -> None:
        record: RoleRecord | None = None
        # Requests that wait (start, barrier, weights of a version) get a task each so
        # the heartbeats on this connection keep being answered; they end with it.
        waiters: set[asyncio.Task] = set()
        try:
            async for msg in conn:
                if record is None and msg.kind == "register":
                    record = await self._register(conn, msg)
                    continue
                if msg.kind == "status":
                    await conn.reply(msg, meta=self.status())
                    continue
                if record is None:
                    await self._reply_error(conn, msg, f"{msg.kind!r} before register")
                    return
                waiter = await self._dispatch(record, conn, msg)
                if waiter is not None:
                    waiters.add(waiter)
                    waiter.add_done_callback(waiters.discard)
        except ConnectionClosed:
            pass
        finally:
            for waiter in list(waiters):
                waiter.cancel()
            await asyncio.gather(*waiters, return_exceptions=True)
            if record is not None and record.conn is conn:
                self._connection_lost(record)

    async def _reply_error(self, conn: Connection, msg: Message, reason: str) -> None:
        if msg.request_id is not None:
            try:
                await conn.reply_error(msg, reason)
            except ConnectionClosed:
                pass

    async def _register(self, conn: Connection, msg: Message) -> RoleRecord | None:
        meta = msg.meta
        name = str(meta.get("role", ""))
        record = self.roles.get(name)
        reason = None
        if record is None:
            reason = (f"unknown role {name!r}: this cluster has {self.cfg.cluster.actors} actors, "
                      f"{self.cfg.cluster.memories} memories, {self.cfg.cluster.learners} learners")
        elif meta.get("config_hash") != self.config_hash:
            reason = (f"config hash mismatch: {name} runs config {meta.get('config_hash')}, the coordinator "
                      f"runs {self.config_hash}; start every role with the same config")
        elif record.status != "expected":
            reason = f"{name} is already registered (status {record.status})"
        elif self.phase != Phase.STARTING:
            reason = f"{name} registered too late: the run is in phase {self.phase.name}"
        if reason is not None:
            log.warning("refused registration from %s: %s", conn.peer, reason)
            await conn.reply_error(msg, reason)
            await conn.close()
            return None
        record.conn = conn
        record.pid = meta.get("pid")
        record.host = meta.get("host")
        address = meta.get("address")
        record.address = (str(address[0]), int(address[1])) if address else None
        record.status = "running"
        record.last_heartbeat = asyncio.get_running_loop().time()
        log.info("registered %s (pid %s, %s)", name, record.pid, conn.peer)
        await conn.reply(msg, meta={"phase": int(self.phase), "config_hash": self.config_hash})
        if all(r.status == "running" for r in self.roles.values()):
            self.started.set()
        return record

    def _connection_lost(self, record: RoleRecord) -> None:
        record.conn = None
        if record.status == "running":
            self._mark(record, "lost", "its connection to the coordinator closed before it reported done")

    def _mark(self, record: RoleRecord, status: str, reason: str) -> None:
        record.status = status
        record.reason = reason
        log.warning("%s %s: %s", record.name, status, reason)
        self.role_changed.set()
        for name, barrier in self.barriers.items():
            if record.name in barrier.participants:
                barrier.remove(record.name)
                log.warning("barrier %r goes on without %s: %d parties left", name, record.name,
                            len(barrier.participants))
        if status in ("lost", "failed"):
            if record.kind == "actor":
                self._actor_gone(record)
            self._role_failed(record)

    def _actor_gone(self, record: RoleRecord) -> None:
        """Its work items go to other actors; memories stop waiting for its rollouts."""
        if self.work is not None:
            items = self.work.release(record.name)
            if items:
                log.warning("work items %s of iteration %d, held by %s, go back to the queue",
                            items, self.work.iteration, record.name)
                self._wake_work()
        memories = [r for r in self.roles.values() if r.kind == "memory" and r.conn is not None]
        if memories:
            task = asyncio.get_running_loop().create_task(self._push(memories, "role_lost", {"role": record.name}))
            self._pushes.add(task)
            task.add_done_callback(self._pushes.discard)

    async def _push(self, records: list[RoleRecord], kind: str, meta: dict) -> None:
        for record in records:
            try:
                await record.conn.send(kind, meta)
            except (ConnectionClosed, AttributeError):
                pass  # gone meanwhile (conn reset to None)

    def _wake_work(self) -> None:
        self.work_changed.set()
        self.work_changed = asyncio.Event()

    def _role_failed(self, record: RoleRecord) -> None:
        kind_alive = [r for r in self.roles.values() if r.kind == record.kind and r.live]
        if record.kind == "actor" and self.phase <= Phase.RUNNING:
            if not kind_alive:
                self.begin_stop("every actor is gone", failed=True)
            else:
                self.failures.append(f"{record.name} {record.status}: {record.reason}")
            return
        if record.kind == "actor":
            self.failures.append(f"{record.name} {record.status}: {record.reason}")
            return
        # Losing a learner or a memory host loses data or learning: end the run.
        self.begin_stop(f"{record.name} {record.status}: {record.reason}", failed=True)

    async def _dispatch(self, record: RoleRecord, conn: Connection, msg: Message) -> asyncio.Task | None:
        kind = msg.kind
        if kind == "heartbeat":
            self._heartbeat(record, msg.meta)
            await conn.reply(msg, meta={"phase": int(self.phase), "weights_version": self.weights_version})
        elif kind == "wait_start":
            return asyncio.create_task(self._answer_start(conn, msg))
        elif kind == "publish":
            await self._publish(record, conn, msg)
        elif kind == "get_weights":
            return asyncio.create_task(self._answer_weights(conn, msg))
        elif kind == "barrier":
            return asyncio.create_task(self._answer_barrier(record, conn, msg))
        elif kind == "work":
            return asyncio.create_task(self._answer_work(record, conn, msg))
        elif kind == "done":
            self._heartbeat(record, msg.meta)
            record.stats = dict(msg.meta.get("stats", {}))
            if record.status == "running":
                record.status = "done"
                log.info("%s done", record.name)
                self.role_changed.set()
            await conn.reply(msg)
        elif kind == "fail":
            reason = str(msg.meta.get("reason", "no reason given"))
            self._mark(record, "failed", reason)
            await conn.reply(msg)
        elif kind == "stop":
            self.begin_stop(f"{record.name} asked to stop ({msg.meta.get('reason', 'no reason')})")
            await conn.reply(msg)
        else:
            await self._reply_error(conn, msg, f"unknown control message {kind!r}")
        return None

    def _heartbeat(self, record: RoleRecord, meta: dict) -> None:
        record.last_heartbeat = asyncio.get_running_loop().time()
        counters = meta.get("counters")
        if counters:
            record.counters = {str(k): int(v) for k, v in counters.items()}
        metrics = meta.get("metrics")
        if metrics:
            record.metrics = metrics
        returns = meta.get("episode_returns")
        if returns:
            self.returns.extend(float(r) for r in returns)
            self.lengths.extend(int(n) for n in meta.get("episode_lengths", ()))
            self.episodes += len(returns)
        self._check_stop_criteria()

    async def _answer_start(self, conn: Connection, msg: Message) -> None:
        try:
            await self.started.wait()
            memories = [self.roles[role_name("memory", i)].address for i in range(self.cfg.cluster.memories)]
            await conn.reply(msg, meta={"memories": [list(a) for a in memories],
                                        "rendezvous": self.rendezvous, "phase": int(self.phase)})
        except ConnectionClosed:
            pass

    async def _publish(self, record: RoleRecord, conn: Connection, msg: Message) -> None:
        if record.name != "learner-0":
            await conn.reply_error(msg, f"only learner-0 publishes weights, not {record.name}")
            return
        async with self.weights_changed:
            # The arrays are views over the received frame: keeping them is free.
            self.weights = dict(msg.arrays)
            self.weights_version += 1
            self.weights_published.append((self.weights_version, time.monotonic()))
            del self.weights_published[:-1000]
            self.weights_changed.notify_all()
        if self.work is not None:
            self.work.start(self.weights_version)  # iteration k's items act with version k
            self._wake_work()
        await conn.reply(msg, meta={"version": self.weights_version})

    async def _answer_weights(self, conn: Connection, msg: Message) -> None:
        """Reply with the weights if newer than ``have``; with ``min_version``, wait for it."""
        have = int(msg.meta.get("have", -1))
        min_version = msg.meta.get("min_version")
        try:
            if min_version is not None:
                async with self.weights_changed:
                    await self.weights_changed.wait_for(
                        lambda: self.weights_version >= int(min_version) or self.phase > Phase.RUNNING
                    )
                if self.weights_version < int(min_version):
                    await conn.reply(msg, meta={"version": self.weights_version, "stop": True})
                    return
            if self.weights_version > have:
                await conn.reply(msg, meta={"version": self.weights_version}, arrays=self.weights)
            else:
                await conn.reply(msg, meta={"version": self.weights_version})
        except ConnectionClosed:
            pass

    async def _answer_barrier(self, record: RoleRecord, conn: Connection, msg: Message) -> None:
        """Reply once every live participant arrived; ``stop: True`` when the run stops first."""
        name = str(msg.meta.get("name", "default"))
        try:
            if self.phase > Phase.RUNNING:  # late arrivals: the barriers were aborted
                await conn.reply(msg, meta={"stop": True})
                return
            barrier = self.barriers.get(name)
            if barrier is None:
                live = [r.name for r in self.roles.values() if r.kind == record.kind and r.status == "running"]
                barrier = self.barriers[name] = Barrier(live)
            try:
                await barrier.wait(record.name, int(msg.meta["generation"]))
            except BarrierAborted:
                await conn.reply(msg, meta={"stop": True})
                return
            except (ValueError, KeyError) as exc:
                await self._reply_error(conn, msg, f"barrier {name!r}: {exc}")
                return
            await conn.reply(msg, meta={"generation": int(msg.meta["generation"])})
        except ConnectionClosed:
            pass

    async def _answer_work(self, record: RoleRecord, conn: Connection, msg: Message) -> None:
        """End the lease of the item reported ``done``, then hand out the next item
        (``iteration``, ``item``); wait while every item of the iteration is taken;
        ``stop: True`` once the run stops."""
        try:
            if self.work is None:
                await self._reply_error(conn, msg, f"{self.cfg.algo} hands out no work items")
                return
            done = msg.meta.get("done")
            if done is not None:
                if not (isinstance(done, list) and len(done) == 2 and all(type(v) is int for v in done)):
                    await self._reply_error(conn, msg, f"work: 'done' must be [iteration, item], got {done!r}")
                    return
                self.work.finish(record.name, done[0], done[1])
            while True:
                if self.phase > Phase.RUNNING or record.status != "running":
                    await conn.reply(msg, meta={"stop": True})
                    return
                item = self.work.take(record.name)
                if item is not None:
                    await conn.reply(msg, meta={"iteration": self.work.iteration, "item": item})
                    return
                await self.work_changed.wait()
        except ConnectionClosed:
            pass

    # ------------------------------------------------------------------ phases

    async def broadcast(self, kind: str, meta: dict) -> None:
        async def send(record: RoleRecord) -> None:
            try:
                await record.conn.send(kind, meta)
            except ConnectionClosed:
                pass

        targets = [r for r in self.roles.values() if r.conn is not None]
        await asyncio.gather(*(send(r) for r in targets))

    async def _set_phase(self, phase: Phase) -> None:
        self.phase = phase
        self.phase_times.append({"phase": phase.name, "time": time.time()})
        log.info("phase %s", phase.name)
        self.phase_changed.set()
        self.phase_changed = asyncio.Event()
        async with self.weights_changed:
            self.weights_changed.notify_all()  # actors waiting for weights learn the run stopped
        if phase > Phase.RUNNING:
            for barrier in self.barriers.values():
                barrier.abort(f"the run is {phase.name}")
            self._wake_work()
        await self.broadcast("phase", {"phase": int(phase), "reason": self.stop_reason})

    async def _wait_roles(self, kind: str | None, deadline_s: float, what: str) -> None:
        """Wait until every live role of `kind` reported done; mark late ones failed."""

        def pending():
            return [r for r in self.roles.values()
                    if (kind is None or r.kind == kind) and r.status == "running"]

        try:
            async with asyncio.timeout(deadline_s):
                while pending():
                    self.role_changed.clear()
                    await self.role_changed.wait()
        except TimeoutError:
            for record in pending():
                self._mark(record, "failed", f"missed the {what} deadline ({deadline_s:g} s)")
                if record.conn is not None:
                    await self._send_exit(record, ok=False)

    async def _send_exit(self, record: RoleRecord, ok: bool) -> None:
        try:
            await record.conn.send("exit", {"ok": ok, "role_ok": record.status == "done",
                                            "reason": record.reason})
        except ConnectionClosed:
            pass

    async def run(self) -> bool:
        """Drive the phases of the run; return True when it ended cleanly."""
        c = self.cfg.cluster
        metrics_task = asyncio.create_task(self._metrics_loop())
        monitor_task = asyncio.create_task(self._heartbeat_monitor())
        try:
            try:
                async with asyncio.timeout(c.start_timeout_s):
                    await self.started.wait()
            except TimeoutError:
                missing = sorted(r.name for r in self.roles.values() if r.status != "running")
                self.begin_stop(f"roles did not register within cluster.start_timeout_s "
                                f"({c.start_timeout_s:g} s): {', '.join(missing)}", failed=True)
                for record in self.roles.values():
                    if record.status == "expected":
                        self._mark(record, "lost", "never registered")
            if not self.stop_event.is_set():
                self.t_running = time.time()
                await self._set_phase(Phase.RUNNING)
                try:
                    async with asyncio.timeout(self.cfg.run.max_seconds):
                        await self.stop_event.wait()
                except TimeoutError:
                    self.begin_stop(f"reached run.max_seconds ({self.cfg.run.max_seconds:g} s)")
            for phase in (Phase.STOPPING, Phase.DRAINING, Phase.CLOSING):
                await self._set_phase(phase)
                await self._wait_roles(PHASE_OWNER[phase], c.phase_timeout_s, phase.name)
            ok = not self.failures and all(r.status == "done" for r in self.roles.values())
            self.phase = Phase.EXITED
            self.phase_times.append({"phase": "EXITED", "time": time.time()})
            self.write_summary(ok)
            for record in self.roles.values():
                if record.conn is not None:
                    await self._send_exit(record, ok)
            return ok
        finally:
            metrics_task.cancel()
            monitor_task.cancel()
            await asyncio.gather(metrics_task, monitor_task, *self._pushes, return_exceptions=True)
            self._write_metrics_row()
            self._metrics.close()

    async def close(self, timeout_s: float = 5.0) -> None:
        """Let roles read their exit message, then close every connection."""
        conns = [r.conn for r in self.roles.values() if r.conn is not None]
        try:
            async with asyncio.timeout(timeout_s):
                await asyncio.gather(*(conn.wait_closed() for conn in conns))
        except TimeoutError:
            pass
        if self.server is not None:
            await self.server.close()

    async def _heartbeat_monitor(self) -> None:
        c = self.cfg.cluster
        loop = asyncio.get_running_loop()
        while True:
            expected = loop.time() + c.heartbeat_interval_s
            await asyncio.sleep(c.heartbeat_interval_s)
            now = loop.time()
            self.loop_lag_max_s = max(self.loop_lag_max_s, now - expected)
            for record in self.roles.values():
                if record.status == "running" and now - record.last_heartbeat > c.heartbeat_timeout_s:
                    self._mark(record, "lost", f"no heartbeat for {now - record.last_heartbeat:.1f} s "
                                               f"(cluster.heartbeat_timeout_s {c.heartbeat_timeout_s:g})")
                    if record.conn is not None:
                        record.conn.abort()

    # ------------------------------------------------------------------ reporting

    def status(self) -> dict:
        now = asyncio.get_running_loop().time()
        return {
            "phase": self.phase.name,
            "stop_reason": self.stop_reason,
            "elapsed_s": round(time.time() - self.t_start, 3),
            "env_steps": self.env_steps,
            "learner_steps": self.learner_steps,
            "episodes": self.episodes,
            "return_mean_100": float(np.mean(self.returns)) if self.returns else None,
            "weights_version": self.weights_version,
            "loop_lag_max_s": round(self.loop_lag_max_s, 6),
            "work": None if self.work is None else {
                "iteration": self.work.iteration, "pending": list(self.work.pending),
                "leases": {str(item): worker for item, worker in self.work.leases.items()},
                "released": self.work.released},
            "metrics": self.last_row,
            "roles": {name: r.public(now) for name, r in self.roles.items()},
        }

    def metrics_row(self) -> dict:
        """One row of metrics.jsonl (keys documented in aiorl.metrics)."""
        now = time.time()
        loop_now = asyncio.get_running_loop().time()
        roles = list(self.roles.values())
        memories = [r.metrics for r in roles if r.kind == "memory" and r.metrics]
        learners = [r.metrics for r in roles if r.kind == "learner" and r.metrics]
        actors = [r.metrics for r in roles if r.kind == "actor" and r.metrics]
        env_steps, learner_steps = self.env_steps, self.learner_steps
        inserted = sum(m.get("inserted", 0) for m in memories)
        sampled = sum(m.get("sampled", 0) for m in memories)
        capacity = sum(m.get("replay_capacity", 0) for m in memories)
        replay_size = sum(m.get("replay_size", 0) for m in memories)
        wait_s = sum(m.get("wait_s", 0.0) for m in learners)
        train_s = sum(m.get("train_s", 0.0) for m in learners)
        late_after = 2 * self.cfg.cluster.heartbeat_interval_s
        row = {
            "time_s": round(now - self.t_start, 3),
            "phase": self.phase.name,
            "env_steps": env_steps,
            "learner_steps": learner_steps,
            "episodes": self.episodes,
            "env_steps_per_s": None,
            "learner_steps_per_s": None,
            "return_mean_100": mean_or_none(self.returns),
            "episode_length_mean_100": mean_or_none(self.lengths),
            "weights_version": self.weights_version,
            "weights_lag_max": max((m.get("weights_lag", 0) for m in actors), default=None),
            "replay_size": replay_size,
            "replay_fill": round(replay_size / capacity, 6) if capacity else None,
            "insert_per_s": None,
            "sample_per_s": None,
            "samples_per_insert": round(sampled / inserted, 6) if inserted else None,
            "learner_wait_fraction": round(wait_s / (wait_s + train_s), 6) if wait_s + train_s > 0 else None,
            "loop_lag_max_s": max([m.get("loop_lag_s", 0.0) for r in roles for m in [r.metrics] if m]
                                  + [self.loop_lag_max_s]),
            "rss_bytes": sum(r.metrics.get("rss_bytes", 0) for r in roles if r.live),
            "roles_alive": sum(r.status in ("running", "done") for r in roles),
            "roles_late": [r.name for r in roles
                           if r.status == "running" and loop_now - r.last_heartbeat > late_after],
            "roles_lost": [r.name for r in roles if r.status in ("lost", "failed")],
        }
        idle = [m["idle_fraction"] for m in actors if isinstance(m.get("idle_fraction"), (int, float))]
        row["actor_idle_fraction"] = mean_or_none(idle)
        for key in sorted({k for m in memories for k in m if k.startswith("queue/")}):
            row[key] = sum(m.get(key, 0) for m in memories)
        algo_keys = sorted({k for m in learners for k in m} - LEARNER_RUNTIME_KEYS)
        for key in algo_keys:
            row[f"learner/{key}"] = mean_or_none(m[key] for m in learners if isinstance(m.get(key), (int, float)))
        if self._last_metrics is not None:
            t0, e0, l0, i0, s0 = self._last_metrics
            dt = max(now - t0, 1e-9)
            row["env_steps_per_s"] = round((env_steps - e0) / dt, 2)
            row["learner_steps_per_s"] = round((learner_steps - l0) / dt, 2)
            row["insert_per_s"] = round((inserted - i0) / dt, 2)
            row["sample_per_s"] = round((sampled - s0) / dt, 2)
        self._last_metrics = (now, env_steps, learner_steps, inserted, sampled)
        return row

    def _write_metrics_row(self) -> None:
        self.last_row = self.metrics_row()
        self._metrics.write(self.last_row)

    async def _metrics_loop(self) -> None:
        while True:
            self._write_metrics_row()
            await asyncio.sleep(self.cfg.run.metrics_interval_s)

    def write_summary(self, ok: bool) -> None:
        summary = {
            "ok": ok,
            "stop_reason": self.stop_reason,
            "failures": self.failures,
            "phases": self.phase_times,
            "env_steps": self.env_steps,
            "learner_steps": self.learner_steps,
            "episodes": self.episodes,
            "return_mean_100": float(np.mean(self.returns)) if self.returns else None,
            "weights_version": self.weights_version,
            "weights_published_monotonic": self.weights_published,
            "roles": {name: {"status": r.status, "reason": r.reason, "pid": r.pid,
                             "counters": r.counters, "stats": r.stats}
                      for name, r in self.roles.items()},
        }
        write_json_atomic(self.run_dir / "summary.json", summary, indent=1)
