"""A role's failure that repeats the one before it, at the same point: a restart would only fail
the same way again.

An env whose ``reset`` raises, or an old ``step`` that returns four values, fails every actor
process the same way. Restarted up to ``cluster.max_restarts`` times, with backoff, such a run took
more than a minute to fail. So a role whose work raises records what failed (its kind, the
exception's type and message, and the innermost frame of its traceback: the point) in
``RUN_DIR/logs/failed-<kind>.json``, stamped with this launch; when a role of the same kind has
already failed the same way at the same point in this launch (its own previous process, or
another actor on the same env), the failure is fatal to the run (``fail`` with ``fatal``: the
coordinator stops the run at once, naming it). A failure whose message differs each time (an
address, a count) never matches, and is restarted as before.
"""

from __future__ import annotations

import traceback
from pathlib import Path

from aiorl.io.rundir import Identity, read_json, write_json_atomic


def signature(kind: str, exc: BaseException) -> dict:
    """What makes two failures the same: the role kind, the exception, and where it was raised."""
    frames = traceback.extract_tb(exc.__traceback__)
    point = f"{frames[-1].filename}:{frames[-1].lineno} in {frames[-1].name}" if frames else None
    return {"kind": kind, "error": f"{type(exc).__name__}: {exc}"[:1000], "point": point}


def repeats(run_dir: Path, role: str, kind: str, exc: BaseException, identity: Identity) -> str | None:
    """Record this failure of `role`; if a role of `kind` already failed the same way at the same
    point in this launch, why the run should stop rather than restart it (one line), else None."""
    path = Path(run_dir) / "logs" / f"failed-{kind}.json"
    mine = signature(kind, exc)
    before = read_json(path)
    same = (
        identity.owns(before) and before.get("point") is not None and all(before.get(k) == v for k, v in mine.items())
    )
    try:
        write_json_atomic(path, identity.stamp({**mine, "role": role}))
    except OSError:
        pass  # no record: the next failure is restarted, as without one
    if not same:
        return None
    return (
        f"{mine['error']} (the same error at the same point as {before.get('role')} before it, "
        f"{mine['point']}: a restart would fail the same way)"
    )
