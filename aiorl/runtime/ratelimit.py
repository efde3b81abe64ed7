"""Samples per insert: the rate limiter each memory host applies to its own shard.

Reverb's ``SampleToInsertRatio``, counted in transitions. With ``spi =
agent.samples_per_insert``, ``min_size`` the memory's share of
``agent.learning_starts`` and an error buffer ``e``, the memory keeps

    diff = inserted * spi - sampled   within   [spi * min_size - e, spi * min_size + e]

- a learner's batch of B is served only once the shard holds ``min_size``
  rows (bound ``min_size``) and ``diff - B`` stays above the lower bound
  (bound ``ratio_lower``: learners ran ahead, they wait, counted as
  ``sample_blocked_s``);
- actors send a batch only against a credit, and the memory grants a credit
  (one batch of up to ``batch_rows`` transitions) only while the inserts
  already granted keep ``diff`` under the upper bound (bound ``ratio_upper``:
  actors ran ahead, they stop stepping until a credit comes, counted as their
  ``blocked_s``). Data is never dropped: a batch sent is always stored.

Pipelining: why the credits run deep and how wide the band is
-------------------------------------------------------------

A credit is a round trip: the memory grants it, the actor fills a batch,
sends it (an actor's connection holds a batch up to
``cluster.actor_flush_delay_s``, 5 ms, to share writes), the memory stores it
and grants the next. With one credit in flight per batch being filled, an
actor whose batch takes ``t_b`` to step waits ``RTT - t_b`` for every batch
as soon as the round trip is longer than a batch. Measured on the 2-core
machine (bench/pipeline.py: CartPole, 64-step batches, one env) an actor
steps a batch in about 1.2 ms (50k env steps/s); with two credits it
delivered 0.29 of that, two batches per round trip of about 9 ms (5 ms of
flush delay, the rest the hops and the memory host's turn). To hide a round
trip an actor must hold

    D >= 1 + RTT / t_b   batches per memory host   (about 8.5 here; its
                                                     batches are spread over
                                                     the hosts, so more hosts
                                                     need no more)

so ``cluster.actor_credits`` defaults to 16: about twice that, for a loaded
machine's longer round trips, and still small (16 batches of 64 rows) against
any replay. Slow envs (Atari: tens of ms a batch) need far less; holding more
credits than needed costs nothing but band width, as below. On the other side a
learner holds ``cluster.learner_credits`` requests per memory: the memory
samples ahead of it as far as the ratio allows, so one batch waits while the
previous one trains.

Neither side may then wait on the other while the ratio is in its band:
from any ``diff`` in the band's middle, the learners must be able to take all
the batches they asked for, ``W_l = learners * learner_credits * B`` samples,
without crossing the lower bound, and the actors must be able to fill all
their credits, ``W_a = spi * actors * actor_credits * batch_rows`` in units of
``diff``, without crossing the upper one. So

    e = max(tolerance * spi * min_size, W_l + W_a)

(``tolerance``: ``agent.samples_per_insert_tolerance``, Acme's
``samples_per_insert_tolerance_rate``). Only a side really ahead, one whose
window reaches its bound, waits; the ratio still holds on average (its drift
is at most ``e`` over the whole run) and never leaves the band. The floor is
also what rules out a state where neither side may move: that needs
``2e < B + spi * batch_rows`` (Reverb refuses such a band for the same
reason), and ``W_l + W_a`` is at least that with a single credit each.

Synchronous algorithms do not use replay; the limiter is not built for them.
"""

from __future__ import annotations

import math

# Default depth of an actor's credits per memory host (cluster.actor_credits): see the docstring.
ACTOR_CREDITS = 16

# What holds a side back, as metrics and log lines name it.
MIN_SIZE, RATIO_LOWER, RATIO_UPPER = "min_size", "ratio_lower", "ratio_upper"
BOUNDS = (MIN_SIZE, RATIO_LOWER, RATIO_UPPER)


class SampleToInsertRatio:
    def __init__(
        self,
        samples_per_insert: float,
        min_size: int,
        learner_batch: int,
        batch_rows: int,
        tolerance: float,
        *,
        actors: int = 1,
        actor_credits: int = ACTOR_CREDITS,
        learner_credits: int = 1,
    ):
        """`actors`: actors feeding this shard; `actor_credits`: batches each may hold credit for;
        `learner_credits`: batch requests all learners together may hold at this shard."""
        if actors < 1 or actor_credits < 1 or learner_credits < 1:
            raise ValueError(
                f"SampleToInsertRatio: actors, actor_credits and learner_credits must be at least 1, "
                f"got {actors}, {actor_credits}, {learner_credits}"
            )
        self.spi = float(samples_per_insert)
        self.min_size = int(min_size)
        self.learner_batch = int(learner_batch)
        self.batch_rows = int(batch_rows)
        self.actor_credits = int(actor_credits)
        self.learner_window = learner_credits * self.learner_batch
        self.actor_window = self.spi * actors * self.actor_credits * self.batch_rows
        self.error_buffer = max(tolerance * self.spi * self.min_size, self.learner_window + self.actor_window)
        offset = self.spi * self.min_size
        self.min_diff = offset - self.error_buffer
        self.max_diff = offset + self.error_buffer
        self.inserted = 0
        self.sampled = 0
        self.reserved = 0  # transitions granted to actors and not yet arrived

    def __repr__(self) -> str:
        return (
            f"<SampleToInsertRatio spi={self.spi:g} min_size={self.min_size} diff={self.diff:.0f} "
            f"band=[{self.min_diff:.0f}, {self.max_diff:.0f}] reserved={self.reserved}>"
        )

    @property
    def diff(self) -> float:
        return self.inserted * self.spi - self.sampled

    def sample_bound(self, size: int) -> str | None:
        """The bound that keeps a learner batch from a shard of `size` rows, or None: it may be drawn."""
        if size < self.min_size:
            return MIN_SIZE
        if self.diff - self.learner_batch < self.min_diff:
            return RATIO_LOWER
        return None

    def can_sample(self, size: int) -> bool:
        """May a learner batch be drawn from a shard holding `size` rows?"""
        return self.sample_bound(size) is None

    def can_grant(self) -> bool:
        """May one more actor batch credit be granted (else bound ``ratio_upper`` holds)?"""
        return (self.inserted + self.reserved + self.batch_rows) * self.spi - self.sampled <= self.max_diff

    def grant(self) -> None:
        self.reserved += self.batch_rows

    def release(self, credits: int = 1) -> None:
        """Credits that will not bring data after all (their actor went away)."""
        self.reserved = max(0, self.reserved - credits * self.batch_rows)

    def inserted_rows(self, rows: int, with_credit: bool) -> None:
        self.inserted += rows
        if with_credit:
            self.release()

    def sampled_rows(self, rows: int) -> None:
        self.sampled += rows

    def restore(self, size: int) -> None:
        """A shard restored from a snapshot with `size` rows: start in the middle of the band,
        as if those rows had been inserted and sampled at the target ratio."""
        self.inserted = size
        self.sampled = max(0, math.floor(size * self.spi - self.spi * self.min_size))
