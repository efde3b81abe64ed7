"""Log lines that a peer can cause, at a bounded rate.

A flood of bad connections must not become a flood of log lines (disk, the
launcher's stderr, the time spent formatting them). `RateLimitedLog` is a
token bucket: a burst of lines, then a steady rate; what it drops it counts
and reports on the next line it lets through.
"""

from __future__ import annotations

import logging
import time

__all__ = ["RateLimitedLog"]


class RateLimitedLog:
    """``log(msg, *args)``: at most `burst` lines at once, refilled at `per_s` lines a second."""

    def __init__(
        self,
        logger: logging.Logger,
        level: int = logging.WARNING,
        *,
        burst: int = 20,
        per_s: float = 1.0,
        clock=time.monotonic,
    ):
        self.logger = logger
        self.level = level
        self.burst = burst
        self.per_s = per_s
        self.clock = clock
        self.suppressed = 0  # lines dropped since the last one logged
        self.total_suppressed = 0
        self._tokens = float(burst)
        self._last = clock()

    def __repr__(self) -> str:
        return f"<RateLimitedLog {self.logger.name} burst={self.burst} per_s={self.per_s} suppressed={self.suppressed}>"

    def __call__(self, msg: str, *args) -> bool:
        """Log the line if the rate allows; True when it was logged."""
        now = self.clock()
        self._tokens = min(float(self.burst), self._tokens + (now - self._last) * self.per_s)
        self._last = now
        if self._tokens < 1.0:
            self.suppressed += 1
            self.total_suppressed += 1
            return False
        self._tokens -= 1.0
        if self.suppressed:
            msg = f"{msg} (and {self.suppressed} similar lines not logged)"
            self.suppressed = 0
        self.logger.log(self.level, msg, *args)
        return True
