"""Mutants of issue #26, first half (recurrent policies for IMPALA and DPPO; mask_velocity).

Each is a plausible bug in the code written for it; the tests named here must fail on it.
Run them with `.venv/bin/python tests/mutants.py --only recurrent`.
"""

REC = "tests/algos/test_recurrent.py"
MASK = "tests/algos/test_mask_velocity.py"
EXPORT = "tests/algos/test_export.py::test_a_recurrent_export_takes_and_returns_the_state_in_plain_torch"
CLUSTER = "tests/cluster/test_recurrent_cluster.py"
LEARNS = "tests/learning/test_recurrent_learning.py::test_a_ci_sized_recurrent_run_learns_past_what_no_memory_can[lstm]"

FUSED = "tests/algos/test_recurrent.py::test_a_cores_fused_sequence_is_the_cell_stepped_outputs_state_and_gradients"

MUTANTS = [
    # ------------------------------------------------------------------ the reset mask
    dict(
        name="actor_does_not_reset_the_state_at_an_episode_start",
        path="aiorl/algos/lib/actor_critic.py",
        old="            self.state[started] = 0.0",
        new="            pass",
        tests=[REC],
    ),
    dict(
        name="runner_never_says_which_envs_started",
        path="aiorl/envs/vector.py",
        old="                begin(started)",
        new="                pass",
        tests=[REC],
    ),
    dict(
        name="learner_mask_off_by_one_step",
        path="aiorl/algos/impala.py",
        old="    first[:, 1:] = terminated[:, :-1] | truncated[:, :-1]",
        new="    first[:, 1:] = terminated[:, 1:] | truncated[:, 1:]",
        tests=[REC],
    ),
    dict(
        name="learner_mask_ignores_truncation",
        path="aiorl/algos/impala.py",
        old="    first[:, 1:] = terminated[:, :-1] | truncated[:, :-1]",
        new="    first[:, 1:] = terminated[:, :-1]",
        tests=[REC],
    ),
    dict(
        name="unroll_never_resets",
        path="aiorl/algos/lib/actor_critic.py",
        old="            if t > 0:\n                state = torch.where(",
        new="            if t < 0:\n                state = torch.where(",
        tests=[REC],
    ),
    dict(
        name="dppo_restart_misses_the_rollout_start",
        path="aiorl/algos/dppo.py",
        old="            restart = np.ones((T, E), np.bool_)",
        new="            restart = np.zeros((T, E), np.bool_)",
        tests=[REC],
    ),
    dict(
        name="dppo_restart_zeroes_instead_of_taking_the_stored_state",
        path="aiorl/algos/dppo.py",
        old="        params, values, _ = self.net.unroll(obs[idx], stored[:, 0], restart[idx], stored)",
        new="        params, values, _ = self.net.unroll(obs[idx], stored[:, 0], restart[idx])",
        tests=[REC],
    ),
    # ------------------------------------------------------------------ the state carried
    dict(
        name="fragment_carries_the_state_after_the_step",
        path="aiorl/algos/impala.py",
        old="            self.state0 = before",
        new="            self.state0 = self.states.state",
        tests=[REC],
    ),
    dict(
        name="learner_unrolls_from_zeros_not_the_fragments_state",
        path="aiorl/algos/impala.py",
        old='        state0 = as_tensor(batch["state"], device)',
        new='        state0 = as_tensor(np.zeros_like(batch["state"]), device)',
        tests=[REC],
    ),
    dict(
        name="lstm_state_halves_swapped",
        path="aiorl/algos/lib/actor_critic.py",
        old="            return h, torch.cat([h, c], dim=1)",
        new="            return h, torch.cat([c, h], dim=1)",
        tests=[REC, EXPORT],
    ),
    dict(
        name="dppo_value_bootstrap_reads_the_state_before_the_last_step",
        path="aiorl/algos/dppo.py",
        old="            states = np.concatenate([after[T - 1], after[cut[:, 0], cut[:, 1]]])",
        new="            states = np.concatenate([before[T - 1], after[cut[:, 0], cut[:, 1]]])",
        tests=[REC],
    ),
    dict(
        name="export_loader_forgets_the_state",
        path="aiorl/io/export.py",
        old='            program.state_size = recurrent["state_size"]  # (obs, state) -> (action, state)',
        new="            pass",
        tests=[EXPORT],
    ),
    # ------------------------------------------------------------------ the wrapper's entries
    dict(
        name="cartpole_keeps_a_velocity",
        path="aiorl/envs/mask_velocity.py",
        old='    "CartPole": (0, 2),',
        new='    "CartPole": (0, 1),',
        tests=[MASK],
    ),
    dict(
        name="lunarlander_keeps_the_angular_velocity",
        path="aiorl/envs/mask_velocity.py",
        old='    "LunarLander": (0, 1, 4, 6, 7),',
        new='    "LunarLander": (0, 1, 4, 5, 6, 7),',
        tests=[MASK],
    ),
    dict(
        name="pendulum_keeps_its_velocity",
        path="aiorl/envs/mask_velocity.py",
        old='    "Pendulum": (0, 1),',
        new='    "Pendulum": (0, 2),',
        tests=[MASK],
    ),
    dict(
        name="unknown_env_not_checked_at_load",
        path="aiorl/envs/checks.py",
        old="        check_mask_velocity(env_cfg.id, wrapper_names(env_cfg.wrappers))",
        new="        pass",
        tests=[MASK],
    ),
    # ------------------------------------------------------------------ through the runtime
    dict(
        name="dppo_rollout_spec_leaves_out_the_state",
        path="aiorl/algos/dppo.py",
        old='        return {"state": ((self.state_size,), "<f4"), "restart": ((), "|b1")}',
        new='        return {"restart": ((), "|b1")}',
        tests=[CLUSTER + "::test_a_recurrent_run_trains_and_exports_a_policy_that_carries_its_state[dppo]"],
    ),
    dict(
        name="exported_policy_returns_the_state_it_was_given",
        path="aiorl/algos/lib/actor_critic.py",
        old="        features, state = self.core(self.torso(self.normalizer(obs)), state)\n",
        new="        features, _ = self.core(self.torso(self.normalizer(obs)), state)\n",
        tests=[CLUSTER + "::test_a_recurrent_run_trains_and_exports_a_policy_that_carries_its_state[impala]"],
    ),
    dict(
        name="fused_lstm_sequence_swaps_h_and_c",
        path="aiorl/algos/lib/actor_critic.py",
        old="torch.lstm(x, (h0, c0), weights,",
        new="torch.lstm(x, (c0, h0), weights,",
        tests=[FUSED + "[lstm]"],
    ),
    dict(
        name="fused_lstm_sequence_returns_c_before_h",
        path="aiorl/algos/lib/actor_critic.py",
        old="            return out, torch.cat([h[0], c[0]], dim=1)\n",
        new="            return out, torch.cat([c[0], h[0]], dim=1)\n",
        tests=[FUSED + "[lstm]"],
    ),
    dict(
        name="fused_gru_sequence_returns_its_start_state",
        path="aiorl/algos/lib/actor_critic.py",
        old="        return out, h[0]\n",
        new="        return out, state\n",
        tests=[FUSED + "[gru]"],
    ),
    # ------------------------------------------------------------------ learning
    dict(
        name="r2d2_learner_unrolls_without_memory",
        path="aiorl/algos/r2d2.py",
        old="        return self.core.sequence(x, state)\n",
        new="        return torch.stack([self.core(x[:, t], torch.zeros_like(state))[0] for t in range(T)], dim=1), state\n",
        tests=["tests/learning/test_recurrent_learning.py::test_a_ci_sized_r2d2_run_learns_past_what_no_memory_can"],
    ),
    dict(
        name="actors_act_without_memory",
        path="aiorl/algos/lib/actor_critic.py",
        old="        self.state = state.numpy().copy()\n",
        new="        self.state = np.zeros_like(before)\n",
        tests=[LEARNS],
    ),
]
