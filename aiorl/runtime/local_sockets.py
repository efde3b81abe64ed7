"""A local run's Unix sockets: where its servers listen, and when a role uses them.

Only the local launcher starts every role on this host, so only it turns them on: it gives
each child ``AIORL_UNIX_SOCKETS=1`` (``cluster.unix_sockets``), and, once memory host 0 has
written ``coordinator.json``, the coordinator's socket in ``AIORL_COORDINATOR_UNIX``. A role
placed by Ray or started by hand has neither and keeps TCP; so does any address whose socket
does not exist on this host. Servers listen on TCP as well in any case (a Ray role, ``aiorl
status HOST:PORT``). Whether rings go beside the sockets is the config's choice, made with the
rest of the transport in :mod:`aiorl.runtime.transport`.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from aiorl.wire.unix import fits

ENV_ON = "AIORL_UNIX_SOCKETS"
ENV_COORDINATOR = "AIORL_COORDINATOR_UNIX"
#: Inside the run directory (0700), kept short: sun_path holds 107 bytes.
SOCKET_DIR = "sock"

log = logging.getLogger("aiorl.wire")
_said_too_long: list[str] = []


def enabled(environ=os.environ) -> bool:
    """Whether the local launcher started this process with Unix sockets on."""
    return environ.get(ENV_ON) == "1"


def path_in(run_dir: str | Path, name: str) -> str | None:
    """Where server `name` of the run in `run_dir` listens besides TCP; None when the path would
    not fit (said once per process, here)."""
    directory = Path(run_dir).absolute() / SOCKET_DIR
    path = str(directory / name)
    if not fits(path):
        if not _said_too_long:  # once per process: the coordinator and memory host 0 share one
            _said_too_long.append(name)
            log.warning(
                "%s: the run directory's path is too long for a Unix socket (%d bytes, at most 107); "
                "serving on TCP only for this run",
                name,
                len(os.fsencode(path)),
            )
        return None
    directory.mkdir(mode=0o700, exist_ok=True)
    return path
