"""Mutants of the fork server (`aiorl.cli.forkserver`, the test suite's warm template for spawners):
each breaks one thing a forked spawner must share with the launcher that asked for it, or the
rule that it forks only for a client it can stand in for (tests/runtime/test_forkserver.py)."""

F = "tests/runtime/test_forkserver.py::"
STATE = F + "test_a_launch_forks_its_spawner_from_the_server_with_the_launchers_state"
REFUSED = F + "test_a_client_with_another_import_time_environment_is_refused_and_starts_its_own"
SERVER = "aiorl/cli/forkserver.py"

MUTANTS = [
    dict(
        name="forkserver-forks-for-a-client-with-another-environment",
        path=SERVER,
        old='    if message.get("fingerprint") != fingerprint:\n',
        new="    if False:\n",
        tests=[REFUSED],
    ),
    dict(
        name="forked-spawner-keeps-the-servers-working-directory",
        path=SERVER,
        old='    os.chdir(message["cwd"])\n',
        new="",
        tests=[STATE],
    ),
    dict(
        name="forked-spawner-keeps-the-servers-environment",
        path=SERVER,
        old='    os.environ.clear()\n    os.environ.update(message["env"])\n',
        new="",
        tests=[STATE],
    ),
    dict(
        name="forked-spawner-keeps-the-servers-umask",
        path=SERVER,
        old='    os.umask(int(message["umask"]))\n',
        new="",
        tests=[STATE],
    ),
    dict(
        name="forked-spawner-stays-in-the-servers-session",
        path=SERVER,
        old="    os.setsid()\n",
        new="",
        tests=[STATE],
    ),
    dict(
        name="a-launch-never-asks-the-forkserver",
        path="aiorl/runtime/warm_fork.py",
        old="    forked = spawner_from_forkserver(path) if path else None\n",
        new="    forked = None\n",
        tests=[STATE],
    ),
]
