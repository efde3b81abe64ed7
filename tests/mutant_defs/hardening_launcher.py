"""Mutants of issue 44's faults that must end in the right place (the launcher's part): a role given
up while alive is ended, its group with it, and restarted; a finished run stays finished when an
actor that had nothing left to give is killed; an env error that repeats at the same point fails
the run at once; a start failure's cause reaches the console; internal variables never leak into a
new run or a restart; the prefork memfd is sealed. Each was checked by hand."""

END_RIGHT = "tests/cluster/test_faults_end_right.py"
STOPPED = f"{END_RIGHT}::test_an_actor_stopped_past_the_heartbeat_timeout_is_ended_and_replaced_and_the_run_finishes"
BUDGET = f"{END_RIGHT}::test_an_actor_killed_once_the_run_reached_its_budget_leaves_it_finished"
STALE = f"{END_RIGHT}::test_a_stale_resume_variable_in_the_shell_does_not_make_a_new_run_continue_another"
HELD = f"{END_RIGHT}::test_a_whole_run_restart_is_never_held"
REPEATS = f"{END_RIGHT}::test_an_env_error_that_repeats_at_the_same_point_fails_the_run_at_once_naming_it"
PORT = f"{END_RIGHT}::test_a_coordinator_port_in_use_is_named_on_the_console"
DELETED = f"{END_RIGHT}::test_a_run_directory_deleted_mid_run_ends_the_run_in_one_line"
SEALED = "tests/runtime/test_prefork_sealed.py"

MUTANTS = [
    dict(
        name="launcher-leaves-a-lost-role-running",
        path="aiorl/launch/local.py",
        old="            self._end_given_up()\n",
        new="",
        tests=[f"{STOPPED}[forked]"],
    ),
    dict(
        name="coordinator-never-names-a-lost-role-to-the-launcher",
        path="aiorl/runtime/coordinator/notices.py",
        old='if record.status != "lost" or type(record.pid) is not int or key in told:',
        new="if True:",
        tests=[f"{STOPPED}[forked]"],
    ),
    dict(
        name="a-kill-ends-a-forked-role-but-not-its-group",
        path="aiorl/launch/spawner.py",
        old="(os.killpg if signum == signal.SIGKILL else os.kill)(pid, signum)",
        new="os.kill(pid, signum)",
        tests=[f"{STOPPED}[forked]"],
    ),
    dict(
        name="a-kill-ends-a-role-of-its-own-process-but-not-its-group",
        path="aiorl/launch/children.py",
        old="        os.killpg(proc.pid, signal.SIGKILL)  # started with a session of its own: its pid is its group's\n",
        new="        proc.kill()\n",
        tests=[f"{STOPPED}[own-process]"],
    ),
    dict(
        name="an-actor-with-nothing-left-to-give-fails-a-finished-run",
        path="aiorl/launch/local.py",
        old="            and c.name not in spent\n",
        new="",
        tests=[BUDGET],
    ),
    dict(
        name="a-stale-resume-variable-reaches-the-roles",
        path="aiorl/launch/child_env.py",
        old="        ENV_RESUME_FROM,\n",
        new="",
        tests=[STALE],
    ),
    dict(
        name="a-whole-run-restart-is-held",
        path="aiorl/launch/local.py",
        old="if restart or self.whole_run_restart:",
        new="if restart:",
        tests=[HELD],
    ),
    dict(
        name="a-repeated-env-error-is-restarted-again",
        path="aiorl/runtime/role.py",
        old="fatal=isinstance(cause, FatalToRun) or again is not None",
        new="fatal=isinstance(cause, FatalToRun)",
        tests=[REPEATS],
    ),
    dict(
        name="a-repeated-failure-is-never-recognised",
        path="aiorl/runtime/repeated_failure.py",
        old="    before = read_json(path)\n",
        new="    before = None\n",
        tests=[REPEATS],
    ),
    dict(
        name="a-start-failure-says-only-see-log",
        path="aiorl/launch/local.py",
        old="{describe_exit(child.proc.returncode)}{child.cause()}; see",
        new="{describe_exit(child.proc.returncode)}; see",
        tests=[PORT],
    ),
    dict(
        name="the-prefork-memfd-is-not-sealed",
        path="aiorl/launch/spawner.py",
        old="    seal(fd)\n    size = os.fstat(fd).st_size\n",
        new="    size = os.fstat(fd).st_size\n",
        tests=[SEALED],
    ),
    dict(
        name="the-prefork-memfd-can-still-be-written",
        path="aiorl/launch/spawner.py",
        old='    getattr(fcntl, "F_SEAL_WRITE", 8)\n    | ',
        new="    ",
        tests=[SEALED],
    ),
    dict(
        name="a-deleted-run-directory-goes-unnoticed",
        path="aiorl/launch/local.py",
        old="            self._check_run_dir()\n",
        new="",
        tests=[DELETED],
    ),
]
