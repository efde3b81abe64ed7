"""Work items handed out by the coordinator for synchronous algorithms whose
iteration is a fixed set of independent items (ES: one antithetic pair of
perturbations per item), so that the items per iteration do not depend on
the number of actors and a slow actor holds up only the items it took.

A sans-I/O state machine: the coordinator drives it and does the waiting.

- `start(iteration)` opens an iteration (when its weights are published):
  items ``0..n-1`` become pending, in order.
- `take(worker)` leases the next pending item to `worker` (None when none is
  pending: every item is leased or done, or no iteration is open).
- `finish(worker, iteration, item)` ends a lease: the result went to a memory.
- `release(worker)` gives the items `worker` holds back (it was lost), at the
  front of the queue; another worker takes them. Should the lost worker's
  result still arrive, the memory keeps the first copy of an item.
"""

from __future__ import annotations

import collections


class WorkQueue:
    def __init__(self, items_per_iteration: int):
        if items_per_iteration < 1:
            raise ValueError(f"WorkQueue: items_per_iteration must be >= 1, got {items_per_iteration}")
        self.items_per_iteration = items_per_iteration
        self.iteration = -1
        self.pending: collections.deque[int] = collections.deque()
        self.leases: dict[int, str] = {}  # item -> worker holding it
        self.finished = 0
        self.released = 0  # items given back by lost workers, over the run

    def __repr__(self) -> str:
        return (
            f"<WorkQueue iteration={self.iteration} pending={len(self.pending)} leased={len(self.leases)} "
            f"finished={self.finished}/{self.items_per_iteration}>"
        )

    def start(self, iteration: int) -> None:
        if iteration <= self.iteration:
            raise ValueError(f"WorkQueue.start: iteration {iteration} after {self.iteration}")
        self.iteration = iteration
        self.pending = collections.deque(range(self.items_per_iteration))
        self.leases = {}
        self.finished = 0

    def take(self, worker: str) -> int | None:
        if not self.pending:
            return None
        item = self.pending.popleft()
        self.leases[item] = worker
        return item

    def finish(self, worker: str, iteration: int, item: int) -> bool:
        """End `worker`'s lease on `item` of `iteration`; False if it held none (stale or released)."""
        if iteration != self.iteration or self.leases.get(item) != worker:
            return False
        del self.leases[item]
        self.finished += 1
        return True

    def release(self, worker: str) -> list[int]:
        """Put `worker`'s leased items back in front of the queue; return them."""
        items = sorted(item for item, holder in self.leases.items() if holder == worker)
        for item in items:
            del self.leases[item]
        self.pending.extendleft(reversed(items))
        self.released += len(items)
        return items
