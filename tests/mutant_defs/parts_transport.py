"""Mutants of "parts that own their state", the transport (its first point): the transport is
chosen in one place (aiorl/runtime/transport.py) from the config, and every serve()/connect()
takes its arguments from there. Each breaks one decision of that seam, or one call site's use
of it, and a test must catch it."""

T = "tests/runtime/test_transport.py::"
EACH_CONFIG = T + "test_each_config_gives_its_serve_and_connect_args"
RING_SIZE = T + "test_the_ring_size_comes_from_the_config_never_from_the_environment"
NO_SOCKET = T + "test_a_server_without_a_socket_hands_out_no_rings_and_a_peer_without_one_is_reached_over_tcp"
LAUNCHER_OWN = T + "test_the_launchers_own_connections_use_the_socket_and_never_rings"
SPELLED = T + "test_no_serve_or_connect_outside_the_seam_and_wire_spells_out_its_transport"
READERS = T + "test_only_the_seam_reads_the_ring_choice"
LOCAL_RUN = "tests/wire/test_sockets.py::test_a_local_runs_roles_and_restarts_connect_over_unix_sockets_and_status_answers_there"

MUTANTS = [
    dict(
        name="transport-ignores-unix-sockets-off",
        path="aiorl/runtime/transport.py",
        old="    unix = cfg.cluster.unix_sockets and local_sockets.enabled(environ)\n",
        new="    unix = local_sockets.enabled(environ)\n",
        tests=[EACH_CONFIG],
    ),
    dict(
        name="transport-ring-size-not-the-configs",
        path="aiorl/runtime/transport.py",
        old="ring_bytes=cfg.cluster.shm_ring_bytes if rings else None)",
        new="ring_bytes=shm.DEFAULT_RING_BYTES if rings else None)",
        tests=[RING_SIZE],
    ),
    dict(
        name="server-without-a-socket-asks-for-rings",
        path="aiorl/runtime/transport.py",
        old='            "rings": unix_path is not None and self.ring_bytes is not None,\n',
        new='            "rings": self.ring_bytes is not None,\n',
        tests=[NO_SOCKET],
    ),
    dict(
        name="client-takes-a-ring-listener-that-is-not-there",
        path="aiorl/runtime/transport.py",
        old="            ring = ring if os.path.exists(ring) else None\n",
        new="            pass\n",
        tests=[NO_SOCKET],
    ),
    dict(
        name="client-takes-a-peer-socket-that-is-not-there",
        path="aiorl/runtime/transport.py",
        old="        return path if os.path.exists(path) else None\n",
        new="        return path\n",
        tests=[NO_SOCKET],
    ),
    dict(
        name="launchers-own-connections-get-rings",
        path="aiorl/runtime/transport.py",
        old="SOCKETS_ONLY = Transport(unix_sockets=True)\n",
        new="SOCKETS_ONLY = Transport(unix_sockets=True, ring_bytes=1 << 20)\n",
        tests=[LAUNCHER_OWN],
    ),
    dict(
        name="status-spells-out-its-socket-again",
        path="aiorl/cli/status.py",
        old="                **SOCKETS_ONLY.connect_args(unix_path),\n",
        new="                unix_path=unix_path,\n",
        tests=[SPELLED],
    ),
    dict(
        name="launcher-hands-out-the-ring-size-again",
        path="aiorl/launch/local.py",
        old='            env[local_sockets.ENV_ON] = "1"\n',
        new='            env[local_sockets.ENV_ON] = "1"\n            env["AIORL_SHM_RING_BYTES"] = str(self.cfg.cluster.shm_ring_bytes)\n',
        tests=[READERS],
    ),
    dict(
        name="control-channel-never-uses-the-coordinators-ring",
        path="aiorl/runtime/control.py",
        old="                    **self.transport.connect_args(self.unix_path),\n",
        new="                    **SOCKETS_ONLY.connect_args(self.unix_path),\n",
        tests=[LOCAL_RUN],
    ),
]
