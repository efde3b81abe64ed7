"""What the benches share: the repository's path, their JSON output (with the machine and its load
beside the numbers), an `aiorl run` they launch and always end, waiting on a condition, and a run's
metrics rows.

A bench runs as ``python bench/NAME.py`` from the repository root: its own folder is then first on
``sys.path``, so ``import common`` needs no path edit (aiorl is installed in the venv)."""

from __future__ import annotations

import contextlib
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
# Read as the bench starts (it imports this module first thing): the load the run began in.
LOAD_AT_START = os.getloadavg()


# ---------------------------------------------------------------------------------------------- JSON


def _version(package: str) -> str | None:
    """An installed package's version, read from its metadata (importing torch takes seconds)."""
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def _commit() -> str | None:
    """The repository's commit, with "-dirty" when tracked files differ from it; None outside git."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if head.returncode != 0:
        return None
    return head.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


def machine(load_before: Sequence[float] | None = None) -> dict:
    """The machine and its load: cores, the load average when the bench began (or `load_before`) and
    now, Python, torch and numpy, and the commit measured."""
    return {
        "cpus": os.cpu_count(),
        "loadavg_before": list(LOAD_AT_START if load_before is None else load_before),
        "loadavg_after": list(os.getloadavg()),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "arch": platform.machine(),
        "torch": _version("torch"),
        "numpy": _version("numpy"),
        "commit": _commit(),
    }


def write_json(path: str | Path, result: Any, *, indent: int = 1, load_before: Sequence[float] | None = None) -> None:
    """Write a bench's `result` to `path` with a "machine" block (`machine()`): a dict gains the key, a
    list of rows becomes ``{"rows": [...], "machine": {...}}``. Values JSON does not know are written
    as their str()."""
    result = {**result} if isinstance(result, dict) else {"rows": list(result)}
    result["machine"] = machine(load_before)
    Path(path).write_text(json.dumps(result, indent=indent, default=str))


# ---------------------------------------------------------------------------------------------- waiting


def wait_for(predicate: Callable[[], Any], timeout_s: float, interval_s: float = 0.05) -> Any:
    """The first true value of `predicate()` within `timeout_s` seconds, polled every `interval_s`;
    None when the time runs out."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval_s)
    return None


# ---------------------------------------------------------------------------------------------- metrics


def metrics_rows(run_dir: Path, phase: str | None = None) -> list[dict]:
    """The whole rows of `run_dir`'s metrics.jsonl (a line still being written does not parse and is
    left out), only those of `phase` when one is named; [] before the file exists."""
    path = Path(run_dir) / "metrics.jsonl"
    try:
        lines = path.read_text(errors="replace").splitlines()
    except FileNotFoundError:
        return []
    rows = []
    for line in lines:
        try:
            rows.append(json.loads(line))
        except ValueError:
            continue
    return rows if phase is None else [r for r in rows if r.get("phase") == phase]


def last_metrics_row(run_dir: Path) -> dict:
    """The newest whole metrics row of `run_dir`; {} while there is none."""
    rows = metrics_rows(run_dir)
    return rows[-1] if rows else {}


def read_json(path: Path) -> dict | None:
    """A JSON file's object; None while it is missing or half-written."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


# ---------------------------------------------------------------------------------------------- launching


def aiorl_run_command(config: str | Path, sets: Sequence[str] = (), *, quiet: bool = True) -> list[str]:
    """``python -m aiorl run CONFIG [--quiet] --set KEY=VALUE ...``, with this interpreter."""
    command = [sys.executable, "-m", "aiorl", "run", str(config), *(["--quiet"] if quiet else [])]
    return command + [arg for s in sets for arg in ("--set", s)]


class Launch:
    """One `aiorl run` of a config dict or file, in `run_dir` (default: a fresh temporary one), as a
    context: started on entry, ended on exit whatever happened (SIGINT, the run's normal shutdown
    phases, then SIGKILL after `grace_s`). A dict config is written as JSON beside its run
    directory with run.dir set to it; a file gets ``--set run.dir=...`` after `sets` unless they name
    one (then it must be `run_dir`)."""

    def __init__(
        self,
        config: dict | str | Path,
        run_dir: Path | None = None,
        sets: Sequence[str] = (),
        *,
        output: Any = subprocess.DEVNULL,
        env: dict | None = None,
        cwd: Path | None = ROOT,
        grace_s: float = 120.0,
    ):
        self.run_dir = Path(run_dir) if run_dir is not None else Path(tempfile.mkdtemp(prefix="aiorl-bench-")) / "run"
        if isinstance(config, dict):
            config = {**config, "run": {**config.get("run", {}), "dir": str(self.run_dir)}}
            self.run_dir.parent.mkdir(parents=True, exist_ok=True)
            path = self.run_dir.with_name(self.run_dir.name + ".json")
            path.write_text(json.dumps(config))
            self.command = aiorl_run_command(path, sets)
        else:
            named = any(s.startswith("run.dir=") for s in sets)
            self.command = aiorl_run_command(config, [*sets] if named else [*sets, f"run.dir={self.run_dir}"])
        self.output, self.env, self.cwd, self.grace_s = output, env, cwd, grace_s
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> Launch:
        text = self.output is subprocess.PIPE
        self.proc = subprocess.Popen(
            self.command, cwd=self.cwd, env=self.env, stdout=self.output, stderr=subprocess.STDOUT, text=text
        )
        return self

    def __exit__(self, *exc) -> None:
        self.end()

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def end(self, grace_s: float | None = None) -> int | None:
        """Stop the run if it still runs (SIGINT, then SIGKILL after `grace_s`); its exit code."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(self.grace_s if grace_s is None else grace_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(30)
        return self.proc.returncode

    def pids(self) -> dict:
        """The roles' process ids (pids.json); {} before the launcher has written them."""
        return read_json(self.run_dir / "pids.json") or {}

    def summary(self) -> dict:
        """The run's summary.json; {} before the run has ended."""
        return read_json(self.run_dir / "summary.json") or {}
