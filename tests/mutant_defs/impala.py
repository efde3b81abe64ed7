"""Mutants of issue #11 (IMPALA with V-trace: fragments, the trajectory queue, credits, lag).

Each is a plausible bug in the code written for it; the tests named here must
fail on it. Run them with `.venv/bin/python tests/mutants.py --only impala`.
"""

CLUSTER = "tests/cluster/test_impala_cluster.py"
MEMORY = "tests/runtime/test_impala_memory.py"
FAULTS = "tests/cluster/test_impala_faults.py"

MUTANTS = [
    # ------------------------------------------------------------------ V-trace kernel
    dict(
        name="vtrace_truncation_does_not_bootstrap",
        path="aiorl/_ext/vtrace.pyx",
        old="                next_value = truncated_values[b, t]",
        new="                next_value = 0.0",
        tests=[
            "tests/kernels/test_vtrace.py::test_truncation_needs_final_values_and_bootstraps_from_them",
            "tests/kernels/test_vtrace.py::test_hand_computed",
        ],
    ),
    dict(
        name="vtrace_fragment_end_taken_for_an_episode_end",
        path="aiorl/_ext/vtrace.pyx",
        old="                next_value = bootstrap[b]",
        new="                next_value = 0.0",
        tests=[
            "tests/kernels/test_vtrace.py::test_hand_computed",
            "tests/kernels/test_vtrace.py::test_on_policy_unclipped_is_the_n_step_return",
        ],
    ),
    dict(
        name="vtrace_traces_clipped_by_rho_bar",
        path="aiorl/_ext/vtrace.pyx",
        old="                + gamma * lam * _clip(c_bar, rho) * next_acc",
        new="                + gamma * lam * _clip(rho_bar, rho) * next_acc",
        tests=["tests/kernels/test_vtrace.py::test_clipping_by_hand"],
    ),
    # ------------------------------------------------------------------ algorithm
    dict(
        name="fragments_reshaped_not_transposed",
        path="aiorl/algos/impala.py",
        old="        fragments = {name: np.ascontiguousarray(np.swapaxes(x, 0, 1)) for name, x in time_major.items()}\n",
        new=(
            "        fragments = {\n"
            "            name: np.ascontiguousarray(x).reshape((x.shape[1], x.shape[0]) + x.shape[2:])\n"
            "            for name, x in time_major.items()\n"
            "        }\n"
        ),
        tests=[
            "tests/algos/test_impala.py::test_fragments_are_one_env_each_with_the_behaviour_policy",
            f"{CLUSTER}::test_fragments_are_whole_across_the_wire_and_batches_stay_unchanged",
        ],
    ),
    dict(
        name="loss_does_not_bootstrap_at_the_fragment_end",
        path="aiorl/algos/impala.py",
        old="    need[:, -1] = True",
        new="    need[:, -1] = False",
        tests=["tests/algos/test_impala.py::test_loss_bootstraps_from_the_right_observations"],
    ),
    dict(
        name="learners_not_data_parallel",
        path="aiorl/algos/impala.py",
        old="        self.join(self.params, [self.net], learner_index, num_learners, rendezvous)",
        new="        self.join(self.params, [self.net], 0, 1, rendezvous)",
        tests=[f"{CLUSTER}::test_two_data_parallel_learners_take_the_same_steps"],
    ),
    # ------------------------------------------------------------------ trajectory queue
    dict(
        name="batches_are_views_of_storage",
        path="aiorl/replay/trajectory_queue.py",
        old="        return {name: storage[slots] for name, storage in self._storage.items()}\n",
        new="        return {name: storage[slots[0] : slots[0] + len(slots)] for name, storage in self._storage.items()}\n",
        tests=["tests/replay/test_trajectory_queue.py::test_batches_are_fresh_arrays_not_views_of_storage"],
    ),
    dict(
        name="lag_filter_off_by_one",
        path="aiorl/replay/trajectory_queue.py",
        old="        stale = [s for s in self._order if version[s] < min_version]",
        new="        stale = [s for s in self._order if version[s] < min_version - 1]",
        tests=[
            "tests/replay/test_trajectory_queue.py::test_drop_older_from_anywhere_frees_room",
            "tests/replay/test_trajectory_queue.py::test_hub_checks_messages_and_filters_lag",
        ],
    ),
    dict(
        name="queued_frames_never_released",
        path="aiorl/replay/trajectory_queue.py",
        old="                self.pool.decref(self._storage[f][slots])",
        new="                pass",
        tests=["tests/replay/test_trajectory_queue.py::test_frame_layout_queue_hands_out_exactly_the_naive_batches"],
    ),
    # ------------------------------------------------------------------ credits, lag, idle time
    dict(
        name="throttle_grants_without_room",
        path="aiorl/runtime/fragments.py",
        old="return not self.throttle or len(self.queue) + (self.reserved + 1) * self.per_message <= self.queue.capacity",
        new="return True",
        tests=[
            "tests/replay/test_trajectory_queue.py::test_queue_room_grants_credits_while_the_queue_has_room_for_them",
            f"{MEMORY}::test_throttle_grants_credits_as_the_queue_has_room_and_refuses_a_message_without_one",
        ],
    ),
    dict(
        name="fragment_without_a_credit_accepted",
        path="aiorl/runtime/memory/queue_store.py",
        old='        if link.credits < 1:\n            raise BadMessage(f"{link.name} sent a fragment message without a credit")',
        new='        if False:\n            raise BadMessage(f"{link.name} sent a fragment message without a credit")',
        tests=[f"{MEMORY}::test_throttle_grants_credits_as_the_queue_has_room_and_refuses_a_message_without_one"],
    ),
    dict(
        name="memory_ignores_the_learners_version",
        path="aiorl/runtime/memory/queue_store.py",
        old='            self.hub.saw_version(fields["version"])',
        new="            pass",
        tests=[f"{CLUSTER}::test_fragments_are_whole_across_the_wire_and_batches_stay_unchanged"],
    ),
    dict(
        name="learner_batch_limit_ignores_fragment_origins",
        path="aiorl/runtime/frame_limits.py",
        old="    if queue is not None:  # whole fragments",
        new="    if False:  # whole fragments",
        tests=[
            "tests/algos/test_impala.py::test_a_fragment_message_a_batch_of_fragments_and_the_weights_fit_their_frame_limits"
        ],
    ),
    dict(
        name="resumed_coordinator_answers_a_version_without_weights",
        path="aiorl/runtime/coordinator/params.py",
        old="lambda: (self.weights and self.weights_version >= int(min_version)) or stopped()",
        new="lambda: (self.weights_version >= int(min_version)) or stopped()",
        tests=[f"{FAULTS}::test_sigkill_every_process_then_resume_from_the_newest_checkpoint"],
    ),
    dict(
        name="checkpoint_forgets_env_steps_trained",
        path="aiorl/algos/lib/common.py",
        old='        self.env_steps_trained = int(state["env_steps_trained"])',
        new="        pass",
        tests=["tests/algos/test_impala.py::test_learner_step_checkpoint_and_export"],
    ),
    dict(
        name="algorithm_agent_defaults_ignored",
        path="aiorl/experiment/loading.py",
        old="    _agent_defaults(raw)\n",
        new="",
        tests=[
            "tests/algos/test_impala.py::test_agent_defaults_are_whole_fragments_and_a_users_values_win",
            "tests/tooling/test_config_reference.py::test_config_algo_prints_every_key_with_its_doc_and_loads_back",
        ],
    ),
    dict(
        name="actor_waits_not_counted",
        path="aiorl/runtime/actor.py",
        old="        self.idle_s += time.monotonic() - self._t0",
        new="        self.idle_s += 0.0",
        tests=["tests/algos/test_impala.py::test_idle_clock_counts_finished_waits_and_the_one_in_progress"],
    ),
    dict(
        name="wait_in_progress_not_counted",
        path="aiorl/runtime/actor.py",
        old="(self.idle_s + waiting) / wall",
        new="self.idle_s / wall",
        tests=["tests/algos/test_impala.py::test_idle_clock_counts_finished_waits_and_the_one_in_progress"],
    ),
    # ------------------------------------------------------------------ issue #28: the learner's cost per sample
    dict(
        name="closed_form_gradient_action_term_sign",
        path="aiorl/algos/impala.py",
        old="    grad_logits[rows, action] -= pg_advantages\n",
        new="    grad_logits[rows, action] += pg_advantages\n",
        tests=["tests/algos/test_impala.py::test_the_learners_gradient_is_that_of_the_loss_written_out"],
    ),
    dict(
        name="closed_form_gradient_without_the_entropy_term",
        path="aiorl/algos/impala.py",
        old="+ m.entropy_coef * (p * log_pi)",
        new="+ 0.0 * (p * log_pi)",
        tests=["tests/algos/test_impala.py::test_the_learners_gradient_is_that_of_the_loss_written_out"],
    ),
    dict(
        name="closed_form_value_gradient_unweighted",
        path="aiorl/algos/impala.py",
        old="    grad_values = diff * (m.value_coef / n)\n",
        new="    grad_values = diff / n\n",
        tests=["tests/algos/test_impala.py::test_the_learners_gradient_is_that_of_the_loss_written_out"],
    ),
    dict(
        name="published_weights_are_views_of_the_live_ones",
        path="aiorl/algos/lib/common.py",
        old="        return {name: v.detach().cpu().numpy().copy() for name, v in self._weights_views}\n",
        new="        return {name: v.detach().cpu().numpy() for name, v in self._weights_views}\n",
        tests=["tests/algos/test_impala.py::test_learner_step_checkpoint_and_export"],
    ),
    dict(
        name="offload_times_calls_by_the_wall_clock",
        path="aiorl/runtime/role.py",
        old="        return wall_s if wall_s >= self.WAIT_FACTOR * self.inline_below_s else cpu_s\n",
        new="        return wall_s\n",
        tests=["tests/runtime/test_offload.py::test_a_cheap_call_the_scheduler_stretched_runs_inline"],
    ),
    dict(
        name="offload_inlines_a_call_that_waits",
        path="aiorl/runtime/role.py",
        old="        return wall_s if wall_s >= self.WAIT_FACTOR * self.inline_below_s else cpu_s\n",
        new="        return cpu_s\n",
        tests=["tests/runtime/test_offload.py::test_a_call_that_waits_or_computes_long_runs_in_a_thread"],
    ),
]
