"""Memory host: holds one shard of the run's data, takes actors' messages and
feeds learners on demand.

`MemoryRole` (role.py) is the role: its server, attachments, phases, metrics
and summary; it hands every connection to its one store. The store is chosen
once from what the algorithm declares (build.py) behind one interface
(`Store`, store.py): `ReplayStore` (replay_store.py: uniform, prioritized,
frame layout, snapshots), `QueueStore` (queue_store.py: IMPALA's trajectory
queue) and `RoundsStore` (rounds_store.py: DPPO's and ES's rounds). Around
them: the credits and the rate limiter both sides move are one `FlowControl`
(flow.py); links.py holds each connection's account and the `Pulse` samplers
wait on; tally.py the counters and the rows refused; reading.py the message
loop of every connection.
"""

from aiorl.runtime.memory.links import ActorLink, LearnerLink, Pulse
from aiorl.runtime.memory.role import MemoryRole

__all__ = ["ActorLink", "LearnerLink", "MemoryRole", "Pulse"]
