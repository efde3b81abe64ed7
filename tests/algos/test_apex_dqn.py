"""Ape-X DQN: double-Q n-step targets, dueling head, IS-weighted loss, per-actor
epsilon, priorities, checkpoints, export and config errors."""

import numpy as np
import pytest
import torch
from apex_helpers import (
    DISCRETE_OBS_ENV,
    IMAGE_ENV,
    episode_rollout,
    make_algo,
    make_config,
    make_constant,
    replay_batch,
)

from aiorl.algos.apex_dqn import actor_epsilon, n_step_q_target
from aiorl.algos.lib.common import td_loss
from aiorl.algos.lib.networks import DuelingHead
from aiorl.config import ConfigError
from aiorl.envs import EnvRunner
from aiorl.io import checkpoint


def constant_q_learner(algo, value: float):
    """A learner whose online and target nets both answer `value` for every (s, a)."""
    learner = algo.make_learner(0, 1, seed=0)
    for net in (learner.online, learner.target):
        make_constant(net.head.value, value)
        make_constant(net.head.advantage, 0.0)
    return learner


# --------------------------------------------------------------------------- targets


def test_double_q_target_takes_online_argmax_valued_by_target():
    q_next_online = torch.tensor([[1.0, 5.0, 2.0], [3.0, 0.0, 0.0]])
    q_next_target = torch.tensor([[10.0, 20.0, 30.0], [7.0, 40.0, 1.0]])
    reward = torch.tensor([1.0, 2.0])
    discount = torch.tensor([0.5, 0.25])
    y = n_step_q_target(reward, discount, q_next_target, q_next_online)
    # argmax online: action 1 (not the target's own argmax 2), action 0 (not 1).
    assert torch.allclose(y, torch.tensor([1.0 + 0.5 * 20.0, 2.0 + 0.25 * 7.0]))
    plain = n_step_q_target(reward, discount, q_next_target, None)
    assert torch.allclose(plain, torch.tensor([1.0 + 0.5 * 30.0, 2.0 + 0.25 * 40.0]))


def set_head(net, value: float, advantages) -> None:
    """A dueling head answering Q(s, .) = value + advantages - mean(advantages) for every s."""
    make_constant(net.head.value, value)
    make_constant(net.head.advantage, 0.0)
    with torch.no_grad():
        net.head.advantage.bias.copy_(torch.tensor(advantages))


def test_learner_step_is_double_q_when_online_and_target_disagree():
    """The priorities of `learner.step` are |r + d * Q_target(s', argmax_a Q_online(s', a)) - Q_online(s, a)|."""
    algo = make_algo("apex_dqn", "CartPole-v1", {"n_step": 1, "learning_rate": 1e-9})
    learner = algo.make_learner(0, 1, seed=0)
    set_head(learner.online, 1.0, [3.0, 0.0])  # Q_online = [2.5, -0.5]: prefers action 0
    set_head(learner.target, 2.0, [0.0, 4.0])  # Q_target = [0.0, 4.0]: prefers action 1
    q_online, q_target = np.array([2.5, -0.5]), np.array([0.0, 4.0])
    reward = np.array([1.0, 0.5, 2.0], np.float32)
    discount = np.array([0.5, 0.99, 0.0], np.float32)  # the last row terminated: no bootstrap
    action = np.array([0, 1, 1], np.int64)
    rows = {
        "obs": np.zeros((3, 4), np.float32),
        "action": action,
        "reward": reward,
        "next_obs": np.ones((3, 4), np.float32),
        "done": discount == 0,
        "discount": discount,
    }
    result = learner.step(replay_batch(rows))
    expected = np.abs(reward + discount * q_target[np.argmax(q_online)] - q_online[action])
    assert np.allclose(result.priorities, expected, atol=1e-5)
    # Plain DQN (the target's own max) would give different priorities here.
    assert not np.allclose(expected, np.abs(reward + discount * q_target.max() - q_online[action]), atol=0.1)


def test_zero_discount_means_no_bootstrap():
    y = n_step_q_target(
        torch.tensor([3.0]), torch.tensor([0.0]), torch.tensor([[1e6, 1e6]]), torch.tensor([[0.0, 1.0]])
    )
    assert y.item() == 3.0


@pytest.mark.parametrize(
    "end, expected_priorities",
    [
        # gamma 0.5, n 3, rewards 1, Q = 4 everywhere; priorities are |y - 4|.
        # terminated at t=3: rows t=1..3 end in the termination, no bootstrap.
        ("terminated", [abs(1.75 + 0.125 * 4 - 4), abs(1.75 - 4), abs(1.5 - 4), abs(1.0 - 4)]),
        # truncated at t=3: every window bootstraps from the final obs with gamma^m.
        (
            "truncated",
            [abs(1.75 + 0.125 * 4 - 4), abs(1.75 + 0.125 * 4 - 4), abs(1.5 + 0.25 * 4 - 4), abs(1.0 + 0.5 * 4 - 4)],
        ),
    ],
)
def test_learner_n_step_target_uses_gamma_power_m(end, expected_priorities):
    algo = make_algo("apex_dqn", "CartPole-v1", {"n_step": 3, "gamma": 0.5, "learning_rate": 1e-9})
    learner = constant_q_learner(algo, 4.0)
    actor = algo.make_actor(0, 1, seed=0)
    rollout = episode_rollout([1, 1, 1, 1], **{f"{end}_at": 3})
    rows, _ = actor.postprocess(rollout)
    assert len(rows["reward"]) == 4
    result = learner.step(replay_batch(rows))
    assert np.allclose(result.priorities, expected_priorities, atol=1e-5)
    assert result.priorities.dtype == np.float64 and not result.stop


def test_actor_initial_priorities_are_td_of_its_network():
    algo = make_algo("apex_dqn", "CartPole-v1", {"n_step": 2, "gamma": 0.5})
    actor = algo.make_actor(0, 1, seed=0)
    make_constant(actor.q.head.value, 2.0)
    make_constant(actor.q.head.advantage, 0.0)
    rows, priorities = actor.postprocess(episode_rollout([1, 1, 1], terminated_at=2))
    # rows: t0: 1 + 0.5 + 0.25 * 2; t1: 1.5 (terminal); t2: 1 (terminal); minus Q = 2.
    assert np.allclose(priorities, [abs(2.0 - 2), abs(1.5 - 2), abs(1.0 - 2)])
    assert actor.flush() == ({}, None)  # the termination closed every window


# --------------------------------------------------------------------------- network and loss


def test_dueling_head_combines_value_and_centered_advantage():
    head = DuelingHead(2, 3)
    with torch.no_grad():
        head.value.weight.copy_(torch.tensor([[1.0, 0.0]]))
        head.value.bias.fill_(0.5)
        head.advantage.weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.0, 0.0]]))
        head.advantage.bias.zero_()
    x = torch.tensor([[2.0, 4.0]])
    value, advantage = 2.0 + 0.5, torch.tensor([2.0, 4.0, 0.0])
    expected = value + advantage - advantage.mean()
    assert torch.allclose(head(x)[0], expected)
    with torch.no_grad():
        head.advantage.bias.add_(7.0)  # a constant advantage shift cannot change Q
    assert torch.allclose(head(x)[0], expected)


def test_dueling_option_selects_the_head():
    assert isinstance(make_algo("apex_dqn", "CartPole-v1", {"dueling": True}).q_network().head, DuelingHead)
    plain = make_algo("apex_dqn", "CartPole-v1", {"dueling": False}).q_network().head
    assert isinstance(plain, torch.nn.Linear) and plain.out_features == 2


def test_importance_weighted_loss():
    td = torch.tensor([0.5, 3.0, -2.0])
    w = torch.tensor([1.0, 0.0, 0.5])
    huber = torch.tensor([0.5 * 0.25, 3.0 - 0.5, 2.0 - 0.5])
    assert torch.isclose(td_loss(td, w, "huber", 1.0), (w * huber).mean())
    assert torch.isclose(td_loss(td, w, "mse", 1.0), (w * 0.5 * td**2).mean())


def test_zero_weight_rows_do_not_move_the_network():
    algo = make_algo("apex_dqn", "CartPole-v1", {"learning_rate": 0.1})
    actor = algo.make_actor(0, 1, seed=0)
    rows, _ = actor.postprocess(episode_rollout([1.0] * 6, terminated_at=5))
    learner = algo.make_learner(0, 1, seed=0)
    before = {k: v.clone() for k, v in learner.online.state_dict().items()}
    learner.step(replay_batch(rows, weights=np.zeros(len(rows["reward"]))))
    assert all(torch.equal(before[k], v) for k, v in learner.online.state_dict().items())
    learner.step(replay_batch(rows))
    assert any(not torch.equal(before[k], v) for k, v in learner.online.state_dict().items())


# --------------------------------------------------------------------------- acting


def test_per_actor_epsilon():
    assert actor_epsilon(0, 1, 0.4, 7.0) == 0.4
    assert actor_epsilon(0, 8, 0.4, 7.0) == pytest.approx(0.4)
    assert actor_epsilon(3, 8, 0.4, 7.0) == pytest.approx(0.4 ** (1 + 7.0 * 3 / 7))
    assert actor_epsilon(7, 8, 0.4, 7.0) == pytest.approx(0.4**8)
    algo = make_algo("apex_dqn", "CartPole-v1", {"exploration_eps": 0.5, "exploration_alpha": 3.0})
    assert algo.make_actor(1, 3, seed=0).epsilons == pytest.approx([0.5 ** (1 + 3.0 * 1 / 2)])


def test_epsilons_spread_over_every_env_slot():
    """One actor with 8 envs explores like 8 actors; 2 x 4 gives the same 8 epsilons."""
    model = {"exploration_eps": 0.4, "exploration_alpha": 7.0}
    one = make_algo("apex_dqn", "CartPole-v1", model, env={"num_envs": 8}).make_actor(0, 1, seed=0)
    assert one.epsilons == pytest.approx([0.4 ** (1 + 7.0 * j / 7) for j in range(8)])
    algo = make_algo("apex_dqn", "CartPole-v1", model, env={"num_envs": 4})
    two = np.concatenate([algo.make_actor(i, 2, seed=0).epsilons for i in range(2)])
    assert two == pytest.approx(one.epsilons)
    single = make_algo("apex_dqn", "CartPole-v1", model).make_actor(0, 1, seed=0)
    assert single.epsilons == pytest.approx([0.4])  # one slot: the base epsilon


def test_each_row_keeps_the_epsilon_of_the_env_that_acted():
    algo = make_algo("apex_dqn", "CartPole-v1", {"n_step": 3}, env={"num_envs": 3})
    assert algo.transition_spec()["epsilon"] == ((), "<f4")
    actor = algo.make_actor(0, 1, seed=0)
    runner = EnvRunner(algo.cfg.env, 3, seed=0)
    rows = []
    for _ in range(4):
        rollout = runner.rollout(actor.act, 5)
        batch, priorities = actor.postprocess(rollout)
        rows.append(batch)
    rows.append(actor.flush()[0])
    runner.close()
    epsilon = np.concatenate([b["epsilon"] for b in rows])
    action = np.concatenate([b["action"] for b in rows])
    assert len(epsilon) == 4 * 5 * 3  # every step of every env, once
    assert action.dtype == np.int64 and set(np.unique(action)) <= {0, 1}
    # Each env contributed its 20 steps, each with that env's epsilon.
    values, counts = np.unique(epsilon, return_counts=True)
    assert values == pytest.approx(np.sort(actor.epsilons.astype(np.float32))) and counts.tolist() == [20] * 3


@pytest.mark.parametrize("eps, greedy_share", [(0.0, 1.0), (1.0, 0.5)])
def test_actor_explores_with_its_epsilon(eps, greedy_share):
    algo = make_algo("apex_dqn", "CartPole-v1", {"exploration_eps": eps})
    actor = algo.make_actor(0, 1, seed=0)
    make_constant(actor.q.head.advantage, 0.0)
    with torch.no_grad():
        actor.q.head.advantage.bias.copy_(torch.tensor([0.0, 1.0]))  # greedy action: 1
    actor.fast.refresh()  # acting reads its numpy copy of the weights
    actions = actor.act(np.zeros((4000, 4), np.float32))
    assert actions.dtype == np.int64
    assert (actions == 1).mean() == pytest.approx(greedy_share, abs=0.03)


def test_set_weights_copies_into_the_policy():
    algo = make_algo("apex_dqn", "CartPole-v1")
    learner, actor = algo.make_learner(0, 1, seed=1), algo.make_actor(0, 1, seed=2)
    weights = learner.get_weights()
    assert all(isinstance(v, np.ndarray) for v in weights.values())
    actor.set_weights(weights, 7)
    assert actor.weights_version == 7
    for key, value in learner.online.state_dict().items():
        assert torch.equal(actor.q.state_dict()[key], value)
    next(iter(weights.values()))[...] = 123.0  # the policy holds a copy
    assert not torch.any(next(iter(actor.q.state_dict().values())) == 123.0)


# --------------------------------------------------------------------------- learner edges


def test_nan_loss_raises_saying_so():
    algo = make_algo("apex_dqn", "CartPole-v1")
    actor, learner = algo.make_actor(0, 1, seed=0), algo.make_learner(0, 1, seed=0)
    rows, _ = actor.postprocess(episode_rollout([1.0] * 5, terminated_at=4))
    rows["reward"][0] = np.nan
    with pytest.raises(FloatingPointError, match="loss is NaN"):
        learner.step(replay_batch(rows))


@pytest.mark.parametrize("clip", [0.01, None])
def test_gradient_clipping_is_applied(clip):
    """The optimizer steps on gradients clipped to model.grad_clip_norm (the metric is the norm before)."""
    algo = make_algo("apex_dqn", "CartPole-v1", {"grad_clip_norm": clip, "learning_rate": 1e-9})
    actor, learner = algo.make_actor(0, 1, seed=0), algo.make_learner(0, 1, seed=0)
    rows, _ = actor.postprocess(episode_rollout([10.0] * 8, terminated_at=7))
    result = learner.step(replay_batch(rows))
    applied = float(torch.norm(torch.stack([p.grad.norm() for p in learner.online.parameters()])))
    before = result.metrics["losses/grad_norm"]
    assert before > 1.0  # a reward of 10 against Q near 0: large gradients
    if clip is None:
        assert applied == pytest.approx(before, rel=1e-4)
    else:
        assert applied == pytest.approx(clip, rel=1e-3)


def test_checkpoint_contents_and_restore(tmp_path):
    algo = make_algo("apex_dqn", "CartPole-v1", {"sync_target_frequency": 1000})
    actor, learner = algo.make_actor(0, 1, seed=0), algo.make_learner(0, 1, seed=0)
    rows, _ = actor.postprocess(episode_rollout([1.0] * 8, terminated_at=7))
    for _ in range(3):
        learner.step(replay_batch(rows))
    paths = [learner.save_checkpoint(str(tmp_path), {"learner_steps": s}, keep=2) for s in (1, 2, 3)]
    assert [p.name for p in checkpoint.list_checkpoints(tmp_path)] == [
        "checkpoint-000000002.pt",
        "checkpoint-000000003.pt",
    ]
    meta, state = checkpoint.load(paths[-1])  # torch.load(weights_only=True) inside
    assert {"algo", "model", "target", "optimizer", "learner_steps", "torch_rng"} <= set(state)
    assert state["algo"] == "apex_dqn" and state["learner_steps"] == 3 and meta["learner_steps"] == 3
    assert state["optimizer"]["state"], "Adam moments are saved"
    # model and target differ: no target sync happened in 3 steps
    assert any(not torch.equal(state["model"][k], state["target"][k]) for k in state["model"])
    torch.rand(5)  # move the global generator on; loading must put it back
    fresh = algo.make_learner(0, 1, seed=99)
    meta = fresh.load_checkpoint(paths[-1])
    assert meta["learner_steps"] == 3 and fresh.learner_steps == 3
    assert torch.equal(torch.get_rng_state(), state["torch_rng"])
    for k, v in learner.online.state_dict().items():
        assert torch.equal(fresh.online.state_dict()[k], v)
        assert torch.equal(fresh.target.state_dict()[k], learner.target.state_dict()[k])
    # The restored learner continues exactly: same optimizer moments, so the same next step.
    a, b = learner.step(replay_batch(rows)), fresh.step(replay_batch(rows))
    assert np.array_equal(a.priorities, b.priorities)
    for k, v in learner.online.state_dict().items():
        assert torch.equal(fresh.online.state_dict()[k], v)


def test_hard_and_soft_target_updates():
    algo = make_algo("apex_dqn", "CartPole-v1", {"sync_target_frequency": 2, "learning_rate": 0.01})
    actor, learner = algo.make_actor(0, 1, seed=0), algo.make_learner(0, 1, seed=0)
    batch = replay_batch(actor.postprocess(episode_rollout([1.0] * 8, terminated_at=7))[0])
    same = lambda: all(
        torch.equal(a, b)
        for a, b in zip(
            learner.online.parameters(),  # noqa: E731
            learner.target.parameters(),
        )
    )
    learner.step(batch)
    assert not same()
    learner.step(batch)
    assert same()
    soft = make_algo("apex_dqn", "CartPole-v1", {"tau": 0.5, "learning_rate": 0.01}).make_learner(0, 1, seed=0)
    old_target = [p.clone() for p in soft.target.parameters()]
    soft.step(batch)
    for t, o, old in zip(soft.target.parameters(), soft.online.parameters(), old_target):
        assert torch.allclose(t, 0.5 * o + 0.5 * old, atol=1e-6)


# --------------------------------------------------------------------------- export


def test_exported_policy_round_trip(tmp_path):
    algo = make_algo("apex_dqn", "CartPole-v1")
    learner = algo.make_learner(0, 1, seed=3)
    path = learner.export_policy(str(tmp_path))
    policy = torch.export.load(path).module()
    obs = torch.randn(16, 4)
    actions = policy(obs)
    assert actions.dtype == torch.int64 and actions.shape == (16,)
    assert torch.equal(actions, learner.online(obs).argmax(dim=1))
    meta = (tmp_path / "policy.json").read_text()
    assert '"discrete"' in meta and "CartPole-v1" in meta


def test_image_observations_stay_uint8_until_the_network(tmp_path):
    algo = make_algo(
        "apex_dqn", IMAGE_ENV, {"network": ["conv:8:4:2", "relu", "flatten", "linear:32", "relu"]}, env={"num_envs": 2}
    )
    assert algo.transition_spec()["obs"] == ((36, 36, 3), "|u1")
    actor, learner = algo.make_actor(0, 1, seed=0), algo.make_learner(0, 1, seed=0)
    runner = EnvRunner(algo.cfg.env, 2, seed=0)
    rows, priorities = actor.postprocess(runner.rollout(actor.act, 8))
    assert rows["obs"].dtype == np.uint8 and len(priorities) == len(rows["obs"])
    result = learner.step(replay_batch(rows))
    assert np.all(np.isfinite(result.priorities))
    policy = torch.export.load(learner.export_policy(str(tmp_path))).module()
    frames = torch.from_numpy(rows["obs"][:3].copy())
    assert torch.equal(policy(frames), learner.online(frames).argmax(dim=1))


def test_default_network_for_images_is_nature_cnn():
    algo = make_algo("apex_dqn", IMAGE_ENV)
    convs = [m for m in algo.q_network().modules() if isinstance(m, torch.nn.Conv2d)]
    assert [c.out_channels for c in convs] == [32, 64, 64]


def test_discrete_observations_are_one_hot():
    algo = make_algo("apex_dqn", DISCRETE_OBS_ENV, {"network": ["linear:16", "relu"]})
    assert algo.transition_spec()["obs"] == ((), "<i8")
    # The encoding itself: the first module of the network turns state k into row k of eye(5).
    encoder = algo.q_network().torso.net[0]
    states = torch.tensor([0, 3, 4, 1, 3])
    assert torch.equal(encoder(states), torch.eye(5)[states])
    actor, learner = algo.make_actor(0, 1, seed=0), algo.make_learner(0, 1, seed=0)
    rows, _ = actor.postprocess(EnvRunner(algo.cfg.env, 1, seed=0).rollout(actor.act, 16))
    assert np.all(np.isfinite(learner.step(replay_batch(rows)).priorities))


# --------------------------------------------------------------------------- config


@pytest.mark.parametrize(
    "model, message",
    [
        ({"n_step": 0}, "model.n_step: must be at least 1, got 0"),
        ({"gamma": 0.0}, "model.gamma: expected a value in (0, 1], got 0.0"),
        ({"gamma": 1.01}, "model.gamma: expected a value in (0, 1], got 1.01"),
        (
            {"network": ["linear:64", "lineer:64"]},
            "model.network[1]: unknown layer 'lineer:64'; did you mean 'linear'?",
        ),
        ({"network": ["linear"]}, "model.network[0]: 'linear' takes 1 argument(s)"),
        ({"network": ["linear:x"]}, "model.network[0]: layer arguments must be integers"),
        ({"network": "linear:64"}, "model.network: expected list"),
        ({"loss": "l1"}, "model.loss: expected 'huber' or 'mse', got 'l1'"),
        ({"tau": 0.0}, "model.tau: expected a value in (0, 1]"),
        ({"sync_target_frequency": 0}, "model.sync_target_frequency: must be at least 1"),
        ({"exploration_eps": 1.5}, "model.exploration_eps: expected a value in [0, 1]"),
        ({"learning_rate": 0}, "model.learning_rate: must be > 0"),
        ({"grad_clip_norm": -1}, "model.grad_clip_norm: must be > 0"),
        ({"device": "tpu"}, "model.device: expected 'auto', 'cpu', 'cuda' or 'cuda:N'"),
        ({"dueling": "yes"}, "model.dueling: expected bool"),
        ({"n_setp": 3}, "unknown key 'model.n_setp'; did you mean 'model.n_step'?"),
    ],
)
def test_bad_model_values_name_the_key(model, message):
    with pytest.raises(ConfigError) as info:
        make_config("apex_dqn", "CartPole-v1", model)
    assert message in str(info.value)


@pytest.mark.parametrize(
    "env, model, message",
    [
        ("Pendulum-v1", {}, "apex_dqn needs a Discrete action space; Pendulum-v1 has Box"),
        ("Blackjack-v1", {}, "unsupported observation space Tuple"),
        ("CartPole-v1", {"network": ["conv:32:8:4"]}, "model.network[0]: conv:32:8:4 needs image observations"),
        (IMAGE_ENV, {"network": ["conv:8:64:1"]}, "model.network[0]: conv:8:64:1 does not fit its input"),
    ],
)
def test_unsupported_spaces_and_shapes_are_config_errors(env, model, message):
    with pytest.raises(ConfigError) as info:
        make_algo("apex_dqn", env, model)
    assert message in str(info.value)


def test_actions_not_numbered_from_0_are_a_config_error():
    from types import SimpleNamespace

    import gymnasium as gym

    from aiorl.algos.lib.networks import discrete_actions

    spec = SimpleNamespace(id="Shifted-v0", action_space=gym.spaces.Discrete(3, start=1))
    with pytest.raises(ConfigError, match=r"env.id: apex_dqn needs actions numbered from 0; Shifted-v0 has Discrete"):
        discrete_actions(spec, "apex_dqn")
    assert discrete_actions(SimpleNamespace(id="A-v0", action_space=gym.spaces.Discrete(3)), "apex_dqn") == 3
