"""What the memory host keeps per connection (`ActorLink`, `LearnerLink`) and
`Pulse`, the wake-up its store's actor and learner sides share."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from aiorl.wire import Connection


class Pulse:
    """Wakes a waiter when state changes and its predicate now holds.

    Predicates are checked in `fire` (they are cheap reads of the memory's
    state), so a change that enables nobody wakes no task: the sampler sees
    every insert, but with a learner batch of 512 and rate limiting only one
    insert in eight lets it send.
    """

    def __init__(self):
        self._waiters: list[tuple[object, asyncio.Future]] = []

    def fire(self) -> None:
        if not self._waiters:
            return
        waiting = []
        for predicate, waiter in self._waiters:
            if waiter.done():  # its task was cancelled
                continue
            if predicate():
                waiter.set_result(None)
            else:
                waiting.append((predicate, waiter))
        self._waiters = waiting

    async def wait_for(self, predicate) -> None:
        while not predicate():
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append((predicate, waiter))
            await waiter


@dataclass
class ActorLink:
    """One actor connection (a restarted actor, or one that reconnected, makes a new one)."""

    name: str
    conn: Connection | None = None
    batches: int = 0
    transitions: int = 0
    next_seq: int = 0
    seq_errors: int = 0
    rows_rejected: int = 0  # rows a learner must not get (see aiorl.runtime.memory.tally)
    done_meta: dict | None = None  # the actor's own account, from its actor_done
    closed: bool = False
    frames: object = None  # frame layout: the FrameStream of this connection (its store opened it)
    credits: int = 0  # granted and not yet used (rate limiting only)
    granted: int = 0  # credits ever granted: ties go to the actor given the fewest
    unsent_credits: int = 0  # granted, not yet told to the actor
    credit_ready: asyncio.Event = field(default_factory=asyncio.Event)
    index: int = -1  # the actor's index (actor-<index>)

    def close(self) -> None:
        """The connection ended: its frame stream, if any, is released."""
        self.closed = True
        if self.frames is not None:
            self.frames.release()
            self.frames = None

    def stats(self) -> dict:
        return {
            "batches": self.batches,
            "transitions": self.transitions,
            "next_seq": self.next_seq,
            "seq_errors": self.seq_errors,
            "rows_rejected": self.rows_rejected,
            "finished": self.done_meta is not None,
        }


@dataclass
class LearnerLink:
    name: str
    credits: int = 0
    beta: float = 0.4
    iteration: int | None = None  # sync mode: the iteration the learner asks for
    next_iteration: int = 0  # sync mode: the iteration after the last one it got
    batches_sent: int = 0
    priority_messages: int = 0
    priorities_applied: int = 0
    priorities_stale: int = 0
    priorities_rejected: int = 0  # non-finite or negative priorities, not applied
    done_meta: dict | None = None
    finished: asyncio.Event = field(default_factory=asyncio.Event)
