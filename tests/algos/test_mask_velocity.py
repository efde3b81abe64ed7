"""`env.wrappers: [mask_velocity]`: the velocity entries removed per env, other envs refused
when the config loads (one line on stderr, exit 2, before any process starts)."""

import json

import gymnasium as gym
import numpy as np
import pytest

from aiorl.cli.main import main
from aiorl.config import ConfigError, EnvConfig
from aiorl.envs import make_env
from aiorl.envs.mask_velocity import KEPT, MaskVelocity, kept_entries
from aiorl.experiment.loading import load_config


@pytest.mark.parametrize(
    "env_id, kept",
    [
        ("CartPole-v1", [0, 2]),  # x, theta
        ("Pendulum-v1", [0, 1]),  # cos, sin
        ("MountainCar-v0", [0]),  # position
        ("MountainCarContinuous-v0", [0]),
        ("LunarLander-v3", [0, 1, 4, 6, 7]),  # x, y, angle, legs
    ],
)
def test_the_velocity_entries_are_removed(env_id, kept):
    if env_id.startswith("LunarLander"):
        pytest.importorskip("Box2D")
    raw = gym.make(env_id)
    masked = make_env(EnvConfig(id=env_id, wrappers=["mask_velocity"]))
    obs_raw, _ = raw.reset(seed=3)
    obs, _ = masked.reset(seed=3)
    assert masked.observation_space.shape == (len(kept),)
    np.testing.assert_array_equal(obs, obs_raw[kept])
    np.testing.assert_array_equal(masked.observation_space.low, raw.observation_space.low[kept])
    action = raw.action_space.sample()
    np.testing.assert_array_equal(masked.step(action)[0], raw.step(action)[0][kept])
    raw.close()
    masked.close()


def test_lunarlander_keeps_position_angle_and_legs_without_box2d():
    # x, y, vx, vy, angle, angular velocity, leg 1, leg 2 (the env needs Box2D; the table does not)
    assert kept_entries("LunarLander-v3") == kept_entries("LunarLanderContinuous-v3") == (0, 1, 4, 6, 7)
    assert kept_entries("MountainCarContinuous-v0") == (0,) and kept_entries("Pendulum-v1") == (0, 1)


def test_every_known_env_keeps_fewer_entries_than_it_has():
    for name, kept in KEPT.items():
        assert len(kept) == len(set(kept)) and kept == tuple(sorted(kept)), name


def test_cartpole_keeps_position_and_angle_only():
    env = MaskVelocity(gym.make("CartPole-v1"))
    np.testing.assert_allclose(env.observation(np.array([0.1, 0.2, 0.3, 0.4], np.float32)), [0.1, 0.3])


def test_an_unknown_env_is_a_config_error_naming_it():
    with pytest.raises(
        ConfigError, match=r"env.wrappers\[0\].mask_velocity: knows the velocity entries of .*'Acrobot-v1'"
    ):
        load_config(data={"algo": "random_agent", "env": {"id": "Acrobot-v1", "wrappers": ["mask_velocity"]}})


def test_an_unknown_env_from_the_cli_is_one_line_and_exit_2(tmp_path, capsys):
    path = tmp_path / "c.json"
    path.write_text(
        json.dumps(
            {
                "algo": "random_agent",
                "env": {"id": "Acrobot-v1", "wrappers": ["mask_velocity"]},
                "run": {"dir": str(tmp_path / "run")},
            }
        )
    )
    assert main(["run", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "mask_velocity" in err and "Acrobot-v1" in err
    assert not (tmp_path / "run").exists()
