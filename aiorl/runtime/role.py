"""What every role process shares: the control connection to the coordinator,
registration, heartbeats, phase tracking, signals and exit codes.

A role's life: connect and register, wait for the start (every role
registered), do its work (`main`), report ``done``, then wait for the
coordinator's ``exit``. Losing the coordinator (its connection closes, or it
stops answering heartbeats for ``cluster.coordinator_timeout_s``) ends the
role with `EXIT_COORDINATOR_LOST`.
"""
from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import time
from pathlib import Path

import psutil

from aiorl.config import Config, connect_host
from aiorl.runtime.phase import (
    EXIT_COORDINATOR_LOST,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    Phase,
    role_name,
)
from aiorl.wire import Connection, ConnectionClosed, RemoteError, connect


class Offload:
    """Runs a call on the loop thread while it is quick, in a worker thread once it is not.

    A worker-thread hop costs tens of microseconds and Python runs slower off
    the main thread, which matters for cheap env steps and cheap learner steps;
    a call that takes longer than `inline_below_s` would hold up heartbeats,
    so it runs in a thread. The first calls run in a thread and are timed;
    threaded calls are re-timed every 64, in case one was slow only while the
    machine was busy.
    """

    def __init__(self, inline_below_s: float = 0.010, allowed: bool = True):
        self.inline_below_s = inline_below_s
        self.allowed = allowed
        self.last_s = float("inf")  # unknown: the first calls run in a thread and are timed
        self.calls = 0

    def __repr__(self) -> str:
        return f"<Offload last_s={self.last_s:.4f} inline={self.allowed and self.last_s < self.inline_below_s}>"

    async def __call__(self, fn, *args):
        self.calls += 1
        t0 = time.perf_counter()
        if self.allowed and self.last_s < self.inline_below_s:
            result = fn(*args)
            self.last_s = time.perf_counter() - t0
            await asyncio.sleep(0)  # let heartbeats and control messages through
            return result
        result = await asyncio.to_thread(fn, *args)
        if self.calls <= 2 or self.calls % 64 == 0:
            self.last_s = time.perf_counter() - t0
        return result


class CoordinatorLost(Exception):
    """The coordinator is gone: its connection closed or it stopped answering."""


class RoleFailed(Exception):
    """The role cannot go on (config refused, its work raised, ...)."""


class Role:
    kind = ""

    def __init__(self, cfg: Config, index: int, run_dir: str | Path, token: bytes,
                 ssl_client=None, ssl_server=None):
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
        self.coordinator: Connection | None = None
        self.start_info: dict = {}
        self.weights_version_seen = -1  # newest version the coordinator told us about
        self._phase_events: dict[Phase, asyncio.Event] = {}
        self._exit_meta: dict | None = None
        self._exited: asyncio.Event | None = None
        self._signals = 0
        self._stop_task: asyncio.Task | None = None
        self._loop_lag_s = 0.0
        self._process = psutil.Process()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name} phase={self.phase.name} counters={self.counters}>"

    # ------------------------------------------------------------------ hooks

    async def main(self) -> dict:
        """The role's work, from start to its phase's end; returns its final stats."""
        raise NotImplementedError

    def metrics(self) -> dict:
        """Gauges reported with every heartbeat."""
        return {}

    def heartbeat_extra(self) -> dict:
        return {}

    def advertised_address(self) -> tuple[str, int] | None:
        return None

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
        self.log.info("phase %s", phase.name)

    # ------------------------------------------------------------------ lifecycle

    def coordinator_address(self) -> tuple[str, int]:
        return connect_host(self.cfg.cluster.host), self.cfg.cluster.port

    async def _connect_coordinator(self) -> Connection:
        host, port = self.coordinator_address()
        if port == 0:
            raise RoleFailed("cluster.port is 0: a role started on its own needs the coordinator's port")
        deadline = asyncio.get_running_loop().time() + self.cfg.cluster.start_timeout_s
        delay = 0.05
        while True:
            try:
                return await connect(host, port, token=self.token, name=self.name, ssl=self.ssl_client,
                                     handshake_timeout_s=self.cfg.cluster.coordinator_timeout_s)
            except OSError as exc:
                if asyncio.get_running_loop().time() + delay > deadline:
                    raise CoordinatorLost(f"cannot reach the coordinator at {host}:{port}: {exc}") from None
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)

    async def run(self) -> int:
        """Run the role to its end; return the process exit code."""
        for phase in Phase:
            self._phase_events[phase] = asyncio.Event()
        self._exited = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self._on_signal, sig)
        try:
            return await self._run()
        except (CoordinatorLost, RoleFailed, ExceptionGroup) as exc:
            lost = _leaves(exc, CoordinatorLost)
            failed = _leaves(exc, RoleFailed)
            if lost:
                self.log.error("lost the coordinator at %s:%s: %s; exiting", *self.coordinator_address(), lost[0])
                return EXIT_COORDINATOR_LOST
            if failed:
                self.log.error("failed: %s", failed[0])
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

    async def _run(self) -> int:
        self.coordinator = await self._connect_coordinator()
        try:
            await self.coordinator.request("register", {
                "role": self.name, "pid": os.getpid(), "host": socket.gethostname(),
                "config_hash": self.cfg.config_hash(), "address": self.advertised_address(),
            }, timeout_s=self.cfg.cluster.coordinator_timeout_s)
        except RemoteError as exc:
            raise RoleFailed(f"the coordinator refused registration: {exc}") from None
        except (ConnectionClosed, TimeoutError) as exc:
            raise CoordinatorLost(f"registration got no answer: {exc!r}") from None
        self.log.info("registered with the coordinator at %s:%s", *self.coordinator_address())
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
        self.log.info("exit (run %s)", "ok" if meta.get("ok") else "not ok")
        return EXIT_OK

    async def _work(self) -> None:
        try:
            # The coordinator answers by its own start deadline; allow it the usual time to answer.
            c = self.cfg.cluster
            reply = await self.coordinator.request("wait_start", timeout_s=c.start_timeout_s + c.coordinator_timeout_s)
        except TimeoutError:
            raise CoordinatorLost("the run did not start within cluster.start_timeout_s") from None
        except ConnectionClosed as exc:
            raise CoordinatorLost(f"connection closed while waiting for the start: {exc}") from None
        self.start_info = reply.meta
        if reply.meta.get("stop"):
            # The run stopped before it started: nothing to do but report and wait for the exit.
            self.log.warning("the run stopped before it started: %s", reply.meta.get("reason"))
            await self._request_or_lost("done", {**self._heartbeat_meta(), "stats": {}})
            return
        try:
            stats = await self.main()
        except (CoordinatorLost, asyncio.CancelledError):
            raise
        except Exception as exc:
            lost = _leaves(exc, CoordinatorLost)
            if lost:
                raise lost[0] from None
            self.log.exception("failed")
            cause = (_leaves(exc, Exception) or [exc])[0]  # the real error, not its TaskGroup wrapper
            await self._report_failure(f"{type(cause).__name__}: {cause}")
            raise RoleFailed(f"{type(cause).__name__}: {cause}") from exc
        await self._request_or_lost("done", {**self._heartbeat_meta(), "stats": stats})
        self.log.info("reported done")

    async def _report_failure(self, reason: str) -> None:
        try:
            await self.coordinator.request("fail", {"reason": reason},
                                           timeout_s=self.cfg.cluster.coordinator_timeout_s)
        except (ConnectionClosed, TimeoutError, RemoteError):
            pass

    async def _request_or_lost(self, kind: str, meta: dict | None = None, **kwargs):
        try:
            return await self.coordinator.request(kind, meta, timeout_s=self.cfg.cluster.coordinator_timeout_s,
                                                  **kwargs)
        except TimeoutError:
            raise CoordinatorLost(f"no answer to {kind!r} within cluster.coordinator_timeout_s "
                                  f"({self.cfg.cluster.coordinator_timeout_s:g} s)") from None
        except ConnectionClosed as exc:
            raise CoordinatorLost(f"connection closed: {exc}") from None

    async def _control_loop(self) -> None:
        try:
            async for msg in self.coordinator:
                if msg.kind == "phase":
                    self._set_phase(Phase(int(msg.meta["phase"])))
                elif msg.kind == "exit":
                    self._exit_meta = msg.meta
                    self._exited.set()
                    return
                else:
                    self.log.warning("ignored control message %r from the coordinator", msg.kind)
        except ConnectionClosed as exc:
            raise CoordinatorLost(f"connection closed: {exc}") from None
        raise CoordinatorLost("connection closed before the exit message")

    def _heartbeat_meta(self) -> dict:
        if not self.cfg.run.metrics:
            return {"counters": dict(self.counters), **self.heartbeat_extra()}
        meta = {
            "counters": dict(self.counters),
            "metrics": {
                **self.metrics(),
                "loop_lag_s": round(self._loop_lag_s, 6),
                "rss_bytes": self._process.memory_info().rss,
            },
        }
        meta.update(self.heartbeat_extra())
        return meta

    async def _heartbeat_loop(self) -> None:
        interval = self.cfg.cluster.heartbeat_interval_s
        loop = asyncio.get_running_loop()
        while True:
            expected = loop.time() + interval
            await asyncio.sleep(interval)
            # How late the timer fired: the loop's responsiveness while work runs.
            self._loop_lag_s = max(0.0, loop.time() - expected)
            reply = await self._request_or_lost("heartbeat", self._heartbeat_meta())
            self._set_phase(Phase(int(reply.meta["phase"])))
            self.weights_version_seen = int(reply.meta.get("weights_version", -1))

    def _on_signal(self, sig: int) -> None:
        self._signals += 1
        if self._signals == 1:
            self.log.warning("got %s: asking the coordinator to stop the run (again to exit now)",
                             signal.Signals(sig).name)
            self._stop_task = asyncio.get_running_loop().create_task(self._ask_stop(signal.Signals(sig).name))
        else:
            self.log.warning("got %s again: exiting now", signal.Signals(sig).name)
            self._exit_meta = {"ok": False, "role_ok": False, "reason": "interrupted"}
            self._exited.set()

    async def _ask_stop(self, reason: str) -> None:
        try:
            await self.coordinator.request("stop", {"reason": reason},
                                           timeout_s=self.cfg.cluster.coordinator_timeout_s)
        except (ConnectionClosed, TimeoutError, RemoteError) as exc:
            self.log.warning("could not ask the coordinator to stop: %r", exc)


def _leaves(exc: BaseException, kind: type) -> list[BaseException]:
    """The exceptions of type `kind` in `exc`, looking inside exception groups."""
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in _leaves(inner, kind)]
    return [exc] if isinstance(exc, kind) else []
