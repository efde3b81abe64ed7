"""The coordinator: registration, heartbeats, counters, stop criteria, barriers,
the parameter store and the shutdown phases. It lives in memory host 0.

Every role keeps one control connection to it. Requests (register, heartbeat,
publish, get_weights, barrier, work, done, stop, run_state) are answered on
that connection; phase changes, ``role_lost`` (to memories), memory host
addresses and the final ``exit`` are pushed to roles on it. Every request is
checked (`aiorl.runtime.messages`): a bad one closes that connection, which
loses that role. Each registration gets a session id, which memory hosts
check (``check_session``) before a role may attach.

Registration carries the role process's ``incarnation`` (a nonce per
process). The same incarnation registering again is a role whose control
connection dropped and came back: it *rejoins* with its counters and its
session. A new incarnation of a lost role is a *restart* (`aiorl.restart`):
accepted within ``cluster.max_restarts`` while RUNNING, its predecessor's
counters kept, with a new session (memory hosts then drop the old one's
connections). A role whose connection closes is ``disconnected`` (still
live) for ``cluster.coordinator_timeout_s`` plus two heartbeats, its time to
rejoin, before it is declared lost.

A resumed run (``AIORL_RESUME_FROM``, see `aiorl.rundir`) starts its global
counters, return window and clock from the checkpoint's.
"""

from __future__ import annotations

import asyncio
import collections
import hmac
import logging
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from aiorl import checkpoint
from aiorl.config import Config
from aiorl.metrics import MetricsWriter, mean_or_none
from aiorl.ratelog import RateLimitedLog
from aiorl.restart import restartable
from aiorl.rundir import Identity, write_json_atomic
from aiorl.runtime import frame_limits
from aiorl.runtime.algorithm import get_algorithm
from aiorl.runtime.barrier import Barrier, BarrierAborted
from aiorl.runtime.evaluator import evaluation_metrics, evaluation_on
from aiorl.runtime.looplag import LoopLagProbe
from aiorl.runtime.messages import BadMessage, RowSpec, any_map, check, pack_table, unpack_table
from aiorl.runtime.phase import FAILED, FINISHED, INTERRUPTED, PHASE_OWNER, Phase, role_name
from aiorl.runtime.resources import listen_backlog
from aiorl.runtime.work import WorkQueue
from aiorl.wire import Connection, ConnectionClosed, Message, Server, serve
from aiorl.wire.names import safe_text

log = logging.getLogger("aiorl.coordinator")

# Learner gauges the runtime itself reports; the rest are the algorithm's (learner/<name>).
LEARNER_RUNTIME_KEYS = {"wait_s", "train_s", "loop_lag_s", "rss_bytes", "queue_depth"}
COUNTERS = ("env_steps", "learner_steps")
WEIGHTS_PUBLISHED_KEPT = 32  # summary.json: weights_published_monotonic holds the first 32 only


@dataclass
class RoleRecord:
    name: str
    kind: str
    index: int
    conn: Connection | None = None
    pid: int | None = None
    host: str | None = None
    address: tuple[str, int] | None = None  # memory hosts: where actors and learners connect
    status: str = "expected"  # expected, running, disconnected, done, lost, failed
    reason: str | None = None
    session: str | None = None  # id of its current registration
    last_heartbeat: float = 0.0
    stall_at_heartbeat_s: float = 0.0  # the coordinator's own stalled time when that heartbeat came
    done_phase: str | None = None  # the phase in which the role reported done
    counters: dict[str, int] = field(default_factory=dict)
    metrics: dict = field(default_factory=dict)
    stats: dict = field(default_factory=dict)
    incarnation: str | None = None  # the registered process's nonce
    restarts: int = 0
    retired: dict[str, int] = field(default_factory=dict)  # counters of its earlier incarnations
    disconnected_at: float | None = None

    @property
    def live(self) -> bool:
        return self.status in ("expected", "running", "disconnected", "done")

    def total(self, key: str) -> int:
        return self.retired.get(key, 0) + self.counters.get(key, 0)

    def public(self, now: float) -> dict:
        return {
            "status": self.status,
            "reason": self.reason,
            "pid": self.pid,
            "host": self.host,
            "address": list(self.address) if self.address else None,
            "heartbeat_age_s": round(now - self.last_heartbeat, 3) if self.last_heartbeat else None,
            "restarts": self.restarts,
            "counters": self.counters,
            "metrics": self.metrics,
        }


class Coordinator:
    """Owns the run's global state; one instance, inside memory host 0."""

    def __init__(self, cfg: Config, run_dir: str | Path, token: bytes, ssl=None, identity: Identity | None = None):
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.token = token
        self.ssl = ssl
        self.identity = identity or Identity.from_env()
        self.config_hash = cfg.config_hash()
        self.synchronous = get_algorithm(cfg.algo).is_synchronous(cfg)
        c = cfg.cluster
        self.roles: dict[str, RoleRecord] = {}
        for kind, count in (("memory", c.memories), ("learner", c.learners), ("actor", c.actors)):
            for i in range(count):
                self.roles[role_name(kind, i)] = RoleRecord(role_name(kind, i), kind, i)
        self.phase = Phase.STARTING
        self.phase_changed = asyncio.Event()
        self.phase_times: list[dict] = []
        self.started = asyncio.Event()
        self.start_settled = asyncio.Event()  # the run started, or stopped before it could
        self.stop_reason: str | None = None
        # The counters the stop was decided on; the final ones are larger by the work in flight
        # then (a learner trains the batches it holds credits for).
        self.stopped_at: dict | None = None
        self.stop_event = asyncio.Event()
        self.failures: list[str] = []  # run-level; lost and failed roles are added at the end
        self.stopped_by_failure = False
        self.interrupted_by: str | None = None  # the signal that stopped the run
        self.no_actor_since: float | None = None  # loop time the last live actor was lost
        self.lost_restartable: list[str] = []  # lost at the end with restarts left (not failures)
        self.role_changed = asyncio.Event()  # any status change: phase waits re-check
        self.weights: dict[str, np.ndarray] = {}
        self.weights_version = -1
        self.weights_changed = asyncio.Condition()
        # (version, time.monotonic()) of the first publications: what a test needs to check that
        # iteration k started after version k, without a long run's list bloating summary.json.
        self.weights_published: list[tuple[int, float]] = []
        self.barriers: dict[str, Barrier] = {}
        algo = get_algorithm(cfg.algo)
        items = algo.work_items(cfg) if algo.is_synchronous(cfg) else None
        self.work = WorkQueue(items) if items else None  # work items of the current iteration
        self.work_changed = asyncio.Event()
        self._pushes: set[asyncio.Task] = set()
        self.returns = collections.deque(maxlen=100)
        self.evaluation: dict | None = None  # learner 0's last and best evaluations (aiorl.runtime.evaluator)
        self._evaluation_row = False  # the next metrics row carries a new evaluation
        self.lengths = collections.deque(maxlen=100)
        self.episodes = 0
        self.server: Server | None = None
        self.rendezvous: str | None = None
        self.loop_lag_max_s = 0.0  # how late the coordinator's own timer fired, worst case
        self.stalled_s = 0.0  # how long the coordinator's own loop was stalled, in total
        self.lag_probe = LoopLagProbe()  # its loop's lateness, finer than the heartbeat monitor's
        self.t_start = time.time()
        self.t_running: float | None = None
        self.base = {"env_steps": 0, "learner_steps": 0, "episodes": 0}  # from the checkpoint resumed
        self._totals = dict.fromkeys(COUNTERS, 0)  # over every role's counters, retired ones too
        self.resumed_from: dict | None = None
        if self.identity.resume_from:
            self._resume(self.identity.resume_from)
        # Made now, before serving: importing TensorBoard's writer takes a while.
        self._metrics = MetricsWriter(
            self.run_dir,
            tensorboard=cfg.run.tensorboard,
            purge_step=self.base["env_steps"] if self.resumed_from else None,
            loggers=cfg.run.loggers,
            config=cfg.to_dict(),
        )
        self.last_row: dict = {}
        self._last_metrics: tuple | None = None
        self.registrations_refused = 0
        self.bad_messages = 0
        self._log_refusal = RateLimitedLog(log, logging.WARNING, burst=10, per_s=0.5)
        self._log_housekeeping = RateLimitedLog(log, logging.ERROR, burst=5, per_s=0.1)

    def __repr__(self) -> str:
        alive = sum(r.live for r in self.roles.values())
        return f"<Coordinator phase={self.phase.name} roles={alive}/{len(self.roles)} weights_v={self.weights_version}>"

    # ------------------------------------------------------------------ counters

    def _resume(self, path: str) -> None:
        """Start counters, returns and clock where the checkpoint at `path` left them."""
        run = checkpoint.read_meta(path).get("run") or {}
        for key in self.base:
            self.base[key] = int(run.get(key, 0))
        self.episodes = self.base["episodes"]
        self.returns.extend(float(r) for r in run.get("returns", ()))
        self.lengths.extend(int(n) for n in run.get("lengths", ()))
        self.t_start -= float(run.get("time_s", 0.0))
        if not self.synchronous:  # synchronous iterations count versions from 0 in every launch
            self.weights_version = int(run.get("weights_version", -1))
        self.resumed_from = {"checkpoint": path, **self.base}
        log.info(
            "resuming from %s: env_steps %d, learner_steps %d, episodes %d",
            path,
            self.base["env_steps"],
            self.base["learner_steps"],
            self.base["episodes"],
        )

    @property
    def env_steps(self) -> int:
        return self.base["env_steps"] + self._totals["env_steps"]

    @property
    def learner_steps(self) -> int:
        return self.base["learner_steps"] + self._totals["learner_steps"]

    def _set_counters(self, record: RoleRecord, counters: dict) -> None:
        """A role's new counters, and the run's totals moved by the difference.

        Every heartbeat reply carries the totals: summing every role's counters
        for each one made a heartbeat cost O(roles), a round of them O(roles^2)
        (a third of the coordinator's time at 512 actors, bench/scale.py).
        A restart moves counters to ``retired``, which leaves the totals as they are.
        """
        totals, old = self._totals, record.counters
        for key in COUNTERS:
            totals[key] += counters.get(key, 0) - old.get(key, 0)
        record.counters = counters

    @property
    def restarts(self) -> int:
        return sum(r.restarts for r in self.roles.values())

    def run_state(self) -> dict:
        """What a checkpoint records of the run, so that a resume continues it."""
        return {
            "env_steps": self.env_steps,
            "learner_steps": self.learner_steps,
            "episodes": self.episodes,
            "weights_version": self.weights_version,
            "returns": list(self.returns),
            "lengths": list(self.lengths),
            "time_s": round(time.time() - self.t_start, 3),
        }

    def _check_stop_criteria(self) -> None:
        if self.phase != Phase.RUNNING or self.stop_event.is_set():
            return
        a = self.cfg.agent
        if a.scheduled_timesteps is not None and self.env_steps >= a.scheduled_timesteps:
            self.begin_stop(f"reached scheduled_timesteps ({self.env_steps} >= {a.scheduled_timesteps})")
        elif a.scheduled_global_steps is not None and self.learner_steps >= a.scheduled_global_steps:
            self.begin_stop(f"reached scheduled_global_steps ({self.learner_steps} >= {a.scheduled_global_steps})")
        elif a.target_return is not None and evaluation_on(self.cfg):
            last = (self.evaluation or {}).get("last")
            if last is not None and last["return_mean"] >= a.target_return:
                self.begin_stop(
                    f"evaluation {last['n']} (learner step {last['learner_steps']}): mean return "
                    f"{last['return_mean']:.1f} >= target_return {a.target_return}"
                )
        elif a.target_return is not None and len(self.returns) >= min(100, self.returns.maxlen):
            mean = float(np.mean(self.returns))
            if mean >= a.target_return:
                self.begin_stop(
                    f"mean return of the last {len(self.returns)} episodes {mean:.1f} "
                    f">= target_return {a.target_return}"
                )

    def begin_stop(self, reason: str, failed: bool = False, role: RoleRecord | None = None) -> None:
        """Stop the run; `failed`: because something went wrong (a `role`'s loss is listed at the end)."""
        if failed:
            self.stopped_by_failure = True
            if role is None:
                self.failures.append(reason)
        if self.stop_event.is_set():
            return
        log.info("stopping: %s", reason)
        self.stop_reason = reason
        self.stopped_at = {"env_steps": self.env_steps, "learner_steps": self.learner_steps}
        self.stop_event.set()

    def interrupt(self, signal_name: str, who: str) -> None:
        """A signal asked the run to stop before its stop criterion held."""
        if self.stop_event.is_set():
            return
        self.interrupted_by = signal_name
        self.begin_stop(f"interrupted by {signal_name} ({who})")

    # ------------------------------------------------------------------ serving

    async def start(self, host: str, port: int) -> int:
        from aiorl.runtime.algorithm import build_algorithm

        self.algo = build_algorithm(self.cfg)
        spec = self.algo.weights_spec()
        self._weights_rows = RowSpec(spec) if spec is not None else None
        c = self.cfg.cluster
        # Every role, room for restarted ones whose old connection lingers, and `aiorl status`.
        self.server = await serve(
            self._on_connection,
            host=host,
            port=port,
            token=self.token,
            name="coordinator",
            ssl=self.ssl,
            limits=frame_limits.UNKNOWN_PEER,
            max_connections=2 * len(self.roles) + 16,
            backlog=listen_backlog(len(self.roles)),
            max_handshakes=c.max_handshakes,
            max_handshakes_per_host=c.max_handshakes_per_host,
        )
        return self.server.port

    async def _on_connection(self, conn: Connection) -> None:
        record: RoleRecord | None = None
        # Requests that wait (start, barrier, weights of a version) get a task each so
        # the heartbeats on this connection keep being answered; they end with it.
        waiters: set[asyncio.Task] = set()
        try:
            async for msg in conn:
                fields = check(msg.kind, msg.meta)
                if msg.request_id is None:
                    raise BadMessage(f"{msg.kind} must be a request")
                if record is None and msg.kind == "register":
                    record = await self._register(conn, msg, fields)
                    if record is None:
                        return
                    continue
                if msg.kind == "status":
                    status = self.status()
                    roles = pack_table(status.pop("roles"))  # over 64 KiB of header from ~400 roles on
                    await conn.reply(msg, meta=status, arrays={"roles": roles})
                    continue
                if record is None:
                    await self._reply_error(conn, msg, f"{msg.kind!r} before register")
                    return
                waiter = await self._dispatch(record, conn, msg, fields)
                if waiter is not None:
                    waiters.add(waiter)
                    waiter.add_done_callback(waiters.discard)
                    waiter.add_done_callback(self._waiter_done)
        except ConnectionClosed:
            pass
        except BadMessage as exc:
            self.bad_messages += 1
            who = record.name if record is not None else f"{conn.peer_name} (unregistered)"
            if record is None:
                self._log_refusal("closing the connection of %s from %s: %s", who, conn.peer, exc)
            else:
                log.error("closing the connection of %s: bad message: %s", who, exc)
            conn.abort()
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

    def _waiter_done(self, task: asyncio.Task) -> None:
        """A request's task that raised is a bug of the coordinator's: log it, fail the run."""
        if not task.cancelled() and task.exception() is not None:
            exc = task.exception()
            log.error("%s failed: %s: %s", task.get_name(), type(exc).__name__, exc, exc_info=exc)
            self.begin_stop(f"coordinator task {task.get_name()} failed: {type(exc).__name__}: {exc}", failed=True)

    def check_session(self, name: str, session: str) -> str | None:
        """None when `session` is the id of `name`'s live registration, else why not."""
        record = self.roles.get(name)
        if record is None or record.session is None:
            return f"{name} is not registered in this run"
        if not hmac.compare_digest(record.session, session):
            return f"not the session of {name}'s current registration"
        if not record.live:
            return f"{name}'s registration has ended ({record.status})"
        return None

    async def _register(self, conn: Connection, msg: Message, meta: dict) -> RoleRecord | None:
        name = meta["role"]
        incarnation = meta.get("incarnation", "")
        record = self.roles.get(name)
        reason = None
        if record is None:
            reason = (
                f"unknown role {name!r}: this cluster has {self.cfg.cluster.actors} actors, "
                f"{self.cfg.cluster.memories} memories, {self.cfg.cluster.learners} learners"
            )
        elif meta.get("config_hash") != self.config_hash:
            reason = (
                f"config hash mismatch: {name} runs config {meta.get('config_hash')}, the coordinator "
                f"runs {self.config_hash}; start every role with the same config"
            )
        if reason is not None:  # a misconfigured process: the error is the user's to fix
            self.registrations_refused += 1
            self._log_refusal("refused registration from %s: %s", conn.peer, reason)
            await conn.reply_error(msg, reason)
            await conn.close()
            return None
        if record.status == "running" and record.incarnation != incarnation:
            await self._await_replaced(record)
        admission, reason = self._admission(record, incarnation)
        if reason is not None:  # the right process at the wrong time (or an impostor): it exits
            self.registrations_refused += 1
            self._log_refusal("did not admit %s from %s: %s", name, conn.peer, reason)
            await conn.reply(msg, meta={"admitted": False, "reason": reason})
            await conn.close()
            return None
        if record.conn is not None and record.conn is not conn:
            record.conn.abort()  # a half-open connection of the process that just rejoined
        record.conn = conn
        record.pid = meta.get("pid")
        record.host = meta.get("host")
        address = meta.get("address")
        old_address = record.address
        record.address = (str(address[0]), int(address[1])) if address else None
        if admission != "rejoin" or record.session is None:
            record.session = secrets.token_hex(16)  # a rejoin keeps its memory hosts' connections
        if name == "learner-0" and meta.get("rendezvous"):
            self.rendezvous = meta["rendezvous"]  # learner 0 listens there (aiorl.runtime.rendezvous)
        record.last_heartbeat = asyncio.get_running_loop().time()
        record.stall_at_heartbeat_s = self.stalled_s
        record.disconnected_at = None
        if admission == "restart":
            for key, value in record.counters.items():
                record.retired[key] = record.retired.get(key, 0) + value
            record.counters = {}
            record.restarts += 1
            record.incarnation = incarnation
            log.warning(
                "%s restarted (restart %d of %d; pid %s, %s)",
                name,
                record.restarts,
                self.cfg.cluster.max_restarts,
                record.pid,
                conn.peer,
            )
        elif admission == "rejoin":
            log.warning("%s rejoined after its connection dropped (pid %s, %s)", name, record.pid, conn.peer)
        else:
            record.incarnation = incarnation
            log.info("registered %s (pid %s, %s)", name, record.pid, conn.peer)
        if record.status != "done":
            record.status = "running"
            record.reason = None
        for barrier in self.barriers.values():
            if record.kind == "actor" and record.status == "running":
                barrier.add(record.name)
        if record.kind == "actor":
            self.no_actor_since = None
        self.role_changed.set()
        conn.set_limits(frame_limits.to_coordinator(name, self.algo))
        await conn.reply(
            msg,
            meta={
                "phase": int(self.phase),
                "config_hash": self.config_hash,
                "admission": admission,
                "restarts": record.restarts,
                "session": record.session,
            },
        )
        if self.started.is_set() and record.kind == "memory" and record.address != old_address:
            await self.broadcast("memories", {"memories": self._memory_addresses()})
        if all(r.status == "running" for r in self.roles.values()):
            self.started.set()
        return record

    def _admission(self, record: RoleRecord, incarnation: str) -> tuple[str | None, str | None]:
        """("first" | "rejoin" | "restart", None), or (None, why the registration is refused)."""
        name, status, phase = record.name, record.status, self.phase
        if status == "expected" or record.session is None:  # it never registered (lost at the start)
            if phase != Phase.STARTING:
                return None, f"{name} registered too late: the run is in phase {phase.name}"
            return "first", None
        if incarnation and incarnation == record.incarnation:
            if status == "failed" or phase >= Phase.EXITED:
                return None, f"{name} cannot rejoin: it is {status} and the run is in phase {phase.name}"
            if status == "lost":  # given up (silent too long): its work and rounds went on without it
                return None, f"{name} cannot rejoin: it was declared lost ({record.reason})"
            return "rejoin", None
        if status in ("running", "done"):
            return None, f"{name} is already registered (status {status})"
        c = self.cfg.cluster
        if not restartable(record.kind, record.index) or self.synchronous:
            return None, f"{name} is {status} and is not restarted (see aiorl/restart.py)"
        if record.restarts >= c.max_restarts:
            return None, f"{name} used its {c.max_restarts} restart(s) (cluster.max_restarts)"
        if phase != Phase.RUNNING:
            return None, f"{name} cannot restart: the run is in phase {phase.name}"
        return "restart", None

    async def _await_replaced(self, record: RoleRecord) -> None:
        """A new process for a role whose old one still looks alive: give the heartbeat monitor
        its time to find the old one lost (a restart after a crash the coordinator missed)."""
        deadline = self.cfg.cluster.heartbeat_timeout_s + self.cfg.cluster.heartbeat_interval_s
        try:
            async with asyncio.timeout(deadline):
                while record.status == "running":
                    self.role_changed.clear()
                    await self.role_changed.wait()
        except TimeoutError:
            pass

    def _memory_addresses(self) -> list:
        """Where each memory host serves, None for one that is away (it may be restarting)."""
        out = []
        for i in range(self.cfg.cluster.memories):
            record = self.roles[role_name("memory", i)]
            up = record.address is not None and record.status in ("running", "done")
            out.append(list(record.address) if up else None)
        return out

    def _connection_lost(self, record: RoleRecord) -> None:
        record.conn = None
        if record.status == "running":
            record.status = "disconnected"
            record.disconnected_at = asyncio.get_running_loop().time()
            log.warning(
                "%s: its connection to the coordinator closed; waiting %.1f s for it to rejoin",
                record.name,
                self._rejoin_grace_s,
            )
            self.role_changed.set()

    @property
    def _rejoin_grace_s(self) -> float:
        c = self.cfg.cluster
        return c.coordinator_timeout_s + 2 * c.heartbeat_interval_s

    def _mark(self, record: RoleRecord, status: str, reason: str) -> None:
        if record.status in ("lost", "failed"):
            # A hung role that wakes after it was given up finds its links cut and reports that:
            # the first verdict is the one that explains the run.
            log.info("%s, already %s (%s), also reports: %s", record.name, record.status, record.reason, reason)
            return
        record.status = status
        record.reason = reason
        log.warning("%s %s: %s", record.name, status, reason)
        self.role_changed.set()
        for name, barrier in self.barriers.items():
            if record.name in barrier.participants:
                barrier.remove(record.name)
                log.warning(
                    "barrier %r goes on without %s: %d parties left", name, record.name, len(barrier.participants)
                )
        if status in ("lost", "failed"):
            if record.kind == "actor":
                self._actor_gone(record)
            self._role_failed(record)

    def _actor_gone(self, record: RoleRecord) -> None:
        """Its work items go to other actors; memories stop waiting for its rollouts."""
        if self.work is not None:
            items = self.work.release(record.name)
            if items:
                log.warning(
                    "work items %s of iteration %d, held by %s, go back to the queue",
                    items,
                    self.work.iteration,
                    record.name,
                )
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

    def _restart_left(self, record: RoleRecord) -> bool:
        return (
            not self.synchronous
            and restartable(record.kind, record.index)
            and record.restarts < self.cfg.cluster.max_restarts
        )

    def _may_restart(self, record: RoleRecord) -> bool:
        return self.phase == Phase.RUNNING and self._restart_left(record)

    def _role_failed(self, record: RoleRecord) -> None:
        """A role was lost or failed: what it means for the run (its own line is listed at the end)."""
        kind_alive = [r for r in self.roles.values() if r.kind == record.kind and r.live]
        restart = self._may_restart(record)
        if restart:
            log.warning(
                "%s may come back: %d restart(s) left", record.name, self.cfg.cluster.max_restarts - record.restarts
            )
        if record.kind == "actor":
            if self.phase <= Phase.RUNNING and not kind_alive:
                if restart:  # the heartbeat monitor ends the run if none is back in time
                    self.no_actor_since = asyncio.get_running_loop().time()
                else:
                    self.begin_stop("every actor is gone", failed=True)
            return
        if restart:
            return
        # Losing a learner or a memory host loses data or learning: end the run.
        self.begin_stop(f"{record.name} {record.status}: {record.reason}", failed=True, role=record)

    async def _dispatch(self, record: RoleRecord, conn: Connection, msg: Message, fields: dict) -> asyncio.Task | None:
        kind = msg.kind
        if kind == "heartbeat":
            self._heartbeat(record, fields)
            await conn.reply(
                msg,
                meta={
                    "phase": int(self.phase),
                    "weights_version": self.weights_version,
                    "env_steps": self.env_steps,
                    "learner_steps": self.learner_steps,
                    "episodes": self.episodes,
                },
            )
        elif kind == "run_state":  # learner 0 checkpointing: its own counters first, so they are exact
            self._heartbeat(record, {"counters": fields.get("counters")})
            await conn.reply(msg, meta=self.run_state())
        elif kind == "wait_start":
            return asyncio.create_task(self._answer_start(conn, msg), name=f"start for {record.name}")
        elif kind == "publish":
            await self._publish(record, conn, msg)
        elif kind == "get_weights":
            return asyncio.create_task(self._answer_weights(conn, msg, fields), name=f"weights for {record.name}")
        elif kind == "barrier":
            return asyncio.create_task(
                self._answer_barrier(record, conn, msg, fields), name=f"barrier for {record.name}"
            )
        elif kind == "work":
            return asyncio.create_task(self._answer_work(record, conn, msg, fields), name=f"work for {record.name}")
        elif kind == "check_session":
            if record.kind != "memory":
                await conn.reply_error(msg, f"only memory hosts check sessions, not {record.name}")
            else:
                reason = self.check_session(fields["role"], fields["session"])
                await conn.reply(msg, meta={"ok": reason is None, "reason": reason})
        elif kind == "done":
            self._heartbeat(record, fields)
            stats = unpack_table(msg.arrays["stats"]) if "stats" in msg.arrays else fields.get("stats", {})
            record.stats = any_map(stats, "done.stats")
            if record.status == "running":
                record.status = "done"
                record.done_phase = self.phase.name
                log.info("%s done in phase %s", record.name, self.phase.name)
                self.role_changed.set()
            await conn.reply(msg)
        elif kind == "fail":
            reason = safe_text(fields.get("reason", "no reason given"), 1000)
            self._mark(record, "failed", reason)
            await conn.reply(msg)
        elif kind == "stop":  # the role got a signal
            self.interrupt(safe_text(fields.get("reason", "a signal")), record.name)
            await conn.reply(msg)
        else:
            await self._reply_error(conn, msg, f"unknown control message {kind!r}")
        return None

    def _heartbeat(self, record: RoleRecord, fields: dict) -> None:
        record.last_heartbeat = asyncio.get_running_loop().time()
        record.stall_at_heartbeat_s = self.stalled_s
        counters = fields.get("counters")
        if counters:
            self._set_counters(record, counters)
        metrics = fields.get("metrics")
        if metrics:
            record.metrics = metrics
        evaluation = fields.get("evaluation")
        if (
            evaluation is not None
            and record.kind == "learner"
            and (self.evaluation is None or evaluation["count"] != self.evaluation["count"])
        ):
            self.evaluation = evaluation
            self._evaluation_row = evaluation["last"] is not None
        returns = fields.get("episode_returns")
        if returns:
            self.returns.extend(returns)
            self.lengths.extend(fields.get("episode_lengths", ()))
            self.episodes += len(returns)
        self._check_stop_criteria()

    async def _answer_start(self, conn: Connection, msg: Message) -> None:
        try:
            await self.start_settled.wait()
            if self.stop_event.is_set():  # it will never run: a role did not register, or Ctrl-C
                await conn.reply(msg, meta={"stop": True, "reason": self.stop_reason, "phase": int(self.phase)})
                return
            await conn.reply(
                msg,
                meta={"memories": self._memory_addresses(), "rendezvous": self.rendezvous, "phase": int(self.phase)},
            )
        except ConnectionClosed:
            pass

    async def _publish(self, record: RoleRecord, conn: Connection, msg: Message) -> None:
        if record.name != "learner-0":
            await conn.reply_error(msg, f"only learner-0 publishes weights, not {record.name}")
            return
        if self._weights_rows is not None:  # actors load these as they are: refuse what they could not
            self._weights_rows.rows("publish", {k: v[None] for k, v in msg.arrays.items()})
        async with self.weights_changed:
            # The arrays are views over the received frame: keeping them is free.
            self.weights = dict(msg.arrays)
            self.weights_version += 1
            if len(self.weights_published) < WEIGHTS_PUBLISHED_KEPT:
                self.weights_published.append((self.weights_version, time.monotonic()))
            self.weights_changed.notify_all()
        if self.work is not None:
            self.work.start(self.weights_version)  # iteration k's items act with version k
            self._wake_work()
        await conn.reply(msg, meta={"version": self.weights_version})

    async def _answer_weights(self, conn: Connection, msg: Message, fields: dict) -> None:
        """Reply with the weights if newer than ``have``; with ``min_version``, wait for it."""
        have = fields.get("have", -1)
        min_version = fields.get("min_version")
        try:
            if min_version is not None:
                # Weights held, not only a version: a resumed run's version comes from its
                # checkpoint before learner 0 has published anything.
                async with self.weights_changed:
                    await self.weights_changed.wait_for(
                        lambda: (
                            (self.weights and self.weights_version >= int(min_version)) or self.phase > Phase.RUNNING
                        )
                    )
                if not self.weights or self.weights_version < int(min_version):
                    await conn.reply(msg, meta={"version": self.weights_version, "stop": True})
                    return
            if self.weights_version > have:
                await conn.reply(msg, meta={"version": self.weights_version}, arrays=self.weights)
            else:
                await conn.reply(msg, meta={"version": self.weights_version})
        except ConnectionClosed:
            pass

    async def _answer_barrier(self, record: RoleRecord, conn: Connection, msg: Message, fields: dict) -> None:
        """Reply once every live participant arrived; ``stop: True`` when the run stops first."""
        name = fields.get("name", "default")
        try:
            if self.phase > Phase.RUNNING:  # late arrivals: the barriers were aborted
                await conn.reply(msg, meta={"stop": True})
                return
            barrier = self.barriers.get(name)
            if barrier is None:
                live = [r.name for r in self.roles.values() if r.kind == record.kind and r.status == "running"]
                barrier = self.barriers[name] = Barrier(live)
            try:
                await barrier.wait(record.name, fields["generation"])
            except BarrierAborted:
                await conn.reply(msg, meta={"stop": True})
                return
            except ValueError as exc:
                await self._reply_error(conn, msg, f"barrier {name!r}: {exc}")
                return
            await conn.reply(msg, meta={"generation": fields["generation"]})
        except ConnectionClosed:
            pass

    async def _answer_work(self, record: RoleRecord, conn: Connection, msg: Message, fields: dict) -> None:
        """End the lease of the item reported ``done``, then hand out the next item
        (``iteration``, ``item``); wait while every item of the iteration is taken;
        ``stop: True`` once the run stops."""
        try:
            if self.work is None:
                await self._reply_error(conn, msg, f"{self.cfg.algo} hands out no work items")
                return
            done = fields.get("done")
            if done is not None:
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
        async def send(conn: Connection) -> None:
            try:
                await conn.send(kind, meta)
            except ConnectionClosed:
                pass

        # The connections as they are now: gather starts each send a loop turn later, by when a
        # role's connection may have closed (record.conn None: at 512 actors that crashed the
        # coordinator in the phase change to STOPPING, bench/scale.py).
        targets = [r.conn for r in self.roles.values() if r.conn is not None]
        await asyncio.gather(*(send(conn) for conn in targets))

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
            return [
                r
                for r in self.roles.values()
                if (kind is None or r.kind == kind) and r.status in ("running", "disconnected")
            ]

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
            await record.conn.send(
                "exit",
                {
                    "ok": ok,
                    "role_ok": record.status == "done",
                    "reason": record.reason,
                    "outcome": self.outcome,
                    "signal": self.interrupted_by,
                },
            )
        except ConnectionClosed:
            pass

    async def run(self) -> bool:
        """Drive the phases of the run; return True when it ended cleanly."""
        c = self.cfg.cluster
        metrics_task = asyncio.create_task(self._metrics_loop())
        monitor_task = asyncio.create_task(self._heartbeat_monitor())
        lag_task = asyncio.create_task(self.lag_probe.run())
        try:
            try:
                async with asyncio.timeout(c.start_timeout_s):
                    await self.started.wait()
            except TimeoutError:
                missing = sorted(r.name for r in self.roles.values() if r.status != "running")
                self.begin_stop(
                    f"roles did not register within cluster.start_timeout_s "
                    f"({c.start_timeout_s:g} s): {', '.join(missing)}",
                    failed=True,
                )
                for record in self.roles.values():
                    if record.status == "expected":
                        self._mark(record, "lost", "never registered")
            self.start_settled.set()
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
            self._settle_outcome()
            ok = self.outcome != FAILED
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
            lag_task.cancel()
            await asyncio.gather(metrics_task, monitor_task, lag_task, *self._pushes, return_exceptions=True)
            self._write_metrics_row()
            self._metrics.close()

    outcome: str | None = None

    def _settle_outcome(self) -> None:
        """failed (a role lost or failed, a deadline missed), interrupted (a signal) or finished.

        A role lost while it still had restarts left is not a failure: it was on its way back
        when the run ended (its restart arrives too late to be admitted)."""
        self.lost_restartable.clear()
        for record in self.roles.values():
            if record.status == "lost" and self._restart_left(record):
                self.lost_restartable.append(record.name)
            elif record.status in ("lost", "failed"):
                line = f"{record.name} {record.status}: {record.reason}"
                if line not in self.failures:
                    self.failures.append(line)
        if (
            self.failures
            or self.stopped_by_failure
            or not all(r.status == "done" or r.name in self.lost_restartable for r in self.roles.values())
        ):
            self.outcome = FAILED
        elif self.interrupted_by is not None:
            self.outcome = INTERRUPTED
        else:
            self.outcome = FINISHED

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

    def silence_s(self, record: RoleRecord, now: float) -> float:
        """How long `record` has been silent while the coordinator itself was listening.

        Time the coordinator's own loop spent stalled (a GC pause, SIGSTOP, an
        overloaded machine) since that role's last heartbeat is not the role's
        silence: its heartbeats were waiting, unread, in the socket.
        """
        return now - record.last_heartbeat - (self.stalled_s - record.stall_at_heartbeat_s)

    async def _heartbeat_monitor(self) -> None:
        c = self.cfg.cluster
        loop = asyncio.get_running_loop()
        while True:
            expected = loop.time() + c.heartbeat_interval_s
            await asyncio.sleep(c.heartbeat_interval_s)
            lag = max(0.0, loop.time() - expected)
            self.loop_lag_max_s = max(self.loop_lag_max_s, lag)
            if lag > 0:
                # The stall is granted as grace, and the heartbeats that queued up
                # during it are read before anyone is judged: after a stall this
                # timer can fire before the loop has run the readers of the sockets.
                self.stalled_s += lag
                await asyncio.sleep(0)
            now = loop.time()
            for record in self.roles.values():
                silence = self.silence_s(record, now)
                if record.status == "running" and silence > c.heartbeat_timeout_s:
                    self._mark(
                        record,
                        "lost",
                        f"no heartbeat for {silence:.1f} s (cluster.heartbeat_timeout_s {c.heartbeat_timeout_s:g})",
                    )
                    if record.conn is not None:
                        record.conn.abort()
                elif record.status == "disconnected" and now - record.disconnected_at > self._rejoin_grace_s:
                    self._mark(
                        record,
                        "lost",
                        f"its connection to the coordinator closed and it did not "
                        f"rejoin within {self._rejoin_grace_s:.1f} s",
                    )
            if self.no_actor_since is not None and now - self.no_actor_since > c.start_timeout_s:
                self.no_actor_since = None
                self.begin_stop(
                    f"every actor is gone and none restarted within cluster.start_timeout_s ({c.start_timeout_s:g} s)",
                    failed=True,
                )

    # ------------------------------------------------------------------ reporting

    def status(self) -> dict:
        now = asyncio.get_running_loop().time()
        return {
            "phase": self.phase.name,
            "stop_reason": self.stop_reason,
            "run_id": self.identity.run_id,
            "launch_id": self.identity.launch_id,
            "attempt": self.identity.attempt,
            "restarts": self.restarts,
            "elapsed_s": round(time.time() - self.t_start, 3),
            "env_steps": self.env_steps,
            "learner_steps": self.learner_steps,
            "episodes": self.episodes,
            "return_mean_100": float(np.mean(self.returns)) if self.returns else None,
            "weights_version": self.weights_version,
            "loop_lag_max_s": round(self.loop_lag_max_s, 6),
            "loop_lag": self.lag_probe.snapshot(),
            "work": None
            if self.work is None
            else {
                "iteration": self.work.iteration,
                "pending": list(self.work.pending),
                "leases": {str(item): worker for item, worker in self.work.leases.items()},
                "released": self.work.released,
            },
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
            "attempt": self.identity.attempt,
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
            "actor_blocked_s": round(sum(m.get("blocked_s", 0.0) for m in actors), 3),
            "sample_blocked_s": round(sum(m.get("sample_blocked_s", 0.0) for m in memories), 3),
            "restarts": self.restarts,
            "loop_lag_max_s": max(
                [m.get("loop_lag_s", 0.0) for r in roles for m in [r.metrics] if m] + [self.loop_lag_max_s]
            ),
            "rss_bytes": sum(r.metrics.get("rss_bytes", 0) for r in roles if r.live),
            "roles_alive": sum(r.status in ("running", "disconnected", "done") for r in roles),
            "roles_late": [
                r.name
                for r in roles
                if r.status == "disconnected" or (r.status == "running" and self.silence_s(r, loop_now) > late_after)
            ],
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
        if self._evaluation_row:  # once per evaluation: a plot or TensorBoard gets one point each
            row.update(evaluation_metrics(self.evaluation))
            self._evaluation_row = False
        return row

    def _write_metrics_row(self) -> None:
        self.last_row = self.metrics_row()
        try:
            self._metrics.write(self.last_row)
        except OSError as exc:  # a full disk or no file descriptor left must not end the run
            self._log_housekeeping("could not write a metrics row: %s", exc)

    async def _metrics_loop(self) -> None:
        while True:
            self._write_metrics_row()
            await asyncio.sleep(self.cfg.run.metrics_interval_s)

    def write_summary(self, ok: bool) -> None:
        interrupted = self.outcome == INTERRUPTED
        summary = {
            "ok": ok,
            "outcome": self.outcome,
            "stop_reason": "interrupted" if interrupted else self.stop_reason,
            "stop_detail": self.stop_reason,
            "signal": self.interrupted_by if interrupted else None,
            "written_by": "coordinator",
            "resumed_from": self.resumed_from,
            "restarts": self.restarts,
            "lost_with_restarts_left": self.lost_restartable,
            "failures": self.failures,
            "phases": self.phase_times,
            "stopped_at": self.stopped_at,
            "env_steps": self.env_steps,
            "learner_steps": self.learner_steps,
            "episodes": self.episodes,
            "return_mean_100": float(np.mean(self.returns)) if self.returns else None,
            "evaluation": self.evaluation,
            "weights_version": self.weights_version,
            "weights_published_monotonic": self.weights_published,
            "registrations_refused": self.registrations_refused,
            "bad_messages": self.bad_messages,
            "connections_refused_busy": self.server.stats["refused_busy"] if self.server else 0,
            "handshakes_failed": self.server.stats["handshake_failures"] if self.server else 0,
            "roles": {
                name: {
                    "status": r.status,
                    "reason": r.reason,
                    "pid": r.pid,
                    "restarts": r.restarts,
                    "done_phase": r.done_phase,
                    "counters": r.counters,
                    "retired_counters": r.retired,
                    "stats": r.stats,
                }
                for name, r in self.roles.items()
            },
        }
        write_json_atomic(self.run_dir / "summary.json", self.identity.stamp(summary), indent=1)
