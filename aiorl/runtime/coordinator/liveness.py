"""Liveness: which roles have gone silent, judged against the coordinator's own stalls.

Time the coordinator's own loop spent stalled (a GC pause, SIGSTOP, an
overloaded machine) since a role's last heartbeat is not the role's silence:
its heartbeats were waiting, unread, in the socket. The monitor measures how
late its own timer fires and grants that as grace. It returns verdicts; the
service records and acts on them.
"""

from __future__ import annotations

import asyncio

from aiorl.config import Config
from aiorl.runtime.coordinator.roster import RoleRecord
from aiorl.runtime.looplag import LoopLagProbe


class Liveness:
    def __init__(self, cfg: Config):
        self.cfg = cfg
        self.loop_lag_max_s = 0.0  # how late the coordinator's own timer fired, worst case
        self.stalled_s = 0.0  # how long the coordinator's own loop was stalled, in total
        self.lag_probe = LoopLagProbe()  # its loop's lateness, finer than the heartbeat monitor's
        self.no_actor_since: float | None = None  # loop time the last live actor was lost
        self._woke: float | None = None  # loop time the monitor last woke up

    def heard(self, record: RoleRecord) -> None:
        """`record` spoke (registered or heartbeat) now."""
        record.last_heartbeat = asyncio.get_running_loop().time()
        record.stall_at_heartbeat_s = self.stalled_s

    def silence_s(self, record: RoleRecord, now: float) -> float:
        """How long `record` has been silent while the coordinator itself was listening."""
        return now - record.last_heartbeat - (self.stalled_s - record.stall_at_heartbeat_s)

    async def tick(self) -> float:
        """Sleep until one heartbeat interval after the last wake-up; grant the lateness as a stall;
        return the loop time of this wake-up, the time the roles are judged at."""
        loop = asyncio.get_running_loop()
        interval = self.cfg.cluster.heartbeat_interval_s
        if self._woke is None:
            self._woke = loop.time()
        # The interval runs from the last wake-up, not from this call: a stall between the two
        # (while judging, or in a callback the loop ran before this one) makes this wake-up late
        # too, and is granted like a stall during the sleep.
        expected = self._woke + interval
        await asyncio.sleep(max(0.0, expected - loop.time()))
        now = loop.time()
        lag = max(0.0, now - expected)
        self.loop_lag_max_s = max(self.loop_lag_max_s, lag)
        self._woke = now
        if lag > 0:
            # The stall is granted as grace, and the heartbeats that queued up
            # during it are read before anyone is judged: after a stall this
            # timer can fire before the loop has run the readers of the sockets.
            # Those read after `now` only make a role's silence shorter.
            self.stalled_s += lag
            await asyncio.sleep(0)
        return now

    def verdicts(self, records, now: float, rejoin_grace_s: float) -> list[tuple[RoleRecord, str, bool]]:
        """(record, why it is lost, whether to abort its connection) for every role given up now."""
        c = self.cfg.cluster
        lost = []
        for record in records:
            silence = self.silence_s(record, now)
            if record.status == "running" and silence > c.heartbeat_timeout_s:
                why = f"no heartbeat for {silence:.1f} s (cluster.heartbeat_timeout_s {c.heartbeat_timeout_s:g})"
                lost.append((record, why, True))
            elif record.status == "disconnected" and now - record.disconnected_at > rejoin_grace_s:
                why = f"its connection to the coordinator closed and it did not rejoin within {rejoin_grace_s:.1f} s"
                lost.append((record, why, False))
        return lost

    def actors_gone(self, now: float) -> str | None:
        """Why the run must stop when every actor has been gone, none restarted, too long; else None."""
        c = self.cfg.cluster
        if self.no_actor_since is not None and now - self.no_actor_since > c.start_timeout_s:
            self.no_actor_since = None
            return f"every actor is gone and none restarted within cluster.start_timeout_s ({c.start_timeout_s:g} s)"
        return None
