"""Mutants of the coordinator's admission part (`aiorl.runtime.coordinator.registration`): each
breaks one decision the tests in tests/runtime/test_admission.py pin as a value."""

T = "tests/runtime/test_admission.py::"
RESTART = T + "test_a_restart_admitted_in_running_joins_the_iteration_after_the_newest_weights_and_memories_hear"
FIRST_REJOIN = T + "test_a_first_start_a_rejoin_and_a_moved_memory_host"
R = "aiorl/runtime/coordinator/registration.py"

MUTANTS = [
    dict(
        name="admission-restart-joins-the-iteration-of-the-newest-weights",
        path=R,
        old="        return max(0, self.params.weights_version + 1)\n",
        new="        return max(0, self.params.weights_version)\n",
        tests=[RESTART],
    ),
    dict(
        name="admission-memories-hear-of-every-synchronous-actor",
        path=R,
        old='        if self.admitted_as != "restart" or self.joins_iteration is None:\n',
        new="        if self.joins_iteration is None:\n",
        tests=[FIRST_REJOIN],
    ),
    dict(
        name="admission-any-roles-address-moves-the-memories",
        path=R,
        old='            moved=record.kind == "memory" and address != record.address,\n',
        new="            moved=address != record.address,\n",
        tests=[FIRST_REJOIN],
    ),
    dict(
        name="admission-a-rejoin-gets-a-new-session",
        path=R,
        old='        if admission.admitted_as != "rejoin" or record.session is None:\n',
        new="        if True:\n",
        tests=[FIRST_REJOIN],
    ),
    dict(
        name="admission-misconfigured-refused-as-if-it-came-late",
        path=R,
        old="            return Admission(name, reason=reason, misconfigured=True)\n",
        new="            return Admission(name, reason=reason)\n",
        tests=[T + "test_a_misconfigured_process_is_refused_for_the_user_to_fix"],
    ),
    dict(
        name="admission-does-not-wait-for-a-predecessor-that-looks-alive",
        path=R,
        old="            await self.roster.await_replaced(record)\n",
        new="            pass\n",
        tests=[T + "test_a_new_process_is_admitted_once_its_predecessor_is_found_lost_meanwhile"],
    ),
    dict(
        name="admission-restart-keeps-the-old-incarnation",
        path=R,
        old="            self.roster.restarted(record, admission.incarnation)\n",
        new="            self.roster.restarted(record, record.incarnation)\n",
        tests=[RESTART],
    ),
]
