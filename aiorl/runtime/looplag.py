"""How late an event loop runs its timers, as a histogram two snapshots can be subtracted from.

The coordinator runs one (its ``status`` reply carries the snapshot) and so do
the simulated actors' processes of ``bench/scale.py``. A timer that fires late
means every callback queued behind it (a heartbeat being read, a reply being
written) waited that long too.

Buckets are log-spaced (ratio `RATIO`), so a percentile read from them is an
upper bound at most 10% above the true value; the counts are fixed-size and a
sample costs one bisect, so the probe allocates nothing per wake-up.
"""

from __future__ import annotations

import asyncio
import bisect
import math

RATIO = 1.1
FIRST_EDGE_S = 50e-6  # lateness under this is the loop's own noise
EDGES_S = tuple(FIRST_EDGE_S * RATIO**k for k in range(int(math.log(600 / FIRST_EDGE_S, RATIO)) + 1))


class LoopLagProbe:
    """Sleeps `interval_s` again and again; counts how late each wake-up came."""

    def __init__(self, interval_s: float = 0.05):
        self.interval_s = interval_s
        self.counts = [0] * (len(EDGES_S) + 1)  # the last bucket: past the last edge
        self.samples = 0
        self.max_s = 0.0

    def __repr__(self) -> str:
        return f"<LoopLagProbe every {self.interval_s:g} s samples={self.samples} max_s={self.max_s:.4f}>"

    def record(self, lag_s: float) -> None:
        self.counts[bisect.bisect_left(EDGES_S, lag_s)] += 1
        self.samples += 1
        if lag_s > self.max_s:
            self.max_s = lag_s

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        interval = self.interval_s
        while True:
            expected = loop.time() + interval
            await asyncio.sleep(interval)
            self.record(max(0.0, loop.time() - expected))

    def snapshot(self) -> dict:
        """What ``status`` carries: the counts so far (subtract an earlier snapshot for a window)."""
        return {
            "interval_s": self.interval_s,
            "ratio": RATIO,
            "first_edge_s": FIRST_EDGE_S,
            "counts": list(self.counts),
            "samples": self.samples,
            "max_s": round(self.max_s, 6),
        }


def window(before: dict, after: dict) -> list[int]:
    """The counts of the samples taken between two snapshots of one probe."""
    return [b - a for a, b in zip(before["counts"], after["counts"])]


def quantile_s(counts: list[int], q: float) -> float | None:
    """Upper edge of the bucket holding quantile `q` of `counts` (None without samples)."""
    total = sum(counts)
    if total == 0:
        return None
    rank = q * total
    seen = 0
    for i, n in enumerate(counts):
        seen += n
        if seen >= rank and n:
            return EDGES_S[i] if i < len(EDGES_S) else math.inf
    return math.inf
