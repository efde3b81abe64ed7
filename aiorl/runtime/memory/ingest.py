"""The actor side of the memory host: each actor connection's batches into
replay, its fragments into the trajectory queue (IMPALA), its rollouts into
the rounds (synchronous algorithms), and its account.

Each actor connection is accounted on its own (batches, transitions, a
sequence number from 0): a restarted actor's new connection starts again at
0, and every transition accepted is counted in exactly one of them.

Rows that would crash a learner or quietly corrupt its update are dropped and
counted (``rows_rejected``), the rest of the message is kept and the
connection stays open: a value out of range or not finite
(`aiorl.runtime.messages.RowSpec.bad_rows`: Discrete actions, ES noise
indices, every float), a non-finite or negative priority (in the frame layout
such rows are kept at priority 0), every fragment of a message acted with a
weights version not yet published. A message whose shape breaks the protocol
closes the connection instead.

IMPALA's memories keep a bounded FIFO of whole fragments instead
(`aiorl.runtime.fragments.FragmentHub`): actors send against credits this
memory gives them (`aiorl.runtime.memory.flow`).

For synchronous algorithms the memory gathers rounds (`aiorl.runtime.rounds`):
exactly one rollout per iteration from each live actor assigned to it (actor
i goes to memory i % memories), or every work item assigned to it.
"""

from __future__ import annotations

import asyncio

import numpy as np

from aiorl.replay import PrioritizedReplayBuffer
from aiorl.replay.frames import FrameReplayBuffer
from aiorl.runtime.memory.links import ActorLink
from aiorl.runtime.messages import MAX_COUNT, BadMessage
from aiorl.runtime.phase import Phase, parse_role_name
from aiorl.wire import Connection


def values_why(fields: list[str]) -> str:
    # Named: an env whose observations are legitimately infinite shows up here, not as a mystery.
    return f"with a value out of range or not finite (in {', '.join(fields)})"


class ActorIngest:
    """`MemoryRole`'s actor side, a mixin: it stores into the role's replay, queue or rounds and
    counts on the role (`inserted`, `rows_rejected`), under the role's `flow` of credits."""

    async def _serve_actor(self, conn: Connection, index: int) -> None:
        link = ActorLink(conn.peer_name, conn)
        self.actor_links.append(link)
        if self.synchronous and self.rounds.work_items is not None:
            # Work items (ES) need no iteration to rejoin at, so the coordinator sends no role_back:
            # an actor that connects again is back here. Left away, the stop counted it as gone and
            # closed the last round under the parts its new process still had in flight, which
            # were then refused as bad messages and failed the run.
            self.away_actors.discard(index)
        if isinstance(self.replay, FrameReplayBuffer):
            link.frames = self.replay.stream()  # frame ids start over with every connection
        elif self.fragments is not None:
            link.frames = self.fragments.stream()

        def handle(msg, fields):
            if msg.kind == "batch":
                self._ingest(link, msg, fields)
            elif msg.kind == "fragment":
                return self._ingest_fragment(link, index, msg, fields)
            else:
                self._ingest_rollout(link, index, msg, fields)

        allowed = {"rollout"} if self.synchronous else {"fragment"} if self.fragments is not None else {"batch"}
        sender = self.spawn(self.flow.send_credits(link), f"credits for {link.name}") if self.flow.limiter else None
        self.flow.grant_actor_credits()
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
            self.flow.actor_closed(link)
            if link.done_meta is None:
                self.log.warning("%s went away without finishing (%d batches received)", link.name, link.batches)
            if self.synchronous:
                if link.done_meta is not None:
                    self._actor_finished(index)
                elif not any(other.name == link.name and not other.closed for other in self.actor_links):
                    self._actor_away(index)
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
        keep = self._good_values(link, arrays, n)
        if keep is not None:
            arrays = {k: v[keep] for k, v in arrays.items()}
            priorities = None if priorities is None else priorities[keep]
            n = int(keep.sum())
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
        self.flow.inserted(link, n)
        self.changed.fire()

    async def _ingest_fragment(self, link: ActorLink, actor_index: int, msg, fields: dict) -> None:
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
            rejected, fields = self.fragments.ingest(
                actor_index,
                version,
                dict(msg.arrays),
                stream=link.frames,
                keep_from=fields.get("keep_from"),
                values=self.rows,
                drop_all=unpublished,
            )
        except ValueError as exc:
            raise BadMessage(f"{link.name}: {exc}") from None
        steps = self.fragments.queue.steps
        n = self.fragments.num_envs * steps
        if rejected:
            why = f"acted with weights version {version}, not yet published" if unpublished else values_why(fields)
            self._reject(link, rejected * steps, n, "dropped", why)
            n -= rejected * steps
        link.batches += 1
        link.transitions += n
        self.inserted += n
        self.flow.inserted(link, n)  # with the credit checked above
        self.changed.fire()

    def _newest_version(self) -> int:
        """The newest published weights version this memory host knows of without asking."""
        if self.local_coordinator is not None:
            return self.local_coordinator.params.weights_version  # exact: the store is in this process
        return max(self.weights_version_seen, self.fragments.known_version)

    async def _published_version(self) -> int:
        """The coordinator's newest version: an actor may have fetched it before the heartbeat
        or a learner's credit told this memory host of it."""
        if self.local_coordinator is not None:
            return self.local_coordinator.params.weights_version
        reply = await self._request_or_lost("get_weights", {"have": MAX_COUNT})  # the version, no weights
        self.weights_version_seen = max(self.weights_version_seen, int(reply.meta.get("version", -1)))
        return self.weights_version_seen

    def _good_values(self, link: ActorLink, arrays: dict, n: int) -> np.ndarray | None:
        """The mask of `arrays`' rows to keep, the others rejected; None: every row is good."""
        found = self.rows.bad_rows(arrays)
        if found is None:
            return None
        bad, fields = found
        self._reject(link, int(bad.sum()), n, "dropped", values_why(fields))
        return ~bad

    def _reject(self, link: ActorLink, bad: int, n: int, done: str, why: str) -> None:
        """Rows a learner must not get: counted every time, logged at a bounded rate."""
        link.rows_rejected += bad
        self.rows_rejected += bad
        self._log_peer("%s: %s %d of %d rows %s", link.name, done, bad, n, why)

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
        self._reject(link, bad, n, "dropped", "with a non-finite or negative priority")
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
                self._reject(link, bad, n, "kept", "with a non-finite or negative priority at priority 0")
                priorities = np.where(good, priorities, 0.0)
        try:  # nothing is stored if any part of the message is invalid
            self.replay.add(arrays, priorities, stream=link.frames, keep_from=fields["keep_from"])
        except ValueError as exc:
            raise BadMessage(str(exc)) from None

    def _ingest_rollout(self, link: ActorLink, actor_index: int, msg, fields: dict) -> None:
        arrays = dict(msg.arrays)
        n = self.rows.rows("rollout", arrays)
        keep = self._good_values(link, arrays, n)
        if keep is not None:  # the part still counts as delivered: its round does not wait for it
            arrays = {k: v[keep] for k, v in arrays.items()}
            n = int(keep.sum())
        try:
            outcome = self.rounds.add(actor_index, fields, arrays)
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
        """Actor `actor_index` will send nothing more here (done, given up, or away when the run stopped)."""
        self.away_actors.discard(actor_index)
        if actor_index in self.finished_actors:
            return
        self.finished_actors.add(actor_index)
        self.rounds.actor_gone(actor_index)
        if len(self.finished_actors) == self.cfg.cluster.actors:
            self.rounds.finalize()
        self.changed.fire()

    def _actor_away(self, actor_index: int) -> None:
        """Actor `actor_index`'s connection ended before it finished: the open round goes on without
        it; it may come back (a restart), so the end does not come for it yet."""
        if actor_index in self.finished_actors:
            return
        if self.phase >= Phase.STOPPING:  # no restart is admitted any more: it is gone
            self._actor_finished(actor_index)
            return
        self.away_actors.add(actor_index)
        self.rounds.drop_actor(actor_index)
        self.changed.fire()

    def actors_stopped(self) -> None:
        """The run is stopping: an actor still away will not come back."""
        for actor_index in sorted(self.away_actors):
            self._actor_finished(actor_index)

    def on_role_lost(self, name: str, returns: bool = False) -> None:
        """The coordinator declared `name` lost or failed (`returns`: it has a restart left): a hung
        actor's rollouts are not waited for."""
        kind, index = parse_role_name(name)  # checked as a name; the coordinator only sends role names
        if kind != "actor" or not 0 <= index < self.cfg.cluster.actors:
            return
        for link in self.actor_links:
            if link.name == name and not link.closed:
                link.conn.abort()  # its reader ends and finishes the actor
        if self.synchronous:
            if returns:
                self._actor_away(index)
            else:
                self._actor_finished(index)

    def on_role_back(self, name: str, iteration: int) -> None:
        """A restarted actor was admitted: its rollouts are expected again from `iteration` on."""
        kind, index = parse_role_name(name)
        if kind != "actor" or not 0 <= index < self.cfg.cluster.actors or not self.synchronous:
            return
        if index in self.away_actors:
            self.away_actors.discard(index)
            self.rounds.rejoin(index, iteration)
            self.changed.fire()

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
