"""Evaluation curves a person can trust (issue 27): every evaluation reaches metrics.jsonl and
TensorBoard at the steps of the policy it scored, however many end between two heartbeats or two
rows; each records how late it was (eval/lag_s) and how many were skipped; `aiorl plot` draws the
evaluations at their scored steps, unsmoothed, beside the training return."""

from __future__ import annotations

import json

import matplotlib.figure
import numpy as np
import pytest
from cluster_helpers import read_json, run

from aiorl.cli.main import main
from aiorl.cli.plot import evaluation_series, series
from aiorl.experiment.loading import load_config
from aiorl.io.metrics import ROW_KEYS, MetricsWriter
from aiorl.runtime import evaluator as evaluator_module
from aiorl.runtime import messages
from aiorl.runtime.coordinator.counters import RunCounters, stop_criterion
from aiorl.runtime.coordinator.report import Report
from aiorl.runtime.evaluator import Evaluator


class Clock:
    """The evaluator's clock (its module's `time`), moved by hand: monotonic t, unix time 1e6 + t."""

    def __init__(self, monkeypatch, t: float = 100.0):
        self.t = t
        monkeypatch.setattr(evaluator_module, "time", self)

    def monotonic(self) -> float:
        return self.t

    def time(self) -> float:
        return 1_000_000.0 + self.t


def dqn_cfg(**run_keys):
    cfg = load_config(data={"algo": "apex_dqn", "run": {"eval_every": 1000, "eval_episodes": 10, **run_keys}})
    return cfg


def reply(n: int, learner_steps: int, env_steps: int, mean: float, kept: bool) -> dict:
    """What the evaluation process answers (aiorl.evaluation.worker.score)."""
    evaluation = {
        "n": n,
        "learner_steps": learner_steps,
        "env_steps": env_steps,
        "return_mean": mean,
        "return_std": 1.0,
        "return_min": mean - 1,
        "episodes": 10,
        "seed": 1_000_000_000,
        "length_mean": mean,
        "seconds": 0.2,
        "copy_s": 0.0,
        "time": 0.0,
        "worker_cpu_s": 1.0,
    }
    return {"evaluation": evaluation, "kept": kept}


def heartbeat(summary: dict) -> dict:
    """The summary as the coordinator takes it: through the heartbeat's checks."""
    return messages.check("heartbeat", {"counters": {}, "evaluation": summary})["evaluation"]


def test_lag_runs_from_due_to_the_result_and_the_grid_counts_skips(tmp_path, monkeypatch):
    clock = Clock(monkeypatch)
    ev = Evaluator(dqn_cfg(), tmp_path / "policy")
    assert not ev.due(999)
    assert ev.due(1000)  # due now, at t=100
    clock.t = 103.0  # taken later (a copy waiting for the one in flight)
    assert ev.mark(1000) == 100.0
    clock.t = 105.5
    record = ev.record(reply(1, 1000, 8000, 51.0, kept=True), 100.0, 1_000_103.0)
    assert record["lag_s"] == 5.5 and record["due_time"] == 1_000_100.0 and record["policy_time"] == 1_000_103.0
    assert record["skipped"] == 0 and record["best_return_mean"] == 51.0
    # One step past two multiples of eval_every (2000 and 3000): the evaluation at 3000 stands for both,
    # 2000 was skipped; the due time is when it was first seen due.
    assert not ev.due(1999) and ev.due(3000) and ev.due(3001)
    clock.t = 110.0
    assert ev.mark(3001) == 105.5 and ev.skipped == 1
    # By time: due at exactly eval_interval_s after the last one, however late it is noticed.
    timed = Evaluator(dqn_cfg(eval_every=None, eval_interval_s=30.0), tmp_path / "policy")
    clock.t += 29.0
    assert not timed.due(5)
    clock.t += 3.0
    assert timed.due(6) and timed.mark(6) == 140.0


def test_a_resumed_launch_starts_its_grid_at_its_first_step(tmp_path):
    ev = Evaluator(dqn_cfg(), tmp_path / "policy")
    assert not ev.due(5301)  # a launch resumed at learner step 5,300: the next multiple is 6,000
    assert ev.due(6000)
    ev.mark(6000)
    assert ev.skipped == 0


def test_two_evaluations_between_two_heartbeats_both_reach_metrics_jsonl_and_tensorboard(tmp_path, monkeypatch):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    clock = Clock(monkeypatch)
    cfg = dqn_cfg()
    ev = Evaluator(cfg, tmp_path / "policy")
    counters = RunCounters()
    counters.t_start = 1_000_000.0  # the run's clock: time_s 0 at t=0
    report = Report(cfg, None, None, None, counters, None, None, None, None)
    writer = MetricsWriter(tmp_path, loggers=["tensorboard"])

    def row(env_steps: int, learner_steps: int) -> dict:
        return {"time_s": clock.t, "phase": "RUNNING", "env_steps": env_steps, "learner_steps": learner_steps}

    # Two evaluations end between two heartbeats; the first heartbeat after them is lost (no answer).
    ev.record(reply(1, 1000, 8000, 79.2, kept=True), 100.0, 1_000_100.0)
    clock.t = 101.0
    ev.record(reply(2, 2000, 16000, 90.0, kept=True), 100.5, 1_000_100.5)
    lost = heartbeat(ev.summary())
    counters.add_evaluation(lost)
    # ... so the next carries them again; the coordinator takes each once.
    answered = heartbeat(ev.summary())
    assert [e["n"] for e in answered["new"]] == [1, 2]
    counters.add_evaluation(answered)
    ev.reported(answered)
    assert ev.summary()["new"] == []  # acknowledged: not sent again
    writer.write(row(30000, 3500), report.evaluation_rows())
    writer.write(row(31000, 3600), report.evaluation_rows())  # nothing new: a plain row
    # A third evaluation, one row later; a fourth ends while the heartbeat carrying the third is on
    # its way: the answer acknowledges the third only.
    clock.t = 110.0
    ev.record(reply(3, 3000, 24000, 500.0, kept=True), 109.0, 1_000_109.0)
    sent = heartbeat(ev.summary())
    ev.record(reply(4, 4000, 32000, 480.0, kept=False), 109.5, 1_000_109.5)
    counters.add_evaluation(sent)
    ev.reported(sent)
    writer.write(row(40000, 4000), report.evaluation_rows())
    assert [e["n"] for e in ev.summary()["new"]] == [4]
    counters.add_evaluation(heartbeat(ev.summary()))
    writer.write(row(41000, 4100), report.evaluation_rows())
    writer.close()

    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in rows if "eval/return_mean" in r]
    assert [r["eval/return_mean"] for r in evals] == [79.2, 90.0, 500.0, 480.0]
    assert [r["eval/learner_steps"] for r in evals] == [1000, 2000, 3000, 4000]
    assert [r["eval/env_steps"] for r in evals] == [8000, 16000, 24000, 32000]
    assert [r["eval/time_s"] for r in evals] == [100.0, 100.5, 109.0, 109.5]
    assert [r["eval/best_return_mean"] for r in evals] == [79.2, 90.0, 500.0, 500.0]  # the best as of each
    assert [r["eval/lag_s"] for r in evals] == [0.0, 0.5, 1.0, 0.5]
    assert [r["eval/skipped"] for r in evals] == [0, 0, 0, 0]
    # Two evaluations in one row's time: two rows, the same counters; every row keeps its shape.
    assert len(rows) == 5 and rows[0]["env_steps"] == rows[1]["env_steps"] == 30000
    assert "eval/return_mean" not in rows[2]
    # TensorBoard: each evaluation at the env steps of the policy it scored, the rows' own at theirs.
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("eval/return_mean")] == [
        (8000, pytest.approx(79.2)),
        (16000, 90.0),
        (24000, 500.0),
        (32000, 480.0),
    ]
    assert [e.step for e in events.Scalars("charts/learner_steps")] == [30000, 31000, 40000, 41000]


def test_the_target_return_is_held_to_every_evaluation_of_a_heartbeat(tmp_path):
    cfg = load_config(data={"algo": "apex_dqn", "agent": {"target_return": 475}, "run": {"eval_every": 1000}})
    ev, counters = Evaluator(cfg, tmp_path / "policy"), RunCounters()
    ev.record(reply(1, 1000, 8000, 480.0, kept=True), 0.0, 0.0)  # reached the target...
    ev.record(reply(2, 2000, 16000, 300.0, kept=False), 0.0, 0.0)  # ... and dipped before the heartbeat
    assert stop_criterion(cfg, counters) is None
    counters.add_evaluation(heartbeat(ev.summary()))
    assert stop_criterion(cfg, counters) == (
        "evaluation 1 (learner step 1000): mean return 480.0 >= target_return 475.0",
        None,  # a target, not a budget: no counter the stop was decided on
    )


def test_an_older_learners_summary_without_new_still_makes_one_row(tmp_path):
    counters = RunCounters()
    last = reply(4, 4000, 9000, 12.0, kept=True)["evaluation"]
    counters.add_evaluation(heartbeat({"count": 4, "last": last, "best": last}))
    counters.add_evaluation(heartbeat({"count": 4, "last": last, "best": last}))  # the same one again
    report = Report(dqn_cfg(), None, None, None, counters, None, None, None, None)
    (row,) = report.evaluation_rows()
    assert row["eval/return_mean"] == 12.0 and row["eval/best_return_mean"] == 12.0
    assert row["eval/lag_s"] is None and report.evaluation_rows() == []


# --------------------------------------------------------------------------
# aiorl plot


def write_run(path, rows):
    path.mkdir(parents=True)
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def training_rows(n=30):
    return [
        {
            "time_s": float(k),
            "phase": "RUNNING",
            "env_steps": 1000 * k,
            "learner_steps": 100 * k,
            "return_mean_100": float(10 * k),
        }
        for k in range(n)
    ]


def with_evaluations(rows, evaluations):
    """Each evaluation (learner steps, value, landed, extra keys) in the row `landed`, where its result landed."""
    rows = [dict(r) for r in rows]
    for learner_steps, value, landed, extra in evaluations:
        rows[landed].update({"eval/return_mean": value, "eval/learner_steps": learner_steps, **extra})
    return rows


def captured_plot(monkeypatch, args):
    """Run `aiorl plot ARGS`; the figure's axis labels, legend and lines (x, y, style) as drawn."""
    drawn = {}
    save = matplotlib.figure.Figure.savefig

    def record(fig, *a, **kw):
        ax = fig.axes[0]
        drawn["ylabel"], drawn["title"] = ax.get_ylabel(), ax.get_title()
        drawn["legend"] = [t.get_text() for t in ax.get_legend().get_texts()]
        drawn["lines"] = [
            {
                "label": line.get_label(),
                "x": line.get_xdata().tolist(),
                "y": line.get_ydata().tolist(),
                "marker": line.get_marker(),
                "linestyle": line.get_linestyle(),
                "color": line.get_color(),
            }
            for line in ax.get_lines()
        ]
        return save(fig, *a, **kw)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", record)
    assert main(["plot", *args]) == 0
    return drawn


def test_the_default_plot_draws_training_and_evaluation_returns_each_evaluation_at_its_scored_step(
    tmp_path, monkeypatch
):
    # An older run's rows (no eval/env_steps): evaluation of the policy at learner step 1,000 landed
    # in the row of step 2,300 (env steps 23,000); the one of 2,000 at 2,100.
    old = write_run(tmp_path / "old", with_evaluations(training_rows(), [(1000, 51.0, 23, {}), (2000, 362.0, 21, {})]))
    drawn = captured_plot(monkeypatch, [str(old), "-o", str(tmp_path / "p.png")])
    assert drawn["ylabel"] == "return" and drawn["title"] == "return vs env steps (old)"
    assert drawn["legend"] == ["training return (last 100 episodes)", "evaluation return (greedy episodes)"]
    training, raw, evaluation = drawn["lines"]
    assert training["marker"] == "None" and training["linestyle"] == "-"
    assert evaluation["marker"] == "o" and evaluation["linestyle"] == "--"
    # env steps of learner steps 1,000 and 2,000 (rows 10 and 20), not of the rows they landed in;
    # sorted by the step scored; the values themselves, unsmoothed.
    assert evaluation["x"] == [10000.0, 20000.0] and evaluation["y"] == [51.0, 362.0]
    assert training["y"] != raw["y"] and raw["y"] == [10.0 * k for k in range(30)]  # training: smoothed
    # against learner steps: eval/learner_steps
    drawn = captured_plot(monkeypatch, [str(old), "-o", str(tmp_path / "p.png"), "--x", "learner_steps"])
    assert drawn["lines"][2]["x"] == [1000.0, 2000.0]


def test_several_runs_each_one_colour_their_names_in_the_legend(tmp_path, monkeypatch):
    a = write_run(tmp_path / "a", with_evaluations(training_rows(), [(1000, 51.0, 12, {})]))
    b = write_run(tmp_path / "b", training_rows())  # no evaluations: its training return alone
    drawn = captured_plot(monkeypatch, [str(a), str(b), "-o", str(tmp_path / "p.png")])
    assert drawn["legend"] == [
        "a: training return (last 100 episodes)",
        "a: evaluation return (greedy episodes)",
        "b: training return (last 100 episodes)",
    ]
    assert drawn["title"] == "return vs env steps"
    a_training, a_raw, a_evaluation, b_training, b_raw = drawn["lines"]
    assert a_training["color"] == a_raw["color"] == a_evaluation["color"] != b_training["color"] == b_raw["color"]


def test_evaluations_recorded_with_their_own_steps_and_times_are_drawn_there(tmp_path):
    extra = {"eval/env_steps": 9500, "eval/time_s": 9.25}
    rows = with_evaluations(training_rows(), [(1000, 51.0, 25, extra)])
    assert [list(a) for a in series(rows, "env_steps", "eval/return_mean")] == [[9500.0], [51.0]]
    assert [list(a) for a in series(rows, "time_s", "eval/return_mean")] == [[9.25], [51.0]]
    assert [list(a) for a in evaluation_series(rows, "learner_steps", "eval/return_mean")] == [[1000.0], [51.0]]
    # A row with neither its own step nor learner steps to interpolate from: where it landed.
    assert [list(a) for a in series([{"env_steps": 7, "eval/return_mean": 3.0}], "env_steps", "eval/return_mean")] == [
        [7.0],
        [3.0],
    ]


def test_evaluations_are_smoothed_only_on_request(tmp_path, monkeypatch):
    values = [51.0, 362.0, 500.0]
    run_dir = write_run(
        tmp_path / "r",
        with_evaluations(training_rows(40), [(1000 * (k + 1), v, 10 * k + 12, {}) for k, v in enumerate(values)]),
    )
    drawn = captured_plot(monkeypatch, [str(run_dir), "--metric", "eval/return_mean", "-o", str(tmp_path / "e.png")])
    (line,) = drawn["lines"]  # points joined by a line, no raw line under it
    assert line["y"] == values and line["marker"] == "o"
    drawn = captured_plot(
        monkeypatch, [str(run_dir), "--metric", "eval/return_mean", "--smooth", "3", "-o", str(tmp_path / "e.png")]
    )
    smoothed, raw = drawn["lines"]
    assert raw["y"] == values and np.allclose(smoothed["y"], [206.5, 304.333333, 431.0])


def test_the_default_plot_of_a_run_without_evaluations_is_its_training_return(tmp_path, monkeypatch):
    run_dir = write_run(tmp_path / "plain", training_rows())
    drawn = captured_plot(monkeypatch, [str(run_dir), "-o", str(tmp_path / "p.png")])
    assert drawn["legend"] == ["plain"] and drawn["ylabel"] == "mean episode return (last 100 episodes)"


# --------------------------------------------------------------------------
# A real run


EVERY_FEW_STEPS = {
    "algo": "apex_dqn",
    "env": {"id": "CartPole-v1", "num_envs": 1},
    "cluster": {"actors": 1, "memories": 1, "learners": 1},
    "agent": {
        "sample_batch_size": 16,
        "batch_size": 32,
        "buffer_size": 5000,
        "learning_starts": 200,
        "publish_interval": 10,
        "scheduled_global_steps": 400,
    },
    "model": {"network": ["linear:16", "relu"]},
    # An evaluation every 10 learner steps, of one episode: several end between two heartbeats.
    "run": {"eval_every": 10, "eval_episodes": 1, "seed": 5, "max_seconds": 120},
}


@pytest.mark.cluster
def test_a_run_records_every_evaluation_once_at_its_steps(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    code, out, run_dir = run(tmp_path, EVERY_FEW_STEPS, timeout_s=200)
    assert code == 0, out
    summary = read_json(run_dir / "summary.json")
    evaluation = summary["evaluation"]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    evals = [r for r in rows if "eval/return_mean" in r]
    # Every evaluation scored is in metrics.jsonl once, in order, whatever the heartbeats did.
    assert evaluation["count"] == len(evals) >= 3
    assert [r["eval/learner_steps"] for r in evals] == sorted(r["eval/learner_steps"] for r in evals)
    assert len({r["eval/learner_steps"] for r in evals}) == len(evals)
    for r in rows:
        assert set(ROW_KEYS) <= set(r)
    for r in evals:
        assert r["eval/lag_s"] >= 0 and r["eval/skipped"] >= 0 and r["eval/episodes"] == 1
        assert 0 <= r["eval/env_steps"] <= r["env_steps"] and 0 <= r["eval/time_s"] <= r["time_s"]
    # Learner 0 dropped each evaluation once a heartbeat's answer said it arrived: its final account
    # holds only the few that ended after its last heartbeat.
    assert len(summary["roles"]["learner-0"]["stats"]["evaluation"]["new"]) <= max(2, evaluation["count"] // 2)
    # Each multiple of 10 learner steps was due once: scored or skipped; then the final policy.
    last = evaluation["last"]["learner_steps"]
    assert last == summary["learner_steps"]
    assert evaluation["count"] + evaluation["skipped"] == -(-last // 10)
    events = EventAccumulator(str(run_dir / "tb"))
    events.Reload()
    assert [e.step for e in events.Scalars("eval/return_mean")] == [r["eval/env_steps"] for r in evals]
