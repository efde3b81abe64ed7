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

The error buffer is ``e = max(tolerance * spi * min_size, W_l + W_a)``: at least the
learners' and the actors' windows together (every batch request and every credit they may
hold), so from the band's middle neither side waits on the other, and no state leaves both
stuck. The derivation, and why ``cluster.actor_credits`` defaults to 16 (a credit is a round
trip, measured): docs/concepts/rate-limit.md.

Synchronous algorithms do not use replay; the limiter is not built for them.
"""

from __future__ import annotations

import math

# Default depth of an actor's credits per memory host (cluster.actor_credits): see docs/concepts/rate-limit.md.
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
