"""R2D2: value rescaling, sequence targets (n-step double Q, masking, truncation against
termination), the priority mix, burn-in, stored against zero start states, the actor's
sequences and their states, export, checkpoints and config errors."""

import numpy as np
import pytest
import torch
from apex_helpers import make_algo, replay_batch
from hypothesis import given, settings
from hypothesis import strategies as st
from test_frame_limits import fits

from aiorl.algos.r2d2 import h, h_inverse, masked_loss, sequence_priority, sequence_td
from aiorl.config import ConfigError
from aiorl.envs import EnvRunner
from aiorl.io import checkpoint
from aiorl.replay import PrioritizedReplayBuffer
from aiorl.runtime import frame_limits

EPS = 1e-3
SMALL = {
    "network": ["linear:16", "relu"],
    "recurrent": {"type": "lstm", "hidden": 8},
    "sequence_length": 6,
    "burn_in": 2,
    "n_step": 2,
    "gamma": 0.9,
}


def algo_with(**model):
    return make_algo("r2d2", "CartPole-v1", {**SMALL, **model}, env={"num_envs": 2})


def sequences(algo, rows=3, lengths=(6, 4, 1), terminal=(False, True, False), seed=0):
    """A replay batch of `rows` sequences: random obs, actions, rewards, states; row i has
    lengths[i] real steps (the rest zero padding, as the adder writes them)."""
    rng = np.random.default_rng(seed)
    spec = algo.transition_spec()
    m = algo.cfg.model.sequence_length
    mask = np.arange(m)[None] < np.asarray(lengths)[:, None]
    obs = rng.normal(size=(rows, m + 1, 4)).astype(np.float32)
    obs[:, 1:][~mask] = 0.0
    batch = {
        "obs": obs,
        "action": np.where(mask, rng.integers(0, 2, (rows, m)), 0),
        "reward": np.where(mask, rng.normal(size=(rows, m)), 0).astype(np.float32),
        "mask": mask,
        "terminal": np.asarray(terminal, bool),
        "epsilon": np.full(rows, 0.1, np.float32),
    }
    if "state" in spec:
        batch["state"] = rng.normal(size=(rows, spec["state"][0][0])).astype(np.float32)
    return replay_batch(batch)


# --------------------------------------------------------------------------- value rescaling


def test_h_known_values_and_its_inverse():
    x = torch.tensor([0.0, 3.0, -3.0, 8.0, 99.0])
    expected = torch.tensor([0.0, 1.0 + 3e-3, -1.0 - 3e-3, 2.0 + 8e-3, 9.0 + 99e-3])
    assert torch.allclose(h(x, EPS), expected, atol=1e-6)
    grid = torch.linspace(-1000, 1000, 20001, dtype=torch.float64)
    assert torch.allclose(h_inverse(h(grid, EPS), EPS), grid, rtol=1e-9, atol=1e-7)
    assert torch.allclose(h(h_inverse(grid / 50, EPS), EPS), grid / 50, rtol=1e-9, atol=1e-9)


# --------------------------------------------------------------------------- targets


def td_case(T=4, n=2, lengths=(4,), terminal=(False,), q_value=10.0, rescale=None):
    """delta of a batch whose online and target nets answer Q(., a) = q_value + a, Q(o_t, a_t) read
    at action 0: y = -delta + q_value."""
    B = len(lengths)
    q = torch.full((B, T + 1, 2), q_value)
    q[..., 1] += 1.0
    reward = torch.arange(1, T + 1, dtype=torch.float32).repeat(B, 1)
    mask = torch.arange(T)[None] < torch.tensor(lengths)[:, None]
    reward = torch.where(mask, reward, torch.zeros_like(reward))
    action = torch.zeros(B, T, dtype=torch.int64)
    delta, valid = sequence_td(q, q.clone(), action, reward, mask, torch.tensor(terminal), n, 0.5, rescale)
    return delta + q_value, valid  # y


def test_n_step_double_q_targets_along_the_sequence():
    y, valid = td_case(T=4, n=2)
    g = 0.5
    # y_t = r_t + g r_{t+1} + g^2 * 11 (the best action's Q) while t + 2 <= 4; then fewer steps.
    want = [1 + g * 2 + g**2 * 11, 2 + g * 3 + g**2 * 11, 3 + g * 4 + g**2 * 11, 4 + g * 11]
    assert torch.allclose(y[0], torch.tensor(want)) and valid.all()


@pytest.mark.parametrize("terminal", [False, True])
def test_truncation_bootstraps_and_termination_does_not(terminal):
    y, valid = td_case(T=4, n=3, lengths=(3,), terminal=(terminal,))
    g = 0.5
    boot = 0.0 if terminal else 11.0
    want = [1 + g * 2 + g**2 * 3 + g**3 * boot, 2 + g * 3 + g**2 * boot, 3 + g * boot]
    assert torch.allclose(y[0, :3], torch.tensor(want))
    assert valid[0].tolist() == [True, True, True, False]


def test_a_terminal_sequence_still_bootstraps_where_the_window_ends_before_its_end():
    y, _ = td_case(T=4, n=2, terminal=(True,))
    g = 0.5
    want = [1 + g * 2 + g**2 * 11, 2 + g * 3 + g**2 * 11, 3 + g * 4, 4]
    assert torch.allclose(y[0], torch.tensor(want))


def test_double_q_the_online_net_picks_the_action_the_target_net_values():
    T = 2
    q_online = torch.zeros(1, T + 1, 3)
    q_online[..., 2] = 1.0  # online prefers action 2
    q_target = torch.zeros(1, T + 1, 3)
    q_target[..., 0], q_target[..., 2] = 100.0, 7.0  # target prefers action 0
    reward, mask = torch.zeros(1, T), torch.ones(1, T, dtype=torch.bool)
    action = torch.zeros(1, T, dtype=torch.int64)
    delta, _ = sequence_td(q_online, q_target, action, reward, mask, torch.tensor([False]), 1, 0.5, None)
    assert torch.allclose(delta, torch.tensor([[3.5, 3.5]]))  # 0.5 * Q_target(., 2) - Q_online(., 0)


def test_steps_past_the_episode_end_are_masked_out_of_delta_and_loss():
    delta, valid = td_case(T=5, n=2, lengths=(2,), q_value=0.0)
    assert valid[0].tolist() == [True, True, False, False, False]
    assert (delta[0, 2:] == 0).all() and (delta[0, :2] != 0).all()
    loss = masked_loss(delta, valid, torch.ones(1), "mse", 1.0)
    assert torch.isclose(loss, 0.5 * delta[0, :2].pow(2).mean())


def test_rescaled_target_is_h_of_the_return_plus_discounted_h_inverse():
    y, _ = td_case(T=2, n=1, lengths=(2,), q_value=3.0, rescale=EPS)
    r0 = torch.tensor(1.0)
    assert torch.isclose(y[0, 0], h(r0 + 0.5 * h_inverse(torch.tensor(4.0), EPS), EPS))


def test_loss_weights_each_sequence_by_its_importance_weight():
    delta = torch.tensor([[1.0, 3.0], [2.0, 2.0]])
    valid = torch.tensor([[True, True], [True, False]])
    loss = masked_loss(delta, valid, torch.tensor([2.0, 0.5]), "mse", 1.0)
    assert torch.isclose(loss, torch.tensor((2.0 * 0.5 * (1 + 9) / 2 + 0.5 * 0.5 * 4) / 2))


def naive_targets(q_online, q_target, reward, length, terminal, n, gamma, eps):
    """y_t of one sequence step by step, straight from the definition (None past its end)."""
    ys = []
    for t in range(len(reward)):
        if t >= length:
            ys.append(None)
            continue
        k = min(n, length - t)
        ret = sum(gamma**j * reward[t + j] for j in range(k))
        if terminal and t + k == length:
            bootstrap = 0.0
        else:
            best = max(range(q_online.shape[1]), key=lambda a: q_online[t + k, a])
            value = q_target[t + k, best]
            bootstrap = gamma**k * (value if eps is None else float(h_inverse(torch.tensor(value), eps)))
        y = ret + bootstrap
        ys.append(y if eps is None else float(h(torch.tensor(y, dtype=torch.float64), eps)))
    return ys


@settings(max_examples=60, deadline=None)
@given(
    T=st.integers(1, 9),
    n=st.integers(1, 5),
    lengths=st.lists(st.integers(0, 9), min_size=1, max_size=3),
    terminal=st.lists(st.booleans(), min_size=3, max_size=3),
    rescale=st.booleans(),
    seed=st.integers(0, 999),
)
def test_sequence_targets_match_the_step_by_step_definition(T, n, lengths, terminal, rescale, seed):
    rng = np.random.default_rng(seed)
    B, A, eps = len(lengths), 3, (EPS if rescale else None)
    lengths = [min(L, T) for L in lengths]
    q_online = torch.as_tensor(rng.normal(size=(B, T + 1, A)) * 5, dtype=torch.float64)
    q_target = torch.as_tensor(rng.normal(size=(B, T + 1, A)) * 5, dtype=torch.float64)
    mask = torch.arange(T)[None] < torch.tensor(lengths)[:, None]
    reward = torch.where(mask, torch.as_tensor(rng.normal(size=(B, T))), torch.zeros(B, T, dtype=torch.float64))
    action = torch.as_tensor(rng.integers(0, A, (B, T)))
    term = torch.tensor(terminal[:B])
    delta, valid = sequence_td(q_online, q_target, action, reward, mask, term, n, 0.9, eps)
    assert torch.equal(valid, mask)
    for b in range(B):
        ys = naive_targets(
            q_online[b].numpy(), q_target[b].numpy(), reward[b].tolist(), lengths[b], terminal[b], n, 0.9, eps
        )
        for t, y in enumerate(ys):
            if y is None:
                assert delta[b, t] == 0
            else:
                q_taken = float(q_online[b, t, action[b, t]])
                assert float(delta[b, t]) == pytest.approx(y - q_taken, rel=1e-9, abs=1e-9)


def test_priority_mixes_max_and_mean_over_valid_steps():
    td = torch.tensor([[1.0, 3.0, 2.0, 100.0], [5.0, 5.0, 5.0, 5.0]])
    valid = torch.tensor([[True, True, True, False], [False] * 4])
    p = sequence_priority(td, valid, 0.9)
    assert torch.allclose(p, torch.tensor([0.9 * 3.0 + 0.1 * 2.0, 0.0]))


# --------------------------------------------------------------------------- burn-in and start state


def test_burn_in_state_is_the_cell_stepped_and_carries_no_gradient():
    algo = algo_with(burn_in=3)
    learner = algo.make_learner(0, 1, seed=0)
    batch = sequences(algo)
    start = torch.tensor(batch["state"], requires_grad=True)
    learner.start_state = lambda batch, rows: start
    loss, *_ = learner.losses(batch)
    loss.backward()
    assert start.grad is None  # nothing of the loss flows back through the burn-in steps

    obs = torch.tensor(batch["obs"])
    state = torch.tensor(batch["state"])
    for t in range(3):
        _, _, _, state = learner.online.step(obs[:, t], state)
    assert torch.allclose(learner.online.advance(obs[:, :3], torch.tensor(batch["state"])), state)


def test_without_burn_in_the_start_state_gets_a_gradient():
    algo = algo_with(burn_in=0)
    learner = algo.make_learner(0, 1, seed=0)
    batch = sequences(algo)
    start = torch.tensor(batch["state"], requires_grad=True)
    learner.start_state = lambda batch, rows: start
    learner.losses(batch)[0].backward()
    assert start.grad is not None and start.grad.abs().sum() > 0


@pytest.mark.parametrize("start_state", ["stored", "zero"])
def test_stored_start_state_is_used_and_zero_ignores_it(start_state):
    algo = algo_with(start_state=start_state)
    learner = algo.make_learner(0, 1, seed=0)
    batch = sequences(algo)
    other = {**batch, "state": batch["state"] + 1.0}
    a, b = float(learner.losses(batch)[0].detach()), float(learner.losses(other)[0].detach())
    assert (a != b) if start_state == "stored" else (a == b)
    zero = {**batch, "state": np.zeros_like(batch["state"])}
    assert (float(learner.losses(zero)[0].detach()) == a) == (start_state == "zero")


def test_learner_step_gives_one_priority_per_sequence_and_zero_without_trained_steps():
    algo = algo_with(burn_in=2)
    learner = algo.make_learner(0, 1, seed=0)
    result = learner.step(sequences(algo, lengths=(6, 4, 1)))
    assert result.priorities.shape == (3,)
    assert result.priorities[2] == 0.0 and (result.priorities[:2] > 0).all()  # 1 step: all burn-in
    assert learner.learner_steps == 1


def test_learning_a_fixed_batch_lowers_its_loss():
    algo = algo_with(learning_rate=1e-2, sync_target_frequency=10_000)
    learner = algo.make_learner(0, 1, seed=0)
    batch = sequences(algo)
    before = float(learner.losses(batch)[0].detach())
    for _ in range(30):
        learner.step(batch)
    assert float(learner.losses(batch)[0].detach()) < 0.5 * before


# --------------------------------------------------------------------------- acting


def rollout(T, E, ends=(), obs_dim=2):
    rng = np.random.default_rng(1)
    obs = rng.normal(size=(T, E, obs_dim)).astype(np.float32)
    terminated = np.zeros((T, E), bool)
    for t, e in ends:
        terminated[t, e] = True
    return {
        "obs": obs,
        "next_obs": np.concatenate([obs[1:], obs[-1:]]),
        "reward": np.ones((T, E), np.float32),
        "terminated": terminated,
        "truncated": np.zeros((T, E), bool),
    }


def act_through(actor, data):
    actions = []
    for t in range(len(data["obs"])):
        actions.append(actor.act(data["obs"][t]))
        ended = data["terminated"][t] | data["truncated"][t]
        if ended.any():
            actor.begin_episodes(ended)
    return actor.postprocess({**data, "action": np.stack(actions)})


def test_actor_sequences_carry_the_state_at_their_first_step_zero_at_episode_starts():
    algo = make_algo(
        "r2d2",
        "CartPole-v1",
        {**SMALL, "sequence_length": 4, "sequence_overlap": 2},
        env={"num_envs": 2, "wrappers": ["mask_velocity"]},
    )
    actor = algo.make_actor(0, 1, seed=0)
    data = rollout(8, 2, ends=[(4, 1)])
    rows, priorities = act_through(actor, data)
    assert priorities is None  # new sequences take the replay's max priority
    assert set(rows) == set(algo.transition_spec())
    # Env 0: starts 0, 2, 4 closed. The state at start 2 is the net stepped over steps 0, 1.
    state = torch.zeros(1, algo.state_size)
    with torch.no_grad():
        for t in range(2):
            _, _, _, state = actor.q.step(torch.as_tensor(data["obs"][t, :1]), state)
    env0 = np.flatnonzero(rows["epsilon"] == np.float32(actor.epsilons[0]))
    np.testing.assert_array_equal(rows["state"][env0[0]], 0.0)
    np.testing.assert_allclose(rows["state"][env0[1]], state[0].numpy(), rtol=1e-5, atol=1e-6)
    # Env 1 ended at step 4: its second episode starts at 5 with a zeroed state.
    env1 = np.flatnonzero(rows["epsilon"] == np.float32(actor.epsilons[1]))
    assert rows["terminal"][env1].tolist() == [False, True]
    flushed, _ = actor.flush()
    late = np.flatnonzero(flushed["epsilon"] == np.float32(actor.epsilons[1]))
    np.testing.assert_array_equal(flushed["state"][late[0]], 0.0)
    np.testing.assert_array_equal(flushed["obs"][late[0], 0], data["obs"][5, 1])


def test_an_actor_batch_never_holds_more_sequences_than_max_batch_rows():
    # Each (step, env) closes at most one sequence: one-step episodes everywhere reach the bound.
    algo = algo_with(sequence_length=4)
    T, E = algo.cfg.agent.sample_batch_size, algo.cfg.env.num_envs
    assert algo.max_batch_rows() == T * E
    actor = algo.make_actor(0, 1, seed=0)
    data = rollout(T, E, obs_dim=4)
    data["terminated"][:] = True
    rows, _ = act_through(actor, data)
    assert len(rows["epsilon"]) == T * E


def test_sequences_of_a_real_rollout_fit_the_wire_limits_and_the_replay():
    algo = make_algo(
        "r2d2",
        "CartPole-v1",
        {**SMALL, "sequence_length": 8, "burn_in": 2},
        env={"num_envs": 3, "wrappers": ["mask_velocity"]},
        agent={"sample_batch_size": 16, "batch_size": 4},
    )
    cfg = algo.cfg
    actor = algo.make_actor(0, 1, seed=0)
    runner = EnvRunner(cfg.env, 3, seed=0)
    to_memory = frame_limits.actor_to_memory(cfg, algo)
    try:
        batches = [actor.postprocess(runner.rollout(actor.act, 16, actor.begin_episodes))[0] for _ in range(4)]
    finally:
        runner.close()
    rows = {k: np.concatenate([b[k] for b in batches if b]) for k in algo.transition_spec()}
    assert rows["mask"].any(axis=1).all() and not rows["mask"].all()  # episode ends cut some
    full = {k: np.repeat(v[:1], algo.max_batch_rows(), axis=0) for k, v in rows.items()}
    assert fits(full, to_memory)
    weights = algo.make_learner(0, 1, seed=0).get_weights()
    assert fits(weights, frame_limits.to_coordinator("learner-0", algo))
    replay = PrioritizedReplayBuffer(100, algo.transition_spec(), alpha=0.6, seed=0)
    replay.add(rows, None)
    sample = replay.sample(cfg.agent.batch_size, 0.4)
    assert fits(sample, frame_limits.memory_to_learner(cfg, algo))
    learner = algo.make_learner(0, 1, seed=0)
    assert learner.step(sample).priorities.shape == (cfg.agent.batch_size,)


def test_feed_forward_baseline_has_no_state_field():
    algo = algo_with(recurrent=None)
    assert "state" not in algo.transition_spec() and algo.state_size == 0
    actor = algo.make_actor(0, 1, seed=0)
    rows, _ = act_through(actor, rollout(12, 2, obs_dim=4))
    assert "state" not in rows and len(rows["epsilon"]) > 0
    learner = algo.make_learner(0, 1, seed=0)
    assert learner.step(sequences(algo)).priorities.shape == (3,)


# --------------------------------------------------------------------------- export, checkpoints


def test_exported_policy_takes_and_returns_the_state(tmp_path):
    algo = algo_with()
    learner = algo.make_learner(0, 1, seed=0)
    path = learner.export_policy(str(tmp_path))
    program = torch.export.load(path).module()
    obs, state = torch.zeros(3, 4), torch.zeros(3, algo.state_size)
    action, next_state = program(obs, state)
    assert action.dtype == torch.int64 and action.shape == (3,)
    want_q, _, _, want_state = learner.online.cpu().step(obs, state)
    assert torch.allclose(next_state, want_state) and torch.equal(action, want_q.argmax(dim=1))
    meta = algo.policy_meta(0)
    assert meta["recurrent"] == {"type": "lstm", "hidden": 8, "state_size": 16}


def test_checkpoint_round_trip_restores_online_target_and_steps(tmp_path):
    algo = algo_with()
    learner = algo.make_learner(0, 1, seed=0)
    batch = sequences(algo)
    learner.step(batch)
    path = learner.save_checkpoint(str(tmp_path), {"learner_steps": 1})
    fresh = algo.make_learner(0, 1, seed=1)
    fresh.load_checkpoint(path)
    assert fresh.learner_steps == 1
    assert float(fresh.losses(batch)[0].detach()) == float(learner.losses(batch)[0].detach())
    assert checkpoint.load(path)[1]["algo"] == "r2d2"


# --------------------------------------------------------------------------- config errors


@pytest.mark.parametrize(
    "model, match",
    [
        ({"burn_in": 6}, r"model.burn_in: expected 0 <= burn_in < sequence_length \(6\), got 6"),
        ({"sequence_overlap": 6}, r"model.sequence_overlap: .* got 6"),
        ({"start_state": "learned"}, r"model.start_state: expected 'stored' or 'zero', got 'learned'"),
        ({"priority_eta": 1.5}, r"model.priority_eta: expected a value in \[0, 1\], got 1.5"),
        ({"recurrent": {"type": "rnn"}}, r"model.recurrent.type"),
        ({"sequence_length": 1, "burn_in": 0}, r"model.sequence_length: must be at least 2"),
        ({"sync_target_frequency": 0}, r"model.sync_target_frequency: must be at least 1, got 0"),
        ({"exploration_alpha": -1.0}, r"model.exploration_alpha: must be >= 0, got -1.0"),
        ({"learning_rate": 0.0}, r"model.learning_rate: must be > 0, got 0.0"),
    ],
)
def test_config_errors_name_the_value(model, match):
    with pytest.raises(ConfigError, match=match) as info:
        algo_with(**model)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    "env, match",
    [
        ("Pendulum-v1", r"env.id: r2d2 needs a Discrete action space; Pendulum-v1 has Box"),
        ("Blackjack-v1", r"unsupported observation space Tuple"),
    ],
)
def test_unsupported_spaces_are_config_errors(env, match):
    with pytest.raises(ConfigError, match=match):
        make_algo("r2d2", env, SMALL, env={"num_envs": 2})
