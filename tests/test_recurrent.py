"""Recurrent policies (``model.recurrent``) without sockets: the actor's state per env, reset at
every episode start; the state each fragment carries; the learner's unroll with the reset mask,
against the cell stepped one step at a time; config errors; the fragment checks of a state."""

import numpy as np
import pytest
import torch

from aiorl.algos.impala import episode_starts, impala_loss
from aiorl.config import ConfigError
from aiorl.envs import EnvRunner
from aiorl.experiment.loading import load_config
from aiorl.replay.trajectory_queue import TrajectoryQueue
from aiorl.runtime.algorithm import build_algorithm

T, E = 8, 3


def config(algo="impala", kind="lstm", hidden=8, env="CartPole-v1", max_steps=5, **model):
    agent = {"sample_batch_size": T, "batch_size": 2 * T} if algo == "impala" else {"sample_batch_size": T}
    return load_config(
        data={
            "algo": algo,
            # Short episodes: every fragment holds episode ends (truncations), the case under test.
            "env": {"id": env, "num_envs": E, "max_episode_steps": max_steps},
            "agent": agent,
            "model": {"network": ["linear:16", "tanh"], "recurrent": {"type": kind, "hidden": hidden}, **model},
        }
    )


def acted(cfg, seed=0, rollouts=1):
    algo = build_algorithm(cfg)
    actor = algo.make_actor(0, 1, seed)
    learner = algo.make_learner(0, 1, seed)
    actor.set_weights(learner.get_weights(), 0)
    runner = EnvRunner(cfg.env, E, seed)
    out = []
    for _ in range(rollouts):
        rollout = runner.rollout(actor.act, T, actor.begin_episodes)
        out.append((rollout, actor.postprocess(rollout)[0]))
    runner.close()
    return algo, actor, learner, out


def step_by_step(net, obs, done):
    """The states an env's steps were acted from, the cell stepped one step at a time from zeros,
    zeroed after every episode end: obs [T, ...], done [T] -> states [T, state_size]."""
    state = torch.zeros(1, net.state_size)
    states = []
    with torch.no_grad():
        for t in range(len(obs)):
            states.append(state[0].numpy().copy())
            state = net.step(torch.as_tensor(obs[t : t + 1]), state)[3]
            if done[t]:
                state = torch.zeros_like(state)
    return np.stack(states)


@pytest.mark.parametrize("kind, size", [("lstm", 16), ("gru", 8)])
def test_the_actor_resets_the_state_at_every_episode_start_and_sends_it(kind, size):
    algo, actor, _, out = acted(config(kind=kind), rollouts=2)
    assert algo.transition_spec()["state"] == ((2 * size,), "<f4")  # policy and value cores
    obs = np.concatenate([f["obs"] for _, f in out], axis=1)  # [E, 2T, ...]
    done = np.concatenate([f["terminated"] | f["truncated"] for _, f in out], axis=1)
    state = np.concatenate([f["state"] for _, f in out], axis=1)
    assert done.any(axis=1).all()  # every env ended an episode inside the fragments
    for e in range(E):
        np.testing.assert_allclose(state[e], step_by_step(actor.net, obs[e], done[e]), rtol=1e-5, atol=1e-6)
        starts = np.flatnonzero(done[e][:-1]) + 1
        assert (state[e, starts] == 0).all() and (state[e, 0] == 0).all()
    # The second fragment carries the state the first one ended with (not zeros).
    second = out[1][1]
    carried = ~(out[0][1]["terminated"][:, -1] | out[0][1]["truncated"][:, -1])
    assert carried.any() and (np.abs(second["state"][carried, 0]).sum(axis=1) > 0).all()


def test_the_learners_unroll_resets_exactly_at_episode_starts():
    _, actor, learner, out = acted(config(), rollouts=2)
    f = out[1][1]  # a fragment that does not start from zeros
    net = learner.net
    first = torch.as_tensor(episode_starts(f["terminated"], f["truncated"]))
    with torch.no_grad():
        params, values, after = net.unroll(torch.as_tensor(f["obs"]), torch.as_tensor(f["state"][:, 0]), first)
    # Every step's state as the actor had it; the state after step t is step t+1's unless t ended one.
    done = f["terminated"] | f["truncated"]
    np.testing.assert_allclose(after[:, :-1].numpy()[~done[:, :-1]], f["state"][:, 1:][~done[:, :-1]], atol=1e-6)
    with torch.no_grad():
        expect = net.step(torch.as_tensor(f["obs"].reshape(E * T, -1)), torch.as_tensor(f["state"].reshape(E * T, -1)))
    np.testing.assert_allclose(params.numpy(), expect[0].numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(values.numpy(), expect[1].numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(f["behaviour_logits"].reshape(E * T, -1), params.numpy(), rtol=1e-5, atol=1e-6)


def test_without_the_reset_mask_the_unroll_differs():
    """The mask matters: a state carried over an episode end gives other outputs."""
    _, _, learner, out = acted(config(), rollouts=1)
    f = out[0][1]
    obs, state0 = torch.as_tensor(f["obs"]), torch.as_tensor(f["state"][:, 0])
    with torch.no_grad():
        masked = learner.net.unroll(obs, state0, torch.as_tensor(episode_starts(f["terminated"], f["truncated"])))
        unmasked = learner.net.unroll(obs, state0, torch.zeros(E, T, dtype=torch.bool))
    assert not torch.allclose(masked[0], unmasked[0])


def test_a_learner_step_on_recurrent_fragments_learns_with_rho_one():
    _, _, learner, out = acted(config(), rollouts=1)
    batch = {**out[0][1], "weights_version": np.zeros(E, np.int64)}
    loss, metrics = impala_loss(learner.net, learner.m, batch, learner.device)
    assert torch.isfinite(loss) and metrics["vtrace/rho_mean"] == pytest.approx(1.0, abs=1e-5)
    result = learner.step(batch)
    assert np.isfinite(result.metrics["losses/policy_loss"])


def test_a_fragment_with_a_wrong_shaped_state_is_refused_whole():
    algo, _, _, out = acted(config(), rollouts=1)
    queue = TrajectoryQueue(8, algo.transition_spec(), T)
    f = out[0][1]
    for bad in (f["state"][:, :, :-1], f["state"][:, :1], f["state"].astype(np.float64)):
        with pytest.raises(ValueError, match="fragment field 'state'"):
            queue.push({**f, "state": bad}, 0, 0)
        assert len(queue) == 0
    queue.push(f, 0, 0)
    assert len(queue) == E


@pytest.mark.parametrize(
    "recurrent, match",
    [
        ({"type": "rnn", "hidden": 8}, r"model.recurrent.type: expected 'lstm' or 'gru', got 'rnn'"),
        ({"type": "lstm", "hidden": 0}, r"model.recurrent.hidden: expected an integer > 0 .* got 0"),
        ({"type": "gru", "hidden": -3}, r"model.recurrent.hidden: expected an integer > 0 .* got -3"),
        ({"type": "lstm", "size": 8}, r"model.recurrent: expected \{type: lstm \| gru, hidden: N\}"),
        ("lstm", r"model.recurrent: expected dict"),
    ],
)
def test_bad_recurrent_values_are_one_line_naming_them(recurrent, match):
    with pytest.raises(ConfigError, match=match):
        load_config(data={"algo": "impala", "model": {"recurrent": recurrent}})


@pytest.mark.parametrize("algo", ["apex_dqn", "es"])
def test_recurrent_with_an_algorithm_without_it_is_one_line(algo):
    with pytest.raises(ConfigError, match=rf"model.recurrent: {algo} has no recurrent policies, got .*lstm.*impala"):
        load_config(data={"algo": algo, "model": {"recurrent": {"type": "lstm", "hidden": 8}}})
