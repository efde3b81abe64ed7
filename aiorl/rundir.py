"""Files of a run directory that other processes poll while they are written.

A run directory is created 0700: only its owner can enter it. Inside it the
token file is 0600 and every other file 0644 (readable, through the
directory, by its owner alone).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

FILE_MODE = 0o644
DIR_MODE = 0o700


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
