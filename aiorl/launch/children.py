"""A role's process as the local launcher sees it: its `Child` record, how its exit reads, and
how it is ended (its whole process group: each role leads a session of its own)."""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from aiorl.launch.role_logs import failure_cause
from aiorl.launch.spawner import is_forked


def end_group(proc) -> None:
    """SIGKILL a role's process and its whole process group (each role leads a session of its own),
    if it still runs: whatever it started dies with it."""
    if proc.poll() is not None:
        return
    if is_forked(proc) or not isinstance(proc, subprocess.Popen):
        # A child of the warm spawner: the spawner, its parent, kills the group before it reaps it.
        # A process placed elsewhere (Ray): its pid means nothing on this host; it ends as it says.
        proc.kill()
        return
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # started with a session of its own: its pid is its group's
    except (ProcessLookupError, PermissionError):
        proc.kill()


@dataclass
class Child:
    name: str
    proc: subprocess.Popen
    started: float = field(default_factory=time.monotonic)
    handled: bool = False  # its exit was seen (and a restart decided)
    log: Path | None = None  # its log, written from `log_from` on (earlier: its predecessors')
    log_from: int = 0

    def cause(self) -> str:
        """What its log says it failed of, as ": CAUSE" to follow its exit in a line; "" if nothing."""
        cause = failure_cause(self.log, self.log_from) if self.log is not None else None
        return f": {cause}" if cause else ""

    @property
    def pid(self) -> int:
        return self.proc.pid


def die_with_parent() -> None:  # runs in the child between fork and exec
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def describe_exit(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        return f"killed by {signal.Signals(-code).name}"
    meaning = {
        0: "ok",
        1: "error",
        2: "failed",
        3: "lost the coordinator",
        4: "refused by the coordinator",
        130: "interrupted (SIGINT)",
        143: "interrupted (SIGTERM)",
    }
    return f"exit code {code} ({meaning.get(code, 'error')})"
