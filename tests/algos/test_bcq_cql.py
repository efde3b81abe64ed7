"""Discrete BCQ and CQL without sockets: the ratio_threshold filter (target and acting), the
target, the conservative term against a hand computation, the config checks and the spaces."""

import math

import numpy as np
import pytest
import torch
from offline_train_helpers import offline_algorithm

from aiorl.algos.bcq import BCQPolicy, allowed_only, bcq_target, behaviour_loss, unlikely_actions
from aiorl.algos.cql import conservative_term
from aiorl.config import ConfigError
from aiorl.offline.rows import OFFLINE_FIELDS

SMALL = {"network": ["linear:8", "relu"]}


def probs_to_logits(probs):
    return torch.log(torch.tensor(probs, dtype=torch.float32))


def test_the_filter_rules_out_actions_at_or_below_the_ratio():
    # pi_b = (0.6, 0.25, 0.15): ratios to the most likely 1, 0.417, 0.25.
    logits = probs_to_logits([[0.6, 0.25, 0.15]]) + 3.0  # the softmax's normaliser cancels
    assert unlikely_actions(logits, 0.3).tolist() == [[False, False, True]]
    assert unlikely_actions(logits, 0.42).tolist() == [[False, True, True]]
    assert unlikely_actions(logits, 0.0).tolist() == [[False, False, False]]
    q = torch.tensor([[1.0, 2.0, 5.0]])
    assert allowed_only(q, logits, 0.3).argmax(1).item() == 1  # the best Q is ruled out
    assert allowed_only(q, logits, 0.42).argmax(1).item() == 0
    assert allowed_only(q, logits, 0.0).argmax(1).item() == 2


def test_the_target_takes_the_best_allowed_action_valued_by_the_target_net():
    logits = probs_to_logits([[0.6, 0.25, 0.15], [0.1, 0.1, 0.8]])
    online = torch.tensor([[1.0, 2.0, 5.0], [9.0, 0.0, 1.0]])
    target = torch.tensor([[30.0, 20.0, 50.0], [90.0, 3.0, 7.0]])
    reward, discount = torch.tensor([1.0, 0.5]), torch.tensor([0.9, 0.0])
    y = bcq_target(reward, discount, target, online, logits, 0.3, double_q=True)
    # row 0: allowed {0, 1}, online picks 1, target values it 20; row 1: terminal.
    assert torch.allclose(y, torch.tensor([1.0 + 0.9 * 20.0, 0.5]))
    y = bcq_target(reward, torch.tensor([0.9, 0.9]), target, online, logits, 0.3, double_q=False)
    # without double Q the target net picks: row 0 -> 0 (30), row 1 -> only action 2 allowed (7).
    assert torch.allclose(y, torch.tensor([1.0 + 0.9 * 30.0, 0.5 + 0.9 * 7.0]))


def test_behaviour_loss_is_cross_entropy_plus_the_logit_penalty():
    logits = torch.tensor([[1.0, -1.0], [0.5, 0.0]])
    action = torch.tensor([0, 1])
    ce = -(math.log(math.e / (math.e + math.exp(-1))) + math.log(1 / (1 + math.exp(0.5)))) / 2
    penalty = (1 + 1 + 0.25 + 0) / 4
    assert behaviour_loss(logits, action, 0.0).item() == pytest.approx(ce, rel=1e-5)
    assert behaviour_loss(logits, action, 0.5).item() == pytest.approx(ce + 0.5 * penalty, rel=1e-5)


def test_the_acting_policy_applies_the_filter():
    algo = offline_algorithm("bcq", {**SMALL, "ratio_threshold": 0.3})
    policy = algo.acting_module()
    assert isinstance(policy, BCQPolicy) and policy.ratio_threshold == 0.3
    net = policy.net
    torch.nn.init.zeros_(net.behaviour_head.weight)
    torch.nn.init.zeros_(net.q_head.value.weight)
    torch.nn.init.zeros_(net.q_head.advantage.weight)
    with torch.no_grad():
        net.behaviour_head.bias.copy_(probs_to_logits([0.8, 0.2]))  # action 1: ratio 0.25
        net.q_head.value.bias.zero_()
        net.q_head.advantage.bias.copy_(torch.tensor([0.0, 1.0]))  # Q prefers action 1
    obs = torch.zeros(3, 4)
    assert policy(obs).tolist() == [0, 0, 0]
    policy.ratio_threshold = 0.2
    assert policy(obs).tolist() == [1, 1, 1]


def test_the_conservative_term_matches_a_hand_computation():
    q = torch.tensor([[1.0, 2.0, 3.0], [0.0, 0.0, 0.0]])
    taken = torch.tensor([3.0, 0.0])  # Q(s, a_data): actions 2 and 0
    weights = torch.tensor([1.0, 2.0])
    lse0 = math.log(math.e + math.e**2 + math.e**3)
    lse1 = math.log(3.0)
    expected = (1.0 * (lse0 - 3.0) + 2.0 * (lse1 - 0.0)) / 2
    assert conservative_term(q, taken, weights).item() == pytest.approx(expected, rel=1e-6)
    # its gradient: softmax(Q) down on every action, 1 up on the data's action (w / B each row)
    q.requires_grad_(True)
    conservative_term(q, q[torch.arange(2), torch.tensor([2, 0])], torch.ones(2)).backward()
    soft = torch.softmax(q.detach(), dim=1)
    onehot = torch.tensor([[0.0, 0.0, 1.0], [1.0, 0.0, 0.0]])
    assert torch.allclose(q.grad, (soft - onehot) / 2)


@pytest.mark.parametrize("name", ["bcq", "cql"])
def test_a_learner_step_lowers_its_loss_and_gives_priorities(name):
    algo = offline_algorithm(name, SMALL, agent={"batch_size": 16})
    spec = algo.transition_spec()
    assert set(spec) <= set(OFFLINE_FIELDS)
    learner = algo.make_learner(0, 1, seed=0)
    rng = np.random.default_rng(0)
    batch = {
        "obs": rng.normal(size=(16, 4)).astype(np.float32),
        "next_obs": rng.normal(size=(16, 4)).astype(np.float32),
        "action": rng.integers(0, 2, 16),
        "reward": np.ones(16, np.float32),
        "discount": np.full(16, 0.99, np.float32),
    }
    first = learner.step(batch)
    assert first.priorities.shape == (16,)
    for _ in range(30):
        last = learner.step(batch)
    assert last.metrics["losses/td_loss"] < first.metrics["losses/td_loss"]
    extra = "losses/behaviour_loss" if name == "bcq" else "losses/conservative_loss"
    assert last.metrics[extra] < first.metrics[extra]
    weights = learner.get_weights()
    assert {k: (v.shape, v.dtype.str) for k, v in weights.items()} == {
        k: (tuple(s), d) for k, (s, d) in algo.weights_spec().items()
    }
    policy, meta = learner.acting_policy()
    assert meta["algo"] == name and meta["action"] == {"kind": "discrete", "n": 2}
    assert policy(torch.as_tensor(batch["obs"])).dtype == torch.int64


def test_cql_alpha_weighs_the_conservative_term_in_the_step():
    rng = np.random.default_rng(1)
    batch = {
        "obs": rng.normal(size=(16, 4)).astype(np.float32),
        "next_obs": rng.normal(size=(16, 4)).astype(np.float32),
        "action": rng.integers(0, 2, 16),
        "reward": np.ones(16, np.float32),
        "discount": np.full(16, 0.99, np.float32),
    }
    after = {}
    for alpha in (0.0, 10.0):
        learner = offline_algorithm("cql", {**SMALL, "alpha": alpha}).make_learner(0, 1, seed=0)
        learner.step(batch)
        after[alpha] = learner.get_weights()
    assert any(not np.allclose(after[0.0][k], after[10.0][k]) for k in after[0.0])


@pytest.mark.parametrize(
    ("name", "key", "value", "says"),
    [
        ("bcq", "ratio_threshold", 1.0, "model.ratio_threshold"),
        ("bcq", "ratio_threshold", -0.1, "model.ratio_threshold"),
        ("bcq", "behaviour_logit_penalty", -1.0, "model.behaviour_logit_penalty"),
        ("bcq", "n_step", 0, "model.n_step"),
        ("bcq", "sync_target_frequency", 0, "model.sync_target_frequency"),
        ("cql", "alpha", -0.5, "model.alpha"),
        ("cql", "tau", 1.5, "model.tau"),
        ("cql", "gamma", 0.0, "model.gamma"),
        ("cql", "learning_rate", 0.0, "model.learning_rate"),
    ],
)
def test_config_checks_name_the_key(name, key, value, says):
    with pytest.raises(ConfigError, match=says):
        offline_algorithm(name, {**SMALL, key: value})


@pytest.mark.parametrize("name", ["bcq", "cql"])
def test_box_actions_are_refused_in_one_line_saying_what_is_supported(name):
    with pytest.raises(ConfigError, match=r"supports Discrete action spaces .* Pendulum-v1 has Box") as info:
        offline_algorithm(name, SMALL, env_id="Pendulum-v1")
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("name", ["bcq", "cql"])
def test_offline_only_and_no_actors(name):
    algo = offline_algorithm(name, SMALL)
    assert algo.offline_only
    with pytest.raises(ConfigError, match="offline.dataset only"):
        algo.make_actor(0, 1, seed=0)
