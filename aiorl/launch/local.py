"""Local launcher: runs every role of a cluster as a child process of `aiorl run`.

Every role is forked from the warm spawner (`aiorl.launch.spawner`), all at once:
memory host 0 (the coordinator) and the others, which read the port it bound from
``coordinator.json`` themselves (only one this launch wrote: see `aiorl.io.rundir`).
With ``cluster.warm_spawner: false`` each role is a ``python -m aiorl`` process of its
own, started once memory 0 listens and pointed at it. Ctrl-C or SIGTERM is forwarded to the
coordinator, which runs the shutdown phases; a second one kills every child.
A role that exits abnormally is restarted under ``cluster.max_restarts``
(`aiorl.runtime.restart`); one the coordinator declares lost while its process may still live
(hung, SIGSTOPped) is ended, its process group with it, and restarted the same way. A role's
environment is the launcher's less the internal ``AIORL_*`` variables a launcher sets itself
(`aiorl.launch.child_env`), then this launch's. Every wait is bounded: a coordinator that stops answering
(every other role lost it) or overstays its shutdown is killed, and the
launcher then writes the summary itself, blaming the role that stalled.
Whatever happens, no child outlives the launcher: each gets SIGTERM if the
launcher dies (PR_SET_PDEATHSIG) and the launcher kills any that overstay.

Exit code: 0 when the run finished (a stop criterion held), 128 + the signal
(130 SIGINT, 143 SIGTERM) when it was interrupted and shut down cleanly (so a
scheduler can requeue it with ``--resume``), 1 when it failed.
"""

from __future__ import annotations

import errno
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from aiorl.algos import get_settings
from aiorl.config import Config
from aiorl.io.rundir import RunDir, RunDirDeleted, RunDirWatch, write_json_atomic
from aiorl.launch.child_env import inherited
from aiorl.launch.children import Child, describe_exit, die_with_parent, end_group
from aiorl.launch.notices import ExitNotices
from aiorl.launch.panel import Progress, next_command, stopped_at_note
from aiorl.launch.spawner import WarmSpawner
from aiorl.runtime import local_sockets
from aiorl.runtime.hold import ENV_HOLD
from aiorl.runtime.phase import (
    EXIT_COORDINATOR_LOST,
    EXIT_OK,
    EXIT_REFUSED,
    FAILED,
    FINISHED,
    INTERRUPTED,
    interrupted_exit_code,
    last_checkpoint_budget_s,
    parse_role_name,
    role_name,
)
from aiorl.runtime.restart import RestartPolicy, restartable
from aiorl.wire import generate_token, write_token_file

log = logging.getLogger("aiorl.launch")
POLL_S = 0.1


class LaunchError(RuntimeError):
    pass


class LocalLauncher:
    def __init__(
        self,
        cfg: Config,
        run_dir: RunDir,
        quiet: bool = False,
        spawner: WarmSpawner | None = None,
        on_metrics: Callable[[dict], object] | None = None,
    ):
        self.cfg = cfg
        self.on_metrics = on_metrics  # each metrics row, as the launcher reads it (aiorl.run)
        self.spawner = spawner  # forks the roles; None: each role is a process started on its own
        self.rundir = run_dir
        self.run_dir = run_dir.path
        self.quiet = quiet
        self.children: dict[str, Child] = {}  # the current process of each role, memory-0 first
        self.ended: list[Child] = []  # earlier processes of restarted roles
        self.policy = RestartPolicy.from_config(cfg, get_settings(cfg.algo).is_synchronous(cfg))
        self.restart_at: dict[str, float] = {}  # role -> monotonic time of its pending restart
        self.signals = 0
        self.signal_name: str | None = None
        self.stalled: str | None = None  # why the launcher killed the coordinator, if it did
        self.config_path = self.run_dir / "config.yaml"
        self.port: int | None = None
        self.coordinator_unix: str | None = None  # the coordinator's Unix socket, once it listens
        self.progress: Progress | None = None
        self.dir_watch: RunDirWatch | None = None  # the run directory this launch started in, held open
        self.unwritten: list[str] = []  # files of its own the launcher could not write (a full disk)
        self.notices = ExitNotices(cfg, self.run_dir)  # each child's exit, told to the coordinator at once
        # This launch is the run restarting itself (`aiorl.launch.attempts`), not one the user started.
        attempts = run_dir.owner.get("attempts") or [{}]
        self.whole_run_restart = bool(attempts[-1].get("run_restart_cause"))

    @property
    def coordinator(self) -> Child | None:
        return self.children.get("memory-0")

    def _role_args(self, kind: str, index: int) -> list[str]:
        """The arguments after ``python`` that start one role process (the Ray launcher's too)."""
        # -P: nothing from the launcher's working directory is imported by accident (a directory
        # another user can write may hold an aiorl/ or a numpy.py); module:Env ids still load
        # from it, through the path aiorl.envs.gym adds for them alone.
        args = ["-P", "-m", "aiorl", "run", str(self.config_path), "--role", kind, "--index", str(index)]
        if self.port is not None:
            args += ["--set", f"cluster.port={self.port}"]
        return args

    def _start(self, kind: str, index: int, log_path: Path, restart: bool = False):
        """Start one role process; returns its Popen, or an object with its calls (a child of the
        warm spawner, a Ray-placed process)."""
        # The role's stdout and stderr (a stray print, a warning, a traceback) go into its log,
        # not the terminal, where they would tear the live panel; the panel counts them.
        env = {**self._unix_env(inherited(os.environ)), **self.rundir.identity.env()}
        if restart or self.whole_run_restart:  # only a first process of the launch the user started is held
            env.pop(ENV_HOLD, None)
        if self.spawner is not None:
            wait = None
            if self.port is None and (kind, index) != ("memory", 0):
                wait = {"run_dir": str(self.run_dir), "timeout_s": self.cfg.cluster.start_timeout_s}
            argv = self._role_args(kind, index)[3:]  # what follows `python -P -m aiorl`
            return self.spawner.spawn_role(argv, env, log_path, wait)
        with open(log_path, "ab") as log_file:
            return subprocess.Popen(
                [sys.executable, *self._role_args(kind, index)],
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=log_file,
                start_new_session=True,
                preexec_fn=die_with_parent,
                env=env,
            )

    def _unix_env(self, environ) -> dict[str, str]:
        """The environment of a child of this launcher: every role runs on this host, so with
        ``cluster.unix_sockets`` they serve and connect over Unix sockets in the run directory
        (never inherited: only this launcher turns them on, or leaves them off). Whether rings go
        beside them each role reads from the config (`aiorl.runtime.transport.transport_of`)."""
        ours = (local_sockets.ENV_ON, local_sockets.ENV_COORDINATOR)
        env = {k: v for k, v in environ.items() if k not in ours}
        if self.cfg.cluster.unix_sockets:
            env[local_sockets.ENV_ON] = "1"
            if self.coordinator_unix:
                env[local_sockets.ENV_COORDINATOR] = self.coordinator_unix
        return env

    def _spawn(self, kind: str, index: int, restart: bool = False) -> Child:
        name = role_name(kind, index)
        logs = self.run_dir / "logs"
        log_path = logs / f"{name}.log"
        try:
            logs.mkdir(exist_ok=True)
            log_from = log_path.stat().st_size if log_path.exists() else 0
            proc = self._start(kind, index, log_path, restart)
        except OSError as exc:  # the run directory gone, the disk full: the run cannot go on
            raise LaunchError(f"cannot start {name}, its log {log_path}: {exc.strerror or exc}") from None
        child = Child(name, proc, log=log_path, log_from=log_from)
        self.children[child.name] = child
        log.debug("started %s (pid %d)", child.name, proc.pid)
        return child

    def _on_signal(self, signum, frame, why: str | None = None) -> None:
        self.signals += 1
        coordinator = self.coordinator
        if self.signals == 1 and coordinator is not None and coordinator.proc.poll() is None:
            self.signal_name = signal.Signals(signum).name
            print(
                f"\naiorl: {why or self.signal_name}: stopping the run cleanly (press Ctrl-C again to kill it)",
                file=sys.stderr,
                flush=True,
            )
            self.restart_at.clear()
            if self.progress is not None:
                self.progress.interrupted()
            coordinator.proc.send_signal(signum)  # the coordinator records which signal stopped the run
        else:
            print("\naiorl: killing every role", file=sys.stderr, flush=True)
            self.kill_all()

    def kill_all(self) -> None:
        self.restart_at.clear()
        for child in self.children.values():
            end_group(child.proc)

    def _wait_coordinator_address(self, child: Child) -> int:
        deadline = time.monotonic() + self.cfg.cluster.start_timeout_s
        while time.monotonic() < deadline:
            address = self.rundir.read_owned("coordinator.json")
            if address is not None:
                unix = address.get("unix")
                self.coordinator_unix = unix if isinstance(unix, str) else None
                return int(address["port"])
            if child.proc.poll() is not None:
                raise LaunchError(
                    f"memory-0 (the coordinator) exited before listening: "
                    f"{describe_exit(child.proc.returncode)}{child.cause()}; see {self.run_dir}/logs/memory-0.log"
                )
            self._idle(0.02)
        raise LaunchError(f"memory-0 did not start listening within {self.cfg.cluster.start_timeout_s:g} s")

    def _idle(self, seconds: float) -> None:
        """Wait up to `seconds`; a child of the spawner that exits meanwhile ends the wait at once."""
        if self.spawner is not None:
            self.spawner.pump(seconds)
        else:
            time.sleep(seconds)

    def run(self) -> int:
        """One attempt of the run (`aiorl.launch.attempts` starts the next, ends the spawner and
        lets go of the run directory); its exit code."""
        try:
            return self._run()
        except RunDirDeleted as exc:  # before the run started
            print(f"aiorl: the {exc}", file=sys.stderr)
            return 1
        finally:
            self.notices.close()
            if self.dir_watch is not None:
                self.dir_watch.close()

    def run_restart_cause(self) -> str | None:
        """Why the whole run should start again: a role that cannot restart in place (a learner,
        memory host 0) was lost or failed and the run failed with it; None for any other end."""
        if self.signals:
            return None  # interrupted on purpose
        if self.unwritten:
            return None  # the run directory takes no more (a full disk): see `_ends_for_a_full_disk`
        summary = self.rundir.read_owned("summary.json") or {}
        if summary.get("outcome") != FAILED:
            return None
        if self.stalled:
            return self.stalled
        # A summary the launcher wrote (the coordinator died) has memory 0 "failed", with its exit.
        roles = summary.get("roles") or {}
        for status in ("lost", "failed"):  # one that died explains the run before one that failed after it
            for name, role in roles.items():
                kind, index = parse_role_name(name)
                if not restartable(kind, index, self.policy.synchronous) and role.get("status") == status:
                    cause = f"{name} {status}: {role.get('reason')}"
                    return None if _ends_for_a_full_disk(cause) else cause
        return None

    def _run(self) -> int:
        token_path = self.run_dir / "token"
        if self.cfg.run.token_file is None and not os.environ.get("AIORL_TOKEN") and not token_path.exists():
            write_token_file(token_path, generate_token())
        for error in self.rundir.skipped:
            print(f"aiorl: {error}; falling back to the previous checkpoint", file=sys.stderr, flush=True)
        if self.rundir.identity.resume_from:
            counters = (self.rundir.resume_meta or {}).get("run", {})
            print(
                f"aiorl: resuming from {self.rundir.identity.resume_from} (env_steps {counters.get('env_steps')}, "
                f"learner_steps {counters.get('learner_steps')})",
                flush=True,
            )
        # Signal handlers can only be set from the main thread; elsewhere (aiorl.run() in a thread)
        # the run keeps Python's and is stopped through its stop criteria.
        in_main = threading.current_thread() is threading.main_thread()
        old = {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGINT, signal.SIGTERM)} if in_main else {}
        progress = self.progress = Progress(self.cfg, self.run_dir, quiet=self.quiet, on_row=self.on_metrics)
        metrics = self.run_dir / "metrics.jsonl"
        progress.tail.offset = metrics.stat().st_size if metrics.exists() else 0  # a resume appends
        progress.logs.skip_existing()
        supervised = False
        try:
            self.dir_watch = RunDirWatch(self.run_dir)
            coordinator = self._spawn("memory", 0)
            if self.spawner is None:  # a process started on its own is told the port
                self.port = self._wait_coordinator_address(coordinator)
            c = self.cfg.cluster
            for kind, count, first in (("memory", c.memories, 1), ("learner", c.learners, 0), ("actor", c.actors, 0)):
                for i in range(first, count):
                    self._spawn(kind, i)
            if self.port is None:  # forked ones find it themselves; restarts are told it
                self.port = self._wait_coordinator_address(coordinator)
            self.notices.start(self.coordinator_unix)
            self._write_pids()
            progress.start()
            self._supervise(progress)
            supervised = True  # _report draws the last frame, with the summary
        except LaunchError as exc:
            progress.stop()
            self.kill_all()
            self._reap(5.0)
            print(f"aiorl: {exc}", file=sys.stderr)
            return 1
        finally:
            if not supervised:
                progress.stop()
            for sig, handler in old.items():
                signal.signal(sig, handler)
            self.kill_all()
            self._reap(5.0)
        return self._report(progress)

    def _write_pids(self) -> None:
        path = self.run_dir / "pids.json"
        try:
            write_json_atomic(path, {c.name: c.pid for c in self.children.values()})
        except OSError as exc:
            raise LaunchError(f"cannot write {path}: {exc.strerror or exc}; ending the run") from None

    def _check_run_dir(self) -> None:
        """The run directory must stay the one this launch started in: deleted (or replaced)
        mid-run, nothing the run writes has a place, so the run ends; nobody makes it again."""
        try:
            self.dir_watch.check()
        except RunDirDeleted as exc:
            raise LaunchError(f"the {exc} mid-run; ending the run") from None

    def _save(self, name: str, data: dict, owned: bool = True) -> bool:
        """Write one of the launcher's own files at the end; a failure (a full disk) is one line of
        the report, naming the file, never a traceback. Whether it was written."""
        try:
            if owned:
                self.rundir.write_owned(name, data)
            else:
                write_json_atomic(self.run_dir / name, data)
        except OSError as exc:
            self.unwritten.append(f"could not write {self.run_dir / name}: {exc.strerror or exc}")
            return False
        return True

    def _end_given_up(self) -> None:
        """End each process the coordinator gave up (lost, maybe alive: hung, stopped): it can never
        rejoin, so it is killed now, its group with it, and restarted like a dead one."""
        for name, pid, why in self.notices.given_up():
            child = self.children.get(name)
            if child is None or child.pid != pid or child.proc.poll() is not None:
                continue  # gone already, or an earlier process of the role
            print(
                f"aiorl: {name} (pid {pid}) was declared lost by the coordinator ({why}); ending it",
                file=sys.stderr,
                flush=True,
            )
            end_group(child.proc)

    def _restart_due(self, now: float) -> None:
        """Decide on children that just exited; start those whose backoff has passed."""
        coordinator = self.coordinator
        for child in list(self.children.values()):
            if child is coordinator or child.handled or child.proc.poll() is None:
                continue
            child.handled = True
            code = child.proc.returncode
            self.notices.child_exited(child.name, child.pid, code)
            delay = None if self.signals else self.policy.decide(child.name, code, now - child.started)
            if delay is not None:
                print(
                    f"aiorl: {child.name} (pid {child.pid}) {describe_exit(code)}{child.cause()}; restarting it in "
                    f"{delay:.1f} s (restart {self.policy.restarts[child.name]} of {self.policy.max_restarts})",
                    file=sys.stderr,
                    flush=True,
                )
                self.restart_at[child.name] = now + delay
        for name, at in list(self.restart_at.items()):
            if now >= at and coordinator.proc.poll() is None:
                del self.restart_at[name]
                self.ended.append(self.children[name])
                kind, _, index = name.rpartition("-")
                self._spawn(kind, int(index), restart=True)
                self._write_pids()

    def _supervise(self, progress: Progress) -> None:
        """Wait for the children, restarting those the policy allows; every wait is bounded.

        Once the coordinator is gone the others get a bounded time. Once every other role
        is gone (and none is due a restart) the coordinator gets one too: if they all lost
        it, it has stopped answering; else it is only finishing its summary.
        """
        coordinator = self.coordinator
        c = self.cfg.cluster
        # Roles notice a lost coordinator within its timeout, then learner 0 writes its last checkpoint.
        grace = c.coordinator_timeout_s + last_checkpoint_budget_s(c) + 5.0
        others_gone_at = signalled_at = None
        while True:
            progress.update()
            if progress.on_row_error is not None and self.signals == 0:
                error = progress.on_row_error
                self._on_signal(signal.SIGINT, None, why=f"on_metrics raised {type(error).__name__}: {error}")
            self._check_run_dir()
            now = time.monotonic()
            self._end_given_up()
            self._restart_due(now)
            alive = [ch for ch in self.children.values() if ch.proc.poll() is None]
            if not alive and not self.restart_at:
                return
            if coordinator.proc.poll() is not None:
                self.restart_at.clear()
                self._end_late_restarts(alive)
                self._wait_rest([ch for ch in alive if ch.proc.poll() is None], grace)
                return
            others = [ch for ch in alive if ch is not coordinator]
            if others or self.restart_at:
                others_gone_at = None
            elif others_gone_at is None:
                others_gone_at = now
            if signalled_at is None and self.signals:
                signalled_at = now
            lost_it = [
                ch.name
                for ch in self.children.values()
                if ch is not coordinator and ch.proc.returncode == EXIT_COORDINATOR_LOST
            ]
            if others_gone_at is not None and lost_it and now - others_gone_at > c.coordinator_timeout_s:
                self._kill_coordinator(
                    f"memory-0 (the coordinator) stopped answering: {', '.join(lost_it)} "
                    f"lost it, and it did not exit within {c.coordinator_timeout_s:g} s; "
                    "killed by the launcher"
                )
            elif others_gone_at is not None and now - others_gone_at > c.phase_timeout_s:
                self._kill_coordinator(
                    f"memory-0 (the coordinator) did not exit {c.phase_timeout_s:g} s after "
                    "every other role had; killed by the launcher"
                )
            elif signalled_at is not None and now - signalled_at > 3 * c.phase_timeout_s + grace:
                self._kill_coordinator(
                    f"the shutdown after {self.signal_name} did not end within its phase "
                    f"deadlines (3 x {c.phase_timeout_s:g} s); killed by the launcher"
                )
            self._idle(POLL_S)

    def _kill_coordinator(self, reason: str) -> None:
        print(f"aiorl: {reason}", file=sys.stderr, flush=True)
        self.stalled = reason
        self.coordinator.proc.kill()

    def _late_restarts(self) -> set[str]:
        """Restarted roles whose new process the run ended without: the coordinator's summary
        lists them as lost with restarts left (it never admitted the new incarnation)."""
        summary = self.rundir.read_owned("summary.json") or {}
        return {name for name in summary.get("lost_with_restarts_left", []) if self.policy.restarts.get(name)}

    def _end_late_restarts(self, alive: list[Child]) -> None:
        # Such a process is still starting or looking for the coordinator, which is gone: it has
        # no part in the run left, so it is ended now instead of after the grace for live roles.
        late = self._late_restarts()
        for child in alive:
            if child.name in late:
                log.info("%s was restarting when the run ended; ending its new process", child.name)
                child.proc.kill()
                child.proc.wait()

    def failed_children(self, ok_codes: set[int]) -> list[Child]:
        """The current processes that ended badly. Not failures: a restart that came after the run
        had left RUNNING and was turned away (exit 4), or that the run ended before it registered;
        nor a role restarted in place whose part the coordinator's summary of a run that ended well
        accounts for (`_spent`)."""
        late = self._late_restarts()
        spent = self._spent()
        return [
            c
            for c in self.children.values()
            if c.proc.returncode not in ok_codes
            and not (c.proc.returncode == EXIT_REFUSED and self.policy.restarts.get(c.name))
            and c.name not in late
            and c.name not in spent
        ]

    def _spent(self) -> set[str]:
        """Roles restarted in place (actors, memory hosts past 0) that ended after giving all they
        had: the coordinator's summary says the run ended well with each of them done, or lost
        with its loss forgiven (after STOPPING; a restart it would have refused). Killed then, an
        actor has nothing left to give, and the run's verdict is the summary's."""
        summary = self.rundir.read_owned("summary.json") or {}
        if not summary.get("ok") or summary.get("written_by") == "launcher":
            return set()
        spent = set()
        for name, role in (summary.get("roles") or {}).items():
            kind, index = parse_role_name(name)
            if restartable(kind, index, self.policy.synchronous) and role.get("status") in ("done", "lost"):
                spent.add(name)
        return spent

    def _wait_rest(self, alive: list[Child], grace: float) -> None:
        deadline = time.monotonic() + grace
        while any(ch.proc.poll() is None for ch in alive) and time.monotonic() < deadline:
            self._idle(POLL_S)
        for child in alive:
            if child.proc.poll() is None:
                print(
                    f"aiorl: {child.name} (pid {child.pid}) did not exit {grace:g} s after the coordinator; killing it",
                    file=sys.stderr,
                )
                child.proc.kill()

    def _reap(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        for child in [*self.ended, *self.children.values()]:
            try:
                child.proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                child.proc.kill()
                child.proc.wait()

    # ------------------------------------------------------------------ outcome

    def _own_summary(self, progress: Progress) -> dict:
        """The summary when the coordinator wrote none: what the launcher saw, blaming who stalled."""
        coordinator = self.coordinator
        if self.stalled:
            failures = [self.stalled]
        elif self.signals > 1:
            failures = [f"killed by a second {self.signal_name or 'signal'} (no clean shutdown)"]
        else:
            failures = [
                f"memory-0 (the coordinator) {describe_exit(coordinator.proc.returncode)} before writing its summary"
            ]
        row = progress.tail.poll() or {}
        roles = {}
        for name, child in self.children.items():
            code = child.proc.returncode
            status = (
                "stalled"
                if name == "memory-0" and self.stalled
                else "lost the coordinator"
                if code == EXIT_COORDINATOR_LOST
                else "done"
                if code == EXIT_OK
                else "failed"
            )
            roles[name] = {"status": status, "reason": describe_exit(code), "pid": child.pid}
        summary = {
            "ok": False,
            "outcome": FAILED,
            "stop_reason": failures[0],
            "failures": failures,
            "written_by": "launcher",
            "env_steps": row.get("env_steps", 0),
            "learner_steps": row.get("learner_steps", 0),
            "episodes": row.get("episodes", 0),
            "return_mean_100": row.get("return_mean_100"),
            "roles": roles,
        }
        written = self._save("summary.json", summary)
        return (self.rundir.read_owned("summary.json") if written else None) or self.rundir.identity.stamp(summary)

    def _report(self, progress: Progress) -> int:
        summary = self.rundir.read_owned("summary.json")
        if summary is None:
            summary = self._own_summary(progress)
        progress.stop(summary, roles_alive=sum(c.proc.poll() is None for c in self.children.values()))
        outcome = summary.get("outcome", FAILED)
        ok_codes = {EXIT_OK}
        if outcome == INTERRUPTED:
            ok_codes.add(interrupted_exit_code(summary.get("signal")))
        failed = self.failed_children(ok_codes)
        self._save("exits.json", {c.name: c.proc.returncode for c in self.children.values()}, owned=False)
        if self.policy.history:
            self._save("restarts.json", {"restarts": self.policy.history})
        counts = (
            f"env_steps {summary.get('env_steps')}, learner_steps {summary.get('learner_steps')}, "
            f"episodes {summary.get('episodes')}"
        )
        restarts = sum(self.policy.restarts.values())
        counts += f", {restarts} restart(s)" if restarts else ""
        lines = []
        if summary.get("written_by") == "launcher":
            lines.append("aiorl: the coordinator wrote no summary (it did not finish)")
        lines.append(f"aiorl: run {outcome} ({summary.get('stop_detail') or summary.get('stop_reason')}): {counts}")
        note = stopped_at_note(summary)
        if note:
            lines.append(f"aiorl: {note}")
        for failure in summary.get("failures", []):
            lines.append(f"aiorl: {failure}")
        lines += [f"aiorl: {line}" for line in self.unwritten]
        problems = progress.logs.summary()
        if problems:
            lines.append(f"aiorl: {problems}")
        for child in failed:
            lines.append(
                f"aiorl: {child.name} (pid {child.pid}) {describe_exit(child.proc.returncode)}; "
                f"log: {self.run_dir}/logs/{child.name}.log"
            )
        clean = not failed and bool(summary.get("ok"))
        if clean and outcome == FINISHED:
            code = EXIT_OK
        elif clean and outcome == INTERRUPTED:
            code = interrupted_exit_code(summary.get("signal"))
            lines.append(f"aiorl: continue it with `aiorl run --resume {self.run_dir}`")
        else:
            code = 1
        verdict = {EXIT_OK: "ok", 1: "FAILED"}.get(code, "interrupted")
        lines.append(f"aiorl: run directory {self.run_dir} ({verdict})")
        hint = next_command(self.run_dir)
        if hint:
            lines.append(f"aiorl: {hint}")
        print("\n".join(lines), file=sys.stderr if code else sys.stdout, flush=True)
        return code


def _ends_for_a_full_disk(cause: str) -> bool:
    """Whether a role failed for a full disk (its checkpoint, its policy not written): a restart would
    write to the same disk and fail the same way, from an older checkpoint; the run ends with what
    it has. The writers name the cause in their one line (`aiorl.io.checkpoint.WriteError`,
    `aiorl.io.export.PolicyWriteError`)."""
    return os.strerror(errno.ENOSPC) in cause
