"""Mutants of the memory host's stores behind one interface (issue "Parts that own their state",
first point): each breaks a rule tests/runtime/test_memory_stores.py pins (the store chosen from
what the algorithm declares, the role only calling the interface, classes owning their state)."""

S = "tests/runtime/test_memory_stores.py::"
DECLARED = S + "test_each_store_is_built_from_what_the_algorithm_declares"
NEVER_ASKS = S + "test_the_role_never_asks_which_store_it_has"
FOURTH = S + "test_a_fourth_store_plugged_in_through_the_builder_is_served"
OWNED = S + "test_no_class_of_the_memory_host_reads_a_self_attribute_it_does_not_own"

MUTANTS = [
    dict(
        name="builder_ignores_the_registered_stores",
        path="aiorl/runtime/memory/build.py",
        old="    return next(cls for cls in STORES if cls.wanted(cfg))",
        new="    return next(cls for cls in (RoundsStore, QueueStore, ReplayStore) if cls.wanted(cfg))",
        tests=[FOURTH],
    ),
    dict(
        name="queue_store_wanted_for_replay",
        path="aiorl/runtime/memory/queue_store.py",
        old="        return cfg.algorithm.fragment_queue(cfg) is not None",
        new="        return True",
        tests=[DECLARED],
    ),
    dict(
        name="role_summary_without_the_stores_own_keys",
        path="aiorl/runtime/memory/role.py",
        old="            **store,  # queue, rounds\n",
        new="",
        tests=[FOURTH],
    ),
    dict(
        name="store_never_told_of_phases",
        path="aiorl/runtime/memory/role.py",
        old="            self.store.on_phase(phase)",
        new="            pass",
        tests=[FOURTH],
    ),
    dict(
        name="store_never_told_of_an_actors_end",
        path="aiorl/runtime/memory/role.py",
        old="            self.store.actor_closed(link)",
        new="            pass",
        tests=[FOURTH],
    ),
    dict(
        name="rounds_store_forgets_its_actor_count",
        path="aiorl/runtime/memory/rounds_store.py",
        old="        self.actors = actors  # cluster.actors: when every one finished, the last round closes\n",
        new="",
        tests=[OWNED],
    ),
    dict(
        name="replay_store_asks_its_buffer_which_it_is",
        path="aiorl/runtime/memory/replay_store.py",
        old='        return {"replay_frames": len(self.replay.pool)} if self.frames else {}',
        new='        return {"replay_frames": len(self.replay.pool)} if isinstance(self.replay, FrameReplayBuffer) else {}',
        tests=[NEVER_ASKS],
    ),
]
