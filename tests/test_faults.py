"""Surviving faults, with real role processes over loopback: restarts under SIGKILL, resume
after every process is killed, a stalled coordinator, a dropped control connection, a run
directory that already holds a run."""
from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from aiorl import checkpoint
from cluster_helpers import alive, finish, last_metrics, pids, read_json, run, start, wait_for, write_config

pytestmark = pytest.mark.cluster

APEX = {
    "algo": "apex_dqn",
    "env": {"id": "CartPole-v1"},
    "agent": {"sample_batch_size": 16, "batch_size": 32, "buffer_size": 20_000, "learning_starts": 300,
              "publish_interval": 10},
    "model": {"network": ["linear:32", "relu"], "n_step": 3, "learning_rate": 0.0005, "tau": 0.01},
}
RANDOM = {
    "algo": "random_agent",
    "env": {"id": "CartPole-v1", "num_envs": 2},
    "agent": {"sample_batch_size": 16, "batch_size": 32, "buffer_size": 4000, "learning_starts": 200},
}


def config(base: dict, **sections) -> dict:
    out = json.loads(json.dumps(base))
    for section, values in sections.items():
        out.setdefault(section, {}).update(values)
    return out


def metrics_rows(run_dir: Path) -> list[dict]:
    rows = []
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            pass  # the row being written when its writer was killed
    return rows


def kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def assert_nothing_accepted_was_lost(roles: dict, memories: list[str], actors: list[str]) -> None:
    """Per memory: every transition it accepted is in its replay, counted once on exactly one
    actor connection, whose batches came in sequence from 0; every actor's last connection
    finished with the memory's count equal to the actor's own."""
    for name in memories:
        stats = roles[name]["stats"]
        connections = [c for a in stats["actors"].values() for c in a["connections"]]
        assert stats["inserted"] == sum(c["transitions"] for c in connections) == stats["replay_added"], name
        for c in connections:
            assert c["seq_errors"] == 0 and c["next_seq"] == c["batches"], (name, c)
    for actor in actors:
        sent = roles[actor]["stats"]["memories"]
        for m, name in enumerate(memories):
            last = roles[name]["stats"]["actors"][actor]["connections"][-1]
            assert last["finished"] and last["transitions"] == sent[m]["transitions"], (actor, name)


def live_status(run_dir: Path) -> dict | None:
    """The coordinator's status (roles with their registered pids), or None if it does not answer."""
    import asyncio

    from aiorl.status import fetch_status, resolve_target

    try:
        host, port, token, _ = resolve_target(str(run_dir), None)
        return asyncio.run(fetch_status(host, port, token, timeout_s=5.0))
    except Exception:
        return None


def registered(run_dir: Path, name: str, pid: int) -> bool:
    """`name` runs as process `pid` as far as the coordinator knows."""
    role = ((live_status(run_dir) or {}).get("roles") or {}).get(name) or {}
    return role.get("pid") == pid and role.get("status") == "running"


def test_chaos_sigkilled_actors_and_memory_host_restart_and_nothing_accepted_is_lost(tmp_path):
    target = 50_000
    cfg = config(APEX, cluster={"actors": 2, "memories": 2, "learners": 1, "max_restarts": 3,
                                "restart_backoff_s": 0.2, "restart_backoff_max_s": 1.0},
                 agent={"scheduled_timesteps": target}, run={"snapshot_replay": True, "snapshot_interval_s": 1.0})
    proc, run_dir = start(tmp_path, cfg)
    rng = random.Random(12)
    budget = {"actor-0": 2, "actor-1": 2, "memory-1": 1}
    victims = []
    try:
        wait_for(lambda: (last_metrics(run_dir) or {}).get("env_steps", 0) > 1000, 120, "env steps")
        # Every few seconds a random registered process dies by SIGKILL (memory-1 once), while
        # the run is in its first part: every successor registers before the run ends.
        while (len(victims) < 5 and proc.poll() is None
               and (last_metrics(run_dir) or {}).get("env_steps", 0) < target * 0.5):
            running = pids(run_dir)
            status = (live_status(run_dir) or {}).get("roles", {})
            ready = [n for n, left in budget.items() if left and status.get(n, {}).get("pid") == running[n]
                     and status[n]["status"] == "running"]
            if not ready:
                time.sleep(0.2)
                continue
            victim = rng.choice(ready)
            kill(running[victim])
            budget[victim] -= 1
            victims.append(victim)
            time.sleep(rng.uniform(1.0, 2.5))
        wait_for(lambda: (live_status(run_dir) or {}).get("restarts", 0) == len(victims), 60, "every restart")
        code, out = finish(proc, timeout_s=240)
    finally:
        proc.kill()
    kills = {name: victims.count(name) for name in ("actor-0", "actor-1", "memory-1")}
    assert len(victims) >= 4, victims
    assert code == 0, out
    summary = read_json(run_dir / "summary.json")
    assert summary["outcome"] == "finished" and summary["env_steps"] >= target
    assert summary["restarts"] == len(victims) and not summary["failures"]
    roles = summary["roles"]
    assert {name: roles[name]["restarts"] for name in kills} == kills
    assert all(r["status"] == "done" for r in roles.values())
    assert metrics_rows(run_dir)[-1]["restarts"] == len(victims)
    assert [h["role"] for h in read_json(run_dir / "restarts.json")["restarts"]] == victims
    # Counters add up over incarnations: the run's env steps are every actor process's.
    assert summary["env_steps"] == sum(r["counters"].get("env_steps", 0) + r["retired_counters"].get("env_steps", 0)
                                       for name, r in roles.items() if name.startswith("actor"))
    assert roles["memory-1"]["stats"]["snapshot_restored_rows"] > 0  # it rejoined from its snapshot
    actors = ["actor-0", "actor-1"]
    # memory-1 restarted: what it accepted before lives on in its snapshot, not its counters;
    # the accounting holds for every connection of this incarnation and all of memory-0's.
    memory0 = roles["memory-0"]["stats"]
    connections = [c for a in memory0["actors"].values() for c in a["connections"]]
    assert len(connections) == 2 + kills["actor-0"] + kills["actor-1"]  # one per actor process
    assert_nothing_accepted_was_lost(roles, ["memory-0"], actors)
    memory1 = roles["memory-1"]["stats"]
    assert memory1["inserted"] == sum(c["transitions"] for a in memory1["actors"].values() for c in a["connections"])
    for connections in (a["connections"] for a in memory1["actors"].values()):
        assert all(c["seq_errors"] == 0 for c in connections)
    for learner_memory in roles["learner-0"]["stats"]["memories"]:
        assert learner_memory["batches"] > 0  # fed by both memory hosts after the restart
    assert not any(alive(pid) for pid in read_json(run_dir / "pids.json").values())
