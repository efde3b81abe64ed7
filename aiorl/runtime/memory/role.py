"""The memory host role: one store (`aiorl.runtime.memory.store`: replay,
the trajectory queue, or the rounds of a synchronous algorithm) that actors
fill and learners draw from on demand, both under one `FlowControl`
(`aiorl.runtime.memory.flow`). This module holds the role itself: its
server and who may attach to it, each connection handed to the store, its
phases, metrics and summary, and its snapshots' schedule.

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
import signal

from aiorl.core.ratelog import RateLimitedLog
from aiorl.runtime import frame_limits
from aiorl.runtime.first_request import first_request
from aiorl.runtime.memory.build import build_store, store_class
from aiorl.runtime.memory.flow import FlowControl
from aiorl.runtime.memory.links import ActorLink, LearnerLink, Pulse
from aiorl.runtime.memory.reading import MessageReader
from aiorl.runtime.memory.store import Store, StoreParts
from aiorl.runtime.memory.tally import Tally
from aiorl.runtime.messages import MAX_COUNT, BadMessage
from aiorl.runtime.phase import Phase, parse_role_name
from aiorl.runtime.resources import listen_backlog
from aiorl.runtime.role import Role
from aiorl.runtime.snapshot import ReplaySnapshots, snapshot_path
from aiorl.wire import Connection, ConnectionClosed, Server, serve


class MemoryRole(Role):
    kind = "memory"

    def __init__(self, *args, coordinator=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.local_coordinator = coordinator  # memory 0 hosts it
        c = self.cfg.cluster
        self.server: Server | None = None
        self.store: Store | None = None  # built in `_run`, from what the algorithm declares
        self.actor_links: list[ActorLink] = []
        self.learners: dict[str, LearnerLink] = {}
        limiter = store_class(self.cfg).limiter(self.cfg)
        self.flow = FlowControl(limiter, c.learner_credits, self.actor_links, lambda: self.phase, self.log)
        self.snapshots = ReplaySnapshots(snapshot_path(self.run_dir, self.name), self.log)
        self.changed = Pulse()
        self.attached: dict[str, tuple[Connection, str]] = {}  # name -> (connection, session)
        self.peers_refused: collections.Counter[str] = collections.Counter()  # by reason
        self._log_peer = RateLimitedLog(self.log, logging.WARNING, burst=10, per_s=0.5)
        self.tally = Tally(self._log_peer)
        self.reader = MessageReader(RateLimitedLog(self.log, logging.ERROR, burst=10, per_s=0.5))

    # The counters, as tests and callers read them on the role.
    inserted = property(lambda self: self.tally.inserted)
    sampled = property(lambda self: self.tally.sampled)
    rows_rejected = property(lambda self: self.tally.rows_rejected)
    bad_messages = property(lambda self: self.reader.bad_messages)

    def coordinator_unix_path(self) -> str | None:
        local = self.local_coordinator  # memory 0 started before the launcher knew the path
        if local is not None and local.server is not None:
            return self.transport.peer_socket(local.server.unix_path)
        return super().coordinator_unix_path()

    def advertised_address(self):
        address = (self.cfg.cluster.advertise_host or self.coordinator_address()[0], self.server.port)
        # A local run's roles connect through the socket where it exists on their host.
        return address if self.server.unix_path is None else (*address, self.server.unix_path)

    def metrics(self) -> dict:
        server = self.server.stats if self.server is not None else {}
        tally, store = self.tally, self.store
        return {
            **store.metrics(),
            **self.flow.held_metrics(),
            "replay_size": store.size(),
            "replay_capacity": store.capacity(),  # sync, queue: no replay
            "inserted": tally.inserted,
            "sampled": tally.sampled,
            "actor_connections": sum(not link.closed for link in self.actor_links),
            "learner_credits": sum(link.credits for link in self.learners.values()),
            "sample_blocked_s": round(tally.sample_blocked_s, 3),
            "peers_refused": sum(self.peers_refused.values()),
            "rows_rejected": tally.rows_rejected,
            "bad_messages": self.reader.bad_messages,
            "connections_refused_busy": server.get("refused_busy", 0),
            "handshakes_failed": server.get("handshake_failures", 0),
            "unix_connections": server.get("unix_connections", 0),
            "connections_refused_uid": server.get("refused_uid", 0),
        }

    def store_parts(self) -> StoreParts:
        """What this role shares with its store."""
        return StoreParts(
            self.index,
            self.flow,
            self.changed,
            self.tally,
            lambda: self.phase,
            self.log,
            self.actor_links,
            self._newest_version,
            self._published_version,
        )

    async def _run(self) -> int:
        self.store = build_store(self.cfg, self.algorithm(), self.store_parts())
        self.store.restore(self.snapshots)
        c = self.cfg.cluster
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
            **self.transport.server_args(self.run_dir, self.name),
        )
        if self.server.unix_path is not None:
            self.log.info("serving on unix:%s too", self.server.unix_path)
        if self.server.ring_path is not None:
            self.log.info("handing out shared-memory rings on %s", self.server.ring_path)
        self.store.announce(bind, self.server.port)
        return await super()._run()

    def _set_phase(self, phase: Phase) -> None:
        super()._set_phase(phase)
        if self.store is not None:  # a phase may come before the store is built
            self.store.on_phase(phase)
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

    async def _serve_actor(self, conn: Connection, index: int) -> None:
        link = ActorLink(conn.peer_name, conn, index=index)
        self.actor_links.append(link)
        self.store.actor_opened(link)
        sender = self.spawn(self.flow.send_credits(link), f"credits for {link.name}") if self.flow.limiter else None
        self.flow.grant_actor_credits()
        try:
            link.done_meta = await self.reader.read(
                conn,
                link.name,
                "actor_done",
                {self.store.actor_kind},
                lambda msg, fields: self.store.accept(link, msg, fields),
            )
        finally:
            link.close()
            if sender is not None:
                sender.cancel()
                await asyncio.gather(sender, return_exceptions=True)
            self.flow.actor_closed(link)
            if link.done_meta is None:
                self.log.warning("%s went away without finishing (%d batches received)", link.name, link.batches)
            self.store.actor_closed(link)
            self.changed.fire()

    async def _serve_learner(self, conn: Connection, index: int) -> None:
        link = self.learners.setdefault(conn.peer_name, LearnerLink(conn.peer_name))
        link.beta = self.cfg.agent.prioritized_replay_beta

        def handle(msg, fields) -> None:
            if msg.kind == "credit":
                self._grant(link, fields.get("n", 1), fields)
            else:
                self.store.on_priorities(link, msg)
                if fields.get("credit"):  # the batch's credit rides on its priorities
                    self._grant(link, fields["credit"], fields)

        sampler = self.spawn(self.store.serve(conn, link, index), f"sampler for {link.name}")
        try:
            allowed = set(self.store.learner_kinds)
            link.done_meta = await self.reader.read(conn, link.name, "learner_done", allowed, handle)
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
        self.store.on_credit(fields)
        self.changed.fire()

    # ------------------------------------------------------------------ the coordinator's word

    def on_role_lost(self, name: str, returns: bool = False) -> None:
        """The coordinator declared `name` lost or failed (`returns`: it has a restart left): a hung
        actor's rollouts are not waited for."""
        kind, index = parse_role_name(name)  # checked as a name; the coordinator only sends role names
        if kind != "actor" or not 0 <= index < self.cfg.cluster.actors:
            return
        for link in self.actor_links:
            if link.name == name and not link.closed:
                link.conn.abort()  # its reader ends and finishes the actor
        if self.store is not None:
            self.store.on_role_lost(index, returns)

    def on_role_back(self, name: str, iteration: int) -> None:
        """A restarted actor was admitted: its rollouts are expected again from `iteration` on."""
        kind, index = parse_role_name(name)
        if kind != "actor" or not 0 <= index < self.cfg.cluster.actors or self.store is None:
            return
        self.store.on_role_back(index, iteration)

    def _newest_version(self, known: int) -> int:
        """The newest published weights version this memory host knows of without asking
        (`known`: what its learners told it)."""
        if self.local_coordinator is not None:
            return self.local_coordinator.params.weights_version  # exact: the store is in this process
        return max(self.weights_version_seen, known)

    async def _published_version(self) -> int:
        """The coordinator's newest version: an actor may have fetched it before the heartbeat
        or a learner's credit told this memory host of it."""
        if self.local_coordinator is not None:
            return self.local_coordinator.params.weights_version
        reply = await self._request_or_lost("get_weights", {"have": MAX_COUNT})  # the version, no weights
        self.weights_version_seen = max(self.weights_version_seen, int(reply.meta.get("version", -1)))
        return self.weights_version_seen

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
        every = self.cfg.run.snapshot_interval_s
        snapshots = self.store.snapshots_every(self.snapshots, every) if self.cfg.run.snapshot_replay else None
        if snapshots is not None:
            periodic = self.spawn(snapshots, "replay snapshots")
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
        if self.cfg.run.snapshot_replay:
            await self.store.save(self.snapshots)
        return self._summary()

    def _summary(self) -> dict:
        store = self.store.summary()
        head = {k: store.pop(k) for k in ("replay_size", "replay_added", "replay_frames")}
        return {
            "inserted": self.tally.inserted,
            "sampled": self.tally.sampled,
            **head,
            "sample_blocked_s": round(self.tally.sample_blocked_s, 3),
            "limiter": {**held, "holds": dict(self.flow.holds)} if (held := self.flow.held_metrics()) else None,
            **self.snapshots.stats(),
            **store,  # queue, rounds
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
            "bad_messages": self.reader.bad_messages,
            "connections_refused_busy": self.server.stats["refused_busy"] if self.server else 0,
        }
