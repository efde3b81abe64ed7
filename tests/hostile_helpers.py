"""Memory host 0 (coordinator + replay) in the test's own loop, over real TCP on loopback, or
(``transport="shm"``) over shared-memory rings handed over on Unix sockets in the run directory.

The test plays the other roles (or an attacker) with real wire connections,
so it can send what a real actor or learner never would and look at the
memory host's and coordinator's state while it does.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import numpy as np

from aiorl.experiment.loading import load_config
from aiorl.runtime import local_sockets
from aiorl.runtime.coordinator import Coordinator
from aiorl.runtime.memory import MemoryRole
from aiorl.runtime.transport import transport_of
from aiorl.wire import connect, generate_token

HANG_S = 30.0  # only bounds a hang

CONFIG = {
    "algo": "random_agent",
    "env": {"id": "CartPole-v1", "num_envs": 1},
    "cluster": {
        "actors": 1,
        "memories": 1,
        "learners": 1,
        "heartbeat_interval_s": 0.2,
        "heartbeat_timeout_s": 60.0,
        "coordinator_timeout_s": 5.0,
        "start_timeout_s": 30.0,
        "phase_timeout_s": 5.0,
    },
    "agent": {
        "sample_batch_size": 4,
        "batch_size": 8,
        "buffer_size": 1000,
        "learning_starts": 8,
        "scheduled_timesteps": 10**9,
    },
    "run": {"metrics_interval_s": 0.5, "tensorboard": False},
}


class Memory0:
    """Coordinator and memory host 0 running in this loop; `register`/`attach` play roles."""

    def __init__(self, tmp_path: Path, overrides: list[str] = (), transport: str = "tcp"):
        assert transport in ("tcp", "shm"), transport
        self.transport = transport
        self._environ: dict[str, str | None] = {}
        self.run_dir = tmp_path / "run"
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.cfg = load_config(data=CONFIG, overrides=[f"run.dir={self.run_dir}", *overrides])
        self.token = generate_token()
        self.conns = []
        self.tasks = []

    async def __aenter__(self) -> Memory0:
        unix_path = None
        if self.transport == "shm":  # as the local launcher starts a role: rings beside the Unix sockets
            self.cfg.cluster.shm_ring_bytes = 256 * 1024
            self._environ[local_sockets.ENV_ON] = os.environ.get(local_sockets.ENV_ON)
            os.environ[local_sockets.ENV_ON] = "1"
            unix_path = transport_of(self.cfg).socket_path(self.run_dir, "coordinator")
        self.coordinator = Coordinator(self.cfg, self.run_dir, self.token)
        self.cfg.cluster.port = await self.coordinator.start("127.0.0.1", 0, unix_path)
        self.memory = MemoryRole(self.cfg, 0, self.run_dir, self.token, coordinator=self.coordinator)
        self.tasks = [asyncio.create_task(self.coordinator.run()), asyncio.create_task(self.memory.run())]
        async with asyncio.timeout(HANG_S):
            while self.coordinator.roles["memory-0"].address is None:
                await asyncio.sleep(0.01)
        return self

    async def __aexit__(self, *exc) -> None:
        for conn in self.conns:
            conn.abort()
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        if self.memory.server is not None:
            await self.memory.server.close()
        await self.coordinator.server.close()
        self.coordinator._metrics.close()
        for key, value in self._environ.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value

    @property
    def memory_address(self) -> tuple[str, int]:
        return self.coordinator.roles["memory-0"].address

    async def connect(self, address, name: str):
        where = {}
        if self.transport == "shm":  # the same server's rings
            servers = (self.coordinator.server, self.memory.server)
            server = next(s for s in servers if s is not None and s.port == address[1])
            assert server.ring_path is not None
            where = {"ring_path": server.ring_path}
        conn = await connect(address[0], address[1], token=self.token, name=name, **where)
        if self.transport == "shm":
            assert conn.peer.endswith(".ring")
        self.conns.append(conn)
        return conn

    async def register(self, name: str) -> tuple[object, str]:
        """Register `name` with the coordinator; returns (control connection, session)."""
        conn = await self.connect(("127.0.0.1", self.cfg.cluster.port), name)
        reply = await conn.request(
            "register",
            {"role": name, "pid": 1, "host": "test", "config_hash": self.cfg.config_hash()},
            timeout_s=HANG_S,
        )
        return conn, reply.meta["session"]

    async def running(self) -> None:
        async with asyncio.timeout(HANG_S):
            while self.coordinator.phase.name != "RUNNING":
                await asyncio.sleep(0.01)

    async def attach(self, name: str, session: str):
        """A connection to the memory host, attached as `name` (raises RemoteError when refused)."""
        conn = await self.connect(self.memory_address, name)
        await conn.request("attach", {"session": session}, timeout_s=HANG_S)
        return conn

    async def publish(self, learner0) -> int:
        """Weights of the next version (zeros of the algorithm's weights spec), published over
        learner 0's control connection `learner0`; returns the version."""
        spec = self.memory.algorithm().weights_spec()
        weights = {k: np.zeros(shape, dtype) for k, (shape, dtype) in spec.items()}
        reply = await learner0.request("publish", {"learner_steps": 0}, arrays=weights, timeout_s=HANG_S)
        return int(reply.meta["version"])

    async def until(self, predicate, what: str) -> None:
        async with asyncio.timeout(HANG_S):
            while not predicate():
                await asyncio.sleep(0.01)


def batch(rows: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Rows in random_agent's asynchronous CartPole spec."""
    rng = np.random.default_rng(seed)
    return {
        "obs": rng.standard_normal((rows, 4)).astype(np.float32),
        "action": rng.integers(0, 2, rows),
        "reward": np.ones(rows, np.float32),
        "next_obs": rng.standard_normal((rows, 4)).astype(np.float32),
        "done": np.zeros(rows, np.bool_),
        "discount": np.full(rows, 0.99, np.float32),
    }
