"""The coordinator's admission part alone (`aiorl.runtime.coordinator.registration`): each
registration's decision is a value, `Admission`, which the service acts on. No connection, no
coordinator: the roster, the phase, the parameter store and the exit notices are made here and
set as each case needs."""

from __future__ import annotations

import asyncio

import pytest

from aiorl.experiment.loading import load_config
from aiorl.runtime.coordinator.notices import ExitNotices
from aiorl.runtime.coordinator.params import ParameterStore
from aiorl.runtime.coordinator.phases import PhaseClock
from aiorl.runtime.coordinator.registration import Admission, Admissions
from aiorl.runtime.coordinator.roster import Roster
from aiorl.runtime.phase import Phase

FAST = {"heartbeat_interval_s": 0.02, "heartbeat_timeout_s": 0.05, "coordinator_timeout_s": 60.0}


class Parts:
    def __init__(self, synchronous: bool = False, **cluster):
        self.cfg = load_config(data={"algo": "random_agent", "cluster": {"actors": 2, **FAST, **cluster}})
        self.roster = Roster(self.cfg, synchronous)
        self.phases = PhaseClock()
        self.params = ParameterStore()
        self.now = [100.0]
        self.notices = ExitNotices(launcher_pid=1, remember_s=10.0, clock=lambda: self.now[0])
        self.admissions = Admissions(
            self.roster,
            self.phases,
            self.params,
            self.notices,
            self.cfg.config_hash(),
            rollouts_by_iteration=synchronous,
            clock=lambda: self.now[0],
        )

    def meta(self, role: str, incarnation: str = "a", **extra) -> dict:
        return {"role": role, "pid": 1000, "config_hash": self.cfg.config_hash(), "incarnation": incarnation, **extra}

    async def admit(self, role: str, incarnation: str = "a", **extra) -> Admission:
        return await self.admissions.admit(role, self.meta(role, incarnation, **extra))

    def registered(self, role: str, status: str = "running", incarnation: str = "a", session: str = "s1"):
        record = self.roster.roles[role]
        record.status, record.incarnation, record.session = status, incarnation, session
        return record


async def test_a_restart_admitted_in_running_joins_the_iteration_after_the_newest_weights_and_memories_hear():
    parts = Parts(synchronous=True, max_restarts=1)
    record = parts.registered("actor-1", status="lost")
    record.counters = {"env_steps": 40}
    parts.phases.enter(Phase.RUNNING)
    parts.params.weights_version = 4
    admission = await parts.admit("actor-1", incarnation="b")
    assert admission == Admission("actor-1", "restart", incarnation="b", joins_iteration=5)
    assert admission.admitted and admission.role_back == {"role": "actor-1", "iteration": 5}

    parts.admissions.enter(record, admission, conn=None, meta=parts.meta("actor-1", "b", pid=1005))
    assert (record.status, record.restarts, record.incarnation, record.pid) == ("running", 1, "b", 1005)
    assert record.joins_iteration == 5 and record.session != "s1" and record.counters_time == 100.0
    assert record.retired == {"env_steps": 40} and record.counters == {}


async def test_a_restart_refused_once_the_run_is_stopping_tells_nobody():
    parts = Parts(synchronous=True, max_restarts=1)
    parts.registered("actor-1", status="lost")
    parts.phases.enter(Phase.RUNNING)
    parts.phases.enter(Phase.STOPPING)
    admission = await parts.admit("actor-1", incarnation="b")
    assert not admission.admitted and not admission.misconfigured
    assert admission.reason == "actor-1 cannot restart: the run is in phase STOPPING"
    assert admission.role_back is None and admission.joins_iteration is None


async def test_a_lost_name_comes_back_only_as_a_restart():
    parts = Parts(max_restarts=2)
    parts.registered("actor-0", status="lost").reason = "no heartbeat"
    parts.phases.enter(Phase.RUNNING)
    same = await parts.admit("actor-0", incarnation="a")
    assert same.reason == "actor-0 cannot rejoin: it was declared lost (no heartbeat)"
    restart = await parts.admit("actor-0", incarnation="b")
    # Not synchronous: no iteration to join, nothing for the memory hosts to hear.
    assert restart == Admission("actor-0", "restart", incarnation="b")
    assert restart.role_back is None


async def test_a_second_live_registration_is_refused_after_its_predecessor_had_its_time():
    parts = Parts(max_restarts=1)
    parts.registered("actor-0", status="running")
    parts.phases.enter(Phase.RUNNING)
    admission = await parts.admit("actor-0", incarnation="b")  # waits heartbeat timeout + interval
    assert admission == Admission("actor-0", reason="actor-0 is already registered (status running)")


async def test_a_new_process_is_admitted_once_its_predecessor_is_found_lost_meanwhile():
    parts = Parts(max_restarts=1)
    record = parts.registered("actor-0", status="running")
    parts.phases.enter(Phase.RUNNING)
    pending = asyncio.ensure_future(parts.admit("actor-0", incarnation="b"))
    await asyncio.sleep(0)
    assert not pending.done()
    parts.roster.mark(record, "lost", "no heartbeat")
    assert (await pending).admitted_as == "restart"


async def test_a_first_start_a_rejoin_and_a_moved_memory_host():
    parts = Parts(synchronous=True)
    first = await parts.admit("actor-0")
    assert first == Admission("actor-0", "first", incarnation="a", joins_iteration=0)
    assert first.role_back is None  # nothing to tell: no memory host counted it yet
    memory = await parts.admit("memory-0", address=["10.0.0.1", "7000", "/run/sock/memory-0"])
    assert memory.address == ("10.0.0.1", 7000, "/run/sock/memory-0") and memory.moved

    record = parts.registered("memory-0", status="disconnected")
    record.address = ("10.0.0.1", 7000, "/run/sock/memory-0")
    parts.phases.enter(Phase.RUNNING)
    rejoin = await parts.admit("memory-0", address=["10.0.0.1", 7000, "/run/sock/memory-0"])
    assert rejoin.admitted_as == "rejoin" and not rejoin.moved and rejoin.role_back is None
    parts.admissions.enter(record, rejoin, conn=None, meta=parts.meta("memory-0"))
    assert record.session == "s1" and record.status == "running"  # a rejoin keeps its session

    actor = parts.registered("actor-1", status="disconnected")
    actor.joins_iteration = 3
    rejoined = await parts.admit("actor-1", address=["10.0.0.2", 7001])
    assert rejoined.joins_iteration is None and not rejoined.moved  # an actor's address moves nothing


@pytest.mark.parametrize(
    "peer, meta, reason",
    [
        ("actor-9", {"role": "actor-9"}, "unknown role 'actor-9': this cluster has 2 actors"),
        ("actor-1", {"role": "actor-0"}, "actor-1 cannot register as actor-0: a role registers under the name"),
        ("actor-0", {"role": "actor-0", "config_hash": "other"}, "config hash mismatch: actor-0 runs config other"),
    ],
)
async def test_a_misconfigured_process_is_refused_for_the_user_to_fix(peer, meta, reason):
    parts = Parts()
    admission = await parts.admissions.admit(peer, {**parts.meta(meta["role"]), **meta})
    assert admission.misconfigured and not admission.admitted
    assert admission.reason.startswith(reason)


async def test_a_process_the_launcher_saw_exit_is_not_admitted():
    parts = Parts()
    record = parts.registered("actor-0")
    record.pid = 999
    assert parts.notices.decide(record, {"role": "actor-0", "pid": 1000, "signal": 9})[1] is None
    admission = await parts.admit("actor-0", incarnation="b")
    assert admission.reason == "actor-0's process (pid 1000) has already exited (seen by the launcher)"
    assert not admission.misconfigured
