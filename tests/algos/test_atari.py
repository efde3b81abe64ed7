"""Envs from config: env.wrappers, the Atari preset (training vs evaluation variant), the native
ALE vector backend against the Gymnasium path, the atari extra, and config errors."""

import json
import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest
import torch

from aiorl.cli.main import main
from aiorl.config import ConfigError, EnvConfig
from aiorl.envs import EnvRunner, make_env
from aiorl.envs.atari import AleVectorEnvs, EpisodicLife
from aiorl.experiment.loading import load_config
from aiorl.replay.frames import frame_layout
from aiorl.runtime.algorithm import build_algorithm

pytestmark = [
    pytest.mark.filterwarnings("ignore:`torch.jit.load` is deprecated:DeprecationWarning"),
    pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning"),
]


def chain(env):
    """Wrapper class names from the outside in."""
    names = []
    while isinstance(env, gym.Wrapper):
        names.append(type(env).__name__)
        env = env.env
    return names


# --------------------------------------------------------------------------- env.wrappers


def test_wrappers_apply_in_order_with_their_keywords():
    cfg = EnvConfig(
        id="CartPole-v1",
        wrappers=[
            {"TimeLimit": {"max_episode_steps": 3}},
            {"ClipReward": {"max_reward": 0.5}},
            "RecordEpisodeStatistics",
        ],
    )
    env = make_env(cfg)
    assert chain(env)[:3] == ["RecordEpisodeStatistics", "ClipReward", "TimeLimit"]
    env.reset(seed=0)
    steps = [env.step(0) for _ in range(3)]
    assert [s[1] for s in steps] == [0.5, 0.5, 0.5] and steps[-1][3] is True  # clipped, cut at 3 steps


@pytest.mark.parametrize(
    "wrappers, message",
    [
        (["Nope"], r"env.wrappers\[0\]: unknown wrapper 'Nope'"),
        (
            ["ClipReward", "FrameStackObservatio"],
            r"env.wrappers\[1\]: unknown wrapper .*did you mean 'FrameStackObservation'",
        ),
        (
            [{"TimeLimit": {"max_step": 3}}],
            r"env.wrappers\[0\].TimeLimit: unknown keyword 'max_step'; did you mean 'max_episode_steps'",
        ),
        ([{"FrameStackObservation": {}}], r"env.wrappers\[0\].FrameStackObservation: missing keyword\(s\) stack_size"),
        ([{"ClipReward": {"min_reward": 0}, "TimeLimit": {}}], r"env.wrappers\[0\]: expected a wrapper name"),
        ("ClipReward", r"env.wrappers: expected list"),
    ],
)
def test_bad_wrappers_are_config_errors_naming_the_item(wrappers, message):
    with pytest.raises(ConfigError, match=message):
        load_config(data={"algo": "random_agent", "env": {"wrappers": wrappers}})


def test_bad_wrapper_from_the_cli_is_one_line_and_exit_2(tmp_path, capsys):
    path = tmp_path / "c.json"
    path.write_text(
        json.dumps(
            {
                "algo": "random_agent",
                "env": {"wrappers": [{"TimeLimit": {"steps": 1}}]},
                "run": {"dir": str(tmp_path / "run")},
            }
        )
    )
    assert main(["run", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "env.wrappers[0].TimeLimit: unknown keyword 'steps'" in err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "env, message",
    [
        ({"id": "ALE/Pong-v5", "preset": "atar"}, "env.preset: expected one of atari"),
        ({"id": "ALE/Pong-v5", "preset": "atari", "preset_options": {"noop": 0}}, "env.preset_options.noop_max"),
        (
            {"id": "ALE/Pong-v5", "preset": "atari", "preset_options": {"frame_stack": 0}},
            "frame_stack: must be at least 1",
        ),
        ({"id": "ALE/Pong-v5", "preset": "atari", "kwargs": {"frameskip": 4}}, "env.kwargs.frameskip"),
        ({"id": "ALE/Pong-v5", "backend": "ale_vector"}, "set env.preset: atari"),
        ({"id": "ALE/Pong-v5", "preset": "atari", "backend": "envpool"}, "env.backend: unknown backend 'envpool'"),
        (
            {"id": "ALE/Pong-v5", "preset": "atari", "backend": "ale_vector", "wrappers": ["ClipReward"]},
            "cannot apply Gymnasium wrappers",
        ),
        (
            {"id": "ALE/Pong-v5", "preset": "atari", "backend": "ale_vector", "kwargs": {"mode": 1}},
            "env.kwargs.mode: not an ale_vector option",
        ),
        ({"id": "CartPole-v1", "preset_options": {"noop_max": 0}}, "set env.preset too"),
    ],
)
def test_bad_atari_settings_are_config_errors(env, message):
    with pytest.raises(ConfigError, match=message):
        load_config(data={"algo": "apex_dqn", "env": env})


# --------------------------------------------------------------------------- the preset


def atari_cfg(env_id="ALE/Breakout-v5", **options):
    return EnvConfig(id=env_id, preset="atari", preset_options=options)


def test_preset_training_and_evaluation_variants():
    train, evaluation = make_env(atari_cfg()), make_env(atari_cfg(), evaluation=True)
    assert chain(train) == [
        "FrameStackObservation",
        "ClipReward",
        "EpisodicLife",
        "RecordEpisodeStatistics",
        "AtariPreprocessing",
        "OrderEnforcing",
        "PassiveEnvChecker",
    ]
    assert chain(evaluation) == [
        "FrameStackObservation",
        "RecordEpisodeStatistics",
        "AtariPreprocessing",
        "OrderEnforcing",
        "PassiveEnvChecker",
    ]
    for env in (train, evaluation):
        assert env.observation_space.shape == (4, 84, 84) and env.observation_space.dtype == np.uint8
        assert env.unwrapped._frameskip == 1 and env.unwrapped.ale.getFloat("repeat_action_probability") == 0.0
    obs, _ = train.reset(seed=0)
    assert all(np.array_equal(obs[0], obs[j]) for j in range(4))  # a new episode: its first frame, stacked


def test_life_loss_ends_a_training_episode_but_not_the_game():
    env = make_env(atari_cfg(noop_max=0))
    env.reset(seed=0)
    ale = env.unwrapped.ale
    lives, terminated, t = ale.lives(), False, 0
    while not terminated:
        obs, reward, terminated, truncated, info = env.step(1)  # FIRE: serve, never move
        t += 1
    assert ale.lives() == lives - 1 and "episode" not in info  # a life, not the game
    frame = ale.getEpisodeFrameNumber()
    obs2, _ = env.reset()
    assert ale.getEpisodeFrameNumber() == frame  # the game went on: no reset, no no-op step
    assert all(np.array_equal(obs2[j], obs[-1]) for j in range(4))  # the new episode starts on that screen
    wrapper = env
    while not isinstance(wrapper, EpisodicLife):
        wrapper = wrapper.env
    assert wrapper.lives == lives - 1


def write_fire_policy(path):
    class Fire(torch.nn.Module):
        def forward(self, obs: torch.Tensor) -> torch.Tensor:
            return torch.ones(obs.shape[0], dtype=torch.int64)

    torch.jit.script(Fire()).save(str(path))


def test_eval_plays_full_games_with_raw_rewards(tmp_path, capsys):
    cfg = load_config(
        data={
            "algo": "apex_dqn",
            "env": {"id": "ALE/Breakout-v5", "preset": "atari", "preset_options": {"noop_max": 0}},
        }
    )
    cfg.dump(tmp_path / "config.yaml")
    write_fire_policy(tmp_path / "fire.pt")
    fire = str(tmp_path / "fire.pt")  # a TorchScript program: loaded only when trusted
    assert main(["eval", str(tmp_path), "--policy", fire, "--episodes", "1", "--json", "--trust-program"]) == 0
    result = json.loads(capsys.readouterr().out)
    # The same game by hand on the evaluation variant: every life, unclipped rewards.
    env = make_env(cfg.env, evaluation=True)
    env.reset(seed=0)
    total, length, done = 0.0, 0, False
    while not done:
        _, reward, terminated, truncated, _ = env.step(1)
        total, length, done = total + reward, length + 1, terminated or truncated
    assert env.unwrapped.ale.lives() == 0
    assert result["lengths"] == [length] and result["returns"] == [total]


# --------------------------------------------------------------------------- native vector backend


def rollout(backend, steps, seed=3):
    cfg = EnvConfig(id="ALE/Breakout-v5", preset="atari", num_envs=2, backend=backend, preset_options={"noop_max": 0})
    runner = EnvRunner(cfg, 2, seed=seed)
    rng = np.random.default_rng(seed)
    try:
        out = runner.rollout(lambda obs: rng.integers(0, 4, len(obs)), steps)
        out["games"] = runner.pop_episodes()
        return out
    finally:
        runner.close()


def test_ale_vector_backend_gives_the_gymnasium_transitions():
    ours, theirs = rollout("ale_vector", 450), rollout("gymnasium", 450)
    assert ours["terminated"].sum() >= 8 and len(ours["games"][0]) >= 2  # life losses and whole games
    assert ours["truncated"].sum() == 0
    for key in ("obs", "action", "reward", "next_obs", "terminated", "truncated"):
        assert ours[key].dtype == theirs[key].dtype and np.array_equal(ours[key], theirs[key]), key
    assert ours["games"] == theirs["games"]


def test_ale_vector_envs_report_final_observations_and_new_stacks():
    envs = AleVectorEnvs(atari_cfg(noop_max=0), 1)
    obs = envs.reset(seed=0)
    assert all(np.array_equal(obs[0, j], obs[0, 3]) for j in range(3))  # zero padding replaced
    for _ in range(2000):
        next_obs, reward, terminated, truncated, reset_obs, games = envs.step(np.array([1]))
        if terminated[0]:
            break
    assert 0 in reset_obs and not np.array_equal(next_obs[0], reset_obs[0])
    assert all(np.array_equal(reset_obs[0][j], next_obs[0][3]) for j in range(4))  # life lost: same screen
    envs.close()


# --------------------------------------------------------------------------- extra, device, layout


def test_without_the_extra_atari_is_one_line_naming_it(tmp_path):
    """An ALE/ id, or the preset, on an install without ale-py: exit 2, one line, nothing started."""
    paths = []
    for i, env in enumerate([{"id": "ALE/Pong-v5"}, {"id": "ALE/Pong-v5", "preset": "atari"}]):
        paths.append(tmp_path / f"c{i}.json")
        paths[-1].write_text(json.dumps({"algo": "apex_dqn", "env": env, "run": {"dir": str(tmp_path / "run")}}))
    code = (
        "import contextlib, io, sys; sys.modules['ale_py'] = None; from aiorl.cli.main import main\n"
        f"for path in {[str(p) for p in paths]!r}:\n"
        "    err = io.StringIO()\n"
        "    with contextlib.redirect_stderr(err):\n"
        "        code = main(['run', path])\n"
        "    print(code, repr(err.getvalue()))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    lines = proc.stdout.splitlines()
    assert proc.returncode == 0 and len(lines) == 2, proc.stdout + proc.stderr
    for line in lines:
        code, err = line.split(" ", 1)
        err = eval(err)  # the repr printed above
        assert code == "2" and err.count("\n") == 1 and "pip install 'aiorl[atari]'" in err, line
        assert "Traceback" not in err
    assert not (tmp_path / "run").exists()


def test_a_cuda_device_without_cuda_is_a_config_error_before_anything_starts(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"algo": "apex_dqn", "model": {"device": "cuda"}, "run": {"dir": str(tmp_path / "r")}}))
    assert main(["run", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "model.device: 'cuda' asked for, but torch sees no CUDA device" in err
    assert main(["run", str(path), "--role", "learner"]) == 2
    assert "model.device" in capsys.readouterr().err and not (tmp_path / "r").exists()
    # Actors never use the learner's device: their hosts need no GPU.
    cfg = load_config(path, ["cluster.port=1"])
    assert cfg.model.device == "cuda"


def test_frame_layout_is_chosen_for_stacked_frames_only():
    def layout(env, **agent):
        cfg = load_config(data={"algo": "apex_dqn", "env": env, "agent": agent})
        return frame_layout(cfg, build_algorithm(cfg))

    atari = {"id": "ALE/Pong-v5", "preset": "atari"}
    pong = layout(atari)
    assert pong.fields == ("obs", "next_obs") and pong.stack == 4 and pong.frame_shape == (84, 84)
    assert layout({"id": "CartPole-v1"}) is None
    assert layout(atari, replay_layout="transitions") is None
    with pytest.raises(ConfigError, match="agent.replay_layout: 'frames' does not fit"):
        layout({"id": "CartPole-v1"}, replay_layout="frames")
    with pytest.raises(ConfigError, match="agent.replay_layout: expected"):
        layout(atari, replay_layout="frame")
    cfg = load_config(data={"algo": "apex_dqn", "env": atari, "run": {"snapshot_replay": True}})
    with pytest.raises(ConfigError, match="run.snapshot_replay"):
        frame_layout(cfg, build_algorithm(cfg))


def test_frame_compression_is_checked_when_the_config_loads(monkeypatch):
    with pytest.raises(ConfigError, match="cluster.frame_compression: expected 'none' or 'lz4', got 'zstd'"):
        load_config(data={"algo": "random_agent", "cluster": {"frame_compression": "zstd"}})
    monkeypatch.setitem(sys.modules, "lz4", None)
    monkeypatch.setitem(sys.modules, "lz4.block", None)
    with pytest.raises(ConfigError, match=r"'lz4' needs the lz4 package: pip install 'aiorl\[atari\]'"):
        load_config(data={"algo": "random_agent", "cluster": {"frame_compression": "lz4"}})
