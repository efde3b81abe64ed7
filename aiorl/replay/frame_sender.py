"""Actor side of the frame layout: number each new frame once, send it once per memory.

`FrameSender` turns the stacked observations an actor's envs return into
frame references (``[k]`` int64 ids per observation), keeps the recent
frames, and builds the batch messages of `aiorl.replay.frames` for each
memory host: the rows with their ids, and only the frames that memory does
not hold yet. Ids come from one counter per actor; a frame enters a stack as
its newest entry and leaves it k steps later, so live ids always fall in a
window the memory host can check (`FrameLayout.window`).

A step's stack is matched against the env's previous one: when the older
k - 1 frames are the previous stack's newer ones (frame stacking), only the
newest frame gets an id; otherwise (an episode start, or an observation that
is not a stack after all) every frame does, equal neighbours sharing one (the
padding of a reset stack). The match compares contents, so no assumption
about the env can make a stored observation differ from the one the env gave.

Whole trajectory fragments (IMPALA) reuse this unchanged: encode each step's
observations with `advance` / `fresh`, then `message` builds the fragment's
arrays with the frames the receiver lacks; the receiver rebuilds stacks from
a `FrameStream` + `FramePool` (`FramePool.take` on the resolved slots).
"""

from __future__ import annotations

from collections import deque

import numpy as np

from aiorl.replay.frames import FrameLayout, lz4_block


class FrameSender:
    """`FrameSender(layout, num_envs, memories, lookback_steps, compression="none")` for one actor.

    compression "lz4": a message's new frames travel as one lz4 block (``frames_lz4``)
    instead of raw ``frames`` (see `aiorl.replay.frames`).
    """

    def __init__(
        self, layout: FrameLayout, num_envs: int, memories: int, lookback_steps: int, compression: str = "none"
    ):
        self.layout = layout
        self.compression = compression
        self._lz4 = lz4_block() if compression == "lz4" else None
        self.window = layout.window
        self._mask = layout.window - 1
        self.next_id = 0
        # The last `window` frames by id (id & mask): enough for any id still referenced.
        self._cache = np.zeros((layout.window,) + layout.frame_shape, layout.dtype)
        self._cache_ids = np.full(layout.window, -1, np.int64)
        # Per memory: the ids it holds, as it keys them (id & mask), and its keep_from.
        self._held = [np.full(layout.window, -1, np.int64) for _ in range(memories)]
        self._keep_from = [0] * memories
        # Oldest id among the observations of the last lookback + 1 steps: rows still to
        # come start at one of them.
        self._recent_min: deque[int] = deque(maxlen=lookback_steps + 1)
        self.frames_sent = 0
        self.rows_sent = 0

    def __repr__(self) -> str:
        return (
            f"<FrameSender next_id={self.next_id} window={self.window} frames_sent={self.frames_sent} "
            f"rows_sent={self.rows_sent}>"
        )

    # ------------------------------------------------------------------ encoding

    def _new_ids(self, frames: np.ndarray) -> np.ndarray:
        n = len(frames)
        ids = np.arange(self.next_id, self.next_id + n, dtype=np.int64)
        self.next_id += n
        pos = ids & self._mask
        self._cache[pos] = frames
        self._cache_ids[pos] = ids
        return ids

    def fresh(self, stack: np.ndarray) -> np.ndarray:
        """Ids of a stack seen for the first time (equal neighbours share one id)."""
        k = len(stack)
        repeat = np.zeros(k, bool)
        for j in range(1, k):
            repeat[j] = np.array_equal(stack[j], stack[j - 1])
        ids = np.empty(k, np.int64)
        ids[~repeat] = self._new_ids(stack[~repeat])
        for j in range(1, k):
            if repeat[j]:
                ids[j] = ids[j - 1]
        return ids

    def advance(self, refs: np.ndarray, previous: np.ndarray, stack: np.ndarray) -> np.ndarray:
        """Ids of `stack`, the observation after `previous` (whose ids are `refs`)."""
        if np.array_equal(stack[:-1], previous[1:]):
            out = np.empty_like(refs)
            out[:-1] = refs[1:]
            out[-1] = self._new_ids(stack[-1:])[0]
            return out
        return self.fresh(stack)

    def note_current(self, refs: np.ndarray) -> None:
        """The ids of the envs' current observations ([num_envs, k]), once per env step."""
        self._recent_min.append(int(refs.min()))

    # ------------------------------------------------------------------ decoding and sending

    def frames_of(self, ids: np.ndarray) -> np.ndarray:
        """The cached frames of `ids` (any shape S): (*S, *frame_shape)."""
        pos = ids & self._mask
        if not np.array_equal(self._cache_ids[pos], ids):
            raise RuntimeError(
                f"FrameSender: frame ids {ids.min()}..{ids.max()} are no longer cached "
                f"(newest {self.next_id - 1}, window {self.window})"
            )
        return self._cache[pos]

    def decode(self, batch: dict) -> dict:
        """`batch` with its frame fields turned back into stacked observations."""
        out = dict(batch)
        for name in self.layout.fields:
            if name in out:
                out[name] = self.frames_of(np.asarray(out[name]))
        return out

    def forget(self, memory: int) -> None:
        """`memory` holds none of our frames any more (a new connection: a new frame stream)."""
        self._held[memory].fill(-1)
        self._keep_from[memory] = 0

    def message(self, memory: int, batch: dict) -> tuple[dict, int]:
        """(arrays, keep_from) of a batch message to `memory`: the rows, plus ``frames`` (or
        ``frames_lz4``) and ``frame_ids`` for every id the rows reference that `memory` does
        not hold."""
        refs = np.concatenate([np.asarray(batch[f]).reshape(-1) for f in self.layout.fields])
        future = min(self._recent_min) if self._recent_min else self.next_id
        # Never below the last keep_from sent to this memory: rows still to come start
        # no earlier than the observations this one's future part was taken from.
        keep_from = min(future, int(refs.min())) if len(refs) else future
        held = self._held[memory]
        ids = np.unique(refs)
        new = ids[held[ids & self._mask] != ids]
        # The memory frees what it held below keep_from, then keys each new id by
        # id & mask: a slot still holding a kept id would be displaced.
        holders = held[new & self._mask]
        if ((holders >= keep_from) & (holders != new)).any() or (len(new) and new[-1] - new[0] >= self.window):
            raise RuntimeError(
                f"FrameSender: ids {new.min()}..{new.max()} do not fit the window {self.window} "
                f"with keep_from {keep_from}"
            )
        held[new & self._mask] = new
        self._keep_from[memory] = keep_from
        arrays = dict(batch)
        frames = self.frames_of(new)
        if self._lz4 is not None:
            arrays["frames_lz4"] = np.frombuffer(self._lz4.compress(frames, store_size=False), np.uint8)
        else:
            arrays["frames"] = frames
        arrays["frame_ids"] = new
        self.frames_sent += len(new)
        self.rows_sent += len(next(iter(batch.values())))
        return arrays, keep_from
