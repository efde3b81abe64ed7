"""Entry point of one role process: logging, token, TLS, the uvloop runner.

Memory host 0 runs the coordinator in the same event loop as its replay.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import ssl
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from aiorl.config import Config
from aiorl.core.console import CONSOLE, console_handler
from aiorl.io.rundir import Identity, make_subdir, write_json_atomic
from aiorl.runtime.actor import ActorRole
from aiorl.runtime.coordinator import Coordinator
from aiorl.runtime.learner import LearnerRole
from aiorl.runtime.memory import MemoryRole
from aiorl.runtime.phase import EXIT_FAILED, EXIT_OK, INTERRUPTED, interrupted_exit_code, role_name
from aiorl.runtime.resources import raise_open_file_limit
from aiorl.runtime.transport import transport_of
from aiorl.wire import load_token
from aiorl.wire.tls import client_context, server_context


def setup_logging(run_dir: Path, name: str, level: str, console: bool = False) -> None:
    """One log file per role, plus warnings on stderr, every line prefixed by the role;
    `console` (a role started by hand): its connect, phase and exit lines on stdout too.

    Under the local launcher stderr already is that log file (aiorl.launch.local): then
    nothing more goes to it, or every warning would be in the log twice.
    """
    logs = make_subdir(run_dir, "logs")  # a deleted run directory is never made again
    fmt = logging.Formatter(f"%(asctime)s {name} %(levelname)s %(name)s: %(message)s")
    root = logging.getLogger()
    root.handlers.clear()
    root.setLevel(level.upper())
    log_path = logs / f"{name}.log"
    file_handler = logging.FileHandler(log_path)
    file_handler.setFormatter(fmt)
    root.addHandler(file_handler)
    logging.captureWarnings(True)  # warnings.warn lines become records: one format to read back
    if not _is_same_file(sys.stderr, log_path):
        err = logging.StreamHandler(sys.stderr)
        err.setLevel(logging.WARNING)
        err.setFormatter(logging.Formatter(f"{name} %(levelname)s: %(message)s"))
        root.addHandler(err)
    if console:
        root.addHandler(console_handler(name))


def _is_same_file(stream, path: Path) -> bool:
    try:
        a, b = os.fstat(stream.fileno()), os.stat(path)
    except (OSError, ValueError, AttributeError):
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def tls_contexts(cfg: Config) -> tuple[ssl.SSLContext | None, ssl.SSLContext | None]:
    """(client, server) contexts when cluster.tls_cert is set, else (None, None).

    Every role presents the cluster certificate both ways; with ``cluster.tls_ca``
    servers also require client certificates signed by that CA.
    """
    c = cfg.cluster
    if not c.tls_cert:
        return None, None
    server = server_context(c.tls_cert, c.tls_key, client_cafile=c.tls_ca)
    client = client_context(c.tls_ca or c.tls_cert, certfile=c.tls_cert, keyfile=c.tls_key)
    return client, server


def cluster_token(cfg: Config, run_dir: Path) -> bytes:
    path = cfg.run.token_file
    if path is None and (run_dir / "token").exists():
        path = run_dir / "token"
    return load_token(path)


async def _run_memory0(cfg: Config, run_dir: Path, token: bytes, ssl_client, ssl_server) -> int:
    identity = Identity.from_env()
    coordinator = Coordinator(cfg, run_dir, token, ssl=ssl_server, identity=identity)
    # A signal is how the launcher stops a run, and it may come while this process still starts
    # (the coordinator's algorithm, memory 0's replay). Until memory 0's role takes the signals
    # over, it stops the run through the coordinator: Python's default would end this process
    # before any summary and leave every other role waiting for a coordinator that is gone.
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, coordinator.interrupt, signal.Signals(sig).name, "memory-0")
    unix_path = transport_of(cfg).socket_path(run_dir, "coordinator")
    port = await coordinator.start(cfg.cluster.host, cfg.cluster.port, unix_path)
    cfg.cluster.port = port
    address = {"host": cfg.cluster.advertise_host or cfg.cluster.host, "port": port, "pid": os.getpid()}
    if coordinator.server.unix_path is not None:  # a local run: its roles (and aiorl status here) use it
        address.update(unix=coordinator.server.unix_path, hostname=socket.gethostname())
    write_json_atomic(run_dir / "coordinator.json", identity.stamp(address))
    logging.getLogger("aiorl.coordinator").info(
        "coordinator listening on %s:%s%s",
        cfg.cluster.host,
        port,
        f" and on unix:{coordinator.server.unix_path}" if coordinator.server.unix_path else "",
        extra={CONSOLE: True},
    )
    memory = MemoryRole(cfg, 0, run_dir, token, ssl_client=ssl_client, ssl_server=ssl_server, coordinator=coordinator)
    async with asyncio.TaskGroup() as tg:
        run_ok = tg.create_task(coordinator.run())
        memory_code = tg.create_task(memory.run())
        await run_ok
        await coordinator.close(timeout_s=cfg.cluster.coordinator_timeout_s)
    code = memory_code.result()
    if code == EXIT_OK and not run_ok.result():
        return EXIT_FAILED
    if code == EXIT_OK and coordinator.outcome == INTERRUPTED:
        return interrupted_exit_code(coordinator.interrupted_by)
    return code


def torch_threads_here() -> None:
    """Give the calling thread the process's torch thread count (``model.torch_threads``).

    torch.set_num_threads sets it for the thread that calls it; MKL keeps its own count per
    thread (``mkl_set_num_threads_local``), and a new thread starts from MKL's default, the
    number of cores. An actor's worker threads therefore ran every gemm and vectorised op (tanh,
    an LSTM cell) with a second MKL thread that spun between ops, and on a busy machine waited
    for it: an IMPALA-LSTM actor spent 7 ms in a tanh of 8 x 64 floats. ``torch.get_num_threads``
    answers the count the process set (torch keeps it process-wide), and setting it again
    applies it to this thread's MKL.
    """
    torch = sys.modules.get("torch")  # a role without torch (a memory host) does not import it for this
    if torch is not None:
        torch.set_num_threads(torch.get_num_threads())


def role_loop(kind: str) -> asyncio.AbstractEventLoop:
    """A role's event loop: uvloop. An actor's default executor (every ``asyncio.to_thread``:
    its offloaded env steps) starts each of its threads on the process's torch thread count.

    A learner's threads keep MKL's own count (the number of cores), as its main thread does:
    its gemms are what the run waits for, and a second MKL thread measured faster there
    (Ape-X DQN CartPole to 475, median of 5 seeds: 15.5 s from launch so, 20.6 s with every
    learner thread held to one)."""
    import uvloop

    loop = uvloop.new_event_loop()
    if kind == "actor":
        loop.set_default_executor(ThreadPoolExecutor(thread_name_prefix="asyncio", initializer=torch_threads_here))
    return loop


async def _run_role(cfg: Config, kind: str, index: int, run_dir: Path) -> int:
    token = cluster_token(cfg, run_dir)
    ssl_client, ssl_server = tls_contexts(cfg)
    if kind == "memory" and index == 0:
        return await _run_memory0(cfg, run_dir, token, ssl_client, ssl_server)
    cls = {"memory": MemoryRole, "learner": LearnerRole, "actor": ActorRole}[kind]
    return await cls(cfg, index, run_dir, token, ssl_client=ssl_client, ssl_server=ssl_server).run()


def run_role(cfg: Config, kind: str, index: int, run_dir: str | Path, console: bool = False) -> int:
    """Run one role to its end in this process; return its exit code. `console`: see `setup_logging`."""
    run_dir = Path(run_dir)
    name = role_name(kind, index)
    setup_logging(run_dir, name, cfg.run.log_level, console)
    log = logging.getLogger(f"aiorl.{name}")
    soft, _ = raise_open_file_limit()
    log.info("starting (pid %d, open-file limit %d)", os.getpid(), soft)
    try:
        with asyncio.Runner(loop_factory=lambda: role_loop(kind)) as runner:
            code = runner.run(_run_role(cfg, kind, index, run_dir))
    except Exception:
        log.exception("crashed")
        code = EXIT_FAILED
    log.info("exit code %d; run directory %s", code, run_dir.resolve(), extra={CONSOLE: True})
    logging.shutdown()
    return code
