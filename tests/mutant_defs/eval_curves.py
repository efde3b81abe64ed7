"""Mutants of issue 27's evaluation curves and evaluations on time: every evaluation reaching
metrics.jsonl and TensorBoard at its policy's steps, eval/lag_s and eval/skipped, `aiorl plot`'s
default figure; each was checked by hand: applied, its tests run and seen failing, reverted."""

T = "tests/cluster/test_eval_curves.py::"
BETWEEN_HEARTBEATS = T + "test_two_evaluations_between_two_heartbeats_both_reach_metrics_jsonl_and_tensorboard"
LAG = T + "test_lag_runs_from_due_to_the_result_and_the_grid_counts_skips"
DEFAULT_PLOT = T + "test_the_default_plot_draws_training_and_evaluation_returns_each_evaluation_at_its_scored_step"
REAL_RUN = T + "test_a_run_records_every_evaluation_once_at_its_steps"

MUTANTS = [
    # --- no evaluation lost between heartbeats
    dict(
        name="heartbeat-carries-only-the-last-evaluation",
        path="aiorl/runtime/evaluator.py",
        old='"new": list(self.unreported),',
        new='"new": list(self.unreported)[-1:],',
        tests=[BETWEEN_HEARTBEATS],
    ),
    dict(
        name="acknowledgement-drops-evaluations-not-sent",
        path="aiorl/runtime/evaluator.py",
        old='self.unreported = [e for e in self.unreported if e["n"] > arrived]',
        new="self.unreported = []",
        tests=[BETWEEN_HEARTBEATS],
    ),
    dict(
        name="heartbeat-answers-never-acknowledge",
        path="aiorl/runtime/role.py",
        old="            self.heartbeat_answered(meta)\n",
        new="",
        tests=[REAL_RUN],
    ),
    dict(
        name="heartbeat-check-drops-new-evaluations",
        path="aiorl/runtime/messages.py",
        old='        "new": nullable(list_of(_evaluation_record, 1024))(value.get("new"), f"{path}[new]"),\n',
        new="",
        tests=[BETWEEN_HEARTBEATS],
    ),
    dict(
        name="coordinator-takes-only-the-newest",
        path="aiorl/runtime/coordinator/counters.py",
        old='for evaluation in sorted(new, key=lambda e: e["n"]):',
        new='for evaluation in sorted(new, key=lambda e: e["n"])[-1:]:',
        tests=[BETWEEN_HEARTBEATS],
    ),
    dict(
        name="coordinator-takes-a-resent-evaluation-again",
        path="aiorl/runtime/coordinator/counters.py",
        old='            if evaluation["n"] > self.evaluations_seen:',
        new="            if True:",
        tests=[BETWEEN_HEARTBEATS],
    ),
    dict(
        name="target-return-only-on-the-newest",
        path="aiorl/runtime/coordinator/counters.py",
        old="        hit = counters.top  # of every evaluation this launch",
        new='        hit = (counters.evaluation or {}).get("last")  # of every evaluation this launch',
        tests=[T + "test_the_target_return_is_held_to_every_evaluation_of_a_heartbeat"],
    ),
    dict(
        name="one-row-holds-only-the-newest-evaluation",
        path="aiorl/io/metrics.py",
        old="for e in evaluations or [{}]))",
        new="for e in evaluations[-1:] or [{}]))",
        tests=[BETWEEN_HEARTBEATS],
    ),
    dict(
        name="tensorboard-evaluation-at-the-rows-step",
        path="aiorl/io/metrics.py",
        old="logger.log_evaluation(evaluation, step if at is None else int(at))",
        new="logger.log_evaluation(evaluation, step)",
        tests=[BETWEEN_HEARTBEATS],
    ),
    dict(
        name="tensorboard-gets-no-evaluation",
        path="aiorl/io/metrics.py",
        old="                for evaluation in evaluations:\n",
        new="                for evaluation in ():\n",
        tests=[BETWEEN_HEARTBEATS],
    ),
    dict(
        name="eval-row-best-as-of-now",
        path="aiorl/runtime/evaluator.py",
        old='best_return = evaluation.get("best_return_mean", best["return_mean"] if best is not None else None)',
        new='best_return = best["return_mean"] if best is not None else None',
        tests=[BETWEEN_HEARTBEATS],
    ),
    dict(
        name="eval-row-without-its-time",
        path="aiorl/runtime/evaluator.py",
        old='"eval/time_s": None if policy_time is None or t_start is None else round(policy_time - t_start, 3),',
        new='"eval/time_s": None,',
        tests=[BETWEEN_HEARTBEATS],
    ),
    # --- lag and skips
    dict(
        name="lag-from-when-the-copy-was-taken",
        path="aiorl/runtime/evaluator.py",
        old="due_t = now if self.due_t is None else self.due_t",
        new="due_t = now",
        tests=[LAG],
    ),
    dict(
        name="lag-by-time-from-when-it-was-noticed",
        path="aiorl/runtime/evaluator.py",
        old="self.last_t + r.eval_interval_s if by_time and not by_steps else time.monotonic()",
        new="time.monotonic()",
        tests=[LAG],
    ),
    dict(
        name="lag-not-up-to-the-result",
        path="aiorl/runtime/evaluator.py",
        old='"lag_s": round(done_t - due_t, 3),',
        new='"lag_s": 0.0,',
        tests=[LAG],
    ),
    dict(
        name="grid-points-passed-over-not-skipped",
        path="aiorl/runtime/evaluator.py",
        old="self.skipped += max(0, learner_steps // r.eval_every - self.last_step // r.eval_every - 1)",
        new="self.skipped += 0",
        tests=[LAG],
    ),
    dict(
        name="resumed-launch-grid-from-zero",
        path="aiorl/runtime/evaluator.py",
        old="self.last_step = learner_steps - learner_steps % r.eval_every if r.eval_every else learner_steps",
        new="self.last_step = 0",
        tests=[T + "test_a_resumed_launch_starts_its_grid_at_its_first_step"],
    ),
    dict(
        name="dropped-copy-not-skipped",
        path="aiorl/runtime/learner_outputs.py",
        old="            self._waiting.popleft()\n            ev.skip()\n",
        new="            self._waiting.popleft()\n",
        tests=["tests/runtime/test_learner_outputs.py::test_copies_wait_for_the_evaluation_in_flight_a_few_at_most"],
    ),
    dict(
        name="waiting-copies-unbounded",
        path="aiorl/runtime/learner_outputs.py",
        old="        if len(self._waiting) >= MAX_WAITING:",
        new="        if False:",
        tests=["tests/runtime/test_learner_outputs.py::test_copies_wait_for_the_evaluation_in_flight_a_few_at_most"],
    ),
    dict(
        name="newest-copy-dropped-not-the-oldest",
        path="aiorl/runtime/learner_outputs.py",
        old="            self._waiting.popleft()\n            ev.skip()\n",
        new="            self._waiting.pop()\n            ev.skip()\n",
        tests=["tests/runtime/test_learner_outputs.py::test_copies_wait_for_the_evaluation_in_flight_a_few_at_most"],
    ),
    dict(
        name="one-slot-for-waiting-copies",
        path="aiorl/runtime/learner_outputs.py",
        old="MAX_WAITING = 3\n",
        new="MAX_WAITING = 1\n",
        tests=["tests/runtime/test_learner_outputs.py::test_copies_wait_for_the_evaluation_in_flight_a_few_at_most"],
    ),
    dict(
        name="waiting-copies-scored-newest-first",
        path="aiorl/runtime/learner_outputs.py",
        old="            args = self._waiting.popleft()",
        new="            args = self._waiting.pop()",
        tests=["tests/runtime/test_learner_outputs.py::test_copies_wait_for_the_evaluation_in_flight_a_few_at_most"],
    ),
    dict(
        name="new-best-never-exported",
        path="aiorl/evaluation/worker.py",
        old='    if reply.get("kept"):',
        new="    if False:",
        tests=[
            "tests/runtime/test_eval_during_training.py::test_the_best_evaluation_is_kept_not_the_last_and_a_resume_keeps_it"
        ],
    ),
    # --- aiorl plot
    dict(
        name="plot-evaluation-x-where-it-landed-not-recorded",
        path="aiorl/cli/plot.py",
        old="        if own is not None and _number(r.get(own)):",
        new="        if False:",
        tests=[T + "test_evaluations_recorded_with_their_own_steps_and_times_are_drawn_there"],
    ),
    dict(
        name="plot-old-run-evaluation-where-it-landed",
        path="aiorl/cli/plot.py",
        old='        elif len(steps) and _number(r.get("eval/learner_steps")):',
        new="        elif False:",
        tests=[DEFAULT_PLOT],
    ),
    dict(
        name="plot-smooths-evaluations-by-default",
        path="aiorl/cli/plot.py",
        old="smoothing = window if window is not None else 1 if is_evaluation(name) else TRAINING_WINDOW",
        new="smoothing = window if window is not None else TRAINING_WINDOW",
        tests=[T + "test_evaluations_are_smoothed_only_on_request"],
    ),
    dict(
        name="plot-never-smooths-evaluations",
        path="aiorl/cli/plot.py",
        old="smoothing = window if window is not None else 1 if is_evaluation(name) else TRAINING_WINDOW",
        new="smoothing = 1 if is_evaluation(name) else window if window is not None else TRAINING_WINDOW",
        tests=[T + "test_evaluations_are_smoothed_only_on_request"],
    ),
    dict(
        name="plot-default-without-the-evaluation",
        path="aiorl/cli/plot.py",
        old='DEFAULT_METRICS = ("return_mean_100", "eval/return_mean")',
        new='DEFAULT_METRICS = ("return_mean_100",)',
        tests=[DEFAULT_PLOT],
    ),
    dict(
        name="plot-evaluation-in-the-training-style",
        path="aiorl/cli/plot.py",
        old='style = {"linestyle": "--", "marker": "o", "markersize": 5, "linewidth": 1.5} if evaluation else',
        new='style = {"linewidth": 2} if evaluation else',
        tests=[DEFAULT_PLOT],
    ),
    dict(
        name="plot-legend-names-no-metric",
        path="aiorl/cli/plot.py",
        old='    if len(metrics) == 1:\n        return ""\n',
        new='    if len(metrics) >= 1:\n        return ""\n',
        tests=[DEFAULT_PLOT],
    ),
]
