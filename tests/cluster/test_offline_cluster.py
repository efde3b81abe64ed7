"""Offline runs on the distributed runtime: real `aiorl run`s over loopback whose memory hosts
serve shards of one logged CartPole dataset (written here: a fixed heuristic policy with 30%
random actions) and start no actors. Algorithm apex_dqn: its learner does without its actors'
``epsilon`` (`AlgorithmSettings.dataset_optional_fields`), which a dataset cannot give.

- 2 memory hosts x 2 learners: every row a memory host sent comes from its own shard (each row
  keeps its dataset index, which the host holds against its range as it samples), and the shards'
  ranges in summary.json cover the dataset exactly once;
- memory host 1 SIGKILLed mid-run is restarted, reloads its shard, and the run finishes, exit 0;
- a resumed offline run continues its counters (learner steps, epochs);
- offline.epochs stops the run, naming it;
- a bad dataset is one line on stderr, exit 2, before any process starts and with no run directory.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from cluster_helpers import alive, finish, last_metrics, live_status, pids, read_json, wait_for

from aiorl.io import checkpoint
from aiorl.offline.dataset import Dataset

pytestmark = pytest.mark.cluster

ROWS = 2000
BATCH = 32


def cartpole_dataset(rows: int = ROWS, epsilon: float = 0.3, seed: int = 0) -> Dataset:
    """CartPole steps of a pole-angle heuristic that takes a random action with probability
    `epsilon`, with that policy's probability of each action taken."""
    env = gym.make("CartPole-v1")
    rng = np.random.default_rng(seed)
    columns = {k: [] for k in ("obs", "action", "reward", "next_obs", "terminated", "truncated", "propensity")}
    obs, _ = env.reset(seed=seed)
    while len(columns["obs"]) < rows:
        greedy = int(obs[2] + 0.5 * obs[3] > 0)
        action = greedy if rng.random() >= epsilon else int(rng.integers(2))
        nxt, reward, terminated, truncated, _ = env.step(action)
        step = (obs, action, reward, nxt, terminated, truncated)
        for key, value in zip(columns, step):
            columns[key].append(value)
        columns["propensity"].append(1 - epsilon / 2 if action == greedy else epsilon / 2)
        obs = env.reset()[0] if terminated or truncated else nxt
    columns["truncated"][-1] = not columns["terminated"][-1]
    return Dataset(
        obs=np.array(columns["obs"], np.float32),
        action=np.array(columns["action"], np.int64),
        reward=np.array(columns["reward"], np.float32),
        next_obs=np.array(columns["next_obs"], np.float32),
        terminated=np.array(columns["terminated"], bool),
        truncated=np.array(columns["truncated"], bool),
        observation_space=env.observation_space,
        action_space=env.action_space,
        propensity=np.array(columns["propensity"]),
        env_id="CartPole-v1",
    )


@pytest.fixture(scope="module")
def dataset_path(tmp_path_factory) -> Path:
    from aiorl.offline.formats import write_dataset

    path = tmp_path_factory.mktemp("offline") / "cartpole"
    write_dataset(cartpole_dataset(), path)
    return path


def offline_config(dataset: Path, learners: int = 2, memories: int = 2, **agent) -> dict:
    return {
        "algo": "apex_dqn",
        "offline": {"dataset": str(dataset)},
        "cluster": {"memories": memories, "learners": learners},
        "agent": {"batch_size": BATCH, "publish_interval": 5, **agent},
        "model": {"network": ["linear:32", "relu"], "n_step": 3},
        "run": {"tensorboard": False},
    }


def kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def shards(summary: dict) -> dict[str, dict]:
    """Each memory host's account of its shard (summary.json's roles), by name."""
    return {name: r["stats"]["dataset"] for name, r in summary["roles"].items() if name.startswith("memory-")}


def assert_offline_summary(summary: dict, memories: int = 2) -> None:
    """No actor, no env step; the shards' ranges cover the dataset's rows exactly once, and no
    host sent a row outside its own."""
    assert not [name for name in summary["roles"] if name.startswith("actor")]
    assert summary["env_steps"] == 0 and summary["episodes"] == 0
    accounts = shards(summary)
    assert len(accounts) == memories
    covered = sorted(row for a in accounts.values() for row in range(*a["shard"]))
    assert covered == list(range(ROWS))
    for name, account in accounts.items():
        assert account["rows"] == ROWS and account["rows_outside_shard"] == 0, (name, account)
        assert account["rows_served"] > 0, (name, account)
    assert summary["epochs"] == pytest.approx(summary["learner_steps"] * BATCH / ROWS, rel=1e-4)


def test_two_memory_hosts_serve_two_learners_each_from_its_own_shard(launch, dataset_path):
    proc, run_dir = launch(offline_config(dataset_path, scheduled_global_steps=300, prioritized_replay=True))
    code, out = finish(proc)
    assert code == 0, out
    summary = read_json(run_dir / "summary.json")
    assert summary["stop_reason"].startswith("reached scheduled_global_steps"), summary["stop_reason"]
    assert_offline_summary(summary)
    memories = [summary["roles"][f"memory-{m}"]["stats"] for m in range(2)]
    for m, stats in enumerate(memories):
        sent = {name: account["batches_sent"] for name, account in stats["learners"].items()}
        assert set(sent) == {"learner-0", "learner-1"} and min(sent.values()) > 0, (m, sent)
        assert stats["dataset"]["rows_served"] == BATCH * sum(sent.values()) == stats["sampled"]
        assert sum(a["priorities_applied"] for a in stats["learners"].values()) > 0  # prioritized, as online
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert all(r["env_steps"] == 0 for r in rows) and rows[-1]["epochs"] == summary["epochs"]
    assert rows[-1]["dataset/rows_outside_shard"] == 0 and rows[-1]["replay_size"] == ROWS
    assert (run_dir / "policy").is_dir()
    status = subprocess.run(
        [sys.executable, "-m", "aiorl", "status", str(run_dir)], capture_output=True, text=True, timeout=60
    )
    assert status.returncode == 0 and "reached scheduled_global_steps" in status.stdout, status


def test_memory_host_1_killed_mid_run_reloads_its_shard_and_the_run_finishes(launch, dataset_path):
    config = offline_config(dataset_path, scheduled_global_steps=2500, prioritized_replay=False)
    proc, run_dir = launch(config)
    wait_for(lambda: (last_metrics(run_dir) or {}).get("learner_steps", 0) > 50, 120, "learning")
    status = live_status(run_dir)
    assert status is not None and "epochs" in status and not any(n.startswith("actor") for n in status["roles"])
    first = pids(run_dir)["memory-1"]
    kill(first)
    wait_for(lambda: pids(run_dir)["memory-1"] != first, 60, "memory-1 restarted")
    log = run_dir / "logs" / "memory-1.log"
    wait_for(lambda: log.read_text().count("serving rows [1000, 2000)") == 2, 60, "memory-1 serving its shard again")
    code, out = finish(proc)
    assert code == 0, out
    summary = read_json(run_dir / "summary.json")
    assert summary["ok"] and summary["roles"]["memory-1"]["restarts"] == 1, summary["roles"]["memory-1"]
    assert_offline_summary(summary)  # the restarted host's account: its shard, reloaded, and served
    assert shards(summary)["memory-1"]["shard"] == [1000, 2000]


def test_a_resumed_offline_run_continues_its_counters(tmp_path, launch, dataset_path):
    config = offline_config(dataset_path, learners=1, scheduled_global_steps=1500, prioritized_replay=False)
    config["run"].update({"checkpoint_every": 100, "checkpoint_interval_s": None})
    proc, run_dir = launch(config)
    newest = lambda: checkpoint.list_checkpoints(run_dir / "checkpoints")  # noqa: E731
    wait_for(lambda: proc.poll() is not None or len(newest()) >= 2, 180, "two checkpoints")
    assert proc.poll() is None, proc.stdout.read()
    roles = pids(run_dir)
    kill(proc.pid)
    kill(roles["memory-0"])
    proc.wait()
    wait_for(lambda: not any(alive(pid) for pid in roles.values()), 60, "the roles ending")
    (run_dir / "pids.json").unlink()
    resumed = launch.track(
        subprocess.Popen(
            [sys.executable, "-m", "aiorl", "run", "--resume", str(run_dir), "--quiet"],
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        ),
        run_dir,
    )
    code, out = finish(resumed, 240)
    assert code == 0, out
    summary = read_json(run_dir / "summary.json")
    assert summary["attempt"] == 2 and summary["resumed_from"]["learner_steps"] >= 100, summary["resumed_from"]
    learner = summary["roles"]["learner-0"]["stats"]
    # This launch's learner started at the checkpoint's count and stepped to the budget: the
    # run's counters went on from there, not from 0.
    assert learner["total_learner_steps"] - learner["learner_steps"] == summary["resumed_from"]["learner_steps"]
    assert summary["learner_steps"] == 1500 and summary["stop_reason"].startswith("reached scheduled_global_steps")
    assert_offline_summary(summary)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if "epochs" in line]
    resumed_rows = [r for r in rows if r.get("attempt") == 2]
    assert resumed_rows and resumed_rows[0]["learner_steps"] >= summary["resumed_from"]["learner_steps"]


def test_offline_epochs_stop_the_run_naming_them(launch, dataset_path):
    config = offline_config(dataset_path, learners=1, memories=2, prioritized_replay=False)
    config["offline"]["epochs"] = 2
    proc, run_dir = launch(config)
    code, out = finish(proc)
    assert code == 0, out
    summary = read_json(run_dir / "summary.json")
    assert summary["stop_reason"].startswith("reached offline.epochs"), summary["stop_reason"]
    assert summary["epochs"] >= 2 and summary["stopped_at"]["learner_steps"] * BATCH >= 2 * ROWS
    assert_offline_summary(summary)


def test_a_bad_dataset_is_one_line_exit_2_and_no_run_directory(tmp_path, dataset_path):
    bad = tmp_path / "not-a-dataset.csv"
    bad.write_text("this is not a dataset\n")
    config = offline_config(bad, scheduled_global_steps=10)
    run_dir = tmp_path / "run"
    config["run"]["dir"] = str(run_dir)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    result = subprocess.run(
        [sys.executable, "-m", "aiorl", "run", str(path), "--quiet"], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 2, result
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("aiorl: config error: offline.dataset: "), result.stderr
    assert not run_dir.exists()


def test_a_bad_eval_dataset_is_one_line_exit_2_and_no_run_directory(tmp_path, dataset_path):
    """offline.eval_dataset is read before anything starts, as offline.dataset is: a bad one
    would otherwise end the evaluation process after the run had begun."""
    bad = tmp_path / "held-out"
    bad.mkdir()
    config = offline_config(dataset_path, learners=1, memories=1, scheduled_global_steps=10)
    config["offline"]["eval_dataset"] = str(bad)
    config["run"]["dir"] = str(tmp_path / "run")
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    result = subprocess.run(
        [sys.executable, "-m", "aiorl", "run", str(path), "--quiet"], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 2, result
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("aiorl: config error: offline.eval_dataset: "), result.stderr
    assert str(bad) in lines[0] and not (tmp_path / "run").exists()


def test_an_offline_run_without_an_env_logs_its_off_policy_estimates(launch, dataset_path):
    """No env: each evaluation is the greedy policy's estimates on offline.eval_dataset alone
    (metrics ope/*), no return and no best policy kept."""
    config = offline_config(dataset_path, learners=1, memories=1, scheduled_global_steps=300)
    config["offline"]["eval_dataset"] = str(dataset_path)
    config["run"]["eval_every"] = 100
    proc, run_dir = launch(config)
    code, out = finish(proc)
    assert code == 0, out
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    scored = [r for r in rows if "ope/dr" in r]
    assert scored, rows[-1]
    assert all(np.isfinite(r["ope/dr"]) and np.isfinite(r["ope/fqe"]) for r in scored), scored
    assert all(r["eval/return_mean"] is None for r in scored), scored[0]
    assert not (run_dir / "policy" / "best").exists()
