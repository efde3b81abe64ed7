"""Mutants of the Ray launcher (issue 14): each breaks one behaviour its tests pin."""

T = "tests/cluster/test_ray_launcher.py::"
SIGTERM = T + "test_sigterm_to_the_driver_stops_the_run_cleanly_and_leaves_nothing"

MUTANTS = [
    dict(
        name="ray-missing-not-checked",
        path="aiorl/experiment/preflight.py",
        old='    if cfg.cluster.launcher == "ray":\n        _check_ray()\n',
        new='    if cfg.cluster.launcher == "ray":\n        pass\n',
        tests=[T + "test_missing_ray_is_one_line_and_exit_2"],
    ),
    dict(
        name="ray-node-token-leaks-into-roles",
        path="aiorl/launch/ray_launcher.py",
        old="env = {key: value for key, value in os.environ.items() if key != TOKEN_ENV}",
        new="env = dict(os.environ)",
        tests=[SIGTERM],
    ),
    dict(
        name="ray-signal-not-forwarded",
        path="aiorl/launch/ray_launcher.py",
        old="            self.host.signal.remote(int(signum))",
        new="            pass",
        tests=[SIGTERM],
    ),
    dict(
        name="ray-memories-packed",
        path="aiorl/launch/placement.py",
        old='GROUP_STRATEGY = {"memory": "SPREAD", "learner": "PACK"}',
        new='GROUP_STRATEGY = {"memory": "PACK", "learner": "PACK"}',
        tests=[SIGTERM],
    ),
    dict(
        name="ray-custom-resources-dropped",
        path="aiorl/launch/placement.py",
        old='    bundle.update({name: float(amount) for name, amount in (spec.get("resources") or {}).items()})',
        new="",
        tests=[T + "test_role_resources_become_bundles_and_actor_options"],
    ),
    dict(
        name="ray-unshared-run-dir-taken",
        path="aiorl/launch/ray_launcher.py",
        old='            "shared": owner.get("run_id") == run_id and launch_id in launches,\n',
        new='            "shared": True,\n',
        tests=[T + "test_a_run_dir_that_nodes_do_not_share_is_refused_before_any_role_starts"],
    ),
    dict(
        name="ray-node-loss-unseen",
        path="aiorl/launch/ray_launcher.py",
        old="            self.node_lost = True\n",
        new="            self.node_lost = False\n",
        tests=[T + "test_removing_a_worker_node_ends_the_run_naming_the_loss"],
    ),
    dict(
        name="ray-launcher-flag-ignored",
        path="aiorl/cli/main.py",
        old='            args.set.append(f"cluster.launcher={args.launcher}")',
        new="            pass",
        tests=[SIGTERM],
    ),
    dict(
        name="ray-unknown-role-kind-taken",
        path="aiorl/launch/placement.py",
        old="        if kind not in KINDS:",
        new="        if False:",
        tests=[T + "test_bad_launcher_keys_are_config_errors_naming_the_key"],
    ),
    dict(
        name="ray-unreachable-address-not-probed",
        path="aiorl/launch/ray_launcher.py",
        old='    if not sep or not port.isdigit() or "://" in address:',
        new="    if True:",
        tests=[T + "test_an_unreachable_ray_address_is_one_line_and_exit_2"],
    ),
    dict(
        name="ray-role-inherits-blocked-sigint",
        path="aiorl/launch/ray_launcher.py",
        old="    signal.pthread_sigmask(signal.SIG_SETMASK, set())\n",
        new="",
        tests=[T + "test_a_second_signal_kills_every_role_and_leaves_nothing"],
    ),
]
