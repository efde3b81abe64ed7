"""Recurrent policies (``model.recurrent``) without sockets: the actor's state per env, reset at
every episode start; the state each fragment carries once, at its first step; the learner's
unroll with the reset mask, against the cell stepped one step at a time; config errors; the
fragment checks of a state."""

import numpy as np
import pytest
import torch

from aiorl.algos.impala import episode_starts, impala_loss
from aiorl.config import ConfigError
from aiorl.envs import EnvRunner
from aiorl.experiment.loading import load_config
from aiorl.replay.trajectory_queue import TrajectoryQueue
from aiorl.runtime.actor import ActorRole
from aiorl.runtime.algorithm import build_algorithm
from aiorl.runtime.messages import RowSpec
from aiorl.runtime.role import OwnInconsistency

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


def step_by_step(net, obs, done, start=None):
    """The states an env's steps were acted from, the cell stepped one step at a time from `start`
    (default zeros), zeroed after every episode end: obs [T, ...], done [T] -> states [T, state_size]."""
    state = torch.zeros(1, net.state_size) if start is None else torch.as_tensor(start).reshape(1, -1)
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
    # Once per fragment (policy and value cores), not per step.
    assert algo.per_fragment_spec() == {"state": ((2 * size,), "<f4")} and "state" not in algo.transition_spec()
    assert all(f["state"].shape == (E, 2 * size) and f["state"].dtype == np.float32 for _, f in out)
    obs = np.concatenate([f["obs"] for _, f in out], axis=1)  # [E, 2T, ...]
    done = np.concatenate([f["terminated"] | f["truncated"] for _, f in out], axis=1)
    logits = np.concatenate([f["behaviour_logits"] for _, f in out], axis=1)
    assert done.any(axis=1).all()  # every env ended an episode inside the fragments
    for e in range(E):
        state = step_by_step(actor.net, obs[e], done[e])
        # Each fragment carries the state of its first step (the second: the one the first ended with).
        np.testing.assert_allclose(out[0][1]["state"][e], state[0], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(out[1][1]["state"][e], state[T], rtol=1e-5, atol=1e-6)
        # Every step was acted from the state reset at each episode start: its logits say so.
        with torch.no_grad():
            expect = actor.net.step(torch.as_tensor(obs[e]), torch.as_tensor(state))[0].numpy()
        np.testing.assert_allclose(logits[e], expect, rtol=1e-5, atol=1e-6)
    assert (out[0][1]["state"] == 0).all()
    carried = ~(out[0][1]["terminated"][:, -1] | out[0][1]["truncated"][:, -1])
    assert carried.any() and (np.abs(out[1][1]["state"][carried]).sum(axis=1) > 0).all()


def test_the_learners_unroll_resets_exactly_at_episode_starts():
    _, actor, learner, out = acted(config(), rollouts=2)
    f = out[1][1]  # a fragment that does not start from zeros
    net = learner.net
    first = torch.as_tensor(episode_starts(f["terminated"], f["truncated"]))
    with torch.no_grad():
        params, values, after = net.unroll(torch.as_tensor(f["obs"]), torch.as_tensor(f["state"]), first)
    # Every step's state as the actor had it, from the one state the fragment carries.
    done = f["terminated"] | f["truncated"]
    states = np.stack([step_by_step(net, f["obs"][e], done[e], f["state"][e]) for e in range(E)])
    # The state after step t is step t+1's unless t ended an episode.
    np.testing.assert_allclose(after[:, :-1].numpy()[~done[:, :-1]], states[:, 1:][~done[:, :-1]], atol=1e-6)
    with torch.no_grad():
        expect = net.step(torch.as_tensor(f["obs"].reshape(E * T, -1)), torch.as_tensor(states.reshape(E * T, -1)))
    np.testing.assert_allclose(params.numpy(), expect[0].numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(values.numpy(), expect[1].numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(f["behaviour_logits"].reshape(E * T, -1), params.numpy(), rtol=1e-5, atol=1e-6)


def test_without_the_reset_mask_the_unroll_differs():
    """The mask matters: a state carried over an episode end gives other outputs."""
    _, _, learner, out = acted(config(), rollouts=1)
    f = out[0][1]
    obs, state0 = torch.as_tensor(f["obs"]), torch.as_tensor(f["state"])
    with torch.no_grad():
        masked = learner.net.unroll(obs, state0, torch.as_tensor(episode_starts(f["terminated"], f["truncated"])))
        unmasked = learner.net.unroll(obs, state0, torch.zeros(E, T, dtype=torch.bool))
    assert not torch.allclose(masked[0], unmasked[0])


def test_a_learner_step_on_recurrent_fragments_learns_with_rho_one():
    """The loss unrolls from each fragment's own first state: a fragment that does not start
    from zeros gets the actor's logits back exactly (every rho is 1)."""
    _, _, learner, out = acted(config(max_steps=500), rollouts=2)
    batch = {**out[1][1], "weights_version": np.zeros(E, np.int64)}
    assert (np.abs(batch["state"]).sum(axis=1) > 0).all()
    loss, metrics = impala_loss(learner.net, learner.m, batch, learner.device)
    assert torch.isfinite(loss) and metrics["vtrace/rho_mean"] == pytest.approx(1.0, abs=1e-6)
    result = learner.step(batch)
    assert np.isfinite(result.metrics["losses/policy_loss"])


def test_a_fragment_with_a_wrong_shaped_state_is_refused_whole():
    algo, _, _, out = acted(config(), rollouts=1)
    queue = TrajectoryQueue(8, algo.transition_spec(), T, per_fragment=algo.per_fragment_spec())
    f = out[0][1]
    per_step = np.repeat(f["state"][:, None], T, axis=1)  # [E, T, S]: the state at every step
    for bad in (f["state"][:, :-1], f["state"][:1], f["state"].astype(np.float64), per_step, f["state"][0]):
        with pytest.raises(ValueError, match="fragment field 'state'"):
            queue.push({**f, "state": bad}, 0, 0)
        assert len(queue) == 0
    with pytest.raises(ValueError, match=r"missing \['state'\]"):
        queue.push({k: v for k, v in f.items() if k != "state"}, 0, 0)
    queue.push(f, 0, 0)
    assert len(queue) == E
    np.testing.assert_array_equal(queue.take(E)["state"], f["state"])


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


# --------------------------------------------------------------------------- DPPO


def test_dppo_rows_are_env_by_env_with_the_state_and_restarts():
    algo, actor, _, out = acted(config("dppo"), rollouts=2)
    spec = algo.transition_spec()
    assert spec["state"] == ((32,), "<f4") and spec["restart"] == ((), "|b1")
    rollouts = [r for r, _ in out]
    rows = [b for _, b in out]
    for e in range(E):
        mine = slice(e * T, (e + 1) * T)  # env e's T steps, consecutive
        obs = np.concatenate([r["obs"][:, e] for r in rollouts])
        done = np.concatenate([r["terminated"][:, e] | r["truncated"][:, e] for r in rollouts])
        np.testing.assert_array_equal(np.concatenate([b["obs"][mine] for b in rows]), obs)
        state = np.concatenate([b["state"][mine] for b in rows])
        np.testing.assert_allclose(state, step_by_step(actor.net, obs, done), rtol=1e-5, atol=1e-6)
        restart = np.concatenate([b["restart"][mine] for b in rows])
        expect = np.zeros(2 * T, np.bool_)
        expect[[0, T]] = True  # each rollout's first step
        expect[1:] |= done[:-1]  # and every episode start
        np.testing.assert_array_equal(restart, expect)


@pytest.mark.parametrize("offset", [0, 3])
def test_dppo_learner_unrolls_each_row_from_its_state_even_from_a_cut_share(offset):
    """A learner's share may start inside an env's rollout (rows split evenly between learners):
    each sequence of rows still unrolls to exactly the network stepped row by row."""
    _, _, learner, out = acted(config("dppo"), rollouts=2)
    b = {k: v[offset:] for k, v in out[1][1].items()}
    n = len(b["obs"])
    L = learner.sequence
    seqs = np.arange(-(-n // L) * L).reshape(-1, L)
    seqs[seqs >= n] = -1
    obs, state, restart = (torch.as_tensor(b[k]) for k in ("obs", "state", "restart"))
    with torch.no_grad():
        params, values = learner.unroll(obs, state, restart, seqs, seqs >= 0)
        expect = learner.net.step(obs, state)
    np.testing.assert_allclose(params.numpy(), expect[0].numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(values.numpy(), expect[1].numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(values.numpy(), b["value"], rtol=1e-5, atol=1e-6)  # the actor's values


def test_dppo_learner_step_on_recurrent_rows():
    _, _, learner, out = acted(config("dppo"), rollouts=1)
    result = learner.step(out[0][1])
    assert np.isfinite(result.metrics["losses/policy_loss"])
    assert result.metrics["losses/approx_kl"] == pytest.approx(0.0, abs=1e-3)  # first minibatch: ratio 1


def test_dppo_recurrent_minibatches_hold_whole_rollouts():
    with pytest.raises(ConfigError, match=r"agent.batch_size \(4 rows per minibatch\) must be at least"):
        load_config(
            data={
                "algo": "dppo",
                "agent": {"sample_batch_size": 8, "batch_size": 4},
                "model": {"recurrent": {"type": "gru", "hidden": 4}},
            }
        )


# --------------------------------------------------------------------------- evaluation


def reference_returns(policy, env_cfg, episodes, seed):
    """Greedy episodes with the state carried by hand, zeros at each start."""
    from aiorl.envs import make_env

    env = make_env(env_cfg, evaluation=True)
    returns = []
    for k in range(episodes):
        obs, _ = env.reset(seed=seed + k)
        state, total, done = torch.zeros(1, policy.state_size), 0.0, False
        while not done:
            with torch.no_grad():
                action, state = policy(torch.as_tensor(obs[None]), state)
            obs, reward, terminated, truncated, _ = env.step(int(action[0]))
            total += reward
            done = terminated or truncated
        returns.append(total)
    env.close()
    return returns


def test_evaluation_carries_the_state_through_each_episode():
    from aiorl.algos.lib.actor_critic import RecurrentPolicy
    from aiorl.evaluation.episodes import run_episodes, run_episodes_together

    cfg = config(max_steps=60)
    _, _, learner, _ = acted(cfg, rollouts=1)
    torch.manual_seed(0)
    with torch.no_grad():
        for p in learner.net.parameters():
            p.add_(torch.randn_like(p))
    policy = RecurrentPolicy(learner.net).eval()
    expect = reference_returns(policy, cfg.env, 4, 7)
    assert run_episodes(policy, cfg.env, 4, 7)["returns"] == expect
    assert run_episodes_together(policy, cfg.env, 4, 7)["returns"] == expect
    assert len(set(expect)) > 1  # episodes that differ: the test can tell them apart


def test_a_fragment_message_with_a_bad_state_is_refused_or_its_fragment_dropped():
    """At the memory host: a wrong-shaped state refuses the whole message (the connection's
    protocol error), a non-finite one drops that env's fragment, counted, the others queued."""
    from aiorl.replay.trajectory_queue import QueueSpec
    from aiorl.runtime.fragments import FragmentHub
    from aiorl.runtime.messages import RowSpec

    algo, _, _, out = acted(config(), rollouts=1)
    spec, once = algo.transition_spec(), algo.per_fragment_spec()
    qspec = QueueSpec(capacity=16, full="throttle", max_policy_lag=None, fragments_per_batch=2)
    hub = FragmentHub(spec, T, E, qspec, per_fragment=once)
    rows = RowSpec({**spec, **once}, bounds=algo.value_bounds())
    f = out[0][1]
    with pytest.raises(ValueError, match=r"fragment field 'state': expected shape"):
        hub.ingest(0, 0, {**f, "state": np.zeros((E, T, 3), np.float32)}, values=rows)
    assert len(hub.queue) == 0
    bad = f["state"].copy()
    bad[1, 0] = np.nan
    dropped, fields = hub.ingest(0, 0, {**f, "state": bad}, values=rows)
    assert (dropped, fields, len(hub.queue)) == (1, ["state"], E - 1)
    np.testing.assert_array_equal(hub.queue.take(E - 1)["state"], f["state"][[0, 2]])


def test_the_lstm_state_is_h_then_c_as_torchs_cell_steps_it():
    from aiorl.algos.lib.actor_critic import RecurrentCore

    torch.manual_seed(0)
    core = RecurrentCore("lstm", 3, 4)
    x = torch.randn(5, 2, 3)
    h, c = torch.randn(2, 4), torch.randn(2, 4)
    state = torch.cat([h, c], dim=1)
    with torch.no_grad():
        for t in range(5):
            out, state = core(x[t], state)
            h, c = core.cell(x[t], (h, c))
            np.testing.assert_allclose(out.numpy(), h.numpy(), rtol=1e-6)
            np.testing.assert_allclose(state.numpy(), torch.cat([h, c], dim=1).numpy(), rtol=1e-6)


def test_dppo_bootstraps_from_the_state_after_the_last_step():
    """value_target at a rollout's last step (no episode end there) is r + gamma V(next obs), V
    read with the state the env carries into the next rollout."""
    algo, actor, _, out = acted(config("dppo", max_steps=500), rollouts=2)
    (r1, b1), (_, b2) = out
    m = algo.cfg.model
    checked = 0
    for e in range(E):
        if r1["terminated"][-1, e] or r1["truncated"][-1, e]:
            continue
        with torch.no_grad():
            v = actor.net.value_step(
                torch.as_tensor(r1["next_obs"][T - 1, e][None]), torch.as_tensor(b2["state"][e * T][None])
            )
        expect = r1["reward"][T - 1, e] * m.reward_scale + m.gamma * float(v[0])
        assert b1["value_target"][e * T + T - 1] == pytest.approx(expect, rel=1e-5, abs=1e-6)
        checked += 1
    assert checked > 0


def test_an_actor_refuses_to_send_a_rollout_its_own_algorithm_spec_refuses(tmp_path):
    """A memory host closes the connection of a rollout that misses the spec, as it would a
    hostile peer's; the actor then waits on its round for ever. The actor checks its first
    rollout against the same spec and fails with the fields named (a restart would repeat it)."""
    cfg = config("dppo")
    algo, _, _, out = acted(cfg)
    role = ActorRole(load_config(data=cfg.to_dict(), overrides=[f"run.dir={tmp_path}"]), 0, tmp_path, b"t" * 64)
    rows = out[0][1]
    role.own_rows = RowSpec(algo.transition_spec())
    role._check_own_rows("rollout", rows)
    role.rows_checked.clear()
    role.own_rows = RowSpec({k: v for k, v in algo.transition_spec().items() if k != "state"})
    with pytest.raises(OwnInconsistency, match=r"rollout.*unexpected \['state'\]"):
        role._check_own_rows("rollout", rows)


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_a_cores_fused_sequence_is_the_cell_stepped_outputs_state_and_gradients(kind):
    """`RecurrentCore.sequence` (R2D2's unroll, burn-in included) runs T steps in one fused call:
    it must be the cell stepped one step at a time, forward and backward, from a nonzero state."""
    from aiorl.algos.lib.actor_critic import RecurrentCore

    torch.manual_seed(0)
    core = RecurrentCore(kind, 5, 7)
    x = torch.randn(4, 6, 5, requires_grad=True)
    start = torch.randn(4, core.state_size, requires_grad=True)
    fused, fused_state = core.sequence(x, start)
    state, stepped = start, []
    for t in range(x.shape[1]):
        y, state = core(x[:, t], state)
        stepped.append(y)
    stepped = torch.stack(stepped, dim=1)
    assert fused.shape == stepped.shape == (4, 6, 7) and fused_state.shape == state.shape
    torch.testing.assert_close(fused, stepped)
    torch.testing.assert_close(fused_state, state)
    inputs = [x, start, *core.parameters()]
    # Both outputs feed the loss, so that a gradient through either path counts.
    g_fused = torch.autograd.grad((fused**2).sum() + (fused_state**3).sum(), inputs)
    g_stepped = torch.autograd.grad((stepped**2).sum() + (state**3).sum(), inputs)
    for a, b in zip(g_fused, g_stepped):
        torch.testing.assert_close(a, b)
