"""The coordinator's service: registration, heartbeats, counters, stop criteria, barriers,
the parameter store and the shutdown phases, answered over every role's control
connection. It lives in memory host 0.

Every role keeps one control connection to it. Requests (register, heartbeat,
publish, get_weights, barrier, work, done, stop, run_state) are answered on
that connection; the local launcher keeps one of its own, on which it reports
each child's exit (`notices`); phase changes, ``role_lost`` (to memories), memory host
addresses and the final ``exit`` are pushed to roles on it. Every request is
checked (`aiorl.runtime.messages`): a bad one closes that connection, which
loses that role. Each registration gets a session id, which memory hosts
check (``check_session``) before a role may attach.

The service dispatches (one handler per request kind, `Coordinator._handlers`) and
acts; its parts decide: who is admitted as what (`registration`, over the `roster`),
who is lost (`roster`, `liveness`, the launcher's exit `notices`), when the run stops
(`counters`), which weights an actor gets (`params`), how the run ended (`phases`),
and what is reported (`report`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

from aiorl.config import Config
from aiorl.core.ratelog import RateLimitedLog
from aiorl.io.metrics import MetricsWriter
from aiorl.io.rundir import Identity, RunDirDeleted, launcher_pid
from aiorl.runtime import frame_limits
from aiorl.runtime.algorithm import build_algorithm
from aiorl.runtime.coordinator.counters import RunCounters, Stop, metrics_step
from aiorl.runtime.coordinator.handlers import RoleRequests
from aiorl.runtime.coordinator.liveness import Liveness
from aiorl.runtime.coordinator.notices import ExitNotices
from aiorl.runtime.coordinator.params import ParameterStore
from aiorl.runtime.coordinator.phases import PhaseClock, first_done, settle_outcome, wait_done
from aiorl.runtime.coordinator.pushes import Pushes
from aiorl.runtime.coordinator.registration import Admission, Admissions
from aiorl.runtime.coordinator.report import Report
from aiorl.runtime.coordinator.requests import Requests, reply_error
from aiorl.runtime.coordinator.roster import RoleRecord, Roster
from aiorl.runtime.first_request import first_request
from aiorl.runtime.messages import BadMessage, check, pack_table
from aiorl.runtime.phase import FAILED, PHASE_OWNER, Phase
from aiorl.runtime.resources import listen_backlog
from aiorl.runtime.restart import LAUNCHER_PEER
from aiorl.runtime.transport import transport_of
from aiorl.runtime.work import WorkQueue
from aiorl.wire import Connection, ConnectionClosed, Message, Server, serve

log = logging.getLogger("aiorl.coordinator")


class Coordinator:
    """Owns the run's global state; one instance, inside memory host 0."""

    def __init__(self, cfg: Config, run_dir: str | Path, token: bytes, ssl=None, identity: Identity | None = None):
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.token = token
        self.ssl = ssl
        self.identity = identity or Identity.from_env()
        self.config_hash = cfg.config_hash()
        algo = cfg.algorithm
        self.synchronous = algo.is_synchronous(cfg)
        self.roster = Roster(cfg, self.synchronous)
        self.phases = PhaseClock()
        self.started = asyncio.Event()
        self.start_settled = asyncio.Event()  # the run started, or stopped before it could
        self.stop = Stop()
        self.counters = RunCounters()
        self.params = ParameterStore()
        self.liveness = Liveness(cfg)
        self._log_refusal = RateLimitedLog(log, logging.WARNING, burst=10, per_s=0.5)
        # Read now, before any other role process exists to rewrite run.json.
        launcher = launcher_pid(self.run_dir, self.identity)
        self.notices = ExitNotices(launcher, cfg.cluster.coordinator_timeout_s, log_refusal=self._log_refusal)
        self.lost_restartable: list[str] = []  # lost at the end with restarts left (not failures)
        items = algo.work_items(cfg) if self.synchronous else None
        self.work = WorkQueue(items) if items else None  # work items of the current iteration
        self.requests = Requests(cfg, self.phases, self.roster, self.params, self.stop, self.work, self.start_settled)
        self.barriers = self.requests.barriers
        by_iteration = self.synchronous and self.work is None  # DPPO: one rollout per actor and iteration
        self.admissions = Admissions(
            self.roster, self.phases, self.params, self.notices, self.config_hash, by_iteration
        )
        self.role_requests = RoleRequests(
            cfg,
            phases=self.phases,
            roster=self.roster,
            counters=self.counters,
            params=self.params,
            stop=self.stop,
            liveness=self.liveness,
            requests=self.requests,
            notices=self.notices,
            mark=self._mark,
            begin_stop=self.begin_stop,
            interrupt=self.interrupt,
            log_refusal=self._log_refusal,
        )
        # The handler of each request kind a registered role may send (`_dispatch`).
        self._handlers = {"status": self._on_status, **self.role_requests.table()}
        self.pushes = Pushes(self.roster.roles)
        self.server: Server | None = None
        if self.identity.resume_from:
            run = self.counters.resume(self.identity.resume_from, cfg.cluster.learners)
            if not self.synchronous:  # synchronous iterations count versions from 0 in every launch
                self.params.weights_version = int(run.get("weights_version", -1))
        self.report = Report(
            cfg,
            self.identity,
            self.phases,
            self.roster,
            self.counters,
            self.params,
            self.liveness,
            self.stop,
            self.work,
        )
        # Made now, before serving: importing TensorBoard's writer takes a while.
        self._metrics = MetricsWriter(
            self.run_dir,
            tensorboard=cfg.run.tensorboard,
            purge_step=self.counters.base[metrics_step(cfg)] if self.counters.resumed_from else None,
            loggers=cfg.run.loggers,
            config=cfg.to_dict(),
        )
        self.last_row: dict = {}
        self.outcome: str | None = None
        self.registrations_refused = 0
        self.unregistered_closed = 0  # authenticated connections that never registered in time
        self.bad_messages = 0
        self._log_bad = RateLimitedLog(log, logging.ERROR, burst=10, per_s=0.5)
        self._log_housekeeping = RateLimitedLog(log, logging.ERROR, burst=5, per_s=0.1)

    def __repr__(self) -> str:
        alive = sum(r.live for r in self.roles.values())
        return f"<Coordinator phase={self.phase.name} roles={alive}/{len(self.roles)} weights_v={self.weights_version}>"

    # ------------------------------------------------------------------ the parts' state, by name

    @property
    def roles(self) -> dict[str, RoleRecord]:
        return self.roster.roles

    @property
    def phase(self) -> Phase:
        return self.phases.phase

    @property
    def env_steps(self) -> int:
        return self.counters.env_steps

    @property
    def learner_steps(self) -> int:
        return self.counters.learner_steps

    @property
    def restarts(self) -> int:
        return self.roster.restarts

    @property
    def counters_refused(self) -> int:
        return self.role_requests.counters_refused

    @property
    def weights_version(self) -> int:
        return self.params.weights_version

    @property
    def stalled_s(self) -> float:
        return self.liveness.stalled_s

    @property
    def lag_probe(self):
        return self.liveness.lag_probe

    @property
    def stop_event(self) -> asyncio.Event:
        return self.stop.event

    @property
    def stop_reason(self) -> str | None:
        return self.stop.reason

    @property
    def stopped_by_failure(self) -> bool:
        return self.stop.by_failure

    @property
    def failures(self) -> list[str]:
        return self.stop.failures

    @property
    def interrupted_by(self) -> str | None:
        return self.stop.interrupted_by

    def run_state(self) -> dict:
        """What a checkpoint records of the run, so that a resume continues it."""
        return self.counters.run_state(self.params.weights_version)

    def silence_s(self, record: RoleRecord, now: float) -> float:
        return self.liveness.silence_s(record, now)

    def check_session(self, name: str, session: str) -> str | None:
        """None when `session` is the id of `name`'s live registration, else why not."""
        return self.roster.check_session(name, session)

    def status(self) -> dict:
        return self.report.status(self.last_row)

    def metrics_row(self) -> dict:
        return self.report.metrics_row()

    # ------------------------------------------------------------------ the stop

    def begin_stop(
        self, reason: str, counter: str | None = None, failed: bool = False, role: RoleRecord | None = None
    ) -> None:
        """Stop the run; `counter`: the one whose budget was reached; `failed`: because something
        went wrong (a `role`'s loss is listed at the end)."""
        self.stop.begin(reason, self.counters, failed, listed_later=role is not None, counter=counter)

    def interrupt(self, signal_name: str, who: str) -> None:
        """A signal asked the run to stop before its stop criterion held."""
        if self.stop_event.is_set():
            return
        self.stop.interrupted_by = signal_name
        self.begin_stop(f"interrupted by {signal_name} ({who})")

    # ------------------------------------------------------------------ serving

    async def start(self, host: str, port: int, unix_path: str | None = None) -> int:
        self.algo = build_algorithm(self.cfg)
        self.params.set_spec(self.algo.weights_spec())
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
            first_bytes_timeout_s=c.first_bytes_timeout_s,
            **transport_of(self.cfg).serve_args(unix_path),
        )
        return self.server.port

    async def _on_connection(self, conn: Connection) -> None:
        record: RoleRecord | None = None
        # Requests that wait (start, barrier, weights of a version) get a task each so
        # the heartbeats on this connection keep being answered; they end with it.
        waiters: set[asyncio.Task] = set()
        try:
            if conn.peer_name == LAUNCHER_PEER:
                await self._launcher_notices(conn)
                return
            record = await self._until_registered(conn)
            if record is None:
                return
            async for msg in conn:
                fields = check(msg.kind, msg.meta)
                if msg.request_id is None:
                    raise BadMessage(f"{msg.kind} must be a request")
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
                self._log_bad("closing the connection of %s: bad message: %s", who, exc)
            conn.abort()
        finally:
            for waiter in list(waiters):
                waiter.cancel()
            await asyncio.gather(*waiters, return_exceptions=True)
            if record is not None and record.conn is conn:
                self._connection_lost(record)

    # ------------------------------------------------------------------ registration

    async def _until_registered(self, conn: Connection) -> RoleRecord | None:
        """Answer `status` until the peer registers, all within cluster.coordinator_timeout_s: an
        authenticated connection that never registers would hold one of max_connections for ever
        (the memory host gives `attach` the same deadline). None: refused, timed out or closed."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.cfg.cluster.coordinator_timeout_s
        while True:
            first = await self._first_request(conn, deadline - loop.time())
            if first is None:
                return None
            msg, fields = first
            if msg.kind == "register":
                return await self._register(conn, msg, fields)
            if msg.kind == "child_exit":
                await self.notices.refuse_request(
                    conn, msg, f"{conn.peer_name} (unregistered)", self.notices.refusal(conn)
                )
                return None
            if msg.kind != "status":
                await reply_error(conn, msg, f"{msg.kind!r} before register")
                return None
            await self._reply_status(conn, msg)

    async def _first_request(self, conn: Connection, timeout_s: float) -> tuple[Message, dict] | None:
        """A connection's next request, or None once it is closed for not sending one in time."""
        try:
            return await first_request(conn, timeout_s)
        except TimeoutError as exc:
            self.unregistered_closed += 1
            self._log_refusal("closing the connection of %s from %s: %s", conn.peer_name, conn.peer, exc)
            conn.abort()
            return None

    async def _reply_status(self, conn: Connection, msg: Message) -> None:
        status = self.status()
        roles = pack_table(status.pop("roles"))  # over 64 KiB of header from ~400 roles on
        await conn.reply(msg, meta=status, arrays={"roles": roles})

    async def _register(self, conn: Connection, msg: Message, meta: dict) -> RoleRecord | None:
        """Act on the admission of a ``register`` request: refuse it, or take the role in."""
        admission = await self.admissions.admit(conn.peer_name, meta)
        if not admission.admitted:
            await self._refuse_registration(conn, msg, admission)
            return None
        record = self.roles[admission.role]
        if record.conn is not None and record.conn is not conn:
            record.conn.abort()  # a half-open connection of the process that just rejoined
        self.admissions.enter(record, admission, conn, meta)
        if record.name == "learner-0" and meta.get("rendezvous"):
            self.requests.rendezvous = meta["rendezvous"]  # learner 0 listens there (aiorl.runtime.rendezvous)
        self.liveness.heard(record)
        self._log_admission(record, admission, conn)
        self._joined(record, admission)
        conn.set_limits(frame_limits.to_coordinator(record.name, self.algo))
        joins = admission.joins_iteration
        await conn.reply(
            msg,
            meta={
                "phase": int(self.phase),
                "config_hash": self.config_hash,
                "admission": admission.admitted_as,
                "restarts": record.restarts,
                "session": record.session,
                **({"iteration": joins} if joins is not None else {}),
            },
        )
        if admission.role_back is not None:
            self.pushes.to_memories("role_back", admission.role_back)
        if self.started.is_set() and admission.moved:
            await self.pushes.broadcast("memories", {"memories": self.roster.memory_addresses()})
        if all(r.status == "running" for r in self.roles.values()):
            self.started.set()
        return record

    async def _refuse_registration(self, conn: Connection, msg: Message, admission: Admission) -> None:
        self.registrations_refused += 1
        if admission.misconfigured:  # a misconfigured process: the error is the user's to fix
            self._log_refusal("refused registration from %s: %s", conn.peer, admission.reason)
            await conn.reply_error(msg, admission.reason)
        else:  # the right process at the wrong time (or an impostor): it exits
            self._log_refusal("did not admit %s from %s: %s", admission.role, conn.peer, admission.reason)
            await conn.reply(msg, meta={"admitted": False, "reason": admission.reason})
        await conn.close()

    def _log_admission(self, record: RoleRecord, admission: Admission, conn: Connection) -> None:
        if admission.admitted_as == "restart":
            restart = f"restart {record.restarts} of {self.cfg.cluster.max_restarts}"
            log.warning("%s restarted (%s; pid %s, %s)", record.name, restart, record.pid, conn.peer)
        elif admission.admitted_as == "rejoin":
            log.warning("%s rejoined after its connection dropped (pid %s, %s)", record.name, record.pid, conn.peer)
        else:
            log.info("registered %s (pid %s, %s)", record.name, record.pid, conn.peer)

    def _joined(self, record: RoleRecord, admission: Admission) -> None:
        """What an admitted role changes: the barriers it takes part in, the actors' absence."""
        for barrier in self.barriers.values():
            if record.kind == "actor" and record.status == "running" and admission.admitted_as != "rejoin":
                barrier.add(record.name, record.joins_iteration)
        if record.kind == "actor":
            self.liveness.no_actor_since = None
        self.roster.changed.set()

    # ------------------------------------------------------------------ the launcher's exit notices

    async def _launcher_notices(self, conn: Connection) -> None:
        """The launcher's connection: ``child_exit`` notices, each answered with what it did."""
        refusal = self.notices.refusal(conn)
        if refusal is not None:  # named as the launcher, and not it: one request gets the refusal
            first = await self._first_request(conn, self.cfg.cluster.coordinator_timeout_s)
            if first is not None:
                await self.notices.refuse_request(conn, first[0], conn.peer_name, refusal)
            return
        await self.notices.serve(conn, self.roles, self._lose)

    # ------------------------------------------------------------------ the roles' connections

    def _waiter_done(self, task: asyncio.Task) -> None:
        """A request's task that raised is a bug of the coordinator's: log it, fail the run."""
        if not task.cancelled() and task.exception() is not None:
            exc = task.exception()
            log.error("%s failed: %s: %s", task.get_name(), type(exc).__name__, exc, exc_info=exc)
            self.begin_stop(f"coordinator task {task.get_name()} failed: {type(exc).__name__}: {exc}", failed=True)

    def _connection_lost(self, record: RoleRecord) -> None:
        self.roster.connection_lost(record, asyncio.get_running_loop().time())

    # ------------------------------------------------------------------ verdicts and what they mean

    def _lose(self, record: RoleRecord, reason: str, abort: bool) -> None:
        """`record` is lost, whoever found out (its silence, the launcher): one set of consequences.
        `abort`: cut its connection too (a hung process's, or a dead one's half-open one)."""
        self._mark(record, "lost", reason)
        if abort and record.conn is not None:
            record.conn.abort()

    def _mark(self, record: RoleRecord, status: str, reason: str) -> None:
        if not self.roster.mark(record, status, reason):
            return
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
                self.requests.wake_work()
        returns = self.roster.may_return(record, self.phase)
        self.pushes.to_memories("role_lost", {"role": record.name, "returns": returns})

    def _role_failed(self, record: RoleRecord) -> None:
        """A role was lost or failed: what it means for the run (its own line is listed at the end)."""
        kind_alive = self.roster.alive(record.kind)
        restart = self.roster.may_return(record, self.phase)
        if restart:
            log.warning(
                "%s may come back: %d restart(s) left", record.name, self.cfg.cluster.max_restarts - record.restarts
            )
        if record.kind == "actor":
            if self.phase <= Phase.RUNNING and not kind_alive:
                if restart:  # the heartbeat monitor ends the run if none is back in time
                    self.liveness.no_actor_since = asyncio.get_running_loop().time()
                else:
                    self.begin_stop("every actor is gone", failed=True)
            return
        if restart:
            return
        # Losing a learner or a memory host loses data or learning: end the run.
        self.begin_stop(f"{record.name} {record.status}: {record.reason}", failed=True, role=record)

    # ------------------------------------------------------------------ requests

    async def _dispatch(self, record: RoleRecord, conn: Connection, msg: Message, fields: dict) -> asyncio.Task | None:
        handler = self._handlers.get(msg.kind)
        if handler is None:
            await reply_error(conn, msg, f"unknown control message {msg.kind!r}")
            return None
        return await handler(record, conn, msg, fields)

    async def _on_status(self, record: RoleRecord, conn: Connection, msg: Message, fields: dict) -> None:
        await self._reply_status(conn, msg)

    # ------------------------------------------------------------------ phases

    async def _set_phase(self, phase: Phase) -> None:
        self.phases.enter(phase)
        await self.params.wake()  # actors waiting for weights learn the run stopped
        if phase > Phase.RUNNING:
            for barrier in self.barriers.values():
                barrier.abort(f"the run is {phase.name}")
            self.requests.wake_work()
        await self.pushes.broadcast("phase", {"phase": int(phase), "reason": self.stop_reason})

    async def _wait_roles(self, kind: str | None, deadline_s: float, what: str) -> None:
        """Wait until every live role of `kind` reported done; mark late ones failed."""
        for record in await wait_done(self.roster, kind, deadline_s):
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
                    await self._started_or_stopped()
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
                self.counters.t_running = time.time()
                await self._set_phase(Phase.RUNNING)
                try:
                    async with asyncio.timeout(self.cfg.run.max_seconds):
                        await self.stop_event.wait()
                except TimeoutError:
                    self.begin_stop(f"reached run.max_seconds ({self.cfg.run.max_seconds:g} s)")
            for phase in (Phase.STOPPING, Phase.DRAINING, Phase.CLOSING):
                await self._set_phase(phase)
                await self._wait_roles(PHASE_OWNER[phase], c.phase_timeout_s, phase.name)
            self.outcome, self.lost_restartable = settle_outcome(self.roster, self.stop)
            ok = self.outcome != FAILED
            self.phases.exited()
            self.write_summary(ok)
            for record in self.roles.values():
                if record.conn is not None:
                    await self._send_exit(record, ok)
            return ok
        finally:
            metrics_task.cancel()
            monitor_task.cancel()
            lag_task.cancel()
            await asyncio.gather(metrics_task, monitor_task, lag_task, *self.pushes.tasks, return_exceptions=True)
            self._write_metrics_row()
            self._metrics.close()

    async def _started_or_stopped(self) -> None:
        """Until every role registered; after a stop during start-up (a signal), only while the
        start can still complete, for phase_timeout_s at most: the roles on their way register and
        are taken through the shutdown, but a lost one (its launcher died) cannot come back before
        RUNNING, and the run ends now rather than after start_timeout_s."""
        await first_done(self.started.wait(), self.stop_event.wait())
        if self.started.is_set():
            return
        deadline = asyncio.get_running_loop().time() + self.cfg.cluster.phase_timeout_s
        while not self.started.is_set() and not any(r.status in ("lost", "failed") for r in self.roles.values()):
            self.roster.changed.clear()
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                break
            try:
                async with asyncio.timeout(left):
                    await first_done(self.started.wait(), self.roster.changed.wait())
            except TimeoutError:
                break
        for record in self.roles.values():
            if record.status == "expected":
                self._mark(record, "lost", "the run stopped before it registered")

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
        while True:
            now = await self.liveness.tick()
            for record, reason, abort in self.liveness.verdicts(self.roles.values(), now, self.roster.rejoin_grace_s):
                self._lose(record, reason, abort)
            reason = self.liveness.actors_gone(now)
            if reason is not None:
                self.begin_stop(reason, failed=True)

    # ------------------------------------------------------------------ reporting

    def _write_metrics_row(self) -> None:
        row, evaluations = self.metrics_row(), self.report.evaluation_rows()
        self.last_row = {**row, **evaluations[-1]} if evaluations else row
        try:
            self._metrics.write(row, evaluations)
        except RunDirDeleted as exc:  # nothing the run writes has anywhere to go: it ends, failed
            if str(exc) not in self.stop.failures:
                self.begin_stop(str(exc), failed=True)
        except OSError as exc:  # a full disk or no file descriptor left must not end the run
            self._log_housekeeping("could not write a metrics row: %s", exc)

    async def _metrics_loop(self) -> None:
        while True:
            self._write_metrics_row()
            await asyncio.sleep(self.cfg.run.metrics_interval_s)

    def write_summary(self, ok: bool) -> None:
        refusals = {
            "registrations_refused": self.registrations_refused,
            "unregistered_closed": self.unregistered_closed,
            "counters_refused": self.counters_refused,
            "exit_notices_refused": self.notices.refused,
            "bad_messages": self.bad_messages,
            "connections_refused_busy": self.server.stats["refused_busy"] if self.server else 0,
            "handshakes_failed": self.server.stats["handshake_failures"] if self.server else 0,
            "connections_refused_uid": self.server.stats["refused_uid"] if self.server else 0,
            # How many authenticated connections came over the local run's Unix socket.
            "unix_connections": self.server.stats["unix_connections"] if self.server else 0,
        }
        self.report.write_summary(self.run_dir, ok, self.outcome, self.lost_restartable, refusals)
