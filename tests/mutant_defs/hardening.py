"""Mutants of issue 13's hardening (hostile peers and edge cases); each was checked by hand."""

MUTANTS = [
    dict(
        name="client-skips-server-mac",
        path="aiorl/wire/auth.py",
        old='if not hmac.compare_digest(_field(meta, "mac", MAC_BYTES), self._mac(b"server")):',
        new="if False:",
        tests=[
            "tests/wire/test_wire_handshake.py::test_client_sends_nothing_after_a_bogus_server_mac",
            "tests/wire/test_wire_handshake.py::test_the_client_checks_the_servers_mac_and_then_says_nothing",
        ],
    ),
    dict(
        name="server-proves-first",
        path="aiorl/wire/auth.py",
        old='            return [Send(self._frame(FrameType.CHALLENGE, {"name": self.name, "nonce": self._nonce}))]\n',
        new='            return [\n                Send(\n                    self._frame(\n                        FrameType.CHALLENGE, {"name": self.name, "nonce": self._nonce, "mac": self._mac(b"server")}\n                    )\n                )\n            ]\n',
        tests=[
            "tests/wire/test_wire_handshake.py::test_the_server_gives_no_mac_before_the_client_proved",
        ],
    ),
    dict(
        name="peer-name-prefix-match",
        path="aiorl/wire/names.py",
        old="return type(name) is str and _PEER_NAME.fullmatch(name) is not None",
        new="return type(name) is str and _PEER_NAME.match(name) is not None",
        tests=[
            "tests/wire/test_wire_handshake.py::test_bad_peer_names_are_refused_and_never_echoed_raw",
            "tests/wire/test_wire_handshake.py::test_forged_name_reaches_no_log_line",
        ],
    ),
    dict(
        name="no-connection-admission",
        path="aiorl/wire/protocol.py",
        old="        if self._admit is not None:\n            refusal = self._admit(self)",
        new="        if False:\n            refusal = self._admit(self)",
        tests=[
            "tests/cluster/test_cluster_hostile.py::test_connection_flood_under_a_low_open_file_limit",
        ],
    ),
    dict(
        name="session-unchecked",
        path="aiorl/runtime/memory/role.py",
        old="        reason = await self._check_session(name, session)",
        new="        reason = None",
        tests=[
            "tests/runtime/test_memory_hostile.py::test_phantom_and_duplicate_names_are_refused_and_counted",
            "tests/runtime/test_memory_hostile.py::test_a_new_registration_of_a_name_replaces_the_old_connection",
        ],
    ),
    dict(
        name="duplicate-attach-allowed",
        path="aiorl/runtime/memory/role.py",
        old="            if hmac.compare_digest(held[1], session):",
        new="            if False:",
        tests=[
            "tests/runtime/test_memory_hostile.py::test_phantom_and_duplicate_names_are_refused_and_counted",
        ],
    ),
    dict(
        name="credit-beta-unchecked",
        path="aiorl/runtime/messages.py",
        old='        "beta": (number(0.0, 1.0), False),\n',
        new='        "beta": (number(), False),\n',
        tests=[
            "tests/runtime/test_memory_hostile.py::test_a_bad_credit_closes_that_connection_and_the_memory_host_keeps_serving",
        ],
    ),
    dict(
        name="sampler-not-watched",
        path="aiorl/runtime/memory/role.py",
        old='        sampler = self.spawn(self.store.serve(conn, link, index), f"sampler for {link.name}")\n',
        new="        sampler = asyncio.ensure_future(self.store.serve(conn, link, index))\n",
        tests=[
            "tests/runtime/test_memory_hostile.py::test_a_dead_sampler_fails_the_memory_host_and_the_run_through_the_phases",
        ],
    ),
    dict(
        name="non-finite-priority-rows-kept",
        path="aiorl/runtime/memory/replay_store.py",
        old="            if good is None or good.all():\n                raise  # not the priorities",
        new="            if True:\n                raise  # not the priorities",
        tests=[
            "tests/runtime/test_memory_hostile.py::test_non_finite_priorities_drop_those_rows_and_keep_the_connection",
        ],
    ),
    dict(
        name="priorities-not-clipped",
        path="aiorl/_ext/buffers.pyx",
        old="v[j] = (p[j] if p[j] < _MAX_PRIORITY else _MAX_PRIORITY) + self.eps",
        new="v[j] = p[j] + self.eps",
        tests=[
            "tests/replay/test_replay_prioritized.py::test_huge_priorities_are_clipped_to_max_priority",
            "tests/runtime/test_memory_hostile.py::test_huge_priorities_are_clipped_so_new_rows_stay_sampleable",
        ],
    ),
    dict(
        name="sumtree-overflow-not-undone",
        path="aiorl/_ext/sumtree.pyx",
        old="                if not isfinite(self._total_value):",
        new="                if False:",
        tests=[
            "tests/kernels/test_sumtree.py::test_finite_values_whose_sum_overflows_are_refused_untouched",
        ],
    ),
    dict(
        name="weights-read-during-a-step",
        path="aiorl/runtime/learner.py",
        old='self._publish = self.spawn(self._publish_weights(self.core.get_weights()), "weights publish")',
        new='self._publish = self.spawn(self._publish_weights(), "weights publish")',
        tests=[
            "tests/runtime/test_learner_runtime.py::test_published_weights_are_never_torn_between_two_steps",
        ],
    ),
    dict(
        name="beta-by-own-learner-steps",
        path="aiorl/runtime/learner.py",
        old="            frac = self.total_steps / self.budget_share",
        new="            frac = self.total_steps / a.scheduled_global_steps",
        tests=[
            "tests/runtime/test_learner_runtime.py::test_beta_anneals_over_the_runs_learner_steps_not_this_learners",
            "tests/runtime/test_learner_runtime.py::test_two_learners_reach_the_final_beta_when_the_run_ends",
        ],
    ),
    dict(
        name="store-binds-every-interface",
        path="aiorl/runtime/rendezvous.py",
        old="        store = dist.TCPStore(host, port, world, True, timeout, master_listen_fd=sock.detach())\n",
        new="        sock.close()\n        store = dist.TCPStore(host, port, world, True, timeout)\n",
        tests=[
            "tests/wire/test_rendezvous.py::test_store_and_gloo_listen_on_the_learners_address_only",
        ],
    ),
    dict(
        name="epsilons-per-actor-only",
        path="aiorl/algos/apex_dqn.py",
        old="    return np.array([actor_epsilon(first + e, slots, eps, alpha) for e in range(num_envs)])",
        new="    return np.array([actor_epsilon(actor_index, num_actors, eps, alpha)] * num_envs)",
        tests=[
            "tests/algos/test_apex_dqn.py::test_epsilons_spread_over_every_env_slot",
        ],
    ),
]
