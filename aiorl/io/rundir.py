"""A run directory belongs to one run: who owns it, which launch wrote what, resuming it.

``run.json`` is the owner record, written when a run directory is made and
updated at each launch::

    {"format": "aiorl.run", "version": 1, "run_id": "<hex>", "created": <unix time>,
     "attempts": [{"attempt": 1, "launch_id": "<hex>", "started": <unix time>,
                   "resume_from": null | "<checkpoint path>", "overrides": [...], "pid": <launcher pid>,
                   resumes only: "set_aside": ["<path>.bad", ...], "restart_from_scratch": <bool>}, ...]}

- ``run_id`` names the run for its whole life; ``launch_id`` names one launch
  of it (the first one, or a ``--resume``). Every file a launch's processes
  write for others to read back (``coordinator.json``, ``summary.json``,
  ``restarts.json``, checkpoints' meta) carries both, and a reader takes a
  file only when they are its own (`Identity.owns`): a leftover of an earlier
  launch is never taken for this one's. The launcher's own records
  (``pids.json``, ``exits.json``: role name -> pid / exit code) are removed
  when a launch starts.
- A launcher holds an exclusive lock (``flock``) on ``.lock`` for as long as
  it runs, so two launchers never share a directory.
- A new run refuses a directory that already holds anything; an earlier run
  is continued with ``aiorl run --resume RUN_DIR``: from its newest good
  checkpoint (newer files that fail their checks are renamed aside to
  ``.bad``), or, when it has none yet, from the beginning again (same run id,
  its ``config.yaml``; the attempt records ``restart_from_scratch: true``).

Role processes learn their launch from the environment the launcher gives
them (`Identity.env`): ``AIORL_RUN_ID``, ``AIORL_LAUNCH_ID``, ``AIORL_ATTEMPT``
and, when resuming, ``AIORL_RESUME_FROM`` (the checkpoint to continue from).
Another launcher (Ray) passes the same variables.

A run directory is created 0700: only its owner can enter it. Inside it the
token file is 0600 and every other file 0644 (readable, through the
directory, by its owner alone).
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path

from aiorl.io import checkpoint

FILE_MODE = 0o644
DIR_MODE = 0o700
OWNER_FILE = "run.json"
LATEST = "latest"  # runs/latest: a link to the newest run launched in runs/
LOCK_FILE = ".lock"
# Files of one launch: a new launch removes the previous launch's.
LAUNCH_FILES = ("coordinator.json", "pids.json", "exits.json")
ENV_RUN_ID = "AIORL_RUN_ID"
ENV_LAUNCH_ID = "AIORL_LAUNCH_ID"
ENV_ATTEMPT = "AIORL_ATTEMPT"
ENV_RESUME_FROM = "AIORL_RESUME_FROM"

log = logging.getLogger("aiorl.rundir")


class RunDirError(Exception):
    """A run directory that cannot be used as asked (a user mistake: one line, exit 2)."""


def write_json_atomic(path: str | Path, data, indent: int | None = None) -> None:
    """Write JSON so that a reader polling `path` never sees a half-written file, even after a crash.

    The data is fsynced before the rename (else a crash can leave the new name
    pointing at an empty file), and the directory after it.
    """
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, FILE_MODE)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(data, indent=indent, default=str))
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems do not sync directories
    finally:
        os.close(fd)


def make_run_dir(run_dir: str | Path) -> Path:
    """Create `run_dir` (and its parents) owner-only; tighten it if others could read it."""
    run_dir = Path(run_dir)
    run_dir.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    if os.stat(run_dir).st_mode & 0o077:
        os.chmod(run_dir, DIR_MODE)  # it will hold the token and code-like files (policies)
    return run_dir


class RunDirDeleted(FileNotFoundError):
    """The run directory went away while the run wrote into it. It is never made again: a
    ``mkdir(parents=True)`` under it would bring it back with the default permissions (0755),
    without its token or owner record, and checkpoints and the policy readable by others."""

    def __init__(self, path: str | Path):
        super().__init__(errno.ENOENT, f"run directory {path} was deleted", str(path))
        self.path = Path(path)

    def __str__(self) -> str:
        return f"run directory {self.path} was deleted"


def make_subdir(run_dir: str | Path, *parts: str) -> Path:
    """`run_dir`/`parts`, each missing level made owner-only (0700), under an existing `run_dir`
    only (RunDirDeleted if it is gone): what a writer inside a role calls instead of
    ``mkdir(parents=True)``."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise RunDirDeleted(run_dir)
    path = run_dir
    for part in parts:
        path = path / part
        try:
            path.mkdir(mode=DIR_MODE)
        except FileExistsError:
            pass
        except FileNotFoundError:  # deleted since the check above
            raise RunDirDeleted(run_dir) from None
    return path


class RunDirWatch:
    """Whether the run directory is still the one a writer started in (`check` raises
    RunDirDeleted if it was deleted, or deleted and made again). It holds the directory open: a
    deleted directory has no link left, whatever now has its path or its inode number."""

    def __init__(self, run_dir: str | Path):
        self.path = Path(run_dir)
        try:
            self._fd: int | None = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except FileNotFoundError:
            raise RunDirDeleted(self.path) from None

    def check(self) -> None:
        if self._fd is None:
            return
        held = os.fstat(self._fd)
        try:
            now = os.stat(self.path)
        except FileNotFoundError:
            raise RunDirDeleted(self.path) from None
        if held.st_nlink == 0 or (now.st_dev, now.st_ino) != (held.st_dev, held.st_ino):
            raise RunDirDeleted(self.path)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def read_json(path: str | Path) -> dict | None:
    """A JSON object from `path`, or None if it is missing or not a whole JSON object."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def run_learner_steps(own_steps: int, learners: int) -> int:
    """The run's learner steps when learner 0 has taken `own_steps` over the whole run: its
    `learners` are data-parallel and step together, each as many (and a resumed launch starts every
    one of them from learner 0's count, `aiorl.runtime.learner_outputs.LearnerOutputs.resume`)."""
    return int(own_steps) * int(learners)


def resumed_counters(meta: dict, learners: int) -> dict:
    """The run's counters a launch of `learners` learners that continues from a checkpoint (its
    `meta`) starts from: those it recorded (``run``), but its learner steps from learner 0's own
    count (the checkpoint's ``learner_steps``), where each of the launch's learners starts. What a
    checkpoint recorded of the run may be older than that count (an abnormal end's, written with the
    totals of learner 0's last heartbeat): a resumed coordinator that started from it waited for
    ``agent.scheduled_global_steps`` short by the gap, for ever, its learners stopped at theirs."""
    run = dict(meta.get("run") or {})
    run["learner_steps"] = run_learner_steps(meta.get("learner_steps", 0), learners)
    return run


@dataclass(frozen=True)
class Identity:
    """Which run and which launch of it a process belongs to."""

    run_id: str
    launch_id: str
    attempt: int = 1
    resume_from: str | None = None

    def env(self) -> dict[str, str]:
        env = {ENV_RUN_ID: self.run_id, ENV_LAUNCH_ID: self.launch_id, ENV_ATTEMPT: str(self.attempt)}
        if self.resume_from:
            env[ENV_RESUME_FROM] = self.resume_from
        return env

    @classmethod
    def from_env(cls, environ=os.environ) -> Identity:
        """The launch this process was started for; a role started by hand gets a launch of its own."""
        launch_id = environ.get(ENV_LAUNCH_ID)
        if not launch_id:
            return cls(run_id="", launch_id=new_id())
        return cls(
            run_id=environ.get(ENV_RUN_ID, ""),
            launch_id=launch_id,
            attempt=int(environ.get(ENV_ATTEMPT, "1")),
            resume_from=environ.get(ENV_RESUME_FROM) or None,
        )

    def stamp(self, data: dict) -> dict:
        return {**data, "run_id": self.run_id, "launch_id": self.launch_id, "attempt": self.attempt}

    def owns(self, data: dict | None) -> bool:
        return isinstance(data, dict) and data.get("launch_id") == self.launch_id and data.get("run_id") == self.run_id


def new_id() -> str:
    return secrets.token_hex(8)


def default_path(algo: str, env_id: str) -> Path:
    """runs/<algo>-<env>-<timestamp>, with a -2, -3... suffix when that one is taken."""
    env = env_id.replace("/", "-")  # ALE/Pong-v5: one directory, not two
    base = Path("runs") / f"{algo}-{env}-{time.strftime('%Y%m%d-%H%M%S')}"
    path, n = base, 1
    while path.exists():
        n += 1
        path = base.with_name(f"{base.name}-{n}")
    return path


def point_latest_at(path: Path) -> None:
    """Make ``latest`` beside `path` (``runs/latest``) a relative link to it: every command takes
    the newest run as ``runs/latest``. Replaced atomically; a ``latest`` that is not a link (the
    user's own) is left alone."""
    link = path.parent / LATEST
    if link.exists() and not link.is_symlink():
        log.warning("%s is not a link made by aiorl; left as it is", link)
        return
    tmp = path.parent / f".{LATEST}-{os.getpid()}"
    try:
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(path.name, target_is_directory=True)
        os.replace(tmp, link)
    except OSError as exc:  # a read-only or odd file system: the run goes on without the shortcut
        log.warning("cannot point %s at %s: %s", link, path.name, exc)
        tmp.unlink(missing_ok=True)


def role_run_dir(path: str | Path | None, algo: str, env_id: str) -> Path:
    """The directory a role started by the launcher writes into: the launcher made it, so one
    that is missing was deleted (RunDirError; made only without a ``run.dir``); a role started by
    hand gets its own complete one (`aiorl.experiment.by_hand`)."""
    if not path:
        return make_run_dir(default_path(algo, env_id))
    path = Path(path)
    if not path.is_dir():
        raise RunDirError(str(RunDirDeleted(path)))
    if os.stat(path).st_mode & 0o077:
        os.chmod(path, DIR_MODE)  # as make_run_dir: tightened if others could read it
    return path


class RunDir:
    """A run directory held by one launcher: made new (`create`) or continued (`resume`)."""

    def __init__(self, path: Path, owner: dict, identity: Identity, lock_fd: int):
        self.path = path
        self.owner = owner
        self.identity = identity
        self._lock_fd: int | None = lock_fd
        self.skipped: list = []  # resume: newer checkpoints that failed their checks, set aside
        self.resume_meta: dict | None = None  # resume: the meta of the checkpoint continued from
        self.starting_over: str | None = None  # resume without a usable checkpoint: the line that says so

    def __repr__(self) -> str:
        return f"<RunDir {self.path} run_id={self.identity.run_id} attempt={self.identity.attempt}>"

    @classmethod
    def create(cls, path: str | Path, overrides: list[str] = ()) -> RunDir:
        path = Path(path)
        _refuse_taken(path)
        try:
            make_run_dir(path)
        except OSError as exc:
            raise RunDirError(f"cannot make run directory {path}: {exc.strerror or exc}") from None
        lock_fd = _lock(path)
        try:
            _refuse_taken(path, ignore=(LOCK_FILE,))  # another launcher may have won the race
            identity = Identity(run_id=new_id(), launch_id=new_id(), attempt=1)
            owner = {
                "format": "aiorl.run",
                "version": 1,
                "run_id": identity.run_id,
                "created": time.time(),
                "attempts": [],
            }
            run_dir = cls(path, owner, identity, lock_fd)
            run_dir._record_attempt(None, overrides)
            return run_dir
        except BaseException:
            os.close(lock_fd)
            raise

    @classmethod
    def resume(cls, path: str | Path, overrides: list[str] = ()) -> RunDir:
        """Take `path` (written by an earlier launch) for a new launch that continues from its newest
        good checkpoint (see `_continue`)."""
        path = Path(path)
        owner = check_resumable(path)
        lock_fd = _lock(path)
        try:
            run_dir = cls(path, owner, Identity(run_id=str(owner["run_id"]), launch_id=""), lock_fd)
            run_dir._continue(overrides)
            return run_dir
        except BaseException:
            os.close(lock_fd)
            raise

    def next_attempt(self, cause: str) -> None:
        """One more launch of this run by the launcher that holds it (the whole run restarts,
        `aiorl.launch.attempts`), with the last launch's overrides; `cause`: why, recorded with it."""
        overrides = (self.owner.get("attempts") or [{}])[-1].get("overrides", [])
        self._continue(overrides, cause)

    def _continue(self, overrides, cause: str | None = None) -> None:
        """Begin a launch that continues the run, under its lock: from the newest good checkpoint,
        each newer file that failed its checks set aside (``.bad``) and listed in `skipped`; with
        no good checkpoint at all, from the beginning (`starting_over` says so in one line)."""
        resume_from, meta, bad = checkpoint.newest_good(self.path / "checkpoints")
        skipped = [_set_aside(self.path, error) for error in bad]
        self.identity = Identity(
            run_id=str(self.owner["run_id"]),
            launch_id=new_id(),
            attempt=len(self.owner.get("attempts", [])) + 1,
            resume_from=str(resume_from) if resume_from is not None else None,
        )
        self.resume_meta = meta
        self.skipped, self.starting_over = [], None
        if resume_from is None:
            found = f" ({'; '.join(str(e) for e in skipped)})" if skipped else ""
            self.starting_over = (
                f"{self.path} has no usable checkpoint yet{found}; starting the run again from the beginning"
            )
        else:
            self.skipped = skipped
        for name in LAUNCH_FILES:
            (self.path / name).unlink(missing_ok=True)
        self._record_attempt(self.identity.resume_from, overrides, [str(e.path) for e in skipped], cause)

    def _record_attempt(
        self, resume_from: str | None, overrides, set_aside: list[str] | None = None, cause: str | None = None
    ) -> None:
        attempt = {
            "attempt": self.identity.attempt,
            "launch_id": self.identity.launch_id,
            "started": time.time(),
            "resume_from": resume_from,
            "overrides": list(overrides),
            "pid": os.getpid(),
        }
        if set_aside is not None:  # a resume, or a restart of the whole run
            attempt["set_aside"] = set_aside
            attempt["restart_from_scratch"] = resume_from is None
        if cause is not None:
            attempt["run_restart_cause"] = cause
        self.owner.setdefault("attempts", []).append(attempt)
        write_json_atomic(self.path / OWNER_FILE, self.owner, indent=1)

    def read_owned(self, name: str) -> dict | None:
        """`name` (a JSON file of the run directory) if this launch wrote it, else None."""
        data = read_json(self.path / name)
        return data if self.identity.owns(data) else None

    def write_owned(self, name: str, data: dict, indent: int | None = 1) -> None:
        write_json_atomic(self.path / name, self.identity.stamp(data), indent=indent)

    def close(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None


def _set_aside(path: Path, error: checkpoint.CheckpointError) -> checkpoint.CheckpointError:
    """Rename the file `error` names out of the checkpoints' names (a resume skipped it: it must not
    count as kept when learner 0 prunes, nor be tried again); the error, saying where it went."""
    try:
        moved = checkpoint.set_aside(error.path)
    except OSError as exc:
        raise RunDirError(f"--resume {path}: cannot set aside {error.path} ({error}): {exc.strerror or exc}") from None
    return checkpoint.CheckpointError(f"{error}; set aside as {moved.name}", moved)


def check_resumable(path: Path) -> dict:
    """The owner record of `path`, or RunDirError saying why `--resume` cannot take it."""
    owner = read_json(path / OWNER_FILE)
    if not path.is_dir() or owner is None or owner.get("format") != "aiorl.run" or "run_id" not in owner:
        raise RunDirError(f"--resume {path}: not an aiorl run directory (no readable {OWNER_FILE})")
    if not (path / "config.yaml").is_file():
        raise RunDirError(f"--resume {path}: the run directory has no config.yaml")
    return owner


def claim(cfg, resume: str | None, overrides: list[str]) -> RunDir:
    """The run directory of a local launch, held until `close`: new (refusing one that holds
    anything) or, with `resume`, the given one continued. Writes the resolved config into it."""
    if resume is not None:
        run_dir = RunDir.resume(Path(resume).resolve(), overrides)  # roles may not share our cwd
        if (run_dir.path.parent / LATEST).is_symlink():
            point_latest_at(run_dir.path)
    else:
        run_dir = RunDir.create(cfg.run.dir or default_path(cfg.algo, cfg.subject), overrides)
        if not cfg.run.dir:
            point_latest_at(run_dir.path)
    cfg.run.dir = str(run_dir.path.resolve())
    cfg.dump(run_dir.path / "config.yaml")
    return run_dir


def latest_launch_id(path: str | Path) -> str | None:
    """The launch_id of the newest launch recorded in a run directory's run.json."""
    owner = read_json(Path(path) / OWNER_FILE)
    attempts = (owner or {}).get("attempts") or []
    return attempts[-1].get("launch_id") if attempts else None


def launcher_pid(path: str | Path, identity: Identity) -> int | None:
    """The pid of the launcher that started `identity`'s launch of the run at `path` (its run.json
    records it), or None: a role started by hand, or by a launch this directory does not record."""
    owner = read_json(Path(path) / OWNER_FILE)
    if owner is None or not identity.run_id or owner.get("run_id") != identity.run_id:
        return None
    for attempt in owner.get("attempts") or []:
        if isinstance(attempt, dict) and attempt.get("launch_id") == identity.launch_id:
            pid = attempt.get("pid")
            return pid if type(pid) is int and pid > 0 else None
    return None


def _refuse_taken(path: Path, ignore: tuple[str, ...] = ()) -> None:
    if not path.exists():
        return
    if not path.is_dir():
        raise RunDirError(f"run directory {path} is a file, not a directory; give a new run.dir")
    owner = read_json(path / OWNER_FILE)
    if owner is not None:
        attempts = len(owner.get("attempts") or [])
        raise RunDirError(
            f"run directory {path} already holds a run (run id {owner.get('run_id')}, "
            f"{attempts} launch(es)); continue it with `aiorl run --resume {path}`, "
            "or give a new run.dir"
        )
    entries = [p.name for p in path.iterdir() if p.name not in ignore]
    if entries:
        raise RunDirError(
            f"run directory {path} is not empty ({', '.join(sorted(entries)[:3])}"
            f"{', ...' if len(entries) > 3 else ''}) and holds no aiorl run; give an empty "
            "or new run.dir"
        )


def _lock(path: Path) -> int:
    fd = os.open(path / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise RunDirError(f"run directory {path} is in use by another `aiorl run`") from None
    return fd
