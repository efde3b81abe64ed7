"""`aiorl status TARGET`: ask a running cluster how it is doing.

TARGET is a run directory (the coordinator's address is recorded in its
``coordinator.json``) or ``host:port``. The cluster token comes from
``AIORL_TOKEN``, ``--token-file`` or the run directory's ``token``. A local run's
coordinator also listens on a Unix socket in the run directory; on the host where that
socket is, a run directory's status is asked there (the server checks the uid too). A finished
run's directory gives its final summary instead, read from ``summary.json``
without a token or a coordinator, but only a summary its latest launch wrote
(``run.json`` names it): an earlier launch's is never shown as this one's
result.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import socket
import sys
from pathlib import Path

from aiorl.config import connect_host
from aiorl.io.rundir import latest_launch_id, read_json
from aiorl.runtime.messages import BadMessage, unpack_table
from aiorl.runtime.transport import SOCKETS_ONLY
from aiorl.wire import ConnectionClosed, ProtocolError, ServerBusy, WireError, connect, load_token


class StatusError(RuntimeError):
    pass


# Control characters other than newline and tab (C0, DEL, C1), and the bidirectional overrides: a
# run directory (summary.json, coordinator.json) or a coordinator holding them could rewrite the
# terminal that prints them (an OSC title, a cleared screen, text shown out of order).
_CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def printable(text: str) -> str:
    """`text` for a terminal: its control characters escaped as Python writes them (``\\x1b``)."""
    return _CONTROLS.sub(lambda m: ascii(m.group())[1:-1], text)


def say(text: str, file=None) -> None:
    print(printable(text), file=file or sys.stdout)


def resolve_target(target: str, token_file: str | None) -> tuple[str, int, bytes | None, Path | None]:
    path = Path(target)
    if path.is_dir():
        address_file = path / "coordinator.json"
        if not address_file.exists():
            raise StatusError(f"{path}: no coordinator.json (not an aiorl run directory, or it never started)")
        address = json.loads(address_file.read_text())
        host = connect_host(address["host"])
        token_path = token_file or (path / "token" if (path / "token").exists() else None)
        return host, int(address["port"]), load_token(token_path), path
    host, sep, port = target.rpartition(":")
    if not sep or not port.isdigit():
        missing = " does not exist" if not path.exists() else " is not a directory" if sep == "" else ""
        raise StatusError(f"TARGET {target!r}{missing}: expected a run directory or host:port")
    return host, int(port), load_token(token_file), None


def status_of(reply) -> dict:
    """The coordinator's status reply as one dict (its roles table travels packed, as an array)."""

    status = dict(reply.meta)
    if "roles" in reply.arrays:
        try:
            status["roles"] = unpack_table(reply.arrays["roles"])
        except BadMessage as exc:
            raise ProtocolError(f"the coordinator's status reply: {exc}") from None
    return status


def unix_socket_of(run_dir: Path) -> str | None:
    """The coordinator's Unix socket from a run directory's coordinator.json, when it is on this
    host and there; None: ask over TCP."""
    address = read_json(run_dir / "coordinator.json") or {}
    path = address.get("unix")
    if not isinstance(path, str) or address.get("hostname") != socket.gethostname() or not os.path.exists(path):
        return None
    return path


async def fetch_status(
    host: str, port: int, token: bytes, timeout_s: float = 5.0, unix_path: str | None = None
) -> dict:
    conn = await _connect(host, port, token, timeout_s, unix_path)
    try:
        reply = await conn.request("status", timeout_s=timeout_s)
        return status_of(reply)
    finally:
        await conn.close()


async def _connect(host: str, port: int, token: bytes, timeout_s: float, unix_path: str | None = None):
    """Connect, retrying while the coordinator is busy: its handshake slots go to peers that
    complete quickly, so a busy refusal lasts at most a stalled handshake's first_bytes_timeout_s."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    delay = 0.05
    while True:
        remaining = deadline - loop.time()
        try:
            return await connect(
                host,
                port,
                token=token,
                name="status",
                handshake_timeout_s=max(0.1, remaining),
                **SOCKETS_ONLY.connect_args(unix_path),
            )
        except ServerBusy:
            if loop.time() + delay > deadline:
                raise
            await asyncio.sleep(delay)
            delay = min(2 * delay, 0.5)


def render(status: dict) -> str:
    lines = [
        f"phase {status['phase']}  elapsed {status.get('elapsed_s', 0):.1f} s"
        + (f"  (stopping: {status['stop_reason']})" if status.get("stop_reason") else ""),
        f"env_steps {status['env_steps']}  learner_steps {status['learner_steps']}  "
        f"episodes {status['episodes']}  return_mean_100 {status.get('return_mean_100')}  "
        f"weights_version {status.get('weights_version')}  attempt {status.get('attempt', 1)}  "
        f"restarts {status.get('restarts', 0)}" + (f"  epochs {status['epochs']:.2f}" if "epochs" in status else ""),
        f"{'role':<12} {'status':<9} {'pid':>8} {'heartbeat':>10}  counters",
    ]
    for name, role in status["roles"].items():
        age = role.get("heartbeat_age_s")
        lines.append(
            f"{name:<12} {role['status']:<9} {role.get('pid') or '-':>8} "
            f"{'-' if age is None else f'{age:.1f} s ago':>10}  "
            + " ".join(f"{k}={v}" for k, v in (role.get("counters") or {}).items())
            + (f"  ({role['reason']})" if role.get("reason") else "")
        )
    return "\n".join(lines)


def finished_summary(run_dir: Path) -> dict | None:
    """The summary of a run directory's latest launch, when that launch finished; else None.

    A finished run needs no coordinator and no token: its summary is a file. A
    directory without a launch record (run.json) has nothing to contradict it.
    """
    final = read_json(run_dir / "summary.json")
    latest = latest_launch_id(run_dir)
    if final is None or (latest is not None and final.get("launch_id") != latest):
        return None
    return final


def render_final(final: dict) -> str:
    lines = [
        f"run {final.get('outcome', 'finished')} ({'ok' if final['ok'] else 'FAILED'}): "
        f"{final.get('stop_detail') or final.get('stop_reason')}",
        f"env_steps {final['env_steps']}  learner_steps {final['learner_steps']}  "
        f"episodes {final['episodes']}  return_mean_100 {final.get('return_mean_100')}"
        + (f"  epochs {final['epochs']:.2f}" if "epochs" in final else ""),
    ]
    evaluation = evaluation_line(final.get("evaluation"))
    if evaluation:
        lines.append(evaluation)
    for name, role in final["roles"].items():
        lines.append(f"{name:<12} {role['status']:<9}" + (f"  ({role['reason']})" if role.get("reason") else ""))
    lines.extend(f"failure: {failure}" for failure in final.get("failures", []))
    return "\n".join(lines)


def evaluation_line(evaluation: dict | None) -> str | None:
    """The best and the last evaluation during training (summary.json's ``evaluation``), or None."""
    best, last = (evaluation or {}).get("best"), (evaluation or {}).get("last")
    if not best:
        return None

    def one(e: dict) -> str:
        return f"{e['return_mean']:.2f} ± {e['return_std']:.1f} at learner step {e['learner_steps']:,}"

    line = f"evaluation: best {one(best)} ({evaluation.get('count')} evaluations)"
    if last and last.get("n") != best.get("n"):
        line += f"; last {one(last)}"
    return line


def cmd_status(args: argparse.Namespace) -> int:
    final = finished_summary(Path(args.target)) if Path(args.target).is_dir() else None
    if final is not None:
        say(json.dumps({"live": False, **final}) if args.json else render_final(final))
        return 0
    try:
        host, port, token, run_dir = resolve_target(args.target, args.token_file)
    except (StatusError, WireError, OSError, ValueError) as exc:
        say(f"aiorl status: {exc}", sys.stderr)
        return 2
    try:
        unix_path = unix_socket_of(run_dir) if run_dir is not None else None
        status = asyncio.run(fetch_status(host, port, token, args.timeout, unix_path))
        status["live"] = True
    except (OSError, TimeoutError, ConnectionClosed, WireError) as exc:
        final = read_json(run_dir / "summary.json") if run_dir is not None else None
        if final is not None:
            say(
                f"aiorl status: cannot reach the coordinator at {host}:{port} ({exc}), and the latest launch "
                f"of {run_dir} wrote no summary: it did not finish (the summary there is an earlier "
                f"launch's, attempt {final.get('attempt')})",
                sys.stderr,
            )
            return 1
        say(f"aiorl status: cannot reach the coordinator at {host}:{port}: {exc}", sys.stderr)
        return 1
    say(json.dumps(status) if args.json else render(status))
    return 0


def add_parser(sub) -> None:
    p = sub.add_parser("status", help="live state of a running cluster (or a finished run's summary)")
    p.add_argument("target", help="run directory or host:port of the coordinator")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--token-file", default=None, help="cluster token file (default: AIORL_TOKEN or RUN_DIR/token)")
    p.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for the coordinator")
    p.set_defaults(func=cmd_status)
