"""What a memory host counts across its connections (`Tally`): rows stored and
sent, the time learners waited on the ratio, and the rows it refused.

Rows that would crash a learner or quietly corrupt its update are dropped and
counted (``rows_rejected``), the rest of the message is kept and the
connection stays open: a value out of range or not finite
(`aiorl.runtime.messages.RowSpec.bad_rows`: Discrete actions, ES noise
indices, every float), a non-finite or negative priority (in the frame layout
such rows are kept at priority 0), every fragment of a message acted with a
weights version not yet published. Each is counted every time and logged at
a bounded rate.
"""

from __future__ import annotations

import numpy as np

from aiorl.core.ratelog import RateLimitedLog
from aiorl.runtime.memory.links import ActorLink
from aiorl.runtime.messages import RowSpec


def values_why(fields: list[str]) -> str:
    # Named: an env whose observations are legitimately infinite shows up here, not as a mystery.
    return f"with a value out of range or not finite (in {', '.join(fields)})"


class Tally:
    """The memory host's counters; `log_peer` is the role's bounded log of what peers got wrong."""

    def __init__(self, log_peer: RateLimitedLog):
        self.log_peer = log_peer  # shared with the role's refusals: one bound for both
        self.inserted = 0
        self.sampled = 0
        self.rows_rejected = 0
        self.sample_blocked_s = 0.0

    def stored(self, link: ActorLink, rows: int) -> None:
        """One message of `link`'s, `rows` of it kept."""
        link.batches += 1
        link.transitions += rows
        self.inserted += rows

    def reject(self, link: ActorLink, bad: int, n: int, done: str, why: str) -> None:
        """Rows a learner must not get: counted every time, logged at a bounded rate."""
        link.rows_rejected += bad
        self.rows_rejected += bad
        self.log_peer("%s: %s %d of %d rows %s", link.name, done, bad, n, why)

    def good_values(self, link: ActorLink, rows: RowSpec, arrays: dict, n: int) -> np.ndarray | None:
        """The mask of `arrays`' rows to keep, the others rejected; None: every row is good."""
        found = rows.bad_rows(arrays)
        if found is None:
            return None
        bad, fields = found
        self.reject(link, int(bad.sum()), n, "dropped", values_why(fields))
        return ~bad
