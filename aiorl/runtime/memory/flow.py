"""Flow control of a memory host: the credits its actors and learners hold,
and the rate limiter between the two sides.

A learner grants credits, one per batch it will consume and at most
``cluster.learner_credits`` at a time; the memory samples only against one.
With ``agent.samples_per_insert`` the memory also rate limits both sides
(`aiorl.runtime.ratelimit`): learners' batches wait for the ratio, and actors
send only against credits it grants them, up to ``cluster.actor_credits``
batches ahead each (deep enough to hide a round trip; the band is sized so
that only a side really ahead waits). IMPALA's memories grant actors their
credits as the trajectory queue has room (`aiorl.runtime.fragments`).

A side held back is accounted by the bound that held it (``min_size``,
``ratio_lower``, ``ratio_upper``: seconds in `held_s`, the ``limiter/held_*_s``
metrics) and named in a log line at a bounded rate, so that a slow run says
whether its actors or its learners were ahead, or neither (an actor's
``blocked_s`` with no ``ratio_upper`` time is round trips, not the ratio).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from aiorl.core.ratelog import RateLimitedLog
from aiorl.runtime.memory.links import ActorLink, LearnerLink
from aiorl.runtime.messages import BadMessage
from aiorl.runtime.phase import Phase
from aiorl.runtime.ratelimit import BOUNDS, RATIO_UPPER
from aiorl.wire import ConnectionClosed


class FlowControl:
    """The credits of one memory host's connections and the limiter that grants actors theirs.

    `limiter` is a `SampleToInsertRatio`, the trajectory queue's `QueueRoom` (IMPALA), or None:
    then actors send without credits and learners are served as soon as the shard holds enough.
    """

    def __init__(
        self,
        limiter,
        learner_limit: int,
        actor_links: list[ActorLink],
        phase: Callable[[], Phase],
        log: logging.Logger | None = None,
    ):
        self.limiter = limiter
        self.learner_limit = learner_limit  # cluster.learner_credits
        self.actor_links = actor_links  # the memory's own list: the actors connect there
        self._phase = phase
        self.held_s = dict.fromkeys(BOUNDS, 0.0)  # seconds a side waited, by the bound that held it
        self.holds = dict.fromkeys(BOUNDS, 0)  # how many times (counters: tests and summaries compare these)
        self._upper_since: float | None = None  # actors want credits and the upper bound refuses them
        # Held sides are the normal state of a limited run (one side is always the slower): a line
        # now and then says which, never one per batch.
        self._log_held = RateLimitedLog(log or logging.getLogger("aiorl.memory"), logging.INFO, burst=2, per_s=0.05)

    def held(self, bound: str, seconds: float, who: str) -> None:
        """`who` waited `seconds` on `bound` (a learner's batch: min_size or ratio_lower)."""
        self.held_s[bound] += seconds
        self.holds[bound] += 1
        self._log_held("%s held back by %s for %.3f s (%r)", who, bound, seconds, self.limiter)

    def held_metrics(self) -> dict:
        """``limiter/held_<bound>_s``, the upper bound's wait in progress included; {} without a limit."""
        if self.limiter is None or not hasattr(self.limiter, "sample_bound"):
            return {}
        held = dict(self.held_s)
        if self._upper_since is not None:
            held[RATIO_UPPER] += time.perf_counter() - self._upper_since
        return {f"limiter/held_{bound}_s": round(s, 3) for bound, s in held.items()}

    def _hold_actors(self, holding: bool) -> None:
        if holding and self._upper_since is None:
            self._upper_since = time.perf_counter()
            self.holds[RATIO_UPPER] += 1
        elif not holding and self._upper_since is not None:
            waited = time.perf_counter() - self._upper_since
            self._upper_since = None
            self.held_s[RATIO_UPPER] += waited
            self._log_held("actors held back by %s for %.3f s (%r)", RATIO_UPPER, waited, self.limiter)

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

    def sample_bound(self, rows: int) -> str | None:
        """What holds a learner batch from a shard of `rows` rows (min_size, ratio_lower), or None."""
        return None if self.limiter is None else self.limiter.sample_bound(rows)

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
        """Top every open actor connection up to the limiter's `actor_credits` batches, while the
        ratio allows; the neediest first, then the least served, so no actor is starved by a
        faster one."""
        if self.limiter is None or self._phase() > Phase.RUNNING:
            return
        depth = self.limiter.actor_credits
        while True:
            open_links = [link for link in self.actor_links if not link.closed and link.credits < depth]
            if not open_links:
                self._hold_actors(False)
                return
            if not self.limiter.can_grant():
                # An actor out of credits here is held by the ratio (one still holding some is not
                # waiting); the queue's room (IMPALA) is counted by the queue, not named a bound.
                starved = any(link.credits == 0 for link in open_links)
                if hasattr(self.limiter, "sample_bound"):
                    self._hold_actors(starved)
                elif starved:
                    self.limiter.hold()
                return
            self._hold_actors(False)
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
