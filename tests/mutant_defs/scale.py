"""Mutants of the coordinator's scale fixes (issue 14): each breaks one behaviour its tests pin."""

MUTANTS = [
    dict(
        name="totals-add-instead-of-difference",
        path="aiorl/runtime/coordinator/counters.py",
        old="            totals[key] += counters.get(key, 0) - old.get(key, 0)",
        new="            totals[key] += counters.get(key, 0)",
        tests=["tests/runtime/test_scale.py::test_run_totals_follow_each_roles_counters_through_a_restart"],
    ),
    dict(
        name="totals-not-kept-on-heartbeat",
        path="aiorl/runtime/coordinator/handlers.py",
        old="            self.counters.set_counters(record, accepted)",
        new="            record.counters = accepted",
        tests=["tests/runtime/test_scale.py::test_run_totals_follow_each_roles_counters_through_a_restart"],
    ),
    dict(
        name="broadcast-reads-record-conn-late",
        path="aiorl/runtime/coordinator/pushes.py",
        old="        targets = [r.conn for r in self.roles.values() if r.conn is not None]\n"
        "        await asyncio.gather(*(send(conn) for conn in targets))",
        new="        targets = [r for r in self.roles.values() if r.conn is not None]\n\n"
        "        async def send_late(record):  # the code before the fix: reads record.conn when it runs\n"
        "            await send(record.conn)\n\n"
        "        await asyncio.gather(*(send_late(r) for r in targets))",
        tests=[
            "tests/runtime/test_scale.py::test_a_broadcast_survives_a_connection_closing_while_its_sends_are_scheduled"
        ],
    ),
    dict(
        name="status-roles-left-in-header",
        path="aiorl/runtime/coordinator/service.py",
        old='roles = pack_table(status.pop("roles"))',
        new='roles = pack_table(status["roles"])',
        tests=["tests/runtime/test_scale.py::test_status_of_a_cluster_too_big_for_one_frame_header"],
    ),
    dict(
        name="status-roles-not-unpacked",
        path="aiorl/cli/status.py",
        old='    if "roles" in reply.arrays:',
        new="    if False:",
        tests=["tests/runtime/test_scale.py::test_status_of_a_cluster_too_big_for_one_frame_header"],
    ),
    dict(
        name="packed-table-any-dtype",
        path="aiorl/runtime/messages.py",
        old="array.dtype != np.uint8 or array.ndim != 1",
        new="array.ndim != 1",
        tests=["tests/runtime/test_scale.py::test_packed_tables_round_trip_and_anything_else_is_a_bad_message"],
    ),
    dict(
        name="lag-quantile-one-bucket-high",
        path="aiorl/runtime/looplag.py",
        old="        if seen >= rank and n:",
        new="        if seen > rank and n:",
        tests=["tests/runtime/test_scale.py::test_loop_lag_quantiles_are_bucket_upper_edges_within_ten_percent"],
    ),
    dict(
        name="lag-probe-not-in-status",
        path="aiorl/runtime/coordinator/report.py",
        old='            "loop_lag": self.liveness.lag_probe.snapshot(),\n',
        new="",
        tests=[
            "tests/runtime/test_scale.py::test_status_of_a_cluster_too_big_for_one_frame_header",
            "tests/runtime/test_scale.py::test_bench_scale_64_actors_no_false_lost_verdict_every_heartbeat_answered",
        ],
    ),
    dict(
        name="attach-gives-up-on-a-slow-handshake",
        path="aiorl/runtime/role.py",
        old="            except (ServerBusy, TimeoutError):",
        new="            except ServerBusy:",
        tests=[
            "tests/runtime/test_scale.py::test_attaching_retries_a_handshake_that_timed_out_and_fails_at_once_on_a_refusal"
        ],
    ),
]
