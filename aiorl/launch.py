"""Local launcher: runs every role of a cluster as a child process of `aiorl run`.

It starts memory host 0 (the coordinator) first, reads the port it bound from
``coordinator.json``, then starts the other roles pointed at it. Ctrl-C or
SIGTERM is forwarded to the coordinator, which runs the shutdown phases; a
second one kills every child. Whatever happens, no child outlives the
launcher: each gets SIGTERM if the launcher dies (PR_SET_PDEATHSIG) and the
launcher kills any that overstay.
"""
from __future__ import annotations

import ctypes
import json
import logging
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from aiorl.config import Config
from aiorl.progress import Progress
from aiorl.rundir import write_json_atomic
from aiorl.runtime.phase import role_name
from aiorl.wire import generate_token, write_token_file

log = logging.getLogger("aiorl.launch")


class LaunchError(RuntimeError):
    pass


@dataclass
class Child:
    name: str
    proc: subprocess.Popen

    @property
    def pid(self) -> int:
        return self.proc.pid


def _die_with_parent() -> None:  # runs in the child between fork and exec
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def describe_exit(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        return f"killed by {signal.Signals(-code).name}"
    meaning = {0: "ok", 1: "error", 2: "failed", 3: "lost the coordinator", 130: "interrupted"}
    return f"exit code {code} ({meaning.get(code, 'error')})"


class LocalLauncher:
    def __init__(self, cfg: Config, run_dir: Path, quiet: bool = False):
        self.cfg = cfg
        self.run_dir = run_dir
        self.quiet = quiet
        self.children: list[Child] = []
        self.signals = 0
        self.config_path = run_dir / "config.yaml"

    def _spawn(self, kind: str, index: int, extra: list[str]) -> Child:
        cmd = [sys.executable, "-m", "aiorl", "run", str(self.config_path), "--role", kind,
               "--index", str(index), *extra]
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, start_new_session=True,
                                preexec_fn=_die_with_parent)
        child = Child(role_name(kind, index), proc)
        self.children.append(child)
        log.debug("started %s (pid %d)", child.name, proc.pid)
        return child

    def _on_signal(self, signum, frame) -> None:
        self.signals += 1
        coordinator = self.children[0] if self.children else None
        if self.signals == 1 and coordinator is not None and coordinator.proc.poll() is None:
            print(f"\naiorl: {signal.Signals(signum).name}: stopping the run cleanly "
                  "(press Ctrl-C again to kill it)", file=sys.stderr, flush=True)
            coordinator.proc.send_signal(signal.SIGTERM)
        else:
            print("\naiorl: killing every role", file=sys.stderr, flush=True)
            self.kill_all()

    def kill_all(self) -> None:
        for child in self.children:
            if child.proc.poll() is None:
                child.proc.kill()

    def _wait_coordinator_address(self, child: Child) -> int:
        path = self.run_dir / "coordinator.json"
        deadline = time.monotonic() + self.cfg.cluster.start_timeout_s
        while time.monotonic() < deadline:
            if path.exists():
                return int(json.loads(path.read_text())["port"])
            if child.proc.poll() is not None:
                raise LaunchError(f"memory-0 (the coordinator) exited before listening: "
                                  f"{describe_exit(child.proc.returncode)}; see {self.run_dir}/logs/memory-0.log")
            time.sleep(0.05)
        raise LaunchError(f"memory-0 did not start listening within {self.cfg.cluster.start_timeout_s:g} s")

    def run(self) -> int:
        token_path = self.run_dir / "token"
        if self.cfg.run.token_file is None and not os.environ.get("AIORL_TOKEN"):
            write_token_file(token_path, generate_token())
        old = {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
        progress = Progress(self.cfg, self.run_dir, quiet=self.quiet)
        try:
            coordinator = self._spawn("memory", 0, [])
            port = self._wait_coordinator_address(coordinator)
            extra = ["--set", f"cluster.port={port}"]
            c = self.cfg.cluster
            for kind, count, first in (("memory", c.memories, 1), ("learner", c.learners, 0),
                                       ("actor", c.actors, 0)):
                for i in range(first, count):
                    self._spawn(kind, i, extra)
            self._write_pids()
            progress.start()
            self._supervise(progress)
        except LaunchError as exc:
            progress.stop()
            self.kill_all()
            self._reap(5.0)
            print(f"aiorl: {exc}", file=sys.stderr)
            return 1
        finally:
            progress.stop()
            for sig, handler in old.items():
                signal.signal(sig, handler)
            self.kill_all()
            self._reap(5.0)
        return self._report()

    def _write_pids(self) -> None:
        write_json_atomic(self.run_dir / "pids.json", {c.name: c.pid for c in self.children})

    def _supervise(self, progress: Progress) -> None:
        """Wait for the children; once the coordinator is gone, give the rest a bounded time."""
        coordinator = self.children[0]
        grace = self.cfg.cluster.coordinator_timeout_s + 5.0
        deadline = None
        while True:
            progress.update()
            alive = [c for c in self.children if c.proc.poll() is None]
            if not alive:
                return
            if deadline is None and coordinator.proc.poll() is not None:
                deadline = time.monotonic() + grace
            if deadline is not None and time.monotonic() > deadline:
                for child in alive:
                    print(f"aiorl: {child.name} (pid {child.pid}) did not exit {grace:g} s after the "
                          "coordinator; killing it", file=sys.stderr)
                    child.proc.kill()
                return
            time.sleep(0.2)

    def _reap(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        for child in self.children:
            try:
                child.proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                child.proc.kill()
                child.proc.wait()

    def _report(self) -> int:
        summary_path = self.run_dir / "summary.json"
        summary = json.loads(summary_path.read_text()) if summary_path.exists() else None
        failed = [c for c in self.children if c.proc.returncode != 0]
        write_json_atomic(self.run_dir / "exits.json", {c.name: c.proc.returncode for c in self.children})
        lines = []
        if summary is not None:
            lines.append(f"aiorl: run finished ({summary.get('stop_reason')}): env_steps {summary['env_steps']}, "
                         f"learner_steps {summary['learner_steps']}, episodes {summary['episodes']}")
            for failure in summary.get("failures", []):
                lines.append(f"aiorl: {failure}")
        else:
            lines.append("aiorl: the coordinator wrote no summary (it did not finish)")
        for child in failed:
            lines.append(f"aiorl: {child.name} (pid {child.pid}) {describe_exit(child.proc.returncode)}; "
                         f"log: {self.run_dir}/logs/{child.name}.log")
        ok = not failed and summary is not None and summary.get("ok")
        lines.append(f"aiorl: run directory {self.run_dir} ({'ok' if ok else 'FAILED'})")
        print("\n".join(lines), file=sys.stderr if not ok else sys.stdout, flush=True)
        return 0 if ok else 1
