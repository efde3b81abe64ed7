"""Mutants of issue 44's resume that reaches its budget: the run's learner steps one truth across a
checkpoint and a resume, and the run ended once every learner says it reached its share."""

COUNTS = "tests/runtime/test_resume_counts.py::"
CLUSTER = "tests/cluster/test_resume_budget.py::"
OUTPUTS = "tests/runtime/test_learner_outputs.py::"

MUTANTS = [
    dict(
        name="resume-starts-the-runs-learner-steps-at-0",
        path="aiorl/io/rundir.py",
        old='    run["learner_steps"] = run_learner_steps(meta.get("learner_steps", 0), learners)\n',
        new='    run["learner_steps"] = run_learner_steps(0, learners)\n',
        tests=[
            COUNTS + "test_the_runs_learner_steps_start_from_learner_0s_own_count_for_each_learner",
            CLUSTER + "test_a_resume_after_the_launcher_was_sigkilled_reaches_its_budget",
            CLUSTER + "test_the_restart_after_memory_host_0_was_sigkilled_reaches_its_budget",
        ],
    ),
    dict(
        name="resume-starts-from-the-recorded-totals",
        path="aiorl/runtime/coordinator/counters.py",
        old="        run = resumed_counters(checkpoint.read_meta(path), learners)\n",
        new='        run = checkpoint.read_meta(path).get("run") or {}\n',
        tests=[COUNTS + "test_a_resumed_coordinator_reaches_the_budget_where_its_learners_stop"],
    ),
    dict(
        name="resume-counts-one-learner",
        path="aiorl/io/rundir.py",
        old="    return int(own_steps) * int(learners)\n",
        new="    return int(own_steps)\n",
        tests=[
            COUNTS + "test_the_runs_learner_steps_start_from_learner_0s_own_count_for_each_learner",
            COUNTS + "test_a_resumed_coordinator_reaches_the_budget_where_its_learners_stop",
        ],
    ),
    dict(
        name="checkpoint-records-the-heartbeats-learner-steps",
        path="aiorl/runtime/learner_outputs.py",
        old='        run_state["learner_steps"] = run_learner_steps(steps, self.cfg.cluster.learners)\n',
        new="",
        tests=[
            COUNTS + "test_every_checkpoint_records_the_runs_learner_steps_as_learner_0_counts_them",
            OUTPUTS + "test_an_abnormal_end_checkpoints_the_last_heartbeats_counters_without_the_coordinator",
        ],
    ),
    dict(
        name="checkpoint-records-learner-0s-steps-alone",
        path="aiorl/runtime/learner_outputs.py",
        old='        run_state["learner_steps"] = run_learner_steps(steps, self.cfg.cluster.learners)\n',
        new='        run_state["learner_steps"] = run_learner_steps(steps, 1)\n',
        tests=[COUNTS + "test_every_checkpoint_records_the_runs_learner_steps_as_learner_0_counts_them"],
    ),
    dict(
        name="learners-word-never-stops-the-run",
        path="aiorl/runtime/coordinator/counters.py",
        old="    if a.scheduled_global_steps is not None and len(counters.at_budget) >= cfg.cluster.learners:\n",
        new="    if False:\n",
        tests=[COUNTS + "test_the_run_stops_when_every_learner_says_its_budget_is_reached"],
    ),
    dict(
        name="one-learners-word-stops-the-run",
        path="aiorl/runtime/coordinator/counters.py",
        old="    if a.scheduled_global_steps is not None and len(counters.at_budget) >= cfg.cluster.learners:\n",
        new="    if a.scheduled_global_steps is not None and counters.at_budget:\n",
        tests=[COUNTS + "test_the_run_stops_when_every_learner_says_its_budget_is_reached"],
    ),
    dict(
        name="learners-word-stops-a-run-without-a-step-budget",
        path="aiorl/runtime/coordinator/counters.py",
        old="    if a.scheduled_global_steps is not None and len(counters.at_budget) >= cfg.cluster.learners:\n",
        new="    if len(counters.at_budget) >= cfg.cluster.learners:\n",
        tests=[COUNTS + "test_without_a_step_budget_the_learners_word_stops_nothing"],
    ),
    dict(
        name="budget-word-kept-among-the-counters",
        path="aiorl/runtime/coordinator/counters.py",
        old='        if counters.pop(BUDGET_REACHED, 0) and record.kind == "learner":\n',
        new='        if counters.get(BUDGET_REACHED, 0) and record.kind == "learner":\n',
        tests=[COUNTS + "test_the_run_stops_when_every_learner_says_its_budget_is_reached"],
    ),
    dict(
        name="any-role-says-a-learners-budget-is-reached",
        path="aiorl/runtime/coordinator/counters.py",
        old='        if counters.pop(BUDGET_REACHED, 0) and record.kind == "learner":\n',
        new="        if counters.pop(BUDGET_REACHED, 0):\n",
        tests=[COUNTS + "test_without_a_step_budget_the_learners_word_stops_nothing"],
    ),
    dict(
        name="budget-word-from-any-role-kind",
        path="aiorl/runtime/coordinator/counters.py",
        old='OWNERS = {"env_steps": "actor", "learner_steps": "learner", BUDGET_REACHED: "learner"}\n',
        new='OWNERS = {"env_steps": "actor", "learner_steps": "learner", BUDGET_REACHED: "actor"}\n',
        tests=[COUNTS + "test_only_a_learner_says_its_budget_is_reached_and_only_once"],
    ),
    dict(
        name="learner-never-says-its-budget-is-reached",
        path="aiorl/runtime/learner.py",
        old="        self.counters[BUDGET_REACHED] = 1\n",
        new="",
        tests=[COUNTS + "test_a_learner_at_its_budget_says_so_with_its_counters"],
    ),
]
