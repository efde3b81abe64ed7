"""The learner side of the memory host: batches out to each learner on its
credits, and its priority updates back.

Pull-based: a learner grants credits (one per batch it will consume); the
memory samples only against a credit, so it never samples ahead of demand,
and every learner is fed by every memory. Priority updates come back on the
same connection; updates to slots overwritten since sampling are counted as
stale, never silently dropped. With ``agent.samples_per_insert`` learners'
batches also wait for the ratio (`aiorl.runtime.memory.flow`).

IMPALA's learners get the oldest fragments of the trajectory queue on their
credits. For synchronous algorithms the memory hands each learner its share
of round k when it asks for iteration k.
"""

from __future__ import annotations

import asyncio
import time

import numpy as np

from aiorl.runtime.memory.links import LearnerLink
from aiorl.runtime.messages import PRIORITY_UPDATE, BadMessage
from aiorl.runtime.phase import Phase
from aiorl.runtime.ratelimit import RATIO_LOWER
from aiorl.wire import Connection, ConnectionClosed


class LearnerFeed:
    """`MemoryRole`'s learner side, a mixin: it samples the role's replay, queue or rounds and
    counts on the role (`sampled`, `sample_blocked_s`), under the role's `flow` of credits."""

    async def _serve_learner(self, conn: Connection, index: int) -> None:
        link = self.learners.setdefault(conn.peer_name, LearnerLink(conn.peer_name))
        link.beta = self.cfg.agent.prioritized_replay_beta

        def handle(msg, fields) -> None:
            if msg.kind == "credit":
                self._grant(link, fields.get("n", 1), fields)
            else:
                self._apply_priorities(link, msg)
                if fields.get("credit"):  # the batch's credit rides on its priorities
                    self._grant(link, fields["credit"], fields)

        allowed = {"credit", "priorities"} if self.cfg.agent.prioritized_replay and not self.synchronous else {"credit"}
        sampler = self.spawn(
            self._sync_sampler(conn, link, index) if self.synchronous else self._sampler(conn, link),
            f"sampler for {link.name}",
        )
        try:
            link.done_meta = await self._read(conn, link.name, "learner_done", allowed, handle)
        finally:
            if link.done_meta is None:
                self.log.warning("%s went away without finishing", link.name)
            link.finished.set()
            sampler.cancel()
            await asyncio.gather(sampler, return_exceptions=True)

    def _grant(self, link: LearnerLink, credits: int, fields: dict) -> None:
        """A learner's credit for `credits` more batches, with its current beta (and sync iteration)."""
        self.flow.grant_learner(link, credits)
        link.beta = fields.get("beta", link.beta)
        if "iteration" in fields:
            link.iteration = fields["iteration"]
        if self.fragments is not None and "version" in fields:
            self.fragments.saw_version(fields["version"])
            self.flow.grant_actor_credits()  # fragments dropped for their lag leave room
        self.changed.fire()

    def _apply_priorities(self, link: LearnerLink, msg) -> None:
        arrays = msg.arrays
        n = PRIORITY_UPDATE.rows("priorities", arrays)
        link.priority_messages += 1
        try:  # refused whole (nothing written) if a priority or an index is bad
            stale = self.replay.update_priorities(arrays["indices"], arrays["priorities"], arrays.get("generations"))
        except ValueError:
            priorities = arrays["priorities"]
            good = np.isfinite(priorities) & (priorities >= 0)
            if good.all():
                raise BadMessage("priorities: an index is out of range") from None
            bad = int(n - good.sum())
            link.priorities_rejected += bad
            self._log_peer("%s: ignored %d of %d priorities that are non-finite or negative", link.name, bad, n)
            arrays = {k: v[good] for k, v in arrays.items()}
            n -= bad
            stale = self.replay.update_priorities(arrays["indices"], arrays["priorities"], arrays.get("generations"))
        link.priorities_stale += int(stale)
        link.priorities_applied += n - int(stale)

    def _within_rate(self) -> bool:
        return self.flow.within_rate(len(self.replay))

    async def _sampler(self, conn: Connection, link: LearnerLink) -> None:
        """Send one batch per credit while RUNNING or STOPPING, then ``end``."""
        if self.fragments is not None:
            return await self._fragment_sampler(conn, link)
        batch_size = self.cfg.agent.batch_size
        draining = lambda: self.phase >= Phase.DRAINING  # noqa: E731
        while True:
            ready = lambda: link.credits > 0 and len(self.replay) >= self.threshold  # noqa: E731
            # First the learner's request, then what the limiter holds it by (the shard's size or
            # the ratio): a wait that began for want of a request is the learner's, not the limiter's.
            await self.changed.wait_for(lambda: draining() or link.credits > 0)
            bound = None if draining() else self.flow.sample_bound(len(self.replay))
            t0 = time.perf_counter()
            await self.changed.wait_for(lambda: draining() or (ready() and self._within_rate()))
            if bound is not None:
                waited = time.perf_counter() - t0
                self.flow.held(bound, waited, link.name)
                if bound == RATIO_LOWER:  # the data was there: the ratio held it back
                    self.sample_blocked_s += waited
            if draining():
                break
            link.credits -= 1
            batch = (
                self.replay.sample(batch_size, link.beta)
                if self.cfg.agent.prioritized_replay
                else self.replay.sample(batch_size)
            )
            rows = len(batch["indices"]) if "indices" in batch else 0
            self.sampled += rows
            self.flow.sampled(rows)
            link.batches_sent += 1
            try:
                await conn.send("samples", {"memory": self.index}, batch)
            except ConnectionClosed:
                return  # the learner went away; its connection handler reports it
        await self._send_end(conn, link)

    async def _fragment_sampler(self, conn: Connection, link: LearnerLink) -> None:
        """One batch of the oldest fragments per credit while RUNNING or STOPPING, then ``end``."""
        hub = self.fragments
        draining = lambda: self.phase >= Phase.DRAINING  # noqa: E731
        while True:
            await self.changed.wait_for(lambda: draining() or (link.credits > 0 and hub.ready()))
            if draining():
                break
            link.credits -= 1
            batch, meta = hub.take()
            rows = hub.qspec.fragments_per_batch * hub.queue.steps
            self.sampled += rows
            link.batches_sent += 1
            self.flow.sampled(rows)  # room in the queue: actors' credits may go out
            self.changed.fire()
            try:
                await conn.send("samples", {"memory": self.index, **meta}, batch)
            except ConnectionClosed:
                return  # the learner went away; its connection handler reports it
        await self._send_end(conn, link)

    async def _sync_sampler(self, conn: Connection, link: LearnerLink, learner_index: int) -> None:
        """Send the learner its share of each round it asks for; ``end`` once none will come."""
        rounds = self.rounds

        def can_answer() -> bool:
            if link.iteration is not None:
                return rounds.ready(link.iteration) or rounds.final
            return rounds.exhausted(link.next_iteration)

        while True:
            await self.changed.wait_for(can_answer)
            iteration = link.iteration
            if iteration is None or not rounds.ready(iteration):
                break
            link.iteration = None
            link.credits -= 1
            batch, meta = rounds.take(iteration, learner_index)
            link.next_iteration = iteration + 1
            link.batches_sent += 1
            self.sampled += len(next(iter(batch.values()))) if batch else 0
            try:
                await conn.send("samples", {"memory": self.index, "iteration": iteration, **meta}, batch)
            except ConnectionClosed:
                return
        await self._send_end(conn, link)

    async def _send_end(self, conn: Connection, link: LearnerLink) -> None:
        try:
            await conn.send("end", {"memory": self.index, "batches_sent": link.batches_sent})
        except ConnectionClosed:
            pass
