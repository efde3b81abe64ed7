"""`aiorl eval RUN_DIR`: text and JSON output, reproducible episodes, clear errors."""

import json
import os
import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest
import torch
from apex_helpers import make_algo

from aiorl.cli.main import main


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
    expected = manual_returns(torch.export.load(str(run_dir / "policy" / "policy.pt2")).module(), "CartPole-v1", 4, 7)
    assert result["returns"] == expected
    assert result["mean"] == pytest.approx(np.mean(expected)) and result["std"] == pytest.approx(np.std(expected))
    assert result["min"] == min(expected) and result["max"] == max(expected)
    assert len(result["lengths"]) == 4 and result["lengths"] == [int(r) for r in expected]  # CartPole: +1 per step


def test_text_output_and_same_seed_same_episodes(tmp_path, capsys):
    run_dir, _ = make_run_dir(tmp_path)
    assert main(["eval", str(run_dir), "--episodes", "3", "--seed", "1"]) == 0
    text = capsys.readouterr().out
    assert text.startswith(
        f"CartPole-v1: 3 episodes (seed 1) with the final policy {run_dir / 'policy' / 'policy.safetensors'}"
    )
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
    policy = torch.export.load(str(run_dir / "policy" / "policy.pt2")).module()
    assert result["returns"] == manual_returns(policy, "Pendulum-v1", 2, 5)
    # The policy's own actions, not some stand-in: a do-nothing policy scores otherwise.
    assert result["returns"] != manual_returns(lambda obs: torch.zeros(1, 1), "Pendulum-v1", 2, 5)


def test_errors_exit_2_with_a_reason(tmp_path, capsys):
    assert main(["eval", str(tmp_path)]) == 2
    assert "is not a run directory (no config.yaml)" in capsys.readouterr().err
    assert main(["eval", str(tmp_path / "nope")]) == 2
    assert (
        capsys.readouterr().err
        == f"aiorl eval: {tmp_path / 'nope'} does not exist (a run directory, such as runs/latest, was expected)\n"
    )
    assert main(["status", str(tmp_path / "nope")]) == 2
    assert f"TARGET '{tmp_path / 'nope'}' does not exist" in capsys.readouterr().err
    run_dir, _ = make_run_dir(tmp_path)
    (run_dir / "policy" / "policy.pt2").unlink()
    (run_dir / "policy" / "policy.safetensors").unlink()
    assert main(["eval", str(run_dir)]) == 2
    assert "no exported policy at" in capsys.readouterr().err
    assert main(["eval", str(run_dir), "--episodes", "0"]) == 2


def test_console_command(tmp_path):
    run_dir, _ = make_run_dir(tmp_path)
    out = subprocess.run(
        [sys.executable, "-m", "aiorl", "eval", str(run_dir), "--episodes", "1", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["episodes"] == 1


def test_checkpoint_n_evaluates_that_checkpoint_not_the_export(tmp_path, capsys):
    run_dir, _ = make_run_dir(tmp_path)
    older = make_algo("apex_dqn", "CartPole-v1").make_learner(0, 1, seed=5)
    older.save_checkpoint(str(run_dir / "checkpoints"), {"learner_steps": 40})
    older.export_policy(str(tmp_path / "older"))
    assert main(["eval", str(run_dir), "--episodes", "3", "--checkpoint", "40", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["policy"].endswith("checkpoint-000000040.pt")
    expected = manual_returns(torch.export.load(str(tmp_path / "older" / "policy.pt2")).module(), "CartPole-v1", 3, 0)
    assert result["returns"] == expected
    assert main(["eval", str(run_dir), "--checkpoint", "41"]) == 2
    assert "no checkpoint at learner step 41 (learner steps there: 40)" in capsys.readouterr().err


def test_video_records_every_episode(tmp_path, capsys):
    pytest.importorskip("moviepy")
    pytest.importorskip("pygame")
    run_dir, _ = make_run_dir(tmp_path)
    assert main(["eval", str(run_dir), "--episodes", "2", "--video", str(tmp_path / "video"), "--json"]) == 0
    videos = sorted((tmp_path / "video").glob("*.mp4"))
    assert [v.name for v in videos] == ["eval-episode-0.mp4", "eval-episode-1.mp4"]
    assert all(v.stat().st_size > 0 for v in videos)


def test_video_on_a_headless_host_prints_nothing_on_stderr(tmp_path):
    """No display and no XDG_RUNTIME_DIR (a server, CI): the recording is off screen, so nothing
    may complain on stderr. A process of its own: SDL's state is per process."""
    pytest.importorskip("moviepy")
    pytest.importorskip("pygame")
    run_dir, _ = make_run_dir(tmp_path)
    env = {k: v for k, v in os.environ.items() if k not in ("XDG_RUNTIME_DIR", "SDL_VIDEODRIVER", "DISPLAY")}
    done = subprocess.run(
        [sys.executable, "-m", "aiorl", "eval", str(run_dir), "--episodes", "1", "--video", str(tmp_path / "v")],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    assert [v.name for v in (tmp_path / "v").glob("*.mp4")] == ["eval-episode-0.mp4"]


def test_video_without_its_extra_and_render_mode_wiring(tmp_path, capsys, monkeypatch):
    import aiorl.envs
    import aiorl.evaluation.options

    run_dir, _ = make_run_dir(tmp_path)
    monkeypatch.setattr(aiorl.evaluation.options, "VIDEO_ENCODER", "no_such_encoder_module")
    assert main(["eval", str(run_dir), "--video", str(tmp_path / "v")]) == 2
    err = capsys.readouterr().err
    assert "pip install 'aiorl[video]'" in err and "Traceback" not in err and len(err.splitlines()) == 1
    modes = []
    real_make_env = aiorl.envs.make_env

    def make_env(env_cfg, evaluation=False):  # no display here: record the mode, render nothing
        modes.append(env_cfg.kwargs.get("render_mode"))
        return real_make_env(env_cfg.__class__(**{**vars(env_cfg), "kwargs": {}}), evaluation)

    monkeypatch.setattr(aiorl.envs, "make_env", make_env)
    assert main(["eval", str(run_dir), "--episodes", "1", "--render"]) == 0
    assert modes[-1] == "human"  # the episodes' env (an earlier one only read the spaces, to check the policy)
