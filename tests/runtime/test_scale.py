"""How the coordinator holds up with many roles: totals kept per heartbeat, status of a big
cluster, the loop-lag probe, and a CI-sized bench/scale.py run (64 actors over real TCP)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from aiorl.cli.status import fetch_status
from aiorl.experiment.loading import load_config
from aiorl.runtime import looplag
from aiorl.runtime.coordinator import Coordinator
from aiorl.runtime.messages import BadMessage, pack_table, unpack_table
from aiorl.runtime.phase import Phase
from aiorl.wire import connect, generate_token

ROOT = Path(__file__).resolve().parents[2]
TOKEN = generate_token()
HANG_S = 30.0  # only bounds a hang


async def register(port: int, cfg, role: str, incarnation: str):
    conn = await connect("127.0.0.1", port, token=TOKEN, name=role)
    meta = {
        "role": role,
        "pid": 1,
        "host": "test",
        "config_hash": cfg.config_hash(),
        "address": None,
        "incarnation": incarnation,
    }
    reply = await conn.request("register", meta, timeout_s=HANG_S)
    assert reply.meta.get("admitted") is not False, reply.meta
    return conn


async def heartbeat(conn, **counters) -> dict:
    return (await conn.request("heartbeat", {"counters": counters}, timeout_s=HANG_S)).meta


async def until(predicate) -> None:
    async with asyncio.timeout(HANG_S):
        while not predicate():
            await asyncio.sleep(0.01)


async def test_run_totals_follow_each_roles_counters_through_a_restart(tmp_path):
    """The totals a heartbeat reply carries are kept as counters change (not summed per heartbeat):
    they must still be every role's counters plus what restarted incarnations counted."""
    cfg = load_config(
        data={
            "algo": "random_agent",
            "cluster": {
                "actors": 2,
                "max_restarts": 1,
                "start_timeout_s": 30.0,
                "heartbeat_interval_s": 0.05,
                "heartbeat_timeout_s": 30.0,
                "coordinator_timeout_s": 0.2,
            },
        }
    )
    coordinator = Coordinator(cfg, tmp_path, TOKEN)
    port = await coordinator.start("127.0.0.1", 0)
    run = asyncio.create_task(coordinator.run())
    conns = {}
    try:
        for role in ("memory-0", "learner-0", "actor-0", "actor-1"):
            conns[role] = await register(port, cfg, role, "first")
        await until(lambda: coordinator.phase == Phase.RUNNING)
        await heartbeat(conns["actor-0"], env_steps=100)
        await heartbeat(conns["actor-1"], env_steps=40)
        await heartbeat(conns["actor-1"], env_steps=70)  # counters are running totals: 70, not 110
        reply = await heartbeat(conns["learner-0"], learner_steps=9)
        assert (reply["env_steps"], reply["learner_steps"]) == (170, 9)

        conns.pop("actor-0").abort()  # it crashes; its restart is a new incarnation
        await until(lambda: coordinator.roles["actor-0"].status == "lost")
        conns["actor-0"] = await register(port, cfg, "actor-0", "second")
        assert coordinator.roles["actor-0"].restarts == 1
        reply = await heartbeat(conns["actor-0"], env_steps=5)
        assert reply["env_steps"] == 175  # 100 retired + 5 + 70
        direct = sum(r.total("env_steps") for r in coordinator.roles.values())
        assert coordinator.env_steps == direct == 175
        assert coordinator.learner_steps == sum(r.total("learner_steps") for r in coordinator.roles.values()) == 9
    finally:
        run.cancel()
        for conn in conns.values():
            conn.abort()
        await asyncio.gather(run, return_exceptions=True)
        await coordinator.close(timeout_s=1.0)


async def test_a_broadcast_survives_a_connection_closing_while_its_sends_are_scheduled(tmp_path):
    """`broadcast` gathers one send per role; they start a loop turn later. A role whose
    connection closes in that turn (record.conn None) must not crash the coordinator."""
    cfg = load_config(data={"algo": "random_agent", "cluster": {"actors": 2, "start_timeout_s": 30.0}})
    coordinator = Coordinator(cfg, tmp_path, TOKEN)
    port = await coordinator.start("127.0.0.1", 0)
    run = asyncio.create_task(coordinator.run())
    conns = {}
    try:
        for role in ("memory-0", "learner-0", "actor-0", "actor-1"):
            conns[role] = await register(port, cfg, role, "first")
        await until(lambda: coordinator.phase == Phase.RUNNING)
        broadcast = asyncio.create_task(coordinator.pushes.broadcast("phase", {"phase": int(Phase.RUNNING)}))
        await asyncio.sleep(0)  # the broadcast has picked its targets; their sends start next turn
        coordinator._connection_lost(coordinator.roles["actor-1"])  # as its connection handler does
        await broadcast
        msg = await asyncio.wait_for(conns["actor-0"].recv(), HANG_S)
        assert msg.kind == "phase"
    finally:
        run.cancel()
        for conn in conns.values():
            conn.abort()
        await asyncio.gather(run, return_exceptions=True)
        await coordinator.close(timeout_s=1.0)


async def test_attaching_retries_a_handshake_that_timed_out_and_fails_at_once_on_a_refusal(tmp_path, monkeypatch):
    """A memory host too busy to finish a handshake in time is busy, not gone: the attach tries
    again (within cluster.start_timeout_s); a refused connection still fails at once."""
    from aiorl.runtime import role as role_module
    from aiorl.runtime.role import Role

    calls = []

    async def flaky_connect(host, port, **kwargs):
        calls.append(port)
        if port == 1:
            raise ConnectionRefusedError("refused")
        if len(calls) < 3:
            raise TimeoutError("connecting: no completed handshake within 10s")
        return "connection"

    monkeypatch.setattr(role_module, "connect", flaky_connect)
    cfg = load_config(data={"algo": "random_agent", "cluster": {"start_timeout_s": HANG_S}})
    role = Role(cfg, 0, tmp_path, TOKEN)
    assert await role.connect_to("127.0.0.1", 2) == "connection"
    assert calls == [2, 2, 2]
    with pytest.raises(ConnectionRefusedError):
        await role.connect_to("127.0.0.1", 1)
    assert calls == [2, 2, 2, 1]


async def test_status_of_a_cluster_too_big_for_one_frame_header(tmp_path):
    """2,000 roles' status is well over the 64 KiB a frame header holds (about 110 bytes a role
    before any has reported): the roles table travels packed and `fetch_status` (what `aiorl status`
    uses) unpacks it; the loop-lag probe rides along."""
    cfg = load_config(data={"algo": "random_agent", "cluster": {"actors": 2000, "start_timeout_s": 30.0}})
    coordinator = Coordinator(cfg, tmp_path, TOKEN)
    port = await coordinator.start("127.0.0.1", 0)
    run = asyncio.create_task(coordinator.run())
    try:
        await until(lambda: coordinator.lag_probe.samples > 0)
        status = await fetch_status("127.0.0.1", port, TOKEN, timeout_s=HANG_S)
    finally:
        run.cancel()
        await asyncio.gather(run, return_exceptions=True)
        await coordinator.close(timeout_s=1.0)
    assert len(status["roles"]) == 2002
    assert status["roles"]["actor-1999"]["status"] == "expected"
    assert status["loop_lag"]["samples"] >= 1 and sum(status["loop_lag"]["counts"]) == status["loop_lag"]["samples"]


def test_packed_tables_round_trip_and_anything_else_is_a_bad_message():
    table = {"actor-0": {"status": "running", "counters": {"env_steps": 3}}, "memory-0": {"address": ["h", 1]}}
    assert unpack_table(pack_table(table)) == table
    with pytest.raises(BadMessage, match="uint8"):
        unpack_table(np.zeros(4, np.float32))
    with pytest.raises(BadMessage, match="not msgpack"):
        unpack_table(np.frombuffer(b"\xc1\xc1", np.uint8))  # 0xc1 is never used in msgpack


def test_loop_lag_quantiles_are_bucket_upper_edges_within_ten_percent():
    probe = looplag.LoopLagProbe()
    before = probe.snapshot()
    for lag in [0.001] * 98 + [0.2, 3.0]:
        probe.record(lag)
    counts = looplag.window(before, probe.snapshot())
    assert sum(counts) == 100
    p50, p99, top = (looplag.quantile_s(counts, q) for q in (0.5, 0.99, 1.0))
    assert 0.001 <= p50 <= 0.0011
    assert 0.2 <= p99 <= 0.22
    assert 3.0 <= top <= 3.3
    assert looplag.quantile_s([0] * len(counts), 0.5) is None


def test_bench_scale_64_actors_no_false_lost_verdict_every_heartbeat_answered(tmp_path):
    """The CI-sized bench: 64 simulated actors (the real actor's control and data connections)
    against real memory-host processes over TCP; nothing is asserted about time."""
    out = tmp_path / "scale.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "scale.py"),
            "--actors",
            "64",
            "--memories",
            "2",
            "--warmup-s",
            "0.5",
            "--duration-s",
            "2",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    row = json.loads(out.read_text())["rows"][0]
    assert row["lost_count"] == 0 and row["lost"] == []
    assert row["heartbeats_failed"] == 0
    assert row["exit_codes_nonzero"] == {}
    assert row["outcome"] == "finished"
    assert row["heartbeats"] > 0 and row["ingest_per_s"] > 0
    assert row["coordinator_lag_samples"] > 0
