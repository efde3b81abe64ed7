"""A reusable async barrier with generations over a changing set of participants."""

from __future__ import annotations

import asyncio


class BarrierAborted(Exception):
    """The barrier was aborted (the run is stopping) while a participant waited."""


class Barrier:
    """Participants call ``await wait(name, generation)``; all return once every
    *live* participant has arrived at that generation.

    Generations let the same barrier be reused every iteration without a reset
    race: a fast participant arriving at generation k+1 never releases or joins
    generation k. Removing a participant (it died) re-checks every open
    generation, so the survivors are not held forever. A participant added
    with `from_generation` (a restarted actor joining at the next iteration)
    is waited for from that generation on, never in the ones already open.
    """

    def __init__(self, participants=()):
        self.participants: set[str] = set(participants)
        self._joins: dict[str, int] = {}  # participant -> the first generation it is counted in
        self._arrived: dict[int, set[str]] = {}
        self._released: dict[int, asyncio.Future] = {}
        self.last_released = -1
        self.aborted: str | None = None  # once aborted, every wait fails at once

    def __repr__(self) -> str:
        open_gens = {g: len(a) for g, a in self._arrived.items()}
        return f"<Barrier participants={len(self.participants)} open={open_gens} last_released={self.last_released}>"

    def add(self, participant: str, from_generation: int = 0) -> None:
        self.participants.add(participant)
        if from_generation > 0:
            self._joins[participant] = from_generation
        else:
            self._joins.pop(participant, None)

    def remove(self, participant: str) -> None:
        self.participants.discard(participant)
        self._joins.pop(participant, None)
        for generation in sorted(self._arrived):
            self._check(generation)

    async def wait(self, participant: str, generation: int) -> None:
        if self.aborted is not None:
            raise BarrierAborted(self.aborted)
        if participant not in self.participants:
            raise ValueError(f"{participant!r} is not a participant of {self!r}")
        if generation < self._joins.get(participant, 0):
            raise ValueError(
                f"{participant!r} arrived at generation {generation}, before the one it joins "
                f"({self._joins[participant]})"
            )
        if generation <= self.last_released:
            raise ValueError(
                f"{participant!r} arrived at generation {generation}, already released "
                f"(last released {self.last_released})"
            )
        arrived = self._arrived.setdefault(generation, set())
        if participant in arrived:
            raise ValueError(f"{participant!r} arrived twice at generation {generation}")
        arrived.add(participant)
        future = self._released.get(generation)
        if future is None:
            future = self._released[generation] = asyncio.get_running_loop().create_future()
        self._check(generation)
        await asyncio.shield(future)

    def _check(self, generation: int) -> None:
        arrived = self._arrived.get(generation)
        if arrived is None or not self.expected(generation) <= arrived:
            return
        del self._arrived[generation]
        future = self._released.pop(generation)
        self.last_released = max(self.last_released, generation)
        if not future.done():
            future.set_result(None)

    def expected(self, generation: int) -> set[str]:
        """The participants that generation `generation` waits for."""
        return {p for p in self.participants if self._joins.get(p, 0) <= generation}

    def abort(self, reason: str) -> None:
        self.aborted = reason
        for future in self._released.values():
            if not future.done():
                future.set_exception(BarrierAborted(reason))
                future.exception()  # mark retrieved: a waiter may already be gone
        self._arrived.clear()
        self._released.clear()
