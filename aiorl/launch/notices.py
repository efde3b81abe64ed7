"""The local launcher's exit notices: as every role's parent it sees a child exit at once, and
tells the coordinator (``child_exit``: role, pid, exit code or signal), which then declares
that incarnation lost instead of waiting for its heartbeats to stop
(`aiorl.runtime.coordinator.notices` says who may send one and what it does).

The launcher's loop is synchronous and must never wait on the coordinator, so the connection
lives in a thread of its own, with its own event loop: `child_exited` only queues a notice.
The thread connects under the handshake name `LAUNCHER_PEER`, over the run's Unix socket only
(there the kernel tells the coordinator which process connected; over TCP a role holding the
token could pass for the launcher), retries with a bounded backoff, and gives every request a
bounded timeout. A coordinator it cannot reach, or one that refuses it, only leaves the
notices unsent: the coordinator then finds the role lost by its silence, as without them.

The connection also carries the coordinator's word the other way: ``end_role`` names a role's
process the run gave up (lost while it may still live: hung, SIGSTOPped); `given_up` hands those
to the launcher's loop, which ends the process and restarts it like a dead one.

The thread starts once every first process of a role is started. With the warm spawner (the
default) the launcher forks nothing itself; with ``cluster.warm_spawner: false`` it forks each
restart while the thread runs, and `subprocess` runs Python code in the child before exec
(``preexec_fn``): the thread imports nothing once started (every module it uses is imported
before), so it never holds the import or the loader's lock a child could need, and `logging`'s
fork hook resets the locks of its handlers in the child.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import threading
from pathlib import Path

from aiorl.config import Config
from aiorl.runtime.messages import BadMessage, integer, name, text
from aiorl.runtime.restart import LAUNCHER_PEER, exit_notice
from aiorl.runtime.transport import SOCKETS_ONLY
from aiorl.wire import ConnectionClosed, RemoteError, WireError, connect, load_token

log = logging.getLogger("aiorl.launch")

TIMEOUT_S = 2.0  # a handshake, or a notice's answer
BACKOFF_S = (0.05, 2.0)  # first and longest wait between attempts to connect
MAX_QUEUED = 1024  # notices waiting for a connection (beyond: the oldest go; heartbeats cover them)
MAX_REASON = 500  # characters of the coordinator's reason for a role given up, as the launcher prints it


def end_role_fields(meta: dict) -> tuple[str, int, str]:
    """(role, pid, why) of an ``end_role`` message; BadMessage if it is not one."""
    if type(meta) is not dict:
        raise BadMessage(f"end_role must be a map, got {type(meta).__name__}")
    why = text(10_000)(meta.get("reason", ""), "end_role[reason]")
    return name(meta.get("role"), "end_role[role]"), integer(1, 1 << 31)(meta.get("pid"), "end_role[pid]"), why


class ExitNotices:
    """Reports the launcher's children's exits to the coordinator, from a thread of its own."""

    def __init__(self, cfg: Config, run_dir: Path):
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.queued: collections.deque[dict] = collections.deque(maxlen=MAX_QUEUED)
        self.answers: list[dict] = []  # (notice, the coordinator's outcome), for the launcher's log
        self.refused: str | None = None  # why the coordinator refused them: nothing more is sent
        # (role, pid, why) of processes the coordinator gave up, for the launcher's loop (`given_up`)
        self._given_up: collections.deque[tuple[str, int, str]] = collections.deque(maxlen=MAX_QUEUED)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._thread: threading.Thread | None = None

    def start(self, unix_path: str | None) -> None:
        """Connect to the coordinator at its Unix socket (none: no notices; heartbeats decide)."""
        if unix_path is None or self._thread is not None:
            return
        path = self.cfg.run.token_file
        if path is None and (self.run_dir / "token").exists():
            path = self.run_dir / "token"
        try:
            token = load_token(path)
        except WireError as exc:
            log.warning("no exit notices to the coordinator: %s", exc)
            return
        self._loop = asyncio.new_event_loop()
        self._wake = asyncio.Event()
        self._thread = threading.Thread(
            target=self._serve, args=(token, unix_path), name="aiorl exit notices", daemon=True
        )
        self._thread.start()

    def child_exited(self, name: str, pid: int, returncode: int) -> None:
        """Queue a notice of `name`'s process `pid` ending with `returncode` (Popen's); never waits."""
        if self._loop is None:
            return
        self.queued.append(exit_notice(name, pid, returncode))
        self._poke()

    def given_up(self) -> list[tuple[str, int, str]]:
        """(role, pid, why) of each process the coordinator declared lost since the last call."""
        out = []
        while self._given_up:
            out.append(self._given_up.popleft())
        return out

    def close(self, timeout_s: float = 1.0) -> None:
        loop, self._loop = self._loop, None
        if loop is None:
            return
        try:
            loop.call_soon_threadsafe(self._stop)
        except RuntimeError:
            pass  # its loop has already ended
        self._thread.join(timeout_s)

    # ------------------------------------------------------------------ the thread

    def _poke(self) -> None:
        try:
            self._loop.call_soon_threadsafe(self._wake.set)
        except (RuntimeError, AttributeError):
            pass  # closed meanwhile

    def _stop(self) -> None:
        self._main_task.cancel()

    def _serve(self, token: bytes, unix_path: str) -> None:
        loop = self._loop
        asyncio.set_event_loop(loop)
        try:
            self._main_task = loop.create_task(self._main(token, unix_path))
            loop.run_until_complete(asyncio.gather(self._main_task, return_exceptions=True))
        finally:
            loop.close()

    async def _read_pushes(self, conn) -> None:
        """What the coordinator sends unasked on the connection: ``end_role`` (see the module)."""
        try:
            async for msg in conn:
                if msg.kind != "end_role" or msg.request_id is not None:
                    log.debug("exit notices: ignored %r from the coordinator", msg.kind)
                    continue
                try:
                    role, pid, why = end_role_fields(msg.meta)
                except BadMessage as exc:
                    log.warning("exit notices: a bad end_role from the coordinator: %s", exc)
                    continue
                self._given_up.append((role, pid, why[:MAX_REASON]))
        except (ConnectionClosed, WireError, OSError):
            pass
        finally:
            self._wake.set()  # the loop finds the connection gone and makes another

    async def _main(self, token: bytes, unix_path: str) -> None:
        conn = reader = None
        # Grows while nothing gets an answer: a coordinator that keeps closing the connection
        # (or keeps refusing it) is not hammered.
        delay = BACKOFF_S[0]
        try:
            while self.refused is None:
                if conn is not None and reader.done():  # the coordinator closed it
                    conn.abort()
                    conn = None
                    await asyncio.sleep(delay)
                    delay = min(2 * delay, BACKOFF_S[1])
                if conn is None:
                    try:
                        conn = await connect(
                            "",
                            0,
                            token=token,
                            name=LAUNCHER_PEER,
                            handshake_timeout_s=TIMEOUT_S,
                            **SOCKETS_ONLY.connect_args(unix_path),
                        )
                    except (OSError, TimeoutError, WireError) as exc:
                        log.debug("exit notices: cannot reach the coordinator (%s); again in %.2f s", exc, delay)
                        await asyncio.sleep(delay)
                        delay = min(2 * delay, BACKOFF_S[1])
                        continue
                    reader = asyncio.get_running_loop().create_task(self._read_pushes(conn))
                if not self.queued:
                    self._wake.clear()
                    if not self.queued and not reader.done():  # one queued, or closed, meanwhile
                        await self._wake.wait()
                    continue
                notice = self.queued[0]
                try:
                    reply = await conn.request("child_exit", notice, timeout_s=TIMEOUT_S)
                except RemoteError as exc:
                    self.refused = str(exc)
                    log.warning("the coordinator refused the launcher's exit notices: %s", exc)
                except (ConnectionClosed, TimeoutError, WireError, OSError) as exc:
                    # Sent again on the next connection: a second notice of one exit does nothing.
                    log.debug("exit notices: the connection to the coordinator ended (%s)", exc)
                    conn.abort()
                    conn = None
                    await asyncio.sleep(delay)
                    delay = min(2 * delay, BACKOFF_S[1])
                else:
                    self.queued.popleft()
                    self.answers.append({**notice, "outcome": reply.meta.get("outcome")})
                    log.debug("exit notice %s: %s", notice, reply.meta.get("outcome"))
                    delay = BACKOFF_S[0]
        finally:
            if conn is not None:
                conn.abort()
            if reader is not None:
                reader.cancel()
                await asyncio.gather(reader, return_exceptions=True)
