"""What every role process shares: the control connection to the coordinator,
registration, heartbeats, phase tracking, signals and exit codes.

A role's life: connect and register, wait for the start (every role
registered), do its work (`main`), report ``done``, then wait for the
coordinator's ``exit``. A dropped control connection is reconnected and the
role rejoins (`aiorl.runtime.control`); losing the coordinator (no way back
within ``cluster.coordinator_timeout_s``, or no answer to a heartbeat for that
long) ends the role with `EXIT_COORDINATOR_LOST`. A role that ends without
finishing its phases gets `on_abnormal_end` (learner 0 checkpoints there).

Registration hands the role a session id for this registration; memory
hosts check it when the role attaches (see `aiorl.runtime.memory`). Tasks a
role starts besides its work go through `spawn`: one that dies is logged
and fails the role (and so the run), never silently.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import signal
import socket
import time
from pathlib import Path

import psutil

from aiorl.config import Config, connect_host
from aiorl.core.console import CONSOLE
from aiorl.io.rundir import Identity
from aiorl.runtime import frame_limits, local_sockets, messages
from aiorl.runtime.algorithm import build_algorithm
from aiorl.runtime.control import ControlChannel, CoordinatorLost, NotAdmitted, Refused
from aiorl.runtime.hold import hold_if_named
from aiorl.runtime.phase import (
    EXIT_COORDINATOR_LOST,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_REFUSED,
    INTERRUPTED,
    Phase,
    interrupted_exit_code,
    role_name,
)
from aiorl.runtime.repeated_failure import repeats
from aiorl.runtime.transport import Transport, transport_of
from aiorl.wire import Connection, ConnectionClosed, Limits, RemoteError, ServerBusy, connect


class Offload:
    """Runs a call on the loop thread while it is quick, in a worker thread once it is not.

    A worker-thread hop costs tens of microseconds and Python runs slower off
    the main thread, which matters for cheap env steps and cheap learner steps;
    a call that takes longer than `inline_below_s` would hold up heartbeats,
    so it runs in a thread. The first calls run in a thread and are timed;
    threaded calls are re-timed every 64, in case one was slow only while the
    machine was busy.

    A call is timed by the CPU its thread spent on it, not by the wall clock: on a
    busy machine the scheduler stretches a 1.5 ms learner step past 10 ms of wall time
    now and then, which sent every following step through a thread (and its hop) until
    the next re-timing, and a thread does not help a call that is waiting for a core.
    A call that waits instead (I/O, a device) spends little CPU: past
    ``WAIT_FACTOR * inline_below_s`` of wall time it counts as slow whatever its CPU.
    """

    WAIT_FACTOR = 10

    def __init__(self, inline_below_s: float = 0.010, allowed: bool = True):
        self.inline_below_s = inline_below_s
        self.allowed = allowed
        self.last_s = float("inf")  # unknown: the first calls run in a thread and are timed
        self.calls = 0

    def __repr__(self) -> str:
        return f"<Offload last_s={self.last_s:.4f} inline={self.allowed and self.last_s < self.inline_below_s}>"

    def _cost(self, cpu_s: float, wall_s: float) -> float:
        """The seconds a call counts for: its CPU, or its wall time where it mostly waited."""
        return wall_s if wall_s >= self.WAIT_FACTOR * self.inline_below_s else cpu_s

    @staticmethod
    def _timed(fn, *args):
        t0 = time.thread_time()
        result = fn(*args)
        return result, time.thread_time() - t0

    async def __call__(self, fn, *args):
        self.calls += 1
        t0 = time.perf_counter()
        if self.allowed and self.last_s < self.inline_below_s:
            result, cpu_s = self._timed(fn, *args)
            self.last_s = self._cost(cpu_s, time.perf_counter() - t0)
            await asyncio.sleep(0)  # let heartbeats and control messages through
            return result
        result, cpu_s = await asyncio.to_thread(self._timed, fn, *args)
        if self.calls <= 2 or self.calls % 64 == 0:
            self.last_s = self._cost(cpu_s, time.perf_counter() - t0)
        return result


class RoleFailed(Exception):
    """The role cannot go on (config refused, its work raised, ...)."""


class FatalToRun(RuntimeError):
    """A failure that a restart of the role would repeat: the run stops at once instead of
    restarting the role (the coordinator is told so: ``fail`` with ``fatal``)."""


class OwnInconsistency(FatalToRun):
    """aiorl disagrees with itself (an algorithm's actor builds rows its own spec refuses)."""


class DivergedWeights(FatalToRun):
    """The learner's weights make an actor's values non-finite: a restarted actor would get the
    same weights, and a memory host drops every row with a non-finite priority, so the run would
    otherwise go on without a row reaching the learner."""


class Role:
    kind = ""

    def __init__(self, cfg: Config, index: int, run_dir: str | Path, token: bytes, ssl_client=None, ssl_server=None):
        self.cfg = cfg
        self.index = index
        self.name = role_name(self.kind, index)
        self.run_dir = Path(run_dir)
        self.token = token
        self.ssl_client = ssl_client
        self.ssl_server = ssl_server
        self.log = logging.getLogger(f"aiorl.{self.name}")
        self.phase = Phase.STARTING
        self.counters: dict[str, int] = {}
        self.coordinator: ControlChannel | None = None
        self.incarnation = secrets.token_hex(8)  # this process; a restart is a new incarnation
        self.run_counters: dict[str, int] = {}  # the run's global counters, from heartbeat replies
        self.start_info: dict = {}
        self.registration: dict = {}  # the coordinator's reply: admission, restarts
        self._signalled_unregistered: str | None = None  # a signal that came before registering
        self.weights_version_seen = -1  # newest version the coordinator told us about
        self._phase_events: dict[Phase, asyncio.Event] = {}
        self._exit_meta: dict | None = None
        self._exited: asyncio.Event | None = None
        self._signals = 0
        self._stop_task: asyncio.Task | None = None
        self._loop_lag_s = 0.0
        self._process = psutil.Process()
        self._rss_bytes = 0
        self.counters_at_heartbeat: dict[str, int] = {}  # ours, as the last run_counters include them
        self._register_extra: dict = {}
        self._fatal: asyncio.Future | None = None
        self._work_done = False
        self._late_failure: asyncio.Task | None = None
        self._spawned: set[asyncio.Task] = set()
        self._algorithm = None
        self._beat_now: asyncio.Event | None = None  # set: send the next heartbeat at once

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name} phase={self.phase.name} counters={self.counters}>"

    # ------------------------------------------------------------------ hooks

    async def main(self) -> dict:
        """The role's work, from start to its phase's end; returns its final stats."""
        raise NotImplementedError

    def metrics(self) -> dict:
        """Gauges reported with every heartbeat."""
        return {}

    def heartbeat_answered(self, meta: dict) -> None:
        """The coordinator answered a heartbeat (or done) that carried `meta`: it has what it held."""

    def heartbeat_extra(self) -> dict:
        return {}

    def advertised_address(self) -> tuple[str, int] | None:
        return None

    def register_extra(self) -> dict:
        """More fields for the registration (learner 0: its rendezvous address)."""
        return {}

    # ------------------------------------------------------------------ tasks

    def spawn(self, coro, name: str) -> asyncio.Task:
        """Run `coro` beside the role's work; if it raises, the role fails (logged, reported)."""
        task = asyncio.get_running_loop().create_task(coro, name=f"{self.name} {name}")
        self._spawned.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task) -> None:
        self._spawned.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self.fatal(task.exception(), task.get_name())

    def fatal(self, exc: BaseException, what: str) -> None:
        """Something the role cannot go on without failed: log it and fail the role."""
        self.log.error("%s failed: %s: %s", what, type(exc).__name__, exc, exc_info=exc)
        reason = f"{what}: {type(exc).__name__}: {exc}"
        if self._work_done:  # too late to stop the work: still fail the run
            self._late_failure = asyncio.get_running_loop().create_task(self._report_failure(reason))
        elif self._fatal is not None and not self._fatal.done():
            self._fatal.set_exception(RuntimeError(reason))
            self._fatal.exception()  # retrieved here; `_main_or_fatal` raises it

    def on_role_lost(self, name: str, returns: bool = False) -> None:
        """The coordinator declared role `name` lost or failed (`returns`: it has a restart left)."""

    def on_role_back(self, name: str, iteration: int) -> None:
        """The coordinator admitted a restarted `name`; synchronous: it acts from `iteration` on."""

    def on_control(self, msg) -> None:
        """A message the coordinator pushed that the base class does not handle."""
        self.log.warning("ignored control message %r from the coordinator", msg.kind)

    async def on_abnormal_end(self, why: str) -> None:
        """The role is ending without finishing its phases (coordinator lost, told to exit
        early, a second signal, its work failed): save what can be saved."""

    # ------------------------------------------------------------------ phases

    async def wait_phase(self, phase: Phase) -> None:
        await self._phase_events[phase].wait()

    def _set_phase(self, phase: Phase) -> None:
        if phase <= self.phase:
            return
        self.phase = phase
        for p, event in self._phase_events.items():
            if p <= phase:
                event.set()
        self.log.info("phase %s", phase.name, extra={CONSOLE: True})

    # ------------------------------------------------------------------ lifecycle

    def coordinator_address(self) -> tuple[str, int]:
        return connect_host(self.cfg.cluster.host), self.cfg.cluster.port

    @property
    def transport(self) -> Transport:
        """How this role's servers listen and its connections go (chosen from the config)."""
        return transport_of(self.cfg)

    def coordinator_unix_path(self) -> str | None:
        """The coordinator's Unix socket when this role of a local run reaches it there, else None."""
        return self.transport.peer_socket(os.environ.get(local_sockets.ENV_COORDINATOR))

    def _register_meta(self) -> dict:
        return {
            "role": self.name,
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "config_hash": self.cfg.config_hash(),
            "address": self.advertised_address(),
            "incarnation": self.incarnation,
            **self._register_extra,
        }

    async def connect_to(
        self,
        host: str,
        port: int,
        limits: Limits | None = None,
        where: dict | None = None,
    ) -> Connection:
        """Connect to a server of the run, retrying (with backoff) while it is busy, for up to
        ``cluster.start_timeout_s``. A server that refuses or cannot be reached fails at once:
        it has gone away (the coordinator announces it when it is back, maybe elsewhere).

        Busy is also a handshake that did not finish in time: when hundreds of actors attach at
        once to a memory host on a loaded machine, some wait past the handshake timeout (74 of
        512 actors failed so in bench/scale.py before this retried)."""
        deadline = asyncio.get_running_loop().time() + self.cfg.cluster.start_timeout_s
        delay = 0.05
        while True:
            try:
                return await connect(
                    host,
                    port,
                    token=self.token,
                    name=self.name,
                    ssl=self.ssl_client,
                    limits=limits,
                    handshake_timeout_s=self.cfg.cluster.coordinator_timeout_s,
                    **(where or {}),  # Transport.connect_args: a Unix socket or a ring; none: TCP
                )
            except (ServerBusy, TimeoutError):  # its handshake slots are taken (a flood, or many peers at once)
                if asyncio.get_running_loop().time() + delay > deadline:
                    raise
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)

    @property
    def session(self) -> str | None:
        """This registration's id, shown to memory hosts when attaching (a rejoin keeps it)."""
        return self.coordinator.session if self.coordinator is not None else None

    async def attach_memory(self, address: list) -> Connection:
        """Connect to a memory host at `address` ([host, port], a local run's with its Unix socket
        after them) and attach with this registration's session id."""
        host, port = address[0], address[1]
        unix_path = self.transport.peer_socket(address[2] if len(address) > 2 else None)
        # A learner receives sampled batches; an actor only the attach reply.
        limits = (
            frame_limits.memory_to_learner(self.cfg, self.algorithm())
            if self.kind == "learner"
            else frame_limits.UNKNOWN_PEER
        )
        where = self.transport.connect_args(unix_path)
        conn = await self.connect_to(host, port, limits, where)
        if where["ring_path"] is not None:
            self.log.info(
                "connected to the memory host at %s:%s over shared memory (ring:%s)", host, port, where["ring_path"]
            )
        elif unix_path is not None:
            self.log.info("connected to the memory host at %s:%s over unix:%s", host, port, unix_path)
        try:
            await conn.request("attach", {"session": self.session}, timeout_s=self.cfg.cluster.coordinator_timeout_s)
        except RemoteError as exc:
            conn.abort()
            raise RoleFailed(f"memory host {host}:{port} refused to attach {self.name}: {exc}") from None
        return conn

    def algorithm(self):
        """The configured algorithm, built once (roles need its specs for frame limits)."""
        if self._algorithm is None:
            self._algorithm = build_algorithm(self.cfg)
        return self._algorithm

    async def run(self) -> int:
        """Run the role to its end; return the process exit code."""
        for phase in Phase:
            self._phase_events[phase] = asyncio.Event()
        self._exited = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self._on_signal, sig)
        self._main = asyncio.current_task()
        try:
            code = await self._run()
            if code != EXIT_OK and not self._finished_phases():
                await self.on_abnormal_end(f"exit code {code}")
            return code
        except asyncio.CancelledError:
            if self._signalled_unregistered is None:
                raise
            self._main.uncancel()
            return interrupted_exit_code(self._signalled_unregistered)
        except (CoordinatorLost, RoleFailed, NotAdmitted, ExceptionGroup) as exc:
            lost = _leaves(exc, CoordinatorLost)
            failed = _leaves(exc, RoleFailed)
            refused = _leaves(exc, NotAdmitted)
            if lost:
                self.log.error("lost the coordinator at %s:%s: %s; exiting", *self.coordinator_address(), lost[0])
                await self.on_abnormal_end(f"lost the coordinator: {lost[0]}")
                return EXIT_COORDINATOR_LOST
            if refused:
                self.log.error("not admitted by the coordinator: %s", refused[0])
                return EXIT_REFUSED
            if failed:
                self.log.error("failed: %s", failed[0])
                # Its own work failed, maybe for a cause outside it (a data-parallel peer died);
                # learner 0 still saves what it can (weights that blew up are not saved).
                await self.on_abnormal_end(f"failed: {failed[0]}")
                return EXIT_FAILED
            raise
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)
            if self.coordinator is not None:
                self.coordinator.abort()
            await self.cleanup()

    async def cleanup(self) -> None:
        """Close what the role opened (servers, peer connections)."""

    def _finished_phases(self) -> bool:
        meta = self._exit_meta or {}
        return bool(meta.get("role_ok")) and self._signals <= 1

    async def _run(self) -> int:
        self._fatal = asyncio.get_running_loop().create_future()
        host, port = self.coordinator_address()
        if port == 0:
            raise RoleFailed("cluster.port is 0: a role started on its own needs the coordinator's port")
        c = self.cfg.cluster
        self._register_extra = self.register_extra()  # once: it may bind (learner 0's rendezvous)
        self.coordinator = ControlChannel(
            self.name,
            (host, port),
            self.token,
            self.ssl_client,
            self._register_meta,
            c.coordinator_timeout_s,
            c.start_timeout_s,
            self.log,
            limits=frame_limits.from_coordinator(self.algorithm()),
            unix_path=self.coordinator_unix_path(),
            transport=self.transport,
        )
        hold_if_named(self.name, self.log)
        try:
            reply = await self.coordinator.open()
        except Refused as exc:
            raise RoleFailed(str(exc)) from None
        self.registration = reply
        self._set_phase(Phase(int(reply.get("phase", Phase.STARTING))))  # a restart joins a running run
        self.log.info(
            "registered with the coordinator at %s:%s (%s)", host, port, reply.get("admission"), extra={CONSOLE: True}
        )
        async with asyncio.TaskGroup() as tg:
            control = tg.create_task(self._control_loop())
            heartbeat = tg.create_task(self._heartbeat_loop())
            work = tg.create_task(self._work())
            await self._exited.wait()
            # The exit message came: what is still running has been given up on.
            for task in (work, heartbeat, control):
                task.cancel()
        meta = self._exit_meta or {}
        if self._signals > 1:
            return EXIT_INTERRUPTED
        if work.cancelled() or not meta.get("role_ok", False):
            self.log.error("exiting without finishing: %s", meta.get("reason") or "told to exit early")
            return EXIT_FAILED
        self.log.info("exit (run %s)", meta.get("outcome") or ("ok" if meta.get("ok") else "not ok"))
        if meta.get("outcome") == INTERRUPTED:
            return interrupted_exit_code(meta.get("signal"))
        return EXIT_OK

    async def _work(self) -> None:
        try:
            # The coordinator answers by its own start deadline; allow it the usual time to answer.
            c = self.cfg.cluster
            reply = await self.coordinator.request("wait_start", timeout_s=c.start_timeout_s + c.coordinator_timeout_s)
        except TimeoutError:
            raise CoordinatorLost("the run did not start within cluster.start_timeout_s") from None
        self.start_info = reply.meta
        if reply.meta.get("stop"):
            # The run stopped before it started: nothing to do but report and wait for the exit.
            self.log.warning("the run stopped before it started: %s", reply.meta.get("reason"))
            await self._request_or_lost("done", {**self._heartbeat_meta(), "stats": {}})
            return
        self._set_phase(Phase(int(reply.meta.get("phase", Phase.STARTING))))
        try:
            stats = await self._main_or_fatal()
        except (CoordinatorLost, asyncio.CancelledError):
            raise
        except Exception as exc:
            lost = _leaves(exc, CoordinatorLost)
            if lost:
                raise lost[0] from None
            self.log.exception("failed")
            cause = (_leaves(exc, Exception) or [exc])[0]  # the real error, not its TaskGroup wrapper
            again = repeats(self.run_dir, self.name, self.kind, cause, Identity.from_env())
            if again is not None:
                self.log.error("%s", again, extra={CONSOLE: True})
            reason = again or f"{type(cause).__name__}: {cause}"
            await self._report_failure(reason, fatal=isinstance(cause, FatalToRun) or again is not None)
            raise RoleFailed(reason) from exc
        # The stats go packed: a memory host's per-actor accounts outgrow a frame header.
        await self._request_or_lost("done", self._heartbeat_meta(), arrays={"stats": messages.pack_table(stats)})
        self.log.info("reported done")

    async def _main_or_fatal(self) -> dict:
        """`main`, unless a spawned task fails first (then main is cancelled and that error raised)."""
        main = asyncio.ensure_future(self.main())
        try:
            await asyncio.wait({main, self._fatal}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            main.cancel()
            raise
        if not main.done():
            main.cancel()
            await asyncio.gather(main, return_exceptions=True)
            raise self._fatal.exception()
        self._work_done = True
        return main.result()

    async def _report_failure(self, reason: str, fatal: bool = False) -> None:
        meta = {"reason": reason, "fatal": True} if fatal else {"reason": reason}
        try:
            await self.coordinator.request("fail", meta, timeout_s=self.cfg.cluster.coordinator_timeout_s)
        except (ConnectionClosed, TimeoutError, RemoteError, CoordinatorLost):
            pass

    async def _request_or_lost(self, kind: str, meta: dict | None = None, **kwargs):
        try:
            return await self.coordinator.request(
                kind, meta, timeout_s=self.cfg.cluster.coordinator_timeout_s, **kwargs
            )
        except TimeoutError:
            raise CoordinatorLost(
                f"no answer to {kind!r} within cluster.coordinator_timeout_s "
                f"({self.cfg.cluster.coordinator_timeout_s:g} s)"
            ) from None

    async def _control_loop(self) -> None:
        try:
            async for msg in self.coordinator.messages():
                fields = messages.check(msg.kind, msg.meta, {"phase", "role_lost", "role_back", "memories", "exit"})
                if msg.kind == "phase":
                    self._set_phase(Phase(fields["phase"]))
                elif msg.kind == "role_lost":
                    self.on_role_lost(fields["role"], fields.get("returns", False))
                elif msg.kind == "role_back":
                    self.on_role_back(fields["role"], fields["iteration"])
                elif msg.kind == "exit":
                    self._exit_meta = fields
                    self._exited.set()
                    return
                else:
                    self.on_control(msg)
        except messages.BadMessage as exc:
            raise CoordinatorLost(f"the coordinator sent a bad message: {exc}") from None

    def _heartbeat_meta(self) -> dict:
        if not self.cfg.run.metrics:
            return {"counters": dict(self.counters), **self.heartbeat_extra()}
        try:
            self._rss_bytes = self._process.memory_info().rss
        except (OSError, psutil.Error):
            pass  # housekeeping never kills a role (EMFILE under a connection flood): keep the last value
        meta = {
            "counters": dict(self.counters),
            "metrics": {
                **self.metrics(),
                "loop_lag_s": round(self._loop_lag_s, 6),
                "rss_bytes": self._rss_bytes,
            },
        }
        meta.update(self.heartbeat_extra())
        return meta

    def beat_now(self) -> None:
        """Send the next heartbeat now, not at its interval: counters the coordinator should act
        on at once (a stop budget reached)."""
        if self._beat_now is not None:
            self._beat_now.set()

    def run_total_reached(self, key: str, budget: int | None) -> bool:
        """Whether the run's counter `key` has reached `budget`, as far as this role knows: the
        run's total at the last heartbeat plus this role's own steps since. The other roles'
        steps since are unknown, so this never says yes too early: a role that stops on it
        never keeps the run from reaching its budget."""
        if budget is None:
            return False
        since = self.counters.get(key, 0) - self.counters_at_heartbeat.get(key, 0)
        return self.run_counters.get(key, 0) + since >= budget

    async def _heartbeat_loop(self) -> None:
        interval = self.cfg.cluster.heartbeat_interval_s
        loop = asyncio.get_running_loop()
        self._beat_now = asyncio.Event()
        while True:
            expected = loop.time() + interval
            try:
                await asyncio.wait_for(self._beat_now.wait(), interval)
                self._beat_now.clear()
            except TimeoutError:
                # How late the timer fired: the loop's responsiveness while work runs.
                self._loop_lag_s = max(0.0, loop.time() - expected)
            meta = self._heartbeat_meta()
            reply = await self._request_or_lost("heartbeat", meta)
            self.heartbeat_answered(meta)
            self._set_phase(Phase(int(reply.meta["phase"])))
            self.weights_version_seen = int(reply.meta.get("weights_version", -1))
            self.run_counters = {
                k: int(reply.meta[k]) for k in ("env_steps", "learner_steps", "episodes") if k in reply.meta
            }
            self.counters_at_heartbeat = meta["counters"]  # what those totals include of ours

    def _on_signal(self, sig: int) -> None:
        self._signals += 1
        if not self.registration and self._signalled_unregistered is None:
            # No run of ours to stop cleanly yet, and its coordinator may be gone (a launcher killed
            # during start-up): exit now rather than retry the connection until start_timeout_s.
            self.log.warning("got %s before registering: exiting", signal.Signals(sig).name)
            self._signalled_unregistered = signal.Signals(sig).name
            self._main.cancel()
            return
        if self._signals == 1:
            self.log.warning(
                "got %s: asking the coordinator to stop the run (again to exit now)", signal.Signals(sig).name
            )
            self._stop_task = asyncio.get_running_loop().create_task(self._ask_stop(signal.Signals(sig).name))
        else:
            self.log.warning("got %s again: exiting now", signal.Signals(sig).name)
            self._exit_meta = {"ok": False, "role_ok": False, "reason": "interrupted"}
            self._exited.set()

    async def _ask_stop(self, reason: str) -> None:
        try:
            await self.coordinator.request("stop", {"reason": reason}, timeout_s=self.cfg.cluster.coordinator_timeout_s)
        except (ConnectionClosed, TimeoutError, RemoteError, CoordinatorLost) as exc:
            self.log.warning("could not ask the coordinator to stop: %r", exc)


def _leaves(exc: BaseException, kind: type) -> list[BaseException]:
    """The exceptions of type `kind` in `exc`, looking inside exception groups."""
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in _leaves(inner, kind)]
    return [exc] if isinstance(exc, kind) else []
