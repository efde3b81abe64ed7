"""Mutants of issue 44's trust boundary: who the fork server and its clients trust, the working
directory on sys.path after a `module:Env` import, `aiorl status` escaping what a run directory
holds, and what a config file may be (size, expanded size, duplicate keys); each was checked by hand."""

TRUST = "tests/runtime/test_forkserver_trust.py::"
ENVPATH = "tests/runtime/test_env_import_path.py::"
STATUS = "tests/tooling/test_status_escapes.py::"
YAML = "tests/tooling/test_yaml_limits.py::"
CLIENT = "aiorl/runtime/warm_fork.py"
SERVER = "aiorl/cli/forkserver.py"
FILES = "aiorl/config/files.py"

MUTANTS = [
    dict(
        name="forkserver-client-trusts-a-socket-of-another-uid",
        path=CLIENT,
        old="        if st.st_uid not in owners:\n",
        new="        if False:\n",
        tests=[TRUST + "test_the_client_sends_nothing_to_a_socket_of_another_uid"],
    ),
    dict(
        name="forkserver-client-trusts-a-socket-others-may-write-to",
        path=CLIENT,
        old="        if st.st_mode & 0o022:\n",
        new="        if False:\n",
        tests=[TRUST + "test_the_client_sends_nothing_to_a_socket_others_may_write_to"],
    ),
    dict(
        name="forkserver-client-checks-no-path",
        path=CLIENT,
        old="    why = forkserver_path_refusal(path)\n",
        new="    why = None\n",
        tests=[
            TRUST + "test_the_client_sends_nothing_to_a_socket_of_another_uid",
            TRUST + "test_the_client_sends_nothing_to_a_socket_others_may_write_to",
        ],
    ),
    dict(
        name="forkserver-client-trusts-a-server-of-another-uid",
        path=CLIENT,
        old="            if server_uid != os.getuid():\n",
        new="            if False:\n",
        tests=[TRUST + "test_the_client_sends_nothing_to_a_server_running_as_another_uid"],
    ),
    dict(
        name="forkserver-client-takes-any-pid",
        path=CLIENT,
        old="    if _parent_of(forked.pid) != server_pid:",
        new="    if False:",
        tests=[TRUST + "test_the_client_never_takes_a_pid_that_is_not_the_servers_child"],
    ),
    dict(
        name="forkserver-serves-clients-of-another-uid",
        path=SERVER,
        old="        if uid != os.getuid():\n",
        new="        if False:\n",
        tests=[TRUST + "test_the_server_answers_no_client_of_another_uid"],
    ),
    dict(
        name="forkserver-serves-on-any-path",
        path=SERVER,
        old="    why = forkserver_path_refusal(argv[0], bound=os.path.lexists(argv[0]))\n",
        new="    why = None\n",
        tests=[TRUST + "test_the_server_refuses_a_path_others_may_write_to"],
    ),
    dict(
        name="forkserver-waits-on-each-client-in-turn",
        path=SERVER,
        old="                    self.accept()\n",
        new="                    self.accept()\n                    if self.pending:\n                        self.answer(next(reversed(self.pending)))\n",
        tests=[TRUST + "test_a_silent_client_holds_up_no_other"],
    ),
    dict(
        name="forkserver-keeps-silent-clients-for-ever",
        path=SERVER,
        old="                self.drop(conn)\n",
        new="                pass\n",
        tests=[TRUST + "test_a_silent_client_is_dropped_after_its_time"],
    ),
    dict(
        name="forkserver-leaves-its-socket-behind",
        path=SERVER,
        old="        remove_socket(path, ours)\n",
        new="        pass\n",
        tests=[TRUST + "test_the_socket_goes_when_the_server_ends"],
    ),
    dict(
        name="forkserver-ends-on-sigterm-without-cleaning-up",
        path=SERVER,
        old="    for sig in (signal.SIGTERM, signal.SIGHUP):\n        signal.signal(sig, ended)\n",
        new="    pass\n",
        tests=[TRUST + "test_the_socket_goes_when_the_server_ends"],
    ),
    dict(
        name="forkserver-cannot-take-over-a-stale-socket",
        path=SERVER,
        old="            os.unlink(path)  # a server that was SIGKILLed left it\n",
        new="            pass\n",
        tests=[TRUST + "test_a_socket_left_by_a_killed_server_is_taken_over"],
    ),
    dict(
        name="module-env-leaves-the-working-directory-on-sys-path",
        path="aiorl/envs/gym.py",
        old="        if added and cwd in sys.path:\n            sys.path.remove(cwd)\n",
        new="        pass\n",
        tests=[ENVPATH + "test_making_a_module_env_leaves_sys_path_as_it_was"],
    ),
    dict(
        name="status-prints-run-directory-strings-raw",
        path="aiorl/cli/status.py",
        old="    print(printable(text), file=file or sys.stdout)",
        new="    print(text, file=file or sys.stdout)",
        tests=[STATUS + "test_a_finished_runs_summary_is_printed_escaped"],
    ),
    dict(
        name="status-lets-c1-controls-through",
        path="aiorl/cli/status.py",
        old="\\x7f-\\x9f",
        new="\\x7f",
        tests=[STATUS + "test_a_finished_runs_summary_is_printed_escaped"],
    ),
    dict(
        name="yaml-duplicate-keys-override-silently",
        path=FILES,
        old="            if identity in seen:\n",
        new="            if False:\n",
        tests=[YAML + "test_a_key_given_twice_in_yaml_is_refused_at_any_depth"],
    ),
    dict(
        name="json-duplicate-keys-override-silently",
        path=FILES,
        old="        return unique_json.loads(text)\n",
        new="        return json.loads(text)\n",
        tests=[YAML + "test_a_key_given_twice_in_json_is_refused_at_any_depth"],
    ),
    dict(
        name="yaml-aliases-expand-without-bound",
        path=FILES,
        old="    if size > MAX_CONFIG_VALUES:\n",
        new="    if False:\n",
        tests=[YAML + "test_an_alias_bomb_is_refused_before_it_is_built"],
    ),
    dict(
        name="yaml-alias-of-itself-recurses",
        path=FILES,
        old="    if id(node) in open_nodes:\n",
        new="    if False:\n",
        tests=[YAML + "test_an_alias_of_itself_is_refused"],
    ),
    dict(
        name="config-file-read-whatever-its-size",
        path=FILES,
        old="    if size > MAX_CONFIG_BYTES:\n",
        new="    if False:\n",
        tests=[YAML + "test_a_file_over_the_cap_is_refused_unread"],
    ),
    dict(
        name="set-override-parsed-without-limits",
        path=FILES,
        old="            value = load_yaml(raw) if raw.strip() else None\n",
        new="            value = yaml.safe_load(raw) if raw.strip() else None\n",
        tests=[YAML + "test_an_alias_bomb_in_a_set_override_is_refused"],
    ),
]
