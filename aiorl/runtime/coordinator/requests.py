"""The coordinator's requests that wait: the start, weights of a version, a barrier, the
next work item. Each is answered from a task of its own, so that the heartbeats on the
same connection keep being answered meanwhile.
"""

from __future__ import annotations

import asyncio

from aiorl.config import Config
from aiorl.runtime.barrier import Barrier, BarrierAborted
from aiorl.runtime.coordinator.counters import Stop
from aiorl.runtime.coordinator.params import ParameterStore
from aiorl.runtime.coordinator.phases import PhaseClock
from aiorl.runtime.coordinator.roster import RoleRecord, Roster
from aiorl.runtime.phase import Phase
from aiorl.runtime.work import WorkQueue
from aiorl.wire import Connection, ConnectionClosed, Message


async def reply_error(conn: Connection, msg: Message, reason: str) -> None:
    if msg.request_id is not None:
        try:
            await conn.reply_error(msg, reason)
        except ConnectionClosed:
            pass


class Requests:
    def __init__(
        self,
        cfg: Config,
        phases: PhaseClock,
        roster: Roster,
        params: ParameterStore,
        stop: Stop,
        work: WorkQueue | None,
        start_settled: asyncio.Event,
    ):
        self.cfg = cfg
        self.phases = phases
        self.roster = roster
        self.params = params
        self.stop = stop
        self.work = work  # work items of the current iteration (work-item algorithms)
        self.work_changed = asyncio.Event()
        self.start_settled = start_settled  # the run started, or stopped before it could
        self.barriers: dict[str, Barrier] = {}
        self.rendezvous: str | None = None  # where learner 0 listens (aiorl.runtime.rendezvous)

    def wake_work(self) -> None:
        self.work_changed.set()
        self.work_changed = asyncio.Event()

    async def start(self, conn: Connection, msg: Message) -> None:
        try:
            await self.start_settled.wait()
            if self.stop.event.is_set():  # it will never run: a role did not register, or Ctrl-C
                await conn.reply(msg, meta={"stop": True, "reason": self.stop.reason, "phase": int(self.phases.phase)})
                return
            await conn.reply(
                msg,
                meta={
                    "memories": self.roster.memory_addresses(),
                    "rendezvous": self.rendezvous,
                    "phase": int(self.phases.phase),
                },
            )
        except ConnectionClosed:
            pass

    async def publish(self, record: RoleRecord, conn: Connection, msg: Message) -> None:
        if record.name != "learner-0":
            await conn.reply_error(msg, f"only learner-0 publishes weights, not {record.name}")
            return
        version = await self.params.publish(msg.arrays)
        if self.work is not None:
            self.work.start(version)  # iteration k's items act with version k
            self.wake_work()
        await conn.reply(msg, meta={"version": version})

    async def weights(self, conn: Connection, msg: Message, fields: dict) -> None:
        """Reply with the weights if newer than ``have``; with ``min_version``, wait for it."""
        have = fields.get("have", -1)
        min_version = fields.get("min_version")
        try:
            if min_version is not None and not await self.params.wait_for(
                min_version, lambda: self.phases.phase > Phase.RUNNING
            ):
                await conn.reply(msg, meta={"version": self.params.weights_version, "stop": True})
                return
            weights = self.params.newer_than(have)
            if weights is not None:
                await conn.reply(msg, meta={"version": self.params.weights_version}, arrays=weights)
            else:
                await conn.reply(msg, meta={"version": self.params.weights_version})
        except ConnectionClosed:
            pass

    async def barrier(self, record: RoleRecord, conn: Connection, msg: Message, fields: dict) -> None:
        """Reply once every live participant arrived; ``stop: True`` when the run stops first."""
        name = fields.get("name", "default")
        try:
            if self.phases.phase > Phase.RUNNING:  # late arrivals: the barriers were aborted
                await conn.reply(msg, meta={"stop": True})
                return
            barrier = self.barriers.get(name)
            if barrier is None:
                barrier = self.barriers[name] = Barrier()
                for r in self.roster.roles.values():
                    if r.kind == record.kind and r.status == "running":
                        barrier.add(r.name, r.joins_iteration)
            try:
                await barrier.wait(record.name, fields["generation"])
            except BarrierAborted:
                await conn.reply(msg, meta={"stop": True})
                return
            except ValueError as exc:
                await reply_error(conn, msg, f"barrier {name!r}: {exc}")
                return
            await conn.reply(msg, meta={"generation": fields["generation"]})
        except ConnectionClosed:
            pass

    async def work_item(self, record: RoleRecord, conn: Connection, msg: Message, fields: dict) -> None:
        """End the lease of the item reported ``done``, then hand out the next item
        (``iteration``, ``item``); wait while every item of the iteration is taken;
        ``stop: True`` once the run stops."""
        try:
            if self.work is None:
                await reply_error(conn, msg, f"{self.cfg.algo} hands out no work items")
                return
            done = fields.get("done")
            if done is not None:
                self.work.finish(record.name, done[0], done[1])
            while True:
                if self.phases.phase > Phase.RUNNING or record.status != "running":
                    await conn.reply(msg, meta={"stop": True})
                    return
                item = self.work.take(record.name)
                if item is not None:
                    await conn.reply(msg, meta={"iteration": self.work.iteration, "item": item})
                    return
                await self.work_changed.wait()
        except ConnectionClosed:
            pass
