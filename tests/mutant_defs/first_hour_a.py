"""Mutants of issue 15, first half (errors, config reference, Python API, roles by hand, README).

Each was applied by hand, its tests run and seen to fail, then reverted.
"""

SWEEP = "tests/tooling/test_cli_errors.py::test_a_users_mistake_is_one_line_and_exit_2"
BY_HAND = "tests/cluster/test_by_hand.py::test_each_role_by_hand_writes_a_complete_run_directory_of_its_kind"
SHARED = (
    "tests/cluster/test_by_hand.py::test_roles_by_hand_share_one_run_dir_without_clobbering_and_refuse_another_config"
)

MUTANTS = [
    dict(
        name="max-episode-steps-0-accepted",
        path="aiorl/config/checks.py",
        old="        e.max_episode_steps is None or e.max_episode_steps >= 1,\n",
        new="        e.max_episode_steps is None or e.max_episode_steps >= 0,\n",
        tests=[f"{SWEEP}[max-episode-steps-0]"],
    ),
    dict(
        name="algo-not-required",
        path="aiorl/experiment/loading.py",
        old="    if cfg.algo is None:\n",
        new="    if False:\n",
        tests=[f"{SWEEP}[no-algo]"],
    ),
    dict(
        name="overrides-mutate-the-callers-mapping",
        path="aiorl/experiment/loading.py",
        old="raw = copy.deepcopy(dict(data)) if data is not None",
        new="raw = dict(data) if data is not None",
        tests=["tests/tooling/test_api.py::test_run_refuses_a_bad_config_before_anything_starts"],
    ),
    dict(
        name="cwd-not-on-sys-path",
        path="aiorl/envs/gym.py",
        old="        sys.path.append(cwd)\n",
        new="        pass\n",
        tests=["tests/tooling/test_api.py::test_custom_env_from_the_current_directory_gets_its_kwargs"],
    ),
    dict(
        name="env-class-not-made-directly",
        path="aiorl/envs/gym.py",
        old="    return gym.envs.registration.EnvSpec(id=name, entry_point=entry)",
        new="    return env_id",
        tests=[
            "tests/tooling/test_api.py::test_custom_env_from_the_current_directory_gets_its_kwargs[my_envs:Corridor]"
        ],
    ),
    dict(
        name="role-port-0-not-checked",
        path="aiorl/experiment/by_hand.py",
        old='    if c.port == 0 and not (kind == "memory" and index == 0):',
        new="    if False and c.port == 0:",
        tests=[f"{SWEEP}[role-with-port-0]"],
    ),
    dict(
        name="shared-dir-takes-another-config",
        path="aiorl/experiment/by_hand.py",
        old="    if theirs != cfg.config_hash():",
        new="    if False:",
        tests=[SHARED],
    ),
    dict(
        name="rerun-writes-over-earlier-results",
        path="aiorl/experiment/by_hand.py",
        old="    if earlier:\n",
        new="    if False:\n",
        tests=[SHARED],
    ),
    dict(
        name="no-console-lines-by-hand",
        path="aiorl/runtime/process.py",
        old="    if console:\n",
        new="    if False:\n",
        tests=[BY_HAND],
    ),
    dict(
        name="policy-shape-not-checked",
        path="aiorl/evaluation/policies.py",
        old="    if have != want:",
        new="    if False:",
        tests=[f"{SWEEP}[eval-wrong-observation-shape]"],
    ),
    dict(
        name="signal-handlers-in-any-thread",
        path="aiorl/launch/local.py",
        old="in_main = threading.current_thread() is threading.main_thread()",
        new="in_main = True",
        tests=["tests/tooling/test_api.py::test_run_from_a_thread_blocks_and_returns_the_summary"],
    ),
    dict(
        name="ctrl-c-traceback",
        path="aiorl/cli/main.py",
        old="    except KeyboardInterrupt:\n",
        new="    except SystemExit:\n",
        tests=["tests/tooling/test_cli_errors.py::test_ctrl_c_during_start_up_prints_no_traceback"],
    ),
    dict(
        name="readme-metric-name-drifts",  # the metrics paragraph moved from the README to the site (issue 27)
        path="docs/getting-started/plots.md",
        old="`learner/losses/td_loss`",
        new="`learner/td_loss`",
        tests=["tests/tooling/test_readme.py::test_metric_names_the_readme_and_the_pages_give_are_real_keys"],
    ),
]
