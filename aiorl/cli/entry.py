"""The `aiorl` command's entry point (``aiorl``, ``python -m aiorl``).

For ``aiorl run`` it starts the warm spawner before anything else is imported, with the
standard library only (`aiorl.runtime.warm_fork`), so that the spawner's imports of torch and
the runtime overlap the command line's own (a fifth of a second of aiorl's modules on a small
machine). The guess is made from the words alone; `aiorl.cli.main` parses them properly and
ends the spawner where the run turns out not to want it (a role, Ray, ``cluster.warm_spawner:
false``, ``--help``).
"""

from __future__ import annotations

import sys

from aiorl.runtime.warm_fork import start_spawner_process, switch_from_env

SPAWNER_MODULE = "aiorl.cli.spawner"


def wants_spawner(argv: list[str]) -> bool:
    """Whether these words look like a local ``aiorl run``: not a role, not on Ray, not help."""
    if not argv or argv[0] != "run" or "--role" in argv or "-h" in argv or "--help" in argv:
        return False
    for i, word in enumerate(argv):
        if word == "--launcher=ray" or (word == "--launcher" and argv[i + 1 : i + 2] == ["ray"]):
            return False
    return switch_from_env() is not False


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    early = start_spawner_process(SPAWNER_MODULE) if wants_spawner(argv) else None
    from aiorl.cli.main import main as command  # after the spawner's start: this is what it overlaps

    return command(argv, early=early)
