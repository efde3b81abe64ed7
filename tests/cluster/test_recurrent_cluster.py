"""Recurrent IMPALA, DPPO and R2D2 through the real runtime (`aiorl run` on the examples, real role
processes over loopback): the state each step was acted from crosses the wire with the
fragments, rollouts or sequences, the learners unroll them, and the exported policy takes and returns
its state in `aiorl eval` and in plain torch. Short budgets: the learning itself is measured
by the examples (`bench/learning.py table`), which take minutes on 2 cores."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from cluster_helpers import run

from aiorl.io import checkpoint

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.cluster


def example(name: str, **agent) -> dict:
    config = yaml.safe_load((ROOT / "examples" / name).read_text())
    config["agent"].update(agent)
    config["run"] = {"eval_every": None}
    return config


@pytest.mark.parametrize(
    "name, agent, learners",
    [
        ("impala_lstm_cartpole_novel.yaml", {"scheduled_timesteps": 3072}, 1),
        ("dppo_lstm_cartpole_novel.yaml", {"scheduled_timesteps": 2048}, 1),
        # Two data-parallel learners: each unrolls its share of the rows, which may start mid-rollout.
        ("dppo_lstm_cartpole_novel.yaml", {"scheduled_timesteps": 2048}, 2),
        ("r2d2_cartpole_novel.yaml", {"scheduled_global_steps": 40, "learning_starts": 20}, 1),
    ],
    ids=["impala", "dppo", "dppo-2-learners", "r2d2"],
)
def test_a_recurrent_run_trains_and_exports_a_policy_that_carries_its_state(tmp_path, name, agent, learners):
    config = example(name, **agent)
    config["cluster"]["learners"] = learners
    code, out, run_dir = run(tmp_path, config, timeout_s=300)
    assert code == 0, out
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["learner_steps"] > 0, summary
    if learners > 1:  # every learner stepped, and all ended on one model
        roles = [summary["roles"][f"learner-{i}"] for i in range(learners)]
        assert all(r["counters"]["learner_steps"] > 0 for r in roles), roles
        assert len({r["stats"]["weights_digest"] for r in roles}) == 1, roles

    policy_dir = run_dir / "policy"
    meta = json.loads(next(policy_dir.rglob("policy.json")).read_text())
    assert meta["recurrent"] == {"type": "lstm", "hidden": 64, "state_size": 128}, meta
    assert meta["observation_shape"] == [2], meta  # mask_velocity: (x, theta)

    # Plain torch, no aiorl: (obs, state) -> (action, next state), the state changing with the steps.
    program = torch.export.load(str(next(policy_dir.rglob("policy.pt2")))).module()
    state = torch.zeros(3, 128)
    obs = torch.as_tensor(np.array([[0.01, 0.02], [-0.03, 0.04], [0.0, -0.05]], np.float32))
    action, state2 = program(obs, state)
    assert action.shape == (3,) and action.dtype == torch.int64
    assert state2.shape == (3, 128) and not torch.equal(state2, state)

    result = subprocess.run(
        [sys.executable, "-m", "aiorl", "eval", str(run_dir), "--episodes", "3", "--json"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert len(json.loads(result.stdout)["returns"]) == 3, result.stdout


def test_an_r2d2_run_resumes_from_its_checkpoint(tmp_path):
    config = example("r2d2_cartpole_novel.yaml", scheduled_global_steps=30, learning_starts=20)
    code, out, run_dir = run(tmp_path, config, timeout_s=300)
    assert code == 0, out
    run_dir = run_dir.resolve()
    first, _, _ = checkpoint.newest_good(run_dir / "checkpoints")
    assert first is not None and checkpoint.read_meta(first)["learner_steps"] >= 30
    resumed = subprocess.run(
        [sys.executable, "-m", "aiorl", "run", "--resume", str(run_dir), "--quiet"]
        + ["--set", "agent.scheduled_global_steps=60"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert f"resuming from {first}" in resumed.stdout + resumed.stderr
    newest, _, _ = checkpoint.newest_good(run_dir / "checkpoints")
    assert checkpoint.read_meta(newest)["learner_steps"] >= 60
