"""bc and marwil: the losses and the MARWIL weights against hand computations, the moving
average of the squared advantage, beta = 0 stepping exactly as bc, Box actions (Gaussian
likelihood, exported mean), checkpoints, the transition spec, config errors and the action
spaces refused in one line; and (slow) learning on a CartPole dataset in one process."""

import math

import gymnasium as gym
import numpy as np
import pytest
import torch
from apex_helpers import make_constant
from offline_train_helpers import behaviour_dataset, evaluate, offline_algorithm, train_offline

from aiorl.algos.bc import bc_loss
from aiorl.algos.marwil import marwil_losses, marwil_weights, update_squared_norm
from aiorl.config import ConfigError
from aiorl.envs import EnvSpec
from aiorl.offline.rows import OFFLINE_FIELDS

SMALL = {"network": ["linear:8", "relu"]}


def algo(name, model=None, env_id="CartPole-v1"):
    return offline_algorithm(name, {**SMALL, **(model or {})}, env_id)


def cartpole_batch(rows=4, action=None, mc_return=None):
    obs = np.linspace(-1, 1, rows * 4, dtype=np.float32).reshape(rows, 4)
    return {
        "obs": obs,
        "action": np.arange(rows, dtype=np.int64) % 2 if action is None else np.asarray(action, np.int64),
        "mc_return": np.arange(rows, dtype=np.float32) if mc_return is None else np.asarray(mc_return, np.float32),
    }


# --------------------------------------------------------------------------
# The math


def test_bc_loss_is_the_negative_mean_log_likelihood():
    assert float(bc_loss(torch.tensor([math.log(0.5), math.log(0.25)]))) == pytest.approx(
        -(math.log(0.5) + math.log(0.25)) / 2
    )


def test_marwil_weights_are_exp_of_beta_times_the_normalised_advantage_clipped():
    advantage = torch.tensor([0.0, 2.0, -4.0, 1e6])
    weights = marwil_weights(advantage, beta=1.5, squared_norm=4.0, max_weight=20.0)
    # c = sqrt(4) = 2: exp(1.5 * A / 2), the last clipped at 20.
    expected = [1.0, math.exp(1.5), math.exp(-3.0), 20.0]
    assert torch.allclose(weights, torch.tensor(expected), rtol=1e-5)
    assert torch.equal(marwil_weights(advantage, 0.0, 4.0, 20.0), torch.ones(4))


def test_the_squared_advantage_norm_moves_toward_the_batchs_mean_square_at_its_rate():
    # mean A^2 = (1 + 9) / 2 = 5; 100 + 0.1 * (5 - 100) = 90.5
    assert update_squared_norm(100.0, torch.tensor([1.0, -3.0]), 0.1) == pytest.approx(90.5)
    assert update_squared_norm(100.0, torch.tensor([1.0, -3.0]), 1.0) == pytest.approx(5.0)


def test_marwil_losses_by_hand():
    log_prob, value = torch.tensor([-0.5, -1.0]), torch.tensor([1.0, 2.0])
    mc_return, weights = torch.tensor([3.0, 1.0]), torch.tensor([2.0, 0.5])
    policy, value_loss = marwil_losses(log_prob, value, mc_return, weights)
    assert float(policy) == pytest.approx((2.0 * 0.5 + 0.5 * 1.0) / 2)
    assert float(value_loss) == pytest.approx(0.5 * (2.0**2 + 1.0**2) / 2)


def test_bc_learner_loss_is_the_cross_entropy_of_the_dataset_actions():
    learner = algo("bc").make_learner(0, 1, seed=0)
    batch = cartpole_batch(action=[0, 1, 1, 1])
    with torch.no_grad():
        logits = learner.policy.policy_params(torch.as_tensor(batch["obs"]))
    expected = torch.nn.functional.cross_entropy(logits, torch.as_tensor(batch["action"]))
    metrics = learner.step(batch).metrics
    assert metrics["losses/policy_loss"] == pytest.approx(float(expected), rel=1e-6)


def test_marwil_learner_on_a_constant_value_network():
    # V = 1 everywhere, returns 0..3: A = -1, 0, 1, 2; mean A^2 = 6 / 4 = 1.5.
    learner = algo("marwil", {"beta": 2.0, "moving_average_start": 4.0, "moving_average_rate": 0.5}).make_learner(
        0, 1, seed=0
    )
    make_constant(learner.value.out, 1.0)
    batch = cartpole_batch()
    with torch.no_grad():
        obs = torch.as_tensor(batch["obs"])
        log_prob = learner.policy.head.log_prob(learner.policy.policy_params(obs), torch.as_tensor(batch["action"]))
    metrics = learner.step(batch).metrics
    norm = 4.0 + 0.5 * (1.5 - 4.0)  # 2.75: updated before the weights are taken
    advantage = torch.tensor([-1.0, 0.0, 1.0, 2.0])
    weights = torch.exp(2.0 * advantage / math.sqrt(norm))
    assert learner.squared_norm == pytest.approx(norm)
    assert metrics["values/advantage_norm"] == pytest.approx(math.sqrt(norm))
    assert metrics["values/weight_mean"] == pytest.approx(float(weights.mean()), rel=1e-5)
    assert metrics["losses/policy_loss"] == pytest.approx(float(-(weights * log_prob).mean()), rel=1e-5)
    assert metrics["losses/value_loss"] == pytest.approx(0.5 * 1.5)


def test_marwil_with_beta_0_steps_exactly_as_bc():
    bc = algo("bc").make_learner(0, 1, seed=3)
    marwil = algo("marwil", {"beta": 0.0}).make_learner(0, 1, seed=3)
    rng = np.random.default_rng(0)
    for _ in range(5):
        batch = cartpole_batch(8, action=rng.integers(0, 2, 8), mc_return=rng.normal(10, 5, 8))
        batch["obs"] = rng.normal(size=(8, 4)).astype(np.float32)
        bc_metrics, marwil_metrics = bc.step(batch).metrics, marwil.step(batch).metrics
        assert marwil_metrics["losses/policy_loss"] == bc_metrics["losses/policy_loss"]
        assert marwil_metrics["values/weight_mean"] == 1.0
    for name, value in bc.get_weights().items():
        np.testing.assert_array_equal(marwil.get_weights()[name], value)
    assert bc.get_weights().keys() == marwil.get_weights().keys()


# --------------------------------------------------------------------------
# Box actions


def test_box_actions_learn_a_gaussian_and_export_its_clipped_mean():
    learner = algo("bc", {"log_std_init": -1.0}, env_id="Pendulum-v1").make_learner(0, 1, seed=0)
    obs = np.linspace(-1, 1, 12, dtype=np.float32).reshape(4, 3)
    action = np.array([[0.5], [-0.5], [1.0], [0.0]], np.float32)
    with torch.no_grad():
        mean = learner.policy.policy_params(torch.as_tensor(obs))
    normal = torch.distributions.Normal(mean, math.exp(-1.0))
    expected = -normal.log_prob(torch.as_tensor(action)).sum(dim=1).mean()
    metrics = learner.step({"obs": obs, "action": action}).metrics
    assert metrics["losses/policy_loss"] == pytest.approx(float(expected), rel=1e-5)
    policy, meta = learner.acting_policy()
    make_constant(policy.head.mean, 7.0)
    assert torch.equal(policy(torch.as_tensor(obs)), torch.full((4, 1), 2.0))  # Pendulum's bound
    assert meta["action"]["kind"] == "box"


def test_marwil_on_box_actions_steps():
    learner = algo("marwil", env_id="Pendulum-v1").make_learner(0, 1, seed=0)
    batch = {
        "obs": np.zeros((4, 3), np.float32),
        "action": np.zeros((4, 1), np.float32),
        "mc_return": np.full(4, -100.0, np.float32),
    }
    metrics = learner.step(batch).metrics
    assert all(math.isfinite(v) for v in metrics.values())


# --------------------------------------------------------------------------
# Builder, export, checkpoints


@pytest.mark.parametrize("name, fields", [("bc", {"obs", "action"}), ("marwil", {"obs", "action", "mc_return"})])
def test_transition_spec_names_dataset_fields_only(name, fields):
    built = algo(name)
    spec = built.transition_spec()
    assert set(spec) == fields
    assert set(spec) <= set(OFFLINE_FIELDS)
    assert spec["action"] == ((), "<i8")
    assert built.offline_only and type(built).offline_only


@pytest.mark.parametrize("name", ["bc", "marwil"])
def test_discrete_acting_module_is_greedy_and_matches_the_weights_spec(name):
    built = algo(name)
    learner = built.make_learner(0, 1, seed=0)
    policy, meta = learner.acting_policy()
    obs = torch.as_tensor(cartpole_batch()["obs"])
    with torch.no_grad():
        logits = learner.policy.policy_params(obs)
    assert torch.equal(policy(obs), logits.argmax(dim=1))
    assert meta["algo"] == name and meta["action"] == {"kind": "discrete", "n": 2}
    spec = built.weights_spec()
    assert {k: (tuple(v.shape), v.dtype.str) for k, v in learner.get_weights().items()} == spec
    fresh = built.acting_module()
    fresh.load_state_dict(policy.state_dict(), strict=True)


@pytest.mark.parametrize("name", ["bc", "marwil"])
def test_checkpoint_restores_the_learner(name, tmp_path):
    built = algo(name)
    learner = built.make_learner(0, 1, seed=0)
    learner.step(cartpole_batch())
    path = learner.save_checkpoint(str(tmp_path), {"learner_steps": learner.learner_steps})
    other = built.make_learner(0, 1, seed=1)
    other.load_checkpoint(path)
    assert other.learner_steps == 1
    for name_, value in learner.get_weights().items():
        np.testing.assert_array_equal(other.get_weights()[name_], value)
    if name == "marwil":
        assert other.squared_norm == learner.squared_norm != 100.0


@pytest.mark.parametrize("name", ["bc", "marwil"])
def test_no_actors(name):
    with pytest.raises(ConfigError, match=f"algo: {name} learns from offline.dataset only"):
        algo(name).make_actor(0, 1, 0)


# --------------------------------------------------------------------------
# Refusals, each one line


@pytest.mark.parametrize("name", ["bc", "marwil"])
@pytest.mark.parametrize(
    "space",
    [gym.spaces.MultiDiscrete([2, 3]), gym.spaces.Discrete(3, start=1), gym.spaces.Box(0, 5, (2,), np.int64)],
)
def test_unsupported_action_spaces_are_refused_in_one_line(name, space):
    cfg = offline_algorithm(name, SMALL).cfg
    spec = EnvSpec(
        id="SomeEnv-v0", observation_space=gym.spaces.Box(-1, 1, (3,)), action_space=space, max_episode_steps=None
    )
    with pytest.raises(ConfigError) as info:
        type(algo(name))(cfg, spec)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"algo: {name} supports Discrete (numbered from 0) and float Box action spaces")
    assert "SomeEnv-v0" in message


@pytest.mark.parametrize(
    "name, model, message",
    [
        ("bc", {"learning_rate": 0.0}, "model.learning_rate: must be > 0"),
        ("bc", {"grad_clip_norm": -1.0}, "model.grad_clip_norm: must be > 0"),
        ("bc", {"device": "tpu"}, "model.device"),
        ("bc", {"network": ["linear:x"]}, r"model.network\[0\]"),
        ("bc", {"torch_threads": 0}, "model.torch_threads"),
        ("marwil", {"beta": -1.0}, "model.beta: must be >= 0"),
        ("marwil", {"max_weight": 0.0}, "model.max_weight: must be > 0"),
        ("marwil", {"moving_average_rate": 0.0}, r"model.moving_average_rate: expected a value in \(0, 1\]"),
        ("marwil", {"moving_average_rate": 1.5}, "model.moving_average_rate"),
        ("marwil", {"moving_average_start": 0.0}, "model.moving_average_start: must be > 0"),
        ("marwil", {"gamma": 0.0}, r"model.gamma: expected a value in \(0, 1\]"),
        ("marwil", {"value_learning_rate": -1.0}, "model.value_learning_rate: must be > 0"),
        ("marwil", {"value_network": ["conv:4:2:1"]}, "model.value_network"),
        ("marwil", {"adam_eps": 0.0}, "model.adam_eps: must be > 0"),
    ],
)
def test_config_errors(name, model, message):
    with pytest.raises(ConfigError, match=message):
        algo(name, model)


@pytest.mark.parametrize("name", ["bc", "marwil"])
def test_an_online_run_is_refused(name):
    from apex_helpers import make_config

    with pytest.raises(ConfigError, match="offline.dataset"):
        make_config(name, "CartPole-v1", SMALL)


# --------------------------------------------------------------------------
# Learning, in one process (the runtime's offline run: tests/learning/test_offline_learning.py)

CARTPOLE = {"network": ["linear:64", "relu", "linear:64", "relu"]}
MARWIL_CARTPOLE = {**CARTPOLE, "gamma": 0.999}


@pytest.fixture(scope="module")
def cartpole_dataset():
    """100k CartPole-v1 transitions of examples/policies/cartpole_dqn_200 with epsilon 0.3."""
    return behaviour_dataset(100_000, epsilon=0.3, seed=0)


@pytest.mark.slow
def test_bc_and_marwil_learn_cartpole_from_a_behaviours_dataset(cartpole_dataset):
    """bc reaches at least 90% of the behaviour's mean return (its greedy clone scores far above the
    epsilon-noisy behaviour); marwil beats bc, on the same 50 evaluation episodes."""
    dataset, behaviour = cartpole_dataset
    bc, _ = train_offline(offline_algorithm("bc", CARTPOLE), dataset, steps=4000)
    marwil, _ = train_offline(offline_algorithm("marwil", MARWIL_CARTPOLE), dataset, steps=4000)
    bc_returns = evaluate(bc.acting_policy()[0].eval(), episodes=50)
    marwil_returns = evaluate(marwil.acting_policy()[0].eval(), episodes=50)
    assert np.mean(bc_returns) >= 0.9 * behaviour, (behaviour, bc_returns)
    assert np.mean(marwil_returns) > np.mean(bc_returns), (bc_returns, marwil_returns)
