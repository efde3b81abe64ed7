"""Mutants of the sync-speed work on issue #10 (time to threshold of DPPO and ES).

Each is a plausible bug in the code changed for it; the tests named here must
fail on it. Run them with `.venv/bin/python tests/mutants.py --only sync_speed`.
"""

MUTANTS = [
    # ------------------------------------------------------------------ episodes side by side
    # (aiorl/evaluation/evaluate.py's run_episodes_together, which the bench's grid uses; the return kept
    # as the last reward is eval_during_training's side-by-side-returns-keep-the-last-reward)
    dict(
        name="together_episodes_share_one_seed",
        path="aiorl/evaluation/episodes.py",
        old="obs = [np.asarray(env.reset(seed=seed + k)[0]) for k, env in enumerate(envs)]",
        new="obs = [np.asarray(env.reset(seed=seed)[0]) for k, env in enumerate(envs)]",
        tests=["tests/tooling/test_episodes_together.py"],
    ),
    dict(
        name="together_keeps_acting_on_the_first_observation",
        path="aiorl/evaluation/episodes.py",
        old="                obs[k] = np.asarray(o)\n",
        new="",
        tests=["tests/tooling/test_episodes_together.py"],
    ),
    # ------------------------------------------------------------------ the synchronous learner
    dict(
        name="sync_learner_no_longer_checkpoints_each_iteration",
        path="aiorl/runtime/learner.py",
        old="                await self._publish_weights()\n            await self.outputs.after_step()\n",
        new="                await self._publish_weights()\n",
        tests=[
            "tests/cluster/test_sync_cluster.py::test_dppo_lockstep_with_two_memories_and_two_identical_data_parallel_learners"
        ],
    ),
]
