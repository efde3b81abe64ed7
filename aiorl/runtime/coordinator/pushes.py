"""What the coordinator sends unasked over the roles' control connections: a message to every
role (a phase change, the memory hosts' addresses) and, in the order they were sent, messages
to the memory hosts alone (``role_lost``, ``role_back``)."""

from __future__ import annotations

import asyncio

from aiorl.runtime.coordinator.roster import RoleRecord
from aiorl.wire import Connection, ConnectionClosed


class Pushes:
    def __init__(self, roles: dict[str, RoleRecord]):
        self.roles = roles  # the roster's records by name
        self.tasks: set[asyncio.Task] = set()  # pushes to the memory hosts still under way
        self._last: asyncio.Task | None = None

    def to_memories(self, kind: str, meta: dict) -> None:
        """Send `kind` to every connected memory host, after every push sent before it: a
        restarted actor's ``role_back`` must never overtake its predecessor's ``role_lost``."""
        memories = [r for r in self.roles.values() if r.kind == "memory" and r.conn is not None]
        if not memories:
            return
        task = asyncio.get_running_loop().create_task(self._push(memories, kind, meta, self._last))
        self._last = task
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _push(self, records: list[RoleRecord], kind: str, meta: dict, after: asyncio.Task | None) -> None:
        if after is not None:
            await asyncio.gather(after, return_exceptions=True)
        for record in records:
            try:
                await record.conn.send(kind, meta)
            except (ConnectionClosed, AttributeError):
                pass  # gone meanwhile (conn reset to None)

    async def broadcast(self, kind: str, meta: dict) -> None:
        """Send `kind` to every role connected now."""

        async def send(conn: Connection) -> None:
            try:
                await conn.send(kind, meta)
            except ConnectionClosed:
                pass

        # The connections as they are now: gather starts each send a loop turn later, by when a
        # role's connection may have closed (record.conn None: at 512 actors that crashed the
        # coordinator in the phase change to STOPPING, bench/scale.py).
        targets = [r.conn for r in self.roles.values() if r.conn is not None]
        await asyncio.gather(*(send(conn) for conn in targets))
