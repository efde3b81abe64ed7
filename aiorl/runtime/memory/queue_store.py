"""The trajectory queue (`QueueStore`, IMPALA): a bounded FIFO of whole
fragments (`aiorl.runtime.fragments.FragmentHub`).

Actors send one fragment per env against credits this memory gives them as
the queue has room (`aiorl.runtime.memory.flow`); a fragment acted with a
weights version not yet published, or with bad values, is dropped and counted
(`aiorl.runtime.memory.tally`). Learners get the oldest fragments on their
credits, and tell the memory the newest version they know of: fragments
dropped for their lag leave room.
"""

from __future__ import annotations

from collections.abc import Awaitable

from aiorl.runtime.fragments import FragmentHub
from aiorl.runtime.memory.links import ActorLink, LearnerLink
from aiorl.runtime.memory.store import Store, StoreParts, send_end
from aiorl.runtime.memory.tally import values_why
from aiorl.runtime.messages import BadMessage, RowSpec
from aiorl.runtime.phase import Phase
from aiorl.wire import Connection, ConnectionClosed


class QueueStore(Store):
    actor_kind = "fragment"

    def __init__(self, parts: StoreParts, hub: FragmentHub, rows: RowSpec):
        super().__init__(parts)
        self.hub = hub
        self.rows = rows
        self.flow.limiter = hub.room  # actor credits as the queue's room allows

    @classmethod
    def wanted(cls, cfg) -> bool:
        return cfg.algorithm.fragment_queue(cfg) is not None

    @classmethod
    def build(cls, cfg, algo, parts: StoreParts, rows: RowSpec, layout) -> QueueStore:
        a, c = cfg.agent, cfg.cluster
        hub = FragmentHub(
            algo.transition_spec(),
            a.sample_batch_size,
            cfg.env.num_envs,
            algo.fragment_queue(cfg),
            layout,
            c.actors,
            c.actor_credits,
            per_fragment=algo.per_fragment_spec(),
        )
        return cls(parts, hub, rows)

    # ------------------------------------------------------------------ actors

    def actor_opened(self, link: ActorLink) -> None:
        link.frames = self.hub.stream()

    async def accept(self, link: ActorLink, msg, fields: dict) -> None:
        """One fragment per env, sent against a credit (the queue's room is counted in credits)."""
        if link.credits < 1:
            raise BadMessage(f"{link.name} sent a fragment message without a credit")
        seq = fields["seq"]
        if seq != link.next_seq:
            link.seq_errors += 1
            self.log.error("%s fragment message seq %d, expected %d", link.name, seq, link.next_seq)
        link.next_seq = seq + 1
        version = fields["weights_version"]
        # A version from the future would never age past max_policy_lag, and its policy lag is negative.
        unpublished = version > self._newest_version() and version > await self._published_version()
        try:
            rejected, fields = self.hub.ingest(
                link.index,
                version,
                dict(msg.arrays),
                stream=link.frames,
                keep_from=fields.get("keep_from"),
                values=self.rows,
                drop_all=unpublished,
            )
        except ValueError as exc:
            raise BadMessage(f"{link.name}: {exc}") from None
        steps = self.hub.queue.steps
        n = self.hub.num_envs * steps
        if rejected:
            why = f"acted with weights version {version}, not yet published" if unpublished else values_why(fields)
            self.tally.reject(link, rejected * steps, n, "dropped", why)
            n -= rejected * steps
        self.tally.stored(link, n)
        self.flow.inserted(link, n)  # with the credit checked above
        self.changed.fire()

    def _newest_version(self) -> int:
        """The newest published weights version this memory host knows of without asking."""
        return self.parts.newest_version(self.hub.known_version)

    def _published_version(self) -> Awaitable[int]:
        return self.parts.published_version()

    # ------------------------------------------------------------------ learners

    def on_credit(self, fields: dict) -> None:
        if "version" in fields:
            self.hub.saw_version(fields["version"])
            self.flow.grant_actor_credits()  # fragments dropped for their lag leave room

    async def serve(self, conn: Connection, link: LearnerLink, learner_index: int) -> None:
        """One batch of the oldest fragments per credit while RUNNING or STOPPING, then ``end``."""
        hub = self.hub
        draining = lambda: self.phase() >= Phase.DRAINING  # noqa: E731
        while True:
            await self.changed.wait_for(lambda: draining() or (link.credits > 0 and hub.ready()))
            if draining():
                break
            link.credits -= 1
            batch, meta = hub.take()
            rows = hub.qspec.fragments_per_batch * hub.queue.steps
            self.tally.sampled += rows
            link.batches_sent += 1
            self.flow.sampled(rows)  # room in the queue: actors' credits may go out
            self.changed.fire()
            try:
                await conn.send("samples", {"memory": self.index, **meta}, batch)
            except ConnectionClosed:
                return  # the learner went away; its connection handler reports it
        await send_end(conn, link, self.index)

    # ------------------------------------------------------------------ the role's life

    def announce(self, bind: str, port: int) -> None:
        self.log.info(
            "serving a trajectory queue on %s:%s (%d fragments of %d steps, when full: %s)",
            bind,
            port,
            self.hub.qspec.capacity,
            self.hub.queue.steps,
            self.hub.qspec.full,
        )

    def metrics(self) -> dict:
        return self.hub.metrics()

    def summary(self) -> dict:
        return {**super().summary(), "queue": self.hub.stats()}
