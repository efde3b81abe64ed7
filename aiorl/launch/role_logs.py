"""Warnings and errors in the role logs, as the launcher's panel reports them.

A local run sends each role's stderr into its log (``RUN_DIR/logs/<role>.log``)
so that nothing a role prints tears the live panel; this module reads those
logs as they grow and picks out the problems: log records at WARNING and
above (``... actor-0 WARNING aiorl.actor: ...``, the format of
`aiorl.runtime.process.setup_logging`), and what reached stderr without going
through logging: a traceback (counted once, by its exception line) or a
``file:line: SomeWarning: ...`` line of the warnings module.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

# "2026-12-01 15:00:00,123 actor-0 WARNING aiorl.actor: message"
RECORD = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ (?P<role>\S+) (?P<level>[A-Z]+) \S+: (?P<message>.*)$")
RAW_WARNING = re.compile(r"^\S.*:\d+: (?P<message>\w*Warning: .*)$")
TRACEBACK = "Traceback (most recent call last):"
PROBLEM_LEVELS = {"WARNING": "warning", "ERROR": "error", "CRITICAL": "error"}


@dataclass
class Problem:
    role: str
    kind: str  # "warning" or "error"
    message: str  # its first line
    log: Path

    def line(self) -> str:
        return f"{self.role} {self.kind}: {self.message} (see {self.log})"


class _LogFile:
    """One log, read from where the last call stopped; a line is only parsed once complete."""

    def __init__(self, path: Path):
        self.path = path
        self.role = path.stem
        self.offset = 0
        self.partial = ""
        self.in_traceback = False  # inside a traceback that reached stderr raw
        self.after_record = False  # the previous line was a logged error (its traceback follows it)

    def read(self) -> list[Problem]:
        try:
            with open(self.path, errors="replace") as f:
                f.seek(self.offset)
                data = f.read()
                self.offset = f.tell()
        except OSError:
            return []
        lines = (self.partial + data).split("\n")
        self.partial = lines.pop()
        problems = []
        for line in lines:
            problem = self._parse(line.rstrip("\r"))
            if problem is not None:
                problems.append(problem)
        return problems

    def _parse(self, line: str) -> Problem | None:
        record = RECORD.match(line)
        if record is not None:
            self.in_traceback = False
            kind = PROBLEM_LEVELS.get(record["level"])
            self.after_record = kind == "error"
            return None if kind is None else Problem(record["role"], kind, record["message"], self.path)
        if line == TRACEBACK:
            # A logged exception (log.exception) prints its traceback right after its record:
            # the record already counted it.
            self.in_traceback = not self.after_record
            self.after_record = False
            return None
        if self.in_traceback and line and not line[0].isspace():
            self.in_traceback = False  # the exception line ends a raw traceback
            return Problem(self.role, "error", line, self.path)
        raw = RAW_WARNING.match(line)
        if raw is not None and not self.in_traceback:
            return Problem(self.role, "warning", raw["message"], self.path)
        return None


class RoleLogWatch:
    """Counts of warnings and errors over every role log under RUN_DIR/logs, and the latest one."""

    def __init__(self, logs_dir: Path):
        self.logs_dir = Path(logs_dir)
        self.files: dict[Path, _LogFile] = {}
        self.counts = {"warning": 0, "error": 0}
        self.latest: Problem | None = None

    def skip_existing(self) -> None:
        """Start at the logs' current ends (a resumed run: the earlier launch's problems are not this one's)."""
        for path in sorted(self.logs_dir.glob("*.log")):
            log = self.files.setdefault(path, _LogFile(path))
            log.offset = path.stat().st_size

    def poll(self) -> list[Problem]:
        """The problems written since the last call, oldest first."""
        new = []
        for path in sorted(self.logs_dir.glob("*.log")):
            new.extend(self.files.setdefault(path, _LogFile(path)).read())
        for problem in new:
            self.counts[problem.kind] += 1
            self.latest = problem
        return new

    def summary(self) -> str | None:
        """One line: how many warnings and errors, and the latest one; None when there were none."""
        if self.latest is None:
            return None
        w, e = self.counts["warning"], self.counts["error"]
        return f"{w} warning(s), {e} error(s) in the role logs; latest: {self.latest.line()}"


CAUSE_TAIL_BYTES = 1 << 20  # a cause is near a log's end: no more of it is read


def failure_cause(path: Path, offset: int = 0) -> str | None:
    """Why a role's process failed, as its log says from `offset` (where that process began
    writing): the exception line of its last traceback, else its last error record; None when
    the log says neither. What the launcher prints beside an exit, so that the cause of a start
    failure (a port in use, a missing module) reaches the console, not only the log."""
    try:
        with open(path, "rb") as f:
            size = f.seek(0, 2)
            f.seek(max(offset, size - CAUSE_TAIL_BYTES))
            text = f.read().decode(errors="replace")
    except OSError:
        return None
    exception = record = None
    in_traceback = False
    for line in text.splitlines():
        parsed = RECORD.match(line)
        if parsed is not None:
            in_traceback = False
            if PROBLEM_LEVELS.get(parsed["level"]) == "error":
                record = parsed["message"]
        elif line == TRACEBACK:
            in_traceback = True
        elif in_traceback and line and not line[0].isspace():
            in_traceback = False
            exception = line
    cause = exception or record
    return None if cause is None else cause.strip()[:500]
