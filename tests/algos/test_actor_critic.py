"""Actor-critic networks and policy distributions (aiorl/algos/lib/actor_critic.py)."""

import gymnasium as gym
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from aiorl.algos.lib.actor_critic import (
    ActorCritic,
    CategoricalHead,
    DeterministicPolicy,
    GaussianHead,
    ObsNormalizer,
    SDEHead,
    batch_moments,
)
from aiorl.algos.lib.layers import parse_network
from aiorl.evaluation.policies import load_policy
from aiorl.io.export import save_policy

BOX_OBS = gym.spaces.Box(-np.inf, np.inf, (3,), np.float32)
BOX_ACT = gym.spaces.Box(np.array([-2.0, -1.0], np.float32), np.array([2.0, 1.0], np.float32))
LAYERS = parse_network(["linear:16", "tanh"], "model.network")


def test_categorical_log_prob_and_entropy_match_torch():
    head = CategoricalHead(5, 4)
    logits = torch.randn(7, 4)
    action = torch.randint(0, 4, (7,))
    ref = torch.distributions.Categorical(logits=logits)
    torch.testing.assert_close(head.log_prob(logits, action), ref.log_prob(action))
    torch.testing.assert_close(head.entropy(logits), ref.entropy())


def test_categorical_samples_follow_the_probabilities_and_report_their_log_prob():
    head = CategoricalHead(5, 3)
    logits = torch.log(torch.tensor([[0.7, 0.2, 0.1]])).expand(20_000, 3)
    action, logp = head.sample(logits, np.random.default_rng(0))
    freq = np.bincount(action, minlength=3) / len(action)
    np.testing.assert_allclose(freq, [0.7, 0.2, 0.1], atol=0.015)
    np.testing.assert_allclose(logp, np.log([0.7, 0.2, 0.1])[action], rtol=1e-5)


def test_gaussian_log_prob_entropy_and_sampling_of_the_unclipped_action():
    head = GaussianHead(5, BOX_ACT, log_std_init=-0.5)
    mean = torch.randn(6, 2)
    action = torch.randn(6, 2) * 3
    ref = torch.distributions.Normal(mean, torch.exp(head.log_std))
    torch.testing.assert_close(head.log_prob(mean, action), ref.log_prob(action).sum(1))
    torch.testing.assert_close(head.entropy(mean), ref.entropy().sum(1))
    big = torch.full((4000, 2), 1.9)
    sample, logp = head.sample(big.detach(), np.random.default_rng(1))
    assert (sample[:, 0] > 2.0).mean() > 0.3  # the sample itself is not clipped...
    torch.testing.assert_close(torch.as_tensor(logp), head.log_prob(big, torch.as_tensor(sample)).detach())
    clipped = head.clip_to_bounds(sample)  # ...what the env gets is
    assert clipped[:, 0].max() <= 2.0 and clipped[:, 1].min() >= -1.0
    np.testing.assert_allclose(sample.std(axis=0), np.exp(-0.5), rtol=0.05)


def test_sde_noise_is_a_linear_function_of_the_features_held_for_sample_freq_steps():
    head = SDEHead(5, BOX_ACT, log_std_init=-0.5, sample_freq=3)
    with torch.no_grad():
        head.log_std.normal_(-0.5, 0.3)  # a scale per (feature, action)
    x = torch.randn(6, 5)
    params = head(x)
    mean, log_sigma = params[:, :2], params[:, 2:]
    # the state's std: sigma(s)^2 = x^2 @ exp(2 log_std), log_prob and entropy those of N(mean, sigma(s))
    torch.testing.assert_close(log_sigma.exp().pow(2), x.pow(2) @ torch.exp(2 * head.log_std) + SDEHead.EPS)
    # the std's gradient reaches log_std, not the torso (the features are detached)
    xg = x.clone().requires_grad_(True)
    head(xg)[:, 2:].sum().backward()
    assert xg.grad is None or not xg.grad.any()
    assert head.log_std.grad is not None and head.log_std.grad.any()
    ref = torch.distributions.Normal(mean, log_sigma.exp())
    action = torch.randn(6, 2) * 3
    torch.testing.assert_close(head.log_prob(params, action), ref.log_prob(action).sum(1))
    torch.testing.assert_close(head.entropy(params), ref.entropy().sum(1))
    params, mean = params.detach(), mean.detach()
    rng = np.random.default_rng(0)
    draws = [head.sample(params, rng, x) for _ in range(4)]
    # one exploration matrix per env for 3 steps: the same state, the same action; then a new one
    assert all(np.array_equal(draws[0][0], d[0]) for d in draws[1:3]) and not np.array_equal(draws[0][0], draws[3][0])
    noise = draws[0][0] - mean.numpy()
    w = head._noise  # [envs, features, dim]: the noise is x @ W
    np.testing.assert_allclose(draws[3][0] - mean.numpy(), np.einsum("bf,bfd->bd", x.numpy(), w), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(torch.as_tensor(draws[0][1]), head.log_prob(params, torch.as_tensor(draws[0][0])))
    assert noise.shape == (6, 2)
    head.reset_noise()
    assert not np.array_equal(head.sample(params, rng, x)[0], draws[3][0])  # new weights: new matrices
    # across many draws the noise has the state's std
    one = x[:1].expand(4000, 5)
    head.sample_freq = 1
    sample, _ = head.sample(head(one).detach(), rng, one)
    np.testing.assert_allclose(sample.std(axis=0), log_sigma[0].exp().detach().numpy(), rtol=0.06)
    # the exported policy is the clipped mean
    big = torch.full((3, 5), 1.9)
    with torch.no_grad():
        torch.testing.assert_close(head.mode(head(big)), torch.max(torch.min(head.mean(big), head.high), head.low))


def test_sde_needs_a_box_action_space():
    from aiorl.config import ConfigError

    with pytest.raises(
        ConfigError, match=r"model.sde: state-dependent exploration needs a Box action space, got Discrete\(3\)"
    ):
        ActorCritic(BOX_OBS, gym.spaces.Discrete(3), LAYERS, sde_sample_freq=4)


@settings(max_examples=40, deadline=None)
@given(sizes=st.lists(st.integers(1, 50), min_size=1, max_size=5), seed=st.integers(0, 1000))
def test_obs_normalizer_merged_batches_equal_the_statistics_of_all_rows(sizes, seed):
    rng = np.random.default_rng(seed)
    batches = [rng.normal(3.0, 2.0, size=(n, 3)) for n in sizes]
    norm = ObsNormalizer(3, clip=100.0)
    norm.count.fill_(0.0)  # no prior: the exact statistics of the rows seen
    for batch in batches:
        norm.update(*batch_moments(batch))
    rows = np.concatenate(batches)
    np.testing.assert_allclose(norm.mean.numpy(), rows.mean(0), rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(norm.var.numpy(), rows.var(0), rtol=1e-7, atol=1e-9)
    x = torch.as_tensor(rows[:4], dtype=torch.float32)
    expected = (rows[:4] - rows.mean(0)) / np.sqrt(rows.var(0) + 1e-8)
    np.testing.assert_allclose(norm(x).numpy(), expected, rtol=1e-4, atol=1e-4)


def test_obs_normalizer_clips_and_a_disabled_one_only_converts():
    norm = ObsNormalizer(1, clip=2.0)
    norm.update(*batch_moments(np.array([[0.0], [2.0]])))
    assert norm(torch.tensor([[100.0], [-100.0]])).tolist() == [[2.0], [-2.0]]
    off = ObsNormalizer(0)
    assert off(torch.tensor([[5]], dtype=torch.int64)).dtype == torch.float32


def test_shared_torso_has_one_torso_and_separate_has_two():
    shared = ActorCritic(BOX_OBS, BOX_ACT, LAYERS, shared=True)
    separate = ActorCritic(BOX_OBS, BOX_ACT, LAYERS, shared=False)
    assert shared.v_torso is None and separate.v_torso is not None
    count = lambda net: sum(p.numel() for p in net.parameters())  # noqa: E731
    assert count(separate) - count(shared) == 3 * 16 + 16
    params, value = separate(torch.zeros(5, 3))
    assert params.shape == (5, 2) and value.shape == (5,)
    torch.testing.assert_close(separate.value(torch.zeros(5, 3)), value)
    no_critic = ActorCritic(BOX_OBS, BOX_ACT, LAYERS, critic=False, learn_std=False)
    assert no_critic.value_head is None and not no_critic.head.log_std.requires_grad


@pytest.mark.parametrize("action_space", [gym.spaces.Discrete(3), BOX_ACT])
def test_exported_policy_is_greedy_or_the_clipped_mean_and_loads_with_plain_torch(tmp_path, action_space):
    net = ActorCritic(BOX_OBS, action_space, LAYERS, obs_norm=3)
    with torch.no_grad():
        for p in net.parameters():
            p.normal_(0, 3.0)  # large outputs: the clip must matter
    net.normalizer.update(*batch_moments(np.random.default_rng(0).normal(size=(10, 3))))
    path = save_policy(
        DeterministicPolicy(net), str(tmp_path), {"algo": "test", "observation_shape": [3], "observation_dtype": "<f4"}
    )
    loaded = load_policy(path, trust_program=True)  # a bare module: no algorithm to rebuild it from
    obs = torch.randn(64, 3)
    out = loaded(obs)
    params = net.policy_params(obs).detach()
    if isinstance(action_space, gym.spaces.Discrete):
        assert out.dtype == torch.int64 and torch.equal(out, params.argmax(1))
    else:
        low, high = torch.as_tensor(action_space.low), torch.as_tensor(action_space.high)
        torch.testing.assert_close(out, torch.max(torch.min(params, high), low))
        assert (out == high).any() or (out == low).any()
