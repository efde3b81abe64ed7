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
from cluster_helpers import (
    NO_RESTARTS,
    alive,
    finish,
    last_metrics,
    live_status,
    pids,
    read_json,
    start,
    wait_for,
    write_config,
)
from configs import APEX_CARTPOLE_TINY, RANDOM_CARTPOLE, configured

from aiorl.io import checkpoint

pytestmark = pytest.mark.cluster


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


def registered(run_dir: Path, name: str, pid: int) -> bool:
    """`name` runs as process `pid` as far as the coordinator knows."""
    role = ((live_status(run_dir) or {}).get("roles") or {}).get(name) or {}
    return role.get("pid") == pid and role.get("status") == "running"


def every_successor_back(run_dir, names: set[str]) -> bool:
    """Each of `names` runs as its newest process, registered; an actor stepping too."""
    running = pids(run_dir)
    status = live_status(run_dir) or {}
    roles = status.get("roles", {})
    for name in names:
        role = roles.get(name, {})
        if role.get("pid") != running[name] or role.get("status") != "running":
            return False
        if name.startswith("actor") and not role["counters"].get("env_steps", 0) > 0:
            return False
    return True


def test_chaos_sigkilled_actors_and_memory_host_restart_and_nothing_accepted_is_lost(launch):
    seconds = 12.0  # how long the kills go on, from the first env steps
    cfg = configured(
        APEX_CARTPOLE_TINY,
        cluster={
            "actors": 2,
            "memories": 2,
            "learners": 1,
            "max_restarts": 3,
            "restart_backoff_s": 0.2,
            "restart_backoff_max_s": 1.0,
        },
        agent={"scheduled_global_steps": 10**9},
        run={"snapshot_replay": True, "snapshot_interval_s": 1.0},
    )
    proc, run_dir = launch(cfg)
    rng = random.Random(12)
    budget = {"actor-0": 2, "actor-1": 2}
    victims = []
    wait_for(lambda: (last_metrics(run_dir) or {}).get("env_steps", 0) > 1000, 120, "env steps")
    running_since = time.monotonic()  # (about: RUNNING began a moment before the first env steps)
    # memory-1 once, then every few seconds a random registered actor dies by SIGKILL; the run
    # ends (SIGINT, through the same phases as a stop criterion) once every successor is back.
    while len(victims) < 5 and proc.poll() is None and time.monotonic() - running_since < seconds:
        running = pids(run_dir)
        status = (live_status(run_dir) or {}).get("roles", {})
        candidates = ["memory-1"] if not victims else [n for n, left in budget.items() if left]
        ready = [
            n
            for n in candidates
            if status.get(n, {}).get("pid") == running[n]
            and status[n]["status"] == "running"
            and (
                status[n]["counters"].get("env_steps", 0) > 0
                if n != "memory-1"  # stepping
                else (run_dir / "replay-memory-1.npz").exists()
            )
        ]  # it has a snapshot to come back to
        if not ready:
            time.sleep(0.2)
            continue
        victim = rng.choice(ready)
        kill(running[victim])
        budget[victim] = budget.get(victim, 1) - 1
        victims.append(victim)
        time.sleep(rng.uniform(1.0, 2.5))
    wait_for(lambda: (live_status(run_dir) or {}).get("restarts", 0) == len(victims), 60, "every restart")
    wait_for(lambda: every_successor_back(run_dir, set(victims)), 60, "every successor back")
    proc.send_signal(signal.SIGINT)
    code, out = finish(proc, timeout_s=240)
    kills = {name: victims.count(name) for name in ("actor-0", "actor-1", "memory-1")}
    assert len(victims) >= 3 and victims[0] == "memory-1", victims
    assert code == 130, out  # interrupted, after a clean shutdown
    summary = read_json(run_dir / "summary.json")
    assert summary["ok"] and summary["outcome"] == "interrupted" and summary["signal"] == "SIGINT", summary
    assert summary["restarts"] == len(victims) and not summary["failures"]
    roles = summary["roles"]
    assert {name: roles[name]["restarts"] for name in kills} == kills
    assert all(r["status"] == "done" for r in roles.values())
    rows = metrics_rows(run_dir)
    assert rows[-1]["restarts"] == len(victims)
    for key in ("env_steps", "learner_steps", "episodes"):  # no counter goes back when a role restarts
        values = [r[key] for r in rows]
        assert values == sorted(values), key
    assert [h["role"] for h in read_json(run_dir / "restarts.json")["restarts"]] == victims
    # Counters add up over incarnations: the run's env steps are every actor process's.
    assert summary["env_steps"] == sum(
        r["counters"].get("env_steps", 0) + r["retired_counters"].get("env_steps", 0)
        for name, r in roles.items()
        if name.startswith("actor")
    )
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


def test_sigkill_every_process_then_resume_continues_past_a_corrupt_checkpoint(tmp_path, launch):
    cfg = configured(
        APEX_CARTPOLE_TINY,
        agent={"scheduled_global_steps": 400},
        run={
            "checkpoint_every": 50,
            "checkpoint_interval_s": None,
            "keep_checkpoints": 3,
            "snapshot_replay": True,
            "snapshot_interval_s": 1.0,
        },
    )
    proc, run_dir = launch(cfg)
    started = pids(run_dir)
    wait_for(
        lambda: (
            len(checkpoint.list_checkpoints(run_dir / "checkpoints")) >= 3
            and (run_dir / "replay-memory-0.npz").exists()
        ),
        180,
        "three checkpoints and a replay snapshot",
    )
    for pid in [*started.values(), proc.pid]:  # every process of the run, no clean shutdown anywhere
        kill(pid)
    proc.wait(30)
    wait_for(lambda: not any(alive(pid) for pid in started.values()), 30, "every process gone")
    assert not (run_dir / "summary.json").exists()
    *_, previous, newest = checkpoint.list_checkpoints(run_dir / "checkpoints")
    data = bytearray(newest.read_bytes())
    data[len(data) // 2] ^= 0xFF
    newest.write_bytes(bytes(data))
    saved = checkpoint.read_meta(previous)
    assert saved["run"]["env_steps"] > 0 and saved["run"]["learner_steps"] > 0

    resumed = subprocess.run(
        [sys.executable, "-m", "aiorl", "run", "--resume", str(run_dir), "--quiet"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert (
        f"{newest} is corrupt (SHA-256 mismatch); set aside as {newest.name}.bad; "
        "falling back to the previous checkpoint"
    ) in resumed.stderr
    summary = read_json(run_dir / "summary.json")
    assert summary["outcome"] == "finished" and summary["attempt"] == 2 and summary["learner_steps"] >= 400
    assert summary["resumed_from"]["checkpoint"] == str(previous)
    rows = metrics_rows(run_dir)
    assert rows[0]["attempt"] == 1  # the first launch's rows are kept; the second appends
    second = [r for r in rows if r["attempt"] == 2]
    # The resumed counters start at the checkpointed values, and only grow from there.
    assert (second[0]["env_steps"], second[0]["learner_steps"], second[0]["episodes"]) == (
        saved["run"]["env_steps"],
        saved["run"]["learner_steps"],
        saved["run"]["episodes"],
    )
    for key in ("env_steps", "learner_steps", "episodes", "time_s"):
        values = [r[key] for r in second]
        assert values == sorted(values), key
    assert second[0]["time_s"] >= saved["run"]["time_s"]  # the clock goes on too
    learner = summary["roles"]["learner-0"]["stats"]
    assert learner["total_learner_steps"] - learner["learner_steps"] == saved["learner_steps"]
    assert saved["run"]["learner_steps"] == saved["learner_steps"]  # one learner: the run's steps are its own
    assert summary["roles"]["memory-0"]["stats"]["snapshot_restored_rows"] > 0
    owner = read_json(run_dir / "run.json")
    assert [a["resume_from"] for a in owner["attempts"]] == [None, str(previous)]


@pytest.fixture(scope="module")
def stalled_run(tmp_path_factory):
    """A run whose coordinator is SIGSTOPped (and never continued) while it is RUNNING."""
    tmp_path = tmp_path_factory.mktemp("stalled")
    proc, run_dir = start(
        tmp_path,
        configured(
            RANDOM_CARTPOLE,
            cluster={"actors": 1, "memories": 2, "learners": 1, **NO_RESTARTS},
            agent={"scheduled_timesteps": 10**9},
        ),
    )
    stopped = None
    try:
        started = pids(run_dir)
        wait_for(lambda: (last_metrics(run_dir) or {}).get("learner_steps", 0) > 5, 120, "learner steps")
        stopped = started["memory-0"]
        os.kill(stopped, signal.SIGSTOP)  # the launcher must not wait for it
        code, out = finish(proc, timeout_s=120)
    finally:
        if stopped is not None:
            kill(stopped)
        proc.kill()
    return tmp_path, run_dir, started, code, out


def test_a_stalled_coordinator_is_killed_and_blamed_alone(stalled_run):
    _, run_dir, started, code, out = stalled_run
    assert code == 1, out
    exits = read_json(run_dir / "exits.json")
    assert exits.pop("memory-0") == -signal.SIGKILL
    assert set(exits.values()) == {3}, exits  # every other role lost the coordinator
    summary = read_json(run_dir / "summary.json")
    assert summary["written_by"] == "launcher" and summary["outcome"] == "failed"
    assert len(summary["failures"]) == 1 and summary["failures"][0].startswith("memory-0 (the coordinator) stopped")
    assert summary["roles"]["memory-0"]["status"] == "stalled"
    assert {r["status"] for n, r in summary["roles"].items() if n != "memory-0"} == {"lost the coordinator"}
    assert "memory-0 (the coordinator) stopped answering" in out
    assert not any(alive(pid) for pid in started.values())


def test_running_twice_into_one_run_directory_is_refused_and_changes_nothing(stalled_run):
    tmp_path, run_dir, _, _, _ = stalled_run

    def tree() -> dict:
        return {
            str(p.relative_to(run_dir)): (p.stat().st_mtime_ns, hashlib.sha256(p.read_bytes()).hexdigest())
            for p in sorted(run_dir.rglob("*"))
            if p.is_file()
        }

    before = tree()
    again = subprocess.run(
        [sys.executable, "-m", "aiorl", "run", str(tmp_path / "config.json"), "--quiet"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert again.returncode == 2 and again.stdout == ""
    lines = again.stderr.strip().splitlines()
    assert len(lines) == 1 and "already holds a run" in lines[0] and f"aiorl run --resume {run_dir}" in lines[0]
    assert tree() == before
    # `aiorl status` reports that run's own summary (the launcher's), proven by its launch id.
    status = subprocess.run(
        [sys.executable, "-m", "aiorl", "status", str(run_dir), "--json"], capture_output=True, text=True, timeout=60
    )
    summary = json.loads(status.stdout)
    assert summary["launch_id"] == read_json(run_dir / "run.json")["attempts"][-1]["launch_id"]
    assert summary["written_by"] == "launcher"


class CuttableProxy:
    """A TCP proxy on loopback whose connections the test can drop (the listener stays up)."""

    def __init__(self, target_port: int):
        self.target = ("127.0.0.1", target_port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.pairs: list[tuple[socket.socket, socket.socket]] = []
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            with self.lock:
                self.pairs.append((client, upstream))
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def cut(self) -> int:
        """Reset every open connection (SO_LINGER 0: the peers see a reset, as on a network drop)."""
        with self.lock:
            pairs, self.pairs = self.pairs, []
        for pair in pairs:
            for s in pair:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
                s.close()
        return len(pairs)

    def close(self) -> None:
        self.listener.close()
        self.cut()


def test_a_role_started_by_hand_rejoins_after_its_connection_drops(tmp_path, launch):
    from aiorl.wire import generate_token

    path, run_dir = write_config(
        tmp_path,
        configured(
            RANDOM_CARTPOLE, cluster={"actors": 1, "memories": 1, "learners": 1}, agent={"scheduled_timesteps": 10**9}
        ),
    )
    env = {**os.environ, "AIORL_TOKEN": generate_token().decode()}

    def role(kind, *extra):
        return launch.track(
            subprocess.Popen(
                [sys.executable, "-m", "aiorl", "run", str(path), "--role", kind, "--index", "0", *extra],
                env=env,
                cwd=tmp_path,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )

    procs = [role("memory")]
    proxy = None
    try:
        port = wait_for(
            lambda: (read_json(run_dir / "coordinator.json") if (run_dir / "coordinator.json").exists() else {}).get(
                "port"
            ),
            60,
            "coordinator",
        )
        proxy = CuttableProxy(port)
        procs += [
            role("learner", "--set", f"cluster.port={port}"),
            role("actor", "--set", f"cluster.port={proxy.port}"),
        ]  # its control connection via the proxy
        wait_for(lambda: (last_metrics(run_dir) or {}).get("env_steps", 0) > 2000, 120, "env steps")
        assert proxy.cut() == 1  # the actor's control connection drops; the proxy still listens
        # The schedule cannot end the run under the rejoin (its data connection kept stepping it
        # on, and a 20k-step schedule once ended before the actor was back): it is stopped once
        # the actor rejoined, through its coordinator.
        actor_log = run_dir / "logs" / "actor-0.log"
        wait_for(lambda: "rejoined the coordinator (rejoin 1)" in actor_log.read_text(), 60, "the rejoin")
        steps = last_metrics(run_dir)["env_steps"]
        wait_for(lambda: last_metrics(run_dir)["env_steps"] > steps + 2000, 60, "steps after the rejoin")
        procs[0].send_signal(signal.SIGINT)
        codes = [p.wait(120) for p in procs]
    finally:
        if proxy is not None:
            proxy.close()
    assert codes == [130, 130, 130], [p.stdout.read() for p in procs]  # interrupted, after a clean stop
    summary = read_json(run_dir / "summary.json")
    assert summary["ok"] and summary["outcome"] == "interrupted" and summary["restarts"] == 0, summary
    assert summary["env_steps"] > steps + 2000 and not summary["failures"], summary
    assert summary["roles"]["actor-0"]["status"] == "done", summary["roles"]["actor-0"]
    assert "reconnecting" in actor_log.read_text()
    assert "actor-0 rejoined" in (run_dir / "logs" / "memory-0.log").read_text()
