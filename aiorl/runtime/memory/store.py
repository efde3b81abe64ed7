"""The one interface every memory host store offers its role (`Store`), and
what the role hands each store (`StoreParts`).

A store is the memory host's data and the rules that go with it: what an
actor sends and how it is kept (`accept`), how a learner is fed on its
credits (`serve`), what a learner sends back (`on_priorities`), an actor's
end, loss and return, the run's phases, and the store's metrics and summary.
The role builds one store from what the algorithm declares
(`aiorl.runtime.memory.build`) and then only calls this interface, so a new
kind of data is one new `Store` class, never a new branch in the role.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import ClassVar

from aiorl.runtime.memory.flow import FlowControl
from aiorl.runtime.memory.links import ActorLink, LearnerLink, Pulse
from aiorl.runtime.memory.tally import Tally
from aiorl.runtime.messages import BadMessage
from aiorl.runtime.phase import Phase
from aiorl.runtime.snapshot import ReplaySnapshots
from aiorl.wire import Connection, ConnectionClosed


@dataclass
class StoreParts:
    """What the role shares with its store: given once, at the store's construction."""

    index: int  # this memory host's index: it names the batches it sends
    flow: FlowControl  # the credits and rate limiter both sides move
    changed: Pulse  # fired on every change a sampler may wait for
    tally: Tally  # rows in and out, rows refused
    phase: Callable[[], Phase]  # the role's phase now
    log: logging.Logger
    actor_links: list[ActorLink]  # the role's own list: every actor connection, open or closed
    newest_version: Callable[[int], int]  # the newest published weights version known without asking
    published_version: Callable[[], Awaitable[int]]  # the coordinator's newest version (may ask it)


class Store:
    """One memory host's data: filled by actors, drawn by learners on credits.

    Subclasses declare `actor_kind` (and `learner_kinds` where a learner sends more than credits)
    and implement `wanted`, `build`, `accept` and `serve`; every other hook does nothing unless a
    store needs it.
    """

    actor_kind: ClassVar[str]  # the message kind actors send it ("batch", "fragment", "rollout")
    learner_kinds: frozenset[str] = frozenset({"credit"})  # what a learner may send besides learner_done

    def __init__(self, parts: StoreParts):
        self.parts = parts
        self.index = parts.index
        self.phase = parts.phase
        self.flow = parts.flow
        self.changed = parts.changed
        self.tally = parts.tally
        self.log = parts.log

    # ------------------------------------------------------------------ what the algorithm declares

    @classmethod
    def wanted(cls, cfg) -> bool:
        """Whether the configured algorithm keeps its data in this kind of store."""
        raise NotImplementedError

    @classmethod
    def limiter(cls, cfg):
        """The flow's limiter from the role's start (the store may set another once built)."""
        return None

    @classmethod
    def build(cls, cfg, algo, parts: StoreParts, rows, layout) -> Store:
        """This store for `algo`'s run: `rows` checks what actors send, `layout` is the frame layout or None."""
        raise NotImplementedError

    @classmethod
    def bytes_per_row(cls, cfg, algo, layout) -> int:
        """Bytes one row of ``agent.buffer_size`` takes at least once the store is full (0: its
        memory does not grow with the capacity); the preflight holds the capacity to the machine's
        memory by it (`aiorl.runtime.memory.build.replay_bytes`)."""
        return 0

    # ------------------------------------------------------------------ the actor side

    def actor_opened(self, link: ActorLink) -> None:
        """An actor connection attached (before its first message)."""

    def accept(self, link: ActorLink, msg, fields: dict) -> Awaitable[None] | None:
        """One checked `actor_kind` message from `link`; what it returns is awaited before the next."""
        raise NotImplementedError

    def actor_closed(self, link: ActorLink) -> None:
        """`link`'s connection ended (`link.done_meta` is None when the actor did not finish)."""

    def on_role_lost(self, actor_index: int, returns: bool) -> None:
        """The coordinator declared actor `actor_index` lost (`returns`: it has a restart left)."""

    def on_role_back(self, actor_index: int, iteration: int) -> None:
        """A restarted actor was admitted; synchronous: it acts from `iteration` on."""

    # ------------------------------------------------------------------ the learner side

    async def serve(self, conn: Connection, link: LearnerLink, learner_index: int) -> None:
        """Send `link` its batches on its credits until none will come, then ``end``."""
        raise NotImplementedError

    def on_credit(self, fields: dict) -> None:
        """A learner's credit (or the credit its priorities carried) was granted; `fields` are its own."""

    def on_priorities(self, link: LearnerLink, msg) -> None:
        """A learner's priority update (only where `learner_kinds` has ``priorities``)."""
        raise BadMessage(f"{link.name} sent priorities, but this memory host keeps none")

    # ------------------------------------------------------------------ the role's life

    def on_phase(self, phase: Phase) -> None:
        """The role entered `phase`."""

    def announce(self, bind: str, port: int) -> None:
        """Say where and what this store serves, once the server is up."""
        self.log.info("serving replay on %s:%s (capacity %d)", bind, port, self.capacity())

    def size(self) -> int:
        """Rows held now (``replay_size``)."""
        return 0

    def capacity(self) -> int:
        """Rows it may hold (``replay_capacity``)."""
        return 0

    def metrics(self) -> dict:
        """Gauges of its own, reported first in the role's metrics."""
        return {}

    def summary(self) -> dict:
        """Its part of the role's summary: these five keys, the role places them."""
        return {"replay_size": 0, "replay_added": 0, "replay_frames": None, "queue": None, "rounds": None}

    # ------------------------------------------------------------------ snapshots

    def restore(self, snapshots: ReplaySnapshots) -> None:
        """Start from the last snapshot, where this store keeps them."""

    def snapshots_every(self, snapshots: ReplaySnapshots, interval_s: float) -> Coroutine | None:
        """The task that snapshots it every `interval_s`; None: it keeps none."""
        return None

    async def save(self, snapshots: ReplaySnapshots) -> None:
        """Its snapshot at the end of the run, where it keeps them."""


async def send_end(conn: Connection, link: LearnerLink, memory_index: int) -> None:
    """Tell a learner that this memory host sends it nothing more."""
    try:
        await conn.send("end", {"memory": memory_index, "batches_sent": link.batches_sent})
    except ConnectionClosed:
        pass
