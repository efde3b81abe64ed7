"""Start-up and shut-down benchmark (issue 30, "fast starts and fast ends"): how long `aiorl run`
takes to reach RUNNING, to exit after the run has ended, to restart a killed actor and to have
learner 0's evaluation worker ready, and how long the `aiorl config` commands take, each beside
``python -c "import torch, gymnasium"`` timed in the same invocation (the reference: one import
of what every role needs, timed once at the start of every round of repeats).

    python bench/startup.py [--repeats 5] [--only launch|exit|restart|eval|config ...]
        [--set KEY=VALUE ...] [--compare-set KEY=VALUE ...] [--json out.json] [--keep]

Rows (each figure the median of --repeats, in seconds and as a ratio to the import's median):

- ``launch``: launch -> RUNNING for the CartPole examples of Ape-X DQN, DPPO, ES and IMPALA
  (examples/*_cartpole.yaml, evaluation during training on as they come): from just before the
  bench starts ``aiorl run CONFIG --quiet --set run.dir=...`` to the RUNNING phase's wall time
  in the run's summary.json. Each run stops after ``--run-seconds`` of RUNNING
  (``run.max_seconds``) and must end cleanly (exit 0, summary ok). Target <= 1.5x the import.
- ``exit``: EXITED -> the launcher's exit, from the same runs: the EXITED phase's wall time in
  summary.json to the return of the bench's ``wait()`` on ``aiorl run``. Target <= 0.3 s.
- ``restart``: an Ape-X DQN CartPole run with 2 actors and ``cluster.max_restarts=5``; once
  memory-0's log says ``phase RUNNING`` (and ``--settle`` seconds more), actor-0's pid (pids.json)
  is sent SIGKILL; the figure runs to the coordinator's ``actor-0 restarted`` line in
  logs/memory-0.log, less the restart's backoff (``cluster.restart_backoff_s`` of the run's
  resolved config.yaml). The run is then interrupted (SIGINT: the clean shutdown, exit 130).
  Target <= 0.5 s (+ the backoff).
- ``eval``: learner 0's evaluation worker ready after learner 0 registers: from learner-0.log's
  ``registered with the coordinator`` line to its ``evaluation worker ready`` line, from the
  launch runs (every example; with only ``--only eval``, Ape-X DQN's alone). n/a where the log
  has no such line. Target <= 0.3 s.
- ``config``: the wall time of ``aiorl config apex_dqn`` and of
  ``aiorl config show examples/dppo_cartpole.yaml``. Target < 1 s.

Every ``aiorl`` is started as ``python -m aiorl`` with this interpreter, so PYTHONPATH decides
which tree runs. ``--set`` goes to every ``aiorl run``; ``--compare-set`` (repeatable) measures
every run row a second time with those overrides too (e.g. ``cluster.warm_spawner=false``: the
old process model beside the new one), alternating which goes first, and prints both columns.
Below the table, where the time of each launch went: the median offset, from the launch, of
memory-0's first log line, the coordinator listening, each role's ``starting`` and
``registered`` lines and RUNNING; and after EXITED, of each role's last log line and the
launcher's exit.

Every process the bench starts is in a session of its own; on any exit path (an error, Ctrl-C,
SIGTERM) the bench kills the process group of every ``aiorl run`` it started and every process
left whose command line names its temporary directory (roles, evaluation workers). A process
still there after a run ended by itself is reported as left behind. The runs' directories are
removed afterwards unless ``--keep``. Tests never assert on these figures; the figures of a
shared machine are indicative only.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import common
from common import ROOT, read_json

EXAMPLES = ("apex_dqn_cartpole", "dppo_cartpole", "es_cartpole", "impala_cartpole")
RESTART_EXAMPLE = "apex_dqn_cartpole"
REFERENCE = [sys.executable, "-c", "import torch, gymnasium"]
CONFIG_COMMANDS = {
    "aiorl config apex_dqn": ["config", "apex_dqn"],
    "aiorl config show examples/dppo_cartpole.yaml": ["config", "show", str(ROOT / "examples" / "dppo_cartpole.yaml")],
}
ROWS = ("launch", "exit", "restart", "eval", "config")
# Targets: (kind, value); "ratio" is a multiple of the import's median, "s" seconds (at most),
# "s<" seconds (strictly below).
TARGETS = {
    "launch": ("ratio", 1.5),
    "exit": ("s", 0.3),
    "restart": ("s", 0.5),
    "eval": ("s", 0.3),
    "config": ("s<", 1.0),
}
EVAL_READY = "evaluation worker ready"
REGISTERED = "registered with the coordinator"
LOG_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) ")
POLL_S = 0.02


# --------------------------------------------------------------------------- processes


class Processes:
    """Every `aiorl run` the bench started, and the one directory all their runs live in: on
    any exit path `kill_all` ends them, and every process whose command line names the directory."""

    def __init__(self, workdir: Path):
        self.workdir = workdir
        self.procs: list[subprocess.Popen] = []

    def start(self, cmd: list[str], out_path: Path) -> subprocess.Popen:
        with open(out_path, "wb") as out:
            proc = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, cwd=ROOT
            )
        self.procs.append(proc)
        return proc

    def kill_group(self, proc: subprocess.Popen) -> None:
        if proc.poll() is None:  # not reaped: its pid (and group) is still its own
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()

    def kill_all(self) -> list[str]:
        for proc in self.procs:
            self.kill_group(proc)
        return kill_naming(str(self.workdir))


def _cmdline(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return None


def _descends_from(pid: int, ancestor: int) -> bool:
    """Whether `ancestor` is `pid`'s parent, or its parent's, ... (Linux /proc). A role forked by
    the warm spawner has the spawner's command line, without the run directory."""
    for _ in range(16):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return False
        pid = int(stat.rsplit(")", 1)[1].split()[1])  # the field after the state: the parent's pid
        if pid == ancestor:
            return True
        if pid <= 1:
            return False
    return False


def process_start(pid: int) -> float | None:
    """When process `pid` started, as a Unix time (Linux: its start in clock ticks since boot;
    the boot's wall time from /proc/uptime, to 10 ms)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, ValueError):
        return None
    ticks = int(stat.rsplit(")", 1)[1].split()[19])  # field 22, after the command's parentheses
    return time.time() - uptime + ticks / os.sysconf("SC_CLK_TCK")


def processes_naming(text: str) -> dict[int, str]:
    """Processes of this user whose command line holds `text` (Linux /proc; elsewhere none)."""
    out = {}
    me = os.getpid()
    uid = os.getuid()
    for entry in Path("/proc").glob("[0-9]*"):
        pid = int(entry.name)
        if pid == me:
            continue
        try:
            if entry.stat().st_uid != uid:
                continue
        except OSError:
            continue
        cmd = _cmdline(pid)
        if cmd and text in cmd:
            out[pid] = cmd
    return out


def kill_naming(text: str) -> list[str]:
    """SIGKILL every process (its group too, where it leads one) whose command line holds `text`;
    returns their command lines."""
    killed = []
    for _ in range(5):  # a process may fork while we look
        found = processes_naming(text)
        if not found:
            break
        for pid, cmd in found.items():
            killed.append(cmd)
            try:
                if os.getpgid(pid) == pid:
                    os.killpg(pid, signal.SIGKILL)
                else:
                    os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.1)
    return killed


# --------------------------------------------------------------------------- logs and files


def log_time(line: str) -> float | None:
    """A log line's local-time timestamp (``YYYY-MM-DD HH:MM:SS,mmm``) as a Unix time."""
    m = LOG_LINE.match(line)
    if m is None:
        return None
    return time.mktime(time.strptime(m.group(1), "%Y-%m-%d %H:%M:%S")) + int(m.group(2)) / 1000


def log_lines(path: Path) -> list[str]:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return []
    lines = text.split("\n")
    return lines[:-1]  # the last may be half-written


def first_time(path: Path, needle: str) -> float | None:
    for line in log_lines(path):
        if needle in line:
            t = log_time(line)
            if t is not None:
                return t
    return None


def last_time(path: Path) -> float | None:
    for line in reversed(log_lines(path)):
        t = log_time(line)
        if t is not None:
            return t
    return None


def phase_times(summary: dict | None) -> dict[str, float]:
    """Each phase's wall time in summary.json: the first RUNNING, the last of the others."""
    out: dict[str, float] = {}
    for p in (summary or {}).get("phases") or []:
        if p.get("phase") == "RUNNING" and "RUNNING" in out:
            continue
        out[p.get("phase")] = p.get("time")
    return out


def timeline(run_dir: Path, t0: float, exited: float | None, t_end: float) -> dict:
    """Where a run's time went, from its role logs: start marks in seconds since the launch, end
    marks in seconds since EXITED."""
    start, end = {}, {}
    logs = run_dir / "logs"
    memory0 = logs / "memory-0.log"
    first = next((log_time(line) for line in log_lines(memory0) if log_time(line) is not None), None)
    marks = [("memory-0 first line", first), ("coordinator listening", first_time(memory0, "coordinator listening"))]
    paths = sorted(logs.glob("*.log"), key=lambda p: (not p.stem.startswith("memory"), p.stem))
    for path in paths:
        marks.append((f"{path.stem} starting", first_time(path, "starting (pid")))
        marks.append((f"{path.stem} registered", first_time(path, REGISTERED)))
    for name, t in marks:
        if t is not None:
            start[name] = t - t0
    if exited is not None:
        for path in paths:
            t = first_time(path, "exit (run ")
            if t is not None:
                end[f"{path.stem} exiting"] = t - exited
            t = last_time(path)
            if t is not None:
                end[f"{path.stem} last line"] = t - exited
        end["launcher exit"] = t_end - exited
    return {"start": start, "end": end}


def last_output_line(path: Path) -> str:
    lines = [x for x in tail(path, 40).splitlines() if x.strip() and not x.startswith("aiorl: run directory")]
    return lines[-1].strip()[:300] if lines else "(no output)"


def tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


# --------------------------------------------------------------------------- measurements


def time_command(cmd: list[str], timeout: float = 120.0) -> tuple[float | None, str | None]:
    """Wall seconds of `cmd` (its output discarded); (None, why) when it failed."""
    t = time.perf_counter()
    try:
        out = subprocess.run(
            cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=timeout, cwd=ROOT
        )
    except subprocess.TimeoutExpired:
        return None, f"timed out after {timeout:g} s"
    elapsed = time.perf_counter() - t
    if out.returncode != 0:
        return None, f"exit code {out.returncode}: {out.stderr.decode(errors='replace').strip()[-500:]}"
    return elapsed, None


def aiorl(*args: str) -> list[str]:
    return [sys.executable, "-m", "aiorl", *args]


def run_command(example: str, run_dir: Path, sets: list[str]) -> list[str]:
    cmd = aiorl("run", str(ROOT / "examples" / f"{example}.yaml"), "--quiet", "--set", f"run.dir={run_dir}")
    for s in sets:
        cmd += ["--set", s]
    return cmd


def finish(procs: Processes, proc: subprocess.Popen, run_dir: Path, record: dict, out_path: Path) -> None:
    """After a run's launcher exited: what it left behind, what it printed when it failed."""
    left = kill_naming(str(run_dir))
    if left:
        record["left_behind"] = left
        record["errors"].append(f"{len(left)} process(es) left behind: {left[0][:200]}")
    if record["errors"] or record.get("rc") not in record.get("ok_codes", (0,)):
        record["output_tail"] = tail(out_path)


def launch_run(procs: Processes, example: str, sets: list[str], tag: str, run_seconds: float, timeout: float) -> dict:
    """One run of `example`: launch -> RUNNING, EXITED -> exit, evaluation worker ready, timeline."""
    run_dir = procs.workdir / tag
    out_path = procs.workdir / f"{tag}.out"
    cmd = run_command(example, run_dir, [f"run.max_seconds={run_seconds}", *sets])
    record: dict = {"run_dir": str(run_dir), "errors": [], "ok_codes": [0]}
    t0 = time.time()
    proc = procs.start(cmd, out_path)
    watcher = EndWatcher(run_dir, proc.pid)
    watcher.start()
    timer = threading.Timer(timeout, _kill_overdue, (proc, record, timeout))
    timer.start()
    try:
        record["rc"] = proc.wait()  # blocking: returns the moment it exits (wait(timeout) polls)
    finally:
        t_end = time.time()
        timer.cancel()
        watcher.stop.set()
        watcher.join()
    summary = read_json(run_dir / "summary.json")
    phases = phase_times(summary)
    if record["rc"] != 0:
        record["errors"].append(f"aiorl run exited {record['rc']}: {last_output_line(out_path)}")
    elif not (summary or {}).get("ok"):
        record["errors"].append(f"summary not ok: {(summary or {}).get('stop_reason')}")
    running, exited = phases.get("RUNNING"), phases.get("EXITED")
    record["launch_s"] = None if running is None else running - t0
    record["exit_s"] = None if exited is None else t_end - exited
    learner0 = run_dir / "logs" / "learner-0.log"
    registered, ready = first_time(learner0, REGISTERED), first_time(learner0, EVAL_READY)
    record["eval_ready_s"] = None if registered is None or ready is None else ready - registered
    record["phases"] = {k: v - t0 for k, v in phases.items()}
    record["timeline"] = timeline(run_dir, t0, exited, t_end)
    for name, t in watcher.started.items():
        record["timeline"]["start"][f"{name} process started"] = t - t0
    if exited is not None:
        for name, t in watcher.ended.items():
            record["timeline"]["end"][f"{name} process ended"] = t - exited
    finish(procs, proc, run_dir, record, out_path)
    return record


def _kill_overdue(proc: subprocess.Popen, record: dict, timeout: float) -> None:
    if proc.returncode is None:  # (the main thread is in wait(): the pid is not reaped yet)
        record["errors"].append(f"still running after {timeout:g} s: killed")
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


class EndWatcher(threading.Thread):
    """When each process of a run ended (a zombie or gone): its roles (pids.json) and the
    evaluation worker, found by their command lines naming the run directory; checked every
    POLL_S, looked for every 0.5 s."""

    def __init__(self, run_dir: Path, launcher_pid: int):
        super().__init__(daemon=True)
        self.run_dir, self.launcher_pid = run_dir, launcher_pid
        self.stop = threading.Event()
        self.started: dict[str, float] = {}  # name -> when its first process started
        self.ended: dict[str, float] = {}  # name -> when its latest process ended
        self.watching: dict[int, str] = {}
        self.seen: set[int] = set()

    def _discover(self) -> None:
        names = {pid: name for name, pid in (read_json(self.run_dir / "pids.json") or {}).items()}
        for pid, cmd in processes_naming(str(self.run_dir)).items():
            if pid in self.seen or pid == self.launcher_pid:
                continue
            name = names.get(pid) or ("evaluation worker" if "aiorl.evaluation.worker" in cmd else None)
            if name is not None:
                self.seen.add(pid)
                self.watching[pid] = name
                started = process_start(pid)
                if started is not None:
                    self.started.setdefault(name, started)

    def run(self) -> None:
        look = 0.0
        text = str(self.run_dir)
        while not self.stop.is_set():
            now = time.monotonic()
            if now >= look:
                self._discover()
                look = now + 0.5
            for pid, name in list(self.watching.items()):
                if text not in (_cmdline(pid) or ""):  # a zombie's command line is empty
                    self.ended[name] = time.time()
                    del self.watching[pid]
            self.stop.wait(POLL_S)


def wait_for(path: Path, needle: str, proc: subprocess.Popen, deadline: float) -> float | None:
    """The timestamp of `path`'s first line holding `needle`, polled until it appears, `proc`
    exits or `deadline` (monotonic) passes."""
    while time.monotonic() < deadline:
        t = first_time(path, needle)
        if t is not None:
            return t
        if proc.poll() is not None:
            return first_time(path, needle)
        time.sleep(POLL_S)
    return None


def restart_run(procs: Processes, sets: list[str], tag: str, settle_s: float, timeout: float) -> dict:
    """SIGKILL actor-0 of a running Ape-X DQN run; seconds until the coordinator logs its restart."""
    run_dir = procs.workdir / tag
    out_path = procs.workdir / f"{tag}.out"
    overrides = ["cluster.actors=2", "cluster.max_restarts=5", f"run.max_seconds={timeout}", *sets]
    record: dict = {"run_dir": str(run_dir), "errors": [], "ok_codes": [128 + signal.SIGINT]}
    memory0 = run_dir / "logs" / "memory-0.log"
    proc = procs.start(run_command(RESTART_EXAMPLE, run_dir, overrides), out_path)
    deadline = time.monotonic() + timeout
    try:
        if wait_for(memory0, "phase RUNNING", proc, deadline) is None:
            record["errors"].append("the run never reached RUNNING")
            return record
        time.sleep(settle_s)
        pid = (read_json(run_dir / "pids.json") or {}).get("actor-0")
        if pid is None or not _descends_from(pid, proc.pid):
            record["errors"].append(f"actor-0's pid ({pid}) is not a role of this run")
            return record
        t_kill = time.time()
        os.kill(pid, signal.SIGKILL)
        restarted = wait_for(memory0, "actor-0 restarted", proc, deadline)
        if restarted is None:
            record["errors"].append("memory-0.log never said `actor-0 restarted`")
            return record
        config = read_config(run_dir / "config.yaml")
        backoff = float(config.get("cluster", {}).get("restart_backoff_s", 0.0))
        record["backoff_s"] = backoff
        history = (read_json(run_dir / "restarts.json") or {}).get("restarts") or []
        record["restart_total_s"] = restarted - t_kill
        # The new process's first line: what the restart spent before its own code ran.
        new = [log_time(x) for x in log_lines(run_dir / "logs" / "actor-0.log") if "starting (pid" in x]
        new = [t for t in new if t is not None and t >= t_kill - 0.001]
        record["new_process_starting_s"] = new[0] - t_kill if new else None
        record["restart_s"] = restarted - t_kill - backoff
        os.kill(proc.pid, signal.SIGINT)  # the clean shutdown
        record["rc"] = proc.wait(max(1.0, deadline - time.monotonic()))
        history = (read_json(run_dir / "restarts.json") or {}).get("restarts") or history
        record["launcher_delays_s"] = [h.get("delay_s") for h in history]
        if record["rc"] not in record["ok_codes"]:
            record["errors"].append(f"aiorl run exited {record['rc']} after SIGINT: {last_output_line(out_path)}")
    except subprocess.TimeoutExpired:
        record["errors"].append(f"still running after {timeout:g} s: killed")
    finally:
        procs.kill_group(proc)
        finish(procs, proc, run_dir, record, out_path)
    return record


def read_config(path: Path) -> dict:
    import yaml

    try:
        return yaml.safe_load(path.read_text()) or {}
    except OSError:
        return {}


# --------------------------------------------------------------------------- rounds and rows


def variants(args) -> list[dict]:
    out = [{"label": "as is", "sets": list(args.set)}]
    if args.compare_set:
        out.append({"label": " ".join(args.compare_set), "sets": [*args.set, *args.compare_set]})
    return out


def measure(args, procs: Processes) -> dict:
    only = set(args.only or ROWS)
    vs = variants(args)
    examples = args.example or list(EXAMPLES)
    if not only & {"launch", "exit"}:
        examples = examples[:1] if args.example else [RESTART_EXAMPLE] if "eval" in only else []
    reference: list[float] = []
    runs = {(e, v["label"]): [] for e in examples for v in vs}
    restarts = {v["label"]: [] for v in vs} if "restart" in only else {}
    configs = {name: [] for name in CONFIG_COMMANDS} if "config" in only else {}
    config_errors: dict[str, list[str]] = {name: [] for name in configs}
    for r in range(args.repeats):
        t, why = time_command(REFERENCE)
        if t is None:
            raise SystemExit(f"startup: the reference `{' '.join(REFERENCE)}` failed: {why}")
        reference.append(t)
        order = vs if r % 2 == 0 else vs[::-1]  # alternate which variant goes first
        for e in examples:
            for v in order:
                tag = f"{e}-{vs.index(v)}-{r}"
                print(f"round {r + 1}/{args.repeats}: {e} ({v['label']}) ...", file=sys.stderr, flush=True)
                runs[(e, v["label"])].append(launch_run(procs, e, v["sets"], tag, args.run_seconds, args.run_timeout))
        if restarts:
            for v in order:
                tag = f"restart-{vs.index(v)}-{r}"
                print(f"round {r + 1}/{args.repeats}: restart ({v['label']}) ...", file=sys.stderr, flush=True)
                restarts[v["label"]].append(restart_run(procs, v["sets"], tag, args.settle, args.run_timeout))
        for name in configs:
            t, why = time_command(aiorl(*CONFIG_COMMANDS[name]))
            configs[name].append(t)
            if why:
                config_errors[name].append(why)
    ref = statistics.median(reference)
    rows = []

    def row(kind: str, name: str, per_variant: dict[str, tuple[list, list]], extra: dict | None = None) -> None:
        cols = []
        for v in vs if kind != "config" else vs[:1]:
            values, errors = per_variant.get(v["label"], ([], []))
            cols.append(column(kind, v["label"] if kind != "config" else "as is", values, errors, ref))
        rows.append({"row": kind, "name": name, "target": target_text(kind, ref), "variants": cols, **(extra or {})})

    for kind, key, label in (
        ("launch", "launch_s", "launch -> RUNNING"),
        ("exit", "exit_s", "EXITED -> launcher exit"),
        ("eval", "eval_ready_s", "learner-0 registered -> eval worker ready"),
    ):
        if kind not in only:
            continue
        for e in examples:
            per = {}
            for v in vs:
                recs = runs[(e, v["label"])]
                per[v["label"]] = ([rec.get(key) for rec in recs], [x for rec in recs for x in rec["errors"]])
            row(kind, f"{label}, {e.removesuffix('_cartpole')}", per)
    if restarts:
        per = {
            label: ([rec.get("restart_s") for rec in recs], [x for rec in recs for x in rec["errors"]])
            for label, recs in restarts.items()
        }
        backoffs = sorted({rec["backoff_s"] for recs in restarts.values() for rec in recs if "backoff_s" in rec})
        row("restart", "actor-0 SIGKILL -> restarted, less backoff", per, {"backoff_s": backoffs})
    for name, values in configs.items():
        row("config", name, {"as is": (values, config_errors[name])})
    return {
        "reference": {"command": 'python -c "import torch, gymnasium"', "times_s": reference, "median_s": ref},
        "repeats": args.repeats,
        "run_seconds": args.run_seconds,
        "set": list(args.set),
        "compare_set": list(args.compare_set),
        "variants": [v["label"] for v in vs],
        "rows": rows,
        "runs": {f"{e} / {label}": recs for (e, label), recs in runs.items()},
        "restart_runs": restarts,
    }


def column(kind: str, label: str, values: list, errors: list[str], ref: float) -> dict:
    got = [v for v in values if v is not None]
    median = statistics.median(got) if got else None
    return {
        "label": label,
        "times_s": values,
        "median_s": median,
        "ratio": None if median is None else median / ref,
        "met": None if median is None else met(kind, median, ref),
        "errors": errors,
    }


def met(kind: str, seconds: float, ref: float) -> bool:
    how, value = TARGETS[kind]
    if how == "ratio":
        return seconds <= value * ref
    if how == "s<":
        return seconds < value
    return seconds <= value


def target_text(kind: str, ref: float) -> str:
    how, value = TARGETS[kind]
    if how == "ratio":
        return f"<= {value:g}x import ({value * ref:.2f} s)"
    if kind == "restart":
        return f"<= {value:g} s + backoff"
    return f"{'<' if how == 's<' else '<='} {value:g} s"


# --------------------------------------------------------------------------- output


def print_table(result: dict) -> None:
    ref = result["reference"]
    print(
        f"\nstartup: medians of {result['repeats']}; reference `{ref['command']}` "
        f"median {ref['median_s']:.2f} s ({min(ref['times_s']):.2f}-{max(ref['times_s']):.2f})"
    )
    if result["set"]:
        print(f"every run with --set {' --set '.join(result['set'])}")
    width = max([len(r["name"]) for r in result["rows"]] + [10])
    labels = result["variants"]
    widths = [max(24, len(label)) for label in labels]
    head = f"{'row':<{width}}"
    for label, w in zip(labels, widths):
        head += f" | {label:>{w}}"
    print(head + " | target")
    for r in result["rows"]:
        line = f"{r['name']:<{width}}"
        for i, w in enumerate(widths):
            col = r["variants"][i] if i < len(r["variants"]) else None
            line += f" | {cell(col):>{w}}"
        print(line + f" | {r['target']}")
    errors: dict[tuple[str, str], list[str]] = {}  # each once, with the rows it touched
    for r in result["rows"]:
        for col in r["variants"]:
            for e in col["errors"]:
                rows = errors.setdefault((col["label"], e), [])
                if r["name"] not in rows:
                    rows.append(r["name"])
    for (label, e), rows in errors.items():
        print(f"  error ({label}; {', '.join(rows)}): {e[:240]}")
    restart = next((r for r in result["rows"] if r["row"] == "restart"), None)
    if restart is not None:
        print(f"restart backoff (cluster.restart_backoff_s) subtracted: {restart.get('backoff_s')}")
        for label, recs in result["restart_runs"].items():
            starting = [r["new_process_starting_s"] for r in recs if r.get("new_process_starting_s") is not None]
            total = [r["restart_total_s"] for r in recs if r.get("restart_total_s") is not None]
            if starting and total:
                print(
                    f"  ({label}) SIGKILL -> the new actor-0's `starting` line {statistics.median(starting):.2f} s, "
                    f"-> `actor-0 restarted` {statistics.median(total):.2f} s (medians, backoff included)"
                )


def cell(col: dict | None) -> str:
    if col is None:
        return ""
    if col["median_s"] is None:
        return "failed" if col["errors"] else "n/a"
    verdict = "met" if col["met"] else "MISSED"
    return f"{col['median_s']:6.2f} s {col['ratio']:5.2f}x {verdict:>6}"


def median_marks(recs: list[dict], part: str) -> dict[str, float]:
    names: dict[str, list[float]] = {}
    for rec in recs:
        for name, t in (rec.get("timeline") or {}).get(part, {}).items():
            names.setdefault(name, []).append(t)
    return {name: statistics.median(ts) for name, ts in names.items()}


def print_timelines(result: dict) -> None:
    if not result["runs"]:
        return
    print("\nwhere the time went (medians; start: seconds since the launch, end: seconds since EXITED):")
    for key, recs in result["runs"].items():
        if not any(r.get("timeline", {}).get("start") for r in recs):
            continue
        marks = median_marks(recs, "start")
        if abs(marks.get("memory-0 first line", 0.0) - marks.get("memory-0 starting", 1e9)) < 0.002:
            del marks["memory-0 first line"]  # the same line
        start = sorted(marks.items(), key=lambda kv: kv[1])
        running = [r["launch_s"] for r in recs if r.get("launch_s") is not None]
        if running:
            start.append(("RUNNING", statistics.median(running)))
        end = sorted(median_marks(recs, "end").items(), key=lambda kv: kv[1])
        print(f"  {key}")
        print("    start: " + ", ".join(f"{name} {t:+.2f}" for name, t in start))
        if end:
            print("    end:   " + ", ".join(f"{name} {t:+.2f}" for name, t in end))


# --------------------------------------------------------------------------- main


def _terminate(signum, frame) -> None:
    raise SystemExit(128 + signum)  # through every finally: the runs are killed


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5, help="repeats of every figure (medians)")
    parser.add_argument("--only", action="append", choices=ROWS, help="only these rows (repeatable)")
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="override passed to every `aiorl run`"
    )
    parser.add_argument(
        "--compare-set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="also measure every run row with this override (repeatable: all together); a second column",
    )
    parser.add_argument(
        "--example", action="append", choices=EXAMPLES, help="only these examples' launch runs (repeatable)"
    )
    parser.add_argument(
        "--run-seconds",
        type=float,
        default=5.0,
        help="run.max_seconds of the launch runs (long enough for the evaluation worker to be ready)",
    )
    parser.add_argument("--settle", type=float, default=1.0, help="seconds after RUNNING before actor-0 is killed")
    parser.add_argument("--run-timeout", type=float, default=240.0, help="a run still going after this is killed")
    parser.add_argument("--json", default=None, help="write every figure here")
    parser.add_argument("--keep", action="store_true", help="keep the runs' directories (and say where)")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    for s in [*args.set, *args.compare_set]:
        if "=" not in s:
            parser.error(f"expected KEY=VALUE, got {s!r}")

    old = {sig: signal.signal(sig, _terminate) for sig in (signal.SIGTERM, signal.SIGHUP)}
    workdir = Path(tempfile.mkdtemp(prefix="aiorl-startup-"))
    procs = Processes(workdir)
    load = os.getloadavg()
    try:
        result = measure(args, procs)
    finally:
        procs.kill_all()
        for sig, handler in old.items():
            signal.signal(sig, handler)
        if args.keep:
            print(f"startup: run directories kept in {workdir}", file=sys.stderr)
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    result["python"] = sys.executable
    print_table(result)
    print_timelines(result)
    if args.json:
        # "machine": cores and the load average before and after the runs (and the versions, commit)
        common.write_json(args.json, result, load_before=load)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
