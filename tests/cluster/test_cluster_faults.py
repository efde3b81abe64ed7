"""Faults through a real run (real role processes over loopback TCP): lost and silent
roles, a stalled or silent coordinator, missed deadlines, a second Ctrl-C.

Whatever goes wrong, the run ends, names what went wrong (stderr, summary.json,
exit codes) and leaves no process behind.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import psutil
import pytest
from cluster_helpers import (
    NO_RESTARTS,
    alive,
    cluster,
    finish,
    last_metrics,
    pids,
    read_json,
    wait_for,
    write_config,
)

from aiorl.wire import generate_token

pytestmark = pytest.mark.cluster


def metrics_rows(run_dir) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines[:-1] if line.strip()]  # the last one may be half-written


def waited(run_dir, predicate, timeout_s: float, what: str):
    """wait_for, and if it times out, say where the run stood."""
    try:
        return wait_for(predicate, timeout_s, what)
    except AssertionError as exc:
        summary = run_dir / "summary.json"
        raise AssertionError(
            f"{exc}; last metrics row: {last_metrics(run_dir)}; summary: "
            f"{summary.read_text()[:3000] if summary.exists() else None}"
        ) from None


def running(run_dir, key: str = "learner_steps", above: int = 5):
    waited(run_dir, lambda: (last_metrics(run_dir) or {}).get(key, 0) > above, 120, key)


def none_left(started: dict[str, int]) -> bool:
    return not any(alive(pid) for pid in started.values())


@pytest.mark.parametrize("victim", ["learner-0", "memory-1"])
def test_losing_a_learner_or_memory_1_ends_the_run(launch, victim):
    config = cluster(1, 2, 1, scheduled_timesteps=10**9)
    config["cluster"].update(NO_RESTARTS)
    proc, run_dir = launch(config)
    started = pids(run_dir)
    running(run_dir)
    os.kill(started[victim], signal.SIGKILL)
    code, out = finish(proc, timeout_s=120)
    summary = read_json(run_dir / "summary.json")
    # (Losing memory 1 also fails the actor that was sending to it; either may stop the run first.)
    # The launcher saw the exit and said so: the verdict came before any wait for a rejoin.
    lost = f"{victim} lost: {victim} exited: killed by SIGKILL (seen by the launcher)"
    assert lost in summary["failures"], summary["failures"]
    assert [p["phase"] for p in summary["phases"]][-1] == "EXITED"
    assert summary["roles"][victim]["status"] == "lost" and not summary["ok"]
    assert read_json(run_dir / "exits.json")[victim] == -signal.SIGKILL
    assert code != 0 and f"{victim} lost" in out
    # A learner cannot restart in place; the whole run would, but for max_run_restarts 0.
    assert ("the run was not restarted: cluster.max_run_restarts is 0" in out) == (victim == "learner-0")
    assert none_left(started)


def test_losing_an_actor_in_synchronous_mode_leaves_the_others_iterating(launch):
    # Memory 1 aggregates only actor 1: once it is gone, memory 1 hands out empty aggregates.
    config = cluster(3, 2, 1, scheduled_timesteps=10**9, sample_batch_size=8)
    config["model"] = {"synchronous": True}
    config["cluster"].update(NO_RESTARTS)
    proc, run_dir = launch(config)
    started = pids(run_dir)
    running(run_dir, "env_steps", 200)
    os.kill(started["actor-1"], signal.SIGKILL)
    lost_at = waited(
        run_dir,
        lambda: (last_metrics(run_dir) or {}).get("roles_lost") == ["actor-1"] and last_metrics(run_dir)["env_steps"],
        60,
        "actor-1 lost",
    )
    running(run_dir, "env_steps", lost_at + 2000)  # 2 actors x 16 env steps per iteration go on
    proc.send_signal(signal.SIGINT)
    code, out = finish(proc, timeout_s=120)
    summary = read_json(run_dir / "summary.json")
    assert summary["roles"]["actor-1"]["status"] == "lost"
    for name in ("actor-0", "actor-2"):
        log = summary["roles"][name]["stats"]["iterations"]  # (the last 1000)
        iterations = [e["iteration"] for e in log]
        # Many more iterations after the loss, still in lock step with the learner's versions.
        assert iterations == [e["weights_version"] for e in log]
        assert iterations == list(range(iterations[0], iterations[0] + len(log)))
        assert iterations[-1] + 1 > (lost_at + 2000) // (3 * 16)
    exits = read_json(run_dir / "exits.json")
    assert exits.pop("actor-1") == -signal.SIGKILL and exits.pop("memory-0") == 2
    assert set(exits.values()) == {0}, exits
    assert code != 0 and "actor-1 lost" in out
    assert none_left(started)


def test_a_missed_phase_deadline_fails_the_run_and_names_the_role(launch):
    # Each learner step takes 4 s; the run stops by the clock during one, and DRAINING waits 1.5 s
    # for it (a step budget would not do: learners take no step past it).
    config = cluster(1, 1, 1)
    config["run"] = {"max_seconds": 2.0}
    config["model"]["learner_step_sleep_s"] = 4.0
    config["cluster"] = {**config["cluster"], "phase_timeout_s": 1.5, **NO_RESTARTS}
    proc, run_dir = launch(config)
    started = pids(run_dir)
    code, out = finish(proc, timeout_s=120)
    summary = read_json(run_dir / "summary.json")
    assert not summary["ok"] and [p["phase"] for p in summary["phases"]][-1] == "EXITED"
    assert summary["failures"] == ["learner-0 failed: missed the DRAINING deadline (1.5 s)"]
    assert summary["roles"]["learner-0"]["status"] == "failed"
    assert {n: r["status"] for n, r in summary["roles"].items() if n != "learner-0"} == {
        "actor-0": "done",
        "memory-0": "done",
    }
    exits = read_json(run_dir / "exits.json")
    assert exits == {"memory-0": 2, "learner-0": 2, "actor-0": 0}
    assert code == 1 and "learner-0 failed: missed the DRAINING deadline" in out
    assert none_left(started)


def test_start_timeout_ends_a_coordinator_alone_and_a_role_without_coordinator(tmp_path):
    path, run_dir = write_config(tmp_path, {**cluster(1, 1, 1), "cluster": {"start_timeout_s": 1.5}})
    env = {**os.environ, "AIORL_TOKEN": generate_token().decode()}
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        nobody = s.getsockname()[1]
    cmd = [sys.executable, "-m", "aiorl", "run", str(path), "--role"]
    alone = subprocess.Popen(
        [*cmd, "memory", "--index", "0"],
        env=env,
        cwd=tmp_path,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    orphan = subprocess.Popen(
        [*cmd, "actor", "--index", "0", "--set", f"cluster.port={nobody}"],
        env=env,
        cwd=tmp_path,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        outs = [p.communicate(timeout=120)[0] for p in (alone, orphan)]
    finally:
        alone.kill()
        orphan.kill()
    assert alone.returncode == 2, outs[0]
    summary = read_json(run_dir / "summary.json")
    assert summary["stop_reason"] == (
        "roles did not register within cluster.start_timeout_s (1.5 s): actor-0, learner-0"
    )
    assert summary["roles"]["learner-0"]["reason"] == "never registered"
    # Its own memory role, registered, was told the run would never start (not "lost the coordinator").
    assert "the run stopped before it started" in (run_dir / "logs" / "memory-0.log").read_text()
    assert orphan.returncode == 3, outs[1]  # EXIT_COORDINATOR_LOST
    assert f"cannot reach the coordinator at 127.0.0.1:{nobody}" in outs[1]


def test_a_silent_coordinator_ends_every_other_role(launch):
    """SIGSTOP memory 0: its connections stay open, it just never answers."""
    config = cluster(2, 2, 1, scheduled_timesteps=10**9)
    config["cluster"].update(NO_RESTARTS)
    proc, run_dir = launch(config)
    started = pids(run_dir)
    running(run_dir)
    coordinator = started["memory-0"]
    others = {n: p for n, p in started.items() if n != "memory-0"}
    os.kill(coordinator, signal.SIGSTOP)
    try:
        wait_for(lambda: none_left(others), 60, "every other role to exit", interval_s=0.2)
    finally:
        os.kill(coordinator, signal.SIGCONT)
    code, out = finish(proc, timeout_s=120)
    exits = read_json(run_dir / "exits.json")
    assert {n: exits[n] for n in others} == {n: 3 for n in others}, exits  # EXIT_COORDINATOR_LOST
    for name in others:
        log = (run_dir / "logs" / f"{name}.log").read_text()
        assert "within cluster.coordinator_timeout_s (3 s)" in log, (name, log[-1500:])
    assert code != 0
    assert none_left(started)


def test_silence_is_judged_against_the_coordinators_own_stalls(launch):
    """A coordinator stopped for 1.4 s (heartbeat_timeout_s 1.0) loses nobody; an actor
    stopped as long is lost, and the run goes on without it."""
    config = cluster(3, 1, 1, scheduled_timesteps=10**9)
    config["cluster"] = {**config["cluster"], "heartbeat_timeout_s": 1.0, **NO_RESTARTS}
    proc, run_dir = launch(config)
    started = pids(run_dir)
    running(run_dir)
    before = len(metrics_rows(run_dir))
    os.kill(started["memory-0"], signal.SIGSTOP)
    time.sleep(1.4)  # the stall itself, not a wait for a condition
    os.kill(started["memory-0"], signal.SIGCONT)
    # The coordinator saw its own stall; then 2 s of rows (10 at 0.2 s) lose nobody.
    seen = waited(
        run_dir,
        lambda: next(
            (i for i, r in enumerate(metrics_rows(run_dir)) if i >= before and r["loop_lag_max_s"] >= 1.0), None
        ),
        60,
        "the stall",
    )
    waited(run_dir, lambda: len(metrics_rows(run_dir)) > seen + 10, 60, "rows after the stall")
    after = metrics_rows(run_dir)[seen:]
    assert all(r["phase"] == "RUNNING" and r["roles_lost"] == [] for r in after), after[-1]

    os.kill(started["actor-1"], signal.SIGSTOP)
    try:
        waited(run_dir, lambda: (last_metrics(run_dir) or {}).get("roles_lost") == ["actor-1"], 60, "actor-1 lost")
        # The launcher ends it: a SIGCONT sent before would let it wake and leave on its own.
        wait_for(lambda: not alive(started["actor-1"]), 60, "the launcher to end actor-1")
    finally:
        try:
            os.kill(started["actor-1"], signal.SIGCONT)
        except ProcessLookupError:
            pass  # already ended by the launcher, as a role declared lost is
    env_steps = last_metrics(run_dir)["env_steps"]
    running(run_dir, "env_steps", env_steps + 1000)  # the other actors go on
    proc.send_signal(signal.SIGINT)
    code, out = finish(proc, timeout_s=60)
    summary = read_json(run_dir / "summary.json")
    actor = summary["roles"].pop("actor-1")
    assert actor["status"] == "lost" and actor["reason"].startswith("no heartbeat for ")
    assert all(r["status"] == "done" for r in summary["roles"].values()), summary["roles"]
    exits = read_json(run_dir / "exits.json")
    # Declared lost while stopped, it could never rejoin: the launcher ended it (no restart is left).
    assert exits.pop("actor-1") == -signal.SIGKILL
    assert f"actor-1 (pid {started['actor-1']}) was declared lost by the coordinator" in out, out
    assert exits.pop("memory-0") == 2 and set(exits.values()) == {0}, exits
    assert code != 0 and "actor-1 lost: no heartbeat for" in out
    assert none_left(started)


def test_a_second_ctrl_c_kills_every_role(launch):
    config = cluster(2, 1, 1, scheduled_timesteps=10**9)
    config["model"]["learner_step_sleep_s"] = 1.0  # DRAINING waits for a step in flight
    proc, run_dir = launch(config)
    started = pids(run_dir)
    running(run_dir, above=0)
    proc.send_signal(signal.SIGINT)
    wait_for(
        lambda: "stopping: interrupted by SIG" in (run_dir / "logs" / "memory-0.log").read_text(),
        60,
        "the clean stop to begin",
    )
    proc.send_signal(signal.SIGINT)
    code, out = finish(proc, timeout_s=60)
    assert code != 0 and "killing every role" in out, out
    exits = read_json(run_dir / "exits.json")
    assert -signal.SIGKILL in exits.values(), exits  # killed, not finished
    assert none_left(started)
    assert all(not psutil.pid_exists(pid) or not alive(pid) for pid in started.values())
