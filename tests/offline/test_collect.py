"""`aiorl collect` (`aiorl.evaluation.collect`): datasets logged from random actions, a policy
file and a run directory, with each step's behaviour probability of the action taken right;
its user errors one line, exit 2."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from aiorl.evaluation.collect import Behaviour, CollectError, collect
from aiorl.evaluation.policies import load_checked
from aiorl.offline.formats import load_dataset

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning")

POLICIES = Path(__file__).resolve().parents[2] / "examples" / "policies"
CARTPOLE = POLICIES / "cartpole_dqn_200" / "policy.safetensors"
PENDULUM = POLICIES / "pendulum_ddpg" / "policy.safetensors"


def greedy_of(path: Path, obs: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return np.asarray(load_checked(path)(torch.as_tensor(obs)))


def aiorl(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "aiorl", *args], capture_output=True, text=True, timeout=120)


def test_random_actions_on_cartpole_record_one_over_n(tmp_path):
    summary = collect("random", tmp_path / "d", 7, env_id="CartPole-v1", seed=3)
    data = load_dataset(tmp_path / "d")
    assert summary["episodes"] == 7 == len(data.episode_ends) and summary["rows"] == len(data)
    assert data.env_id == "CartPole-v1" and data.format == "aiorl"
    np.testing.assert_allclose(data.propensity, 0.5)
    assert 0.3 < data.action.mean() < 0.7
    ends = data.episode_ends
    returns = np.add.reduceat(data.reward, np.r_[0, ends[:-1] + 1])
    assert summary["return_mean"] == pytest.approx(returns.mean())
    # each episode is contiguous: a row's next observation is the next row's observation inside it
    inside = np.setdiff1d(np.arange(len(data) - 1), ends)
    np.testing.assert_array_equal(data.next_obs[inside], data.obs[inside + 1])


def test_random_box_actions_record_the_uniform_density(tmp_path):
    collect("random", tmp_path / "d", 2, env_id="Pendulum-v1")
    data = load_dataset(tmp_path / "d")
    np.testing.assert_allclose(data.propensity, 1 / 4.0)  # Pendulum's torque in [-2, 2]
    assert np.abs(data.action).max() <= 2.0


def test_epsilon_greedy_propensities_of_a_policy(tmp_path):
    summary = collect(str(CARTPOLE), tmp_path / "d", 12, epsilon=0.3, seed=1)
    data = load_dataset(tmp_path / "d")
    greedy = greedy_of(CARTPOLE, data.obs)
    took_greedy = data.action == greedy
    np.testing.assert_allclose(data.propensity[took_greedy], 0.85)
    np.testing.assert_allclose(data.propensity[~took_greedy], 0.15)
    assert 0.08 < (~took_greedy).mean() < 0.22  # eps/2 of the steps are the other action
    assert summary["episodes"] == 12 and "policy" in summary["behaviour"]


def test_a_greedy_policy_records_probability_one(tmp_path):
    collect(str(CARTPOLE), tmp_path / "d", 3)
    data = load_dataset(tmp_path / "d")
    np.testing.assert_array_equal(data.action, greedy_of(CARTPOLE, data.obs))
    np.testing.assert_allclose(data.propensity, 1.0)


def test_gaussian_noise_records_the_density_of_the_action(tmp_path):
    sigma = 0.3
    collect(str(PENDULUM), tmp_path / "d", 3, noise=sigma, env_id="Pendulum-v1", seed=2)
    data = load_dataset(tmp_path / "d")
    mean = greedy_of(PENDULUM, data.obs).reshape(-1)
    a = data.action.reshape(-1)
    inside = np.abs(a) < 2.0  # a clipped action's density is its unclipped draw's
    assert inside.mean() > 0.3
    want = np.exp(-0.5 * ((a - mean) / sigma) ** 2) / (np.sqrt(2 * np.pi) * sigma)
    np.testing.assert_allclose(data.propensity[inside], want[inside], rtol=1e-4)
    assert np.abs(a).max() <= 2.0


def test_box_epsilon_mixes_the_uniform_density_in():
    class Fixed:
        def __call__(self, obs):
            return torch.zeros(len(obs), 1)

    import gymnasium as gym

    space = gym.spaces.Box(-2.0, 2.0, (1,), np.float32)
    b = Behaviour(space, Fixed(), epsilon=0.25, noise=0.5, rng=np.random.default_rng(0))
    action, density = b.act(np.zeros((4000, 3), np.float32))
    a = action.reshape(-1)
    inside = np.abs(a) < 2.0
    gauss = np.exp(-0.5 * (a / 0.5) ** 2) / (np.sqrt(2 * np.pi) * 0.5)
    np.testing.assert_allclose(density[inside], 0.75 * gauss[inside] + 0.25 / 4.0, rtol=1e-5)

    # near the bound, a clipped action's density is its unclipped draw's: lower than at the bound, and varying
    class NearTheBound:
        def __call__(self, obs):
            return torch.full((len(obs), 1), 1.9)

    b = Behaviour(space, NearTheBound(), epsilon=0.0, noise=1.0, rng=np.random.default_rng(1))
    action, density = b.act(np.zeros((2000, 3), np.float32))
    clipped = action.reshape(-1) == 2.0
    at_bound = np.exp(-0.5 * 0.1**2) / np.sqrt(2 * np.pi)
    assert clipped.sum() > 100 and (density[clipped] < at_bound).all() and density[clipped].std() > 0.01
    deterministic = Behaviour(space, Fixed())
    assert deterministic.act(np.zeros((3, 3), np.float32))[1] is None


def test_a_run_directory_collects_with_its_policy_and_env(tmp_path):
    run = tmp_path / "run"
    (run / "policy").mkdir(parents=True)
    for name in ("policy.json", "policy.safetensors"):
        shutil.copy(CARTPOLE.with_name(name), run / "policy" / name)
    (run / "config.yaml").write_text("algo: apex_dqn\nenv:\n  id: CartPole-v1\n")
    result = aiorl("collect", str(run), "-o", str(tmp_path / "d"), "--episodes", "4", "--epsilon", "0.1")
    assert result.returncode == 0, result.stderr
    assert "collected 4 episodes" in result.stdout and "behaviour return mean" in result.stdout
    assert "collect: 4/4 episodes" in result.stderr  # progress goes to stderr
    data = load_dataset(tmp_path / "d")
    greedy = greedy_of(CARTPOLE, data.obs)
    np.testing.assert_allclose(data.propensity, np.where(data.action == greedy, 0.95, 0.05))


def test_episode_k_is_reset_with_seed_plus_k_beyond_the_first_lanes(tmp_path):
    from aiorl.evaluation.collect import LANES

    collect("random", tmp_path / "d", LANES + 6, env_id="CartPole-v1", seed=10)
    data = load_dataset(tmp_path / "d")
    firsts = data.obs[np.r_[0, data.episode_ends[:-1] + 1]]
    assert len(firsts) == LANES + 6 and len({row.tobytes() for row in firsts}) == LANES + 6


def test_the_same_seed_collects_the_same_dataset(tmp_path):
    for name in ("a", "b"):
        collect(str(CARTPOLE), tmp_path / name, 5, epsilon=0.2, seed=7)
    a, b = load_dataset(tmp_path / "a"), load_dataset(tmp_path / "b")
    np.testing.assert_array_equal(a.obs, b.obs)
    np.testing.assert_array_equal(a.action, b.action)


@pytest.mark.parametrize(
    "args, words",
    [
        (["random", "--episodes", "2"], "needs --env"),
        (["nowhere/run", "--episodes", "2"], "no such run directory"),
        ([str(CARTPOLE), "--episodes", "2", "--env", "Pendulum-v1"], "shape [4]"),
        ([str(CARTPOLE), "--episodes", "2", "--noise", "0.1"], "--noise is for Box"),
        (["random", "--env", "CartPole-v1", "--episodes", "0"], "--episodes must be"),
        (["random", "--env", "CartPole-v1", "--episodes", "2", "--format", "minari"], "NAME-vN"),
    ],
)
def test_user_errors_are_one_line_exit_2(tmp_path, args, words):
    result = aiorl("collect", "-o", str(tmp_path / "out"), *args)
    assert result.returncode == 2, result
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("aiorl collect: ") and words in lines[0], result.stderr
    assert not (tmp_path / "out").exists()


def test_an_existing_output_directory_is_refused(tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("mine")
    result = aiorl("collect", "random", "--env", "CartPole-v1", "-o", str(tmp_path / "out"), "--episodes", "1")
    assert result.returncode == 2 and "not an empty directory" in result.stderr
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["keep.txt"]
    with pytest.raises(CollectError):
        collect("random", tmp_path / "out", 1, env_id="CartPole-v1")
    collect("random", tmp_path / "empty", 1, env_id="CartPole-v1")  # a new directory is made
