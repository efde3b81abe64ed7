"""Mutants of the warm spawner (issue 30): each breaks one thing that makes a forked role behave
like a process started on its own, or one rule of who may ask the spawner for what; a test in
tests/runtime/test_spawner.py (or test_coordinator.py, for a stop during start-up) catches each."""

T = "tests/runtime/test_spawner.py::"
SESSIONS = T + "test_every_role_is_a_child_of_one_spawner_in_a_session_of_its_own"
LAUNCHER_KILLED = T + "test_killing_the_launcher_outright_leaves_no_process"
SPAWNER_KILLED = T + "test_a_spawner_killed_outright_takes_every_role_with_it"
EVAL_WORKER = T + "test_the_evaluation_worker_is_forked_and_dies_with_its_learner"
OFF_CONFIG = T + "test_the_off_switch_starts_each_role_on_its_own[config]"
OFF_ENV = T + "test_the_off_switch_starts_each_role_on_its_own[environment]"
RESTART = T + "test_a_killed_actor_is_forked_again_and_the_run_finishes"
CLIENT_KINDS = T + "test_a_client_other_than_the_launcher_may_fork_only_an_evaluation_worker"
FOREIGN_PID = T + "test_a_signal_for_a_pid_that_is_not_the_clients_child_is_ignored"
ENV_UNSET = T + "test_a_role_started_without_the_unix_sockets_has_none_though_the_launcher_had_the_variable"
OWN_ADDRESS = T + "test_a_forked_role_takes_only_this_launchs_coordinator_address"
THREADS = T + "test_the_spawner_forks_with_no_thread_beyond_numpys_own"
LEARNER_IMPORTS = T + "test_the_spawner_imports_what_the_algorithms_learner_core_needs_before_it_forks"
ENTRY = T + "test_the_command_starts_a_spawner_first_only_for_a_local_run"
CHILD_GC = T + "test_a_forked_child_collects_over_the_frozen_heap_the_spawner_shares"
STOP_IN_START = (
    "tests/runtime/test_coordinator.py::test_a_stop_during_start_up_ends_the_run_without_waiting_for_the_start_timeout"
)

MUTANTS = [
    dict(
        name="forked-role-shares-the-spawners-session",
        path="aiorl/launch/spawner.py",
        old="        os.setsid()\n        set_parent_death_signal(signal.SIGTERM)",
        new="        set_parent_death_signal(signal.SIGTERM)",
        tests=[SESSIONS],
    ),
    dict(
        name="forked-role-outlives-the-spawner",
        path="aiorl/launch/spawner.py",
        old="        os.setsid()\n        set_parent_death_signal(signal.SIGTERM)",
        new="        os.setsid()",
        tests=[LAUNCHER_KILLED, SPAWNER_KILLED],
    ),
    dict(
        name="spawner-outlives-the-launcher",
        path="aiorl/runtime/warm_fork.py",
        old="        preexec_fn=lambda: set_parent_death_signal(signal.SIGTERM),",
        new="",
        tests=[LAUNCHER_KILLED],
    ),
    dict(
        name="evaluation-worker-outlives-its-learner",
        path="aiorl/launch/spawner.py",
        old="                if orphan in self.children:\n                    os.kill(orphan, signal.SIGKILL)",
        new="                pass",
        tests=[EVAL_WORKER],
    ),
    dict(
        name="evaluation-worker-started-on-its-own",
        path="aiorl/runtime/eval_worker.py",
        old="        if channel is not None:\n            self.proc = _fork_worker(channel, args)",
        new="        if False:\n            self.proc = _fork_worker(channel, args)",
        tests=[EVAL_WORKER],
    ),
    dict(
        name="config-switch-ignored",
        path="aiorl/launch/spawner.py",
        old="    return bool(cfg.cluster.warm_spawner)",
        new="    return True",
        tests=[OFF_CONFIG],
    ),
    dict(
        name="environment-switch-ignored",
        path="aiorl/launch/spawner.py",
        old="    return bool(cfg.cluster.warm_spawner) if switch is None else switch\n",
        new="    return bool(cfg.cluster.warm_spawner)\n",
        tests=[OFF_ENV],
    ),
    dict(
        name="restart-not-told-the-port",
        path="aiorl/launch/local.py",
        old='            if self.port is None and (kind, index) != ("memory", 0):',
        new='            if (kind, index) != ("memory", 0):',
        tests=[RESTART],
    ),
    dict(
        name="any-client-may-fork-anything",
        path="aiorl/launch/spawner.py",
        old="            if kind not in allowed:",
        new='            if kind not in ("role", "eval_worker"):',
        tests=[CLIENT_KINDS],
    ),
    dict(
        name="signal-to-any-pid",
        path="aiorl/launch/spawner.py",
        old="            if self.children.get(pid) is sock:  # only its own, only before it was reaped",
        new="            if True:",
        tests=[FOREIGN_PID],
    ),
    dict(
        name="environment-removals-not-applied",
        path="aiorl/launch/spawner.py",
        old='        for key in env.get("unset", ()):\n            os.environ.pop(key, None)',
        new="",
        tests=[ENV_UNSET],
    ),
    dict(
        name="coordinator-address-of-any-launch",
        path="aiorl/launch/spawner.py",
        old="        if data is not None and identity.owns(data):",
        new="        if data is not None:",
        tests=[OWN_ADDRESS],
    ),
    dict(
        name="spawner-runs-a-torch-op-before-forking",
        path="aiorl/cli/spawner.py",
        old="    import uvloop  # noqa: F401\n",
        new="    import uvloop  # noqa: F401\n\n    torch.ones(1 << 16).add_(1)\n",
        tests=[THREADS],
    ),
    dict(
        name="stop-during-start-up-waits-for-the-start-timeout",
        path="aiorl/runtime/coordinator/service.py",
        old="                    await self._started_or_stopped()",
        new="                    await self.started.wait()",
        tests=[STOP_IN_START],
    ),
    dict(
        name="a-forked-role-keeps-the-collector-off",
        path="aiorl/launch/spawner.py",
        old="        if pid == 0:  # the child: nothing below returns\n            gc.enable()\n",
        new="        if pid == 0:  # the child: nothing below returns\n",
        tests=[CHILD_GC],
    ),
    dict(
        name="the-spawners-heap-not-frozen-before-a-fork",
        path="aiorl/launch/spawner.py",
        old="    gc.freeze()\n",
        new="",
        tests=[CHILD_GC],
    ),
    dict(
        name="the-entry-starts-a-spawner-for-a-role",
        path="aiorl/cli/entry.py",
        old='    if not argv or argv[0] != "run" or "--role" in argv or "-h" in argv or "--help" in argv:\n',
        new='    if not argv or argv[0] != "run" or "-h" in argv or "--help" in argv:\n',
        tests=[ENTRY],
    ),
    dict(
        name="the-entry-ignores-the-environment-switch",
        path="aiorl/cli/entry.py",
        old="    return switch_from_env() is not False\n",
        new="    return True\n",
        tests=[ENTRY],
    ),
    dict(
        name="spawner-never-computes-what-the-roles-share",
        path="aiorl/launch/spawner.py",
        old="        shared = self._fork_prefork(config) if self.prefork is not None else None\n",
        new="        shared = None\n",
        tests=["tests/runtime/test_spawner.py::test_es_roles_share_the_noise_table_the_spawner_drew_before_forking"],
    ),
    dict(
        name="es-roles-draw-their-own-noise-table-though-the-spawner-drew-it",
        path="aiorl/algos/es.py",
        old="        preforked = _PREFORKED.get(noise_key(seed, size))\n",
        new="        preforked = None\n",
        tests=[
            "tests/algos/test_es.py::test_a_table_drawn_before_the_fork_is_the_one_each_role_reads",
            "tests/runtime/test_spawner.py::test_es_roles_share_the_noise_table_the_spawner_drew_before_forking",
        ],
    ),
    dict(
        name="prefork-arrays-mapped-past-their-memfd",
        path="aiorl/launch/spawner.py",
        old='        if entry["offset"] + count * dtype.itemsize > size:\n',
        new="        if False:\n",
        tests=["tests/runtime/test_spawner.py::test_prefork_arrays_come_back_from_a_memfd_equal_read_only_and_shared"],
    ),
    dict(
        name="a-deterministic-runs-spawner-leaves-torchs-deterministic-imports-to-the-roles",
        path="aiorl/experiment/preflight.py",
        old="spawner.ready(cfg.algo, deterministic=cfg.run.deterministic)",
        new="spawner.ready(cfg.algo)",
        tests=[T + "test_a_deterministic_run_finds_what_torchs_deterministic_mode_imports_in_its_spawner"],
    ),
    dict(
        name="the-spawner-ignores-a-deterministic-run",
        path="aiorl/cli/spawner.py",
        old="    if deterministic:\n        # torch.use_deterministic_algorithms",
        new="    if False:\n        # torch.use_deterministic_algorithms",
        tests=[T + "test_a_deterministic_run_finds_what_torchs_deterministic_mode_imports_in_its_spawner"],
    ),
    dict(
        name="prefork-empty-arrays-writable",
        path="aiorl/launch/spawner.py",
        old="            array.flags.writeable = False\n",
        new="            pass\n",
        tests=["tests/runtime/test_spawner.py::test_prefork_arrays_come_back_from_a_memfd_equal_read_only_and_shared"],
    ),
    dict(
        name="prefork-arrays-written-at-one-offset",
        path="aiorl/launch/spawner.py",
        old="        end += -(-array.nbytes // PREFORK_ALIGN) * PREFORK_ALIGN\n",
        new="        end = max(end, -(-array.nbytes // PREFORK_ALIGN) * PREFORK_ALIGN)\n",
        tests=["tests/runtime/test_spawner.py::test_prefork_arrays_come_back_from_a_memfd_equal_read_only_and_shared"],
    ),
]
