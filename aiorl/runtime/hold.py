"""Holding a role before it registers, to look at a run kept in STARTING.

``AIORL_HOLD_BEFORE_REGISTER=actor-1`` (a comma-separated list of role names) makes the first
process of each named role stop itself with SIGSTOP just before it connects to the coordinator:
the run stays in STARTING while one attaches a debugger or a profiler to that role
(``py-spy dump --pid PID``, ``gdb -p PID``), or, in the survival tests, kills roles in STARTING.
``kill -CONT PID`` lets it go on; a held role still counts against ``cluster.start_timeout_s``.

The local launcher gives the variable to a role's first process of the launch the user started
only: a role restarted in place, or any role of a whole-run restart (`aiorl.launch.attempts`), is
never held, so killing a held role lets the run go on without it being held again.
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Mapping

ENV_HOLD = "AIORL_HOLD_BEFORE_REGISTER"


def held_names(environ: Mapping[str, str] = os.environ) -> set[str]:
    return {name.strip() for name in environ.get(ENV_HOLD, "").split(",") if name.strip()}


def hold_if_named(name: str, log: logging.Logger, environ: Mapping[str, str] = os.environ) -> bool:
    """Stop this process (SIGSTOP) if `name` is held; True once it was continued."""
    if name not in held_names(environ):
        return False
    log.warning("held before registering (%s): `kill -CONT %d` lets it go on", ENV_HOLD, os.getpid())
    for handler in log.handlers + logging.getLogger().handlers:
        handler.flush()
    os.kill(os.getpid(), signal.SIGSTOP)
    return True
