"""A real run (role processes over loopback TCP) against peers that attack it while it runs.

Each test starts `aiorl run`, attacks it from the test process (with the
run's own token where the attack needs one), then stops it with SIGINT and
checks that the run ended cleanly, that nothing the attacker sent joined it,
and what was counted and logged.
"""

from __future__ import annotations

import asyncio
import resource
import signal
import socket
import subprocess
import sys
import time

import pytest
from cluster_helpers import finish, last_metrics, read_json, wait_for, write_config
from configs import configured, random_cartpole

from aiorl.cli.status import fetch_status
from aiorl.experiment.loading import load_config
from aiorl.wire import RemoteError, connect, load_token
from aiorl.wire.auth import handshake_frame, new_nonce
from aiorl.wire.codec import FrameType

pytestmark = pytest.mark.cluster

CONFIG = configured(
    random_cartpole(1, 1, 1, scheduled_timesteps=10**9),
    env={"num_envs": 1},
    model={"learner_step_sleep_s": 0.002},
    run={"tensorboard": False},
)
FORGED = "actor-0\n2026-01-01 00:00:00 memory-0 INFO aiorl.coordinator: all good\x1b[2J"


def start_run(launch, nofile: int | None = None, transport: str = "auto"):
    """The run under attack, ended at the test's teardown by the `launch` fixture."""
    tmp_path = launch.tmp_path
    path, run_dir = write_config(tmp_path, {**CONFIG, "cluster": {**CONFIG["cluster"], "transport": transport}})

    def limit():
        if nofile is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

    proc = subprocess.Popen(
        [sys.executable, "-m", "aiorl", "run", str(path), "--quiet"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=limit,
    )
    return launch.track(proc, run_dir), run_dir


def addresses(run_dir) -> tuple[bytes, tuple[str, int], tuple[str, int]]:
    """The run's token, the coordinator's and memory-0's address (from the run directory)."""
    token = load_token(run_dir / "token")
    port = read_json(run_dir / "coordinator.json")["port"]
    status = asyncio.run(fetch_status("127.0.0.1", port, token))
    return token, ("127.0.0.1", port), tuple(status["roles"]["memory-0"]["address"][:2])  # TCP, as a peer elsewhere


def learner_steps(run_dir) -> int:
    return (last_metrics(run_dir) or {}).get("learner_steps") or 0


def stop(proc, run_dir) -> tuple[int, str, dict]:
    proc.send_signal(signal.SIGINT)
    code, out = finish(proc, timeout_s=90)
    return code, out, read_json(run_dir / "summary.json")


@pytest.mark.parametrize("transport", ["tcp", "shm"])
def test_phantom_duplicate_and_forged_names_never_join_a_running_cluster(launch, transport):
    proc, run_dir = start_run(launch, transport=transport)
    wait_for(lambda: learner_steps(run_dir) > 5, 120, "learner steps")
    token, coordinator, memory = addresses(run_dir)
    config_hash = load_config(run_dir / "config.yaml").config_hash()

    async def attacks() -> list[str]:
        refusals = []
        for name in ("actor-99", "actor-0", "learner-0"):  # a phantom, then two live names
            conn = await connect(*coordinator, token=token, name=name)
            try:  # a name the run lacks is an error; a live name's other process is not admitted
                reply = await conn.request("register", {"role": name, "config_hash": config_hash}, timeout_s=30)
                assert reply.meta.get("admitted") is False, reply.meta
                refusals.append(str(reply.meta["reason"]))
            except RemoteError as exc:
                refusals.append(str(exc))
            conn.abort()
        for name in ("actor-99", "learner-9", "actor-0", "learner-0"):  # memory: guessed sessions
            conn = await connect(*memory, token=token, name=name)
            with pytest.raises(RemoteError) as info:
                await conn.request("attach", {"session": "0" * 32}, timeout_s=10)
            refusals.append(str(info.value))
            conn.abort()
        for address in (coordinator, memory):  # a name forging a log line
            reader, writer = await asyncio.open_connection(*address)
            writer.write(handshake_frame(FrameType.HELLO, {"name": FORGED, "nonce": new_nonce()}))
            assert b"bad peer name" in await reader.read()
            writer.close()
        return refusals

    refusals = asyncio.run(attacks())
    steps = learner_steps(run_dir)
    wait_for(lambda: learner_steps(run_dir) > steps, 60, "the run to go on after the attacks")
    code, out, summary = stop(proc, run_dir)
    assert "unknown role 'actor-99'" in refusals[0] and "already registered" in refusals[1]
    assert all("refused" in r for r in refusals[3:])
    assert code == 130, out  # interrupted by our SIGINT, after a clean shutdown
    assert summary["ok"] and set(summary["roles"]) == {"memory-0", "learner-0", "actor-0"}
    assert summary["registrations_refused"] == 3
    memory_stats = summary["roles"]["memory-0"]["stats"]
    assert set(memory_stats["actors"]) == {"actor-0"} and set(memory_stats["learners"]) == {"learner-0"}
    assert memory_stats["peers_refused"] == {"unknown": 2, "session": 2}
    logs = out + "".join(p.read_text() for p in (run_dir / "logs").iterdir())
    assert "bad peer name" in logs
    assert "all good" not in logs and "\x1b" not in logs
    assert ("over shared memory" in logs) == (transport == "shm")  # the run's own data path


def test_connection_flood_under_a_low_open_file_limit(launch):
    """Bare connections (no byte sent) to both ports, three times the role processes' fd limit."""
    nofile = 256
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 8192), hard))  # room for our own sockets
    proc, run_dir = start_run(launch, nofile=nofile)
    socks = []
    try:
        wait_for(lambda: learner_steps(run_dir) > 5, 120, "learner steps")
        _, coordinator, memory = addresses(run_dir)
        rate_per_s = 500
        t0 = time.monotonic()
        for i in range(3 * nofile):
            s = socket.socket()
            s.setblocking(False)
            s.connect_ex(coordinator if i % 2 else memory)
            socks.append(s)
            time.sleep(max(0.0, t0 + (i + 1) / rate_per_s - time.monotonic()))
        assert proc.poll() is None, "the run died under the flood"
        steps = learner_steps(run_dir)
        wait_for(lambda: learner_steps(run_dir) > steps, 60, "the run to go on during the flood")
        code, out, summary = stop(proc, run_dir)
    finally:
        for s in socks:
            s.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert code == 130, out  # interrupted by our SIGINT, after a clean shutdown
    assert summary["ok"]
    refused = summary["connections_refused_busy"]  # memory-0 serves both ports: one process
    assert refused + summary["roles"]["memory-0"]["stats"]["connections_refused_busy"] > nofile
