"""Mutants of issue #17 (tests that bite), and of the code and tests written for it.

Each is a plausible bug; the tests named with it must fail on it. Run them with
`.venv/bin/python tests/mutants.py --only tests_bite` (see tests/mutants.py).
"""

CLUSTER = "tests/cluster/test_cluster.py::test_2x2x2_run_reaches_schedule_loses_nothing_and_leaves_no_process"
OPTIONS = "tests/cluster/test_cluster_options.py::test_uniform_replay_credits_snapshots_and_env_options"
BETA = (
    "tests/cluster/test_cluster_options.py::test_beta_anneals_to_its_final_value_and_sync_interval_spaces_weight_pulls"
)
STALL_BETWEEN = "tests/runtime/test_coordinator.py::test_a_stall_between_two_wake_ups_of_the_monitor_is_granted_too"
STALL = "tests/cluster/test_cluster_faults.py::test_silence_is_judged_against_the_coordinators_own_stalls"
# The grace on its own (in a real run, reading the queued heartbeats first often saves the roles too).
STALL_GRACE = "tests/runtime/test_coordinator.py::test_a_stall_of_the_coordinators_own_loop_is_granted_to_silent_roles_then_they_are_lost"
START = (
    "tests/cluster/test_cluster_faults.py::test_start_timeout_ends_a_coordinator_alone_and_a_role_without_coordinator"
)
METRICS = "tests/cluster/test_observability.py::test_metrics_jsonl_has_documented_keys_and_monotonic_counters"

MUTANTS = [
    # ------------------------------------------------------------------ the survivors
    dict(
        name="dqn_double_q_off",
        path="aiorl/algos/apex_dqn.py",
        old="y = n_step_q_target(reward, discount, self.target(next_obs), q_next_online)",
        new="y = n_step_q_target(reward, discount, self.target(next_obs), None)",
        tests=["tests/algos/test_apex_dqn.py::test_learner_step_is_double_q_when_online_and_target_disagree"],
    ),
    dict(
        name="memory_drops_generations",
        path="aiorl/runtime/memory/replay_store.py",
        old='arrays.get("generations"))\n        except ValueError:',
        new="None)\n        except ValueError:",
        tests=["tests/runtime/test_memory_host.py", CLUSTER],
    ),
    dict(
        name="rate_limit_off",
        path="aiorl/runtime/memory/flow.py",
        old="return self.limiter is None or self.limiter.can_sample(rows)",
        new="return True",
        tests=[METRICS],
    ),
    dict(
        name="tls_contexts_return_nothing",
        path="aiorl/runtime/process.py",
        old="    return client, server\n",
        new="    return None, None\n",
        tests=["tests/cluster/test_cluster.py::test_tls_cluster"],
    ),
    dict(
        name="one_hot_is_a_repeated_scalar",
        path="aiorl/algos/lib/networks.py",
        old="return nn.functional.one_hot(x.to(torch.int64).reshape(-1), self.n).to(torch.float32)",
        new="return x.to(torch.float32).reshape(-1, 1).expand(-1, self.n)",
        tests=["tests/algos/test_apex_dqn.py::test_discrete_observations_are_one_hot"],
    ),
    dict(
        name="phases_draining_closing_swapped",
        path="aiorl/runtime/coordinator/service.py",
        old="for phase in (Phase.STOPPING, Phase.DRAINING, Phase.CLOSING):",
        new="for phase in (Phase.STOPPING, Phase.CLOSING, Phase.DRAINING):",
        tests=[CLUSTER],
    ),
    dict(
        name="phase_owners_draining_closing_swapped",
        path="aiorl/runtime/phase.py",
        old='PHASE_OWNER = {Phase.STOPPING: "actor", Phase.DRAINING: "learner", Phase.CLOSING: "memory"}',
        new='PHASE_OWNER = {Phase.STOPPING: "actor", Phase.DRAINING: "memory", Phase.CLOSING: "learner"}',
        tests=[CLUSTER],
    ),
    dict(
        name="stopping_waits_for_nobody",
        path="aiorl/runtime/phase.py",
        old='PHASE_OWNER = {Phase.STOPPING: "actor",',
        new='PHASE_OWNER = {Phase.STOPPING: "nobody",',
        tests=[CLUSTER],
    ),
    # ------------------------------------------------------------------ the coordinator's judgement
    dict(
        name="stall_not_granted",
        path="aiorl/runtime/coordinator/liveness.py",
        old="silence = self.silence_s(record, now)",
        new="silence = now - record.last_heartbeat",
        tests=[STALL_GRACE, STALL],
    ),
    dict(
        name="stall_not_counted",
        path="aiorl/runtime/coordinator/liveness.py",
        old="self.stalled_s += lag",
        new="self.stalled_s += 0.0",
        tests=[STALL_GRACE, STALL],
    ),
    dict(
        name="stall_between_wake_ups_not_seen",
        path="aiorl/runtime/coordinator/liveness.py",
        old="expected = self._woke + interval",
        new="expected = loop.time() + interval",
        tests=[STALL_BETWEEN],
    ),
    dict(
        name="silent_role_never_lost",
        path="aiorl/runtime/coordinator/liveness.py",
        old='if record.status == "running" and silence > c.heartbeat_timeout_s:',
        new='if record.status == "running" and silence > c.heartbeat_timeout_s and False:',
        tests=[STALL],
    ),
    dict(
        name="late_registration_checked_after_duplicates",
        path="aiorl/runtime/coordinator/roster.py",
        old='        if status == "expected" or record.session is None:  # it never registered',
        new='        if status == "expected":  # it never registered',
        tests=["tests/runtime/test_coordinator.py"],
    ),
    dict(
        name="lost_learner_does_not_stop_the_run",
        path="aiorl/runtime/coordinator/service.py",
        old='        self.begin_stop(f"{record.name} {record.status}: {record.reason}", failed=True, role=record)',
        new='        self.failures.append(f"{record.name} {record.status}: {record.reason}")',
        tests=["tests/cluster/test_cluster_faults.py::test_losing_a_learner_or_memory_1_ends_the_run"],
    ),
    dict(
        name="phase_deadline_not_enforced",
        path="aiorl/runtime/coordinator/phases.py",
        old="async with asyncio.timeout(deadline_s):",
        new="async with asyncio.timeout(None):",
        tests=["tests/cluster/test_cluster_faults.py::test_a_missed_phase_deadline_fails_the_run_and_names_the_role"],
    ),
    dict(
        name="start_timeout_not_enforced",
        path="aiorl/runtime/coordinator/service.py",
        old="async with asyncio.timeout(c.start_timeout_s):",
        new="async with asyncio.timeout(None):",
        tests=[START],
    ),
    dict(
        name="wait_start_never_answered_when_the_start_fails",
        path="aiorl/runtime/coordinator/service.py",
        old="            self.start_settled.set()\n",
        new="",
        tests=[START],
    ),
    dict(
        name="role_runs_a_run_that_never_started",
        path="aiorl/runtime/role.py",
        old='if reply.meta.get("stop"):',
        new="if False:",
        tests=[START],
    ),
    dict(
        name="roles_wait_forever_on_a_silent_coordinator",
        path="aiorl/runtime/role.py",
        old="            return await self.coordinator.request(\n                kind, meta, timeout_s=self.cfg.cluster.coordinator_timeout_s, **kwargs\n            )\n",
        new="            return await self.coordinator.request(kind, meta, timeout_s=1e9, **kwargs)\n",
        tests=["tests/cluster/test_cluster_faults.py::test_a_silent_coordinator_ends_every_other_role"],
    ),
    dict(
        name="second_ctrl_c_stops_cleanly_again",
        path="aiorl/launch/local.py",
        old="if self.signals == 1 and coordinator is not None",
        new="if coordinator is not None",
        tests=["tests/cluster/test_cluster_faults.py::test_a_second_ctrl_c_kills_every_role"],
    ),
    # ------------------------------------------------------------------ memories and learners
    dict(
        name="learning_starts_ignored",
        path="aiorl/runtime/memory/replay_store.py",
        old="len(self.replay) >= self.threshold",
        new="len(self.replay) >= 1",
        tests=["tests/cluster/test_cluster_options.py::test_learning_starts_holds_learners_back"],
    ),
    dict(
        name="learner_asks_one_credit",
        path="aiorl/runtime/learner.py",
        old="credits = self.cfg.cluster.learner_credits",
        new="credits = 1",
        tests=[OPTIONS],
    ),
    dict(
        name="memory_ignores_credits",
        path="aiorl/runtime/memory/replay_store.py",
        # Both waits for a credit: with only the second one gone the first still holds the sampler.
        old="link.credits > 0 and len(self.replay) >= self.threshold  # noqa: E731\n"
        "            # First the learner's request, then what the limiter holds it by (the shard's size or\n"
        "            # the ratio): a wait that began for want of a request is the learner's, not the limiter's.\n"
        "            await self.changed.wait_for(lambda: draining() or link.credits > 0)",
        new="len(self.replay) >= self.threshold  # noqa: E731\n            await self.changed.wait_for(lambda: True)",
        tests=[OPTIONS],
    ),
    dict(
        name="prioritized_replay_always_on",
        path="aiorl/runtime/memory/replay_store.py",
        old="elif a.prioritized_replay:",
        new="elif True:",
        tests=[OPTIONS],
    ),
    dict(
        name="snapshot_replay_ignored",
        path="aiorl/runtime/memory/role.py",
        old='            self.log.error("learners did not finish in time: %s", ", ".join(late))\n        if self.cfg.run.snapshot_replay:',
        new='            self.log.error("learners did not finish in time: %s", ", ".join(late))\n        if False:',
        tests=[OPTIONS],
    ),
    dict(
        name="max_episode_steps_ignored",
        path="aiorl/envs/make.py",
        old="if env_cfg.max_episode_steps is not None:",
        new="if False:",
        tests=[OPTIONS],
    ),
    dict(
        name="env_kwargs_ignored",
        path="aiorl/envs/make.py",
        old="kwargs = dict(env_cfg.kwargs)",
        new="kwargs = {}",
        tests=[OPTIONS],
    ),
    dict(
        name="beta_never_anneals",
        path="aiorl/runtime/learner.py",
        old="        frac = self.schedule_progress()",
        new="        frac = 0.0",
        tests=[BETA],
    ),
    dict(
        name="memory_ignores_the_learners_beta",
        path="aiorl/runtime/memory/role.py",
        old='link.beta = fields.get("beta", link.beta)',
        new="pass",
        tests=[BETA],
    ),
    dict(
        name="sync_interval_ignored",
        path="aiorl/runtime/actor.py",
        old="                self.batches % self.cfg.agent.sync_interval == 0\n",
        new="                True\n",
        tests=[BETA],
    ),
    dict(
        name="sync_memory_waits_for_a_lost_actor",
        path="aiorl/runtime/memory/rounds_store.py",
        old="        if returns:\n            self._actor_away(actor_index)\n        else:\n            self._actor_finished(actor_index)\n",
        new="        pass\n",
        tests=[
            "tests/cluster/test_cluster_faults.py::test_losing_an_actor_in_synchronous_mode_leaves_the_others_iterating"
        ],
    ),
    # ------------------------------------------------------------------ algorithms, kernels, tools
    dict(
        name="grad_clip_never_clips",
        path="aiorl/algos/lib/common.py",
        old="        torch._foreach_mul_(grads, (max_norm / (norm + 1e-6)).clamp_(max=1.0))\n",
        new="        pass\n",
        tests=["tests/algos/test_apex_dqn.py::test_gradient_clipping_is_applied"],
    ),
    dict(
        name="grad_clip_norm_not_passed",
        path="aiorl/algos/lib/common.py",
        old="norms[name] = clip_grad(params, self.m.grad_clip_norm)",
        new="norms[name] = clip_grad(params, None)",
        tests=["tests/algos/test_apex_dqn.py::test_gradient_clipping_is_applied"],
    ),
    dict(
        name="dqn_target_never_updated",
        path="aiorl/algos/apex_dqn.py",
        old="soft_update(self.target, self.online, self.m.tau)",
        new="pass",
        tests=[
            "tests/learning/test_apex_learning.py::test_dqn_reaches_cartpole_v1s_threshold_on_the_deterministic_harness"
        ],
    ),
    dict(
        name="harness_seeded_from_the_clock",
        path="bench/learning.py",
        old="learner = algo.make_learner(0, 1, cfg.run.seed + 100)",
        new="learner = algo.make_learner(0, 1, time.time_ns() % 1000)",
        tests=["tests/learning/test_apex_learning.py::test_the_harness_is_deterministic_for_a_seed"],
    ),
    dict(
        name="gae_truncation_wins_over_termination",
        path="aiorl/_ext/gae.pyx",
        old="            if terminated[i]:\n",
        new="            if terminated[i] and not truncated[i]:\n",
        tests=["tests/kernels/test_gae.py::test_truncation_needs_final_values"],
    ),
    dict(
        name="eval_ignores_box_actions",
        path="aiorl/evaluation/episodes.py",
        old="action = int(action) if discrete else action.reshape(env.action_space.shape)",
        new="action = int(action) if discrete else np.zeros(env.action_space.shape, np.float32)",
        tests=["tests/tooling/test_eval.py::test_box_actions"],
    ),
    dict(
        name="panel_hides_late_and_lost_roles",
        path="aiorl/launch/panel.py",
        old='lines += [Text(line, style="bold red") for line in role_problems(row)]',
        new="pass",
        tests=["tests/tooling/test_panel_and_plot.py::test_live_panel_renders_the_latest_row"],
    ),
    dict(
        name="plot_time_axis_is_env_steps",
        path="aiorl/cli/plot.py",
        old='"time": ("time_s", "wall time (s)")',
        new='"time": ("env_steps", "wall time (s)")',
        tests=["tests/tooling/test_panel_and_plot.py::test_plot_overlays_several_runs_against_wall_time"],
    ),
    dict(
        name="plot_draws_only_the_first_run",
        path="aiorl/cli/plot.py",
        old="for run_dir in run_dirs:",
        new="for run_dir in run_dirs[:1]:",
        tests=["tests/tooling/test_panel_and_plot.py::test_plot_overlays_several_runs_against_wall_time"],
    ),
    dict(
        name="bench_hides_skipped_comparisons",
        path="bench/replay.py",
        old='print(f"skipped: the {name} comparisons ({why})")',
        new="pass",
        tests=["tests/kernels/test_replay_backend.py::test_bench_quick_run_writes_its_table_and_json"],
    ),
    dict(
        name="mutants_runner_accepts_an_ambiguous_old",
        path="tests/mutants.py",
        old="    if count != 1:\n",
        new="    if count < 1:\n",
        tests=["tests/tooling/test_mutants.py"],
    ),
]
