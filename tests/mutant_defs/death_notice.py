"""Mutants of "a dead child is noticed at once" (issue 30): the launcher's exit notices, who may
send one, and what the coordinator does with it; each breaks one piece a test in
tests/runtime/test_death_notice.py pins (in process, or over real role processes)."""

T = "tests/runtime/test_death_notice.py::"
COORDINATOR = T + "test_the_launcher_alone_reports_exits_and_only_the_registered_process_is_lost"
UNREACHABLE = T + "test_an_unreachable_coordinator_leaves_the_notices_queued_and_the_launcher_free"
FORGOTTEN = T + "test_a_pid_that_exited_unregistered_is_remembered_only_while_its_registration_could_come"
RESTARTED = T + "test_a_sigkilled_actor_is_lost_at_once_with_its_exit_and_restarted"
BARRIER = T + "test_a_sigkilled_actor_leaves_the_synchronous_barrier_at_once"

MUTANTS = [
    dict(
        name="notice-pid-check-dropped",
        path="aiorl/runtime/coordinator/notices.py",
        old="        if record.pid != pid:\n",
        new="        if False:\n",
        tests=[COORDINATOR],
    ),
    dict(
        name="notice-accepted-from-any-peer-named-launcher",
        path="aiorl/runtime/coordinator/service.py",
        old="        refusal = self.notices.refusal(conn)\n        if refusal is not None:  # named as the launcher",
        new="        refusal = None\n        if refusal is not None:  # named as the launcher",
        tests=[COORDINATOR, RESTARTED],
    ),
    dict(
        name="notice-accepted-from-a-role",
        path="aiorl/runtime/coordinator/handlers.py",
        old="        await self.notices.refuse_request(conn, msg, record.name, self.notices.refusal(conn))\n",
        new='        outcome, reason = self.notices.heard(self.roster.roles.get(fields["role"]), fields)\n'
        "        if reason is not None:\n"
        '            self.mark(self.roster.roles[fields["role"]], "lost", reason)\n'
        '        await conn.reply(msg, meta={"outcome": outcome})\n',
        tests=[COORDINATOR],
    ),
    dict(
        name="notice-launcher-pid-not-checked",
        path="aiorl/runtime/coordinator/notices.py",
        old="        if conn.peer_pid != self.launcher_pid:\n",
        new="        if False:\n",
        tests=[COORDINATOR, RESTARTED],
    ),
    dict(
        name="notice-unix-peer-pid-not-recorded",
        path="aiorl/wire/protocol.py",
        old="            self.peer_pid = unix.peer_pid(sock)\n",
        new="",
        tests=[COORDINATOR],
    ),
    dict(
        name="notice-verdict-without-its-consequences",
        path="aiorl/runtime/coordinator/notices.py",
        old="                lose(record, reason, abort=True)\n",
        new='                record.status, record.reason = "lost", reason  # no consequences\n',
        tests=[COORDINATOR],
    ),
    dict(
        name="notice-ignored-while-disconnected",
        path="aiorl/runtime/coordinator/notices.py",
        old='        if record.status not in ("running", "disconnected"):\n',
        new='        if record.status not in ("running",):\n',
        tests=[COORDINATOR],
    ),
    dict(
        name="notice-exited-pid-may-still-register",
        path="aiorl/runtime/coordinator/registration.py",
        old='        reason = self.notices.exited(name, meta.get("pid"))\n',
        new="        reason = None\n",
        tests=[COORDINATOR],
    ),
    dict(
        name="notice-exited-pid-remembered-for-ever",
        path="aiorl/runtime/coordinator/notices.py",
        old="        if at is not None and self.clock() - at <= self.remember_s:\n",
        new="        if at is not None:\n",
        tests=[FORGOTTEN],
    ),
    dict(
        name="notice-not-sent",
        path="aiorl/launch/local.py",
        old="            self.notices.child_exited(child.name, child.pid, code)\n",
        new="",
        tests=[RESTARTED, BARRIER],
    ),
    dict(
        name="notice-connection-never-opened",
        path="aiorl/launch/local.py",
        old="            self.notices.start(self.coordinator_unix)\n",
        new="",
        tests=[RESTARTED],
    ),
    dict(
        name="notice-launcher-connects-under-another-name",
        path="aiorl/launch/notices.py",
        old="                            name=LAUNCHER_PEER,\n",
        new='                            name="actor-0",\n',
        tests=[RESTARTED],
    ),
    dict(
        name="notice-signal-sent-as-an-exit-code",
        path="aiorl/runtime/restart.py",
        old='        return {"role": name, "pid": pid, "signal": -returncode}\n',
        new='        return {"role": name, "pid": pid, "exit_code": -returncode}\n',
        tests=[UNREACHABLE, RESTARTED],
    ),
]
