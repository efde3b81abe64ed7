"""A dead child is noticed at once (issue 30): the local launcher, every role's parent, tells the
coordinator the moment a child exits, and the coordinator declares that incarnation lost then,
with the consequences a heartbeat verdict has. Only the launcher may say so, and only about the
process the role registered.

Heartbeat and rejoin timeouts are 60 s throughout: only a notice explains a verdict that names
the exit, and the order of events says the rest. No test here reads a clock.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import tempfile

import pytest
from cluster_helpers import NO_RESTARTS, cluster, finish, pids, read_json, wait_for

from aiorl.experiment.loading import load_config
from aiorl.io.rundir import Identity
from aiorl.launch.notices import ExitNotices as LauncherSide
from aiorl.runtime.coordinator import Coordinator
from aiorl.runtime.coordinator.notices import ExitNotices
from aiorl.runtime.coordinator.roster import RoleRecord
from aiorl.runtime.phase import Phase
from aiorl.wire import ConnectionClosed, RemoteError, connect, generate_token, load_token

TOKEN = generate_token()
HANG_S = 30.0  # only bounds a hang
SLOW = {"heartbeat_interval_s": 0.2, "heartbeat_timeout_s": 60.0, "coordinator_timeout_s": 60.0}
KILLED = "actor-1 lost: actor-1 exited: killed by SIGKILL (seen by the launcher)"


class NotAdmitted(Exception):
    pass


async def until(predicate, what: str) -> None:
    async with asyncio.timeout(HANG_S):
        while not predicate():
            await asyncio.sleep(0.01)


async def register(port: int, cfg, role: str, pid: int, incarnation: str = "a"):
    conn = await connect("127.0.0.1", port, token=TOKEN, name=role)
    meta = {"role": role, "pid": pid, "config_hash": cfg.config_hash(), "incarnation": incarnation}
    reply = await conn.request("register", meta, timeout_s=HANG_S)
    if reply.meta.get("admitted") is False:
        await conn.close()
        raise NotAdmitted(reply.meta["reason"])
    return conn, reply.meta


def exit_of(role: str, pid: int, sig: int = signal.SIGKILL) -> dict:
    return {"role": role, "pid": pid, "signal": int(sig)}


@pytest.fixture
def short_dir():
    """A run directory whose socket path fits in sun_path (tmp_path's can be too long)."""
    directory = tempfile.mkdtemp(prefix="aiorl-notice-", dir="/tmp")
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


async def test_the_launcher_alone_reports_exits_and_only_the_registered_process_is_lost(short_dir):
    cfg = load_config(
        data={"algo": "random_agent", "cluster": {"actors": 2, "max_restarts": 1, "phase_timeout_s": 0.5, **SLOW}}
    )
    # This test process is the launcher of the launch run.json records.
    identity = Identity(run_id="run", launch_id="launch")
    with open(os.path.join(short_dir, "run.json"), "w") as f:
        json.dump({"run_id": "run", "attempts": [{"launch_id": "launch", "pid": os.getpid()}]}, f)
    coordinator = Coordinator(cfg, short_dir, TOKEN, identity=identity)
    unix_path = os.path.join(short_dir, "coordinator")
    port = await coordinator.start("127.0.0.1", 0, unix_path)
    run = asyncio.create_task(coordinator.run())
    conns = []
    launcher = await connect("", 0, token=TOKEN, name="launcher", unix_path=unix_path)

    async def notice(fields: dict) -> str:
        return (await launcher.request("child_exit", fields, timeout_s=HANG_S)).meta["outcome"]

    async def refused(conn, fields: dict) -> str:
        with pytest.raises(RemoteError, match="exit notice refused: ") as info:
            await conn.request("child_exit", fields, timeout_s=HANG_S)
        return str(info.value)

    try:
        # actor-1's first process died before its registration was read: that registration is refused.
        assert await notice(exit_of("actor-1", 2000)) == "not registered"
        with pytest.raises(NotAdmitted, match=r"actor-1's process \(pid 2000\) has already exited"):
            await register(port, cfg, "actor-1", 2000)
        for pid, role in enumerate(("memory-0", "learner-0", "actor-0", "actor-1"), start=1001):
            conns.append((await register(port, cfg, role, pid))[0])
        await until(lambda: coordinator.phase == Phase.RUNNING, "RUNNING")
        records = coordinator.roles

        # Nobody else may say a role died: a role, an unregistered peer, a peer calling itself the
        # launcher over TCP, or over the Unix socket from another process than the launcher.
        actor0 = conns[2]
        assert "only the launcher reports exits, not actor-0" in await refused(actor0, exit_of("actor-1", 1004))
        assert (await actor0.request("heartbeat", {}, timeout_s=HANG_S)).meta["phase"] == int(Phase.RUNNING)
        probe = await connect("127.0.0.1", port, token=TOKEN, name="probe")
        assert "only the launcher reports exits, not probe" in await refused(probe, exit_of("actor-1", 1004))
        tcp = await connect("127.0.0.1", port, token=TOKEN, name="launcher")
        assert "over the run's Unix socket only" in await refused(tcp, exit_of("actor-1", 1004))
        coordinator.notices.launcher_pid = os.getpid() + 1
        impostor = await connect("", 0, token=TOKEN, name="launcher", unix_path=unix_path)
        reason = await refused(impostor, exit_of("actor-1", 1004))
        assert f"peer pid {os.getpid()} is not the launcher of this launch" in reason
        coordinator.notices.launcher_pid = os.getpid()
        assert coordinator.notices.refused == 4 and records["actor-1"].status == "running"

        # A notice about another process of actor-1 changes nothing; about its registered one, it is
        # lost, also while the coordinator still waits for it to rejoin (its connection closed first).
        assert await notice(exit_of("actor-1", 999)) == "not registered"
        assert records["actor-1"].status == "running"
        conns[3].abort()
        await until(lambda: records["actor-1"].status == "disconnected", "actor-1's connection to close")
        assert await notice(exit_of("actor-1", 1004)) == "lost"
        assert records["actor-1"].status == "lost"
        assert records["actor-1"].reason == "actor-1 exited: killed by SIGKILL (seen by the launcher)"
        assert await notice(exit_of("actor-1", 1004)) == "lost"  # said twice: the first verdict stands

        # Its restart is admitted at once; a late notice about the old process does not touch it.
        conns.append((await register(port, cfg, "actor-1", 1005, incarnation="b"))[0])
        assert records["actor-1"].status == "running" and records["actor-1"].restarts == 1
        assert await notice(exit_of("actor-1", 1004)) == "not registered"
        assert records["actor-1"].status == "running"
        assert await notice({"role": "learner-0", "pid": 1002, "exit_code": 1}) == "lost"
        assert records["learner-0"].reason == "learner-0 exited: exit code 1 (seen by the launcher)"
        with pytest.raises(ConnectionClosed):  # a dead process's connection, half-open, is cut
            await conns[1].request("heartbeat", {}, timeout_s=HANG_S)
        async with asyncio.timeout(HANG_S):
            ok = await run  # losing a learner ends the run, as a heartbeat verdict does
    finally:
        run.cancel()
        for conn in conns:
            conn.abort()
        launcher.abort()
        await coordinator.close(timeout_s=1.0)
    assert ok is False and coordinator.stop_reason.startswith("learner-0 lost: learner-0 exited: exit code 1")
    assert read_json_path(short_dir, "summary.json")["exit_notices_refused"] == 4


def read_json_path(directory: str, name: str) -> dict:
    with open(os.path.join(directory, name)) as f:
        return json.load(f)


def test_a_pid_that_exited_unregistered_is_remembered_only_while_its_registration_could_come():
    """Past cluster.coordinator_timeout_s no registration of a process that authenticated before
    it died can come (it would have been closed unregistered), and pids wrap: forgotten."""
    now = [100.0]
    notices = ExitNotices(launcher_pid=1, remember_s=10.0, clock=lambda: now[0])
    record = RoleRecord("actor-1", "actor", 1, pid=500, status="running")
    assert notices.decide(record, exit_of("actor-1", 400)) == ("not registered", None)
    assert notices.exited("actor-1", 400) == "actor-1's process (pid 400) has already exited (seen by the launcher)"
    assert notices.exited("actor-0", 400) is None and notices.exited("actor-1", 401) is None
    now[0] += 10.5
    assert notices.exited("actor-1", 400) is None


def test_an_unreachable_coordinator_leaves_the_notices_queued_and_the_launcher_free(tmp_path):
    cfg = load_config(data={"algo": "random_agent"})
    notices = LauncherSide(cfg, tmp_path)
    notices.child_exited("actor-0", 123, -9)  # not started (no Unix socket): nothing to do
    assert not notices.queued
    (tmp_path / "token").write_bytes(TOKEN)
    os.chmod(tmp_path / "token", 0o600)
    notices.start(str(tmp_path / "no-such-socket"))
    notices.child_exited("actor-0", 123, -9)
    notices.close()
    assert not notices._thread.is_alive()
    assert list(notices.queued) == [{"role": "actor-0", "pid": 123, "signal": 9}] and not notices.answers


# ---------------------------------------------------------------------- real processes


def coordinator_log(run_dir) -> str:
    return (run_dir / "logs" / "memory-0.log").read_text()


def order(text: str, *lines: str) -> list[int]:
    """Where each line first appears in `text` (-1: not there)."""
    return [text.find(line) for line in lines]


async def refused_notice(run_dir, name: str, fields: dict, unix: bool) -> str:
    address = read_json(run_dir / "coordinator.json")
    token = load_token(run_dir / "token")
    where = {"unix_path": address["unix"]} if unix else {}
    conn = await connect("127.0.0.1", address["port"], token=token, name=name, **where)
    try:
        with pytest.raises(RemoteError) as info:
            await conn.request("child_exit", fields, timeout_s=HANG_S)
        return str(info.value)
    finally:
        conn.abort()


@pytest.mark.cluster
def test_a_sigkilled_actor_is_lost_at_once_with_its_exit_and_restarted(tmp_path, launch):
    config = cluster(2, 1, 1, scheduled_timesteps=10**9)
    config["cluster"] = {**config["cluster"], **SLOW, "max_restarts": 1, "restart_backoff_s": 0.2}
    proc, run_dir = launch(config)
    started = pids(run_dir)
    wait_for(lambda: "phase RUNNING" in coordinator_log(run_dir), 120, "the run to start")
    # Another process than the launcher, under its name over the Unix socket or a role's over
    # TCP, cannot make the coordinator give up a live role.
    live = {"role": "actor-0", "pid": started["actor-0"], "signal": 9}
    assert "is not the launcher of this launch" in asyncio.run(refused_notice(run_dir, "launcher", live, True))
    assert "only the launcher reports exits" in asyncio.run(refused_notice(run_dir, "actor-0", live, False))
    os.kill(started["actor-1"], signal.SIGKILL)
    wait_for(lambda: "actor-1 restarted" in coordinator_log(run_dir), 120, "actor-1's restart")
    proc.send_signal(signal.SIGINT)
    code, out = finish(proc, timeout_s=120)
    text = coordinator_log(run_dir)
    connected, lost, restarted = order(text, "the launcher (pid", KILLED, "actor-1 restarted (restart 1 of 1")
    assert 0 <= connected < lost < restarted, text[-3000:]
    assert "no heartbeat for" not in text and "did not rejoin" not in text
    summary = read_json(run_dir / "summary.json")
    assert summary["exit_notices_refused"] == 2
    assert summary["roles"]["actor-0"]["status"] == "done" and summary["roles"]["actor-1"]["restarts"] == 1
    assert code == 130, out


@pytest.mark.cluster
def test_a_sigkilled_actor_leaves_the_synchronous_barrier_at_once(tmp_path, launch):
    config = cluster(3, 1, 1, scheduled_timesteps=10**9, sample_batch_size=8)
    config["model"] = {"synchronous": True}
    config["cluster"] = {**config["cluster"], **SLOW, **NO_RESTARTS}
    proc, run_dir = launch(config)
    started = pids(run_dir)
    learner = run_dir / "logs" / "learner-0.log"
    wait_for(lambda: learner.exists() and "iteration 3:" in learner.read_text(), 120, "3 iterations")
    os.kill(started["actor-1"], signal.SIGKILL)
    gone = "barrier 'iteration' goes on without actor-1"
    wait_for(lambda: gone in coordinator_log(run_dir), 120, "the barrier to go on without actor-1")
    before = len(re.findall(r"iteration \d+:", learner.read_text()))
    wait_for(lambda: len(re.findall(r"iteration \d+:", learner.read_text())) >= before + 3, 120, "iterations")
    proc.send_signal(signal.SIGINT)
    code, out = finish(proc, timeout_s=120)
    text = coordinator_log(run_dir)
    lost, left = order(text, KILLED, gone)
    assert 0 <= lost < left, text[-3000:]
    summary = read_json(run_dir / "summary.json")
    assert summary["roles"]["actor-1"]["reason"] == "actor-1 exited: killed by SIGKILL (seen by the launcher)"
    assert code != 0 and "actor-1 lost" in out
