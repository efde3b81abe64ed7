"""DPPO's pieces in one process: rollout rows and GAE for vector envs, the clipped loss, the learner step."""

import numpy as np
import pytest
import torch

from aiorl.algos.dppo import ppo_loss
from aiorl.config import ConfigError
from aiorl.envs import EnvRunner
from aiorl.experiment.loading import load_config
from aiorl.replay import reference
from aiorl.runtime.algorithm import build_algorithm


def config(agent=None, **model):
    data = {
        "algo": "dppo",
        "env": {"id": "CartPole-v1", "num_envs": 3, "max_episode_steps": 5},
        "agent": {"sample_batch_size": 7, "batch_size": 8, **(agent or {})},
        "model": {"network": ["linear:16", "tanh"], **model},
    }
    return load_config(data=data)


def test_rollout_rows_and_gae_for_vector_envs_bootstrap_on_truncation_only():
    cfg = config(gamma=0.9, gae_lambda=0.8)
    algo = build_algorithm(cfg)
    actor = algo.make_actor(0, 1, seed=3)
    actor.set_weights(algo.make_learner(0, 1, 0).get_weights(), 0)
    runner = EnvRunner(cfg.env, 3, seed=3)
    rollout = runner.rollout(actor.act, 7)
    values = np.stack([s[2] for s in actor.steps])
    rows, priorities = actor.postprocess(rollout)
    assert priorities is None and actor.steps == []
    T, E = 7, 3
    assert rollout["truncated"].any()  # the 5-step time limit cuts episodes inside the rollout
    expect = {
        "obs": (T * E, 4),
        "action": (T * E,),
        "logp": (T * E,),
        "value": (T * E,),
        "advantage": (T * E,),
        "value_target": (T * E,),
    }
    assert {k: v.shape for k, v in rows.items()} == expect
    assert rows["action"].dtype == np.int64 and rows["obs"].dtype == np.float32
    # Row t * E + e is step t of env e.
    np.testing.assert_array_equal(rows["obs"].reshape(T, E, 4), rollout["obs"])
    np.testing.assert_array_equal(rows["action"].reshape(T, E), rollout["action"])
    with torch.no_grad():
        v_next = actor.net.value(torch.as_tensor(rollout["next_obs"].reshape(T * E, 4))).numpy().reshape(T, E)
    adv, target = reference.gae(
        rollout["reward"],
        values,
        v_next[T - 1],
        rollout["terminated"],
        rollout["truncated"],
        0.9,
        0.8,
        truncated_values=v_next,
    )
    np.testing.assert_allclose(rows["advantage"].reshape(T, E), adv, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(rows["value_target"].reshape(T, E), target, rtol=1e-5, atol=1e-5)
    runner.close()


def _tiny_batch(algo, n=16, seed=0):
    rng = np.random.default_rng(seed)
    return {
        "obs": rng.normal(size=(n, 4)).astype(np.float32),
        "action": rng.integers(0, 2, n),
        "logp": np.full(n, np.log(0.5), np.float32),
        "value": np.zeros(n, np.float32),
        "advantage": rng.normal(size=n).astype(np.float32),
        "value_target": rng.normal(size=n).astype(np.float32),
    }


def test_the_surrogate_is_clipped_where_the_ratio_left_the_trust_region():
    cfg = config(clip_ratio=0.2, normalize_advantages=False, value_coef=0.0, entropy_coef=0.0)
    net = build_algorithm(cfg).network()
    obs = torch.randn(32, 4)
    action = torch.randint(0, 2, (32,))
    with torch.no_grad():
        logp = net.head.log_prob(net.policy_params(obs), action)
    zeros = torch.zeros(32)
    head_params = list(net.head.parameters())
    for ratio, advantage, clipped in [(1.5, 1.0, True), (0.5, -1.0, True), (1.5, -1.0, False), (1.1, 1.0, False)]:
        old_logp = logp - np.log(ratio)
        loss, metrics = ppo_loss(net, cfg.model, obs, action, old_logp, zeros, torch.full((32,), advantage), zeros)
        grads = torch.autograd.grad(loss, head_params)
        norm = float(sum(g.norm() for g in grads))
        assert float(metrics["losses/clip_fraction"]) == (1.0 if ratio != 1.1 else 0.0)
        assert (norm == 0.0) == clipped, (ratio, advantage, norm)
        expected = (
            -advantage * (min(ratio, 1.2) if advantage > 0 else max(ratio, 0.8)) if clipped else -advantage * ratio
        )
        assert float(loss.detach()) == pytest.approx(expected, rel=1e-5)


def test_value_clipping_takes_the_larger_error():
    obs, action = torch.zeros(4, 4), torch.zeros(4, dtype=torch.int64)
    for value_clip in (None, 0.1):
        cfg = config(value_clip=value_clip, entropy_coef=0.0)
        net = build_algorithm(cfg).network()
        with torch.no_grad():
            v = net.value(obs)
            logp = net.head.log_prob(net.policy_params(obs), action)
        old_value, target = v - 1.0, v + 0.05  # the new value moved 1.0 from the old one
        _, metrics = ppo_loss(net, cfg.model, obs, action, logp, old_value, torch.zeros(4), target)
        # Unclipped error 0.05; clipped: V_old + 0.1 is 0.95 short of the target.
        expected = 0.5 * (0.95**2 if value_clip else 0.05**2)
        assert float(metrics["losses/value_loss"]) == pytest.approx(expected, rel=1e-4)


def test_learner_step_takes_epochs_times_minibatches_and_anneals_the_step_size_to_zero():
    # One step of 16 rows anneals the step size to 0.
    cfg = config(agent={"scheduled_timesteps": 16}, epochs=3, lr_annealing=True)
    algo = build_algorithm(cfg)
    learner = algo.make_learner(0, 1, 0)
    result = learner.step(_tiny_batch(algo))
    assert learner.learner_steps == 3 * (16 // 8)  # minibatches of agent.batch_size = 8 rows
    assert result.metrics["policy/learning_rate"] == cfg.model.learning_rate
    assert np.isfinite(list(result.metrics.values())).all()
    before = {k: v.copy() for k, v in learner.get_weights().items()}
    result = learner.step(_tiny_batch(algo, seed=1))
    assert result.metrics["policy/learning_rate"] == 0.0
    after = learner.get_weights()
    changed = [k for k in before if not np.array_equal(before[k], after[k]) and "normalizer" not in k]
    assert changed == []


@pytest.mark.parametrize(
    "model, env, message",
    [
        ({"lr_annealing": True}, {}, "agent.scheduled_timesteps, which is not set"),
        ({"clip_ratio": 1.5}, {}, "model.clip_ratio"),
        ({"obs_norm": True}, {"id": "FrozenLake-v1"}, "model.obs_norm: observation normalization needs vector"),
        ({"network": ["linear:0"]}, {}, "model.network[0]"),
        ({}, {"id": "Blackjack-v1"}, "unsupported observation space"),
        ({"sde": True}, {}, "model.sde: state-dependent exploration needs a Box action space, got Discrete(2)"),
        (
            {"sde": True, "sde_sample_freq": 0},
            {"id": "Pendulum-v1"},
            "model.sde_sample_freq: must be at least 1, got 0",
        ),
    ],
)
def test_config_errors_name_the_key(model, env, message):
    data = {"algo": "dppo", "env": {"id": "CartPole-v1", **env}, "model": model}
    with pytest.raises(ConfigError) as info:
        build_algorithm(load_config(data=data))
    assert message in str(info.value)


def test_fewer_rows_per_actor_than_learners_is_refused_before_anything_starts(tmp_path, capsys):
    from aiorl.cli.main import main

    path = tmp_path / "c.yaml"
    path.write_text(
        "algo: dppo\nenv: {id: CartPole-v1}\ncluster: {learners: 3}\nagent: {sample_batch_size: 2}\n"
        f"run: {{dir: {tmp_path / 'run'}}}\n"
    )
    assert main(["run", str(path)]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "(2 rows per actor) must be at least cluster.learners (3)" in lines[0], lines
    assert not (tmp_path / "run").exists()


def test_gaussian_policy_on_a_shared_torso_steps_clipped_learns_from_unclipped_and_moves_log_std():
    cfg = load_config(
        data={
            "algo": "dppo",
            "env": {"id": "Pendulum-v1", "num_envs": 2},
            "agent": {"sample_batch_size": 50, "batch_size": 50},
            "model": {
                "network": ["linear:16", "tanh"],
                "shared_torso": True,
                "log_std_init": 0.5,
                "obs_norm": True,
                "epochs": 2,
            },
        }
    )
    algo = build_algorithm(cfg)
    learner = algo.make_learner(0, 1, 0)
    assert learner.net.v_torso is None
    actor = algo.make_actor(0, 1, seed=0)
    actor.set_weights(learner.get_weights(), 0)
    runner = EnvRunner(cfg.env, 2, seed=0)
    rollout = runner.rollout(actor.act, 50)
    rows, _ = actor.postprocess(rollout)
    runner.close()
    assert rows["action"].shape == (100, 1) and rows["action"].dtype == np.float32
    assert np.abs(rollout["action"]).max() <= 2.0 < np.abs(rows["action"]).max()  # std e^0.5 around 0
    np.testing.assert_array_equal(np.clip(rows["action"].reshape(50, 2), -2, 2), rollout["action"][..., 0])
    log_std = float(learner.net.head.log_std.detach())
    result = learner.step(rows)
    assert float(learner.net.head.log_std.detach()) != log_std and "policy/log_std_mean" in result.metrics
    # The normalizer learned this round's observations (merged after the update).
    np.testing.assert_allclose(learner.net.normalizer.mean.numpy(), rows["obs"].mean(0), rtol=1e-3, atol=1e-3)


def test_sde_actor_holds_its_noise_for_sample_freq_steps_and_redraws_it_for_new_weights():
    cfg = load_config(
        data={
            "algo": "dppo",
            "env": {"id": "Pendulum-v1", "num_envs": 2},
            "agent": {"sample_batch_size": 6, "batch_size": 12},
            "model": {"network": ["linear:16", "tanh"], "sde": True, "sde_sample_freq": 3},
        }
    )
    algo = build_algorithm(cfg)
    learner = algo.make_learner(0, 1, 0)
    actor = algo.make_actor(0, 1, seed=0)
    actor.set_weights(learner.get_weights(), 0)
    obs = np.random.default_rng(0).normal(size=(2, 3)).astype(np.float32)
    acted = [actor.act(obs) for _ in range(4)]
    # one observation, one exploration matrix per env for 3 steps, then a new one
    assert np.array_equal(acted[0], acted[1]) and np.array_equal(acted[0], acted[2])
    assert not np.array_equal(acted[0], acted[3]) and not np.array_equal(acted[0][0], acted[0][1])
    actor.steps = []
    actor.set_weights(learner.get_weights(), 1)  # a new version: a new rollout, new matrices
    assert not np.array_equal(actor.act(obs), acted[3])
    # the learner trains on the rows with the same state-dependent distribution
    actor.steps = []
    runner = EnvRunner(cfg.env, 2, seed=0)
    rows, _ = actor.postprocess(runner.rollout(actor.act, 6))
    runner.close()
    with torch.no_grad():
        params, _ = learner.net(torch.as_tensor(rows["obs"]))
        np.testing.assert_allclose(
            learner.net.head.log_prob(params, torch.as_tensor(rows["action"])).numpy(),
            rows["logp"],
            rtol=1e-4,
            atol=1e-4,
        )
    log_std = learner.net.head.log_std.detach().clone()
    assert log_std.shape == (16, 1)
    learner.step(rows)
    assert not torch.equal(learner.net.head.log_std.detach(), log_std)


def test_checkpoint_round_trip_restores_weights_and_counters(tmp_path):
    algo = build_algorithm(config())
    learner = algo.make_learner(0, 1, 0)
    learner.step(_tiny_batch(algo))
    path = learner.save_checkpoint(str(tmp_path), {"learner_steps": 1})
    other = algo.make_learner(0, 1, 5)
    meta = other.load_checkpoint(path)
    assert meta["learner_steps"] == 1 and other.iterations == 1 and other.env_steps_trained == 16
    assert other.rng.bit_generator.state == learner.rng.bit_generator.state  # minibatch order goes on
    for key, value in learner.get_weights().items():
        np.testing.assert_array_equal(other.get_weights()[key], value)
