"""The rounds of a synchronous algorithm (`RoundsStore`, DPPO and ES;
`aiorl.runtime.rounds`): exactly one rollout per iteration from each live
actor assigned to this memory (actor i goes to memory i % memories), or every
work item assigned to it; each learner gets its share of round k when it asks
for iteration k.

An actor that finished (done, given up, or away when the run stopped) sends
nothing more: its part of every later round is not waited for. One whose
connection ended may come back (a restart): the open round goes on without
it, and it rejoins at the iteration the coordinator names.
"""

from __future__ import annotations

from aiorl.runtime.memory.links import ActorLink, LearnerLink
from aiorl.runtime.memory.replay_store import shard_capacity
from aiorl.runtime.memory.store import Store, StoreParts, send_end
from aiorl.runtime.messages import BadMessage, RowSpec
from aiorl.runtime.phase import Phase
from aiorl.runtime.rounds import Rounds
from aiorl.wire import Connection, ConnectionClosed


class RoundsStore(Store):
    actor_kind = "rollout"

    def __init__(self, parts: StoreParts, rounds: Rounds, rows: RowSpec, *, actors: int, shard_capacity: int):
        super().__init__(parts)
        self.rounds = rounds
        self.rows = rows
        self.actors = actors  # cluster.actors: when every one finished, the last round closes
        self.shard_capacity = shard_capacity  # named where it serves, as replay's is
        self.actor_links = parts.actor_links
        self.finished_actors: set[int] = set()  # actors that can send nothing more here
        self.away_actors: set[int] = set()  # actors whose connection ended; they may come back

    @classmethod
    def wanted(cls, cfg) -> bool:
        return cfg.algorithm.is_synchronous(cfg)

    @classmethod
    def build(cls, cfg, algo, parts: StoreParts, rows: RowSpec, layout) -> RoundsStore:
        c = cfg.cluster
        rounds = Rounds(
            algo.transition_spec(), parts.index, c.memories, c.actors, c.learners, algo.work_items(cfg), parts.log
        )
        return cls(parts, rounds, rows, actors=c.actors, shard_capacity=shard_capacity(cfg))

    # ------------------------------------------------------------------ actors

    def actor_opened(self, link: ActorLink) -> None:
        if self.rounds.work_items is not None:
            # Work items (ES) need no iteration to rejoin at, so the coordinator sends no role_back:
            # an actor that connects again is back here. Left away, the stop counted it as gone and
            # closed the last round under the parts its new process still had in flight, which
            # were then refused as bad messages and failed the run.
            self.away_actors.discard(link.index)

    def accept(self, link: ActorLink, msg, fields: dict) -> None:
        arrays = dict(msg.arrays)
        n = self.rows.rows("rollout", arrays)
        keep = self.tally.good_values(link, self.rows, arrays, n)
        if keep is not None:  # the part still counts as delivered: its round does not wait for it
            arrays = {k: v[keep] for k, v in arrays.items()}
            n = int(keep.sum())
        try:
            outcome = self.rounds.add(link.index, fields, arrays)
        except ValueError as exc:
            raise BadMessage(f"{link.name}: {exc}") from None
        if outcome != "added":
            self.log.debug("%s: ignored a %s part (%r)", link.name, outcome, fields)
            return
        link.next_seq += 1
        self.tally.stored(link, n)
        self.changed.fire()

    def actor_closed(self, link: ActorLink) -> None:
        if link.done_meta is not None:
            self._actor_finished(link.index)
        elif not any(other.name == link.name and not other.closed for other in self.actor_links):
            self._actor_away(link.index)

    def _actor_finished(self, actor_index: int) -> None:
        """Actor `actor_index` will send nothing more here (done, given up, or away when the run stopped)."""
        self.away_actors.discard(actor_index)
        if actor_index in self.finished_actors:
            return
        self.finished_actors.add(actor_index)
        self.rounds.actor_gone(actor_index)
        if len(self.finished_actors) == self.actors:
            self.rounds.finalize()
        self.changed.fire()

    def _actor_away(self, actor_index: int) -> None:
        """Actor `actor_index`'s connection ended before it finished: the open round goes on without
        it; it may come back (a restart), so the end does not come for it yet."""
        if actor_index in self.finished_actors:
            return
        if self.phase() >= Phase.STOPPING:  # no restart is admitted any more: it is gone
            self._actor_finished(actor_index)
            return
        self.away_actors.add(actor_index)
        self.rounds.drop_actor(actor_index)
        self.changed.fire()

    def actors_stopped(self) -> None:
        """The run is stopping: an actor still away will not come back."""
        for actor_index in sorted(self.away_actors):
            self._actor_finished(actor_index)

    def on_role_lost(self, actor_index: int, returns: bool) -> None:
        """A hung actor's rollouts are not waited for."""
        if returns:
            self._actor_away(actor_index)
        else:
            self._actor_finished(actor_index)

    def on_role_back(self, actor_index: int, iteration: int) -> None:
        """Its rollouts are expected again from `iteration` on."""
        if actor_index in self.away_actors:
            self.away_actors.discard(actor_index)
            self.rounds.rejoin(actor_index, iteration)
            self.changed.fire()

    # ------------------------------------------------------------------ learners

    async def serve(self, conn: Connection, link: LearnerLink, learner_index: int) -> None:
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
            self.tally.sampled += len(next(iter(batch.values()))) if batch else 0
            try:
                await conn.send("samples", {"memory": self.index, "iteration": iteration, **meta}, batch)
            except ConnectionClosed:
                return
        await send_end(conn, link, self.index)

    # ------------------------------------------------------------------ the role's life

    def on_phase(self, phase: Phase) -> None:
        if phase >= Phase.STOPPING:
            self.actors_stopped()

    def announce(self, bind: str, port: int) -> None:
        self.log.info("serving replay on %s:%s (capacity %d)", bind, port, self.shard_capacity)

    def summary(self) -> dict:
        return {
            **super().summary(),
            "rounds": {
                "completed": self.rounds.iteration,
                "duplicates": self.rounds.duplicates,
                "stale": self.rounds.stale,
                "discarded_rows": self.rounds.discarded_rows,
            },
        }
