"""`aiorl plot`: learning curves from the metrics.jsonl of one or more runs."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from aiorl.argtypes import non_negative

# Axis labels with units for the metrics users plot most.
LABELS = {
    "return_mean_100": "mean episode return (last 100 episodes)",
    "env_steps_per_s": "env steps / s",
    "learner_steps_per_s": "learner steps / s",
    "replay_size": "replay size (transitions)",
    "learner_steps": "learner steps",
    "env_steps": "env steps",
}
X_AXES = {"steps": ("env_steps", "env steps"), "time": ("time_s", "wall time (s)")}


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


def series(rows: list[dict], x_key: str, metric: str) -> tuple[np.ndarray, np.ndarray]:
    points = [(r[x_key], r[metric]) for r in rows
              if isinstance(r.get(metric), (int, float)) and isinstance(r.get(x_key), (int, float))]
    if not points:
        return np.empty(0), np.empty(0)
    x, y = np.array(points, dtype=np.float64).T
    return x, y


def smooth(y: np.ndarray, window: int) -> tuple[np.ndarray, np.ndarray]:
    """Trailing rolling mean and std (the band), same length as y."""
    if len(y) == 0 or window <= 1:
        return y, np.zeros_like(y)
    c1 = np.concatenate([[0.0], np.cumsum(y)])
    c2 = np.concatenate([[0.0], np.cumsum(y * y)])
    idx = np.arange(1, len(y) + 1)
    lo = np.maximum(0, idx - window)
    n = idx - lo
    mean = (c1[idx] - c1[lo]) / n
    var = np.maximum(0.0, (c2[idx] - c2[lo]) / n - mean**2)
    return mean, np.sqrt(var)


def plot(run_dirs: list[Path], out: Path, x: str = "steps", metric: str = "return_mean_100",
         size: tuple[int, int] = (1000, 600), window: int = 10, title: str | None = None) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x_key, x_label = X_AXES[x]
    dpi = 100
    fig, ax = plt.subplots(figsize=(size[0] / dpi, size[1] / dpi), dpi=dpi)
    plotted = 0
    for run_dir in run_dirs:
        xs, ys = series(read_metrics(run_dir), x_key, metric)
        if len(xs) == 0:
            print(f"aiorl plot: {run_dir}: no values of {metric!r}", file=sys.stderr)
            continue
        mean, std = smooth(ys, window)
        (line,) = ax.plot(xs, mean, linewidth=2, label=run_dir.name)
        ax.fill_between(xs, mean - std, mean + std, color=line.get_color(), alpha=0.2, linewidth=0)
        ax.plot(xs, ys, color=line.get_color(), alpha=0.35, linewidth=0.8)
        plotted += 1
    if plotted == 0:
        plt.close(fig)
        raise ValueError(f"no run has values of {metric!r}")
    ax.set_xlabel(x_label)
    ax.set_ylabel(LABELS.get(metric, metric))
    ax.set_title(title or f"{LABELS.get(metric, metric)} vs {x_label}")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="best")
    if x_key == "env_steps":
        ax.ticklabel_format(axis="x", style="sci", scilimits=(-3, 4))
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=dpi, format="png")
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
    if not args.output.lower().endswith(".png"):
        print(f"aiorl plot: -o {args.output!r}: expected a .png file name", file=sys.stderr)
        return 2
    try:
        path = plot([Path(p) for p in args.run_dirs], Path(args.output), x=args.x, metric=args.metric,
                    size=args.size, window=args.smooth, title=args.title)
    except (FileNotFoundError, ValueError) as exc:
        print(f"aiorl plot: {exc}", file=sys.stderr)
        return 1
    print(f"aiorl plot: wrote {path}")
    return 0


def add_parser(sub) -> None:
    p = sub.add_parser("plot", help="learning curves from runs' metrics.jsonl (PNG)")
    p.add_argument("run_dirs", nargs="+", help="run directories (several are overlaid)")
    p.add_argument("-o", "--output", required=True, help="PNG file to write")
    p.add_argument("--x", choices=sorted(X_AXES), default="steps", help="x axis: env steps or wall time")
    p.add_argument("--metric", default="return_mean_100", help="metrics.jsonl key to plot")
    p.add_argument("--size", type=_size, default=(1000, 600), help="WIDTHxHEIGHT in pixels")
    p.add_argument("--smooth", type=non_negative(int), default=10, help="rolling window (rows) of the smoothed line")
    p.add_argument("--title", default=None)
    p.set_defaults(func=cmd_plot)
