"""The parameter store: the weights learner 0 publishes, their version, and the waits for one.

Actors load published weights as they are, so a publication is checked against the
algorithm's weights spec before it is kept; the arrays kept are views over the frame
received (keeping them is free).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import numpy as np

from aiorl.runtime.messages import RowSpec

WEIGHTS_PUBLISHED_KEPT = 32  # summary.json: weights_published_monotonic holds the first 32 only


class ParameterStore:
    def __init__(self):
        self.weights: dict[str, np.ndarray] = {}
        self.weights_version = -1
        self.weights_changed = asyncio.Condition()
        # (version, time.monotonic()) of the first publications: what a test needs to check that
        # iteration k started after version k, without a long run's list bloating summary.json.
        self.weights_published: list[tuple[int, float]] = []
        self._rows: RowSpec | None = None

    def set_spec(self, spec: dict | None) -> None:
        """The arrays a publication must hold (`Algorithm.weights_spec`); None: not checked."""
        self._rows = RowSpec(spec) if spec is not None else None

    async def publish(self, arrays: dict[str, np.ndarray]) -> int:
        """Keep `arrays` as the next version (BadMessage if they do not match the spec); wake waiters."""
        if self._rows is not None:  # actors load these as they are: refuse what they could not
            self._rows.rows("publish", {k: v[None] for k, v in arrays.items()})
        async with self.weights_changed:
            self.weights = dict(arrays)
            self.weights_version += 1
            if len(self.weights_published) < WEIGHTS_PUBLISHED_KEPT:
                self.weights_published.append((self.weights_version, time.monotonic()))
            self.weights_changed.notify_all()
        return self.weights_version

    async def wake(self) -> None:
        """Wake every waiter to re-check (the phase changed: actors waiting learn the run stopped)."""
        async with self.weights_changed:
            self.weights_changed.notify_all()

    async def wait_for(self, min_version: int, stopped: Callable[[], bool]) -> bool:
        """Wait until weights of `min_version` or newer are held, or `stopped()`; True when held.

        Weights held, not only a version: a resumed run's version comes from its
        checkpoint before learner 0 has published anything.
        """
        async with self.weights_changed:
            await self.weights_changed.wait_for(
                lambda: (self.weights and self.weights_version >= int(min_version)) or stopped()
            )
        return bool(self.weights) and self.weights_version >= int(min_version)

    def newer_than(self, have: int) -> dict[str, np.ndarray] | None:
        """The weights if newer than version `have`, else None."""
        return self.weights if self.weights_version > have else None
