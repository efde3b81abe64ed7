"""Mutants of issue 18 (evaluation during training, the best policy kept, aiorl eval --best/--final);
each was checked by hand: applied, its tests run and seen failing, reverted."""

T = "tests/runtime/test_eval_during_training.py::"

MUTANTS = [
    dict(
        name="a-sigterm-ends-the-warm-up-a-best-export-waits-on",
        path="aiorl/evaluation/worker.py",
        old="                stop.evaluating = best is not None\n",
        new="                stop.evaluating = False\n",
        tests=[T + "test_a_sigterm_in_the_warm_up_still_exports_the_best_waiting_for_it"],
    ),
    dict(
        name="best-is-the-last-evaluation",
        path="aiorl/evaluation/worker.py",
        old='kept = evaluation["return_mean"] is not None and (best is None or evaluation["return_mean"] > best)',
        new='kept = evaluation["return_mean"] is not None',
        tests=[T + "test_the_best_evaluation_is_kept_not_the_last_and_a_resume_keeps_it"],
    ),
    dict(
        name="resume-forgets-the-best",
        path="aiorl/runtime/evaluator.py",
        old="self.best = read_best(policy_dir)  # a resumed run goes on from its best",
        new="self.best = None",
        tests=[
            T + "test_the_best_evaluation_is_kept_not_the_last_and_a_resume_keeps_it",
            T + "test_a_resumed_run_keeps_the_best_of_its_earlier_launch",
        ],
    ),
    dict(
        name="eval-on-the-training-seeds",
        path="aiorl/runtime/evaluator.py",
        old="return EVAL_SEED_BASE + cfg.run.seed",
        new="return cfg.run.seed",
        tests=[T + "test_evaluation_episodes_have_their_own_seeds"],
    ),
    dict(
        name="eval-due-on-absolute-steps",
        path="aiorl/runtime/evaluator.py",
        old="learner_steps // r.eval_every > self.last_step // r.eval_every",
        new="learner_steps >= r.eval_every",
        tests=[T + "test_due_by_learner_steps_and_stopped_at_shutdown"],
    ),
    dict(
        name="eval-ignores-the-shutdown",
        path="aiorl/evaluation/episodes.py",
        old="            if stop is not None and stop.is_set():\n                return None\n",
        new="",
        tests=[T + "test_due_by_learner_steps_and_stopped_at_shutdown"],
    ),
    dict(
        name="heartbeat-drops-the-evaluation",
        path="aiorl/runtime/messages.py",
        old='    "evaluation": (evaluation, False),\n',
        new="",
        tests=[T + "test_a_run_evaluates_stops_on_the_evaluation_return_and_keeps_its_best"],
    ),
    dict(
        name="target-return-ignores-the-evaluation",
        path="aiorl/runtime/coordinator/counters.py",
        old='if hit is not None and hit["return_mean"] >= a.target_return:',
        new="if False:",
        tests=[T + "test_a_run_evaluates_stops_on_the_evaluation_return_and_keeps_its_best"],
    ),
    dict(
        name="no-eval-rows",
        path="aiorl/runtime/coordinator/report.py",
        old="        return [evaluation_row(e, best, counters.t_start) for e in counters.take_evaluation_rows()]\n",
        new="        return []\n",
        tests=[T + "test_a_run_evaluates_stops_on_the_evaluation_return_and_keeps_its_best"],
    ),
    dict(
        name="eval-defaults-to-the-final-policy",
        path="aiorl/evaluation/policies.py",
        old='if which == "best" or (which is None and best is not None and best_path.is_file()):',
        new='if which == "best":',
        tests=[T + "test_a_run_evaluates_stops_on_the_evaluation_return_and_keeps_its_best"],
    ),
    dict(
        name="best-without-a-best-falls-through",
        path="aiorl/evaluation/policies.py",
        old='if which == "best" and (best is None or not best_path.is_file()):',
        new="if False:",
        tests=[T + "test_best_on_a_run_without_a_best_policy_is_one_line_exit_2"],
    ),
    dict(
        name="side-by-side-returns-keep-the-last-reward",
        path="aiorl/evaluation/episodes.py",
        old="returns[k] += float(reward)",
        new="returns[k] = float(reward)",
        tests=[T + "test_due_by_learner_steps_and_stopped_at_shutdown"],
    ),
    dict(
        name="panel-keeps-only-the-latest-row",
        path="aiorl/launch/panel.py",
        old='if "eval/return_mean" in new:',
        new="if False:",
        tests=[T + "test_the_panel_shows_the_last_evaluation_until_the_next"],
    ),
    # ------------------------------------------------------------------ the evaluation process
    dict(
        name="worker-scores-its-own-weights",
        path="aiorl/evaluation/worker.py",
        old="            policy.load_state_dict({k: torch.from_numpy(arrays[k]) for k in arrays.files})\n",
        new="            pass\n",
        tests=[T + "test_every_algorithms_export_evaluates"],
    ),
    dict(
        name="worker-outlives-a-killed-learner",
        path="aiorl/evaluation/worker.py",
        old="ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG",
        new="pass",
        tests=[T + "test_the_evaluation_process_dies_with_a_learner_killed_outright"],
    ),
    dict(
        name="interrupt-lets-the-evaluation-run-on",
        path="aiorl/runtime/eval_worker.py",
        old="            self.proc.send_signal(signal.SIGTERM)\n",
        new="            pass\n",
        tests=[T + "test_an_interrupted_evaluation_is_not_recorded_and_close_ends_the_process"],
    ),
    dict(
        name="learner-leaves-the-evaluation-process",
        path="aiorl/runtime/learner.py",
        old="        await self.outputs.close()\n",
        new="        pass\n",
        tests=[T + "test_a_run_evaluates_stops_on_the_evaluation_return_and_keeps_its_best"],
    ),
    dict(
        name="no-final-evaluation",
        path="aiorl/runtime/learner_outputs.py",
        old="        if self.evaluator is not None and not signalled:  # a signal asks for a prompt end\n",
        new="        if False:\n",
        tests=[T + "test_a_run_evaluates_stops_on_the_evaluation_return_and_keeps_its_best"],
    ),
    dict(
        name="evaluation-competes-with-training",
        path="aiorl/evaluation/worker.py",
        old="    os.nice(nice)",
        new="    pass",
        tests=[T + "test_an_interrupted_evaluation_is_not_recorded_and_close_ends_the_process"],
    ),
]
