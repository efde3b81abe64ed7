"""The console flag: log records marked ``extra={CONSOLE: True}`` also go to the terminal of a
role started by hand (its connect, phase and exit lines), as ``aiorl <role>: <message>``."""

from __future__ import annotations

import logging
import sys

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
