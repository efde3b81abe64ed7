"""Seeing a run: metrics.jsonl, `aiorl plot`, `aiorl status`, plain progress output."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys

import numpy as np
import pytest
from cluster_helpers import finish, pids, read_json, run, wait_for
from configs import configured, random_cartpole

from aiorl.io.metrics import ROW_KEYS

pytestmark = pytest.mark.cluster

# Tight: the running-mean learner alone would sample several times what actors insert.
SAMPLES_PER_INSERT = 0.5
CONFIG = configured(random_cartpole(2, 1, 1, samples_per_insert=SAMPLES_PER_INSERT), run={"metrics_interval_s": 0.1})


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("obs")
    config = {**CONFIG, "agent": {**CONFIG["agent"], "scheduled_timesteps": 40_000}}
    code, out, run_dir = run(tmp, config)
    assert code == 0, out
    return run_dir, out


def test_metrics_jsonl_has_documented_keys_and_monotonic_counters(finished_run):
    run_dir, _ = finished_run
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) >= 5
    for row in rows:
        assert set(ROW_KEYS) <= set(row), set(ROW_KEYS) - set(row)
    for key in ("time_s", "env_steps", "learner_steps", "episodes"):
        values = [r[key] for r in rows]
        assert values == sorted(values), key
    running = [r for r in rows if r["phase"] == "RUNNING" and r["env_steps_per_s"]]
    assert running and all(r["env_steps_per_s"] > 0 for r in running[1:])
    # Rates are the counters' differences over the rows' own times.
    for before, row in zip(rows, rows[1:]):
        dt = row["time_s"] - before["time_s"]
        if dt >= 0.05 and row["env_steps_per_s"] is not None:
            assert row["env_steps_per_s"] == pytest.approx((row["env_steps"] - before["env_steps"]) / dt, rel=0.05)
    # The limiter's band is a few batches wide: over 40k inserts the ratio ends at its target, and
    # the learner (which alone would sample several times more) got what it allowed.
    last = rows[-1]
    assert last["phase"] == "EXITED" and last["env_steps"] >= 40_000
    assert SAMPLES_PER_INSERT / 2 <= last["samples_per_insert"] <= SAMPLES_PER_INSERT * 1.05
    assert last["replay_fill"] == 1.0 and last["replay_size"] == 4000  # 40k transitions through 4000 slots
    # CartPole pays 1 per step: a random policy's episodes last 8 to ~100 steps.
    assert last["return_mean_100"] == pytest.approx(last["episode_length_mean_100"])
    assert 8 <= last["return_mean_100"] <= 100
    losses = [r["learner/loss"] for r in rows if r.get("learner/loss") is not None]
    assert losses and all(math.isfinite(x) and x >= 0 for x in losses)
    assert 10 * 2**20 < last["rss_bytes"] < 16 * 2**30  # 4 processes, each well under 4 GiB
    assert 0 <= last["loop_lag_max_s"] < 5.0  # below heartbeat_timeout_s: no role was late for long
    assert last["roles_alive"] == 4 and last["roles_lost"] == [] and last["roles_late"] == []
    assert (run_dir / "tb").is_dir()  # TensorBoard is installed in the test environment


def test_summary_json_stays_compact(finished_run):
    run_dir, _ = finished_run
    summary = read_json(run_dir / "summary.json")
    # The weights publications of a long run are a debugging list: only the first 32 are kept
    # (the barrier tests read those), not one per publication.
    assert summary["weights_version"] > 32
    published = summary["weights_published_monotonic"]
    assert [version for version, _ in published] == list(range(32))  # version 0 (the initial weights) on
    assert summary["stopped_at"]["env_steps"] >= 40_000 and summary["stopped_at"]["env_steps"] <= summary["env_steps"]


def test_plain_progress_output_is_line_oriented(tmp_path):
    path = tmp_path / "c.json"
    config = {
        **CONFIG,
        "agent": {**CONFIG["agent"], "scheduled_timesteps": 20_000},
        "run": {"dir": str(tmp_path / "run")},
    }
    path.write_text(json.dumps(config))
    proc = subprocess.run(
        [sys.executable, "-m", "aiorl", "run", str(path)], cwd=tmp_path, capture_output=True, text=True, timeout=180
    )
    assert proc.returncode == 0, proc.stderr
    assert not re.search(r"[\x00-\x08\x0b-\x1f\x7f]", proc.stdout)  # no escapes, no carriage returns
    progress = [line for line in proc.stdout.splitlines() if line.startswith("[")]
    assert progress and "EXITED" in progress[-1] and "env_steps" in progress[-1]


def test_plot_writes_a_png_of_the_requested_size(finished_run, tmp_path):
    from PIL import Image

    run_dir, _ = finished_run
    out = tmp_path / "curve.png"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "aiorl",
            "plot",
            str(run_dir),
            str(run_dir),
            "-o",
            str(out),
            "--size",
            "800x500",
            "--metric",
            "return_mean_100",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    image = Image.open(out)
    assert image.format == "PNG" and image.size == (800, 500)
    pixels = np.asarray(image.convert("L"))
    assert pixels.std() > 5  # not blank
    proc = subprocess.run(
        [sys.executable, "-m", "aiorl", "plot", str(run_dir), "-o", str(out), "--metric", "no_such_metric"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and "--metric 'no_such_metric': no run has values of it" in proc.stderr


def test_status_of_a_running_cluster_and_of_a_finished_run(launch):
    config = {**CONFIG, "agent": {**CONFIG["agent"], "scheduled_timesteps": 10**9}}
    proc, run_dir = launch(config)
    started = pids(run_dir)
    wait_for(lambda: (run_dir / "coordinator.json").exists(), 60, "coordinator.json")

    def live_status():
        out = subprocess.run(
            [sys.executable, "-m", "aiorl", "status", str(run_dir), "--json"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        status = json.loads(out.stdout) if out.returncode == 0 else None
        return status if status and status["phase"] == "RUNNING" and status["env_steps"] > 0 else None

    status = wait_for(live_status, 120, "a RUNNING status", interval_s=0.5)
    assert set(status["roles"]) == set(started)
    assert all(r["status"] == "running" and r["heartbeat_age_s"] is not None for r in status["roles"].values())
    text = subprocess.run(
        [sys.executable, "-m", "aiorl", "status", str(run_dir)], capture_output=True, text=True, timeout=60
    ).stdout
    assert "phase RUNNING" in text and "learner-0" in text
    proc.send_signal(2)
    code, out = finish(proc, 60)
    assert code == 130, out  # interrupted by SIGINT, cleanly
    (run_dir / "token").unlink()  # a finished run's summary is a file: no token, no coordinator needed
    final = subprocess.run(
        [sys.executable, "-m", "aiorl", "status", str(run_dir), "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "AIORL_TOKEN": ""},
    )
    summary = json.loads(final.stdout)
    assert summary["live"] is False and summary["ok"] and set(summary["roles"]) == set(started)
    assert read_json(run_dir / "summary.json")["ok"]


def test_missing_tensorboard_is_a_one_line_notice(tmp_path, monkeypatch, caplog):
    import logging

    from aiorl.io.metrics import MetricsWriter

    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # import fails as if not installed
    with caplog.at_level(logging.INFO, logger="aiorl.loggers"):
        writer = MetricsWriter(tmp_path)
    writer.write({"time_s": 0.0, "env_steps": 1})
    writer.close()
    assert writer.loggers == [] and not (tmp_path / "tb").exists()
    notices = [r.getMessage() for r in caplog.records]
    assert len(notices) == 1 and "TensorBoard is not installed" in notices[0] and "\n" not in notices[0]
    assert json.loads((tmp_path / "metrics.jsonl").read_text()) == {"time_s": 0.0, "env_steps": 1}
