"""Mutants of issue 44's data faults: an env's non-finite rows, a replay that cannot fit, a deleted
run directory; each was checked by hand."""

CLUSTER = "tests/cluster/test_env_faults.py"
ROWS = "tests/runtime/test_env_rows.py"
FITS = "tests/runtime/test_replay_fits.py"
DELETED = "tests/rundirs/test_run_dir_deleted.py"

MUTANTS = [
    # --- an env's NaN and inf
    dict(
        name="actor-reports-nan-returns",
        path="aiorl/runtime/actor.py",
        old="        returns, lengths = self.env_faults.finite_episodes(returns, lengths)\n",
        new="",
        tests=[f"{CLUSTER}::test_an_env_with_some_nan_rows_learns_with_them_counted"],
    ),
    dict(
        name="actor-never-checks-its-rollouts",
        path="aiorl/runtime/actor.py",
        old="        self.env_faults.check_rollout(rollout)\n",
        new="",
        tests=[
            f"{CLUSTER}::test_an_env_whose_every_reward_is_nan_fails_the_run_in_one_line",
            f"{CLUSTER}::test_an_env_with_some_nan_rows_learns_with_them_counted",
        ],
    ),
    dict(
        name="actor-sends-the-env-s-nan-rows",
        path="aiorl/runtime/actor.py",
        old="            batch, priorities = self.env_faults.drop_rows(*self.policy.postprocess(rollout))\n",
        new="            batch, priorities = self.policy.postprocess(rollout)\n",
        tests=[f"{CLUSTER}::test_an_env_with_some_nan_rows_learns_with_them_counted"],
    ),
    dict(
        name="env-fault-restarts-the-actor",
        path="aiorl/runtime/env_faults.py",
        old="class EnvNotFinite(FatalToRun):",
        new="class EnvNotFinite(RuntimeError):",
        tests=[
            f"{CLUSTER}::test_an_env_whose_every_reward_is_nan_fails_the_run_in_one_line",
            f"{ROWS}::test_an_env_with_no_finite_step_fails_by_steps_naming_it_and_the_field",
        ],
    ),
    dict(
        name="all-bad-env-never-fails",
        path="aiorl/runtime/env_faults.py",
        old="        if not self.finite_seen and self.steps >= self.fail_after_steps:\n",
        new="        if False:\n",
        tests=[
            f"{CLUSTER}::test_an_env_whose_every_reward_is_nan_fails_the_run_in_one_line",
            f"{ROWS}::test_an_env_with_no_finite_step_fails_by_steps_naming_it_and_the_field",
        ],
    ),
    dict(
        name="one-finite-step-forgotten",
        path="aiorl/runtime/env_faults.py",
        old="        self.finite_seen = self.finite_seen or bad < steps\n",
        new="        self.finite_seen = bad < steps\n",
        tests=[f"{ROWS}::test_one_finite_step_is_enough_to_go_on"],
    ),
    dict(
        name="observations-not-checked",
        path="aiorl/runtime/env_faults.py",
        old='ENV_FIELDS = ("reward", "obs", "next_obs")',
        new='ENV_FIELDS = ("reward",)',
        tests=[
            f"{ROWS}::test_steps_with_a_non_finite_reward_or_observation_are_counted",
            f"{CLUSTER}::test_an_env_with_some_nan_rows_learns_with_them_counted",
        ],
    ),
    dict(
        name="dropped-rows-keep-the-wrong-priorities",
        path="aiorl/runtime/env_faults.py",
        old="        return batch, None if priorities is None else np.asarray(priorities)[good]\n",
        new="        return batch, None if priorities is None else np.asarray(priorities)[: len(good[good])]\n",
        tests=[f"{ROWS}::test_rows_holding_a_non_finite_float_are_dropped_with_their_priorities"],
    ),
    # --- a replay that cannot fit
    dict(
        name="replay-never-checked-against-memory",
        path="aiorl/experiment/preflight.py",
        old="        check_replay_fits(cfg, algo, machine_memory_bytes())\n",
        new="",
        tests=[f"{FITS}::test_aiorl_run_refuses_it_before_any_process_starts"],
    ),
    dict(
        name="memory-hosts-shards-not-added-up",
        path="aiorl/experiment/preflight.py",
        old="    needed = shard * cfg.cluster.memories\n",
        new="    needed = shard\n",
        tests=[f"{FITS}::test_memory_hosts_of_a_local_run_share_the_machine"],
    ),
    dict(
        name="priority-leaf-not-counted",
        path="aiorl/runtime/memory/replay_store.py",
        old="            row += np.dtype(np.float64).itemsize\n",
        new="            row += 0\n",
        tests=[f"{FITS}::test_a_row_takes_its_fields_and_its_priority"],
    ),
    dict(
        name="frames-counted-as-stacks",
        path="aiorl/runtime/memory/replay_store.py",
        old="        frame_fields = () if layout is None else layout.fields\n",
        new="        frame_fields = ()\n",
        tests=[f"{FITS}::test_in_the_frame_layout_a_row_takes_its_ids_and_one_new_frame"],
    ),
    dict(
        name="the-whole-memory-for-the-replay",
        path="aiorl/experiment/preflight.py",
        old="    allowed = int(memory * REPLAY_MEMORY_SHARE)\n",
        new="    allowed = memory\n",
        tests=[f"{FITS}::test_a_replay_that_cannot_fit_is_refused_in_one_line_naming_what_it_needs"],
    ),
    # --- a deleted run directory
    dict(
        name="subdir-made-with-parents",
        path="aiorl/io/rundir.py",
        old="    if not run_dir.is_dir():\n        raise RunDirDeleted(run_dir)\n    path = run_dir\n",
        new="    run_dir.mkdir(parents=True, exist_ok=True)\n    path = run_dir\n",
        tests=[f"{DELETED}::test_a_deleted_run_directory_is_named_and_never_made_again"],
    ),
    dict(
        name="subdir-made-with-the-default-mode",
        path="aiorl/io/rundir.py",
        old="            path.mkdir(mode=DIR_MODE)\n",
        new="            path.mkdir()\n",
        tests=[f"{DELETED}::test_subdirectories_are_made_owner_only_under_the_run_directory"],
    ),
    dict(
        name="launched-role-makes-its-run-directory-again",
        path="aiorl/io/rundir.py",
        old="    if not path.is_dir():\n        raise RunDirError(str(RunDirDeleted(path)))\n",
        new="    path.mkdir(parents=True, exist_ok=True)\n",
        tests=[f"{DELETED}::test_a_launched_role_never_makes_its_run_directory"],
    ),
    dict(
        name="watch-misses-a-replaced-directory",
        path="aiorl/io/rundir.py",
        old="        if held.st_nlink == 0 or (now.st_dev, now.st_ino) != (held.st_dev, held.st_ino):\n",
        new="        if False:\n",
        tests=[f"{DELETED}::test_the_watch_sees_a_deleted_or_replaced_run_directory"],
    ),
    dict(
        name="metrics-rows-into-a-deleted-file",
        path="aiorl/io/metrics.py",
        old="        self.watch.check()\n",
        new="",
        tests=[f"{DELETED}::test_metrics_rows_stop_when_the_run_directory_is_deleted"],
    ),
    dict(
        name="tensorboard-makes-the-run-directory-again",
        path="aiorl/io/loggers.py",
        old='log_dir=str(make_subdir(run_dir, "tb"))',
        new='log_dir=str(run_dir / "tb")',
        tests=[f"{DELETED}::test_tensorboard_makes_its_directory_owner_only_and_never_the_run_directory"],
    ),
]
