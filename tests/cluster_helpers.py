"""Start real `aiorl run` clusters (real processes, real TCP on loopback) for tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil

# A cluster of the runtime's own test algorithm (random actions, a running-mean learner).
ASYNC = {
    "algo": "random_agent",
    "env": {"id": "CartPole-v1", "num_envs": 2},
    "agent": {
        "sample_batch_size": 16,
        "batch_size": 32,
        "buffer_size": 4000,
        "learning_starts": 200,
        "publish_interval": 5,
    },
    "model": {"n_step": 3, "gamma": 0.99},
}

FAST_CLUSTER = {
    "heartbeat_interval_s": 0.2,
    "heartbeat_timeout_s": 5.0,
    "coordinator_timeout_s": 3.0,
    "start_timeout_s": 60.0,
    "phase_timeout_s": 20.0,
}

# For tests of what a loss does when nothing comes back (restarts in place and of the whole run
# are on by default; tests/cluster/test_survival.py is about those).
NO_RESTARTS = {"max_restarts": 0, "max_run_restarts": 0}


def cluster(actors: int, memories: int, learners: int, **agent) -> dict:
    """A random_agent config with these role counts and `agent` overrides (a fresh dict)."""
    config = json.loads(json.dumps(ASYNC))
    config["cluster"] = {"actors": actors, "memories": memories, "learners": learners}
    config["agent"].update(agent)
    return config


def write_config(tmp_path: Path, config: dict) -> tuple[Path, Path]:
    run_dir = tmp_path / "run"
    config = json.loads(json.dumps(config))
    config.setdefault("run", {})["dir"] = str(run_dir)
    config["run"].setdefault("metrics_interval_s", 0.2)
    config.setdefault("cluster", {})
    for key, value in FAST_CLUSTER.items():
        config["cluster"].setdefault(key, value)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    return path, run_dir


def start(
    tmp_path: Path, config: dict, *extra: str, env: dict[str, str] | None = None
) -> tuple[subprocess.Popen, Path]:
    """`aiorl run` of `config` in the background; `env`: added to this process's environment."""
    path, run_dir = write_config(tmp_path, config)
    proc = subprocess.Popen(
        [sys.executable, "-m", "aiorl", "run", str(path), "--quiet", *extra],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=None if env is None else {**os.environ, **env},
    )
    return proc, run_dir


def finish(proc: subprocess.Popen, timeout_s: float = 180.0) -> tuple[int, str]:
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        raise AssertionError(f"aiorl run did not finish within {timeout_s} s:\n{out}") from None
    return proc.returncode, out


def run(tmp_path: Path, config: dict, timeout_s: float = 180.0) -> tuple[int, str, Path]:
    proc, run_dir = start(tmp_path, config)
    code, out = finish(proc, timeout_s)
    return code, out, run_dir


def evaluated(run_dir: Path, episodes: int = 20) -> dict:
    """`aiorl eval --json` of the run's best policy over `episodes` episodes."""
    result = subprocess.run(
        [sys.executable, "-m", "aiorl", "eval", str(run_dir), "--episodes", str(episodes), "--json"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def evaluated_mean(run_dir: Path, episodes: int = 20) -> float:
    """`aiorl eval`'s mean return over `episodes` episodes of the run's best policy."""
    return evaluated(run_dir, episodes)["mean"]


def wait_for(predicate, timeout_s: float, what: str, interval_s: float = 0.05):
    """Wait on a condition; the timeout only bounds a hang."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


def read_json(path: Path):
    return json.loads(path.read_text())


def pids(run_dir: Path) -> dict[str, int]:
    return wait_for(lambda: (run_dir / "pids.json").exists() and read_json(run_dir / "pids.json"), 60, "pids.json")


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def stopped(pid: int) -> bool:
    """Whether `pid` is stopped (SIGSTOP), as a role held before it registers is."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_STOPPED
    except psutil.NoSuchProcess:
        return False


def last_metrics(run_dir: Path) -> dict | None:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return None
    lines = [l for l in path.read_text().splitlines() if l.strip()]
    return json.loads(lines[-1]) if lines else None


def check_tls_only(run_dir: Path, cert: Path, key: Path) -> None:
    """The run's coordinator speaks only TLS: a plain TCP client (right token and all) gets nowhere,
    a TLS client with the cluster's certificate is served (and finds the run RUNNING)."""
    import asyncio

    import pytest

    from aiorl.wire import WireError, connect, load_token
    from aiorl.wire.tls import client_context

    port = read_json(run_dir / "coordinator.json")["port"]
    token = load_token(run_dir / "token")

    async def probe(ssl):
        conn = await connect("127.0.0.1", port, token=token, name="probe", ssl=ssl, handshake_timeout_s=30)
        try:
            return (await conn.request("status", timeout_s=30)).meta["phase"]
        finally:
            await conn.close()

    with pytest.raises((WireError, OSError)):
        asyncio.run(probe(None))
    assert asyncio.run(probe(client_context(cert, certfile=cert, keyfile=key))) == "RUNNING"


def live_status(run_dir: Path) -> dict | None:
    """The coordinator's status (roles with their registered pids), or None if it does not answer."""
    import asyncio

    from aiorl.cli.status import fetch_status, resolve_target

    try:
        host, port, token, _ = resolve_target(str(run_dir), None)
        return asyncio.run(fetch_status(host, port, token, timeout_s=5.0))
    except Exception:
        return None
