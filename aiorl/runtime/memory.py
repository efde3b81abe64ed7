"""Memory host: holds one shard of replay, ingests actors' batches and feeds
learners on demand.

Pull-based: a learner grants credits (one per batch it will consume); the
memory samples only against a credit, so it never samples ahead of demand,
and every learner is fed by every memory. Priority updates come back on the
same connection; updates to slots overwritten since sampling are counted as
stale, never silently dropped. With ``agent.samples_per_insert`` the memory
also rate limits both sides (`aiorl.runtime.ratelimit`): learners' batches
wait for the ratio, and actors send only against credits it grants them.

Each actor connection is accounted on its own (batches, transitions, a
sequence number from 0): a restarted actor's new connection starts again at
0, and every transition accepted is counted in exactly one of them.

IMPALA's memories keep a bounded FIFO of whole fragments instead
(`aiorl.runtime.fragments.FragmentHub`): actors send against credits this
memory gives them, learners get the oldest fragments on their credits.

For synchronous algorithms the memory gathers rounds (`aiorl.runtime.rounds`):
exactly one rollout per iteration from each live actor assigned to it (actor
i goes to memory i % memories), or every work item assigned to it, and hands
each learner its share of round k when it asks for iteration k.

Only roles the coordinator registered for this run attach, once per live
registration: a peer's first message is ``attach`` with the session id its
registration got, which the coordinator confirms. A name this run does not
have, a session that is not that name's current one, or a second connection
of the same registration is refused (logged at a bounded rate, counted in
``peers_refused``); a newer registration of a name (a restarted role)
replaces the older one's connection. Every message is checked
(`aiorl.runtime.messages`); a bad one closes that connection only. Batch
rows with a non-finite or negative priority are dropped and counted
(``rows_rejected``), the rest of the batch is kept (in the frame layout, where
the rows of a message share its frames, such rows are kept at priority 0).
"""

from __future__ import annotations

import asyncio
import collections
import hmac
import logging
import math
import signal
import time
from dataclasses import dataclass, field

import numpy as np

from aiorl.ratelog import RateLimitedLog
from aiorl.replay import PrioritizedReplayBuffer, ReplayBuffer
from aiorl.replay.frames import FrameReplayBuffer, frame_layout
from aiorl.runtime import frame_limits
from aiorl.runtime.algorithm import get_algorithm
from aiorl.runtime.fragments import FragmentHub
from aiorl.runtime.messages import PRIORITY_UPDATE, BadMessage, RowSpec, check
from aiorl.runtime.phase import Phase, parse_role_name
from aiorl.runtime.ratelimit import ACTOR_CREDITS, SampleToInsertRatio
from aiorl.runtime.resources import listen_backlog
from aiorl.runtime.role import Role
from aiorl.runtime.rounds import Rounds
from aiorl.runtime.snapshot import ReplaySnapshots, snapshot_path
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
    """One actor connection (a restarted actor, or one that reconnected, makes a new one)."""

    name: str
    conn: Connection | None = None
    batches: int = 0
    transitions: int = 0
    next_seq: int = 0
    seq_errors: int = 0
    rows_rejected: int = 0  # rows dropped for a non-finite or negative priority
    done_meta: dict | None = None  # the actor's own account, from its actor_done
    closed: bool = False
    frames: object = None  # frame layout: the FrameStream of this connection
    credits: int = 0  # granted and not yet used (rate limiting only)
    granted: int = 0  # credits ever granted: ties go to the actor given the fewest
    unsent_credits: int = 0  # granted, not yet told to the actor
    credit_ready: asyncio.Event = field(default_factory=asyncio.Event)

    def stats(self) -> dict:
        return {
            "batches": self.batches,
            "transitions": self.transitions,
            "next_seq": self.next_seq,
            "seq_errors": self.seq_errors,
            "rows_rejected": self.rows_rejected,
            "finished": self.done_meta is not None,
        }


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
    priorities_rejected: int = 0  # non-finite or negative priorities, not applied
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
        self.actor_links: list[ActorLink] = []
        self.learners: dict[str, LearnerLink] = {}
        self.limiter: SampleToInsertRatio | None = None
        if a.samples_per_insert is not None and not self.synchronous:
            self.limiter = SampleToInsertRatio(
                a.samples_per_insert,
                self.threshold,
                a.batch_size,
                a.sample_batch_size * self.cfg.env.num_envs,
                a.samples_per_insert_tolerance,
            )
        self.sample_blocked_s = 0.0
        self.snapshots = ReplaySnapshots(snapshot_path(self.run_dir, self.name), self.log)
        self.changed = Pulse()
        self.inserted = 0
        self.sampled = 0
        self.rounds: Rounds | None = None  # sync mode
        self.fragments: FragmentHub | None = None  # trajectory queue (IMPALA)
        self.finished_actors: set[int] = set()  # sync mode: actors that can send nothing more here
        self.attached: dict[str, tuple[Connection, str]] = {}  # name -> (connection, session)
        self.peers_refused: collections.Counter[str] = collections.Counter()  # by reason
        self.rows_rejected = 0
        self.bad_messages = 0  # connections closed for a message that broke the protocol
        self._log_peer = RateLimitedLog(self.log, logging.WARNING, burst=10, per_s=0.5)

    def advertised_address(self):
        return (self.cfg.cluster.advertise_host or self.coordinator_address()[0], self.server.port)

    def metrics(self) -> dict:
        server = self.server.stats if self.server is not None else {}
        frames = {"replay_frames": len(self.replay.pool)} if isinstance(self.replay, FrameReplayBuffer) else {}
        queue = self.fragments.metrics() if self.fragments is not None else {}
        return {
            **frames,
            **queue,
            "replay_size": len(self.replay) if self.replay is not None else 0,
            "replay_capacity": self.capacity if self.replay is not None else 0,  # sync: no replay
            "inserted": self.inserted,
            "sampled": self.sampled,
            "actor_connections": sum(not link.closed for link in self.actor_links),
            "learner_credits": sum(link.credits for link in self.learners.values()),
            "sample_blocked_s": round(self.sample_blocked_s, 3),
            "peers_refused": sum(self.peers_refused.values()),
            "rows_rejected": self.rows_rejected,
            "bad_messages": self.bad_messages,
            "connections_refused_busy": server.get("refused_busy", 0),
            "handshakes_failed": server.get("handshake_failures", 0),
        }

    async def _run(self) -> int:
        algo = self.algorithm()
        spec = algo.transition_spec()
        layout = frame_layout(self.cfg, algo)
        # Frame layout: a batch's rows carry frame ids; its frames travel beside them.
        self.rows = RowSpec(layout.wire_spec(spec) if layout is not None else spec)
        a, c = self.cfg.agent, self.cfg.cluster
        queue = algo.fragment_queue(self.cfg)
        if self.synchronous:
            self.rounds = Rounds(
                spec, self.index, c.memories, c.actors, c.learners, algo.work_items(self.cfg), self.log
            )
        elif queue is not None:
            self.fragments = FragmentHub(spec, a.sample_batch_size, self.cfg.env.num_envs, queue, layout, c.actors)
            self.limiter = self.fragments.room  # actor credits as the queue's room allows
        elif layout is not None:
            self.replay = FrameReplayBuffer(
                self.capacity,
                spec,
                layout,
                alpha=a.prioritized_replay_alpha if a.prioritized_replay else None,
                eps=a.prioritized_replay_eps,
                seed=self.cfg.run.seed + 1000 + self.index,
                max_streams=c.actors,
            )
        elif a.prioritized_replay:
            self.replay = PrioritizedReplayBuffer(
                self.capacity,
                spec,
                alpha=a.prioritized_replay_alpha,
                eps=a.prioritized_replay_eps,
                seed=self.cfg.run.seed + 1000 + self.index,
            )
        else:
            self.replay = ReplayBuffer(self.capacity, spec, seed=self.cfg.run.seed + 1000 + self.index)
        if self.replay is not None:
            restored = self.snapshots.restore(self.replay)
            if restored and self.limiter is not None:
                self.limiter.restore(restored)
        bind = c.advertise_host or self.coordinator_address()[0]
        # Actors and learners, and room for restarted ones whose old connection lingers.
        self.server = await serve(
            self._on_connection,
            host=bind,
            port=0,
            token=self.token,
            name=self.name,
            ssl=self.ssl_server,
            limits=frame_limits.UNKNOWN_PEER,
            max_connections=2 * (c.actors + c.learners) + 4,
            backlog=listen_backlog(c.actors + c.learners),
            max_handshakes=c.max_handshakes,
            max_handshakes_per_host=c.max_handshakes_per_host,
        )
        if self.fragments is not None:
            self.log.info(
                "serving a trajectory queue on %s:%s (%d fragments of %d steps, when full: %s)",
                bind,
                self.server.port,
                queue.capacity,
                a.sample_batch_size,
                queue.full,
            )
        else:
            self.log.info("serving replay on %s:%s (capacity %d)", bind, self.server.port, self.capacity)
        return await super()._run()

    def _set_phase(self, phase: Phase) -> None:
        super()._set_phase(phase)
        self.changed.fire()

    def _on_signal(self, sig: int) -> None:
        if self.local_coordinator is not None and self._signals == 0:
            self._signals += 1
            self.local_coordinator.interrupt(signal.Signals(sig).name, self.name)
            return
        super()._on_signal(sig)

    async def cleanup(self) -> None:
        if self.server is not None:
            await self.server.close()

    # ------------------------------------------------------------------ connections

    async def _on_connection(self, conn: Connection) -> None:
        try:
            attached = await self._attach(conn)
            if attached is None:
                return
            kind, index = attached
            if kind == "actor":
                await self._serve_actor(conn, index)
            else:
                await self._serve_learner(conn, index)
        except (ConnectionClosed, asyncio.CancelledError):
            raise
        except Exception as exc:  # not the peer's fault: a bug of ours ends the memory host loudly
            self.fatal(exc, f"serving {conn.peer_name}")

    def _refuse(self, conn: Connection, code: str, reason: str) -> None:
        self.peers_refused[code] += 1
        self._log_peer("refused %s from %s: %s", conn.peer_name, conn.peer, reason)

    async def _attach(self, conn: Connection) -> tuple[str, int] | None:
        """Check that the peer is a registered actor or learner of this run, attached once."""
        c = self.cfg.cluster
        name = conn.peer_name  # validated by the handshake: safe to log
        try:
            async with asyncio.timeout(c.coordinator_timeout_s):
                msg = await conn.recv()
            session = check(msg.kind, msg.meta, {"attach"})["session"]
            if msg.request_id is None:
                raise BadMessage("attach must be a request")
        except (TimeoutError, ConnectionClosed, BadMessage) as exc:
            self._refuse(conn, "no_attach", f"no valid attach: {exc or 'timed out'}")
            return None
        try:
            kind, index = parse_role_name(name)
        except ValueError:
            kind, index = "", -1
        code = reason = None
        if kind not in ("actor", "learner") or index >= (c.actors if kind == "actor" else c.learners):
            code, reason = "unknown", f"{name} is not an actor or learner of this run"
        else:
            reason = await self._check_session(name, session)
            code = "session"
            held = self.attached.get(name)
            if reason is None and held is not None and not held[0].closed:
                if hmac.compare_digest(held[1], session):
                    code, reason = "duplicate", f"{name} is already attached (a second connection, same registration)"
                else:  # a newer registration (a restarted role): its predecessor is gone
                    self.log.warning("%s registered again: dropping its previous connection (%s)", name, held[0].peer)
                    held[0].abort()
        if reason is not None:
            self._refuse(conn, code, reason)
            try:
                await conn.reply_error(msg, f"refused: {reason}")
            except ConnectionClosed:
                pass
            return None
        self.attached[name] = (conn, session)
        conn.set_limits(
            frame_limits.actor_to_memory(self.cfg, self.algorithm())
            if kind == "actor"
            else frame_limits.learner_to_memory(self.cfg, self.algorithm())
        )
        await conn.reply(msg)
        return kind, index

    async def _check_session(self, name: str, session: str) -> str | None:
        """None when `session` is `name`'s live registration, else why not (asks the coordinator)."""
        if self.local_coordinator is not None:
            return self.local_coordinator.check_session(name, session)
        reply = await self._request_or_lost("check_session", {"role": name, "session": session})
        return None if reply.meta.get("ok") is True else str(reply.meta.get("reason", "refused"))

    async def _read(self, conn: Connection, name: str, done_kind: str, allowed: set[str], handle) -> dict | None:
        """Feed each checked message to `handle` until the peer's `done_kind` message, whose
        fields are returned; None when the connection ended first or sent something bad (logged)."""
        try:
            async for msg in conn:
                fields = check(msg.kind, msg.meta, allowed | {done_kind})
                if msg.kind == done_kind:
                    return fields
                handle(msg, fields)
        except ConnectionClosed:
            pass
        except BadMessage as exc:
            self.bad_messages += 1
            self.log.error("closing connection of %s: bad message: %s", name, exc)
            conn.abort()
        return None

    async def _serve_actor(self, conn: Connection, index: int) -> None:
        link = ActorLink(conn.peer_name, conn)
        self.actor_links.append(link)
        if isinstance(self.replay, FrameReplayBuffer):
            link.frames = self.replay.stream()  # frame ids start over with every connection
        elif self.fragments is not None:
            link.frames = self.fragments.stream()

        def handle(msg, fields) -> None:
            if msg.kind == "batch":
                self._ingest(link, msg, fields)
            elif msg.kind == "fragment":
                self._ingest_fragment(link, index, msg, fields)
            else:
                self._ingest_rollout(link, index, msg, fields)

        allowed = {"rollout"} if self.synchronous else {"fragment"} if self.fragments is not None else {"batch"}
        sender = self.spawn(self._send_credits(link), f"credits for {link.name}") if self.limiter else None
        self._grant_actor_credits()
        try:
            link.done_meta = await self._read(conn, link.name, "actor_done", allowed, handle)
        finally:
            link.closed = True
            if link.frames is not None:
                link.frames.release()
                link.frames = None
            if sender is not None:
                sender.cancel()
                await asyncio.gather(sender, return_exceptions=True)
            if self.limiter is not None and link.credits:
                self.limiter.release(link.credits)
                link.credits = 0
                self._grant_actor_credits()  # what it held back may go to the others
            if link.done_meta is None:
                self.log.warning("%s went away without finishing (%d batches received)", link.name, link.batches)
            if self.synchronous:
                self._actor_finished(index)
            self.changed.fire()

    def _ingest(self, link: ActorLink, msg, fields: dict) -> None:
        seq = fields["seq"]
        if seq != link.next_seq:
            link.seq_errors += 1
            self.log.error("%s batch seq %d, expected %d", link.name, seq, link.next_seq)
        link.next_seq = seq + 1
        arrays = dict(msg.arrays)
        priorities = arrays.pop("priorities", None)
        frames = {k: arrays.pop(k) for k in ("frames", "frames_lz4", "frame_ids") if k in arrays}
        n = self.rows.rows("batch", arrays)
        if priorities is not None and (priorities.dtype != np.float64 or priorities.shape != (n,)):
            raise BadMessage(f"batch.priorities is {priorities.dtype}{list(priorities.shape)}, expected float64[{n}]")
        if link.frames is not None:
            self._add_frames(link, {**arrays, **frames}, priorities, n, fields)
        elif frames:
            raise BadMessage(f"batch carries {sorted(frames)}, but this run does not use the frame layout")
        elif isinstance(self.replay, PrioritizedReplayBuffer):
            n = self._add_prioritized(link, arrays, priorities, n)
        else:
            self.replay.add(arrays)
        link.batches += 1
        link.transitions += n
        self.inserted += n
        if self.limiter is not None:
            with_credit = link.credits > 0  # an actor's last batch, in STOPPING, comes without one
            link.credits -= with_credit
            self.limiter.inserted_rows(n, with_credit)
            self._grant_actor_credits()
        self.changed.fire()

    # ------------------------------------------------------------------ trajectory queue

    def _ingest_fragment(self, link: ActorLink, actor_index: int, msg, fields: dict) -> None:
        """One fragment per env, sent against a credit (the queue's room is counted in credits)."""
        if link.credits < 1:
            raise BadMessage(f"{link.name} sent a fragment message without a credit")
        seq = fields["seq"]
        if seq != link.next_seq:
            link.seq_errors += 1
            self.log.error("%s fragment message seq %d, expected %d", link.name, seq, link.next_seq)
        link.next_seq = seq + 1
        try:
            self.fragments.ingest(
                actor_index,
                fields["weights_version"],
                dict(msg.arrays),
                stream=link.frames,
                keep_from=fields.get("keep_from"),
            )
        except ValueError as exc:
            raise BadMessage(f"{link.name}: {exc}") from None
        n = self.fragments.num_envs * self.fragments.queue.steps
        link.batches += 1
        link.transitions += n
        self.inserted += n
        link.credits -= 1
        self.limiter.inserted_rows(n, with_credit=True)
        self._grant_actor_credits()
        self.changed.fire()

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
            self.limiter.sampled_rows(rows)
            link.batches_sent += 1
            self._grant_actor_credits()  # room in the queue: actors' credits may go out
            self.changed.fire()
            try:
                await conn.send("samples", {"memory": self.index, **meta}, batch)
            except ConnectionClosed:
                return  # the learner went away; its connection handler reports it
        await self._send_end(conn, link)

    def _grant_actor_credits(self) -> None:
        """Top every open actor connection up to ACTOR_CREDITS batches, while the ratio allows;
        the neediest first, then the least served, so no actor is starved by a faster one."""
        if self.limiter is None or self.phase > Phase.RUNNING:
            return
        while True:
            open_links = [link for link in self.actor_links if not link.closed and link.credits < ACTOR_CREDITS]
            if not open_links or not self.limiter.can_grant():
                return
            link = min(open_links, key=lambda l: (l.credits, l.granted))
            link.credits += 1
            link.granted += 1
            link.unsent_credits += 1
            link.credit_ready.set()
            self.limiter.grant()

    async def _send_credits(self, link: ActorLink) -> None:
        """Tell an actor of the credits granted to it (several per message when they pile up)."""
        try:
            while True:
                await link.credit_ready.wait()
                link.credit_ready.clear()
                n, link.unsent_credits = link.unsent_credits, 0
                await link.conn.send("credit", {"n": n})
        except ConnectionClosed:
            pass  # its reader sees the close

    def _add_prioritized(self, link: ActorLink, arrays: dict, priorities, n: int) -> int:
        """Add rows; rows with a non-finite or negative priority are dropped and counted
        (one bad row must not cost the actor its connection). Returns the rows added."""
        try:
            self.replay.add(arrays, priorities)  # refuses the whole batch if a priority is bad
            return n
        except ValueError:
            good = None if priorities is None else np.isfinite(priorities) & (priorities >= 0)
            if good is None or good.all():
                raise  # not the priorities: a bug of ours
        bad = int(n - good.sum())
        link.rows_rejected += bad
        self.rows_rejected += bad
        self._log_peer("%s: dropped %d of %d rows with a non-finite or negative priority", link.name, bad, n)
        self.replay.add({k: v[good] for k, v in arrays.items()}, priorities[good])
        return n - bad

    def _add_frames(self, link: ActorLink, arrays: dict, priorities, n: int, fields: dict) -> None:
        """Frame layout: every row stays (later messages of the stream lean on this one's
        frames); a row with a non-finite or negative priority is stored at priority 0."""
        if "keep_from" not in fields:
            raise BadMessage("batch without its 'keep_from' field (the frame layout needs it)")
        if priorities is not None:
            good = np.isfinite(priorities) & (priorities >= 0)
            if not good.all():
                bad = int(n - good.sum())
                link.rows_rejected += bad
                self.rows_rejected += bad
                self._log_peer(
                    "%s: %d of %d rows with a non-finite or negative priority kept at priority 0", link.name, bad, n
                )
                priorities = np.where(good, priorities, 0.0)
        try:  # nothing is stored if any part of the message is invalid
            self.replay.add(arrays, priorities, stream=link.frames, keep_from=fields["keep_from"])
        except ValueError as exc:
            raise BadMessage(str(exc)) from None

    # ------------------------------------------------------------------ sync aggregation

    def _ingest_rollout(self, link: ActorLink, actor_index: int, msg, fields: dict) -> None:
        n = self.rows.rows("rollout", msg.arrays)
        try:
            outcome = self.rounds.add(actor_index, fields, dict(msg.arrays))
        except ValueError as exc:
            raise BadMessage(f"{link.name}: {exc}") from None
        if outcome != "added":
            self.log.debug("%s: ignored a %s part (%r)", link.name, outcome, fields)
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
        kind, index = parse_role_name(name)  # checked as a name; the coordinator only sends role names
        if kind != "actor" or not 0 <= index < self.cfg.cluster.actors:
            return
        for link in self.actor_links:
            if link.name == name and not link.closed:
                link.conn.abort()  # its reader ends and finishes the actor
        if self.synchronous:
            self._actor_finished(index)

    # ------------------------------------------------------------------ learners

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
        limit = self.cfg.cluster.learner_credits
        if link.credits + credits > limit:
            raise BadMessage(
                f"{link.name} holds {link.credits} credits and asks for {credits} more, "
                f"over cluster.learner_credits ({limit})"
            )
        link.credits += credits
        link.beta = fields.get("beta", link.beta)
        if "iteration" in fields:
            link.iteration = fields["iteration"]
        if self.fragments is not None and "version" in fields:
            self.fragments.saw_version(fields["version"])
            self._grant_actor_credits()  # fragments dropped for their lag leave room
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
        return self.limiter is None or self.limiter.can_sample(len(self.replay))

    async def _sampler(self, conn: Connection, link: LearnerLink) -> None:
        """Send one batch per credit while RUNNING or STOPPING, then ``end``."""
        if self.fragments is not None:
            return await self._fragment_sampler(conn, link)
        batch_size = self.cfg.agent.batch_size
        draining = lambda: self.phase >= Phase.DRAINING  # noqa: E731
        while True:
            ready = lambda: link.credits > 0 and len(self.replay) >= self.threshold  # noqa: E731
            limited = ready() and not self._within_rate()
            t0 = time.perf_counter()
            await self.changed.wait_for(lambda: draining() or (ready() and self._within_rate()))
            if limited:  # the learner asked and the data was there: the ratio held it back
                self.sample_blocked_s += time.perf_counter() - t0
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
            if self.limiter is not None:
                self.limiter.sampled_rows(rows)
                self._grant_actor_credits()
            link.batches_sent += 1
            try:
                await conn.send("samples", {"memory": self.index}, batch)
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

    # ------------------------------------------------------------------ main

    def _actor_stats(self) -> dict:
        """Per actor: totals over its connections, the last one's sequence state, and each connection."""
        by_name: dict[str, list[ActorLink]] = {}
        for link in self.actor_links:
            by_name.setdefault(link.name, []).append(link)
        return {
            name: {
                "batches": sum(l.batches for l in links),
                "transitions": sum(l.transitions for l in links),
                "next_seq": links[-1].next_seq,
                "seq_errors": sum(l.seq_errors for l in links),
                "rows_rejected": sum(l.rows_rejected for l in links),
                "finished": links[-1].done_meta is not None,
                "connections": [l.stats() for l in links],
            }
            for name, links in by_name.items()
        }

    # ------------------------------------------------------------------ main

    async def main(self) -> dict:
        periodic = None
        if self.cfg.run.snapshot_replay and self.replay is not None:
            periodic = self.spawn(
                self.snapshots.run_every(self.replay, self.cfg.run.snapshot_interval_s), "replay snapshots"
            )
        try:
            await self.wait_phase(Phase.CLOSING)
        finally:
            if periodic is not None:
                periodic.cancel()
                await asyncio.gather(periodic, return_exceptions=True)
        # Learners send learner_done after their last priorities; wait for every one
        # connected (or its connection closing) so no update is left unapplied.
        pending = [link.finished.wait() for link in self.learners.values()]
        try:
            async with asyncio.timeout(self.cfg.cluster.phase_timeout_s / 2):
                await asyncio.gather(*pending)
        except TimeoutError:
            late = [n for n, link in self.learners.items() if not link.finished.is_set()]
            self.log.error("learners did not finish in time: %s", ", ".join(late))
        if self.cfg.run.snapshot_replay and self.replay is not None:
            await self.snapshots.save(self.replay)
        return {
            "inserted": self.inserted,
            "sampled": self.sampled,
            "replay_size": len(self.replay) if self.replay is not None else 0,
            "replay_added": self.replay.added if self.replay is not None else 0,
            "sample_blocked_s": round(self.sample_blocked_s, 3),
            **self.snapshots.stats(),
            "queue": None if self.fragments is None else self.fragments.stats(),
            "rounds": None
            if self.rounds is None
            else {
                "completed": self.rounds.iteration,
                "duplicates": self.rounds.duplicates,
                "stale": self.rounds.stale,
                "discarded_rows": self.rounds.discarded_rows,
            },
            "actors": self._actor_stats(),
            "learners": {
                n: {
                    "batches_sent": l.batches_sent,
                    "priority_messages": l.priority_messages,
                    "priorities_applied": l.priorities_applied,
                    "priorities_stale": l.priorities_stale,
                    "beta": l.beta,
                    "priorities_rejected": l.priorities_rejected,
                    "reported": l.done_meta,
                }
                for n, l in self.learners.items()
            },
            "peers_refused": dict(self.peers_refused),
            "bad_messages": self.bad_messages,
            "connections_refused_busy": self.server.stats["refused_busy"] if self.server else 0,
        }
