"""`aiorl eval RUN_DIR`: text and JSON output, reproducible episodes, clear errors."""
import json
import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest
import torch

from aiorl.cli import main
from apex_helpers import make_algo

pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.load` is deprecated:DeprecationWarning")


def make_run_dir(tmp_path, algo_name="apex_dqn", env_id="CartPole-v1"):
    algo = make_algo(algo_name, env_id)
    algo.cfg.dump(tmp_path / "config.yaml")
    learner = algo.make_learner(0, 1, seed=0)
    learner.export_policy(str(tmp_path / "policy"))
    return tmp_path, learner


def manual_returns(policy, env_id, episodes, seed):
    env = gym.make(env_id)
    returns = []
    for k in range(episodes):
        obs, _ = env.reset(seed=seed + k)
        total, done = 0.0, False
        while not done:
            action = policy(torch.as_tensor(obs[None]))[0].detach().numpy()
            action = int(action) if hasattr(env.action_space, "n") else action
            obs, reward, terminated, truncated, _ = env.step(action)
            total += float(reward)
            done = terminated or truncated
        returns.append(total)
    return returns


def test_json_output_matches_the_policy_run_by_hand(tmp_path, capsys):
    run_dir, _ = make_run_dir(tmp_path)
    assert main(["eval", str(run_dir), "--episodes", "4", "--seed", "7", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["env"] == "CartPole-v1" and result["episodes"] == 4 and result["seed"] == 7
    expected = manual_returns(torch.jit.load(str(run_dir / "policy" / "policy.pt")), "CartPole-v1", 4, 7)
    assert result["returns"] == expected
    assert result["mean"] == pytest.approx(np.mean(expected)) and result["std"] == pytest.approx(np.std(expected))
    assert result["min"] == min(expected) and result["max"] == max(expected)
    assert len(result["lengths"]) == 4 and result["lengths"] == [int(r) for r in expected]  # CartPole: +1 per step


def test_text_output_and_same_seed_same_episodes(tmp_path, capsys):
    run_dir, _ = make_run_dir(tmp_path)
    assert main(["eval", str(run_dir), "--episodes", "3", "--seed", "1"]) == 0
    text = capsys.readouterr().out
    assert text.startswith(f"CartPole-v1: 3 episodes (seed 1) with {run_dir / 'policy' / 'policy.pt'}")
    assert "return mean " in text and " std " in text and " min " in text and " max " in text
    main(["eval", str(run_dir), "--episodes", "3", "--seed", "1", "--json"])
    first = json.loads(capsys.readouterr().out)
    main(["eval", str(run_dir), "--episodes", "3", "--seed", "1", "--json"])
    assert json.loads(capsys.readouterr().out)["returns"] == first["returns"]
    assert f"return mean {first['mean']:.2f}" in text


def test_box_actions(tmp_path, capsys):
    run_dir, _ = make_run_dir(tmp_path, "apex_ddpg", "Pendulum-v1")
    assert main(["eval", str(run_dir), "--episodes", "2", "--seed", "5", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    policy = torch.jit.load(str(run_dir / "policy" / "policy.pt"))
    assert result["returns"] == manual_returns(policy, "Pendulum-v1", 2, 5)
    # The policy's own actions, not some stand-in: a do-nothing policy scores otherwise.
    assert result["returns"] != manual_returns(lambda obs: torch.zeros(1, 1), "Pendulum-v1", 2, 5)


def test_errors_exit_2_with_a_reason(tmp_path, capsys):
    assert main(["eval", str(tmp_path)]) == 2
    assert "is not a run directory (no config.yaml)" in capsys.readouterr().err
    run_dir, _ = make_run_dir(tmp_path)
    (run_dir / "policy" / "policy.pt").unlink()
    assert main(["eval", str(run_dir)]) == 2
    assert "no exported policy at" in capsys.readouterr().err
    assert main(["eval", str(run_dir), "--episodes", "0"]) == 2


def test_console_command(tmp_path):
    run_dir, _ = make_run_dir(tmp_path)
    out = subprocess.run([sys.executable, "-m", "aiorl", "eval", str(run_dir), "--episodes", "1", "--json"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["episodes"] == 1
