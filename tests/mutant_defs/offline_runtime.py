"""Mutants of issue 45's offline run on the distributed runtime: the dataset store's shards and
fields, the offline config and its checks, the preflight of a bad dataset, offline.epochs and
what the panel shows; each was checked by hand."""

UNIT = "tests/offline/test_dataset_store.py"
CLUSTER = "tests/cluster/test_offline_cluster.py"
STORE = "aiorl/runtime/memory/dataset_store.py"

MUTANTS = [
    # --- shards: every row in exactly one, as the whole dataset's rows
    dict(
        name="offline-every-host-serves-shard-0",
        path=STORE,
        old="        lo, hi = shard_range(len(dataset), c.memories, parts.index)\n",
        new="        lo, hi = shard_range(len(dataset), c.memories, 0)\n",
        tests=[
            f"{UNIT}::test_shards_hold_every_row_exactly_once_as_the_whole_datasets_rows",
            f"{CLUSTER}::test_two_memory_hosts_serve_two_learners_each_from_its_own_shard",
        ],
    ),
    dict(
        name="offline-shard-rows-read-from-the-start",
        path=STORE,
        old="        data = offline_rows(dataset, lo, hi, n_step=model_n_step(cfg), gamma=model_gamma(cfg))\n",
        new="        data = offline_rows(dataset, 0, hi - lo, n_step=model_n_step(cfg), gamma=model_gamma(cfg))\n",
        tests=[
            f"{UNIT}::test_shards_hold_every_row_exactly_once_as_the_whole_datasets_rows",
            f"{CLUSTER}::test_two_memory_hosts_serve_two_learners_each_from_its_own_shard",
        ],
    ),
    dict(
        name="offline-n-step-ignored",
        path=STORE,
        old='    return int(getattr(cfg.model, "n_step", 1) or 1)\n',
        new="    return 1\n",
        tests=[f"{UNIT}::test_shards_hold_every_row_exactly_once_as_the_whole_datasets_rows"],
    ),
    dict(
        name="offline-rows-outside-the-shard-not-counted",
        path=STORE,
        old="        self.rows_outside += int(np.count_nonzero((rows < self.lo) | (rows >= self.hi)))\n",
        new="        self.rows_outside += int(np.count_nonzero(rows < self.lo))\n",
        tests=[f"{UNIT}::test_a_row_outside_the_shard_is_counted_and_the_row_field_served_only_when_named"],
    ),
    # --- fields by the algorithm's spec
    dict(
        name="offline-row-index-sent-to-learners",
        path=STORE,
        old="        rows = batch[ROW] if self.serve_row else batch.pop(ROW)\n",
        new="        rows = batch[ROW]\n",
        tests=[
            f"{UNIT}::test_learners_get_the_fields_the_spec_names_and_the_dataset_gives",
            f"{UNIT}::test_a_memory_host_serves_its_shard_to_a_learner_on_credits",
        ],
    ),
    dict(
        name="offline-optional-fields-required",
        path=STORE,
        old="    missing = [name for name in spec if name not in rows and name not in optional]\n",
        new="    missing = [name for name in spec if name not in rows]\n",
        tests=[f"{UNIT}::test_learners_get_the_fields_the_spec_names_and_the_dataset_gives"],
    ),
    dict(
        name="offline-missing-field-silently-dropped",
        path=STORE,
        old="    if missing:\n        raise DatasetError(",
        new="    if False:\n        raise DatasetError(",
        tests=[f"{UNIT}::test_a_field_the_dataset_cannot_give_is_one_line_naming_it"],
    ),
    dict(
        name="offline-field-shape-unchecked",
        path=STORE,
        old="        if shape != got:\n",
        new="        if False:\n",
        tests=[f"{UNIT}::test_a_field_the_dataset_cannot_give_is_one_line_naming_it"],
    ),
    dict(
        name="offline-initial-priorities-uneven",
        path=STORE,
        old="            buffer.add(arrays, np.ones(hi - lo))\n",
        new="            buffer.add(arrays, np.arange(1.0, hi - lo + 1))\n",
        tests=[f"{UNIT}::test_prioritized_shards_start_at_priority_one_and_take_learners_priorities"],
    ),
    dict(
        name="offline-store-not-chosen",
        path="aiorl/runtime/memory/build.py",
        old="STORES: list[type[Store]] = [DatasetStore, RoundsStore, QueueStore, ReplayStore]",
        new="STORES: list[type[Store]] = [RoundsStore, QueueStore, ReplayStore, DatasetStore]",
        tests=[f"{UNIT}::test_shards_hold_every_row_exactly_once_as_the_whole_datasets_rows"],
    ),
    # --- the dataset read once per process, checked against the env
    dict(
        name="offline-read-without-the-envs-spaces",
        path="aiorl/runtime/dataset_source.py",
        old="                o.dataset, o.format, observation_space=spec.observation_space, action_space=spec.action_space\n",
        new="                o.dataset, o.format\n",
        tests=[f"{UNIT}::test_a_dataset_whose_spaces_are_not_the_envs_is_one_line"],
    ),
    dict(
        name="offline-empty-shards-allowed",
        path="aiorl/runtime/dataset_source.py",
        old="        if len(dataset) < cfg.cluster.memories:\n",
        new="        if False:\n",
        tests=[f"{UNIT}::test_bad_dataset_or_actors_are_refused_before_any_row_is_served"],
    ),
    # --- the config
    dict(
        name="offline-run-keeps-its-actor",
        path="aiorl/experiment/loading.py",
        old='    for section, key, value in (("cluster", "actors", 0), ("env", "id", None)):\n',
        new='    for section, key, value in (("env", "id", None),):\n',
        tests=[f"{UNIT}::test_an_offline_run_defaults_to_no_actors_and_no_env_and_stops_by_epochs"],
    ),
    dict(
        name="offline-run-with-actors-allowed",
        path="aiorl/config/checks.py",
        old="        not offline or c.actors == 0,\n",
        new="        True,\n",
        tests=[f"{UNIT}::test_offline_configs_that_cannot_work_are_one_line_naming_the_key"],
    ),
    dict(
        name="offline-only-algorithm-runs-online",
        path="aiorl/config/checks.py",
        old="        o.dataset is not None or not offline_only,\n",
        new="        True,\n",
        tests=[f"{UNIT}::test_an_algorithm_that_learns_from_logged_data_only_needs_a_dataset"],
    ),
    dict(
        name="offline-synchronous-algorithm-allowed",
        path="aiorl/config/checks.py",
        old="        keeps_replay,\n",
        new="        True,\n",
        tests=[f"{UNIT}::test_offline_configs_that_cannot_work_are_one_line_naming_the_key"],
    ),
    dict(
        name="offline-epochs-not-a-stop",
        path="aiorl/config/checks.py",
        old="            a.scheduled_global_steps is not None or cfg.offline.epochs is not None or r.max_seconds is not None,\n",
        new="            a.scheduled_global_steps is not None or r.max_seconds is not None,\n",
        tests=[f"{UNIT}::test_an_offline_run_defaults_to_no_actors_and_no_env_and_stops_by_epochs"],
    ),
    dict(
        name="offline-target-return-without-episodes",
        path="aiorl/config/checks.py",
        old="        cfg.agent.target_return is None or (cfg.env.id is not None and evaluates),\n",
        new="        True,\n",
        tests=[f"{UNIT}::test_an_offline_run_defaults_to_no_actors_and_no_env_and_stops_by_epochs"],
    ),
    # --- the preflight: a bad dataset is the user's mistake
    dict(
        name="offline-bad-dataset-crashes-the-preflight",
        path="aiorl/experiment/preflight.py",
        old='        raise ConfigError(f"offline.dataset: {exc}") from None\n',
        new="        raise\n",
        tests=[f"{CLUSTER}::test_a_bad_dataset_is_one_line_exit_2_and_no_run_directory"],
    ),
    dict(
        name="offline-fields-checked-only-in-the-roles",
        path="aiorl/experiment/preflight.py",
        old="        if cfg.offline.dataset is not None:\n            check_dataset(cfg, algo)\n",
        new="",
        tests=[f"{UNIT}::test_the_preflight_refuses_a_dataset_the_algorithm_cannot_learn_from"],
    ),
    # --- offline.epochs and what is shown
    dict(
        name="offline-epochs-miscounted",
        path="aiorl/runtime/coordinator/counters.py",
        old="        return self.learner_steps * cfg.agent.batch_size / len(run_dataset(cfg))\n",
        new="        return self.learner_steps / len(run_dataset(cfg))\n",
        tests=[
            f"{UNIT}::test_offline_epochs_stop_the_run_at_that_many_passes_over_the_dataset",
            f"{CLUSTER}::test_offline_epochs_stop_the_run_naming_them",
        ],
    ),
    dict(
        name="offline-epochs-stop-late",
        path="aiorl/runtime/coordinator/counters.py",
        old="    if cfg.offline.epochs is not None and epochs is not None and epochs >= cfg.offline.epochs:\n",
        new="    if cfg.offline.epochs is not None and epochs is not None and epochs > cfg.offline.epochs + 0.1:\n",
        tests=[f"{UNIT}::test_offline_epochs_stop_the_run_at_that_many_passes_over_the_dataset"],
    ),
    dict(
        name="offline-epochs-not-in-metrics",
        path="aiorl/runtime/coordinator/report.py",
        old="        row.update(self._epochs())\n",
        new="",
        tests=[f"{UNIT}::test_a_memory_host_serves_its_shard_to_a_learner_on_credits"],
    ),
    dict(
        name="offline-panel-shows-env-steps",
        path="aiorl/launch/panel.py",
        old='        if "epochs" in row\n',
        new="        if False\n",
        tests=[f"{UNIT}::test_the_panel_shows_epochs_where_an_offline_run_has_no_env_steps"],
    ),
    dict(
        name="offline-panel-goal-not-epochs",
        path="aiorl/launch/panel.py",
        old='        return "epochs", cfg.offline.epochs\n',
        new='        return "env_steps", None\n',
        tests=[f"{UNIT}::test_the_panel_shows_epochs_where_an_offline_run_has_no_env_steps"],
    ),
    dict(
        name="eval-dataset-not-checked-before-start",
        path="aiorl/experiment/preflight.py",
        old="    check_eval_dataset(cfg, algo)\n",
        new="    pass\n",
        tests=[
            "tests/cluster/test_offline_cluster.py::test_a_bad_eval_dataset_is_one_line_exit_2_and_no_run_directory"
        ],
    ),
    dict(
        name="evaluations-drop-the-off-policy-estimates",
        path="aiorl/evaluation/worker.py",
        old="        evaluation.update(ope.score(policy))\n",
        new="        pass\n",
        tests=[
            "tests/cluster/test_offline_cluster.py::test_an_offline_run_without_an_env_logs_its_off_policy_estimates"
        ],
    ),
]
