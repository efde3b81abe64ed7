"""Samples per insert: the rate limiter each memory host applies to its own shard.

Reverb's ``SampleToInsertRatio``, counted in transitions. With ``spi =
agent.samples_per_insert``, ``min_size`` the memory's share of
``agent.learning_starts`` and an error buffer ``e``, the memory keeps

    diff = inserted * spi - sampled   within   [spi * min_size - e, spi * min_size + e]

- a learner's batch of B is served only once the shard holds ``min_size``
  rows and ``diff - B`` stays above the lower bound (learners ran ahead: they
  wait, the time counted as ``sample_blocked_s``);
- actors send a batch only against a credit, and the memory grants a credit
  (one batch of up to ``batch_rows`` transitions) only while the inserts
  already granted keep ``diff`` under the upper bound (actors ran ahead: they
  stop stepping until a credit comes, counted as their ``blocked_s``). Data
  is never dropped: a batch sent is always stored.

``e = max(tolerance * spi * min_size, B + spi * batch_rows)``
(``tolerance``: ``agent.samples_per_insert_tolerance``, Acme's
``samples_per_insert_tolerance_rate``). The floor keeps the band wider than
one learner batch plus one actor batch, so a state where neither side may
move cannot occur (Reverb refuses such a band for the same reason).

Synchronous algorithms do not use replay; the limiter is not built for them.
"""

from __future__ import annotations

import math

# Batches an actor may hold credit for at one memory host: one being filled, one in flight.
ACTOR_CREDITS = 2


class SampleToInsertRatio:
    def __init__(self, samples_per_insert: float, min_size: int, learner_batch: int, batch_rows: int, tolerance: float):
        self.spi = float(samples_per_insert)
        self.min_size = int(min_size)
        self.learner_batch = int(learner_batch)
        self.batch_rows = int(batch_rows)
        self.error_buffer = max(tolerance * self.spi * self.min_size, self.learner_batch + self.spi * self.batch_rows)
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

    def can_sample(self, size: int) -> bool:
        """May a learner batch be drawn from a shard holding `size` rows?"""
        return size >= self.min_size and self.diff - self.learner_batch >= self.min_diff

    def can_grant(self) -> bool:
        """May one more actor batch credit be granted?"""
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
