"""Config options through a real run (real role processes over loopback TCP): each
option must change what the run does, as seen in its summary, metrics and files."""

from __future__ import annotations

import numpy as np
import pytest
from cluster_helpers import cluster, last_metrics, read_json, run

from aiorl.experiment.loading import load_config
from aiorl.replay import ReplayBuffer
from aiorl.runtime.algorithm import build_algorithm

pytestmark = pytest.mark.cluster


def test_uniform_replay_credits_snapshots_and_env_options(tmp_path):
    credits, memories = 3, 2
    config = cluster(2, memories, 1, scheduled_global_steps=150, prioritized_replay=False)
    config["cluster"]["learner_credits"] = credits
    config["model"]["learner_step_sleep_s"] = 0.02  # slower than the memories: batches queue up
    # Every episode is cut at 5 steps (random CartPole never falls that soon), and with
    # Sutton & Barto's reward a step earns 0 unless the pole falls.
    config["env"].update(max_episode_steps=5, kwargs={"sutton_barto_reward": True})
    config["run"] = {"snapshot_replay": True}
    code, out, run_dir = run(tmp_path, config)
    assert code == 0, out
    summary = read_json(run_dir / "summary.json")
    roles = summary["roles"]

    # env.max_episode_steps and env.kwargs reached the actors' environments.
    row = last_metrics(run_dir)
    assert row["episode_length_mean_100"] == 5.0 and row["return_mean_100"] == 0.0

    # A learner holds at most learner_credits batches per memory; a slow one holds them all.
    learner = roles["learner-0"]["stats"]
    assert credits * memories - 1 <= learner["queue_depth_max"] <= credits * memories, learner
    assert summary["learner_steps"] >= 150

    # Uniform replay: no priorities travel back, yet every memory fed the learner.
    cfg = load_config(run_dir / "config.yaml")
    spec = build_algorithm(cfg).transition_spec()
    for m in range(memories):
        stats = roles[f"memory-{m}"]["stats"]
        link = stats["learners"]["learner-0"]
        assert link["batches_sent"] > 0 and link["priority_messages"] == 0
        # run.snapshot_replay: the replay as it was at the end, loadable.
        assert stats["snapshot"] == str(run_dir / f"replay-memory-{m}.npz")
        replay = ReplayBuffer(cfg.agent.buffer_size // memories, spec)
        replay.load(stats["snapshot"])
        assert len(replay) == stats["replay_size"] > 0
        rewards = replay.sample(256)["reward"]
        assert np.all(rewards == 0.0), "the env's kwargs changed its rewards"


def test_learning_starts_holds_learners_back(tmp_path):
    # 50k transitions per memory before any batch; the run stops after a few thousand.
    config = cluster(1, 2, 1, buffer_size=100_000, learning_starts=100_000, scheduled_timesteps=2000)
    code, out, run_dir = run(tmp_path, config)
    assert code == 0, out
    summary = read_json(run_dir / "summary.json")
    assert summary["learner_steps"] == 0
    for m in range(2):
        stats = summary["roles"][f"memory-{m}"]["stats"]
        assert 0 < stats["inserted"] < 50_000 and stats["sampled"] == 0, stats


def test_beta_anneals_to_its_final_value_and_sync_interval_spaces_weight_pulls(tmp_path):
    config = cluster(
        1,
        1,
        1,
        scheduled_global_steps=200,
        prioritized_replay_beta=0.4,
        prioritized_replay_beta_final=1.0,
        sync_interval=10**6,
    )
    config["model"]["learner_step_sleep_s"] = 0.01  # a run of a few heartbeats: newer weights get announced
    code, out, run_dir = run(tmp_path, config)
    assert code == 0, out
    summary = read_json(run_dir / "summary.json")
    assert summary["learner_steps"] >= 200
    # The beta the memory last sampled with is the final one: the schedule is over.
    assert summary["roles"]["memory-0"]["stats"]["learners"]["learner-0"]["beta"] == 1.0
    # Weights were published, but an actor checks for them only every 10**6 batches.
    assert summary["weights_version"] >= 5
    assert summary["roles"]["actor-0"]["stats"]["weights_version"] == -1
