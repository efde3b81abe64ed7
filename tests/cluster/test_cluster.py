"""Acceptance tests of the runtime: real role processes over real TCP on loopback."""

from __future__ import annotations

import os
import signal

import pytest
from cluster_helpers import (
    NO_RESTARTS,
    alive,
    check_tls_only,
    cluster,
    finish,
    last_metrics,
    live_status,
    pids,
    read_json,
    run,
    wait_for,
)

pytestmark = pytest.mark.cluster

DONE_PHASE = {"actor": "STOPPING", "learner": "DRAINING", "memory": "CLOSING"}


@pytest.mark.parametrize("transport", ["tcp", "shm"])
def test_2x2x2_run_reaches_schedule_loses_nothing_and_leaves_no_process(tmp_path, transport):
    # Random actors step ~15k env steps/s: the run must outlast the learners' start-up.
    config = cluster(2, 2, 2, scheduled_timesteps=20_000)
    config["cluster"]["transport"] = transport
    code, out, run_dir = run(tmp_path, config)
    assert code == 0, out
    # Every data connection took the path asked for: rings on one host, sockets with tcp.
    for name in ("actor-0", "actor-1", "learner-0", "learner-1"):
        log = (run_dir / "logs" / f"{name}.log").read_text()
        assert log.count("over shared memory (ring:") == (2 if transport == "shm" else 0), name
        assert ("connected to the coordinator over shared memory" in log) == (transport == "shm"), name
    summary = read_json(run_dir / "summary.json")
    assert summary["ok"] and summary["env_steps"] >= 20_000
    assert [p["phase"] for p in summary["phases"]] == ["RUNNING", "STOPPING", "DRAINING", "CLOSING", "EXITED"]
    roles = summary["roles"]
    assert all(r["status"] == "done" for r in roles.values())
    assert set(read_json(run_dir / "exits.json").values()) == {0}
    # Each kind reported done in the phase that waits for it.
    for name, role in roles.items():
        assert role["done_phase"] == DONE_PHASE[name.split("-")[0]], (name, role["done_phase"])

    # Every learner was fed by both memories.
    for learner in ("learner-0", "learner-1"):
        batches = [m["batches"] for m in roles[learner]["stats"]["memories"]]
        assert len(batches) == 2 and min(batches) > 0, (learner, batches)

    # Nothing lost: every transition an actor sent was inserted exactly once, in sequence.
    memories = {name: roles[name]["stats"] for name in ("memory-0", "memory-1")}
    total_sent = 0
    for actor in ("actor-0", "actor-1"):
        sent = roles[actor]["stats"]["memories"]
        for m, memory in enumerate(("memory-0", "memory-1")):
            received = memories[memory]["actors"][actor]
            assert received["transitions"] == sent[m]["transitions"] > 0
            assert received["batches"] == received["next_seq"] == sent[m]["batches"]
            assert received["seq_errors"] == 0 and received["finished"]
            total_sent += sent[m]["transitions"]
    assert sum(m["inserted"] for m in memories.values()) == total_sent

    # Every priority update sent was applied or counted stale.
    for learner in ("learner-0", "learner-1"):
        sent = roles[learner]["stats"]["memories"]
        for m, memory in enumerate(("memory-0", "memory-1")):
            got = memories[memory]["learners"][learner]
            assert got["priority_messages"] == sent[m]["priority_messages"] > 0
            assert got["priorities_applied"] + got["priorities_stale"] == sent[m]["priorities"]
    # Each memory's 2000 slots were overwritten more than once while learners sampled them:
    # some updates came back for slots that hold other rows by then.
    for memory in memories.values():
        assert memory["inserted"] > 2000
        assert sum(got["priorities_stale"] for got in memory["learners"].values()) > 0

    # Outputs of the run directory.
    for name in ("config.yaml", "metrics.jsonl", "summary.json", "run.json"):
        assert (run_dir / name).exists(), name
    assert list((run_dir / "checkpoints").glob("checkpoint-*.pt"))  # random_agent checkpoints too
    for role in roles:
        assert (run_dir / "logs" / f"{role}.log").exists()
    assert not any(alive(pid) for pid in read_json(run_dir / "pids.json").values())


def test_learners_outnumbering_memories_all_get_batches(launch):
    # Stopped by hand once every learner has stepped: a step budget could be spent by the first
    # learners before a slow-starting one attaches, which is not starvation.
    proc, run_dir = launch(cluster(1, 1, 3, scheduled_global_steps=10**9))

    def every_learner_stepped():
        roles = (live_status(run_dir) or {}).get("roles") or {}
        return all(
            ((roles.get(f"learner-{i}") or {}).get("counters") or {}).get("learner_steps", 0) > 0 for i in range(3)
        )

    wait_for(every_learner_stepped, 180, "every learner to take a step", 0.5)
    proc.send_signal(signal.SIGINT)
    code, out = finish(proc, timeout_s=120)
    assert code == 130, out
    roles = read_json(run_dir / "summary.json")["roles"]
    for i in range(3):
        assert roles[f"learner-{i}"]["stats"]["memories"][0]["batches"] > 0


def test_sync_barrier_no_iteration_starts_before_its_weights(tmp_path):
    actors, iterations, steps = 3, 6, 8
    config = cluster(actors, 2, 1, scheduled_timesteps=actors * iterations * steps * 2, sample_batch_size=steps)
    config["model"] = {"synchronous": True}
    code, out, run_dir = run(tmp_path, config)
    assert code == 0, out
    summary = read_json(run_dir / "summary.json")
    for a in range(actors):
        log = summary["roles"][f"actor-{a}"]["stats"]["iterations"]
        assert len(log) >= iterations
        for k, entry in enumerate(log):
            assert entry["iteration"] == k
            assert entry["weights_version"] == k  # iteration k acts with version k


def test_sigkill_an_actor_the_run_still_ends_cleanly(launch):
    config = cluster(3, 2, 1, scheduled_timesteps=150_000)
    config["cluster"].update(NO_RESTARTS)  # the run ends cleanly without the actor (test_survival: with it)
    proc, run_dir = launch(config)
    victim = pids(run_dir)["actor-1"]
    wait_for(lambda: (last_metrics(run_dir) or {}).get("env_steps", 0) > 1000, 120, "env steps")
    os.kill(victim, signal.SIGKILL)
    code, out = finish(proc)
    summary = read_json(run_dir / "summary.json")
    assert summary["env_steps"] >= 150_000
    assert summary["roles"]["actor-1"]["status"] == "lost"
    assert [p["phase"] for p in summary["phases"]][-1] == "EXITED"
    assert all(r["status"] == "done" for n, r in summary["roles"].items() if n != "actor-1")
    assert any("actor-1 lost" in failure for failure in summary["failures"])
    exits = read_json(run_dir / "exits.json")
    assert exits.pop("actor-1") == -signal.SIGKILL
    # The coordinator's process reports the run's outcome; every other role finished its phases.
    assert exits.pop("memory-0") == 2
    assert set(exits.values()) == {0}, exits
    assert code != 0 and "actor-1" in out  # the launcher names the lost role
    assert not any(alive(pid) for pid in read_json(run_dir / "pids.json").values())


def test_killing_the_coordinator_ends_every_role_nonzero(launch):
    config = cluster(2, 2, 1, scheduled_timesteps=10**9)
    config["cluster"].update(NO_RESTARTS)  # not the run restarting itself (test_survival)
    proc, run_dir = launch(config)
    started = pids(run_dir)
    wait_for(lambda: (last_metrics(run_dir) or {}).get("learner_steps", 0) > 5, 120, "learner steps")
    os.kill(started["memory-0"], signal.SIGKILL)
    code, out = finish(proc, timeout_s=60)
    exits = read_json(run_dir / "exits.json")
    assert exits.pop("memory-0") == -signal.SIGKILL
    assert all(code == 3 for code in exits.values()), exits  # EXIT_COORDINATOR_LOST
    for name in exits:
        assert "lost the coordinator" in (run_dir / "logs" / f"{name}.log").read_text()
    # Learner 0 still wrote a checkpoint on its way out.
    from aiorl.io import checkpoint

    newest = checkpoint.list_checkpoints(run_dir / "checkpoints")[-1]
    assert checkpoint.read_meta(newest)["reason"].startswith("abnormal end: lost the coordinator")
    assert code != 0
    assert not any(alive(pid) for pid in started.values())


def test_sigint_to_the_launcher_runs_the_shutdown_phases(launch):
    proc, run_dir = launch(cluster(2, 1, 1, scheduled_timesteps=10**9))
    started = pids(run_dir)
    wait_for(lambda: (last_metrics(run_dir) or {}).get("learner_steps", 0) > 5, 120, "learner steps")
    proc.send_signal(signal.SIGINT)
    code, out = finish(proc, timeout_s=60)
    assert code == 130, out  # interrupted, after a clean shutdown: a scheduler may requeue it
    summary = read_json(run_dir / "summary.json")
    assert summary["ok"] and summary["outcome"] == "interrupted" and summary["stop_reason"] == "interrupted"
    assert summary["signal"] == "SIGINT" and "--resume" in out
    assert set(read_json(run_dir / "exits.json").values()) == {130}
    assert list((run_dir / "checkpoints").glob("checkpoint-*.pt"))
    assert not any(alive(pid) for pid in started.values())


def test_actors_pull_newer_weights(tmp_path):
    config = cluster(2, 1, 1, scheduled_global_steps=200)
    config["model"]["learner_step_sleep_s"] = 0.01  # a run of a few heartbeats
    code, out, run_dir = run(tmp_path, config)
    assert code == 0, out
    summary = read_json(run_dir / "summary.json")
    assert summary["weights_version"] >= 5
    for actor in ("actor-0", "actor-1"):
        assert summary["roles"][actor]["stats"]["weights_version"] >= 1


def test_heartbeats_flow_while_a_learner_step_runs_longer_than_the_heartbeat_timeout(tmp_path):
    config = cluster(1, 1, 1, scheduled_global_steps=3)
    config["cluster"]["heartbeat_timeout_s"] = 1.0
    config["model"]["learner_step_sleep_s"] = 2.5  # each step blocks 2.5x the timeout
    code, out, run_dir = run(tmp_path, config)
    assert code == 0, out
    summary = read_json(run_dir / "summary.json")
    assert summary["roles"]["learner-0"]["status"] == "done"
    assert summary["learner_steps"] >= 3


@pytest.mark.parametrize(
    "stop, expected",
    [
        # A budget far off: a run needs one (a target may never be reached); the target ends this one.
        ({"agent": {"target_return": 15.0, "scheduled_timesteps": 10**9}}, "target_return"),
        ({"run": {"max_seconds": 2.0}}, "run.max_seconds"),
    ],
)
def test_other_stop_criteria(tmp_path, stop, expected):
    config = cluster(1, 1, 1)
    for section, values in stop.items():
        config.setdefault(section, {}).update(values)
    code, out, run_dir = run(tmp_path, config)
    assert code == 0, out
    assert expected in read_json(run_dir / "summary.json")["stop_reason"]


def test_one_role_per_process_deployment_and_config_hash_refusal(tmp_path, launch):
    """Start every role with `aiorl run --role`, as one would on separate hosts."""
    import json
    import subprocess
    import sys

    from cluster_helpers import write_config

    from aiorl.wire import generate_token

    config = cluster(1, 2, 1, scheduled_timesteps=3000)
    path, run_dir = write_config(tmp_path, config)
    env = {**os.environ, "AIORL_TOKEN": generate_token().decode()}

    def role(kind, index, *extra):
        return launch.track(
            subprocess.Popen(
                [sys.executable, "-m", "aiorl", "run", str(path), "--role", kind, "--index", str(index), *extra],
                env=env,
                cwd=tmp_path,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )

    procs = [role("memory", 0)]
    port = wait_for(
        lambda: (
            (run_dir / "coordinator.json").exists() and json.loads((run_dir / "coordinator.json").read_text())["port"]
        ),
        60,
        "coordinator",
    )
    at = f"cluster.port={port}"
    intruder = role("actor", 0, "--set", at, "--set", "agent.batch_size=16")
    assert intruder.wait(60) == 2
    assert "config hash mismatch" in intruder.stdout.read()
    procs += [role("memory", 1, "--set", at), role("learner", 0, "--set", at), role("actor", 0, "--set", at)]
    codes = [p.wait(120) for p in procs]
    assert codes == [0, 0, 0, 0], [p.stdout.read() for p in procs]
    assert read_json(run_dir / "summary.json")["ok"]


def test_tls_cluster(tmp_path, launch):
    from aiorl.wire.tls import generate_self_signed

    cert, key = generate_self_signed(tmp_path / "tls", hosts=("127.0.0.1", "localhost"))
    config = cluster(1, 2, 1, scheduled_timesteps=10**9)
    config["cluster"].update(tls_cert=str(cert), tls_key=str(key), tls_ca=str(cert))
    proc, run_dir = launch(config)
    wait_for(lambda: (last_metrics(run_dir) or {}).get("learner_steps", 0) > 0, 120, "learner steps")
    check_tls_only(run_dir, cert, key)
    proc.send_signal(signal.SIGINT)
    code, out = finish(proc, timeout_s=60)
    assert code == 130, out  # interrupted by our SIGINT, after a clean shutdown
    summary = read_json(run_dir / "summary.json")
    assert summary["ok"] and summary["learner_steps"] > 0
