"""The offline algorithms learning from logged data through the real runtime (`aiorl run` with
an `offline:` section, then `aiorl eval`), on datasets written here. Shared by the helpers of
issue 45: each part adds its own test functions (and fixtures) in a section of its own."""

from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import yaml
from cluster_helpers import evaluated, run

from aiorl.offline.dataset import Dataset

ROOT = Path(__file__).resolve().parents[2]


# --------------------------------------------------------------------------
# Pendulum-v1 (IQL helper): iql and marwil through `aiorl run` on a dataset of the DDPG
# example's policy with Gaussian action noise, scored by `aiorl eval`.

PENDULUM_BEHAVIOUR = ROOT / "examples" / "policies" / "pendulum_ddpg" / "policy.safetensors"


def noisy_pendulum_dataset(episodes: int = 100, sigma: float = 0.5, seed: int = 1) -> tuple[Dataset, float]:
    """`episodes` Pendulum-v1 episodes of the DDPG example's policy with N(0, sigma^2) noise, in
    units of the action's half range, added to each action (clipped to the bounds); and their
    mean return: the distribution the examples' `aiorl collect ... --noise 1.0` logs (N(0, 1) on
    Pendulum's [-2, 2]), written here so that the test depends on the dataset writer only."""
    from aiorl import load_policy

    policy = load_policy(PENDULUM_BEHAVIOUR)
    env = gym.make("Pendulum-v1")
    low, high = env.action_space.low, env.action_space.high
    rng = np.random.default_rng(seed)
    steps, returns = [], []
    for episode in range(episodes):
        obs, _ = env.reset(seed=seed * 100_000 + episode)
        ret, done = 0.0, False
        while not done:
            mean = np.asarray(policy(obs[None].astype(np.float32)), np.float32).reshape(-1)
            action = np.clip(mean + sigma * (high - low) / 2 * rng.standard_normal(mean.shape), low, high)
            next_obs, reward, terminated, truncated, _ = env.step(action.astype(np.float32))
            steps.append((obs, action, reward, next_obs, terminated, truncated))
            ret, obs, done = ret + reward, next_obs, terminated or truncated
        returns.append(ret)
    obs, action, reward, next_obs, terminated, truncated = (np.array(x) for x in zip(*steps))
    dataset = Dataset(
        obs=obs.astype(np.float32),
        action=action.astype(np.float32),
        reward=reward.astype(np.float32),
        next_obs=next_obs.astype(np.float32),
        terminated=terminated.astype(bool),
        truncated=truncated.astype(bool),
        observation_space=env.observation_space,
        action_space=env.action_space,
        env_id="Pendulum-v1",
    )
    return dataset, float(np.mean(returns))


@pytest.fixture(scope="module")
def noisy_pendulum(tmp_path_factory) -> tuple[Path, float]:
    from aiorl.offline.formats import write_dataset

    dataset, behaviour_return = noisy_pendulum_dataset()
    path = tmp_path_factory.mktemp("pendulum") / "pendulum_ddpg"
    write_dataset(dataset, path)
    return path, behaviour_return


@pytest.mark.slow
@pytest.mark.cluster
@pytest.mark.parametrize("example", ["iql_pendulum.yaml", "marwil_pendulum.yaml"])
def test_pendulum_example_reaches_the_noisy_behaviours_return(tmp_path, noisy_pendulum, example):
    """The acceptance: the example's run on the noisy DDPG dataset scores at least the
    behaviour's mean return (about -170 to -180) and -200, over 50 episodes of `aiorl eval`."""
    path, behaviour_return = noisy_pendulum
    config = yaml.safe_load((ROOT / "examples" / example).read_text())
    config["offline"]["dataset"] = str(path)
    code, out, run_dir = run(tmp_path, config, timeout_s=600)
    assert code == 0, out
    result = evaluated(run_dir, episodes=50)
    assert result["mean"] >= max(-200.0, behaviour_return), (result, behaviour_return)


# --------------------------------------------------------------------------
# CartPole-v1 (DISCRETE helper): bc and marwil through `aiorl run` on the dataset the examples'
# `aiorl collect` command makes, scored by `aiorl eval --episodes 20`.

CARTPOLE_BEHAVIOUR = ROOT / "examples" / "policies" / "cartpole_dqn_200" / "policy.safetensors"


@pytest.fixture(scope="module")
def cartpole_dqn_200(tmp_path_factory) -> tuple[Path, float]:
    """The CartPole examples' dataset, made by the command their comments give (1,000 episodes,
    about 104k transitions, epsilon 0.3); and the behaviour's mean return in it."""
    import json
    import subprocess
    import sys

    out = tmp_path_factory.mktemp("cartpole") / "cartpole_dqn_200"
    command = [sys.executable, "-m", "aiorl", "collect", str(CARTPOLE_BEHAVIOUR), "-o", str(out)]
    command += ["--env", "CartPole-v1", "--episodes", "1000", "--epsilon", "0.3", "--seed", "0", "--json"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    return out, float(json.loads(result.stdout)["return_mean"])


@pytest.mark.slow
@pytest.mark.cluster
def test_bc_and_marwil_cartpole_examples(tmp_path, cartpole_dqn_200):
    """The acceptance: bc scores at least 90% of the behaviour's mean return in the dataset (its
    greedy clone, the random actions averaged out, scores about what the behaviour's own greedy
    policy does, far above the noisy behaviour); marwil beats bc; on the same 20 episodes."""
    path, behaviour_return = cartpole_dqn_200
    means = {}
    for algo in ("bc", "marwil"):
        config = yaml.safe_load((ROOT / "examples" / f"{algo}_cartpole.yaml").read_text())
        config["offline"]["dataset"] = str(path)
        (tmp_path / algo).mkdir()
        code, out, run_dir = run(tmp_path / algo, config, timeout_s=120)
        assert code == 0, out
        means[algo] = evaluated(run_dir, episodes=20)["mean"]
    assert means["bc"] >= 0.9 * behaviour_return, (means, behaviour_return)
    assert means["marwil"] > means["bc"], means


# --------------------------------------------------------------------------
# CartPole-v1 (Q helper): bcq and cql through `aiorl run` on the same dataset, scored by
# `aiorl eval --episodes 20`.


@pytest.mark.slow
@pytest.mark.cluster
@pytest.mark.parametrize("algo", ["bcq", "cql"])
def test_bcq_and_cql_cartpole_examples_reach_475(tmp_path, cartpole_dqn_200, algo):
    """The acceptance: from the behaviour's epsilon-0.3 log (mean return about 104) the example's
    run keeps a policy scoring at least 475 over 20 episodes of `aiorl eval`."""
    path, _ = cartpole_dqn_200
    config = yaml.safe_load((ROOT / "examples" / f"{algo}_cartpole.yaml").read_text())
    config["offline"]["dataset"] = str(path)
    code, out, run_dir = run(tmp_path, config, timeout_s=120)
    assert code == 0, out
    result = evaluated(run_dir, episodes=20)
    assert result["mean"] >= 475.0, result
