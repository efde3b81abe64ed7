"""Mutants of learner 0's outputs as an owned part (issue "Parts that own their state", second point):
each breaks a rule tests/runtime/test_learner_outputs.py pins with the part driven alone through its
moments (the first checkpoint at the first publication, NaN weights never checkpointed, the abnormal
end without the coordinator, the final publish, a resumed launch's steps, only learner 0 writing), or
one the role's own calls to it keep (checked by the runs that use them)."""

O = "tests/runtime/test_learner_outputs.py::"
FIRST = O + "test_the_first_checkpoint_comes_at_the_first_publish_then_by_the_interval"
SYNC = O + "test_a_synchronous_learner_checkpoints_after_its_first_iteration_and_none_with_both_off"
ONLY_0 = O + "test_checkpoint_every_counts_the_runs_steps_and_only_learner_0_writes"
NAN = O + "test_weights_holding_nan_are_never_checkpointed"
FINISH = O + "test_finish_publishes_then_checkpoints_then_exports_and_the_summary_lists_the_files"
ABNORMAL = O + "test_an_abnormal_end_checkpoints_the_last_heartbeats_counters_without_the_coordinator"
NO_COORDINATOR = O + "test_a_checkpoint_without_the_coordinator_records_the_last_heartbeats_counters"
RESUMED = O + "test_a_resumed_launch_loads_its_checkpoint_and_its_files_go_on_from_its_steps"
FINAL_EVAL = O + "test_the_final_evaluation_scores_the_final_policy_unless_a_signal_asks_for_a_prompt_end"
FIRST_PUBLISHED = (
    "tests/cluster/test_resume_always.py::test_the_first_checkpoint_comes_with_the_first_weights_published"
)

MUTANTS = [
    dict(
        name="outputs-first-checkpoint-at-the-first-step",
        path="aiorl/runtime/learner_outputs.py",
        old="            and self.access.launch_steps() >= self.first_publication_step()\n",
        new="            and self.access.launch_steps() >= 1\n",
        tests=[FIRST],
    ),
    dict(
        name="outputs-first-checkpoint-counts-the-runs-steps",
        path="aiorl/runtime/learner_outputs.py",
        old="            and self.access.launch_steps() >= self.first_publication_step()\n",
        new="            and self.total_steps() >= self.first_publication_step()\n",
        tests=[RESUMED],
    ),
    dict(
        name="outputs-nan-weights-checkpointed",
        path="aiorl/runtime/learner_outputs.py",
        old="            return None if state is None else read(state)\n",
        new="            return None if state is None else read({k: v.nan_to_num() for k, v in state.items()})\n",
        tests=[NAN],
    ),
    dict(
        name="outputs-every-learner-writes",
        path="aiorl/runtime/learner_outputs.py",
        old="        self.writes = index == 0  # only learner 0 has outputs\n",
        new="        self.writes = True\n",
        tests=[ONLY_0],
    ),
    dict(
        name="outputs-final-checkpoint-before-the-publish",
        path="aiorl/runtime/learner_outputs.py",
        old="        await self.access.publish()\n",
        new="",
        tests=[FINISH],
    ),
    dict(
        name="outputs-abnormal-end-asks-the-coordinator",
        path="aiorl/runtime/learner_outputs.py",
        old='await self._checkpoint(f"abnormal end: {why}", coordinator=False)',
        new='await self._checkpoint(f"abnormal end: {why}")',
        tests=[ABNORMAL],
    ),
    dict(
        name="outputs-abnormal-end-before-the-core-was-built",
        path="aiorl/runtime/learner_outputs.py",
        old="        if not self.writes or self.access.core() is None:\n",
        new="        if not self.writes:\n",
        tests=[ABNORMAL],
    ),
    dict(
        name="outputs-checkpoint-fails-without-the-coordinator",
        path="aiorl/runtime/learner_outputs.py",
        old="            return dict(self.access.run_counters())\n\n    async def _checkpoint(",
        new="            raise\n\n    async def _checkpoint(",
        tests=[NO_COORDINATOR],
    ),
    dict(
        name="outputs-resumed-files-named-by-this-launchs-steps",
        path="aiorl/runtime/learner_outputs.py",
        old="        return self.step_base + self.access.launch_steps()\n",
        new="        return self.access.launch_steps()\n",
        tests=[RESUMED],
    ),
    dict(
        name="outputs-synchronous-first-checkpoint-at-publish-interval",
        path="aiorl/runtime/learner_outputs.py",
        old="        return 1 if self.synchronous else self.cfg.agent.publish_interval\n",
        new="        return self.cfg.agent.publish_interval\n",
        tests=[SYNC],
    ),
    dict(
        name="outputs-final-evaluation-even-after-a-signal",
        path="aiorl/runtime/learner_outputs.py",
        old="        if self.evaluator is not None and not signalled:  # a signal asks for a prompt end\n",
        new="        if self.evaluator is not None:  # a signal asks for a prompt end\n",
        tests=[FINAL_EVAL],
    ),
    dict(
        name="learner-never-calls-its-outputs-after-a-step",
        path="aiorl/runtime/learner.py",
        old="        if checkpoint_now:\n            await self.outputs.after_step()\n",
        new="        if checkpoint_now:\n            pass\n",
        tests=[FIRST_PUBLISHED],
    ),
]
