"""Mutants of the fault-survival code (issue 12): each breaks one behaviour its tests pin."""

MUTANTS = [
    dict(
        name="checkpoint-checksum-ignored",
        path="aiorl/io/checkpoint.py",
        old="    if digest != bytes(view[parts.digest_offset :]):\n",
        new="    if False:\n",
        tests=["tests/rundirs/test_checkpoint.py::test_a_damaged_file_is_refused_by_name"],
    ),
    dict(
        name="checkpoint-no-fallback",
        path="aiorl/io/checkpoint.py",
        old="    for path in reversed(list_checkpoints(directory)):\n        try:\n            return path, verify(path), bad",
        new="    for path in reversed(list_checkpoints(directory)[-1:]):\n        try:\n            return path, verify(path), bad",
        tests=[
            "tests/rundirs/test_checkpoint.py::test_newest_good_falls_back_past_bad_files_and_says_which",
            "tests/rundirs/test_rundir.py::test_resume_takes_the_newest_good_checkpoint_and_records_the_launch",
        ],
    ),
    dict(
        name="checkpoint-nan-weights-saved",
        path="aiorl/io/checkpoint.py",
        old="        if state.is_floating_point() and not bool(torch.isfinite(state).all()):",
        new="        if False:",
        tests=["tests/rundirs/test_checkpoint.py::test_weights_that_blew_up_are_never_checkpointed"],
    ),
    dict(
        name="rundir-reuse-allowed",
        path="aiorl/io/rundir.py",
        old='    if owner is not None:\n        attempts = len(owner.get("attempts") or [])',
        new='    if owner is not None and False:\n        attempts = len(owner.get("attempts") or [])',
        tests=[
            "tests/rundirs/test_rundir.py::test_a_new_run_takes_an_absent_or_empty_directory_only",
            "tests/cluster/test_faults.py::test_running_twice_into_one_run_directory_is_refused_and_changes_nothing",
        ],
    ),
    dict(
        name="rundir-leftover-taken-as-own",
        path="aiorl/io/rundir.py",
        old='data.get("launch_id") == self.launch_id',
        new='data.get("launch_id") is not None',
        tests=["tests/rundirs/test_rundir.py::test_files_are_taken_only_from_this_launch"],
    ),
    dict(
        name="restart-no-backoff-growth",
        path="aiorl/runtime/restart.py",
        old="        delay = min(self.backoff_max_s, self.backoff_s * 2 ** max(0, quick - 1))",
        new="        delay = self.backoff_s",
        tests=["tests/runtime/test_restart.py::test_backoff_doubles_on_quick_failures_and_resets_after_a_healthy_run"],
    ),
    dict(
        name="limiter-grants-past-the-band",
        path="aiorl/runtime/ratelimit.py",
        old="        return (self.inserted + self.reserved + self.batch_rows) * self.spi - self.sampled <= self.max_diff",
        new="        return True",
        tests=[
            "tests/replay/test_ratelimit.py::test_the_band_holds_and_someone_can_always_move",
            "tests/replay/test_ratelimit.py::test_a_slow_learner_holds_the_actors_back_by_credits_and_nothing_is_dropped",
        ],
    ),
    dict(
        name="limiter-samples-past-the-band",
        path="aiorl/runtime/ratelimit.py",
        old="        if self.diff - self.learner_batch < self.min_diff:\n            return RATIO_LOWER",
        new="        if False:\n            return RATIO_LOWER",
        tests=["tests/replay/test_ratelimit.py::test_the_band_holds_and_someone_can_always_move"],
    ),
    dict(
        name="credits-unfair",
        path="aiorl/runtime/memory/flow.py",
        old="            link = min(open_links, key=lambda l: (l.credits, l.granted))",
        new="            link = min(open_links, key=lambda l: l.credits)",
        tests=[
            "tests/replay/test_ratelimit.py::test_a_fast_actor_does_not_take_every_credit_from_a_slow_one",
            "tests/replay/test_ratelimit.py::test_a_slow_learner_holds_the_actors_back_by_credits_and_nothing_is_dropped",
        ],
    ),
    dict(
        name="restart-forgets-counters",
        path="aiorl/runtime/coordinator/roster.py",
        old="            record.retired[key] = record.retired.get(key, 0) + value",
        new="            pass",
        tests=[
            "tests/cluster/test_faults.py::test_chaos_sigkilled_actors_and_memory_host_restart_and_nothing_accepted_is_lost"
        ],
    ),
    dict(
        name="resume-counters-from-zero",
        path="aiorl/runtime/coordinator/counters.py",
        old="            self.base[key] = int(run.get(key, 0))",
        new="            self.base[key] = 0",
        tests=[
            "tests/cluster/test_faults.py::test_sigkill_every_process_then_resume_continues_past_a_corrupt_checkpoint"
        ],
    ),
    dict(
        name="launcher-waits-for-stalled-coordinator",
        path="aiorl/launch/local.py",
        old="            if others_gone_at is not None and lost_it and now - others_gone_at > c.coordinator_timeout_s:",
        new="            if False:",
        tests=["tests/cluster/test_faults.py::test_a_stalled_coordinator_is_killed_and_blamed_alone"],
    ),
    dict(
        name="no-rejoin-after-a-drop",
        path="aiorl/runtime/control.py",
        old='            if self._closed:\n                raise CoordinatorLost("the control connection is closed")\n            await self._reconnect(conn)',
        new='            raise CoordinatorLost("the control connection dropped")',
        tests=["tests/cluster/test_faults.py::test_a_role_started_by_hand_rejoins_after_its_connection_drops"],
    ),
    dict(
        name="interrupted-exits-0",
        path="aiorl/launch/local.py",
        old='            code = interrupted_exit_code(summary.get("signal"))\n            lines.append',
        new="            code = EXIT_OK\n            lines.append",
        tests=["tests/cluster/test_cluster.py::test_sigint_to_the_launcher_runs_the_shutdown_phases"],
    ),
    dict(
        name="no-checkpoint-when-the-coordinator-is-lost",
        path="aiorl/runtime/role.py",
        old='                await self.on_abnormal_end(f"lost the coordinator: {lost[0]}")\n',
        new="",
        tests=["tests/cluster/test_cluster.py::test_killing_the_coordinator_ends_every_role_nonzero"],
    ),
    dict(
        name="late-restart-counted-as-failure",
        path="aiorl/launch/local.py",
        old="            and c.name not in late\n",
        new="",
        tests=["tests/runtime/test_restart.py::test_a_restart_the_run_ended_without_is_ended_and_not_a_failure"],
    ),
    dict(
        name="late-restart-left-running",
        path="aiorl/launch/local.py",
        old="            if child.name in late:\n",
        new="            if child.name in late and False:\n",
        tests=["tests/runtime/test_restart.py::test_a_restart_the_run_ended_without_is_ended_and_not_a_failure"],
    ),
]
