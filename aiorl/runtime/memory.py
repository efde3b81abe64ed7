"""Memory host: holds one shard of replay, ingests actors' batches and feeds
learners on demand.

Pull-based: a learner grants credits (one per batch it will consume); the
memory samples only against a credit, so it never samples ahead of demand,
and every learner is fed by every memory. Priority updates come back on the
same connection; updates to slots overwritten since sampling are counted as
stale, never silently dropped.

For synchronous algorithms the memory aggregates exactly one rollout per
iteration from each live actor assigned to it (actor i goes to memory
i % memories) and hands the aggregate of iteration k to the learner that asks
for it.
"""
from __future__ import annotations

import asyncio
import math
import signal
from dataclasses import dataclass, field


from aiorl.replay import AggregateBuffer, PrioritizedReplayBuffer, ReplayBuffer
from aiorl.runtime.algorithm import build_algorithm, get_algorithm
from aiorl.runtime.phase import Phase, parse_role_name
from aiorl.runtime.role import Role
from aiorl.wire import Connection, ConnectionClosed, Server, serve


class Pulse:
    """Wakes a waiter when state changes and its predicate now holds.

    Predicates are checked in `fire` (they are cheap reads of the memory's
    state), so a change that enables nobody wakes no task: the sampler sees
    every insert, but with a learner batch of 512 and rate limiting only one
    insert in eight lets it send.
    """

    def __init__(self):
        self._waiters: list[tuple[object, asyncio.Future]] = []

    def fire(self) -> None:
        if not self._waiters:
            return
        waiting = []
        for predicate, waiter in self._waiters:
            if waiter.done():  # its task was cancelled
                continue
            if predicate():
                waiter.set_result(None)
            else:
                waiting.append((predicate, waiter))
        self._waiters = waiting

    async def wait_for(self, predicate) -> None:
        while not predicate():
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append((predicate, waiter))
            await waiter


@dataclass
class ActorLink:
    name: str
    batches: int = 0
    transitions: int = 0
    next_seq: int = 0
    seq_errors: int = 0
    done_meta: dict | None = None  # the actor's own account, from its actor_done
    closed: bool = False


@dataclass
class LearnerLink:
    name: str
    credits: int = 0
    beta: float = 0.4
    iteration: int | None = None  # sync mode: the iteration the learner asks for
    batches_sent: int = 0
    priority_messages: int = 0
    priorities_applied: int = 0
    priorities_stale: int = 0
    done_meta: dict | None = None
    finished: asyncio.Event = field(default_factory=asyncio.Event)


class MemoryRole(Role):
    kind = "memory"

    def __init__(self, *args, coordinator=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.local_coordinator = coordinator  # memory 0 hosts it
        a, c = self.cfg.agent, self.cfg.cluster
        self.synchronous = get_algorithm(self.cfg.algo).is_synchronous(self.cfg)
        self.capacity = a.buffer_size // c.memories
        self.threshold = max(1, math.ceil(a.learning_starts / c.memories))
        self.server: Server | None = None
        self.replay = None
        self.actors: dict[str, ActorLink] = {}
        self.learners: dict[str, LearnerLink] = {}
        self.changed = Pulse()
        self.inserted = 0
        self.sampled = 0
        self.assigned = [i for i in range(c.actors) if i % c.memories == self.index]
        self.aggregates: dict[int, dict] = {}  # sync mode: iteration -> aggregate
        self.aggregate_iteration = 0
        self.aggregate: AggregateBuffer | None = None
        self.lost_actors: set[int] = set()
        self._conn_tasks: set[asyncio.Task] = set()

    def advertised_address(self):
        return (self.cfg.cluster.advertise_host or self.coordinator_address()[0], self.server.port)

    def metrics(self) -> dict:
        return {"replay_size": len(self.replay) if self.replay is not None else 0,
                "replay_capacity": self.capacity, "inserted": self.inserted, "sampled": self.sampled,
                "actor_connections": sum(not link.closed for link in self.actors.values()),
                "learner_credits": sum(link.credits for link in self.learners.values())}

    async def _run(self) -> int:
        spec = build_algorithm(self.cfg).transition_spec()
        a = self.cfg.agent
        if self.synchronous:
            self.aggregate = AggregateBuffer(max(1, len(self.assigned)), spec)
        elif a.prioritized_replay:
            self.replay = PrioritizedReplayBuffer(self.capacity, spec, alpha=a.prioritized_replay_alpha,
                                                  eps=a.prioritized_replay_eps,
                                                  seed=self.cfg.run.seed + 1000 + self.index)
        else:
            self.replay = ReplayBuffer(self.capacity, spec, seed=self.cfg.run.seed + 1000 + self.index)
        bind = self.cfg.cluster.advertise_host or self.coordinator_address()[0]
        self.server = await serve(self._on_connection, host=bind, port=0, token=self.token,
                                  name=self.name, ssl=self.ssl_server)
        self.log.info("serving replay on %s:%s (capacity %d)", bind, self.server.port, self.capacity)
        return await super()._run()

    def _set_phase(self, phase: Phase) -> None:
        super()._set_phase(phase)
        self.changed.fire()

    def _on_signal(self, sig: int) -> None:
        if self.local_coordinator is not None and self._signals == 0:
            self._signals += 1
            self.local_coordinator.begin_stop(f"got {signal.Signals(sig).name}")
            return
        super()._on_signal(sig)

    async def cleanup(self) -> None:
        if self.server is not None:
            await self.server.close()

    # ------------------------------------------------------------------ connections

    async def _on_connection(self, conn: Connection) -> None:
        try:
            kind, index = parse_role_name(conn.peer_name or "")
        except ValueError:
            self.log.warning("closing connection from %s: %r is not an actor or learner",
                             conn.peer, conn.peer_name)
            return
        if kind == "actor":
            await self._serve_actor(conn, index)
        elif kind == "learner":
            await self._serve_learner(conn, index)
        else:
            self.log.warning("closing connection from %s: %s does not talk to memories", conn.peer, conn.peer_name)

    async def _read(self, conn: Connection, name: str, done_kind: str, handle) -> dict | None:
        """Feed each message to `handle` until the peer's `done_kind` message, whose meta is
        returned; None when the connection ended first or sent something bad (logged)."""
        try:
            async for msg in conn:
                if msg.kind == done_kind:
                    return dict(msg.meta)
                handle(msg)
        except ConnectionClosed:
            pass
        except (ValueError, KeyError, TypeError) as exc:
            self.log.error("closing connection of %s: bad message: %s", name, exc)
        return None

    async def _serve_actor(self, conn: Connection, index: int) -> None:
        link = self.actors.setdefault(conn.peer_name, ActorLink(conn.peer_name))

        def handle(msg) -> None:
            if msg.kind == "batch":
                self._ingest(link, msg)
            elif msg.kind == "rollout":
                self._ingest_rollout(link, index, msg)
            else:
                raise ValueError(f"unexpected message {msg.kind!r}")

        try:
            link.done_meta = await self._read(conn, link.name, "actor_done", handle)
        finally:
            link.closed = True
            if link.done_meta is None:
                self.log.warning("%s went away without finishing (%d batches received)", link.name, link.batches)
                if self.synchronous:
                    self._drop_actor(index)
            self.changed.fire()

    def _ingest(self, link: ActorLink, msg) -> None:
        seq = int(msg.meta.get("seq", -1))
        if seq != link.next_seq:
            link.seq_errors += 1
            self.log.error("%s batch seq %d, expected %d", link.name, seq, link.next_seq)
        link.next_seq = seq + 1
        arrays = dict(msg.arrays)
        priorities = arrays.pop("priorities", None)
        if isinstance(self.replay, PrioritizedReplayBuffer):
            self.replay.add(arrays, priorities)
        else:
            self.replay.add(arrays)
        n = len(next(iter(arrays.values()))) if arrays else 0
        link.batches += 1
        link.transitions += n
        self.inserted += n
        self.changed.fire()

    # ------------------------------------------------------------------ sync aggregation

    def _ingest_rollout(self, link: ActorLink, actor_index: int, msg) -> None:
        iteration = int(msg.meta["iteration"])
        if iteration != self.aggregate_iteration:
            raise ValueError(f"{link.name} sent iteration {iteration}, this memory is collecting "
                             f"iteration {self.aggregate_iteration}")
        self.aggregate.add(self.assigned.index(actor_index), dict(msg.arrays))
        link.batches += 1
        link.next_seq += 1
        n = len(next(iter(msg.arrays.values()))) if msg.arrays else 0
        link.transitions += n
        self.inserted += n
        self._maybe_complete_aggregate()

    def _drop_actor(self, actor_index: int) -> None:
        if actor_index in self.lost_actors:
            return
        self.lost_actors.add(actor_index)
        self.aggregate.drop(self.assigned.index(actor_index))
        self._maybe_complete_aggregate()

    def _maybe_complete_aggregate(self) -> None:
        if self.aggregate.complete:
            self.aggregates[self.aggregate_iteration] = self.aggregate.take()
            self.aggregate_iteration += 1
        self.changed.fire()

    def _aggregate_ready(self, iteration: int) -> bool:
        return iteration in self.aggregates or len(self.lost_actors) == len(self.assigned)

    # ------------------------------------------------------------------ learners

    async def _serve_learner(self, conn: Connection, index: int) -> None:
        link = self.learners.setdefault(conn.peer_name, LearnerLink(conn.peer_name))
        link.beta = self.cfg.agent.prioritized_replay_beta

        def handle(msg) -> None:
            if msg.kind == "credit":
                self._grant(link, int(msg.meta.get("n", 1)), msg.meta)
            elif msg.kind == "priorities":
                self._apply_priorities(link, msg)
                if msg.meta.get("credit"):  # the batch's credit rides on its priorities
                    self._grant(link, int(msg.meta["credit"]), msg.meta)
            else:
                raise ValueError(f"unexpected message {msg.kind!r}")

        sampler = asyncio.create_task(self._sampler(conn, link))
        try:
            link.done_meta = await self._read(conn, link.name, "learner_done", handle)
        finally:
            if link.done_meta is None:
                self.log.warning("%s went away without finishing", link.name)
            link.finished.set()
            sampler.cancel()
            await asyncio.gather(sampler, return_exceptions=True)

    def _grant(self, link: LearnerLink, credits: int, meta: dict) -> None:
        """A learner's credit for `credits` more batches, with its current beta (and sync iteration)."""
        link.credits += credits
        link.beta = float(meta.get("beta", link.beta))
        if "iteration" in meta:
            link.iteration = int(meta["iteration"])
        self.changed.fire()

    def _apply_priorities(self, link: LearnerLink, msg) -> None:
        arrays = msg.arrays
        link.priority_messages += 1
        stale = self.replay.update_priorities(arrays["indices"], arrays["priorities"],
                                              arrays.get("generations"))
        link.priorities_stale += int(stale)
        link.priorities_applied += len(arrays["indices"]) - int(stale)

    def _within_rate(self, batch_size: int) -> bool:
        limit = self.cfg.agent.max_samples_per_insert
        return limit is None or self.sampled + batch_size <= limit * self.inserted

    async def _sampler(self, conn: Connection, link: LearnerLink) -> None:
        """Send one batch per credit while RUNNING or STOPPING, then ``end``."""
        batch_size = self.cfg.agent.batch_size
        draining = lambda: self.phase >= Phase.DRAINING  # noqa: E731
        while True:
            if self.synchronous:
                await self.changed.wait_for(lambda: draining() or (
                    link.credits > 0 and link.iteration is not None and self._aggregate_ready(link.iteration)))
            else:
                await self.changed.wait_for(lambda: draining() or (
                    link.credits > 0 and len(self.replay) >= self.threshold and self._within_rate(batch_size)))
            if draining():
                break
            link.credits -= 1
            if self.synchronous:
                iteration = link.iteration
                batch = self.aggregates.pop(iteration, None)
                meta = {"memory": self.index, "iteration": iteration, "empty": batch is None}
                link.iteration = None
                batch = batch or {}
            else:
                beta = link.beta
                batch = self.replay.sample(batch_size, beta) if isinstance(
                    self.replay, PrioritizedReplayBuffer) else self.replay.sample(batch_size)
                meta = {"memory": self.index}
            self.sampled += len(batch["indices"]) if "indices" in batch else 0
            link.batches_sent += 1
            await conn.send("samples", meta, batch)
        await conn.send("end", {"memory": self.index, "batches_sent": link.batches_sent})

    # ------------------------------------------------------------------ main

    async def main(self) -> dict:
        await self.wait_phase(Phase.CLOSING)
        # Learners send learner_done after their last priorities; wait for every one
        # connected (or its connection closing) so no update is left unapplied.
        pending = [link.finished.wait() for link in self.learners.values()]
        try:
            async with asyncio.timeout(self.cfg.cluster.phase_timeout_s / 2):
                await asyncio.gather(*pending)
        except TimeoutError:
            late = [n for n, link in self.learners.items() if not link.finished.is_set()]
            self.log.error("learners did not finish in time: %s", ", ".join(late))
        snapshot = None
        if self.cfg.run.snapshot_replay and self.replay is not None:
            snapshot = str(self.run_dir / f"replay-{self.name}.npz")
            await asyncio.to_thread(self.replay.save, snapshot)
            self.log.info("replay saved to %s", snapshot)
        return {
            "inserted": self.inserted,
            "sampled": self.sampled,
            "replay_size": len(self.replay) if self.replay is not None else 0,
            "snapshot": snapshot,
            "actors": {n: {"batches": l.batches, "transitions": l.transitions, "next_seq": l.next_seq,
                           "seq_errors": l.seq_errors, "finished": l.done_meta is not None}
                       for n, l in self.actors.items()},
            "learners": {n: {"batches_sent": l.batches_sent, "priority_messages": l.priority_messages,
                             "priorities_applied": l.priorities_applied,
                             "priorities_stale": l.priorities_stale, "beta": l.beta,
                             "reported": l.done_meta}
                         for n, l in self.learners.items()},
        }
