"""Start real `aiorl run` clusters (real processes, real TCP on loopback) for tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

# The named configs live in tests/configs.py; these are imported from here by many tests.
from configs import ASYNC, FAST_CLUSTER, NO_RESTARTS, cluster  # noqa: F401


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


def end(proc: subprocess.Popen) -> None:
    """End a launched process as a test's `finally: proc.kill()` did: SIGKILL if it still runs (its
    roles end with it, as they do with a launcher killed outright), then reap it and close its pipe."""
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()


class Launcher:
    """The `launch` fixture: `launch(config, *extra, env=None, where=None) -> (proc, run_dir)` is
    `start(where or tmp_path, config, *extra, env=env)`, and every run it started is ended at the
    test's teardown, whether the test passed or failed: its launcher as `end` does, then any role
    of that launch still running (a SIGSTOPped one ignores the signal its launcher's death sends).
    `launch.track(proc)` keeps a process started some other way (a resume, a role by hand, a Ray
    driver) to be ended with them."""

    def __init__(self, tmp_path: Path):
        self.tmp_path = tmp_path
        self.launched: list[tuple[subprocess.Popen, Path | None, float]] = []

    def __call__(
        self, config: dict, *extra: str, env: dict[str, str] | None = None, where: Path | None = None
    ) -> tuple[subprocess.Popen, Path]:
        since = time.time()
        proc, run_dir = start(where or self.tmp_path, config, *extra, env=env)
        self.launched.append((proc, run_dir, since))
        return proc, run_dir

    def track(self, proc: subprocess.Popen, run_dir: Path | None = None) -> subprocess.Popen:
        self.launched.append((proc, run_dir, psutil.Process(proc.pid).create_time() if proc.poll() is None else 0.0))
        return proc

    def end_all(self) -> None:
        for proc, run_dir, since in self.launched:
            end(proc)
            if run_dir is not None:
                end_roles(run_dir, since)


def end_roles(run_dir: Path, since: float) -> None:
    """SIGKILL every role in the run's pids.json still running that started after `since` (not a
    process that took a dead role's pid before this launch)."""
    try:
        roles = read_json(run_dir / "pids.json")
    except (OSError, ValueError):
        return
    for pid in roles.values():
        try:
            role = psutil.Process(pid)
            if role.create_time() >= since - 1.0 and "aiorl" in " ".join(role.cmdline()):
                role.kill()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass


@pytest.fixture
def launch(tmp_path):
    """Launches runs for a test and ends each one still running at its teardown (see `Launcher`).
    Imported by tests/conftest.py, which makes it every test's fixture."""
    launcher = Launcher(tmp_path)
    try:
        yield launcher
    finally:
        launcher.end_all()


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
