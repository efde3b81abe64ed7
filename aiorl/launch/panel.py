"""Progress of a run as the launcher shows it, read from the run's metrics.jsonl and role logs.

On a terminal: a live rich panel: a bar toward the stop criterion with its ETA,
env and learner steps (totals, and rates over the last `RATE_WINDOW_S`
seconds of rows rather than between two rows, so a short last interval is no
spike), the return, the learner's loss and exploration as the algorithm
names them (`AlgorithmSettings.panel_metrics`), replay fill, the phase, roles that
are late or lost, and a count of the warnings and errors in the role logs
with the latest one's first line. Roles write stderr into their logs, so
nothing they print tears the panel. The last frame shows the stop reason, the
final counters (those of summary.json), roles alive 0, no ETA, and the next
command.

Elsewhere (CI, files): one plain line every few seconds, and each warning or
error of a role as a line of its own (the first `MAX_PLAIN_PROBLEMS`, then
only counted), with no control characters. ``--quiet`` shows nothing; the
launcher's closing lines still count the problems.
"""

from __future__ import annotations

import json
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from aiorl.algos import get_settings
from aiorl.config import Config
from aiorl.core.console import aiorl_command
from aiorl.io.export import LEGACY_POLICY_FILE, POLICY_FILE
from aiorl.launch.role_logs import RoleLogWatch

PLAIN_INTERVAL_S = 5.0
RATE_WINDOW_S = 10.0
MAX_PLAIN_PROBLEMS = 20


def _fmt(value, spec: str = ".1f", none: str = "-") -> str:
    return none if value is None else format(value, spec)


def _clock(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class MetricsTail:
    """Reads the rows appended to a metrics.jsonl since the last call."""

    def __init__(self, path: Path):
        self.path = path
        self.offset = 0
        self.partial = ""
        self.last: dict | None = None
        self.new_rows: list[dict] = []  # the rows the last poll read, oldest first

    def poll(self) -> dict | None:
        self.new_rows = []
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
                self.new_rows.append(self.last)
        return self.last


class RateWindow:
    """Env and learner steps per second over the rows of the last `window_s` seconds (row time)."""

    def __init__(self, window_s: float = RATE_WINDOW_S):
        self.window_s = window_s
        self.points: deque[tuple[float, int, int]] = deque()

    def add(self, row: dict) -> None:
        t = row.get("time_s")
        if t is None:
            return
        if self.points and t < self.points[-1][0]:
            self.points.clear()  # a new launch's clock
        self.points.append((float(t), int(row.get("env_steps") or 0), int(row.get("learner_steps") or 0)))
        # Keep the newest point that is at least window_s old: the window spans window_s.
        while len(self.points) > 2 and t - self.points[1][0] >= self.window_s:
            self.points.popleft()

    def rates(self) -> tuple[float | None, float | None]:
        """(env steps/s, learner steps/s); None until two rows are apart in time."""
        if len(self.points) < 2:
            return None, None
        (t0, e0, l0), (t1, e1, l1) = self.points[0], self.points[-1]
        if t1 <= t0:
            return None, None
        return (e1 - e0) / (t1 - t0), (l1 - l0) / (t1 - t0)


@dataclass
class PanelState:
    """Everything one frame shows; `render_panel` turns it into a renderable, with no clock or I/O."""

    title: str
    run_dir: Path
    goal_key: str
    goal: int | None
    panel_metrics: tuple[tuple[str, str], ...] = ()
    row: dict = field(default_factory=dict)
    env_rate: float | None = None
    learner_rate: float | None = None
    problems: str | None = None  # RoleLogWatch.summary()
    problem_kind: str | None = None  # "warning" or "error": the latest one's
    interrupted: bool = False
    final: dict | None = None  # summary.json, once the run has ended
    roles_alive: int | None = None  # the launcher's count at the end
    evaluation: dict | None = None  # the eval/* keys of the newest row that had them
    # What the memory hosts hold: "replay" (its size and fill), "queue" (IMPALA's fragments),
    # "dataset" (an offline run's rows) or None (the rounds of a synchronous algorithm: nothing
    # worth a line).
    store: str | None = "replay"
    # Seconds since this launch started (the launcher's clock); None: the row's time_s. A resumed
    # run's rows count from its first launch.
    elapsed_s: float | None = None

    def elapsed_text(self) -> str:
        run_s = self.row.get("time_s") or 0
        if self.elapsed_s is None:
            return f"elapsed {_clock(run_s)}"
        own = f"elapsed {_clock(self.elapsed_s)}"
        return own if run_s <= self.elapsed_s + 1 else f"{own} (run {_clock(run_s)})"

    @property
    def offline(self) -> bool:
        """An offline run: no actors, so epochs over its dataset where env steps would be."""
        return self.store == "dataset"

    def store_text(self) -> str | None:
        row = self.row
        if self.store == "dataset":
            return f"{row.get('replay_size', 0) or 0:,} rows"
        if self.store == "replay":
            fill = row.get("replay_fill")
            return f"{row.get('replay_size', 0) or 0:,}" + ("" if fill is None else f" ({100 * fill:.0f}%)")
        if self.store == "queue":
            size, capacity = row.get("queue/fragments"), row.get("queue/capacity")
            return f"{size or 0:,}" + (f"/{capacity:,} fragments" if capacity else " fragments")
        return None

    def eval_text(self) -> str | None:
        e = self.evaluation
        if not e:
            return None
        return (
            f"{_fmt(e.get('eval/return_mean'), '.2f')} ± {_fmt(e.get('eval/return_std'), '.1f')} "
            f"at step {_fmt(e.get('eval/learner_steps'), ',')} (best {_fmt(e.get('eval/best_return_mean'), '.2f')})"
        )

    def counters(self) -> dict:
        """The counters to show: the summary's at the end (so they match summary.json), else the row's."""
        source = self.final if self.final is not None else self.row
        return {k: source.get(k) for k in ("env_steps", "learner_steps", "episodes", "return_mean_100", "epochs")}

    def eta_s(self) -> float | None:
        if self.final is not None or self.interrupted or not self.goal:
            return None
        rate = self.env_rate if self.goal_key == "env_steps" else self.learner_rate
        done = self.counters()[self.goal_key] or 0
        if self.goal_key == "epochs":  # passes grow with learner steps: at the same rate, in their unit
            steps = self.counters()["learner_steps"] or 0
            rate = rate * done / steps if rate and done and steps else None
        if not rate or rate <= 0 or done >= self.goal:
            return None
        return (self.goal - done) / rate


def next_command(run_dir: Path) -> str | None:
    """What to do with a finished run's policy; None when there is none."""

    policy = run_dir / "policy"
    if not ((policy / POLICY_FILE).exists() or (policy / LEGACY_POLICY_FILE).exists()):
        return None
    return f"policy at {policy}; try `{aiorl_command()} eval {run_dir} --episodes 20`"


def stopped_at_note(final: dict) -> str | None:
    """The counters the stop was decided on, when the final ones (summary.json's) are past them: the
    work in flight at the stop finishes after it (actors' last batches, the learners' training
    while those arrive, and the batches they hold credits for)."""
    at = final.get("stopped_at") or {}
    if all(at[key] == final.get(key) for key in at):
        return None
    counts = ", ".join(f"{key} {at[key]:,}" for key in ("env_steps", "learner_steps") if key in at)
    return f"at the stop {counts} (the work in flight then finished after it)"


def stop_line(final: dict) -> str:
    """The stop reason, with the counters it was decided on where the final ones differ."""
    line = f"stopped: {final.get('stop_detail') or final.get('stop_reason') or '-'}"
    note = stopped_at_note(final)
    return f"{line}; {note}" if note else line


def render_panel(state: PanelState):
    from rich.console import Group
    from rich.panel import Panel
    from rich.progress_bar import ProgressBar
    from rich.table import Table
    from rich.text import Text

    row, counters = state.row, state.counters()
    phase = "EXITED" if state.final is not None else row.get("phase", "STARTING")
    alive = state.roles_alive if state.roles_alive is not None else row.get("roles_alive", "-")
    done = counters[state.goal_key] or 0
    bar_line = Table.grid(padding=(0, 1))
    bar_line.add_row(
        Text(state.goal_key, style="bold"),
        ProgressBar(total=state.goal or None, completed=min(done, state.goal) if state.goal else 0, width=30),
        _count(done) + (f"/{_count(state.goal)} ({100 * min(done / state.goal, 1):.0f}%)" if state.goal else ""),
        state.elapsed_text(),
        *([f"eta {_clock(state.eta_s())}"] if state.eta_s() is not None else []),
    )

    table = Table.grid(padding=(0, 2))
    for _ in range(4):
        table.add_column()
    table.add_row("phase", f"[bold]{phase}", "roles alive", str(alive))
    table.add_row(
        *(
            ("epochs", _count(counters["epochs"] or 0))
            if state.offline
            else ("env steps", f"{counters['env_steps'] or 0:,} ({_fmt(state.env_rate, ',.0f')}/s)")
        ),
        "learner steps",
        f"{counters['learner_steps'] or 0:,} ({_fmt(state.learner_rate, ',.0f')}/s)",
    )
    table.add_row(
        "return (100 ep.)", _fmt(counters["return_mean_100"], ".2f"), "episodes", f"{counters['episodes'] or 0:,}"
    )
    metrics = [(label, _fmt(row.get(key), ".4g")) for label, key in state.panel_metrics]
    for i in range(0, len(metrics), 2):
        pair = metrics[i : i + 2]
        table.add_row(*(cell for item in pair for cell in item), *([""] * (4 - 2 * len(pair))))
    if state.eval_text() is not None:
        table.add_row("last evaluation", state.eval_text(), "", "")
    store = state.store_text()
    table.add_row(
        state.store if store is not None else "",
        store or "",
        "weights version",
        str(row.get("weights_version", "-")),
    )
    lines = [bar_line, table]
    if state.final is None:
        lines += [Text(line, style="bold red") for line in role_problems(row)]
    if state.problems:
        lines.append(Text(state.problems, style="red" if state.problem_kind == "error" else "yellow"))
    if state.final is not None:
        lines.append(Text(stop_line(state.final), style="bold"))
        hint = next_command(state.run_dir)
        if hint:
            lines.append(Text(hint))
    return Panel(Group(*lines), title=state.title, subtitle=str(state.run_dir), expand=False)


def _count(value) -> str:
    """A counter as the panel shows it: steps with thousands separators, epochs (a float) to 2 places."""
    return f"{value:,.2f}" if isinstance(value, float) else f"{value:,}"


def summary_line(row: dict, env_rate=None, learner_rate=None, store: str | None = None) -> str:
    """The plain line's counters; `store`: PanelState.store_text()'s words, with its name. An offline
    run's row (it has ``epochs``) shows its passes over the dataset where env steps would be (0)."""
    env_rate = row.get("env_steps_per_s") if env_rate is None else env_rate
    learner_rate = row.get("learner_steps_per_s") if learner_rate is None else learner_rate
    first = (
        f"epochs {_fmt(row['epochs'], ',.2f')}  "
        if "epochs" in row
        else f"env {row.get('env_steps', 0):,} ({_fmt(env_rate, ',.0f')}/s)  "
    )
    return (
        first + f"learner {row.get('learner_steps', 0):,} ({_fmt(learner_rate, ',.0f')}/s)  "
        f"return {_fmt(row.get('return_mean_100'))}" + (f"  {store}" if store else "")
    )


def role_problems(row: dict) -> list[str]:
    return [f"{name} is late (no heartbeat for 2 intervals)" for name in row.get("roles_late") or []] + [
        f"{name} is lost" for name in row.get("roles_lost") or []
    ]


def _goal(cfg: Config) -> tuple[str, float | None]:
    """The counter the bar runs toward and its budget: env steps, learner steps, or an offline
    run's epochs over its dataset."""
    a = cfg.agent
    if a.scheduled_timesteps:
        return "env_steps", a.scheduled_timesteps
    if a.scheduled_global_steps:
        return "learner_steps", a.scheduled_global_steps
    if cfg.offline.dataset is not None:
        return "epochs", cfg.offline.epochs
    return "env_steps", None


class Progress:
    def __init__(self, cfg: Config, run_dir: Path, quiet: bool = False, stream=None, panel_metrics=None, on_row=None):
        self.cfg = cfg
        # Called with each metrics row as it is read (`aiorl.run(on_metrics=...)`), quiet or not;
        # the first exception it raises is kept in `on_row_error` and it is not called again.
        self.on_row = on_row
        self.on_row_error: Exception | None = None
        self.run_dir = run_dir
        self.stream = stream or sys.stdout
        self.quiet = quiet
        self.tail = MetricsTail(run_dir / "metrics.jsonl")
        self.logs = RoleLogWatch(run_dir / "logs")
        self.rates = RateWindow()
        self.live = None
        self.last_plain = 0.0
        self.printed: dict | None = None
        self.plain_problems = 0
        goal_key, goal = _goal(cfg)
        settings = get_settings(cfg.algo)
        if panel_metrics is None:
            panel_metrics = settings.panel_metrics
        self.state = PanelState(f"aiorl {cfg.algo} on {cfg.subject}", run_dir, goal_key, goal, tuple(panel_metrics))
        self.state.store = (
            "replay" if settings.keeps_replay(cfg) else "queue" if settings.fragment_queue(cfg) is not None else None
        )
        if cfg.offline.dataset is not None:
            self.state.store = "dataset"  # its memory hosts serve the rows of a dataset
        self.t0 = time.monotonic()

    @property
    def goal_key(self) -> str:
        return self.state.goal_key

    @property
    def goal(self) -> int | None:
        return self.state.goal

    def start(self) -> None:
        if self.quiet or not self.stream.isatty():
            return
        from rich.console import Console
        from rich.live import Live

        self.live = Live(
            render_panel(self.state), console=Console(file=self.stream), refresh_per_second=4, transient=False
        )
        self.live.start()

    def interrupted(self) -> None:
        """A signal stopped the run: no ETA from now on."""
        self.state.interrupted = True

    def _read(self) -> dict | None:
        row = self.tail.poll()
        for new in self.tail.new_rows:
            self.rates.add(new)
            if "eval/return_mean" in new:
                self.state.evaluation = {k: v for k, v in new.items() if k.startswith("eval/")}
            self._tell(new)
        problems = self.logs.poll()
        s = self.state
        if row is not None:
            s.row = row
        s.elapsed_s = time.monotonic() - self.t0
        s.env_rate, s.learner_rate = self.rates.rates()
        s.problems = self.logs.summary()
        s.problem_kind = self.logs.latest.kind if self.logs.latest else None
        if self.live is None and not self.quiet:
            for problem in problems:
                self.plain_problems += 1
                if self.plain_problems <= MAX_PLAIN_PROBLEMS:
                    print(f"aiorl: {problem.line()}", file=self.stream, flush=True)
                elif self.plain_problems == MAX_PLAIN_PROBLEMS + 1:
                    print(
                        f"aiorl: further warnings and errors are only counted; see {self.run_dir}/logs",
                        file=self.stream,
                        flush=True,
                    )
        return row

    def _tell(self, row: dict) -> None:
        if self.on_row is None:
            return
        try:
            self.on_row(dict(row))  # a copy: what the callback does to it is its own business
        except Exception as exc:
            self.on_row, self.on_row_error = None, exc

    def stop(self, final: dict | None = None, roles_alive: int | None = None) -> None:
        """End the display; with `final` (summary.json), the last frame shows how the run ended."""
        if self.live is None:
            if self.quiet:
                self._read()  # shown nowhere, but counted for the launcher's closing lines
            else:
                self.update()
            return
        self._read()
        if final is not None:
            self.state.final, self.state.roles_alive = final, roles_alive
        self.live.update(render_panel(self.state), refresh=True)
        self.live.stop()
        self.live = None

    def update(self) -> None:
        if self.quiet:
            if self.on_row is not None:
                self._read()
            return
        row = self._read()
        if row is None:
            return
        if self.live is not None:
            self.live.update(render_panel(self.state))
            return
        now = time.monotonic()
        final = row.get("phase") == "EXITED" and row is not self.printed
        if (now - self.last_plain >= PLAIN_INTERVAL_S and row is not self.printed) or final:
            self.last_plain = now
            self.printed = row
            done = row.get(self.goal_key) or 0
            total = _count(self.goal) if isinstance(self.goal, float) else self.goal
            goal = f"/{total} ({100 * min(done / self.goal, 1):.0f}%)" if self.goal else ""
            problems = "; ".join(role_problems(row))
            store = self.state.store_text()
            store = store and f"{self.state.store} {store}"
            print(
                f"[{self.state.elapsed_s:7.1f}s] {row.get('phase', '?'):<8} {self.goal_key} {_count(done)}{goal}  "
                f"{summary_line(row, self.state.env_rate, self.state.learner_rate, store)}"
                + (f"  eval {self.state.eval_text()}" if self.state.eval_text() else "")
                + (f"  !! {problems}" if problems else ""),
                file=self.stream,
                flush=True,
            )
