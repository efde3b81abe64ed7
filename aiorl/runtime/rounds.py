"""One memory host's rounds of a synchronous algorithm (DPPO, ES).

A round is one iteration's data at this memory, gathered in an
`AggregateBuffer` with one part per producer:

- per actor (``work_items is None``, DPPO): actor i sends its rollouts to
  memory ``i % memories``; the round is complete when every live actor
  assigned here has delivered. An actor whose connection ended owes nothing
  more to the round being gathered (`drop_actor`: it is *away*); a part it
  already delivered stays in the round. An away actor that comes back (a
  restart, a connection that dropped and came back) is expected again from
  the iteration it joins (`rejoin`): the coordinator says which, the next
  one after the newest weights; a part it sends for an earlier round is
  ignored (``stale``). A round in which every actor assigned here is away
  closes empty when one of them joins a later iteration, so the learners
  step past it. An actor that reported done, or that the coordinator gave
  up (no restart left), or any away one once the run stops, is *gone*
  (`actor_gone`): only when every actor here is gone does the end come.
- per work item (ES): item i of an iteration goes to memory
  ``i % memories``; the round is complete when every item assigned here
  has arrived. A second copy of an item (a released item that its first,
  lost, taker still delivered) is ignored, as is any result for an
  iteration already complete.

A complete round is split evenly between the learners (learner j gets rows
``[j*n//L, (j+1)*n//L)``) and dropped once every learner took its share.

The end (`finalize`, once no actor can send anything more here): per actor,
every actor has been dropped by then, so whatever they delivered of their
last round already completed it (a partial last round, of the actors that
started it, is trained on); one empty round follows, so that a learner
whose other memories do hold that round gets an answer from this one too.
Per work item, an incomplete round is discarded (a fraction of a population
is not an ES estimate). After that, a learner asking for an iteration that
is not there gets the end of the data.
"""

from __future__ import annotations

import logging

from aiorl.replay import AggregateBuffer


class Rounds:
    def __init__(
        self,
        spec,
        memory_index: int,
        memories: int,
        actors: int,
        learners: int,
        work_items: int | None,
        log: logging.Logger,
    ):
        self.memory_index = memory_index
        self.memories = memories
        self.learners = learners
        self.work_items = work_items
        self.log = log
        if work_items is None:
            self.producers = [i for i in range(actors) if i % memories == memory_index]
        else:
            self.producers = [i for i in range(work_items) if i % memories == memory_index]
        self.aggregate = AggregateBuffer(max(1, len(self.producers)), spec)
        self.iteration = 0  # the round being gathered
        self.versions: list[int] = []  # weights versions of the open round's parts
        self.completed: dict[int, tuple[dict, dict]] = {}  # iteration -> (batch, meta)
        self.taken: dict[int, set[int]] = {}
        self.dropped: set[int] = set()  # actor indices not expected in the open round (per-actor rounds)
        self.gone: set[int] = set()  # actor indices that will send nothing more (per-actor rounds)
        self.joins: dict[int, int] = {}  # away actor index -> the iteration it is expected again from
        self.empty_upto = -1  # highest iteration answered with an empty share since every actor here left
        self.final = False
        self.duplicates = 0
        self.stale = 0
        self.discarded_rows = 0

    def __repr__(self) -> str:
        return (
            f"<Rounds iteration={self.iteration} completed={sorted(self.completed)} final={self.final} "
            f"{self.aggregate!r}>"
        )

    # ------------------------------------------------------------------ gathering

    def add(self, actor_index: int, meta: dict, arrays: dict) -> str:
        """Take one part; 'added', 'duplicate' or 'stale'. Raises ValueError on a part that breaks
        the protocol (a future iteration, an actor or item not assigned here)."""
        iteration = int(meta["iteration"])
        if self.final:
            raise ValueError(f"a part for iteration {iteration} after this memory's last round")
        if self.work_items is None:
            if actor_index not in self.producers:
                raise ValueError(
                    f"actor {actor_index} sends its rollouts to memory "
                    f"{actor_index % self.memories}, not memory {self.memory_index}"
                )
            producer = self.producers.index(actor_index)
            if iteration < self.iteration or (iteration == self.iteration and actor_index in self.dropped):
                self.stale += 1  # an away actor's part for a round that went on without it
                return "stale"
            if iteration != self.iteration:
                raise ValueError(
                    f"actor {actor_index} sent iteration {iteration}, this memory is gathering "
                    f"iteration {self.iteration}"
                )
        else:
            item = int(meta["item"])
            if item not in self.producers:
                raise ValueError(f"work item {item} does not belong to memory {self.memory_index}")
            producer = self.producers.index(item)
            if iteration < self.iteration:
                self.stale += 1
                return "stale"
            if iteration > self.iteration:
                raise ValueError(
                    f"work item {item} of iteration {iteration}, this memory is gathering iteration {self.iteration}"
                )
            if producer in self.aggregate.received:
                self.duplicates += 1
                return "duplicate"
        self.aggregate.add(producer, arrays)
        self.versions.append(int(meta.get("weights_version", -1)))
        self._maybe_complete()
        return "added"

    def drop_actor(self, actor_index: int) -> None:
        """Per-actor rounds: stop waiting for this actor in the open round (it is away)."""
        if self.work_items is not None or actor_index not in self.producers:
            return
        self.joins.pop(actor_index, None)
        if actor_index not in self.dropped:
            self.dropped.add(actor_index)
            self.aggregate.drop(self.producers.index(actor_index))
            self._maybe_complete()

    def actor_gone(self, actor_index: int) -> None:
        """Per-actor rounds: this actor will send nothing more here (done, given up, the run stopped)."""
        if self.work_items is not None or actor_index not in self.producers:
            return
        self.gone.add(actor_index)
        self.drop_actor(actor_index)

    def rejoin(self, actor_index: int, iteration: int) -> None:
        """Per-actor rounds: an away actor is expected again from `iteration` on."""
        if self.work_items is not None or actor_index not in self.dropped or actor_index in self.gone:
            return
        self.joins[actor_index] = min(iteration, self.joins.get(actor_index, iteration))
        # A round that nobody here can deliver to any more closes empty, so the learners step past it.
        while self.iteration < iteration and not self.final and not self.aggregate.missing:
            self._close_round(self.aggregate.take() if self.aggregate.received else {})
        self._revive_joined()

    def _revive_joined(self) -> None:
        for actor_index, iteration in list(self.joins.items()):
            if iteration <= self.iteration:
                del self.joins[actor_index]
                self.dropped.discard(actor_index)
                self.aggregate.revive(self.producers.index(actor_index))

    def _all_dropped(self) -> bool:
        return self.work_items is None and len(self.gone) == len(self.producers)

    def _maybe_complete(self) -> None:
        if self.aggregate.complete:
            self._close_round(self.aggregate.take())

    def _close_round(self, batch: dict) -> None:
        meta = {"versions": [min(self.versions), max(self.versions)] if self.versions else None, "final": self.final}
        self.completed[self.iteration] = (batch, meta)
        self.taken[self.iteration] = set()
        self.iteration += 1
        self.versions = []
        self._revive_joined()

    def finalize(self) -> None:
        """No actor can send anything more here: close or discard the open round (see the module doc)."""
        if self.final:
            return
        self.final = True
        rows = len(self.aggregate)
        if self.work_items is None:
            self._close_round(self.aggregate.take() if self.aggregate.complete else {})
        elif rows:
            self.discarded_rows += rows
            self.log.info(
                "discarding the incomplete round of iteration %d (%d of %d work items here)",
                self.iteration,
                len(self.aggregate.received),
                len(self.producers),
            )

    # ------------------------------------------------------------------ serving learners

    def ready(self, iteration: int) -> bool:
        """A share of `iteration` can be handed out now (possibly empty). Once one learner got an
        answer for an iteration, every learner gets the same one, before or after `finalize`
        (data-parallel learners must take the same steps)."""
        return iteration in self.completed or iteration <= self.empty_upto or (not self.final and self._all_dropped())

    def exhausted(self, next_iteration: int) -> bool:
        """Nothing at or after `next_iteration` will ever be handed out."""
        return self.final and next_iteration > self.empty_upto and not any(i >= next_iteration for i in self.completed)

    def take(self, iteration: int, learner_index: int) -> tuple[dict, dict]:
        """Learner `learner_index`'s share of a ready round and its meta (``empty``, ``versions``)."""
        if iteration not in self.completed:
            self.empty_upto = max(self.empty_upto, iteration)
            return {}, {"empty": True, "versions": None, "final": True}  # every actor here is gone
        batch, meta = self.completed[iteration]
        taken = self.taken[iteration]
        if learner_index in taken:
            raise ValueError(f"learner {learner_index} asked twice for iteration {iteration}")
        taken.add(learner_index)
        if len(taken) == self.learners:
            del self.completed[iteration], self.taken[iteration]
        if not batch:
            return {}, {**meta, "empty": True}
        n = len(next(iter(batch.values())))
        lo, hi = learner_index * n // self.learners, (learner_index + 1) * n // self.learners
        share = batch if self.learners == 1 else {k: v[lo:hi] for k, v in batch.items()}
        return share, {**meta, "empty": hi == lo}
