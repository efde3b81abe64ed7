"""Mutants of the value checks (issue 29, point 3) at the memory host, in V-trace and in the
learner: each lets through one value the tests in tests/runtime/test_values.py pin."""

V = "tests/runtime/test_values.py::"
ACTIONS = V + "test_actions_outside_the_discrete_space_are_dropped_counted_and_the_connection_stays"
FLOATS = V + "test_non_finite_floats_are_dropped_and_counted"
FRAMES = V + "test_frame_layout_rows_are_dropped_and_their_frames_kept_for_later_messages"
ES = V + "test_es_noise_indices_off_the_table_and_non_finite_returns_are_dropped"
FRAGMENTS = V + "test_fragments_with_bad_values_or_an_unpublished_version_are_dropped"
ASKS = V + "test_a_memory_host_that_has_not_heard_of_a_version_asks_before_it_drops"
VTRACE = V + "test_vtrace_lets_a_nan_importance_ratio_through"
POISONED = V + "test_a_learner_drops_a_batch_holding_non_finite_values_and_goes_on"
DIVERGED = V + "test_a_non_finite_loss_on_finite_data_still_fails_the_learner"
PEER = V + "test_a_learner_drops_the_step_its_data_parallel_peer_could_not_take"
PEER_CORE = "tests/algos/test_apex_data_parallel.py::test_nan_loss_stops_every_learner"

MUTANTS = [
    dict(
        name="discrete-actions-unbounded",
        path="aiorl/runtime/algorithm.py",
        old='            if not hasattr(space, "n"):  # not Discrete',
        new="            if True:",
        tests=[ACTIONS],
    ),
    dict(
        name="floats-not-checked",
        path="aiorl/runtime/messages.py",
        old='name: None for name, (dtype, _) in self.fields.items() if dtype.kind == "f"',
        new="name: None for name, (dtype, _) in self.fields.items() if False",
        tests=[FLOATS],
    ),
    dict(
        name="infinities-pass-as-finite",
        path="aiorl/runtime/messages.py",
        old="                if math.isfinite(low) and math.isfinite(high):",
        new="                if not (math.isnan(low) or math.isnan(high)):",
        tests=[FLOATS],
    ),
    dict(
        name="batch-rows-kept-whatever-their-values",
        path="aiorl/runtime/memory/replay_store.py",
        old="        keep = self.tally.good_values(link, self.rows, arrays, n)\n        if keep is not None:\n",
        new="        keep = None\n        if keep is not None:\n",
        tests=[FRAMES, ACTIONS, FLOATS],
    ),
    dict(
        name="priorities-not-dropped-with-their-rows",
        path="aiorl/runtime/memory/replay_store.py",
        old="            priorities = None if priorities is None else priorities[keep]",
        new="            priorities = priorities",
        tests=[ACTIONS],
    ),
    dict(
        name="rejected-rows-not-counted-on-the-role",
        path="aiorl/runtime/memory/tally.py",
        old="        link.rows_rejected += bad\n        self.rows_rejected += bad\n        self.log_peer(",
        new="        link.rows_rejected += bad\n        self.log_peer(",
        tests=[ACTIONS],
    ),
    dict(
        name="rollout-rows-kept-whatever-their-values",
        path="aiorl/runtime/memory/rounds_store.py",
        old="        keep = self.tally.good_values(link, self.rows, arrays, n)\n        if keep is not None:  # the part",
        new="        keep = None\n        if keep is not None:  # the part",
        tests=[ES],
    ),
    dict(
        name="es-noise-index-up-to-the-table-end",
        path="aiorl/algos/es.py",
        old='"noise_index": (0, self.cfg.model.noise_table_size - self.dim)}',
        new='"noise_index": (0, self.cfg.model.noise_table_size - 1)}',
        tests=[ES],
    ),
    dict(
        name="es-noise-index-unbounded",
        path="aiorl/algos/es.py",
        old='return {**super().value_bounds(), "noise_index": (0, self.cfg.model.noise_table_size - self.dim)}',
        new="return super().value_bounds()",
        tests=[ES],
    ),
    dict(
        name="fragment-values-unchecked",
        path="aiorl/runtime/fragments.py",
        old="            bad, fields = (values.bad_rows(rows) if values is not None else None) or (None, [])",
        new="            bad, fields = None, []",
        tests=[FRAGMENTS],
    ),
    dict(
        name="fragments-of-unpublished-versions-kept",
        path="aiorl/runtime/memory/queue_store.py",
        old="        unpublished = version > self._newest_version() and version > await self._published_version()",
        new="        unpublished = False",
        tests=[FRAGMENTS],
    ),
    dict(
        name="memory-host-drops-what-it-has-not-heard-of",
        path="aiorl/runtime/memory/role.py",
        old='        reply = await self._request_or_lost("get_weights", {"have": MAX_COUNT})  # the version, no weights\n'
        '        self.weights_version_seen = max(self.weights_version_seen, int(reply.meta.get("version", -1)))\n',
        new="",
        tests=[ASKS],
    ),
    dict(
        name="vtrace-clip-turns-nan-into-the-bound",
        path="aiorl/_ext/vtrace.pyx",
        old="    return bound if x > bound else x",
        new="    return x if x < bound else bound",
        tests=[VTRACE, POISONED],
    ),
    dict(
        name="poisoned-batch-fails-the-learner",
        path="aiorl/runtime/learner.py",
        old="            if not (holds_non_finite(batch) or isinstance(exc, PeerNotFinite)):",
        new="            if not isinstance(exc, PeerNotFinite):",
        tests=[POISONED],
    ),
    dict(
        name="diverged-learner-drops-its-batches",
        path="aiorl/runtime/learner.py",
        old="            if not (holds_non_finite(batch) or isinstance(exc, PeerNotFinite)):",
        new="            if False:",
        tests=[DIVERGED],
    ),
    dict(
        name="a-peers-poisoned-batch-fails-this-learner",
        path="aiorl/runtime/learner.py",
        old="            if not (holds_non_finite(batch) or isinstance(exc, PeerNotFinite)):",
        new="            if not holds_non_finite(batch):",
        tests=[PEER],
    ),
    dict(
        name="peer-not-finite-is-a-plain-floating-point-error",
        path="aiorl/algos/lib/common.py",
        old="        raise PeerNotFinite(",
        new="        raise FloatingPointError(",
        tests=[PEER_CORE],
    ),
    dict(
        name="dropped-batch-keeps-its-credit",
        path="aiorl/runtime/learner.py",
        old="_source(m), exc)\n            return False",
        new="_source(m), exc)\n            return True",
        tests=[POISONED],
    ),
]
