"""Flow control of a memory host: the credits its actors and learners hold,
and the rate limiter between the two sides.

A learner grants credits, one per batch it will consume and at most
``cluster.learner_credits`` at a time; the memory samples only against one.
With ``agent.samples_per_insert`` the memory also rate limits both sides
(`aiorl.runtime.ratelimit`): learners' batches wait for the ratio, and actors
send only against credits it grants them. IMPALA's memories grant actors their
credits as the trajectory queue has room (`aiorl.runtime.fragments`).
"""

from __future__ import annotations

from collections.abc import Callable

from aiorl.runtime.memory.links import ActorLink, LearnerLink
from aiorl.runtime.messages import BadMessage
from aiorl.runtime.phase import Phase
from aiorl.runtime.ratelimit import ACTOR_CREDITS
from aiorl.wire import ConnectionClosed


class FlowControl:
    """The credits of one memory host's connections and the limiter that grants actors theirs.

    `limiter` is a `SampleToInsertRatio`, the trajectory queue's `QueueRoom` (IMPALA), or None:
    then actors send without credits and learners are served as soon as the shard holds enough.
    """

    def __init__(self, limiter, learner_limit: int, actor_links: list[ActorLink], phase: Callable[[], Phase]):
        self.limiter = limiter
        self.learner_limit = learner_limit  # cluster.learner_credits
        self.actor_links = actor_links  # the memory's own list: the actors connect there
        self._phase = phase

    def grant_learner(self, link: LearnerLink, credits: int) -> None:
        """A learner's credit for `credits` more batches; more than it may hold breaks the protocol."""
        limit = self.learner_limit
        if link.credits + credits > limit:
            raise BadMessage(
                f"{link.name} holds {link.credits} credits and asks for {credits} more, "
                f"over cluster.learner_credits ({limit})"
            )
        link.credits += credits

    def within_rate(self, rows: int) -> bool:
        """May a learner batch be drawn from a shard of `rows` rows, as far as the ratio goes?"""
        return self.limiter is None or self.limiter.can_sample(rows)

    def restored(self, rows: int) -> None:
        """The shard starts from a snapshot of `rows` rows."""
        if self.limiter is not None:
            self.limiter.restore(rows)

    def inserted(self, link: ActorLink, rows: int) -> None:
        """`rows` from `link` were stored: the credit they came on is used, and more may go out."""
        if self.limiter is not None:
            with_credit = link.credits > 0  # an actor's last batch, in STOPPING, comes without one
            link.credits -= with_credit
            self.limiter.inserted_rows(rows, with_credit)
            self.grant_actor_credits()

    def sampled(self, rows: int) -> None:
        """`rows` went to a learner: the ratio (or the queue's room) may let actors send more."""
        if self.limiter is not None:
            self.limiter.sampled_rows(rows)
            self.grant_actor_credits()

    def actor_closed(self, link: ActorLink) -> None:
        """`link`'s connection ended: the credits it held will bring nothing."""
        if self.limiter is not None and link.credits:
            self.limiter.release(link.credits)
            link.credits = 0
            self.grant_actor_credits()  # what it held back may go to the others

    def grant_actor_credits(self) -> None:
        """Top every open actor connection up to ACTOR_CREDITS batches, while the ratio allows;
        the neediest first, then the least served, so no actor is starved by a faster one."""
        if self.limiter is None or self._phase() > Phase.RUNNING:
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

    async def send_credits(self, link: ActorLink) -> None:
        """Tell an actor of the credits granted to it (several per message when they pile up)."""
        try:
            while True:
                await link.credit_ready.wait()
                link.credit_ready.clear()
                n, link.unsent_credits = link.unsent_credits, 0
                await link.conn.send("credit", {"n": n})
        except ConnectionClosed:
            pass  # its reader sees the close
