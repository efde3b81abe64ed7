"""The requests a registered role makes over its control connection, one handler per kind
(`RoleRequests.table`, through which the service dispatches): its reports (``heartbeat``,
``done``, ``run_state``: each value only from the role that owns it), the requests that wait
(answered by `requests`), a memory host's session check, a failure, a signal, and an exit
notice (refused: only the launcher sends those).

What a report or a failure means for the run is the service's: it hands in its verdict
(`mark`), its stop (`begin_stop`) and its answer to a signal (`interrupt`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from aiorl.config import Config
from aiorl.core.ratelog import RateLimitedLog
from aiorl.runtime.coordinator.counters import RunCounters, Stop, owned_counters, stop_criterion
from aiorl.runtime.coordinator.liveness import Liveness
from aiorl.runtime.coordinator.notices import ExitNotices
from aiorl.runtime.coordinator.params import ParameterStore
from aiorl.runtime.coordinator.phases import PhaseClock
from aiorl.runtime.coordinator.requests import Requests, reply_error
from aiorl.runtime.coordinator.roster import RoleRecord, Roster
from aiorl.runtime.messages import any_map, unpack_table
from aiorl.runtime.phase import Phase
from aiorl.wire import Connection, Message
from aiorl.wire.names import safe_text

log = logging.getLogger("aiorl.coordinator")

# A request's handler: (the role, its connection, the request, its checked fields) -> the task
# of a request that waits, or None once it is answered.
Handler = Callable[[RoleRecord, Connection, Message, dict], Awaitable[asyncio.Task | None]]


class RoleRequests:
    def __init__(
        self,
        cfg: Config,
        *,
        phases: PhaseClock,
        roster: Roster,
        counters: RunCounters,
        params: ParameterStore,
        stop: Stop,
        liveness: Liveness,
        requests: Requests,
        notices: ExitNotices,
        mark: Callable[[RoleRecord, str, str], None],
        begin_stop: Callable[..., None],
        interrupt: Callable[[str, str], None],
        log_refusal: RateLimitedLog,
    ):
        self.cfg = cfg
        self.phases = phases
        self.roster = roster
        self.counters = counters
        self.params = params
        self.stop = stop
        self.liveness = liveness
        self.requests = requests
        self.notices = notices
        self.mark = mark  # the service's verdict on a role
        self.begin_stop = begin_stop
        self.interrupt = interrupt
        self.log_refusal = log_refusal
        self.counters_refused = 0

    def table(self) -> dict[str, Handler]:
        return {
            "heartbeat": self.heartbeat,
            "run_state": self.run_state,
            "wait_start": self.wait_start,
            "publish": self.publish,
            "get_weights": self.get_weights,
            "barrier": self.barrier,
            "work": self.work,
            "check_session": self.check_session,
            "done": self.done,
            "fail": self.fail,
            "child_exit": self.child_exit,
            "stop": self.signalled,
        }

    async def heartbeat(self, record: RoleRecord, conn: Connection, msg: Message, fields: dict) -> None:
        self.report(record, fields)
        await conn.reply(
            msg,
            meta={
                "phase": int(self.phases.phase),
                "weights_version": self.params.weights_version,
                "env_steps": self.counters.env_steps,
                "learner_steps": self.counters.learner_steps,
                "episodes": self.counters.episodes,
            },
        )

    async def run_state(self, record: RoleRecord, conn: Connection, msg: Message, fields: dict) -> None:
        """Learner 0 checkpointing: its own counters first, so that they are exact."""
        if record.name != "learner-0":
            await reply_error(conn, msg, f"only learner-0 checkpoints the run, not {record.name}")
            return
        self.report(record, {"counters": fields.get("counters")})
        await conn.reply(msg, meta=self.counters.run_state(self.params.weights_version))

    async def wait_start(self, record: RoleRecord, conn: Connection, msg: Message, fields: dict) -> asyncio.Task:
        return asyncio.create_task(self.requests.start(conn, msg), name=f"start for {record.name}")

    async def publish(self, record: RoleRecord, conn: Connection, msg: Message, fields: dict) -> None:
        await self.requests.publish(record, conn, msg)

    async def get_weights(self, record: RoleRecord, conn: Connection, msg: Message, fields: dict) -> asyncio.Task:
        return asyncio.create_task(self.requests.weights(conn, msg, fields), name=f"weights for {record.name}")

    async def barrier(self, record: RoleRecord, conn: Connection, msg: Message, fields: dict) -> asyncio.Task:
        return asyncio.create_task(self.requests.barrier(record, conn, msg, fields), name=f"barrier for {record.name}")

    async def work(self, record: RoleRecord, conn: Connection, msg: Message, fields: dict) -> asyncio.Task:
        return asyncio.create_task(self.requests.work_item(record, conn, msg, fields), name=f"work for {record.name}")

    async def check_session(self, record: RoleRecord, conn: Connection, msg: Message, fields: dict) -> None:
        if record.kind != "memory":
            await conn.reply_error(msg, f"only memory hosts check sessions, not {record.name}")
            return
        reason = self.roster.check_session(fields["role"], fields["session"])
        await conn.reply(msg, meta={"ok": reason is None, "reason": reason})

    async def done(self, record: RoleRecord, conn: Connection, msg: Message, fields: dict) -> None:
        self.report(record, fields)
        stats = unpack_table(msg.arrays["stats"]) if "stats" in msg.arrays else fields.get("stats", {})
        record.stats = any_map(stats, "done.stats")
        if record.status == "running":
            phase = self.phases.phase
            record.status = "done"
            record.done_phase = phase.name
            log.info("%s done in phase %s", record.name, phase.name)
            self.roster.changed.set()
        await conn.reply(msg)

    async def fail(self, record: RoleRecord, conn: Connection, msg: Message, fields: dict) -> None:
        reason = safe_text(fields.get("reason", "no reason given"), 1000)
        self.mark(record, "failed", reason)
        if fields.get("fatal"):  # a restart would fail the same way: no role waits for one
            self.begin_stop(f"{record.name} failed: {reason}", failed=True, role=record)
        await conn.reply(msg)

    async def child_exit(self, record: RoleRecord, conn: Connection, msg: Message, fields: dict) -> None:
        await self.notices.refuse_request(conn, msg, record.name, self.notices.refusal(conn))

    async def signalled(self, record: RoleRecord, conn: Connection, msg: Message, fields: dict) -> None:
        """``stop``: the role got a signal."""
        self.interrupt(safe_text(fields.get("reason", "a signal")), record.name)
        await conn.reply(msg)

    def report(self, record: RoleRecord, fields: dict) -> None:
        """A role's report (heartbeat, done, run_state): each value only from the role that owns it."""
        self.liveness.heard(record)
        counters = fields.get("counters")
        if counters:
            accepted, refused = owned_counters(record, counters, asyncio.get_running_loop().time())
            if refused:
                self.counters_refused += len(refused)
                self.log_refusal("refused counters of %s: %s", record.name, "; ".join(refused))
            self.counters.set_counters(record, accepted)
        metrics = fields.get("metrics")
        if metrics:
            record.metrics = metrics
        evaluation = fields.get("evaluation")
        if evaluation is not None and record.name == "learner-0":
            self.counters.add_evaluation(evaluation)
        returns = fields.get("episode_returns")
        if returns and record.kind == "actor":
            self.counters.add_episodes(returns, fields.get("episode_lengths", ()))
        self.check_stop_criteria()

    def check_stop_criteria(self) -> None:
        if self.phases.phase != Phase.RUNNING or self.stop.event.is_set():
            return
        stop = stop_criterion(self.cfg, self.counters)
        if stop is not None:
            self.begin_stop(*stop)
