"""IMPALA without sockets: fragments from the acting policy, the V-trace loss and its episode
edges, the learner step, checkpoints and export, config refusals."""

import numpy as np
import pytest
import torch

from aiorl.algos.impala import impala_loss
from aiorl.config import ConfigError
from aiorl.envs import EnvRunner
from aiorl.experiment.loading import load_config
from aiorl.io import checkpoint
from aiorl.replay import reference
from aiorl.runtime.algorithm import build_algorithm

T, E = 6, 3


def config(env="CartPole-v1", **model):
    return load_config(
        data={
            "algo": "impala",
            "env": {"id": env, "num_envs": E},
            "agent": {"sample_batch_size": T, "batch_size": 2 * T},
            "model": {"network": ["linear:16", "tanh"], **model},
        }
    )


def rollout_fragments(cfg, seed=0, steps=T):
    algo = build_algorithm(cfg)
    actor = algo.make_actor(0, 1, seed)
    learner = algo.make_learner(0, 1, seed)
    actor.set_weights(learner.get_weights(), 0)
    runner = EnvRunner(cfg.env, E, seed)
    rollout = runner.rollout(actor.act, steps)
    runner.close()
    fragments, priorities = actor.postprocess(rollout)
    return algo, actor, learner, rollout, fragments, priorities


def test_fragments_are_one_env_each_with_the_behaviour_policy():
    algo, actor, _, rollout, fragments, priorities = rollout_fragments(config())
    assert priorities is None and actor.steps == []
    spec = algo.transition_spec()
    assert set(fragments) == set(spec)
    for name, (shape, dtype) in spec.items():
        assert fragments[name].shape == (E, T) + shape and fragments[name].dtype == np.dtype(dtype), name
        assert fragments[name].flags.c_contiguous
    for name in ("obs", "next_obs", "reward", "terminated", "truncated", "action"):
        for e in range(E):
            np.testing.assert_array_equal(fragments[name][e], rollout[name][:, e])
    # The logits are the acting network's, and the action was sampled from them.
    with torch.no_grad():
        logits = actor.net.policy_params(torch.as_tensor(fragments["obs"].reshape(E * T, -1))).numpy()
    np.testing.assert_allclose(fragments["behaviour_logits"].reshape(E * T, -1), logits, rtol=1e-5, atol=1e-6)


def test_box_actions_carry_the_log_probability_of_the_unclipped_sample():
    cfg = config("Pendulum-v1", log_std_init=1.0)
    algo, actor, learner, rollout, fragments, _ = rollout_fragments(cfg)
    assert "behaviour_logp" in fragments and "behaviour_logits" not in fragments
    action = fragments["action"]
    assert action.shape == (E, T, 1) and (np.abs(action) > 2.0).any()  # unclipped: std e^1 around ~0
    assert (np.abs(rollout["action"]) <= 2.0).all()  # the env got the clipped one
    with torch.no_grad():
        mean = actor.net.policy_params(torch.as_tensor(fragments["obs"].reshape(E * T, -1)))
        logp = actor.net.head.log_prob(mean, torch.as_tensor(action.reshape(E * T, 1))).numpy()
    np.testing.assert_allclose(fragments["behaviour_logp"].reshape(-1), logp, rtol=1e-5, atol=1e-5)
    batch = {**fragments, "weights_version": np.zeros(E, np.int64)}
    result = learner.step(batch)
    assert np.isfinite(result.metrics["losses/policy_loss"])
    # Acting and learning policy are the same weights: every rho is 1.
    assert result.metrics["vtrace/rho_mean"] == pytest.approx(1.0, abs=1e-4)


def fragments_with_ends(cfg):
    """A learner and a copy of its actor's T-step fragments with a termination (fragment 0, step
    2) and a time limit (fragment 1, step 3), nowhere else."""
    _, _, learner, _, fragments, _ = rollout_fragments(cfg, steps=T)
    batch = {k: v.copy() for k, v in fragments.items()}
    batch["terminated"][:] = False
    batch["truncated"][:] = False
    batch["terminated"][0, 2] = True
    batch["truncated"][1, 3] = True
    return learner, batch


def test_loss_bootstraps_from_the_right_observations():
    """V-trace in the loss: values of obs, V(next_obs) only after the last step and at
    truncations (not terminations), exactly reference.vtrace of the network's numbers."""
    cfg = config(gamma=0.9)
    learner, batch = fragments_with_ends(cfg)
    batch["terminated"][2, T - 1] = True  # the fragment ends on a terminal step
    net, m = learner.net, cfg.model

    def loss_of(b):
        torch.manual_seed(0)
        return impala_loss(net, m, b, learner.device)[0].item()

    base = loss_of(batch)
    for (e, t), matters in [((0, 2), False), ((0, T - 1), True), ((1, 3), True), ((1, 2), False), ((2, T - 1), False)]:
        changed = {k: v.copy() for k, v in batch.items()}
        changed["next_obs"][e, t] += 0.5
        assert (loss_of(changed) != base) == matters, (e, t)
    # The same numbers through the oracle.
    with torch.no_grad():
        flat = torch.as_tensor(batch["obs"].reshape(E * T, -1))
        logits, values = net(flat)
        logp = net.head.log_prob(logits, torch.as_tensor(batch["action"].reshape(-1)))
        blogp = net.head.log_prob(
            torch.as_tensor(batch["behaviour_logits"].reshape(E * T, -1)), torch.as_tensor(batch["action"].reshape(-1))
        )
        v_next = net.value(torch.as_tensor(batch["next_obs"].reshape(E * T, -1))).numpy().reshape(E, T)
    values = values.numpy().reshape(E, T)
    vs, pg = reference.vtrace(
        (logp - blogp).numpy().reshape(E, T),
        batch["reward"],
        values,
        v_next[:, -1],
        batch["terminated"],
        batch["truncated"],
        0.9,
        truncated_values=v_next,
    )
    entropy = float(net.head.entropy(logits).mean())
    want = -(pg.reshape(-1) * logp.numpy()).mean() + 0.5 * 0.5 * ((vs - values) ** 2).mean() - 0.01 * entropy
    assert base == pytest.approx(float(want), rel=1e-5)


def written_out_loss(net, m, batch):
    """The module docstring's loss in plain torch ops, autograd all the way (V-trace targets from
    the reference implementation, on the network's numbers): what the learner's closed-form
    gradient must match."""
    B, Tb = batch["reward"].shape
    obs = torch.as_tensor(batch["obs"].reshape(B * Tb, -1))
    action = torch.as_tensor(batch["action"].reshape(B * Tb, *batch["action"].shape[2:]))
    params, values = net(obs)
    logp = net.head.log_prob(params, action)
    with torch.no_grad():
        if "behaviour_logits" in batch:
            logp_mu = net.head.log_prob(torch.as_tensor(batch["behaviour_logits"].reshape(B * Tb, -1)), action)
        else:
            logp_mu = torch.as_tensor(batch["behaviour_logp"].reshape(-1))
        v_next = net.value(torch.as_tensor(batch["next_obs"].reshape(B * Tb, -1))).numpy().reshape(B, Tb)
    vs, pg = reference.vtrace(
        (logp.detach() - logp_mu).numpy().reshape(B, Tb),
        batch["reward"] * np.float32(m.reward_scale),
        values.detach().numpy().reshape(B, Tb),
        v_next[:, -1],
        batch["terminated"],
        batch["truncated"],
        m.gamma,
        rho_bar=m.rho_bar,
        c_bar=m.c_bar,
        pg_rho_bar=m.pg_rho_bar,
        truncated_values=v_next,
    )
    vs, pg = torch.as_tensor(vs.reshape(-1), dtype=torch.float32), torch.as_tensor(pg.reshape(-1), dtype=torch.float32)
    entropy = net.head.entropy(params).mean()
    return -(pg * logp).mean() + m.value_coef * 0.5 * (vs - values).pow(2).mean() - m.entropy_coef * entropy


@pytest.mark.parametrize(
    "env, model",
    [
        ("CartPole-v1", {}),
        ("CartPole-v1", {"entropy_coef": 0.3, "value_coef": 2.0, "rho_bar": 0.9, "pg_rho_bar": 1.1}),
        ("Pendulum-v1", {"entropy_coef": 0.1}),
    ],
)
def test_the_learners_gradient_is_that_of_the_loss_written_out(env, model):
    """Discrete actions take the loss's gradient with respect to the logits and values in closed
    form (one autograd node, `OutputGradient`); it must be autograd's gradient of the loss written
    out, for every parameter, with off-policy fragments (rho != 1), an episode end and a time limit
    in them. Box actions go through autograd and must agree the same way."""
    cfg = config(env, gamma=0.9, reward_scale=0.5, **model)
    learner, batch = fragments_with_ends(cfg)
    net, m = learner.net, cfg.model
    torch.manual_seed(1)
    with torch.no_grad():  # the learner's policy moves away from the actors': rho != 1
        for p in net.parameters():
            p.add_(0.3 * torch.randn_like(p))
    params = [p for p in net.parameters() if p.requires_grad]
    loss, metrics = impala_loss(net, m, batch, learner.device)
    got = torch.autograd.grad(loss, params)
    want_loss = written_out_loss(net, m, batch)
    want = torch.autograd.grad(want_loss, params)
    assert loss.item() == pytest.approx(want_loss.item(), rel=1e-5, abs=1e-6)
    assert metrics["vtrace/rho_mean"] != pytest.approx(1.0, abs=1e-3)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=1e-4, atol=1e-6)


def test_learner_step_checkpoint_and_export(tmp_path):
    cfg = config()
    algo, actor, learner, _, fragments, _ = rollout_fragments(cfg)
    before = learner.get_weights()
    result = learner.step({**fragments, "weights_version": np.zeros(E, np.int64)})
    assert not result.stop and result.metrics["losses/grad_norm"] > 0
    after = learner.get_weights()
    assert any(not np.array_equal(before[k], after[k]) for k in before)
    assert learner.env_steps_trained == E * T and learner.iterations == 1
    path = learner.save_checkpoint(str(tmp_path / "ckpt"), {"learner_steps": 1})
    assert checkpoint.load(path)[1]["algo"] == "impala"  # plain tensors and numbers (weights_only=True)
    other = algo.make_learner(0, 1, seed=7)
    meta = other.load_checkpoint(path)
    assert meta["learner_steps"] == 1 and other.env_steps_trained == E * T and other.iterations == 1
    for k, v in learner.get_weights().items():
        np.testing.assert_array_equal(other.get_weights()[k], v)
    # The optimizer goes on where it was: the next step is the same on both.
    batch = {**fragments, "weights_version": np.zeros(E, np.int64)}
    learner.step(batch)
    other.step(batch)
    for k, v in learner.get_weights().items():
        np.testing.assert_allclose(other.get_weights()[k], v, rtol=1e-6, atol=1e-7)
    exported = torch.export.load(learner.export_policy(str(tmp_path / "policy"))).module()
    obs = torch.as_tensor(fragments["obs"].reshape(E * T, -1))
    with torch.no_grad():
        greedy = learner.net.policy_params(obs).argmax(dim=1)
    assert torch.equal(exported(obs), greedy)


@pytest.mark.parametrize(
    "override, match",
    [
        ({"agent": {"batch_size": 2 * T + 1}}, r"agent.batch_size \(13 transitions .*\) must be a multiple"),
        ({"model": {"queue_capacity": 3}}, r"model.queue_capacity \(3 fragments\) must be at least 4: .*room for a"),
        ({"model": {"queue_capacity": 2, "queue_full": "drop_oldest"}}, r"must be at least 3"),
        ({"model": {"queue_full": "block"}}, r"model.queue_full: expected 'throttle' or 'drop_oldest', got 'block'"),
        ({"model": {"rho_bar": 0}}, r"model.rho_bar: must be > 0"),
        ({"model": {"max_policy_lag": -1}}, r"model.max_policy_lag: must be >= 0"),
        ({"model": {"optimizer": "sgd"}}, r"model.optimizer: expected 'rmsprop' or 'adam', got 'sgd'"),
        ({"agent": {"samples_per_insert": 1.0}}, r"impala trains on each fragment once"),
        ({"model": {"lr_annealing": True}}, r"anneals over agent.scheduled_timesteps"),
    ],
)
def test_config_refusals(override, match):
    data = {
        "algo": "impala",
        "env": {"id": "CartPole-v1", "num_envs": E},
        "agent": {"sample_batch_size": T, "batch_size": 2 * T},
        "model": {"queue_capacity": 4},
    }
    load_config(data=data)  # 2 fragments per batch + 3 envs - 1: just enough
    for section, values in override.items():
        data[section].update(values)
    with pytest.raises(ConfigError, match=match):
        load_config(data=data)


def test_idle_clock_counts_finished_waits_and_the_one_in_progress(monkeypatch):
    """An actor's idle fraction: finished waits over loop time, plus the wait it is in now (a
    throttled actor reports its wait while it waits, not once it ends)."""
    from aiorl.runtime import actor

    now = [0.0]
    monkeypatch.setattr(actor.time, "monotonic", lambda: now[0])
    clock = actor.IdleClock()
    assert clock.fraction() is None
    clock.start()
    now[0] = 2.0
    with clock:
        now[0] = 5.0
    now[0] = 10.0
    assert clock.fraction() == pytest.approx(0.3)
    clock.__enter__()
    now[0] = 20.0
    assert clock.fraction() == pytest.approx(13 / 20)
    clock.__exit__(None, None, None)
    clock.stop()
    now[0] = 40.0
    assert clock.fraction() == pytest.approx(13 / 20) and clock.wall_s == 20.0


@pytest.mark.parametrize("steps, recurrent", [(1, None), (T, None), (1, "gru"), (T, "lstm")])
def test_a_fragment_message_a_batch_of_fragments_and_the_weights_fit_their_frame_limits(steps, recurrent):
    """What each IMPALA connection carries fits the limits the wire holds it to, also for
    fragments of one step (as many fragments as rows, each with its origin) and with a recurrent
    state once per fragment; and a state at every step (what a fragment carried before) does not."""
    from test_frame_limits import fits

    from aiorl.replay.trajectory_queue import TrajectoryQueue
    from aiorl.runtime import frame_limits

    per_batch = 128  # fragments: well over the floor every limit has (4 KiB)
    cfg = load_config(
        data={
            "algo": "impala",
            "env": {"id": "CartPole-v1", "num_envs": E},
            "agent": {"sample_batch_size": steps, "batch_size": per_batch * steps},
            "model": {
                "network": ["linear:16", "tanh"],
                "queue_capacity": per_batch + E,
                "recurrent": recurrent and {"type": recurrent, "hidden": 256},  # states over the 4 KiB floor
            },
        }
    )
    algo, _, learner, _, message, _ = rollout_fragments(cfg, steps=steps)
    to_memory, to_learner = frame_limits.actor_to_memory(cfg, algo), frame_limits.memory_to_learner(cfg, algo)
    assert fits(message, to_memory)
    queue = TrajectoryQueue(per_batch + E, algo.transition_spec(), steps, per_fragment=algo.per_fragment_spec())
    while len(queue) < per_batch:
        queue.push(message, version=len(queue), actor=0)
    batch = queue.take(per_batch)
    assert fits(batch, to_learner)
    if recurrent is None:
        assert algo.per_fragment_spec() == {} and set(message) == set(algo.transition_spec())
    elif steps > 1:
        per_step = np.repeat(message["state"][:, None], steps, axis=1)
        assert not fits({**message, "state": per_step}, to_memory)
        assert not fits({**batch, "state": np.repeat(batch["state"][:, None], steps, axis=1)}, to_learner)
    assert fits(learner.get_weights(), frame_limits.to_coordinator("learner-0", algo))
    assert fits(learner.get_weights(), frame_limits.from_coordinator(algo))


def test_agent_defaults_are_whole_fragments_and_a_users_values_win():
    cfg = load_config(data={"algo": "impala"})
    assert (cfg.agent.sample_batch_size, cfg.agent.batch_size) == (20, 640)  # 32 fragments of 20 steps
    cfg = load_config(data={"algo": "impala", "agent": {"batch_size": 40}})
    assert (cfg.agent.sample_batch_size, cfg.agent.batch_size) == (20, 40)
    assert load_config(data={"algo": "dppo"}).agent.batch_size == 32  # the shared default elsewhere
