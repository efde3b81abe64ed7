"""A budget is where the run stops: `agent.scheduled_global_steps` exactly (learners take no step
past their share), `agent.scheduled_timesteps` within one rollout per actor (actors stop on what
they know and tell the coordinator at once), however long the heartbeat interval. Real role
processes over real sockets; the heartbeat interval is long (3 s) so that a stop decided on
heartbeats alone would overshoot by thousands of steps."""

from __future__ import annotations

import json

import pytest
from cluster_helpers import cluster, run
from configs import configured, es_tiny

SLOW_BEATS = {"heartbeat_interval_s": 3.0, "heartbeat_timeout_s": 30.0, "coordinator_timeout_s": 30.0}


def summary_of(run_dir):
    return json.loads((run_dir / "summary.json").read_text())


def test_an_env_step_budget_ends_within_one_rollout_of_the_actor(tmp_path):
    config = cluster(1, 1, 1, scheduled_timesteps=500)  # random_agent, 2 envs x 16 steps a rollout
    config["cluster"].update(SLOW_BEATS)
    code, out, run_dir = run(tmp_path, config)
    assert code == 0, out
    summary = summary_of(run_dir)
    assert 500 <= summary["env_steps"] <= 500 + 2 * 16, summary["env_steps"]
    assert summary["stopped_at"] == {"env_steps": summary["env_steps"]}  # the budget's counter only
    assert summary["stop_reason"].startswith("reached scheduled_timesteps")


def test_two_actors_each_stop_on_what_they_know_and_the_run_still_reaches_its_budget(tmp_path):
    config = cluster(2, 1, 1, scheduled_timesteps=600)
    config["cluster"].update(SLOW_BEATS)
    code, out, run_dir = run(tmp_path, config)
    assert code == 0, out
    assert summary_of(run_dir)["env_steps"] >= 600


@pytest.mark.parametrize("learners", [1, 2])
def test_a_learner_step_budget_is_met_exactly(tmp_path, learners):
    config = cluster(1, 1, learners, scheduled_global_steps=40)
    config["cluster"].update(SLOW_BEATS)
    code, out, run_dir = run(tmp_path, config)
    assert code == 0, out
    summary = summary_of(run_dir)
    assert summary["learner_steps"] == 40
    assert summary["stopped_at"] == {"learner_steps": 40}


def test_an_es_iteration_budget_is_met_exactly(tmp_path):
    config = configured(es_tiny(2, 1, 1, population=4, scheduled_global_steps=3), cluster=SLOW_BEATS)
    code, out, run_dir = run(tmp_path, config)
    assert code == 0, out
    summary = summary_of(run_dir)
    assert summary["learner_steps"] == 3 and summary["stopped_at"] == {"learner_steps": 3}
    assert "at the stop env_steps 0" not in out
