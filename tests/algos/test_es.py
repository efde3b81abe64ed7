"""ES's pieces in one process: the shared noise table, fitness shaping, the update, the numpy policy."""

import subprocess
import sys

import numpy as np
import pytest
import torch

from aiorl.algos.es import Adam, NoiseTable, NumpyPolicy, centered_ranks, es_gradient, set_flat
from aiorl.algos.lib.actor_critic import DeterministicPolicy, batch_moments
from aiorl.config import ConfigError
from aiorl.experiment.loading import load_config
from aiorl.io import checkpoint
from aiorl.runtime.algorithm import build_algorithm

TABLE = "from aiorl.algos.es import NoiseTable; print(NoiseTable({seed}, {size}).digest())"


def config(env="CartPole-v1", **model):
    return load_config(
        data={
            "algo": "es",
            "env": {"id": env},
            "model": {"network": ["linear:8", "tanh"], "noise_table_size": 4096, **model},
        }
    )


def test_noise_table_is_identical_in_every_process():
    here = NoiseTable(7, 1 << 16)
    there = subprocess.run(
        [sys.executable, "-c", TABLE.format(seed=7, size=1 << 16)],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout.strip()
    assert there == here.digest()
    assert NoiseTable(8, 1 << 16).digest() != here.digest()
    assert here.noise.dtype == np.float32 and abs(float(here.noise.std()) - 1.0) < 0.01


def test_centered_ranks_span_minus_half_to_half_and_ties_share_their_rank():
    np.testing.assert_allclose(centered_ranks(np.array([[3.0, 1.0], [2.0, 10.0]])), [[1 / 6, -0.5], [-1 / 6, 0.5]])
    tied = centered_ranks(np.array([[500.0, 500.0], [500.0, 20.0]]))
    np.testing.assert_allclose(tied, [[1 / 6, 1 / 6], [1 / 6, -0.5]])
    assert centered_ranks(np.full((4, 2), 500.0)).tolist() == [[0.0, 0.0]] * 4  # all tied: no signal


def test_es_gradient_is_the_rank_weighted_sum_of_the_pairs_noise():
    table = NoiseTable(0, 1000)
    indices = np.array([5, 100, 700])
    returns = np.array([[1.0, 0.0], [5.0, 6.0], [2.0, -3.0]])
    ranks = centered_ranks(returns)
    expected = (
        sum((ranks[i, 0] - ranks[i, 1]) * table.noise[j : j + 10].astype(np.float64) for i, j in enumerate(indices)) / 6
    )
    np.testing.assert_allclose(es_gradient(table, indices, returns, 10), expected, rtol=1e-12)


def test_adam_matches_torch_adam():
    rng = np.random.default_rng(0)
    theta = rng.normal(size=5)
    ours = Adam(5, lr=0.01, eps=1e-8)
    param = torch.nn.Parameter(torch.as_tensor(theta.copy()))
    ref = torch.optim.Adam([param], lr=0.01, eps=1e-8)
    for _ in range(5):
        g = rng.normal(size=5)
        theta = ours.step(theta, g)
        param.grad = torch.as_tensor(g)
        ref.step()
    np.testing.assert_allclose(theta, param.detach().numpy(), rtol=1e-6)


@pytest.mark.parametrize("env, obs_norm", [("CartPole-v1", True), ("Pendulum-v1", True), ("FrozenLake-v1", False)])
def test_numpy_policy_acts_as_the_exported_torch_policy(env, obs_norm):
    algo = build_algorithm(config(env, obs_norm=obs_norm, network=["linear:8", "tanh", "linear:8", "relu"]))
    net = algo.network()
    rng = np.random.default_rng(1)
    theta = rng.normal(0, 1.5, size=sum(p.numel() for p in net.parameters() if p.requires_grad))
    set_flat(net, theta)
    space = algo.env_spec.observation_space
    obs = np.stack([space.sample() for _ in range(50)])
    if obs_norm:
        net.normalizer.update(*batch_moments(obs))
    ours = NumpyPolicy(net)
    assert ours.dim == len(theta)
    ours.set_theta(theta)
    ours.set_normalizer(net.normalizer.shift.numpy(), net.normalizer.scale.numpy())
    with torch.no_grad():
        expected = DeterministicPolicy(net)(torch.as_tensor(obs)).numpy()
    got = np.array([ours(o) for o in obs])
    if expected.dtype == np.int64:
        assert got.tolist() == expected.tolist()
    else:
        np.testing.assert_allclose(got.reshape(expected.shape), expected, rtol=1e-4, atol=1e-5)


def test_learner_step_moves_theta_toward_the_better_perturbation():
    cfg = config(weight_decay=0.0, learning_rate=0.1)
    algo = build_algorithm(cfg)
    learner = algo.make_learner(0, 1, 0)
    theta0 = learner.theta.copy()
    dim = len(theta0)
    batch = {
        "noise_index": np.array([0, 50]),
        "returns": np.array([[10.0, 0.0], [3.0, 4.0]]),
        "lengths": np.array([[10, 1], [3, 4]]),
        "obs_count": np.zeros(2),
        "obs_sum": np.zeros((2, 1)),
        "obs_sumsq": np.zeros((2, 1)),
    }
    learner.step(batch)
    g = es_gradient(learner.noise, batch["noise_index"], batch["returns"], dim)
    assert np.dot(learner.theta - theta0, g) > 0  # ascent on the shaped returns
    assert learner.env_steps_trained == 18


@pytest.mark.parametrize(
    "cluster, env, model, message",
    [
        ({"learners": 2}, {}, {}, "cluster.learners: es combines every result on one learner"),
        ({"memories": 4}, {}, {"population": 3}, "model.population (3) must be at least cluster.memories (4)"),
        ({}, {"num_envs": 2}, {}, "env.num_envs: es evaluates each perturbation on one env"),
        ({}, {}, {"network": ["layernorm"]}, "es actors run the policy in numpy"),
        ({}, {}, {"noise_table_size": 10}, "model.noise_table_size (10) must be at least"),
    ],
)
def test_config_errors_name_the_key(cluster, env, model, message):
    data = {"algo": "es", "cluster": cluster, "env": {"id": "CartPole-v1", **env}, "model": model}
    with pytest.raises(ConfigError) as info:
        build_algorithm(load_config(data=data))
    assert message in str(info.value)


def test_observation_moments_from_the_actors_are_merged_into_the_published_normalizer():
    algo = build_algorithm(config(obs_norm=True))
    learner = algo.make_learner(0, 1, 0)
    actor = algo.make_actor(0, 1, seed=0)
    actor.set_weights(learner.get_weights(), 0)
    results = [actor.run_work(0, item) for item in range(3)]
    batch = {k: np.concatenate([r.batch[k] for r in results]) for k in results[0].batch}
    assert batch["obs_count"].sum() == sum(r.env_steps for r in results) and batch["obs_sum"].shape == (3, 4)
    learner.step(batch)
    mean = batch["obs_sum"].sum(0) / batch["obs_count"].sum()
    np.testing.assert_allclose(learner.net.normalizer.mean.numpy(), mean, rtol=1e-3, atol=1e-6)
    weights = learner.get_weights()
    np.testing.assert_allclose(weights["normalizer.shift"], mean, rtol=1e-3, atol=1e-6)
    actor.set_weights(weights, 1)
    np.testing.assert_allclose(actor.policy.shift, mean, rtol=1e-3, atol=1e-6)


def test_an_item_gives_the_same_result_whichever_actor_evaluates_it():
    algo = build_algorithm(config())
    weights = algo.make_learner(0, 1, 0).get_weights()
    first, second = algo.make_actor(0, 2, seed=10_000), algo.make_actor(1, 2, seed=20_000)
    for actor in (first, second):
        actor.set_weights(weights, 3)
    a, b = first.run_work(3, 4), second.run_work(3, 4)
    assert {k: v.tolist() for k, v in a.batch.items()} == {k: v.tolist() for k, v in b.batch.items()}
    other = first.run_work(3, 5).batch
    assert other["noise_index"][0] != a.batch["noise_index"][0]  # another item, another perturbation


def test_checkpoint_round_trip_restores_theta_adam_and_normalizer(tmp_path):
    algo = build_algorithm(config(obs_norm=True))
    learner = algo.make_learner(0, 1, 0)
    actor = algo.make_actor(0, 1, seed=0)
    actor.set_weights(learner.get_weights(), 0)
    learner.step({k: v for k, v in actor.run_work(0, 0).batch.items()})
    path = learner.save_checkpoint(str(tmp_path), {"learner_steps": 1})
    assert checkpoint.load(path)[1]["algo"] == "es"  # plain tensors and numbers (weights_only=True)
    other = algo.make_learner(0, 1, 1)
    other.load_checkpoint(path)
    assert other.iterations == 1 and other.env_steps_trained == learner.env_steps_trained
    for key, value in learner.get_weights().items():
        np.testing.assert_array_equal(other.get_weights()[key], value)
    assert other.adam.t == 1 and np.array_equal(other.adam.m, learner.adam.m)
    assert other.export_policy(str(tmp_path / "policy")).endswith("policy.pt2")


def test_a_table_drawn_before_the_fork_is_the_one_each_role_reads(monkeypatch):
    """ES.prefork (for the warm spawner) draws the table once; a NoiseTable of the same seed and
    size then holds that very array, read-only (shared pages stay shared), equal to a fresh draw."""
    from types import SimpleNamespace

    from aiorl.algos import es

    monkeypatch.setattr(es, "_PREFORKED", {})
    cfg = SimpleNamespace(model=SimpleNamespace(noise_seed=3, noise_table_size=1 << 12))
    fresh = NoiseTable(3, 1 << 12)
    assert not fresh.shared
    es.ES.adopt_prefork(es.ES.prefork(cfg))
    shared = NoiseTable(3, 1 << 12)
    assert shared.shared and shared.noise is es._PREFORKED[es.noise_key(3, 1 << 12)]
    assert np.array_equal(shared.noise, fresh.noise) and shared.digest() == fresh.digest()
    assert not shared.noise.flags.writeable and not fresh.noise.flags.writeable
    assert not NoiseTable(4, 1 << 12).shared  # another seed: drawn here
