"""Mutants of "idle sockets lock nobody out" (issue 29, point 4): each breaks one piece that a
test in tests/wire/test_sockets.py pins over real sockets."""

T = "tests/wire/test_sockets.py::"
SILENT_CLOSED = T + "test_a_silent_connection_is_closed_after_first_bytes_timeout_not_the_handshake_deadline"
SILENT_FLOOD = T + "test_silent_sockets_held_and_reopened_cannot_hold_the_per_host_slots"
STALLED = T + "test_a_stalled_handshake_keeps_its_slot_while_young_and_gives_it_up_when_slow"
STATUS_RETRIES = T + "test_aiorl_status_waits_out_a_busy_refusal"
CONFIG = T + "test_first_bytes_timeout_out_of_range_is_a_one_line_config_error"
CONFIGURED = T + "test_the_coordinator_and_memory_host_serve_with_the_configured_first_bytes_timeout"
NEVER_REGISTER = T + "test_authenticated_connections_that_never_register_or_attach_are_closed"
# Point 4d: a local run over Unix sockets, the peer's uid checked.
LOCAL_UNIX = T + "test_a_local_runs_roles_and_restarts_connect_over_unix_sockets_and_status_answers_there"
OTHER_UID = T + "test_a_unix_peer_of_another_uid_is_refused_before_the_handshake"
UID_CHECK = T + "test_the_uid_check_reads_the_peers_credentials"
STATUS_UNIX = T + "test_aiorl_status_of_a_run_directory_asks_over_its_unix_socket_on_this_host_only"
TOO_DEEP = T + "test_a_run_directory_too_deep_for_a_socket_path_falls_back_to_tcp_and_says_so_once"
LAUNCHER_ENV = T + "test_only_the_local_launcher_turns_unix_sockets_on_and_cluster_unix_sockets_turns_them_off"

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
        path="aiorl/runtime/coordinator/service.py",
        old="first = await self._first_request(conn, deadline - loop.time())",
        new="first = await self._first_request(conn, 1e9)",
        tests=[NEVER_REGISTER],
    ),
    dict(
        name="each-status-request-restarts-the-register-deadline",
        path="aiorl/runtime/coordinator/service.py",
        old="first = await self._first_request(conn, deadline - loop.time())",
        new="first = await self._first_request(conn, self.cfg.cluster.coordinator_timeout_s)",
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
    dict(
        name="unix-peers-not-screened",
        path="aiorl/wire/connection.py",
        old="        if not proto.unix:\n            return None\n        refusal = check_peer(",
        new="        if True:\n            return None\n        refusal = check_peer(",
        tests=[OTHER_UID],
    ),
    dict(
        name="uid-check-trusts-any-known-uid",
        path="aiorl/wire/unix.py",
        old="    if uid == expected_uid:\n        return None",
        new="    if uid is not None:\n        return None",
        tests=[OTHER_UID, UID_CHECK],
    ),
    dict(
        name="roles-reach-the-coordinator-over-tcp",
        path="aiorl/runtime/role.py",
        old="            unix_path=self.coordinator_unix_path(),\n",
        new="            unix_path=None,\n",
        tests=[LOCAL_UNIX],
    ),
    dict(
        name="memory-0-reaches-its-own-coordinator-over-tcp",
        path="aiorl/runtime/memory/role.py",
        old="            return self.transport.peer_socket(local.server.unix_path)",
        new="            return None",
        tests=[LOCAL_UNIX],
    ),
    dict(
        name="roles-attach-to-memory-hosts-over-tcp",
        path="aiorl/runtime/role.py",
        old="unix_path = self.transport.peer_socket(address[2] if len(address) > 2 else None)",
        new="unix_path = None",
        tests=[LOCAL_UNIX],
    ),
    dict(
        name="coordinator-drops-the-memory-hosts-socket-path",
        path="aiorl/runtime/coordinator/registration.py",
        old="return (str(address[0]), int(address[1]), *address[2:]) if address else None",
        new="return (str(address[0]), int(address[1])) if address else None",
        tests=[LOCAL_UNIX],
    ),
    dict(
        name="launcher-keeps-the-coordinators-socket-to-itself",
        path="aiorl/launch/local.py",
        old="                self.coordinator_unix = unix if isinstance(unix, str) else None\n",
        new="",
        tests=[LOCAL_UNIX],
    ),
    dict(
        name="status-asks-over-tcp",
        path="aiorl/cli/status.py",
        old="        unix_path = unix_socket_of(run_dir) if run_dir is not None else None",
        new="        unix_path = None",
        tests=[STATUS_UNIX],
    ),
    dict(
        name="status-uses-a-socket-of-another-host",
        path="aiorl/cli/status.py",
        old=' or address.get("hostname") != socket.gethostname() or ',
        new=" or ",
        tests=[STATUS_UNIX],
    ),
    dict(
        name="too-long-socket-path-not-noticed",
        path="aiorl/runtime/local_sockets.py",
        old="    if not fits(path):",
        new="    if False:",
        tests=[TOO_DEEP],
    ),
    dict(
        name="too-long-socket-path-said-every-time",
        path="aiorl/runtime/local_sockets.py",
        old="        if not _said_too_long:",
        new="        if True:",
        tests=[TOO_DEEP],
    ),
    dict(
        name="unix-sockets-cannot-be-turned-off",
        path="aiorl/launch/local.py",
        old="        if self.cfg.cluster.unix_sockets:",
        new="        if True:",
        tests=[LAUNCHER_ENV],
    ),
    dict(
        name="unix-sockets-inherited-from-the-launchers-environment",
        path="aiorl/launch/local.py",
        old="env = {k: v for k, v in environ.items() if k not in ours}",
        new="env = {k: v for k, v in environ.items() if True}",
        tests=[LAUNCHER_ENV],
    ),
]
