"""Mutants of issue 15, second half (export, status/summary, panel, eval options, plot, loggers);
each was checked by hand: applied, its tests run and seen failing, reverted."""

MUTANTS = [
    dict(
        name="export-static-batch",
        path="aiorl/io/export.py",
        old="        return (obs,), ({0: batch},)",
        new="        return (obs,), None",
        tests=["tests/algos/test_export.py::test_every_algorithms_exported_policy_loads_with_plain_torch_and_no_aiorl"],
    ),
    dict(
        name="no-legacy-torchscript-fallback",
        path="aiorl/io/export.py",
        old="    for name in (WEIGHTS_FILE, POLICY_FILE, LEGACY_POLICY_FILE):",
        new="    for name in (WEIGHTS_FILE, POLICY_FILE):",
        tests=["tests/algos/test_export.py::test_an_older_run_with_a_torchscript_policy_still_evaluates"],
    ),
    dict(
        name="status-of-a-finished-run-needs-the-token",
        path="aiorl/cli/status.py",
        old="final = finished_summary(Path(args.target)) if Path(args.target).is_dir() else None",
        new="final = None",
        tests=["tests/cluster/test_observability.py::test_status_of_a_running_cluster_and_of_a_finished_run"],
    ),
    dict(
        name="summary-keeps-every-publication",
        path="aiorl/runtime/coordinator/params.py",
        old="if len(self.weights_published) < WEIGHTS_PUBLISHED_KEPT:",
        new="if True:",
        tests=["tests/cluster/test_observability.py::test_summary_json_stays_compact"],
    ),
    dict(
        name="role-stderr-on-the-terminal",
        path="aiorl/launch/local.py",
        old="                stdout=log_file,\n                stderr=log_file,\n",
        new="                stdout=None,\n                stderr=None,\n",
        tests=[
            "tests/cluster/test_panel.py::test_a_role_writing_to_stderr_goes_to_its_log_and_the_launcher_reports_it"
        ],
    ),
    dict(
        name="warnings-twice-in-the-log",
        path="aiorl/runtime/process.py",
        old="if not _is_same_file(sys.stderr, log_path):",
        new="if True:",
        tests=[
            "tests/cluster/test_panel.py::test_a_role_writing_to_stderr_goes_to_its_log_and_the_launcher_reports_it"
        ],
    ),
    dict(
        name="rate-between-the-last-two-rows",
        path="aiorl/launch/panel.py",
        old="while len(self.points) > 2 and t - self.points[1][0] >= self.window_s:",
        new="while len(self.points) > 2:",
        tests=["tests/cluster/test_panel.py::test_rates_are_smoothed_over_a_window_not_the_last_short_interval"],
    ),
    dict(
        name="last-frame-shows-the-row-not-the-summary",
        path="aiorl/launch/panel.py",
        old="source = self.final if self.final is not None else self.row",
        new="source = self.row",
        tests=[
            "tests/cluster/test_panel.py::test_last_frame_says_exited_with_the_summary_counters_and_the_next_command",
            "tests/cluster/test_panel.py::test_live_panel_last_frame_is_the_end_not_the_last_running_row",
        ],
    ),
    dict(
        name="eta-after-an-interrupt",
        path="aiorl/launch/panel.py",
        old="if self.final is not None or self.interrupted or not self.goal:",
        new="if self.final is not None or not self.goal:",
        tests=["tests/cluster/test_panel.py::test_no_eta_after_an_interrupt"],
    ),
    dict(
        name="logged-exception-counted-twice",
        path="aiorl/launch/role_logs.py",
        old="self.in_traceback = not self.after_record",
        new="self.in_traceback = True",
        tests=["tests/cluster/test_panel.py::test_role_log_problems_counted_once_each_with_the_latest_first_line"],
    ),
    dict(
        name="trailing-smoothing-lags",
        path="aiorl/cli/plot.py",
        old="hi = np.minimum(len(y), idx + window // 2 + 1)",
        new="hi = idx + 1",
        tests=["tests/tooling/test_plot.py::test_smoothing_is_centred_and_does_not_lag"],
    ),
    dict(
        name="seeds-are-different-experiments",
        path="aiorl/cli/plot.py",
        old='NOT_THE_EXPERIMENT = {"run": ("dir", "seed")}',
        new='NOT_THE_EXPERIMENT = {"run": ("dir",)}',
        tests=["tests/tooling/test_plot.py::test_runs_of_one_config_form_one_group_with_a_min_max_band"],
    ),
    dict(
        name="checkpoint-not-loaded",
        path="aiorl/evaluation/options.py",
        old="        learner.load_checkpoint(str(path))\n",
        new="        str(path)\n",
        tests=["tests/tooling/test_eval.py::test_checkpoint_n_evaluates_that_checkpoint_not_the_export"],
    ),
    dict(
        name="no-tensorboard-hparams",
        path="aiorl/io/loggers.py",
        old="            self.writer.file_writer.add_summary(summary)\n",
        new="            pass\n",
        tests=["tests/tooling/test_loggers.py::test_tensorboard_gets_the_rows_and_the_config_as_hparams"],
    ),
    dict(
        name="argparse-usage-before-the-error",
        path="aiorl/cli/main.py",
        old='        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\\n")\n',
        new="        super().error(message)\n",
        tests=["tests/tooling/test_cli_errors.py::test_a_users_mistake_is_one_line_and_exit_2"],
    ),
]
