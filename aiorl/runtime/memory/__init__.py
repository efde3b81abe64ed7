"""Memory host: holds one shard of replay, ingests actors' batches and feeds
learners on demand.

`MemoryRole` (role.py) is the role: its store, server, attachments, phases
and summary. Its actor side is `ActorIngest` (ingest.py), its learner side
`LearnerFeed` (feed.py); the credits and the rate limiter both sides move are
one `FlowControl` (flow.py); links.py holds each connection's account.
"""

from aiorl.runtime.memory.links import ActorLink, LearnerLink, Pulse
from aiorl.runtime.memory.role import MemoryRole

__all__ = ["ActorLink", "LearnerLink", "MemoryRole", "Pulse"]
