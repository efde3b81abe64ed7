"""Acting in numpy (aiorl/algos/lib/numpy_forward.py): the compiled forward equals the torch
module's to float tolerance for every layer it claims, follows new weights after `refresh`, is
refused (None) for layers it does not run, and each acting policy chooses the same actions with
it as through torch; and bench/acting.py stays runnable."""

import json
import os
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st
from torch import nn

from aiorl.algos.lib.actor_critic import ActorCritic
from aiorl.algos.lib.common import load_numpy_state, state_to_numpy
from aiorl.algos.lib.layers import parse_network
from aiorl.algos.lib.networks import DeterministicActor, QNetwork
from aiorl.algos.lib.numpy_forward import (
    NumpyActorCritic,
    NumpyForward,
    compile_numpy,
    probe_observations,
)
from aiorl.experiment.loading import load_config
from aiorl.runtime.algorithm import build_algorithm

ROOT = Path(__file__).resolve().parents[2]
BOX = gym.spaces.Box(-5, 5, (6,), np.float32)
HIDDEN = ["linear", "relu", "tanh", "elu", "silu", "layernorm"]


def _network(kinds: list[str], width: int = 16) -> list:
    spec, last = [], None
    for kind in kinds:
        if kind == "linear" or last is None:
            spec.append(f"linear:{width}")
        if kind != "linear":
            spec.append(kind)
        last = kind
    return parse_network(spec, "model.network")


def _perturb(module: nn.Module, seed: int) -> None:
    """Weights away from their initialization (zero biases would hide a dropped bias)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.5)


@settings(max_examples=25, deadline=None)
@given(
    kinds=st.lists(st.sampled_from(HIDDEN), min_size=0, max_size=5),
    dueling=st.booleans(),
    rows=st.integers(1, 9),
    seed=st.integers(0, 2**16),
)
@example(kinds=["linear", "layernorm", "elu"], dueling=True, rows=4, seed=1)  # every run holds a layernorm
def test_q_network_in_numpy_equals_torch(kinds, dueling, rows, seed):
    torch.manual_seed(seed)
    q = QNetwork(BOX, 5, _network(kinds), dueling).eval()
    _perturb(q, seed)
    fast = compile_numpy(q)
    obs = probe_observations(BOX, rows, seed)
    with torch.inference_mode():
        expected = q(torch.as_tensor(obs)).numpy()
    np.testing.assert_allclose(fast(obs), expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    "space",
    [
        gym.spaces.Discrete(7),  # one-hot encoded
        gym.spaces.Box(-1, 1, (), np.float32),  # scalar observations
        gym.spaces.Box(0, 255, (5,), np.uint8),  # scaled to [0, 1]
    ],
    ids=["discrete", "scalar", "uint8"],
)
def test_observation_encoders_in_numpy_equal_torch(space):
    q = QNetwork(space, 3, _network(["linear", "relu"]), dueling=False).eval()
    _perturb(q, 1)
    obs = probe_observations(space, 6, 3)
    fast = compile_numpy(q, obs)  # checks itself on obs
    with torch.inference_mode():
        np.testing.assert_allclose(fast(obs), q(torch.as_tensor(obs)).numpy(), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("network", [["conv:8:3:1", "relu", "flatten"], ["linear:16", "gelu"]])
def test_layers_numpy_does_not_run_leave_the_module_to_torch(network):
    space = gym.spaces.Box(0, 255, (12, 12, 1), np.uint8) if "conv" in network[0] else BOX
    q = QNetwork(space, 3, parse_network(network, "model.network"), dueling=False)
    assert compile_numpy(q, probe_observations(space)) is None


def test_a_numpy_forward_follows_new_weights_only_after_refresh():
    q = QNetwork(BOX, 4, _network(["linear", "relu", "linear", "tanh"]), dueling=True).eval()
    fast = NumpyForward(q)
    obs = probe_observations(BOX, 5, 0)
    before = fast(obs)
    other = QNetwork(BOX, 4, _network(["linear", "relu", "linear", "tanh"]), dueling=True)
    _perturb(other, 9)
    load_numpy_state(q, state_to_numpy(other, "q"), "q")
    np.testing.assert_array_equal(fast(obs), before)  # copies, not views of the module's tensors
    fast.refresh()
    with torch.inference_mode():
        np.testing.assert_allclose(fast(obs), other(torch.as_tensor(obs)).numpy(), rtol=1e-4, atol=1e-5)


def test_check_refuses_a_forward_that_differs_from_the_module():
    q = QNetwork(BOX, 4, _network(["linear", "relu"]), dueling=False).eval()
    fast = NumpyForward(q)
    fast.steps[-1].b = fast.steps[-1].b + 1e-2
    with pytest.raises(RuntimeError, match="differs from torch"):
        fast.check(probe_observations(BOX))


@pytest.mark.parametrize("shared", [False, True], ids=["two torsos", "shared torso"])
@pytest.mark.parametrize(
    "action_space", [gym.spaces.Discrete(3), gym.spaces.Box(-2, 2, (2,), np.float32)], ids=["categorical", "gaussian"]
)
def test_actor_critic_act_in_numpy_equals_torch_with_normalized_observations(shared, action_space):
    net = ActorCritic(BOX, action_space, _network(["linear", "tanh", "linear", "tanh"]), shared=shared, obs_norm=6)
    _perturb(net, 4)
    rng = np.random.default_rng(0)
    rows = rng.normal(2.0, 3.0, (50, 6))
    net.normalizer.update(len(rows), rows.sum(0), np.square(rows).sum(0))  # shift and scale away from 0 and 1
    fast = compile_numpy(net)
    assert isinstance(fast, NumpyActorCritic)
    obs = rng.normal(2.0, 3.0, (7, 6)).astype(np.float32)
    obs[0] = 80.0  # far outside: the normalizer clips it
    fast.check(obs)
    with torch.inference_mode():
        params, value, features = net.act(torch.as_tensor(obs))
    got = fast.act(obs)
    for have, want in zip(got, (params, value, features)):
        np.testing.assert_allclose(have, want.numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(fast.policy_params(obs), params.numpy(), rtol=1e-4, atol=1e-5)


def test_deterministic_actor_unit_in_numpy_equals_torch():
    space = gym.spaces.Box(-2, 2, (3,), np.float32)
    actor = DeterministicActor(BOX, space, _network(["linear", "relu", "linear", "relu"]))
    _perturb(actor, 2)
    fast = compile_numpy(nn.Sequential(actor.torso, actor.out, nn.Tanh()))
    obs = probe_observations(BOX, 4, 1)
    with torch.inference_mode():
        np.testing.assert_allclose(fast(obs), actor.unit(torch.as_tensor(obs)).numpy(), rtol=1e-4, atol=1e-5)


EXAMPLES = ["apex_dqn_cartpole", "apex_ddpg_pendulum", "impala_cartpole", "dppo_cartpole"]


@pytest.mark.parametrize("example", EXAMPLES)
def test_each_acting_policy_takes_the_numpy_path_and_acts_as_through_torch(example):
    """Two policies of one seed, one forced onto torch, fed the same observations and new weights:
    the same actions (and the same values and behaviour parameters they keep for their fragments)."""
    cfg = load_config(ROOT / "examples" / f"{example}.yaml", ["env.num_envs=4"])
    algo = build_algorithm(cfg)
    fast, slow = algo.make_actor(0, 1, 7), algo.make_actor(0, 1, 7)
    assert fast.fast is not None
    slow.fast = None
    space = algo.env_spec.observation_space
    learner = algo.make_actor(0, 1, 99)  # other weights, as a learner would publish them
    weights = _published(learner)
    for policy in (fast, slow):
        policy.set_weights(weights, 1)
    for t in range(20):
        obs = probe_observations(space, 4, t)
        np.testing.assert_allclose(fast.act(obs), slow.act(obs), rtol=1e-5, atol=1e-5)
    if hasattr(fast, "steps"):  # what IMPALA and PPO keep of each step for the learner
        for a, b in zip(fast.steps, slow.steps):
            for x, y in zip(a, b):
                np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-5)


def _published(policy) -> dict:
    """The weights a learner publishes for `policy`'s algorithm, from the policy's own modules."""
    weights = {}
    for name in ("q", "net", "actor", "critic"):
        module = getattr(policy, name, None)
        if isinstance(module, nn.Module):
            _perturb(module, len(weights))
            weights.update(state_to_numpy(module, name))
    return weights


def test_bench_acting_writes_its_rows(tmp_path):
    path = tmp_path / "acting.json"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run(
        [sys.executable, "bench/acting.py", "--seconds", "0.2", "--repeats", "1", "--json", str(path)]
        + ["examples/apex_dqn_cartpole.yaml", "examples/es_cartpole.yaml"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    rows = json.loads(path.read_text())["rows"]
    dqn, es = rows
    assert dqn["example"] == "apex_dqn_cartpole" and dqn["num_envs"] == 8
    assert dqn["policy_steps_per_s"] > 0 and dqn["random_steps_per_s"] > 0 and dqn["torch_ratio"] > 0
    assert "work items" in es["note"]
    assert "target apex_dqn_cartpole" in out.stdout
