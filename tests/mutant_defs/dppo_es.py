"""Mutants of issue #10 (distributed PPO and ES on the coordinator's barrier).

Each is a plausible bug in the code written for it; the tests named here must
fail on it. Run them with `.venv/bin/python tests/mutants.py --only dppo_es`.
"""

MUTANTS = [
    # ------------------------------------------------------------------ dppo
    dict(
        name="gae_bootstraps_from_the_last_obs_not_the_next",
        path="aiorl/algos/dppo.py",
        old="needed = np.concatenate([next_obs[T - 1], next_obs[cut[:, 0], cut[:, 1]]])",
        new='needed = np.concatenate([rollout["obs"][T - 1], next_obs[cut[:, 0], cut[:, 1]]])',
        tests=["tests/algos/test_dppo.py::test_rollout_rows_and_gae_for_vector_envs_bootstrap_on_truncation_only"],
    ),
    dict(
        name="truncation_does_not_bootstrap",
        path="aiorl/algos/dppo.py",
        old="truncated_values[cut[:, 0], cut[:, 1]] = v_next[E:]",
        new="truncated_values[cut[:, 0], cut[:, 1]] = 0.0",
        tests=["tests/algos/test_dppo.py::test_rollout_rows_and_gae_for_vector_envs_bootstrap_on_truncation_only"],
    ),
    dict(
        name="surrogate_takes_the_optimistic_bound",
        path="aiorl/algos/dppo.py",
        old="policy_loss = torch.max(-advantage * ratio,",
        new="policy_loss = torch.min(-advantage * ratio,",
        tests=["tests/algos/test_dppo.py::test_the_surrogate_is_clipped_where_the_ratio_left_the_trust_region"],
    ),
    dict(
        name="value_clip_takes_the_smaller_error",
        path="aiorl/algos/dppo.py",
        old="value_error = torch.max(value_error, (clipped - value_target).pow(2))",
        new="value_error = torch.min(value_error, (clipped - value_target).pow(2))",
        tests=["tests/algos/test_dppo.py::test_value_clipping_takes_the_larger_error"],
    ),
    dict(
        name="learning_rate_never_anneals",
        path="aiorl/algos/lib/common.py",  # ActorCriticLearner.anneal_lr, DPPO's and IMPALA's
        old="frac = max(0.0, 1.0 - self.env_steps_trained / self.schedule)",
        new="frac = 1.0",
        tests=[
            "tests/algos/test_dppo.py::test_learner_step_takes_epochs_times_minibatches_and_anneals_the_step_size_to_zero"
        ],
    ),
    dict(
        name="learners_normalize_observations_with_their_own_share_only",
        path="aiorl/algos/dppo.py",
        old="totals = self.dp.all_sum(np.concatenate([[rows], *moments]))",
        new="totals = np.concatenate([[rows], *moments])",
        tests=[
            "tests/cluster/test_sync_cluster.py::test_dppo_lockstep_with_two_memories_and_two_identical_data_parallel_learners"
        ],
    ),
    dict(
        name="obs_normalizer_merge_drops_the_mean_shift_term",
        path="aiorl/algos/lib/actor_critic.py",
        old="        m2 = var0 * n0 + batch_var * count + delta**2 * (n0 * count / n)\n",
        new="        m2 = var0 * n0 + batch_var * count\n",
        tests=["tests/algos/test_actor_critic.py::test_obs_normalizer_merged_batches_equal_the_statistics_of_all_rows"],
    ),
    # ------------------------------------------------------------------ the synchronous runtime
    dict(
        name="actors_start_an_iteration_with_the_weights_they_have",
        path="aiorl/runtime/actor.py",
        old='                    {"have": self.policy.weights_version, "min_version": iteration + 1},\n',
        new='                    {"have": self.policy.weights_version, "min_version": iteration},\n',
        tests=[
            "tests/cluster/test_sync_cluster.py::test_dppo_lockstep_with_two_memories_and_two_identical_data_parallel_learners"
        ],
    ),
    dict(
        name="a_dropped_actor_is_still_waited_for",
        path="aiorl/runtime/rounds.py",
        old="        self.aggregate.drop(self.producers.index(actor_index))\n",
        new="",
        tests=[
            "tests/runtime/test_sync_rounds.py::test_a_round_completes_when_every_live_actor_delivered_and_a_dropped_one_owes_nothing"
        ],
    ),
    dict(
        name="every_learner_gets_the_whole_round",
        path="aiorl/runtime/rounds.py",
        old="share = batch if self.learners == 1 else {k: v[lo:hi] for k, v in batch.items()}",
        new="share = batch",
        tests=[
            "tests/runtime/test_sync_rounds.py::test_each_learner_gets_an_even_share_and_the_round_goes_once_all_took_it",
            "tests/cluster/test_sync_cluster.py::test_dppo_lockstep_with_two_memories_and_two_identical_data_parallel_learners",
        ],
    ),
    dict(
        name="a_copy_of_a_work_item_counts_twice",
        path="aiorl/runtime/rounds.py",
        old="            if producer in self.aggregate.received:\n",
        new="            if False:\n",
        tests=[
            "tests/runtime/test_sync_rounds.py::test_work_items_complete_a_round_ignore_copies_and_an_incomplete_round_is_discarded"
        ],
    ),
    dict(
        name="released_work_items_go_to_the_back_of_the_queue",
        path="aiorl/runtime/work.py",
        old="self.pending.extendleft(reversed(items))",
        new="self.pending.extend(items)",
        tests=[
            "tests/runtime/test_sync_rounds.py::test_work_queue_hands_out_each_item_once_and_a_lost_workers_items_go_first"
        ],
    ),
    dict(
        name="a_hung_actor_is_never_dropped_by_the_memory",
        path="aiorl/runtime/memory/role.py",
        old="                link.conn.abort()  # its reader ends and finishes the actor\n        if self.store is not None:\n",
        new="                pass\n        if False:\n",
        tests=[
            "tests/cluster/test_sync_cluster.py::test_dppo_lost_actors_leave_the_barrier_and_with_no_actor_left_the_run_ends"
        ],
    ),
    # ------------------------------------------------------------------ es
    dict(
        name="noise_table_unseeded",
        path="aiorl/algos/es.py",
        old="noise = np.random.default_rng(seed).standard_normal(size, dtype=np.float32)",
        new="noise = np.random.default_rng().standard_normal(size, dtype=np.float32)",
        tests=["tests/algos/test_es.py::test_noise_table_is_identical_in_every_process"],
    ),
    dict(
        name="ties_get_arbitrary_ranks",
        path="aiorl/algos/es.py",
        old="mean_rank = first + (counts - 1) / 2.0",
        new="mean_rank = first",
        tests=["tests/algos/test_es.py::test_centered_ranks_span_minus_half_to_half_and_ties_share_their_rank"],
    ),
    dict(
        name="es_descends_the_shaped_returns",
        path="aiorl/algos/es.py",
        old="weights = ranks[:, 0] - ranks[:, 1]",
        new="weights = ranks[:, 1] - ranks[:, 0]",
        tests=[
            "tests/algos/test_es.py::test_es_gradient_is_the_rank_weighted_sum_of_the_pairs_noise",
            "tests/algos/test_es.py::test_learner_step_moves_theta_toward_the_better_perturbation",
        ],
    ),
    dict(
        name="lost_actors_keep_their_work_items",
        path="aiorl/runtime/coordinator/service.py",
        old="            items = self.work.release(record.name)\n",
        new="            items = []\n",
        tests=[
            "tests/cluster/test_sync_cluster.py::test_es_items_per_iteration_whatever_the_actors_and_a_hung_actors_item_is_redone"
        ],
    ),
    # ------------------------------------------------------------------ gSDE (issue 18)
    dict(
        name="sde_noise_redrawn_every_step",
        path="aiorl/algos/lib/actor_critic.py",
        old="if self._noise is None or self._age >= self.sample_freq or len(self._noise) != len(x):",
        new="if True:",
        tests=[
            "tests/algos/test_actor_critic.py::test_sde_noise_is_a_linear_function_of_the_features_held_for_sample_freq_steps",
            "tests/algos/test_dppo.py::test_sde_actor_holds_its_noise_for_sample_freq_steps_and_redraws_it_for_new_weights",
        ],
    ),
    dict(
        name="sde_std_trains_the_torso",
        path="aiorl/algos/lib/actor_critic.py",
        old="variance = x.detach().pow(2) @ torch.exp(2.0 * self.log_std)",
        new="variance = x.pow(2) @ torch.exp(2.0 * self.log_std)",
        tests=[
            "tests/algos/test_actor_critic.py::test_sde_noise_is_a_linear_function_of_the_features_held_for_sample_freq_steps"
        ],
    ),
    dict(
        name="sde_logp_of_the_state_independent_std",
        path="aiorl/algos/lib/actor_critic.py",
        old="        logp = diag_normal_log_prob_np(noise * np.exp(-log_sigma), log_sigma)",
        new="        logp = diag_normal_log_prob_np(noise, np.zeros_like(log_sigma))",
        tests=[
            "tests/algos/test_actor_critic.py::test_sde_noise_is_a_linear_function_of_the_features_held_for_sample_freq_steps",
            "tests/algos/test_dppo.py::test_sde_actor_holds_its_noise_for_sample_freq_steps_and_redraws_it_for_new_weights",
        ],
    ),
    dict(
        name="sde_actor_keeps_the_old_versions_noise",
        path="aiorl/algos/dppo.py",
        old="            self.net.head.reset_noise()  # a new rollout",
        new="            pass  # a new rollout",
        tests=[
            "tests/algos/test_dppo.py::test_sde_actor_holds_its_noise_for_sample_freq_steps_and_redraws_it_for_new_weights"
        ],
    ),
    dict(
        name="sde_off_when_asked_for",
        path="aiorl/algos/dppo.py",
        old="            sde_sample_freq=m.sde_sample_freq if m.sde else None,\n",
        new="            sde_sample_freq=None,\n",
        tests=[
            "tests/algos/test_dppo.py::test_sde_actor_holds_its_noise_for_sample_freq_steps_and_redraws_it_for_new_weights"
        ],
    ),
]
