"""Mutants of "idle sockets lock nobody out" (issue 29, point 4): each breaks one piece that a
test in tests/test_sockets.py pins over real sockets."""

T = "tests/test_sockets.py::"
SILENT_CLOSED = T + "test_a_silent_connection_is_closed_after_first_bytes_timeout_not_the_handshake_deadline"
SILENT_FLOOD = T + "test_silent_sockets_held_and_reopened_cannot_hold_the_per_host_slots"
STALLED = T + "test_a_stalled_handshake_keeps_its_slot_while_young_and_gives_it_up_when_slow"
STATUS_RETRIES = T + "test_aiorl_status_waits_out_a_busy_refusal"
CONFIG = T + "test_first_bytes_timeout_out_of_range_is_a_one_line_config_error"
CONFIGURED = T + "test_the_coordinator_and_memory_host_serve_with_the_configured_first_bytes_timeout"
NEVER_REGISTER = T + "test_authenticated_connections_that_never_register_or_attach_are_closed"

MUTANTS = [
    dict(
        name="silent-connection-keeps-its-slot-for-the-handshake-deadline",
        path="aiorl/wire/protocol.py",
        old="if self._server and first is not None and first < self._handshake_timeout_s:",
        new="if False:",
        tests=[SILENT_CLOSED],
    ),
    dict(
        name="first-bytes-not-noticed",
        path="aiorl/wire/protocol.py",
        old="                if self.silent:\n                    self.silent = False\n",
        new="                if False:\n                    self.silent = False\n",
        tests=[SILENT_CLOSED],
    ),
    dict(
        name="silent-sockets-never-give-up-their-slot",
        path="aiorl/wire/connection.py",
        old="            if proto.silent:\n                return proto\n",
        new="            if False:\n                return proto\n",
        tests=[SILENT_FLOOD],
    ),
    dict(
        name="stalled-handshakes-never-give-up-their-slot",
        path="aiorl/wire/connection.py",
        old="            if now - proto.connected_at >= self.first_bytes_timeout_s:",
        new="            if False:",
        tests=[STALLED],
    ),
    dict(
        name="young-handshakes-evicted-too",
        path="aiorl/wire/connection.py",
        old="            if now - proto.connected_at >= self.first_bytes_timeout_s:",
        new="            if True:",
        tests=[STALLED],
    ),
    dict(
        name="status-gives-up-at-the-first-busy",
        path="aiorl/cli/status.py",
        old="        except ServerBusy:\n            if loop.time() + delay > deadline:",
        new="        except ZeroDivisionError:\n            if loop.time() + delay > deadline:",
        tests=[STATUS_RETRIES],
    ),
    dict(
        name="first-bytes-timeout-unchecked",
        path="aiorl/config/checks.py",
        old="        0 < c.first_bytes_timeout_s <= 60,",
        new="        True,",
        tests=[CONFIG],
    ),
    dict(
        name="register-has-no-deadline",
        path="aiorl/runtime/coordinator/registration.py",
        old="msg, fields = await first_request(conn, deadline - loop.time())",
        new="msg, fields = await first_request(conn, 1e9)",
        tests=[NEVER_REGISTER],
    ),
    dict(
        name="each-status-request-restarts-the-register-deadline",
        path="aiorl/runtime/coordinator/registration.py",
        old="msg, fields = await first_request(conn, deadline - loop.time())",
        new="msg, fields = await first_request(conn, self.cfg.cluster.coordinator_timeout_s)",
        tests=[NEVER_REGISTER],
    ),
    dict(
        name="attach-has-no-deadline",
        path="aiorl/runtime/memory/role.py",
        old='await first_request(conn, c.coordinator_timeout_s, {"attach"})',
        new='await first_request(conn, 1e9, {"attach"})',
        tests=[NEVER_REGISTER],
    ),
    dict(
        name="coordinator-ignores-first-bytes-timeout-config",
        path="aiorl/runtime/coordinator/service.py",
        old="            first_bytes_timeout_s=c.first_bytes_timeout_s,\n",
        new="",
        tests=[CONFIGURED],
    ),
    dict(
        name="memory-host-ignores-first-bytes-timeout-config",
        path="aiorl/runtime/memory/role.py",
        old="            first_bytes_timeout_s=c.first_bytes_timeout_s,\n",
        new="",
        tests=[CONFIGURED],
    ),
]
