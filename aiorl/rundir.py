"""Files of a run directory that other processes poll while they are written."""
from __future__ import annotations

import json
import os
from pathlib import Path


def write_json_atomic(path: str | Path, data, indent: int | None = None) -> None:
    """Write JSON so that a reader polling `path` never sees a half-written file."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=indent, default=str))
    os.replace(tmp, path)
