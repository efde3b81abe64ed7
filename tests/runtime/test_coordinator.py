"""The coordinator in process, over real loopback TCP: who may register, and when."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time

import pytest

from aiorl.experiment.loading import load_config
from aiorl.runtime import process
from aiorl.runtime.coordinator import Coordinator
from aiorl.runtime.coordinator.liveness import Liveness
from aiorl.runtime.coordinator.roster import RoleRecord
from aiorl.runtime.phase import Phase
from aiorl.wire import RemoteError, connect, generate_token

TOKEN = generate_token()
HANG_S = 30.0  # only bounds a hang


class NotAdmitted(Exception):
    """A registration the coordinator answered but did not admit (the right name at the wrong time)."""


async def register(port: int, cfg, role: str, **meta):
    conn = await connect("127.0.0.1", port, token=TOKEN, name=role)
    meta = {"role": role, "pid": 1, "host": "test", "config_hash": cfg.config_hash(), "address": None, **meta}
    try:
        reply = await conn.request("register", meta, timeout_s=HANG_S)
    except RemoteError:
        await conn.close()
        raise
    if reply.meta.get("admitted") is False:
        await conn.close()
        raise NotAdmitted(reply.meta["reason"])
    return conn


async def test_registration_refuses_unknown_duplicate_mismatched_and_late_roles(tmp_path):
    cfg = load_config(
        data={
            "algo": "random_agent",
            "cluster": {
                "start_timeout_s": 1.0,
                "phase_timeout_s": 0.5,
                "heartbeat_interval_s": 0.1,
                "heartbeat_timeout_s": 5.0,
            },
        }
    )
    coordinator = Coordinator(cfg, tmp_path, TOKEN)
    port = await coordinator.start("127.0.0.1", 0)
    run = asyncio.create_task(coordinator.run())
    conns = []
    try:
        with pytest.raises(RemoteError, match=r"unknown role 'actor-7': this cluster has 1 actors"):
            await register(port, cfg, "actor-7")
        with pytest.raises(RemoteError, match="config hash mismatch: actor-0 runs config 0000"):
            await register(port, cfg, "actor-0", config_hash="0000")
        conns.append(await register(port, cfg, "actor-0"))
        with pytest.raises(NotAdmitted, match=r"actor-0 is already registered \(status running\)"):
            await register(port, cfg, "actor-0")
        assert coordinator.roles["actor-0"].status == "running"  # the duplicate took nothing over

        # memory-0 and learner-0 never register: the start times out and the run stops.
        async with asyncio.timeout(HANG_S):
            while coordinator.phase == Phase.STARTING:
                await asyncio.sleep(0.01)
        with pytest.raises(
            NotAdmitted, match=r"learner-0 registered too late: the run is in phase (STOPPING|DRAINING|CLOSING)"
        ):
            await register(port, cfg, "learner-0")
        async with asyncio.timeout(HANG_S):
            ok = await run
    finally:
        run.cancel()
        for conn in conns:
            conn.abort()
        await coordinator.close(timeout_s=1.0)
    assert ok is False
    assert "did not register within cluster.start_timeout_s (1 s): learner-0, memory-0" in coordinator.stop_reason
    roles = coordinator.roles
    assert roles["learner-0"].status == roles["memory-0"].status == "lost"
    assert roles["learner-0"].reason == "never registered"
    assert roles["actor-0"].status == "failed" and "missed the STOPPING deadline" in roles["actor-0"].reason


async def test_a_stall_between_two_wake_ups_of_the_monitor_is_granted_too():
    """The stall lands after the monitor woke and before it sleeps again (while it judges, or in
    a callback the loop runs next): its next wake-up is late by as much, and that is granted, so a
    role heard at the first wake-up is not lost at the second. A stall outside the monitor's own
    sleep, unseen, once lost every role of a CI run."""
    cfg = load_config(
        data={"algo": "random_agent", "cluster": {"heartbeat_interval_s": 0.05, "heartbeat_timeout_s": 1.0}}
    )
    liveness = Liveness(cfg)
    record = RoleRecord(name="actor-0", kind="actor", index=0)
    record.status = "running"
    await liveness.tick()
    liveness.heard(record)
    time.sleep(1.4)  # the stall itself, outside the monitor's sleep
    now = await liveness.tick()
    assert liveness.stalled_s >= 1.3 and liveness.loop_lag_max_s >= 1.3  # the stall less one interval
    assert liveness.verdicts([record], now, rejoin_grace_s=5.0) == []
    # Silent on while the monitor itself is on time: lost.
    async with asyncio.timeout(HANG_S):
        while not liveness.verdicts([record], now, rejoin_grace_s=5.0):
            now = await liveness.tick()
    assert liveness.silence_s(record, now) > 1.0


async def test_a_stall_of_the_coordinators_own_loop_is_granted_to_silent_roles_then_they_are_lost(tmp_path):
    """Roles that never heartbeat, and a coordinator whose loop blocks for 1.5 s (a GC pause, an
    overloaded host) with heartbeat_timeout_s 1.0: right after the stall nobody is lost (the
    stall was the coordinator's, not the roles' silence); a second later they are."""
    cfg = load_config(
        data={
            "algo": "random_agent",
            "cluster": {
                "start_timeout_s": 30.0,
                "heartbeat_interval_s": 0.1,
                "heartbeat_timeout_s": 1.0,
                "coordinator_timeout_s": 30.0,
            },
        }
    )
    coordinator = Coordinator(cfg, tmp_path, TOKEN)
    port = await coordinator.start("127.0.0.1", 0)
    run = asyncio.create_task(coordinator.run())
    conns = []
    try:
        for role in ("memory-0", "learner-0", "actor-0"):
            conns.append(await register(port, cfg, role))
        async with asyncio.timeout(HANG_S):
            while coordinator.phase != Phase.RUNNING:
                await asyncio.sleep(0.01)
        for record in coordinator.roles.values():  # their silence starts now
            record.last_heartbeat = asyncio.get_running_loop().time()
        time.sleep(1.5)  # the stall itself: the loop (and its heartbeat monitor) cannot run
        await asyncio.sleep(0.3)  # the monitor fires (late), judges, and fires again
        assert coordinator.stalled_s >= 1.4
        assert {r.status for r in coordinator.roles.values()} == {"running"}
        async with asyncio.timeout(HANG_S):  # silent on past the grace: lost
            while any(r.status == "running" for r in coordinator.roles.values()):
                await asyncio.sleep(0.05)
        assert all(r.status == "lost" and r.reason.startswith("no heartbeat for ") for r in coordinator.roles.values())
    finally:
        run.cancel()
        for conn in conns:
            conn.abort()
        await coordinator.close(timeout_s=1.0)


async def test_a_stop_during_start_up_ends_the_run_without_waiting_for_the_start_timeout(tmp_path):
    # A launcher killed (or Ctrl-C) while roles are still registering: the coordinator takes the
    # roles that registered through the shutdown now; start_timeout_s is far beyond HANG_S here.
    cfg = load_config(
        data={
            "algo": "random_agent",
            "cluster": {"start_timeout_s": 600.0, "phase_timeout_s": 0.5, "heartbeat_interval_s": 0.1},
        }
    )
    coordinator = Coordinator(cfg, tmp_path, TOKEN)
    port = await coordinator.start("127.0.0.1", 0)
    run = asyncio.create_task(coordinator.run())
    conn = await register(port, cfg, "actor-0")
    try:
        assert coordinator.phase == Phase.STARTING
        coordinator.begin_stop("interrupted by SIGTERM (test)")
        ok = await asyncio.wait_for(run, HANG_S)
        assert ok is False  # roles that never registered: the run did not finish
        assert coordinator.roles["learner-0"].reason == "the run stopped before it registered"
        assert coordinator.phase == Phase.EXITED
    finally:
        await conn.close()
        await coordinator.close(timeout_s=1.0)


@pytest.mark.parametrize("fatal", [False, True])
async def test_a_failure_a_restart_would_repeat_stops_the_run_at_once(tmp_path, fatal):
    """An actor's failure leaves room for its restart, unless the actor says a restart would fail
    the same way (aiorl disagreeing with itself): then nothing waits for one and the run stops."""
    cfg = load_config(data={"algo": "random_agent", "cluster": {"actors": 2, "start_timeout_s": HANG_S}})
    coordinator = Coordinator(cfg, tmp_path, TOKEN)
    port = await coordinator.start("127.0.0.1", 0)
    run = asyncio.create_task(coordinator.run())
    conn = None
    try:
        conn = await register(port, cfg, "actor-0")
        meta = {"reason": "OwnInconsistency: rollout fields do not match", **({"fatal": True} if fatal else {})}
        await conn.request("fail", meta, timeout_s=HANG_S)
        assert coordinator.roles["actor-0"].status == "failed"
        assert coordinator.stop_event.is_set() is fatal
        if fatal:
            assert "actor-0 failed: OwnInconsistency: rollout fields do not match" in coordinator.stop_reason
    finally:
        run.cancel()
        if conn is not None:
            conn.abort()
        await coordinator.close(timeout_s=1.0)


class _Interrupted(Exception):
    """Python's handling of the signal: it would have ended memory 0 before any summary."""


def _raise_interrupted(signum, frame):
    raise _Interrupted(signal.Signals(signum).name)


async def test_a_signal_while_memory_0_still_starts_stops_the_run_through_its_coordinator(tmp_path, monkeypatch):
    # The launcher stops a run by signalling memory 0, which may still be building its role (its
    # replay, under load for seconds): the run must stop through the coordinator, with a summary,
    # not end the process as Python's handler would (the other roles then waited for a coordinator
    # that was gone).
    cfg = load_config(
        data={
            "algo": "random_agent",
            "cluster": {"host": "127.0.0.1", "start_timeout_s": 600.0, "phase_timeout_s": 0.5},
        }
    )
    built = process.MemoryRole

    class SignalledWhileBuilt(built):
        def __init__(self, *args, **kwargs):
            os.kill(os.getpid(), signal.SIGINT)  # as the launcher's, while memory 0 builds its role
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(process, "MemoryRole", SignalledWhileBuilt)
    previous = signal.signal(signal.SIGINT, _raise_interrupted)
    try:
        code = await asyncio.wait_for(process._run_memory0(cfg, tmp_path, TOKEN, None, None), HANG_S)
    finally:
        signal.signal(signal.SIGINT, previous)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["stop_reason"] == "interrupted by SIGINT (memory-0)", summary
    # Here no other role was on its way to register, so the run could not finish: failed, not a crash.
    assert summary["outcome"] == "failed" and code != 0, summary
