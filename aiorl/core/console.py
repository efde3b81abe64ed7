"""The console flag: log records marked ``extra={CONSOLE: True}`` also go to the terminal of a
role started by hand (its connect, phase and exit lines), as ``aiorl <role>: <message>``."""

from __future__ import annotations

import logging
import os
import shutil
import sys
from pathlib import Path

# Log records with this attribute set also go to the console of a role started by hand.
CONSOLE = "console"


class _ConsoleFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return bool(getattr(record, CONSOLE, False))


def console_handler(name: str) -> logging.Handler:
    """A handler printing only the records marked ``extra={CONSOLE: True}``, as ``<role>: <message>``."""
    handler = logging.StreamHandler(sys.stdout)
    handler.setLevel(logging.INFO)
    handler.addFilter(_ConsoleFilter())
    handler.setFormatter(logging.Formatter(f"aiorl {name}: %(message)s"))
    return handler


def aiorl_command() -> str:
    """`aiorl` as the user can type it in this shell, for the commands aiorl suggests: ``aiorl``
    when that is on PATH and is this installation; else this installation's script (a venv not
    activated: ``.venv/bin/aiorl``), else ``python -m aiorl`` with this interpreter."""
    script = Path(sys.executable).parent / "aiorl"
    if not script.is_file():
        return f"{sys.executable} -m aiorl"
    found = shutil.which("aiorl")
    if found is not None and os.path.samefile(found, script):
        return "aiorl"
    try:
        return str(script.relative_to(Path.cwd()))
    except ValueError:
        return str(script)
