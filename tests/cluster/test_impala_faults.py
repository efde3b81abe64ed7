"""IMPALA survives faults as Ape-X does, with real role processes over loopback: a SIGKILLed
actor is restarted and its successor sends fragments against fresh credits; a run whose every
process was SIGKILLed resumes from its newest checkpoint."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
from cluster_helpers import alive, finish, last_metrics, live_status, pids, read_json, wait_for
from test_faults import metrics_rows
from test_impala_cluster import impala_config

from aiorl.io import checkpoint

pytestmark = pytest.mark.cluster


def kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def assert_every_fragment_accounted_for(memory: dict) -> None:
    """Every fragment message the memory accepted came in sequence on one actor connection and was
    trained on, dropped (counted) or left queued at the end."""
    q = memory["queue"]
    assert q["pushed"] == q["taken"] + q["dropped_full"] + q["dropped_lag"] + q["left_at_end"], q
    connections = [c for a in memory["actors"].values() for c in a["connections"]]
    assert sum(c["batches"] for c in connections) == q["messages"], (q, connections)
    assert all(c["seq_errors"] == 0 and c["next_seq"] == c["batches"] for c in connections), connections


def test_a_sigkilled_actor_is_restarted_and_its_successor_gets_credits(launch):
    """The run is stopped (SIGINT) once the successor has stepped: a restart that comes as a run
    ends is another matter (the launcher's)."""
    config = impala_config()
    config["cluster"].update(max_restarts=1, restart_backoff_s=0.2, restart_backoff_max_s=1.0)
    proc, run_dir = launch(config)
    wait_for(lambda: (last_metrics(run_dir) or {}).get("learner_steps", 0) >= 20, 120, "training")
    first = pids(run_dir)["actor-0"]
    kill(first)
    wait_for(lambda: pids(run_dir)["actor-0"] != first, 60, "a successor")
    successor = pids(run_dir)["actor-0"]
    per_message = config["env"]["num_envs"] * config["agent"]["sample_batch_size"]

    def stepped() -> bool:
        role = (live_status(run_dir) or {}).get("roles", {}).get("actor-0", {})
        return (
            role.get("pid") == successor
            and role.get("status") == "running"
            and role.get("counters", {}).get("env_steps", 0) >= 4 * per_message
        )

    wait_for(stepped, 60, "the successor stepping")
    proc.send_signal(signal.SIGINT)
    code, out = finish(proc, 120)
    assert code == 130, out
    summary = read_json(run_dir / "summary.json")
    assert summary["outcome"] == "interrupted" and summary["restarts"] == 1 and not summary["failures"]
    roles = summary["roles"]
    assert roles["actor-0"]["restarts"] == 1
    memory = roles["memory-0"]["stats"]
    assert_every_fragment_accounted_for(memory)
    connections = memory["actors"]["actor-0"]["connections"]
    assert len(connections) == 2 and connections[-1]["batches"] > 0 and connections[-1]["finished"]
    # The successor's own account matches the memory's.
    assert connections[-1]["transitions"] == roles["actor-0"]["stats"]["memories"][0]["transitions"]
    assert not any(alive(pid) for pid in read_json(run_dir / "pids.json").values())


def steps(run_dir) -> list[int]:
    """Learner steps of the checkpoints on disk, oldest first."""
    found = checkpoint.list_checkpoints(run_dir / "checkpoints")
    return [int(checkpoint.CHECKPOINT_RE.match(p.name).group(1)) for p in found]


def test_sigkill_every_process_then_resume_from_the_newest_checkpoint(tmp_path, launch):
    config = impala_config()
    config["agent"]["scheduled_global_steps"] = 400
    config["run"] = {"checkpoint_every": 50, "checkpoint_interval_s": None, "keep_checkpoints": 2}
    proc, run_dir = launch(config)
    started = pids(run_dir)
    # Two of every 50 steps: not the first one, written at the first publication (before the
    # run's counters reached learner 0), which pruning then drops.
    wait_for(lambda: steps(run_dir) and steps(run_dir)[0] >= 50 and len(steps(run_dir)) >= 2, 180, "2 checkpoints")
    for pid in [*started.values(), proc.pid]:  # no clean shutdown anywhere
        kill(pid)
    proc.wait(30)
    wait_for(lambda: not any(alive(pid) for pid in started.values()), 30, "every process gone")
    newest, saved, _ = checkpoint.newest_good(run_dir / "checkpoints")
    assert saved["algo"] == "impala" and saved["run"]["env_steps"] > 0

    resumed = subprocess.run(
        [sys.executable, "-m", "aiorl", "run", "--resume", str(run_dir), "--quiet"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    summary = read_json(run_dir / "summary.json")
    assert summary["outcome"] == "finished" and summary["attempt"] == 2 and summary["learner_steps"] >= 400
    assert summary["resumed_from"]["checkpoint"] == str(newest)
    second = [r for r in metrics_rows(run_dir) if r["attempt"] == 2]
    assert (second[0]["env_steps"], second[0]["learner_steps"]) == (
        saved["run"]["env_steps"],
        saved["run"]["learner_steps"],
    )
    learner = summary["roles"]["learner-0"]["stats"]
    assert learner["total_learner_steps"] - learner["learner_steps"] == saved["learner_steps"]
    assert learner["policy_lag"]["fragments"] > 0  # it trained on fragments of the resumed actors
    assert_every_fragment_accounted_for(summary["roles"]["memory-0"]["stats"])
