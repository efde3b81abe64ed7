"""Memory host: holds one shard of replay, ingests actors' batches and feeds
learners on demand.

Pull-based: a learner grants credits (one per batch it will consume); the
memory samples only against a credit, so it never samples ahead of demand,
and every learner is fed by every memory. Priority updates come back on the
same connection; updates to slots overwritten since sampling are counted as
stale, never silently dropped.

IMPALA's memories keep a bounded FIFO of whole fragments instead
(`aiorl.runtime.fragments.FragmentHub`): actors send against credits this
memory gives them, learners get the oldest fragments on their credits.

For synchronous algorithms the memory gathers rounds (`aiorl.runtime.rounds`):
exactly one rollout per iteration from each live actor assigned to it (actor
i goes to memory i % memories), or every work item assigned to it, and hands
each learner its share of round k when it asks for iteration k.
"""
from __future__ import annotations

import asyncio
import math
import signal
from dataclasses import dataclass, field


from aiorl.replay import PrioritizedReplayBuffer, ReplayBuffer
from aiorl.replay.frames import FrameReplayBuffer, frame_layout
from aiorl.runtime.algorithm import build_algorithm, get_algorithm
from aiorl.runtime.fragments import FragmentHub, int_field
from aiorl.runtime.phase import Phase, parse_role_name
from aiorl.runtime.role import Role
from aiorl.runtime.rounds import Rounds
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
    frames: object = None  # frame layout: the FrameStream of this connection
    conn: Connection | None = None


@dataclass
class LearnerLink:
    name: str
    credits: int = 0
    beta: float = 0.4
    iteration: int | None = None  # sync mode: the iteration the learner asks for
    next_iteration: int = 0  # sync mode: the iteration after the last one it got
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
        self.rounds: Rounds | None = None  # sync mode
        self.fragments: FragmentHub | None = None  # trajectory queue (IMPALA)
        self.finished_actors: set[int] = set()  # sync mode: actors that can send nothing more here
        self._conn_tasks: set[asyncio.Task] = set()

    def advertised_address(self):
        return (self.cfg.cluster.advertise_host or self.coordinator_address()[0], self.server.port)

    def metrics(self) -> dict:
        frames = {"replay_frames": len(self.replay.pool)} if isinstance(self.replay, FrameReplayBuffer) else {}
        queue = self.fragments.metrics() if self.fragments is not None else {}
        return {**frames, **queue, "replay_size": len(self.replay) if self.replay is not None else 0,
                "replay_capacity": self.capacity if self.replay is not None else 0,  # sync: no replay
                "inserted": self.inserted, "sampled": self.sampled,
                "actor_connections": sum(not link.closed for link in self.actors.values()),
                "learner_credits": sum(link.credits for link in self.learners.values())}

    async def _run(self) -> int:
        algo = build_algorithm(self.cfg)
        spec = algo.transition_spec()
        layout = frame_layout(self.cfg, algo)
        a, c = self.cfg.agent, self.cfg.cluster
        queue = algo.fragment_queue(self.cfg)
        if self.synchronous:
            self.rounds = Rounds(spec, self.index, c.memories, c.actors, c.learners, algo.work_items(self.cfg),
                                 self.log)
        elif queue is not None:
            self.fragments = FragmentHub(spec, a.sample_batch_size, self.cfg.env.num_envs, queue, layout, c.actors)
        elif layout is not None:
            self.replay = FrameReplayBuffer(
                self.capacity, spec, layout, alpha=a.prioritized_replay_alpha if a.prioritized_replay else None,
                eps=a.prioritized_replay_eps, seed=self.cfg.run.seed + 1000 + self.index,
                max_streams=self.cfg.cluster.actors)
        elif a.prioritized_replay:
            self.replay = PrioritizedReplayBuffer(self.capacity, spec, alpha=a.prioritized_replay_alpha,
                                                  eps=a.prioritized_replay_eps,
                                                  seed=self.cfg.run.seed + 1000 + self.index)
        else:
            self.replay = ReplayBuffer(self.capacity, spec, seed=self.cfg.run.seed + 1000 + self.index)
        bind = self.cfg.cluster.advertise_host or self.coordinator_address()[0]
        self.server = await serve(self._on_connection, host=bind, port=0, token=self.token,
                                  name=self.name, ssl=self.ssl_server)
        if self.fragments is not None:
            self.log.info("serving a trajectory queue on %s:%s (%d fragments of %d steps, when full: %s)", bind,
                          self.server.port, queue.capacity, a.sample_batch_size, queue.full)
        else:
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
        if isinstance(self.replay, FrameReplayBuffer):
            link.frames = self.replay.stream()  # frame ids start over with every connection
        link.conn = conn

        def handle(msg) -> None:
            if msg.kind == "batch":
                self._ingest(link, msg)
            elif msg.kind == "rollout":
                self._ingest_rollout(link, index, msg)
            elif msg.kind == "fragment" and self.fragments is not None:
                self._ingest_fragment(link, index, msg)
            else:
                raise ValueError(f"unexpected message {msg.kind!r}")

        credits = None
        if self.fragments is not None:
            self.fragments.join(link.name)
            credits = asyncio.create_task(self._actor_credits(conn, link))
        try:
            link.done_meta = await self._read(conn, link.name, "actor_done", handle)
        finally:
            if credits is not None:
                credits.cancel()
                await asyncio.gather(credits, return_exceptions=True)
                self.fragments.leave(link.name)
            link.closed = True
            if link.frames is not None:
                link.frames.release()
                link.frames = None
            if link.done_meta is None:
                self.log.warning("%s went away without finishing (%d batches received)", link.name, link.batches)
            if self.synchronous:
                self._actor_finished(index)
            self.changed.fire()

    def _ingest(self, link: ActorLink, msg) -> None:
        seq = int(msg.meta.get("seq", -1))
        if seq != link.next_seq:
            link.seq_errors += 1
            self.log.error("%s batch seq %d, expected %d", link.name, seq, link.next_seq)
        link.next_seq = seq + 1
        arrays = dict(msg.arrays)
        priorities = arrays.pop("priorities", None)
        if link.frames is not None:
            self.replay.add(arrays, priorities, stream=link.frames, keep_from=msg.meta.get("keep_from"))
        elif isinstance(self.replay, PrioritizedReplayBuffer):
            self.replay.add(arrays, priorities)
        else:
            self.replay.add(arrays)
        n = len(next(iter(arrays.values()))) if arrays else 0
        link.batches += 1
        link.transitions += n
        self.inserted += n
        self.changed.fire()

    # ------------------------------------------------------------------ trajectory queue

    def _ingest_fragment(self, link: ActorLink, actor_index: int, msg) -> None:
        seq = int_field(msg.meta, "seq")
        if seq != link.next_seq:
            link.seq_errors += 1
            self.log.error("%s fragment message seq %d, expected %d", link.name, seq, link.next_seq)
        link.next_seq = seq + 1
        arrays = dict(msg.arrays)
        self.fragments.ingest(link.name, actor_index, msg.meta, arrays)
        n = self.fragments.num_envs * self.fragments.queue.steps
        link.batches += 1
        link.transitions += n
        self.inserted += n
        self.changed.fire()

    async def _actor_credits(self, conn: Connection, link: ActorLink) -> None:
        """Give this actor its credits, each when it is first in line and (throttle) the queue has room."""
        hub = self.fragments
        try:
            while True:
                await self.changed.wait_for(lambda: hub.next_credit(link.name))
                hub.gate.grant(link.name)
                self.changed.fire()  # the next actor in line may go now
                await conn.send("credit", {"n": 1})
        except ConnectionClosed:
            pass

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
            self.sampled += hub.qspec.fragments_per_batch * hub.queue.steps
            link.batches_sent += 1
            self.changed.fire()  # room in the queue: actors' credits may go out
            await conn.send("samples", {"memory": self.index, **meta}, batch)
        await conn.send("end", {"memory": self.index, "batches_sent": link.batches_sent})

    # ------------------------------------------------------------------ sync aggregation

    def _ingest_rollout(self, link: ActorLink, actor_index: int, msg) -> None:
        n = len(next(iter(msg.arrays.values()))) if msg.arrays else 0
        outcome = self.rounds.add(actor_index, msg.meta, dict(msg.arrays))
        if outcome != "added":
            self.log.debug("%s: ignored a %s part (%r)", link.name, outcome, msg.meta)
            return
        link.batches += 1
        link.next_seq += 1
        link.transitions += n
        self.inserted += n
        self.changed.fire()

    def _actor_finished(self, actor_index: int) -> None:
        """Actor `actor_index` will send nothing more here (done, connection gone, or lost)."""
        if actor_index in self.finished_actors:
            return
        self.finished_actors.add(actor_index)
        self.rounds.drop_actor(actor_index)
        if len(self.finished_actors) == self.cfg.cluster.actors:
            self.rounds.finalize()
        self.changed.fire()

    def on_role_lost(self, name: str) -> None:
        """The coordinator declared `name` lost or failed: a hung actor's rollouts are not waited for."""
        try:
            kind, index = parse_role_name(name)
        except ValueError:
            self.log.warning("ignored role_lost for %r", name)
            return
        if kind != "actor" or not 0 <= index < self.cfg.cluster.actors:
            return
        link = self.actors.get(name)
        if link is not None and link.conn is not None and not link.closed:
            link.conn.abort()  # its reader ends and finishes the actor
        if self.synchronous:
            self._actor_finished(index)

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

        if self.synchronous:
            sampler = asyncio.create_task(self._sync_sampler(conn, link, index))
        elif self.fragments is not None:
            sampler = asyncio.create_task(self._fragment_sampler(conn, link))
        else:
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
        if self.fragments is not None and "version" in meta:
            self.fragments.saw_version(int_field(meta, "version", -1))
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
            await self.changed.wait_for(lambda: draining() or (
                link.credits > 0 and len(self.replay) >= self.threshold and self._within_rate(batch_size)))
            if draining():
                break
            link.credits -= 1
            beta = link.beta
            batch = self.replay.sample(batch_size, beta) if self.cfg.agent.prioritized_replay \
                else self.replay.sample(batch_size)
            meta = {"memory": self.index}
            self.sampled += len(batch["indices"]) if "indices" in batch else 0
            link.batches_sent += 1
            await conn.send("samples", meta, batch)
        await conn.send("end", {"memory": self.index, "batches_sent": link.batches_sent})

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
            await conn.send("samples", {"memory": self.index, "iteration": iteration, **meta}, batch)
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
            "queue": None if self.fragments is None else self.fragments.stats(),
            "rounds": None if self.rounds is None else {
                "completed": self.rounds.iteration, "duplicates": self.rounds.duplicates,
                "stale": self.rounds.stale, "discarded_rows": self.rounds.discarded_rows},
            "actors": {n: {"batches": l.batches, "transitions": l.transitions, "next_seq": l.next_seq,
                           "seq_errors": l.seq_errors, "finished": l.done_meta is not None}
                       for n, l in self.actors.items()},
            "learners": {n: {"batches_sent": l.batches_sent, "priority_messages": l.priority_messages,
                             "priorities_applied": l.priorities_applied,
                             "priorities_stale": l.priorities_stale,
                             "reported": l.done_meta}
                         for n, l in self.learners.items()},
        }
