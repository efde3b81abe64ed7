"""The memory host role: one shard of replay (or of the trajectory queue, or
the rounds of a synchronous algorithm) that actors fill (`ActorIngest`,
`aiorl.runtime.memory.ingest`) and learners draw from on demand
(`LearnerFeed`, `aiorl.runtime.memory.feed`), both under one `FlowControl`
(`aiorl.runtime.memory.flow`). This module holds the role itself: its store,
its server and who may attach to it, its phases, metrics and summary.

Only roles the coordinator registered for this run attach, once per live
registration: a peer's first message is ``attach`` with the session id its
registration got, which the coordinator confirms. A name this run does not
have, a session that is not that name's current one, or a second connection
of the same registration is refused (logged at a bounded rate, counted in
``peers_refused``); a newer registration of a name (a restarted role)
replaces the older one's connection. Every message is checked
(`aiorl.runtime.messages`); a bad one closes that connection only.
"""

from __future__ import annotations

import asyncio
import collections
import hmac
import logging
import math
import signal

from aiorl.core.ratelog import RateLimitedLog
from aiorl.replay import PrioritizedReplayBuffer, ReplayBuffer
from aiorl.replay.frames import FrameReplayBuffer, frame_layout
from aiorl.runtime import frame_limits, local_sockets
from aiorl.runtime.first_request import first_request
from aiorl.runtime.fragments import FragmentHub
from aiorl.runtime.memory.feed import LearnerFeed
from aiorl.runtime.memory.flow import FlowControl
from aiorl.runtime.memory.ingest import ActorIngest
from aiorl.runtime.memory.links import ActorLink, LearnerLink, Pulse
from aiorl.runtime.messages import BadMessage, RowSpec, check
from aiorl.runtime.phase import Phase, parse_role_name
from aiorl.runtime.ratelimit import SampleToInsertRatio
from aiorl.runtime.resources import listen_backlog
from aiorl.runtime.role import Role
from aiorl.runtime.rounds import Rounds
from aiorl.runtime.snapshot import ReplaySnapshots, snapshot_path
from aiorl.wire import Connection, ConnectionClosed, Server, serve, shm


class MemoryRole(ActorIngest, LearnerFeed, Role):
    kind = "memory"

    def __init__(self, *args, coordinator=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.local_coordinator = coordinator  # memory 0 hosts it
        a, c = self.cfg.agent, self.cfg.cluster
        self.synchronous = self.cfg.algorithm.is_synchronous(self.cfg)
        self.capacity = a.buffer_size // c.memories
        self.threshold = max(1, math.ceil(a.learning_starts / c.memories))
        self.server: Server | None = None
        self.replay = None
        self.actor_links: list[ActorLink] = []
        self.learners: dict[str, LearnerLink] = {}
        limiter: SampleToInsertRatio | None = None
        if a.samples_per_insert is not None and not self.synchronous:
            limiter = SampleToInsertRatio(
                a.samples_per_insert,
                self.threshold,
                a.batch_size,
                a.sample_batch_size * self.cfg.env.num_envs,
                a.samples_per_insert_tolerance,
                actors=c.actors,  # every actor spreads its batches over every memory
                actor_credits=c.actor_credits,
                learner_credits=c.learners * c.learner_credits,
            )
        self.flow = FlowControl(limiter, c.learner_credits, self.actor_links, lambda: self.phase, self.log)
        self.sample_blocked_s = 0.0
        self.snapshots = ReplaySnapshots(snapshot_path(self.run_dir, self.name), self.log)
        self.changed = Pulse()
        self.inserted = 0
        self.sampled = 0
        self.rounds: Rounds | None = None  # sync mode
        self.fragments: FragmentHub | None = None  # trajectory queue (IMPALA)
        self.finished_actors: set[int] = set()  # sync mode: actors that can send nothing more here
        self.away_actors: set[int] = set()  # sync mode: actors whose connection ended; they may come back
        self.attached: dict[str, tuple[Connection, str]] = {}  # name -> (connection, session)
        self.peers_refused: collections.Counter[str] = collections.Counter()  # by reason
        self.rows_rejected = 0
        self.bad_messages = 0  # connections closed for a message that broke the protocol
        self._log_peer = RateLimitedLog(self.log, logging.WARNING, burst=10, per_s=0.5)
        # Bad input from a peer that authenticated: every one is counted, the lines are bounded.
        self._log_bad = RateLimitedLog(self.log, logging.ERROR, burst=10, per_s=0.5)

    def coordinator_unix_path(self) -> str | None:
        local = self.local_coordinator  # memory 0 started before the launcher knew the path
        if local is not None and local.server is not None:
            return local_sockets.usable(local.server.unix_path)
        return super().coordinator_unix_path()

    def advertised_address(self):
        address = (self.cfg.cluster.advertise_host or self.coordinator_address()[0], self.server.port)
        # A local run's roles connect through the socket where it exists on their host.
        return address if self.server.unix_path is None else (*address, self.server.unix_path)

    def metrics(self) -> dict:
        server = self.server.stats if self.server is not None else {}
        frames = {"replay_frames": len(self.replay.pool)} if isinstance(self.replay, FrameReplayBuffer) else {}
        queue = self.fragments.metrics() if self.fragments is not None else {}
        return {
            **frames,
            **queue,
            **self.flow.held_metrics(),
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
            "unix_connections": server.get("unix_connections", 0),
            "connections_refused_uid": server.get("refused_uid", 0),
        }

    async def _run(self) -> int:
        algo = self.algorithm()
        spec = algo.transition_spec()
        layout = frame_layout(self.cfg, algo)
        # Frame layout: a batch's rows carry frame ids; its frames travel beside them. A fragment's
        # own fields are held to the same values (a NaN state is as bad as a NaN reward).
        per_fragment = algo.per_fragment_spec()
        wire = layout.wire_spec(spec) if layout is not None else spec
        self.rows = RowSpec({**wire, **per_fragment}, bounds=algo.value_bounds())
        a, c = self.cfg.agent, self.cfg.cluster
        queue = algo.fragment_queue(self.cfg)
        if self.synchronous:
            self.rounds = Rounds(
                spec, self.index, c.memories, c.actors, c.learners, algo.work_items(self.cfg), self.log
            )
        elif queue is not None:
            self.fragments = FragmentHub(
                spec,
                a.sample_batch_size,
                self.cfg.env.num_envs,
                queue,
                layout,
                c.actors,
                c.actor_credits,
                per_fragment=per_fragment,
            )
            self.flow.limiter = self.fragments.room  # actor credits as the queue's room allows
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
            if restored:
                self.flow.restored(restored)
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
            first_bytes_timeout_s=c.first_bytes_timeout_s,
            unix_path=local_sockets.socket_path(self.run_dir, self.name),
            rings=local_sockets.ring_bytes() is not None,
            ring_bytes=local_sockets.ring_bytes() or shm.DEFAULT_RING_BYTES,
        )
        if self.server.unix_path is not None:
            self.log.info("serving on unix:%s too", self.server.unix_path)
        if self.server.ring_path is not None:
            self.log.info("handing out shared-memory rings on %s", self.server.ring_path)
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
        if self.synchronous and phase >= Phase.STOPPING:
            self.actors_stopped()
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
            msg, fields = await first_request(conn, c.coordinator_timeout_s, {"attach"})
            session = fields["session"]
        except (TimeoutError, ConnectionClosed, BadMessage) as exc:
            self._refuse(conn, "no_attach", f"no valid attach: {exc or 'closed'}")
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
        fields are returned; None when the connection ended first or sent something bad (logged).
        What `handle` returns, if anything, is awaited before the next message is read."""
        try:
            async for msg in conn:
                fields = check(msg.kind, msg.meta, allowed | {done_kind})
                if msg.kind == done_kind:
                    return fields
                pending = handle(msg, fields)
                if pending is not None:
                    await pending
        except ConnectionClosed:
            pass
        except BadMessage as exc:
            self.bad_messages += 1
            self._log_bad("closing connection of %s: bad message: %s", name, exc)
            conn.abort()
        return None

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
            # Frame layout: frames stored at the end, each once however many rows reference it.
            "replay_frames": len(self.replay.pool) if isinstance(self.replay, FrameReplayBuffer) else None,
            "sample_blocked_s": round(self.sample_blocked_s, 3),
            "limiter": {**held, "holds": dict(self.flow.holds)} if (held := self.flow.held_metrics()) else None,
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
