"""Progress of a run as the launcher shows it, read from the run's metrics.jsonl.

On a terminal: a live rich panel (progress bar toward the stop criterion with
ETA, rates, return, replay fill, phase). Elsewhere (CI, files): one plain line
every few seconds, without control characters. ``--quiet`` shows nothing.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from aiorl.config import Config

PLAIN_INTERVAL_S = 5.0


def _fmt(value, spec: str = ".1f", none: str = "-") -> str:
    return none if value is None else format(value, spec)


class MetricsTail:
    """Reads the rows appended to a metrics.jsonl since the last call."""

    def __init__(self, path: Path):
        self.path = path
        self.offset = 0
        self.partial = ""
        self.last: dict | None = None

    def poll(self) -> dict | None:
        if not self.path.exists():
            return self.last
        with open(self.path) as f:
            f.seek(self.offset)
            data = f.read()
            self.offset = f.tell()
        lines = (self.partial + data).split("\n")
        self.partial = lines.pop()
        for line in lines:
            if line.strip():
                self.last = json.loads(line)
        return self.last


class Progress:
    def __init__(self, cfg: Config, run_dir: Path, quiet: bool = False, stream=None):
        self.cfg = cfg
        self.stream = stream or sys.stdout
        self.quiet = quiet
        self.tail = MetricsTail(run_dir / "metrics.jsonl")
        self.live = None
        self.last_plain = 0.0
        a = cfg.agent
        if a.scheduled_timesteps:
            self.goal_key, self.goal = "env_steps", a.scheduled_timesteps
        elif a.scheduled_global_steps:
            self.goal_key, self.goal = "learner_steps", a.scheduled_global_steps
        else:
            self.goal_key, self.goal = "env_steps", None

    def start(self) -> None:
        if self.quiet or not self.stream.isatty():
            return
        from rich.console import Console
        from rich.progress import BarColumn, Progress as RichProgress, TextColumn, TimeElapsedColumn, \
            TimeRemainingColumn

        self.live = RichProgress(
            TextColumn("[bold]{task.fields[phase]:<9}"),
            BarColumn(),
            TextColumn("{task.completed:>9.0f}/{task.total:<9.0f}" if self.goal else "{task.completed:>9.0f}"),
            TimeElapsedColumn(), TimeRemainingColumn(),
            TextColumn("{task.fields[line]}"),
            console=Console(file=self.stream), transient=False,
        )
        self.task = self.live.add_task(self.goal_key, total=self.goal, phase="STARTING", line="")
        self.live.start()

    def stop(self) -> None:
        if self.live is not None:
            self.update()
            self.live.stop()
            self.live = None

    def line(self, row: dict) -> str:
        return (f"env_steps/s {_fmt(row.get('env_steps_per_s'), '.0f')}  "
                f"learner_steps {row.get('learner_steps', 0)} ({_fmt(row.get('learner_steps_per_s'), '.0f')}/s)  "
                f"return {_fmt(row.get('return_mean_100'))}  replay {row.get('replay_size', 0)}  "
                f"roles {row.get('roles_alive', '-')}")

    def update(self) -> None:
        if self.quiet:
            return
        row = self.tail.poll()
        if row is None:
            return
        if self.live is not None:
            self.live.update(self.task, completed=row.get(self.goal_key, 0), phase=row.get("phase", ""),
                             line=self.line(row))
            return
        now = time.monotonic()
        if now - self.last_plain >= PLAIN_INTERVAL_S:
            self.last_plain = now
            done = row.get(self.goal_key, 0)
            goal = f"/{self.goal} ({100 * done / self.goal:.0f}%)" if self.goal else ""
            print(f"[{row.get('time_s', 0):7.1f}s] {row.get('phase', '?'):<8} {self.goal_key} {done}{goal}  "
                  f"{self.line(row)}", file=self.stream, flush=True)
