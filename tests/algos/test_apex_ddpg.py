"""Ape-X DDPG: n-step critic target with gamma^m, bounded actor, exploration noise,
priorities, checkpoints, export and config errors."""

import gymnasium as gym
import numpy as np
import pytest
import torch
from apex_helpers import make_algo, make_config, make_constant, replay_batch

from aiorl.algos.apex_ddpg import GaussianNoise, OUNoise, n_step_critic_target
from aiorl.algos.lib.layers import parse_network
from aiorl.algos.lib.networks import Critic, split_at_flat
from aiorl.config import ConfigError
from aiorl.envs import EnvRunner
from aiorl.io import checkpoint


def pendulum_rollout(rewards, terminated_at=None, truncated_at=None):
    T = len(rewards)
    obs = np.repeat(np.linspace(-1, 1, T, dtype=np.float32)[:, None, None], 3, axis=2)
    rollout = {
        "obs": obs,
        "action": np.full((T, 1, 1), 0.5, np.float32),
        "reward": np.asarray(rewards, np.float32).reshape(T, 1),
        "next_obs": obs + 0.1,
        "terminated": np.zeros((T, 1), bool),
        "truncated": np.zeros((T, 1), bool),
    }
    if terminated_at is not None:
        rollout["terminated"][terminated_at, 0] = True
    if truncated_at is not None:
        rollout["truncated"][truncated_at, 0] = True
    return rollout


def test_critic_target_uses_the_row_discount():
    y = n_step_critic_target(torch.tensor([1.0, 2.0]), torch.tensor([0.729, 0.0]), torch.tensor([10.0, 10.0]))
    assert torch.allclose(y, torch.tensor([1.0 + 7.29, 2.0]))


@pytest.mark.parametrize(
    "end, expected",
    [
        # gamma 0.5, n 3, rewards -1, Q' = -4 everywhere; priorities |y - Q| with Q = -4.
        # EasyRL bootstrapped with gamma (0.5) whatever m; the right factor is gamma^m.
        ("terminated", [abs(-1.75 + 0.125 * -4 + 4), abs(-1.75 + 4), abs(-1.5 + 4), abs(-1.0 + 4)]),
        (
            "truncated",
            [
                abs(-1.75 + 0.125 * -4 + 4),
                abs(-1.75 + 0.125 * -4 + 4),
                abs(-1.5 + 0.25 * -4 + 4),
                abs(-1.0 + 0.5 * -4 + 4),
            ],
        ),
    ],
)
def test_learner_target_is_gamma_power_m(end, expected):
    algo = make_algo(
        "apex_ddpg",
        "Pendulum-v1",
        {"n_step": 3, "gamma": 0.5, "actor_network": ["linear:8", "relu"], "critic_network": ["linear:8", "relu"]},
    )
    learner = algo.make_learner(0, 1, seed=0)
    for critic in (learner.critic, learner.critic_target):
        make_constant(critic.out, -4.0)
    actor = algo.make_actor(0, 1, seed=0)
    rows, _ = actor.postprocess(pendulum_rollout([-1, -1, -1, -1], **{f"{end}_at": 3}))
    result = learner.step(replay_batch(rows))
    assert np.allclose(result.priorities, expected, atol=1e-5)


def test_actor_priorities_use_its_critic_copy():
    algo = make_algo("apex_ddpg", "Pendulum-v1", {"n_step": 1, "gamma": 0.9})
    actor = algo.make_actor(0, 1, seed=0)
    make_constant(actor.critic.out, 3.0)
    rows, priorities = actor.postprocess(pendulum_rollout([1.0, 2.0], terminated_at=1))
    assert np.allclose(priorities, [abs(1.0 + 0.9 * 3.0 - 3.0), abs(2.0 - 3.0)])


def test_actions_stay_within_bounds_and_noise_explores():
    algo = make_algo("apex_ddpg", "Pendulum-v1", {"exploration_sigma": 0.5})
    actor = algo.make_actor(0, 1, seed=0)
    obs = np.random.default_rng(0).standard_normal((500, 3)).astype(np.float32)
    actions = actor.act(obs)
    assert actions.shape == (500, 1) and actions.dtype == np.float32
    assert actions.min() >= -2.0 and actions.max() <= 2.0
    with torch.no_grad():
        greedy = actor.actor(torch.from_numpy(obs)).numpy()
    assert np.abs(actions - greedy).mean() > 0.1
    quiet = make_algo("apex_ddpg", "Pendulum-v1", {"exploration_sigma": 0.0}).make_actor(0, 1, seed=0)
    quiet.set_weights(
        {
            **{f"actor.{k}": v.numpy() for k, v in actor.actor.state_dict().items()},
            **{f"critic.{k}": v.numpy() for k, v in actor.critic.state_dict().items()},
        },
        1,
    )
    assert np.allclose(quiet.act(obs), greedy, atol=1e-6)


def test_noise_processes():
    rng = np.random.default_rng(0)
    gauss = np.stack([GaussianNoise((2, 1), 0.3, rng)() for _ in range(4000)])
    assert gauss.std() == pytest.approx(0.3, rel=0.05)
    assert abs(np.corrcoef(gauss[:-1, 0, 0], gauss[1:, 0, 0])[0, 1]) < 0.1
    ou = OUNoise((2, 1), 0.3, 0.15, rng)
    samples = np.stack([ou() for _ in range(4000)])
    # AR(1) with coefficient 1 - theta: strongly correlated, stationary std sigma / sqrt(1 - (1-theta)^2)
    assert np.corrcoef(samples[:-1, 0, 0], samples[1:, 0, 0])[0, 1] == pytest.approx(0.85, abs=0.05)
    assert samples.std() == pytest.approx(0.3 / np.sqrt(1 - 0.85**2), rel=0.2)
    algo = make_algo("apex_ddpg", "Pendulum-v1", {"exploration": "ou"}, env={"num_envs": 2})
    actor = algo.make_actor(0, 1, seed=0)
    EnvRunner(algo.cfg.env, 2, seed=0).rollout(actor.act, 4)
    assert isinstance(actor.noise, OUNoise) and actor.noise.state.shape == (2, 1)


def test_gradients_and_soft_targets():
    algo = make_algo("apex_ddpg", "Pendulum-v1", {"tau": 0.25})
    actor, learner = algo.make_actor(0, 1, seed=0), algo.make_learner(0, 1, seed=0)
    rows, _ = actor.postprocess(pendulum_rollout([-1.0] * 6, truncated_at=5))
    old = {n: [p.clone() for p in getattr(learner, n).parameters()] for n in ("actor_target", "critic_target")}
    result = learner.step(replay_batch(rows))
    assert {"losses/critic_loss", "losses/actor_loss"} <= set(result.metrics)
    for name, online in (("actor_target", learner.actor), ("critic_target", learner.critic)):
        for t, o, before in zip(getattr(learner, name).parameters(), online.parameters(), old[name]):
            assert torch.allclose(t, 0.25 * o + 0.75 * before, atol=1e-6)


def test_nan_loss_raises_saying_so():
    algo = make_algo("apex_ddpg", "Pendulum-v1")
    actor, learner = algo.make_actor(0, 1, seed=0), algo.make_learner(0, 1, seed=0)
    rows, _ = actor.postprocess(pendulum_rollout([-1.0] * 4, terminated_at=3))
    rows["reward"][1] = np.nan
    with pytest.raises(FloatingPointError, match="critic loss is NaN"):
        learner.step(replay_batch(rows))


def test_checkpoint_contents_and_restore(tmp_path):
    algo = make_algo("apex_ddpg", "Pendulum-v1")
    actor, learner = algo.make_actor(0, 1, seed=0), algo.make_learner(0, 1, seed=0)
    rows, _ = actor.postprocess(pendulum_rollout([-1.0] * 6, truncated_at=5))
    learner.step(replay_batch(rows))
    path = learner.save_checkpoint(str(tmp_path), {"learner_steps": 1})
    meta, state = checkpoint.load(path)
    assert {
        "actor",
        "critic",
        "actor_target",
        "critic_target",
        "actor_optimizer",
        "critic_optimizer",
        "learner_steps",
        "torch_rng",
    } <= set(state)
    assert meta["learner_steps"] == 1 and state["learner_steps"] == 1 and state["actor_optimizer"]["state"]
    fresh = algo.make_learner(0, 1, seed=5)
    fresh.load_checkpoint(path)
    for name in ("actor", "critic", "actor_target", "critic_target"):
        for k, v in getattr(learner, name).state_dict().items():
            assert torch.equal(getattr(fresh, name).state_dict()[k], v)


def test_weights_carry_actor_and_critic():
    algo = make_algo("apex_ddpg", "Pendulum-v1")
    learner, actor = algo.make_learner(0, 1, seed=1), algo.make_actor(0, 1, seed=2)
    weights = learner.get_weights()
    assert any(k.startswith("actor.") for k in weights) and any(k.startswith("critic.") for k in weights)
    actor.set_weights(weights, 3)
    obs = torch.randn(5, 3)
    assert torch.equal(actor.actor(obs), learner.actor(obs)) and actor.weights_version == 3


def test_exported_policy_round_trip(tmp_path):
    algo = make_algo("apex_ddpg", "Pendulum-v1")
    learner = algo.make_learner(0, 1, seed=3)
    policy = torch.export.load(learner.export_policy(str(tmp_path))).module()
    obs = torch.randn(8, 3) * 5
    actions = policy(obs)
    assert actions.shape == (8, 1) and actions.dtype == torch.float32
    assert torch.equal(actions, learner.actor(obs))
    assert actions.abs().max() <= 2.0


def test_critic_action_joins_where_features_become_flat():
    critic = make_algo(
        "apex_ddpg", "MountainCarContinuous-v0", {"critic_network": ["linear:16", "relu"]}
    ).critic_network()
    assert critic.post[0].in_features == 2 + 1  # vector obs (2) + action (1) at the input
    layers = parse_network(["conv:8:4:2", "relu", "linear:32", "relu"], "model.critic_network")
    image, flat = split_at_flat(layers)
    assert [str(x) for x in image] == ["conv:8:4:2", "relu"] and [str(x) for x in flat] == ["linear:32", "relu"]
    frames = gym.spaces.Box(0, 255, (36, 36, 3), np.uint8)
    critic = Critic(frames, gym.spaces.Box(-1, 1, (2,), np.float32), layers)
    assert critic.post[0].in_features == 8 * 17 * 17 + 2  # conv features ((36 - 4) // 2 + 1 = 17), then the action
    q = critic(torch.zeros(4, 36, 36, 3, dtype=torch.uint8), torch.zeros(4, 2))
    assert q.shape == (4,)


@pytest.mark.parametrize(
    "env, model, message",
    [
        ("CartPole-v1", {}, "apex_ddpg needs a Box action space; CartPole-v1 has Discrete(2)"),
        ("Pendulum-v1", {"tau": 0}, "model.tau: expected a value in (0, 1], got 0"),
        ("Pendulum-v1", {"exploration": "uniform"}, "model.exploration: expected 'gaussian' or 'ou'"),
        ("Pendulum-v1", {"exploration_sigma": -0.1}, "model.exploration_sigma: must be >= 0"),
        ("Pendulum-v1", {"n_step": 0}, "model.n_step: must be at least 1, got 0"),
        ("Pendulum-v1", {"gamma": -0.5}, "model.gamma: expected a value in (0, 1]"),
        ("Pendulum-v1", {"critic_network": ["linear:64", "sigmoidd"]}, "model.critic_network[1]: unknown layer"),
        ("Pendulum-v1", {"actor_learning_rate": 0}, "model.actor_learning_rate: must be > 0"),
    ],
)
def test_config_errors(env, model, message):
    with pytest.raises(ConfigError) as info:
        make_algo("apex_ddpg", env, model)
    assert message in str(info.value)


def test_validation_happens_at_load_time():
    with pytest.raises(ConfigError, match=r"model.actor_network\[0\]: unknown layer"):
        make_config("apex_ddpg", "Pendulum-v1", {"actor_network": ["relux"]})


def test_an_action_dimension_of_zero_width_is_a_config_error():
    """low == high would rescale by 0/0: NaN actions. Refused, naming the dimension."""
    from aiorl.algos.apex_ddpg import ApexDDPG
    from aiorl.envs import EnvSpec

    cfg = make_config("apex_ddpg", "Pendulum-v1", {})
    space = gym.spaces.Box(np.array([-2.0, 0.5, -1.0], np.float32), np.array([2.0, 0.5, 1.0], np.float32))
    spec = EnvSpec("Fixed-v0", gym.spaces.Box(-1, 1, (3,), np.float32), space, 200)
    with pytest.raises(ConfigError, match=r"low == high in dimension\(s\) \[1\]"):
        ApexDDPG(cfg, spec)
    # The same space with a real range in every dimension is fine.
    ApexDDPG(cfg, EnvSpec("Ok-v0", spec.observation_space, gym.spaces.Box(-1, 1, (3,), np.float32), 200))
