"""Progress of a run as the launcher shows it, read from the run's metrics.jsonl.

On a terminal: a live rich panel (progress bar toward the stop criterion with
ETA, env and learner rates, recent return, replay fill, phase, and a line per
role that is late or lost). Elsewhere (CI, files): one plain line every few
seconds, with no control characters. ``--quiet`` shows nothing.
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


def summary_line(row: dict) -> str:
    fill = row.get("replay_fill")
    return (f"env {_fmt(row.get('env_steps_per_s'), ',.0f')}/s  "
            f"learner {row.get('learner_steps', 0):,} ({_fmt(row.get('learner_steps_per_s'), ',.0f')}/s)  "
            f"return {_fmt(row.get('return_mean_100'))}  "
            f"replay {row.get('replay_size', 0):,}{'' if fill is None else f' ({100 * fill:.0f}%)'}")


def role_problems(row: dict) -> list[str]:
    return ([f"{name} is late (no heartbeat for 2 intervals)" for name in row.get("roles_late") or []]
            + [f"{name} is lost" for name in row.get("roles_lost") or []])


class Progress:
    def __init__(self, cfg: Config, run_dir: Path, quiet: bool = False, stream=None):
        self.cfg = cfg
        self.run_dir = run_dir
        self.stream = stream or sys.stdout
        self.quiet = quiet
        self.tail = MetricsTail(run_dir / "metrics.jsonl")
        self.live = None
        self.last_plain = 0.0
        self.printed: dict | None = None
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
        from rich.live import Live
        from rich.progress import BarColumn, MofNCompleteColumn, Progress as Bar, TextColumn, \
            TimeElapsedColumn, TimeRemainingColumn

        self.bar = Bar(TextColumn(f"[bold]{self.goal_key}"), BarColumn(), MofNCompleteColumn(),
                       TextColumn("elapsed"), TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn())
        self.task = self.bar.add_task(self.goal_key, total=self.goal)
        self.live = Live(self._render({}), console=Console(file=self.stream), refresh_per_second=4,
                         transient=False)
        self.live.start()

    def _render(self, row: dict):
        from rich.console import Group
        from rich.panel import Panel
        from rich.table import Table
        from rich.text import Text

        table = Table.grid(padding=(0, 2))
        for _ in range(4):
            table.add_column()
        fill = row.get("replay_fill")
        table.add_row("phase", f"[bold]{row.get('phase', 'STARTING')}", "roles alive", str(row.get("roles_alive", "-")))
        table.add_row("env steps/s", _fmt(row.get("env_steps_per_s"), ",.0f"),
                      "learner steps/s", _fmt(row.get("learner_steps_per_s"), ",.0f"))
        table.add_row("return (100 ep.)", _fmt(row.get("return_mean_100"), ".2f"),
                      "replay", f"{row.get('replay_size', 0):,}" + ("" if fill is None else f" ({100 * fill:.0f}%)"))
        table.add_row("episodes", f"{row.get('episodes', 0):,}", "weights version", str(row.get("weights_version", "-")))
        problems = [Text(line, style="bold red") for line in role_problems(row)]
        return Panel(Group(self.bar, table, *problems), title=f"aiorl {self.cfg.algo} on {self.cfg.env.id}",
                     subtitle=str(self.run_dir), expand=False)

    def stop(self) -> None:
        if self.live is not None:
            self.update()
            self.live.stop()
            self.live = None

    def update(self) -> None:
        if self.quiet:
            return
        row = self.tail.poll()
        if row is None:
            return
        if self.live is not None:
            self.bar.update(self.task, completed=row.get(self.goal_key, 0))
            self.live.update(self._render(row))
            return
        now = time.monotonic()
        final = row.get("phase") == "EXITED" and row is not self.printed
        if (now - self.last_plain >= PLAIN_INTERVAL_S and row is not self.printed) or final:
            self.last_plain = now
            self.printed = row
            done = row.get(self.goal_key, 0)
            goal = f"/{self.goal} ({100 * min(done / self.goal, 1):.0f}%)" if self.goal else ""
            problems = "; ".join(role_problems(row))
            print(f"[{row.get('time_s', 0):7.1f}s] {row.get('phase', '?'):<8} {self.goal_key} {done:,}{goal}  "
                  f"{summary_line(row)}" + (f"  !! {problems}" if problems else ""), file=self.stream, flush=True)
