"""IQL: the expectile loss and the clipped advantage weights against hand computations, the
learner's three losses on constant networks, the Gaussian actor, the exported mean, checkpoints
and config errors (Box actions only, offline only)."""

import math

import numpy as np
import pytest
import torch
from apex_helpers import make_config, make_constant

from aiorl.algos import get_algorithm
from aiorl.algos.iql import advantage_weights, expectile_loss, gaussian_log_prob
from aiorl.algos.lib.networks import DeterministicActor
from aiorl.config import ConfigError
from aiorl.envs import env_spec

SMALL = {
    "actor_network": ["linear:8", "relu"],
    "critic_network": ["linear:8", "relu"],
    "value_network": ["linear:8", "relu"],
}


def iql_config(model=None, env_id="Pendulum-v1"):
    return make_config("iql", env_id, {**SMALL, **(model or {})}, offline={"dataset": "unused-in-these-tests"})


def iql(model=None, env_id="Pendulum-v1"):
    """The algorithm on the env's spaces (no dataset read: these tests feed batches by hand)."""
    cfg = iql_config(model, env_id)
    return get_algorithm("iql")(cfg, env_spec(cfg.env))


def pendulum_batch(rows=4, reward=-1.0, discount=0.99, action=0.5):
    obs = np.linspace(-1, 1, rows * 3, dtype=np.float32).reshape(rows, 3)
    return {
        "obs": obs,
        "action": np.full((rows, 1), action, np.float32),
        "reward": np.full(rows, reward, np.float32),
        "next_obs": obs + 0.1,
        "done": np.zeros(rows, bool),
        "discount": np.full(rows, discount, np.float32),
    }


def test_expectile_loss_weighs_positive_and_negative_errors_by_tau_and_1_minus_tau():
    # diff = target - V: (0.7 * 2^2 + 0.3 * (-1)^2 + 0.7 * 0) / 3 by hand.
    loss = expectile_loss(torch.tensor([2.0, -1.0, 0.0]), 0.7)
    assert float(loss) == pytest.approx((0.7 * 4 + 0.3 * 1 + 0.0) / 3)
    # tau 0.5 is half the mean squared error.
    assert float(expectile_loss(torch.tensor([2.0, -1.0]), 0.5)) == pytest.approx(0.5 * (4 + 1) / 2)


def test_advantage_weights_are_exp_beta_a_clipped_at_max_weight():
    weights = advantage_weights(torch.tensor([0.0, 1.0, -2.0, 10.0, 1e6]), beta=3.0, max_weight=100.0)
    expected = [1.0, math.exp(3.0), math.exp(-6.0), 100.0, 100.0]
    assert torch.allclose(weights, torch.tensor(expected), rtol=1e-5)
    assert torch.isfinite(weights).all()
    # beta 0: every row weighs 1 (behaviour cloning).
    assert torch.equal(advantage_weights(torch.tensor([-5.0, 5.0]), 0.0, 100.0), torch.ones(2))


def test_gaussian_log_prob_is_the_normal_density_summed_over_dimensions():
    mean, log_std, action = torch.tensor([[0.1, -0.2]]), torch.tensor([-1.0, 0.5]), torch.tensor([[0.3, 0.4]])
    expected = torch.distributions.Normal(mean, log_std.exp()).log_prob(action).sum(dim=1)
    assert torch.allclose(gaussian_log_prob(mean, log_std, action), expected)


def test_learner_losses_on_constant_networks():
    # Q'_1 = -4, Q'_2 = -3 (the min is -4), V = -5 everywhere: u = A = 1 on every row.
    algo = iql({"expectile": 0.7, "beta": 3.0, "max_weight": 100.0, "gamma": 0.99})
    learner = algo.make_learner(0, 1, seed=0)
    for critic, value in zip(learner.critics_target, (-4.0, -3.0)):
        make_constant(critic.out, value)
    for critic in learner.critics:
        make_constant(critic.out, -2.0)
    make_constant(learner.value.out, -5.0)
    metrics = learner.step(pendulum_batch(reward=-1.0, discount=0.99)).metrics
    assert metrics["losses/value_loss"] == pytest.approx(0.7 * 1.0**2)
    assert metrics["values/advantage_mean"] == pytest.approx(1.0)
    assert metrics["values/weight_mean"] == pytest.approx(math.exp(3.0), rel=1e-5)
    # Critic target R + d * V(s') = -1 + 0.99 * -5, against Q_i = -2, for both critics.
    assert metrics["losses/critic_loss"] == pytest.approx(2 * (-1 - 0.99 * 5 + 2) ** 2, rel=1e-5)
    assert metrics["values/weight_clipped_frac"] == 0.0


def test_learner_clips_the_weights_scales_rewards_and_a_terminal_row_does_not_bootstrap():
    algo = iql({"beta": 3.0, "max_weight": 10.0, "reward_scale": 0.5})
    learner = algo.make_learner(0, 1, seed=0)
    for critic in learner.critics_target:
        make_constant(critic.out, 0.0)
    for critic in learner.critics:
        make_constant(critic.out, 0.0)
    make_constant(learner.value.out, -5.0)
    metrics = learner.step(pendulum_batch(reward=-1.0, discount=0.0)).metrics
    assert metrics["values/weight_mean"] == pytest.approx(10.0)
    assert metrics["values/weight_clipped_frac"] == 1.0
    assert metrics["losses/critic_loss"] == pytest.approx(2 * 0.5**2)  # y = 0.5 * -1, Q = 0


def test_actor_log_std_is_clipped_and_actions_taken_in_unit_range():
    algo = iql({"min_log_std": -2.0, "max_log_std": 1.0})
    actor = algo.make_learner(0, 1, seed=0).actor
    with torch.no_grad():
        actor.log_std.fill_(-10.0)
    make_constant(actor.mean.out, 0.0)  # mean action 0 (tanh 0)
    obs = torch.zeros(1, 3)
    # Pendulum's action 1.0 is 0.5 in unit range; sigma = e^-2 (the clip), not e^-10.
    expected = torch.distributions.Normal(0.0, math.exp(-2.0)).log_prob(torch.tensor(0.5))
    assert torch.allclose(actor.log_prob(obs, torch.tensor([[1.0]])), expected.reshape(1))


def test_exported_policy_is_the_actor_mean_within_bounds():
    algo = iql()
    learner = algo.make_learner(0, 1, seed=0)
    make_constant(learner.actor.mean.out, 5.0)  # tanh(5) ~ 1: the upper bound, never past it
    module, meta = learner.acting_policy()
    assert isinstance(module, DeterministicActor)
    assert set(module.state_dict()) == set(algo.acting_module().state_dict())
    action = module(torch.zeros(2, 3))
    assert torch.allclose(action, torch.full((2, 1), 2.0 * math.tanh(5.0)))
    assert meta["algo"] == "iql" and meta["action"]["kind"] == "box"
    assert set(learner.get_weights()) == set(algo.weights_spec())


def test_checkpoint_round_trip():
    algo = iql()
    learner = algo.make_learner(0, 1, seed=0)
    learner.step(pendulum_batch())
    other = algo.make_learner(0, 1, seed=1)
    other.load_state_dict(learner.state_dict())
    assert other.learner_steps == 1
    for a, b in zip(learner.critics_target.parameters(), other.critics_target.parameters()):
        assert torch.equal(a, b)
    assert torch.equal(learner.actor.log_std, other.actor.log_std)


def test_transition_spec_takes_offline_fields():
    spec = iql().transition_spec()
    assert set(spec) == {"obs", "action", "reward", "next_obs", "done", "discount"}
    assert spec["action"] == ((1,), "<f4")


def test_discrete_actions_refused_in_one_line():
    with pytest.raises(ConfigError) as err:
        iql(env_id="CartPole-v1")
    message = str(err.value)
    assert "\n" not in message
    assert "iql supports bounded Box action spaces" in message and "Discrete" in message


@pytest.mark.parametrize(
    "model, key",
    [
        ({"expectile": 1.0}, "model.expectile"),
        ({"expectile": 0.4}, "model.expectile"),
        ({"beta": -1.0}, "model.beta"),
        ({"max_weight": 0.0}, "model.max_weight"),
        ({"reward_scale": 0.0}, "model.reward_scale"),
        ({"value_learning_rate": 0.0}, "model.value_learning_rate"),
        ({"tau": 0.0}, "model.tau"),
        ({"min_log_std": 2.0, "max_log_std": 2.0}, "model.min_log_std"),
        ({"n_step": 0}, "model.n_step"),
        ({"gamma": 1.5}, "model.gamma"),
        ({"value_network": ["bogus:3"]}, "model.value_network"),
    ],
)
def test_config_errors_name_the_key(model, key):
    with pytest.raises(ConfigError, match=key):
        iql_config(model)


def test_offline_only():
    with pytest.raises(ConfigError, match="offline.dataset"):
        make_config("iql", "Pendulum-v1", SMALL)
