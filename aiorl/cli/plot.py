"""`aiorl plot`: learning curves from the metrics.jsonl of one or more runs.

By default a run's training return (``return_mean_100``, a line) and its
evaluation return (``eval/return_mean``, when it evaluated during training:
points joined by a dashed line) share one figure and one legend; ``--metric``
(repeatable) draws others.

Evaluation metrics (``eval/*``) are drawn at the step of the policy each one
scored (``eval/learner_steps``, ``eval/env_steps``, ``eval/time_s``; a run
written before the last two interpolates them from its rows' learner steps),
not where its result landed in the rows, and are not smoothed unless
``--smooth`` is given: a handful of points under a window of 10 rows would be
a flat line.

Smoothing (``--smooth N``; training metrics 10 by default) is a centred moving
average over N rows: each point is the mean of the rows around it (fewer at
the two ends), so the smoothed curve does not lag the data it smooths, as a
trailing mean or an EMA would. ``return_mean_100`` itself is already the mean
of the last 100 episodes.

Runs of the same config (config.yaml equal but for ``run.dir`` and
``run.seed``: ``aiorl plot runs/a runs/b``) are one curve: the mean across
them, with a band from their min to their max, on the x range they all
cover. A single run is drawn as its smoothed line over its faint raw data,
with no band: spread within one run is not seed variance.

The output format follows the file's extension: .png, .svg or .pdf.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from aiorl.cli.argtypes import non_negative
from aiorl.config import ConfigError
from aiorl.config.files import read_config_file
from aiorl.core.suggest import did_you_mean

# Axis labels with units for the metrics users plot most.
LABELS = {
    "return_mean_100": "mean episode return (last 100 episodes)",
    "eval/return_mean": "mean evaluation return (greedy episodes during training)",
    "env_steps_per_s": "env steps / s",
    "learner_steps_per_s": "learner steps / s",
    "replay_size": "replay size (transitions)",
    "learner_steps": "learner steps",
    "env_steps": "env steps",
}
X_AXES = {
    "steps": ("env_steps", "env steps"),
    "env_steps": ("env_steps", "env steps"),
    "learner_steps": ("learner_steps", "learner steps"),
    "time": ("time_s", "wall time (s)"),
}
# Where each evaluation's x lies: the policy it scored, by x axis.
EVAL_X = {"learner_steps": "eval/learner_steps", "env_steps": "eval/env_steps", "time_s": "eval/time_s"}
DEFAULT_METRICS = ("return_mean_100", "eval/return_mean")
TRAINING_WINDOW = 10  # rows of the training metrics' smoothed line unless --smooth says otherwise
FORMATS = (".png", ".svg", ".pdf")
# Keys that differ between seeds of one experiment.
NOT_THE_EXPERIMENT = {"run": ("dir", "seed")}


class PlotError(ValueError):
    """A user's mistake: a bad metric, an unknown format (exit 2)."""


def read_metrics(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl" if run_dir.is_dir() else run_dir
    if not path.exists():
        raise FileNotFoundError(f"{run_dir}: no metrics.jsonl (is it an aiorl run directory?)")
    rows = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{n}: not JSON: {exc}") from None
    return rows


def is_evaluation(metric: str) -> bool:
    return metric.startswith("eval/")


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def series(rows: list[dict], x_key: str, metric: str) -> tuple[np.ndarray, np.ndarray]:
    """(x, y) of `metric` over the rows that have it; an evaluation metric at its scored steps."""
    if is_evaluation(metric):
        return evaluation_series(rows, x_key, metric)
    points = [
        (r[x_key], r[metric])
        for r in rows
        if isinstance(r.get(metric), (int, float)) and isinstance(r.get(x_key), (int, float))
    ]
    if not points:
        return np.empty(0), np.empty(0)
    x, y = np.array(points, dtype=np.float64).T
    return x, y


def evaluation_series(rows: list[dict], x_key: str, metric: str) -> tuple[np.ndarray, np.ndarray]:
    """Each evaluation's `metric` at the x of the policy it scored, sorted by it: its eval/learner_steps,
    eval/env_steps or eval/time_s; where the row has no such key (a run written before them), the x
    the training rows had at its eval/learner_steps (interpolated); without those either, the row's own."""
    evaluations = [r for r in rows if _number(r.get(metric))]
    if not evaluations:
        return np.empty(0), np.empty(0)
    own = EVAL_X.get(x_key)
    training = sorted(
        (r["learner_steps"], r[x_key])
        for r in rows
        if _number(r.get("learner_steps")) and _number(r.get(x_key)) and x_key != "learner_steps"
    )
    steps, xs = np.array(training, dtype=np.float64).reshape(-1, 2).T
    points = []
    for r in evaluations:
        if own is not None and _number(r.get(own)):
            x = r[own]
        elif len(steps) and _number(r.get("eval/learner_steps")):
            x = float(np.interp(r["eval/learner_steps"], steps, xs))
        elif _number(r.get(x_key)):
            x = r[x_key]
        else:
            continue
        points.append((x, r[metric]))
    if not points:
        return np.empty(0), np.empty(0)
    x, y = np.array(sorted(points, key=lambda p: p[0]), dtype=np.float64).T
    return x, y


def smooth(y: np.ndarray, window: int) -> np.ndarray:
    """Centred moving average over `window` rows (fewer at the ends), same length as y: no lag."""
    if len(y) == 0 or window <= 1:
        return y
    c = np.concatenate([[0.0], np.cumsum(y)])
    idx = np.arange(len(y))
    lo = np.maximum(0, idx - (window - 1) // 2)
    hi = np.minimum(len(y), idx + window // 2 + 1)
    return (c[hi] - c[lo]) / (hi - lo)


def numeric_metrics(rows: list[dict]) -> list[str]:
    return sorted({k for r in rows for k, v in r.items() if isinstance(v, (int, float)) and not isinstance(v, bool)})


def experiment_key(run_dir: Path) -> str:
    """What makes runs seeds of one experiment: their config.yaml without run.dir and run.seed."""
    path = run_dir / "config.yaml"
    try:
        config = read_config_file(path)  # capped and checked as every config aiorl reads
    except (OSError, ConfigError):
        return f"run:{run_dir.resolve()}"  # no readable config: a group of its own
    for section, keys in NOT_THE_EXPERIMENT.items():
        for key in keys:
            (config.get(section) or {}).pop(key, None)
    return json.dumps(config, sort_keys=True, default=str)


def group_runs(run_dirs: list[Path]) -> list[list[Path]]:
    """Runs of the same experiment together, in the order first given."""
    groups: dict[str, list[Path]] = {}
    for run_dir in run_dirs:
        groups.setdefault(experiment_key(run_dir), []).append(run_dir)
    return list(groups.values())


def across_runs(curves: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, ...]:
    """(x, mean, min, max) of several (x, y) curves on the x range they all cover."""
    lo, hi = max(x[0] for x, _ in curves), min(x[-1] for x, _ in curves)
    grid = np.unique(np.concatenate([x[(x >= lo) & (x <= hi)] for x, _ in curves]))
    ys = np.stack([np.interp(grid, x, y) for x, y in curves])
    return grid, ys.mean(axis=0), ys.min(axis=0), ys.max(axis=0)


def _label(metric: str, metrics: list[str]) -> str:
    """A curve's name in the legend: the metric's, where the figure has more than one."""
    if len(metrics) == 1:
        return ""
    if metric == "return_mean_100":
        return "training return (last 100 episodes)"
    if metric == "eval/return_mean":
        return "evaluation return (greedy episodes)"
    return metric


def _draw(ax, curves, name: str, metric: str, window: int, color):
    """One group's curve of `metric`: training metrics a smoothed line over the faint raw one,
    evaluation metrics points joined by a dashed line; several runs their mean with a min-max band."""
    evaluation = is_evaluation(metric)
    style = {"linestyle": "--", "marker": "o", "markersize": 5, "linewidth": 1.5} if evaluation else {"linewidth": 2}
    if len(curves) == 1:
        xs, ys = curves[0]
        (line,) = ax.plot(xs, smooth(ys, window), color=color, label=name, **style)
        if window > 1:  # the raw values under a smoothed line
            ax.plot(xs, ys, color=line.get_color(), alpha=0.35, linewidth=0.8)
        return line
    grid, mean, low, high = across_runs([(x, smooth(y, window)) for x, y in curves])
    (line,) = ax.plot(grid, mean, color=color, label=f"{name} (mean of {len(curves)} runs)", **style)
    ax.fill_between(
        grid,
        low,
        high,
        color=line.get_color(),
        alpha=0.2,
        linewidth=0,
        label=f"{name} (min-max of {len(curves)} runs)",
    )
    return line


def plot(
    run_dirs: list[Path],
    out: Path,
    x: str = "steps",
    metric: str | list[str] | None = None,
    size: tuple[int, int] = (1000, 600),
    window: int | None = None,
    title: str | None = None,
) -> Path:
    """Draw `metric` (one or several; default the training and the evaluation return) of `run_dirs`.
    `window`: the smoothing of every curve; None: training metrics TRAINING_WINDOW, evaluations none."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x_key, x_label = X_AXES[x]
    metrics = list(DEFAULT_METRICS) if metric is None else [metric] if isinstance(metric, str) else list(metric)
    metric = metrics[0]  # the one a run must have; the default's evaluation return is drawn where there is one
    dpi = 100
    fig, ax = plt.subplots(figsize=(size[0] / dpi, size[1] / dpi), dpi=dpi)
    plotted, seen, drawn = 0, set(), set()
    groups = [{run_dir: read_metrics(run_dir) for run_dir in group} for group in group_runs(run_dirs)]
    for rows_of in groups:
        for rows in rows_of.values():
            seen.update(numeric_metrics(rows))
    present = [m for m in metrics if m in seen] or [metric]  # named in the legend where more than one
    for rows_of in groups:
        first = next(iter(rows_of))
        color = None  # a group's curves share its colour; the metric tells them apart by style
        for name in present:
            curves = []
            for run_dir, rows in rows_of.items():
                xs, ys = series(rows, x_key, name)
                order = np.argsort(xs, kind="stable")  # a resumed run's rows can restart the clock
                if len(xs) == 0:
                    continue
                drawn.add(run_dir)
                curves.append((xs[order], ys[order]))
            if not curves:
                continue
            label = _label(name, present)
            if len(groups) > 1 or not label:  # one run's name is in the title
                label = f"{first.name}: {label}" if label else first.name
            smoothing = window if window is not None else 1 if is_evaluation(name) else TRAINING_WINDOW
            color = _draw(ax, curves, label, name, smoothing, color).get_color()
            plotted += 1
    if plotted == 0:
        plt.close(fig)
        hint = did_you_mean(metric, sorted(seen), prefer=DEFAULT_METRICS)  # the returns a person means
        raise PlotError(
            f"--metric {metric!r}: no run has values of it{hint} (metrics there: {', '.join(sorted(seen)) or 'none'})"
        )
    for run_dir in (r for r in run_dirs if r not in drawn):
        print(f"aiorl plot: {run_dir}: no values of {metric!r}; left out", file=sys.stderr)
    if present == list(DEFAULT_METRICS):
        y_label = "return"
    else:
        y_label = LABELS.get(present[0], present[0]) if len(present) == 1 else ", ".join(present)
    ax.set_xlabel(x_label)
    ax.set_ylabel(y_label)
    one = ""
    if len(groups) == 1 and len(present) > 1:  # the legend names the metrics, the title the run
        first, more = next(iter(groups[0])).name, len(groups[0]) - 1
        one = f" ({first})" if not more else f" ({first} and {more} more run{'s' if more > 1 else ''} of its config)"
    ax.set_title(title or f"{y_label} vs {x_label}{one}")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="best")
    if x_key == "env_steps":
        ax.ticklabel_format(axis="x", style="sci", scilimits=(-3, 4))
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=dpi, format=out.suffix.lower().lstrip("."))
    plt.close(fig)
    return out


def _size(text: str) -> tuple[int, int]:
    try:
        w, h = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected WIDTHxHEIGHT in pixels, e.g. 1000x600, got {text!r}") from None
    if not (100 <= w <= 8000 and 100 <= h <= 8000):
        raise argparse.ArgumentTypeError(f"size {text!r}: each side must be 100..8000 pixels")
    return w, h


def cmd_plot(args: argparse.Namespace) -> int:
    if Path(args.output).suffix.lower() not in FORMATS:
        print(f"aiorl plot: -o {args.output!r}: expected a file name ending in {', '.join(FORMATS)}", file=sys.stderr)
        return 2
    try:
        path = plot(
            [Path(p) for p in args.run_dirs],
            Path(args.output),
            x=args.x,
            metric=args.metric,
            size=args.size,
            window=args.smooth,
            title=args.title,
        )
    except PlotError as exc:
        print(f"aiorl plot: {exc}", file=sys.stderr)
        return 2
    except (FileNotFoundError, ValueError) as exc:
        print(f"aiorl plot: {exc}", file=sys.stderr)
        return 1
    print(f"aiorl plot: wrote {path}")
    return 0


def add_parser(sub) -> None:
    p = sub.add_parser("plot", help="learning curves from runs' metrics.jsonl (PNG, SVG or PDF)")
    p.add_argument(
        "run_dirs",
        nargs="+",
        help="run directories; runs of the same config are one curve with a min-max band across them",
    )
    p.add_argument("-o", "--output", required=True, help="file to write: .png, .svg or .pdf")
    p.add_argument(
        "--x",
        choices=sorted(X_AXES),
        default="steps",
        help="x axis: env steps (steps, env_steps), learner_steps or wall time",
    )
    p.add_argument(
        "--metric",
        action="append",
        default=None,
        help="metrics.jsonl key to plot; repeatable (default: return_mean_100 and, where the run evaluated "
        "during training, eval/return_mean)",
    )
    p.add_argument("--size", type=_size, default=(1000, 600), help="WIDTHxHEIGHT in pixels")
    p.add_argument(
        "--smooth",
        type=non_negative(int),
        default=None,
        help=f"rolling window (rows) of the smoothed line (default: {TRAINING_WINDOW} for training metrics, "
        "none for evaluations, eval/*)",
    )
    p.add_argument("--title", default=None)
    p.set_defaults(func=cmd_plot)
