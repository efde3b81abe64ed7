"""The live panel (a captured frame) and `aiorl plot` of several runs against wall time,
both from metrics rows written here (no cluster needed)."""

from __future__ import annotations

import io
import json
import re

import matplotlib.figure
import numpy as np

from aiorl.cli.main import main
from aiorl.experiment.loading import load_config
from aiorl.launch.panel import Progress

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def write_rows(run_dir, rows) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_live_panel_renders_the_latest_row(tmp_path, monkeypatch):
    monkeypatch.setenv("COLUMNS", "120")
    cfg = load_config(data={"algo": "random_agent", "agent": {"scheduled_global_steps": 15000}})
    write_rows(
        tmp_path,
        [
            {"time_s": 1.0, "phase": "STARTING"},
            {
                "time_s": 40.0,
                "phase": "RUNNING",
                "env_steps": 81234,
                "learner_steps": 6271,
                "env_steps_per_s": 2040.4,
                "learner_steps_per_s": 112.2,
                "return_mean_100": 186.6,
                "episodes": 1900,
                "replay_size": 25000,
                "replay_fill": 0.5,
                "weights_version": 634,
                "roles_alive": 4,
                "roles_late": ["actor-1"],
                "roles_lost": ["memory-1"],
            },
        ],
    )
    screen = Terminal()
    progress = Progress(cfg, tmp_path, stream=screen)
    progress.start()
    try:
        progress.update()
    finally:
        progress.stop()
    frame = ANSI.sub("", screen.getvalue())
    assert "aiorl random_agent on CartPole-v1" in frame
    assert "6,271/15,000" in frame  # the bar counts learner steps toward scheduled_global_steps
    # Totals, and rates over the rows' window (here the two rows: 39 s apart), not the last row's spike.
    for text in (
        "RUNNING",
        "81,234 (2,083/s)",
        "6,271 (161/s)",
        "186.60",
        "25,000 (50%)",
        "1,900",
        "634",
        "actor-1 is late (no heartbeat for 2 intervals)",
        "memory-1 is lost",
    ):
        assert text in frame, text


def test_plot_overlays_several_runs_against_wall_time(tmp_path, monkeypatch, capsys):
    runs = {"fast": ([0.0, 1.0, 2.0, 3.0], [10.0, 50.0, 90.0, 100.0]), "slow": ([0.0, 2.5, 5.0], [5.0, 7.0, 30.0])}
    for name, (times, returns) in runs.items():
        write_rows(
            tmp_path / name,
            [
                {"time_s": t, "env_steps": 1000 * (k + 1), "return_mean_100": r}
                for k, (t, r) in enumerate(zip(times, returns))
            ],
        )
    drawn = {}
    save = matplotlib.figure.Figure.savefig

    def record(fig, *args, **kwargs):
        ax = fig.axes[0]
        drawn["xlabel"] = ax.get_xlabel()
        drawn["legend"] = [t.get_text() for t in ax.get_legend().get_texts()]
        drawn["lines"] = [(line.get_xdata().tolist(), line.get_ydata().tolist()) for line in ax.get_lines()]
        return save(fig, *args, **kwargs)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", record)
    out = tmp_path / "curves.png"
    assert (
        main(["plot", str(tmp_path / "fast"), str(tmp_path / "slow"), "-o", str(out), "--x", "time", "--smooth", "2"])
        == 0
    )
    assert out.stat().st_size > 0 and "wrote" in capsys.readouterr().out
    assert drawn["xlabel"] == "wall time (s)" and drawn["legend"] == ["fast", "slow"]
    # Per run: the smoothed line, then the raw values, both over the rows' wall times.
    for k, (times, returns) in enumerate(runs.values()):
        (sx, sy), (rx, ry) = drawn["lines"][2 * k : 2 * k + 2]
        assert sx == rx == times and ry == returns
    # Centred window of 2 (no lag): each value with the next, the last alone.
    assert np.allclose(drawn["lines"][0][1], [30.0, 70.0, 95.0, 100.0])
    assert np.allclose(drawn["lines"][2][1], [6.0, 18.5, 30.0])
