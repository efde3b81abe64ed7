"""Actor: steps its environments with the algorithm's policy and streams the
postprocessed batches to the memory hosts.

Env stepping and acting run one rollout of ``sample_batch_size`` steps at a
time: on the loop thread while a rollout is quick, in a worker thread otherwise
(`Offload`), so the loop keeps answering the coordinator. Batches go round-robin over all memories, each with a
per-(actor, memory) sequence number that lets memories prove nothing was lost
or duplicated. Weights are pulled when the coordinator reports a newer
version, at most one request in flight, and applied between rollouts (never
while the policy is acting in the worker thread).
"""
from __future__ import annotations

import asyncio
import time

import numpy as np

from aiorl.envs import EnvRunner
from aiorl.runtime.phase import Phase
from aiorl.runtime.role import Offload, Role
from aiorl.wire import Connection

# Waits whose liveness comes from heartbeats and connection loss, not a timer.
UNBOUNDED_S = 365 * 24 * 3600.0


class ActorRole(Role):
    kind = "actor"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.memories: list[Connection] = []
        self.sent = []  # per memory: batches, transitions
        self.batches = 0
        self.episode_returns: list[float] = []
        self.episode_lengths: list[int] = []
        self.iterations: list[dict] = []
        self._pull: asyncio.Task | None = None
        self._pending_weights = None
        self.offload = Offload()  # env stepping: inline while quick, else a worker thread
        self.counters = {"env_steps": 0}

    def heartbeat_extra(self) -> dict:
        returns, self.episode_returns = self.episode_returns, []
        lengths, self.episode_lengths = self.episode_lengths, []
        return {"episode_returns": returns, "episode_lengths": lengths}

    def metrics(self) -> dict:
        version = self.policy.weights_version if hasattr(self, "policy") else -1
        return {"weights_version": version, "weights_lag": max(0, self.weights_version_seen - version)}

    async def cleanup(self) -> None:
        if self._pull is not None:
            self._pull.cancel()
        for conn in self.memories:
            conn.abort()

    async def main(self) -> dict:
        cfg = self.cfg
        algo = self.algorithm()
        seed = cfg.run.seed + 10_000 * (self.index + 1)
        self.policy = algo.make_actor(self.index, cfg.cluster.actors, seed)
        self.runner = EnvRunner(cfg.env, cfg.env.num_envs, seed)
        for host, port in self.start_info["memories"]:
            self.memories.append(await self.attach_memory(host, port))
        self.sent = [{"batches": 0, "transitions": 0} for _ in self.memories]
        try:
            if algo.is_synchronous(cfg):
                await self._sync_loop()
            else:
                # A steady stream of batches nobody waits on: let a few share each write.
                # (A synchronous rollout is waited on, so it goes at once.)
                for conn in self.memories:
                    conn.flush_delay_s = cfg.cluster.actor_flush_delay_s
                await self._async_loop()
            batch, priorities = self.policy.flush()
            if batch:
                await self._send(batch, priorities)
            for i, conn in enumerate(self.memories):
                await conn.send("actor_done", {"actor": self.index, **self.sent[i]})
        finally:
            self.runner.close()
        return {"env_steps": self.runner.env_steps, "memories": self.sent, "batches": self.batches,
                "weights_version": self.policy.weights_version,
                "iterations": self.iterations[-1000:]}

    async def _rollout(self):
        rollout = await self.offload(self.runner.rollout, self.policy.act, self.cfg.agent.sample_batch_size)
        returns, lengths = self.runner.pop_episodes()
        self.episode_returns.extend(returns)
        self.episode_lengths.extend(lengths)
        self.counters["env_steps"] = self.runner.env_steps
        return rollout

    async def _send(self, batch: dict, priorities) -> None:
        m = self.batches % len(self.memories)
        arrays = dict(batch)
        if priorities is not None:
            arrays["priorities"] = np.asarray(priorities, np.float64)
        await self.memories[m].send("batch", {"actor": self.index, "seq": self.sent[m]["batches"]}, arrays)
        self._count_sent(m, batch)

    def _count_sent(self, m: int, batch: dict) -> None:
        """The actor's own account of what memory `m` got, checked against the memory's at the end."""
        self.sent[m]["batches"] += 1
        self.sent[m]["transitions"] += len(next(iter(batch.values())))
        self.batches += 1

    async def _async_loop(self) -> None:
        while self.phase == Phase.RUNNING:
            if self._pending_weights is not None:
                self.policy.set_weights(*self._pending_weights)
                self._pending_weights = None
            rollout = await self._rollout()
            batch, priorities = self.policy.postprocess(rollout)
            if batch:
                await self._send(batch, priorities)
            if (self.batches % self.cfg.agent.sync_interval == 0
                    and self.weights_version_seen > self.policy.weights_version
                    and (self._pull is None or self._pull.done())):
                self._pull = self.spawn(self._pull_weights(), "weights pull")

    async def _pull_weights(self) -> None:
        reply = await self._request_or_lost("get_weights", {"have": self.policy.weights_version})
        if reply.arrays:
            self._pending_weights = (dict(reply.arrays), int(reply.meta["version"]))

    async def _sync_loop(self) -> None:
        """One rollout per iteration; no iteration starts before its weights are published."""
        m = self.index % len(self.memories)
        memory = self.memories[m]
        # On-policy: even iteration 0 acts with the learner's weights (version 0).
        reply = await self.coordinator.request("get_weights", {"have": -1, "min_version": 0},
                                               timeout_s=UNBOUNDED_S)
        if reply.meta.get("stop"):
            return
        self.policy.set_weights(dict(reply.arrays), int(reply.meta["version"]))
        iteration = 0
        while self.phase == Phase.RUNNING:
            started = time.monotonic()
            rollout = await self._rollout()
            batch, _ = self.policy.postprocess(rollout)
            await memory.send("rollout", {"actor": self.index, "iteration": iteration,
                                          "weights_version": self.policy.weights_version}, batch)
            self._count_sent(m, batch)
            self.iterations.append({"iteration": iteration, "weights_version": self.policy.weights_version,
                                    "started_monotonic": started})
            reply = await self.coordinator.request(
                "barrier", {"name": "iteration", "generation": iteration}, timeout_s=UNBOUNDED_S)
            if reply.meta.get("stop"):
                break  # the run stopped while this actor waited for the others
            reply = await self.coordinator.request(
                "get_weights", {"have": self.policy.weights_version, "min_version": iteration + 1},
                timeout_s=UNBOUNDED_S)
            if reply.meta.get("stop"):
                break
            self.policy.set_weights(dict(reply.arrays), int(reply.meta["version"]))
            iteration += 1
