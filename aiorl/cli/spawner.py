"""The warm spawner's process: ``python -P -m aiorl.cli.spawner FD`` (started by the local launcher).

`aiorl.launch.spawner` holds the serving loop and says why the spawner exists; this entry
sits at the top floor because what it forks runs the top floor's code: a role is
``aiorl run CONFIG --role KIND --index N`` (`aiorl.cli.main`), the evaluation worker is
`aiorl.evaluation.worker`, the preflight is `aiorl.experiment.preflight`.

What it imports before it serves is what every role would import on its own: numpy, torch,
gymnasium, uvloop, the runtime's roles and the command line; an algorithm's module when the
launcher names it (and, for a ``run.deterministic`` run, what torch's deterministic mode imports);
and what the algorithm's roles share, computed once in a child (`Algorithm.prefork`: numpy only).
Not torch._dynamo: no role needs it before its end (`aiorl.algos.lib.optimizers`). Nothing here
runs a torch op.
"""

from __future__ import annotations

import gc
import socket
import sys

from aiorl.algos import get_algorithm
from aiorl.cli.main import main as aiorl_main
from aiorl.config import ConfigError
from aiorl.evaluation.worker import main as eval_worker_main
from aiorl.experiment.loading import load_config
from aiorl.experiment.preflight import check_algorithm
from aiorl.launch.spawner import Spawner, exit_child


def preload() -> None:
    # The cyclic collector stays off here: run over torch's half a million objects again and
    # again while they are imported, it cost 0.3-0.7 s of this start on 2 cores. Children turn
    # it back on over a frozen heap (`Spawner` freezes it before each fork), so their collections
    # never walk, nor write to, the pages they share with the spawner.
    gc.disable()
    import gymnasium  # noqa: F401
    import numpy  # noqa: F401
    import torch  # noqa: F401
    import uvloop  # noqa: F401

    import aiorl.runtime.process  # noqa: F401  (the roles' own modules)


def warm(algo: str, deterministic: bool = False) -> None:
    get_algorithm(algo)
    if deterministic:
        # torch.use_deterministic_algorithms imports torch._inductor.config, and torch._dynamo with
        # it (a second of CPU): once here, for a run.deterministic run, not in every role after
        # RUNNING. Other runs never import it (aiorl.algos.lib.optimizers says why).
        import torch._inductor.config  # noqa: F401


def prefork(config_path: str) -> tuple[str, dict] | None:
    """The run's algorithm and its `Algorithm.prefork` arrays (in the spawner's prefork child); None
    for a config the preflight refuses: that is the preflight's to report, and no role is forked."""
    try:
        cfg = load_config(config_path)
    except ConfigError:
        return None
    return cfg.algo, get_algorithm(cfg.algo).prefork(cfg)


def adopt(algo: str, arrays: dict) -> None:
    get_algorithm(algo).adopt_prefork(arrays)


def check(config_path: str) -> dict:
    """The preflight's half with torch (`aiorl.experiment.preflight.check_algorithm`) on a resolved
    config; the launcher checked the rest."""
    try:
        check_algorithm(load_config(config_path))
    except ConfigError as exc:
        return {"mistake": str(exc)}
    return {"mistake": None}


def run_child(kind: str, argv: list[str]) -> int:
    return (aiorl_main if kind == "role" else eval_worker_main)(argv)


def serve(sock: socket.socket) -> None:
    """Serve one launcher on `sock` until it goes (here, or in a spawner the fork server forked)."""
    Spawner(sock, run_child, check, warm, prefork, adopt).serve()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    sock = socket.socket(fileno=int(argv[0]))
    preload()
    serve(sock)
    return 0


if __name__ == "__main__":
    # Its children are reaped and it holds nothing to save: skip tearing down torch's modules.
    exit_child(main())
