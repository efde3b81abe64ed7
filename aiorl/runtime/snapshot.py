"""Replay snapshots of a memory host: ``RUN_DIR/replay-memory-<i>.npz``.

The file is the replay core's own state format (``state_dict``, see
`aiorl.replay`: plain arrays in an .npz, read back with ``allow_pickle=False``;
zip CRC-32s catch a damaged file), written atomically (temporary file, fsync,
rename). Sampling pauses only while the live rows are copied, on the event
loop (the live storage must not change under the copy); writing the copy
(uncompressed) runs in a worker thread while sampling goes on. The
longest pause is reported (``snapshot_pause_max_s`` in the memory's stats).

A memory host that starts (a resumed run, or a restarted memory host) loads
its snapshot when there is one; one that does not fit (a changed buffer size
or spec) or does not read back is named in the log and the shard starts empty.
"""

from __future__ import annotations

import asyncio
import logging
import time
import zipfile
from pathlib import Path

import numpy as np

from aiorl.io.checkpoint import atomic_write


def snapshot_path(run_dir: Path, memory_name: str) -> Path:
    return Path(run_dir) / f"replay-{memory_name}.npz"


class ReplaySnapshots:
    def __init__(self, path: Path, log: logging.Logger):
        self.path = path
        self.log = log
        self.saved = 0
        self.pause_max_s = 0.0
        self.restored_rows: int | None = None
        self._lock = asyncio.Lock()

    def __repr__(self) -> str:
        return f"<ReplaySnapshots {self.path.name} saved={self.saved} pause_max_s={self.pause_max_s:.4f}>"

    def restore(self, replay) -> int | None:
        """Load the snapshot into `replay` if there is one; the rows restored, or None."""
        if not self.path.exists():
            return None
        try:
            replay.load(self.path)
        except (ValueError, OSError, KeyError, EOFError, zipfile.BadZipFile) as exc:
            self.log.error(
                "replay snapshot %s not restored (%s: %s); this shard starts empty", self.path, type(exc).__name__, exc
            )
            return None
        self.restored_rows = len(replay)
        self.log.info("restored %d transitions from %s", self.restored_rows, self.path)
        return self.restored_rows

    async def save(self, replay) -> None:
        """Copy the live rows (the only pause in sampling), then write the copy in a thread."""
        async with self._lock:  # one write at a time: a slow disk does not pile up copies
            t0 = time.perf_counter()
            state = {key: np.array(value) for key, value in replay.state_dict().items()}
            pause = time.perf_counter() - t0
            self.pause_max_s = max(self.pause_max_s, pause)
            await asyncio.to_thread(atomic_write, self.path, lambda f: np.savez(f, **state))
            self.saved += 1
            self.log.info(
                "replay snapshot %s: %d transitions (sampling paused %.3f s for the copy)",
                self.path.name,
                len(replay),
                pause,
            )

    async def run_every(self, replay, interval_s: float) -> None:
        while True:
            await asyncio.sleep(interval_s)
            await self.save(replay)

    def stats(self) -> dict:
        return {
            "snapshot": str(self.path) if self.saved else None,
            "snapshots_saved": self.saved,
            "snapshot_pause_max_s": round(self.pause_max_s, 6),
            "snapshot_restored_rows": self.restored_rows,
        }
