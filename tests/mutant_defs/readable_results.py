"""Mutants of "results a person can read and trust" (issue 27), the first hour's rough edges and
reproducibility: each breaks one rule a test pins. The evaluation curve and evaluations on time
are in eval_curves.py."""

EVAL = "tests/tooling/test_eval.py::"

MUTANTS = [
    dict(
        name="video-looks-for-a-display",
        path="aiorl/evaluation/options.py",
        old='        os.environ.setdefault("SDL_VIDEODRIVER", "dummy")\n',
        new="        pass\n",
        tests=[EVAL + "test_video_on_a_headless_host_prints_nothing_on_stderr"],
    ),
]

API = "tests/tooling/test_api.py::"
THREAD_RUN = API + "test_run_from_a_thread_blocks_and_returns_the_summary"
CALLBACK_RAISES = API + "test_an_on_metrics_callback_that_raises_stops_the_run_cleanly_and_its_error_surfaces"

MUTANTS += [
    dict(
        name="on-metrics-not-called-when-quiet",
        path="aiorl/launch/panel.py",
        old="            if self.on_row is not None:\n                self._read()\n            return",
        new="            return",
        # Rows then come only at the end: the callback that raises cannot stop the run early.
        tests=[THREAD_RUN, CALLBACK_RAISES],
    ),
    dict(
        name="on-metrics-error-does-not-stop-the-run",
        path="aiorl/launch/local.py",
        old="            if progress.on_row_error is not None and self.signals == 0:\n",
        new="            if False:\n",
        tests=[CALLBACK_RAISES],
    ),
    dict(
        name="on-metrics-error-swallowed",
        path="aiorl/api.py",
        old="        raise callback.error\n",
        new="        pass\n",
        tests=[CALLBACK_RAISES],
    ),
    dict(
        name="run-result-repr-is-the-whole-summary",
        path="aiorl/api.py",
        old="        return f\"<RunResult {' '.join(parts)}>\"\n",
        new="        return f\"<RunResult {' '.join(parts)} {self.summary}>\"\n",
        tests=[THREAD_RUN],
    ),
]

SUGGEST = "tests/tooling/test_suggest.py::"

MUTANTS += [
    dict(
        name="suggest-by-spelling-only",
        path="aiorl/core/suggest.py",
        old="    holding = [c for c in pool if _holds_every_word(name, c)]\n",
        new="    holding = []\n",
        tests=[SUGGEST + "test_a_name_made_of_words_gets_the_candidate_holding_them_the_preferred_one_first"],
    ),
    dict(
        name="suggest-ignores-prefer",
        path="aiorl/core/suggest.py",
        old="        if ranked:\n",
        new="        if False:\n",
        tests=[SUGGEST + "test_a_name_made_of_words_gets_the_candidate_holding_them_the_preferred_one_first"],
    ),
    dict(
        name="env-suggestion-from-the-registry-only",
        path="aiorl/envs/gym.py",
        old='        hint = did_you_mean(name, own + list(gym.registry), prefix=f"{module_name}:")\n',
        new='        hint = did_you_mean(name, list(gym.registry), prefix=f"{module_name}:")\n',
        tests=[SUGGEST + "test_a_misspelt_class_of_a_users_module_is_suggested_before_a_registered_id"],
    ),
]

BUDGETS = "tests/runtime/test_budgets.py::"

MUTANTS += [
    dict(
        name="learners-step-past-their-budget",
        path="aiorl/runtime/learner.py",
        old="        if self.stopped or self.budget_reached:\n",
        new="        if self.stopped:\n",
        tests=[
            BUDGETS + "test_a_learner_step_budget_is_met_exactly[1]",
            BUDGETS + "test_an_es_iteration_budget_is_met_exactly",
        ],
    ),
    dict(
        name="each-data-parallel-learner-takes-the-whole-budget",
        path="aiorl/runtime/learner.py",
        old="        return None if budget is None else -(-budget // self.cfg.cluster.learners)\n",
        new="        return budget\n",
        tests=[BUDGETS + "test_a_learner_step_budget_is_met_exactly[2]"],
    ),
    dict(
        name="actors-step-past-the-env-budget",
        path="aiorl/runtime/actor.py",
        old='        if not self.run_total_reached("env_steps", self.cfg.agent.scheduled_timesteps):\n',
        new="        if True:\n",
        tests=[BUDGETS + "test_an_env_step_budget_ends_within_one_rollout_of_the_actor"],
    ),
    dict(
        name="stop-records-a-stale-counter",
        path="aiorl/runtime/coordinator/counters.py",
        old="        if counter is not None:\n            self.at = {counter: self.at[counter]}\n",
        new="",
        tests=[BUDGETS + "test_an_es_iteration_budget_is_met_exactly"],
    ),
    dict(
        name="latest-not-pointed-at-a-new-run",
        path="aiorl/io/rundir.py",
        old="        if not cfg.run.dir:\n            point_latest_at(run_dir.path)\n",
        new="",
        tests=["tests/rundirs/test_rundir.py::test_runs_latest_points_at_the_newest_run_launched_there"],
    ),
    dict(
        name="hint-says-aiorl-where-it-is-not-on-path",
        path="aiorl/core/console.py",
        old="    if found is not None and os.path.samefile(found, script):\n",
        new="    if True:\n",
        tests=[
            "tests/cluster/test_panel.py::test_the_suggested_command_runs_as_written_with_the_venv_activated_or_not"
        ],
    ),
    dict(
        name="eval-of-a-missing-path-says-not-a-run-directory",
        path="aiorl/evaluation/evaluate.py",
        old="    if not run_dir.exists():\n",
        new="    if False:\n",
        tests=["tests/tooling/test_eval.py::test_errors_exit_2_with_a_reason"],
    ),
]

MUTANTS += [
    dict(
        name="status-of-a-finished-run-without-its-evaluation",
        path="aiorl/cli/status.py",
        old="    if evaluation:\n        lines.append(evaluation)\n",
        new="",
        tests=[
            "tests/runtime/test_eval_during_training.py::test_a_run_evaluates_stops_on_the_evaluation_return_and_keeps_its_best"
        ],
    ),
]

REFERENCE = "tests/tooling/test_config_reference.py::"

MUTANTS += [
    dict(
        name="generated-config-without-a-budget",
        path="aiorl/experiment/reference.py",
        old="    starter = get_settings(algo).starter\n",
        new="    starter = {}\n",
        tests=[REFERENCE + "test_config_algo_prints_every_key_with_its_doc_and_loads_back[apex_dqn]"],
    ),
    dict(
        name="a-run-without-a-stop-criterion-is-launched",
        path="aiorl/experiment/preflight.py",
        old="    check_stops(cfg)  # last: what is wrong with the config itself reads first\n",
        new="",
        tests=[REFERENCE + "test_a_generated_config_runs_and_stops_by_itself_and_one_without_a_budget_is_refused"],
    ),
]

REPRO = "tests/runtime/test_reproducibility.py::"

MUTANTS += [
    dict(
        name="deterministic-allowed-for-asynchronous-algorithms",
        path="aiorl/config/checks.py",
        old='        synchronous,\n        f"run.deterministic: {cfg.algo} is asynchronous',
        new='        True,\n        f"run.deterministic: {cfg.algo} is asynchronous',
        tests=[REPRO + "test_deterministic_is_refused_where_it_cannot_hold"],
    ),
    dict(
        name="deterministic-allowed-with-a-clock-stop",
        path="aiorl/config/checks.py",
        old='        cfg.run.max_seconds is None,\n        "run.deterministic: run.max_seconds',
        new='        True,\n        "run.deterministic: run.max_seconds',
        tests=[REPRO + "test_deterministic_is_refused_where_it_cannot_hold"],
    ),
]

MUTANTS += [
    dict(
        name="plot-suggests-by-spelling",
        path="aiorl/cli/plot.py",
        old="        hint = did_you_mean(metric, sorted(seen), prefer=DEFAULT_METRICS)",
        new="        hint = did_you_mean(metric, sorted(seen), prefer=DEFAULT_METRICS[:0]) if False else ''",
        tests=[
            "tests/tooling/test_plot.py::test_a_metric_named_in_words_suggests_the_evaluation_return_not_its_spread"
        ],
    ),
]

PANEL = "tests/cluster/test_panel.py::"

MUTANTS += [
    dict(
        name="panel-shows-replay-for-every-algorithm",
        path="aiorl/launch/panel.py",
        old='            "replay" if settings.keeps_replay(cfg) else',
        new='            "replay" if True else',
        tests=[PANEL + "test_the_store_line_is_replay_a_queue_or_nothing_as_the_algorithm_keeps"],
    ),
    dict(
        name="panel-elapsed-from-the-first-launch",
        path="aiorl/launch/panel.py",
        old='        if self.elapsed_s is None:\n            return f"elapsed {_clock(run_s)}"\n',
        new='        if True:\n            return f"elapsed {_clock(run_s)}"\n',
        tests=[PANEL + "test_elapsed_is_this_launchs_with_a_resumed_runs_total_beside_it"],
    ),
]
