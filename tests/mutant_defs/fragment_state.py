"""Mutants of issue #26, last point (a recurrent IMPALA fragment carries its state once, at its
first step: per-fragment fields in the message, the queue, the limits and the learner's batch).

Each is a plausible bug in the code written for it; the tests named here must fail on it.
Run them with `.venv/bin/python tests/mutants.py --only fragment_state`.
"""

QUEUE = "tests/replay/test_trajectory_queue.py"
REC = "tests/algos/test_recurrent.py"
MEMORY = "tests/runtime/test_impala_memory.py::test_a_recurrent_fragments_state_is_once_per_fragment_or_the_connection_is_closed"
LIMITS = (
    "tests/algos/test_impala.py::test_a_fragment_message_a_batch_of_fragments_and_the_weights_fit_their_frame_limits"
)

MUTANTS = [
    dict(
        name="queue_checks_a_per_fragment_field_but_not_its_count",
        path="aiorl/replay/trajectory_queue.py",
        old="            if array.shape != (n,) + shape:",
        new="            if array.shape[1:] != shape:",
        tests=[QUEUE, REC],
    ),
    dict(
        name="queue_gathers_per_fragment_fields_in_slot_order",
        path="aiorl/replay/trajectory_queue.py",
        old="        return {name: storage[slots] for name, storage in self._storage.items()}",
        new=(
            "        return {name: storage[slots] if name in self.spec else storage[sorted(slots)]"
            " for name, storage in self._storage.items()}"
        ),
        tests=[QUEUE],
    ),
    dict(
        name="frame_queue_forgets_the_per_fragment_fields",
        path="aiorl/replay/trajectory_queue.py",
        old="        super().__init__(capacity, layout.wire_spec(spec), steps, full, per_fragment)",
        new="        super().__init__(capacity, layout.wire_spec(spec), steps, full)",
        tests=[QUEUE],
    ),
    dict(
        name="actor_sends_the_last_steps_state",
        path="aiorl/algos/impala.py",
        old="        if self.recurrent and not self.steps:",
        new="        if self.recurrent:",
        tests=[REC],
    ),
    dict(
        name="memory_host_queue_without_the_per_fragment_fields",
        path="aiorl/runtime/memory/queue_store.py",
        old="            per_fragment=algo.per_fragment_spec(),\n",
        new="",
        tests=[MEMORY],
    ),
    dict(
        name="memory_host_lets_a_non_finite_state_through",
        path="aiorl/runtime/memory/build.py",
        old="    rows = RowSpec({**wire, **algo.per_fragment_spec()}, bounds=algo.value_bounds())",
        new="    rows = RowSpec(wire, bounds=algo.value_bounds())",
        tests=[MEMORY],
    ),
    dict(
        name="learner_limit_leaves_out_the_per_fragment_bytes",
        path="aiorl/runtime/frame_limits.py",
        old="            + once[0]\n",
        new="",
        tests=[LIMITS],
    ),
    dict(
        name="actor_limit_leaves_out_the_per_fragment_bytes",
        path="aiorl/runtime/frame_limits.py",
        old="        return _limits(_payload(rows, spec, 8, 1) + once[0], len(spec) + 1 + once[1])",
        new="        return _limits(_payload(rows, spec, 8, 1), len(spec) + 1 + once[1])",
        tests=[LIMITS],
    ),
]
