"""Mutants of "survival that holds" (issue 25): restarts in every phase and every algorithm, on by
default; a synchronous actor that joins the next iteration; a run that restarts itself. Each breaks
one rule a test pins, in process (barrier, rounds) or over real role processes
(tests/cluster/test_survival.py). The checkpoint rules of the same issue are in checkpoints_kept.py."""

S = "tests/cluster/test_survival.py::"
CHAOS_DPPO = S + "test_chaos_actors_killed_in_starting_and_running_are_restarted_and_the_run_finishes[dppo]"
CHAOS_APEX = S + "test_chaos_actors_killed_in_starting_and_running_are_restarted_and_the_run_finishes[apex_dqn]"
LONE = S + "test_a_lone_synchronous_actor_killed_mid_run_comes_back_and_the_learner_steps_past_its_round"
RUN_RESTART = S + "test_a_lost_learner_0_or_memory_0_restarts_the_whole_run_from_its_checkpoint"
BUDGET = S + "test_a_run_whose_restart_budget_is_spent_fails_naming_every_cause"
ROUNDS = "tests/runtime/test_sync_rounds.py::"
JOIN_LATER = (
    "tests/runtime/test_barrier.py::test_a_participant_joining_at_a_later_generation_is_not_waited_for_before_it"
)

MUTANTS = [
    dict(
        name="restart-refused-in-starting",
        path="aiorl/runtime/coordinator/roster.py",
        old="        if phase > Phase.RUNNING:\n",
        new="        if phase != Phase.RUNNING:\n",
        tests=[CHAOS_APEX],
    ),
    dict(
        name="restarts-off-by-default",
        path="aiorl/config/sections.py",
        old='every algorithm; 0: never. See aiorl/runtime/restart.py.",\n        default=10,',
        new='every algorithm; 0: never. See aiorl/runtime/restart.py.",\n        default=0,',
        tests=[CHAOS_APEX],
    ),
    dict(
        name="barrier-waits-for-a-joiner-before-its-generation",
        path="aiorl/runtime/barrier.py",
        old="        return {p for p in self.participants if self._joins.get(p, 0) <= generation}\n",
        new="        return set(self.participants)\n",
        tests=[JOIN_LATER],
    ),
    dict(
        name="rounds-never-close-a-round-everyone-left",
        path="aiorl/runtime/rounds.py",
        old="        while self.iteration < iteration and not self.final and not self.aggregate.missing:\n",
        new="        while False:\n",
        tests=[ROUNDS + "test_a_round_every_actor_is_away_from_waits_then_closes_empty_when_one_joins_a_later_one"],
    ),
    dict(
        name="rounds-part-of-an-away-actor-is-a-protocol-error",
        path="aiorl/runtime/rounds.py",
        old="(iteration == self.iteration and actor_index in self.dropped)",
        new="False",
        tests=[ROUNDS + "test_a_part_of_an_away_actor_for_a_round_that_went_on_without_it_is_stale"],
    ),
    dict(
        name="memory-takes-an-actor-whose-connection-ended-for-gone",
        path="aiorl/runtime/memory/rounds_store.py",
        old="        elif not any(other.name == link.name and not other.closed for other in self.actor_links):\n"
        "            self._actor_away(link.index)\n",
        new="        elif not any(other.name == link.name and not other.closed for other in self.actor_links):\n"
        "            self._actor_finished(link.index)\n",
        tests=[LONE],
    ),
    dict(
        name="learner-ends-at-a-round-every-actor-was-away-from",
        path="aiorl/runtime/learner.py",
        old="            if not parts and (final or self.phase > Phase.RUNNING):\n",
        new="            if not parts:\n",
        tests=[LONE],
    ),
    dict(
        name="restarted-sync-actor-starts-at-iteration-0",
        path="aiorl/runtime/actor.py",
        old='        iteration = int(self.registration.get("iteration", 0))\n',
        new="        iteration = 0\n",
        tests=[LONE],
    ),
    dict(
        name="run-restarts-off-by-default",
        path="aiorl/config/sections.py",
        old='"with the coordinator); 0: never. See aiorl/launch/attempts.py.",\n        default=2,',
        new='"with the coordinator); 0: never. See aiorl/launch/attempts.py.",\n        default=0,',
        tests=[RUN_RESTART + "[learner-0-dppo_cartpole-475.0]"],
    ),
    dict(
        name="run-restart-cause-takes-restartable-roles",
        path="aiorl/launch/local.py",
        old='                if not restartable(kind, index, self.policy.synchronous) and role.get("status") == status:\n',
        new='                if restartable(kind, index, self.policy.synchronous) and role.get("status") == status:\n',
        tests=[RUN_RESTART + "[learner-0-dppo_cartpole-475.0]"],
    ),
    dict(
        name="run-restart-budget-off-by-one",
        path="aiorl/launch/attempts.py",
        old="            if cause is None or len(attempts) > budget:\n",
        new="            if cause is None or len(attempts) >= budget:\n",
        tests=[BUDGET],
    ),
    dict(
        name="memory-0-keeps-pythons-signal-handling-while-it-starts",
        path="aiorl/runtime/process.py",
        old='        loop.add_signal_handler(sig, coordinator.interrupt, signal.Signals(sig).name, "memory-0")\n',
        new="        pass\n",
        tests=[
            "tests/runtime/test_coordinator.py::test_a_signal_while_memory_0_still_starts_stops_the_run_through_its_coordinator"
        ],
    ),
    dict(
        name="actor-sends-non-finite-priorities-of-diverged-weights",
        path="aiorl/runtime/actor.py",
        old="        if bad.any():\n            bad = np.count_nonzero(bad)\n",
        new="        if False:\n            bad = np.count_nonzero(bad)\n",
        tests=["tests/learning/test_apex_learning.py::test_an_actor_whose_weights_overflow_ends_the_run"],
    ),
    dict(
        name="diverged-weights-restart-the-actor",
        path="aiorl/runtime/role.py",
        old="class DivergedWeights(FatalToRun):",
        new="class DivergedWeights(RuntimeError):",
        tests=["tests/learning/test_apex_learning.py::test_an_actor_whose_weights_overflow_ends_the_run"],
    ),
    dict(
        name="a-held-role-is-not-held",
        path="aiorl/runtime/hold.py",
        old="    if name not in held_names(environ):\n",
        new="    if True:\n",
        tests=[CHAOS_APEX],
    ),
    dict(
        name="a-restarted-role-is-held-again",
        path="aiorl/launch/local.py",
        old="            env.pop(ENV_HOLD, None)\n",
        new="            pass\n",
        tests=[CHAOS_APEX],
    ),
]
