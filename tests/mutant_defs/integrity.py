"""Mutants of the integrity rules (issue 29) written beside the coordinator and the policy loader:
each breaks one rule the tests in tests/runtime/test_integrity.py pin."""

T = "tests/runtime/test_integrity.py::"
PLANTED = T + "test_a_run_started_beside_planted_code_never_runs_it"
COUNTERS = T + "test_each_counter_only_from_its_owner_only_growing_by_a_plausible_amount"
DOCTORED = T + "test_a_doctored_policy_runs_nothing_and_is_refused_in_one_line"

MUTANTS = [
    dict(
        name="roles-import-from-the-working-directory",
        path="aiorl/launch/local.py",
        old='args = ["-P", "-m", "aiorl", "run",',
        new='args = ["-m", "aiorl", "run",',
        tests=[PLANTED],
    ),
    dict(
        name="eval-worker-imports-from-the-working-directory",
        path="aiorl/runtime/eval_worker.py",
        old='                "-P",  # nothing from the working directory (see aiorl.launch.local)\n',
        new="",
        tests=[T + "test_an_evaluation_worker_started_without_a_spawner_never_runs_planted_code"],
    ),
    dict(
        name="registration-takes-the-claimed-name",
        path="aiorl/runtime/coordinator/registration.py",
        old="if reason is None and name != peer_name:",
        new="if False:",
        tests=[T + "test_a_role_registers_only_under_the_name_it_authenticated_with"],
    ),
    dict(
        name="any-role-sets-any-counter",
        path="aiorl/runtime/coordinator/counters.py",
        old="        if owner != record.kind:",
        new="        if False:",
        tests=[COUNTERS],
    ),
    dict(
        name="counters-may-go-down",
        path="aiorl/runtime/coordinator/counters.py",
        old="        elif value < old:",
        new="        elif False:",
        tests=[COUNTERS],
    ),
    dict(
        name="counters-may-jump",
        path="aiorl/runtime/coordinator/counters.py",
        old="        elif value - old > MAX_GROWTH[key] + MAX_GROWTH_PER_S[key] * dt:",
        new="        elif False:",
        tests=[COUNTERS],
    ),
    dict(
        name="run-state-from-any-role",
        path="aiorl/runtime/coordinator/handlers.py",
        old='        if record.name != "learner-0":\n            await reply_error(conn, msg, f"only learner-0 checkpoints',
        new='        if False:\n            await reply_error(conn, msg, f"only learner-0 checkpoints',
        tests=[COUNTERS],
    ),
    dict(
        name="episodes-from-any-role",
        path="aiorl/runtime/coordinator/handlers.py",
        old='if returns and record.kind == "actor":',
        new="if returns:",
        tests=[COUNTERS],
    ),
    dict(
        name="policy-archive-not-checked",
        path="aiorl/io/export.py",
        old="            check_policy_archive(path)\n",
        new="            pass\n",
        tests=[DOCTORED],
    ),
    dict(
        name="pickled-weights-allowed",
        path="aiorl/io/policy_archive.py",
        old='payload.get("use_pickle") is not False',
        new="False",
        tests=[DOCTORED],
    ),
    dict(
        name="any-node-target-allowed",
        path="aiorl/io/policy_archive.py",
        old='if key == "target" and isinstance(value, str) and not SAFE_TARGET.fullmatch(value):',
        new="if False:",
        tests=[DOCTORED],
    ),
    dict(
        name="any-name-in-a-shape-expression",
        path="aiorl/io/policy_archive.py",
        old="if ident is not None and ident not in EXPR_NAMES and not SYMBOL_NAME.fullmatch(ident):",
        new="if False:",
        tests=[DOCTORED],
    ),
    dict(
        name="sample-inputs-not-loaded-weights-only",
        path="aiorl/io/policy_archive.py",
        old="        torch.load(io.BytesIO(data), weights_only=True)\n",
        new="        pass\n",
        tests=[DOCTORED],
    ),
    dict(
        name="any-archive-entry-allowed",
        path="aiorl/io/policy_archive.py",
        old="if top != root or not ALLOWED_PATHS.fullmatch(rest):",
        new="if top != root:",
        tests=[DOCTORED],
    ),
    dict(
        name="a-launch-id-in-the-environment-is-trusted",
        path="aiorl/cli/main.py",
        old="    by_hand.check_launched(run_dir)\n",
        new="",
        tests=[T + "test_a_role_naming_a_launch_that_does_not_own_the_run_directory_is_refused"],
    ),
    dict(
        name="negative-seed-accepted",
        path="aiorl/config/checks.py",
        old="        0 <= r.seed <= 2**32 - 1,",
        new="        r.seed <= 2**32 - 1,",
        tests=[T + "test_a_negative_or_huge_seed_is_a_config_error"],
    ),
    dict(
        name="es-episode-without-a-step-cap",
        path="aiorl/algos/es.py",
        old="done = terminated or truncated or length >= self.m.episode_step_cap",
        new="done = terminated or truncated",
        tests=[T + "test_an_es_episode_ends_at_its_step_cap_where_the_env_has_no_time_limit"],
    ),
    dict(
        name="obs-norm-without-a-std-floor",
        path="aiorl/algos/lib/actor_critic.py",
        old="std = torch.sqrt(self.var + self.eps).clamp(min=self.std_floor)",
        new="std = torch.sqrt(self.var + self.eps)",
        tests=[T + "test_es_observation_normalization_floors_the_std"],
    ),
    dict(
        name="every-bad-message-logged",
        path="aiorl/runtime/memory/reading.py",
        old='            self._log_bad("closing connection of %s: bad message: %s", name, exc)',
        new='            self._log_bad.logger.error("closing connection of %s: bad message: %s", name, exc)',
        tests=[T + "test_bad_input_from_an_authenticated_peer_is_counted_every_time_and_logged_at_a_bounded_rate"],
    ),
]
