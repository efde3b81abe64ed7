"""Actor: steps its environments with the algorithm's policy and streams the
postprocessed batches to the memory hosts.

Env stepping and acting run one rollout of ``sample_batch_size`` steps at a
time: on the loop thread while a rollout is quick, in a worker thread otherwise
(`Offload`), so the loop keeps answering the coordinator. Batches go round-robin over all memories, each with a
per-(actor, memory) sequence number that lets memories prove nothing was lost
or duplicated. Weights are pulled when the coordinator reports a newer
version, at most one request in flight, and applied between rollouts (never
while the policy is acting in the worker thread).

Synchronous algorithms run in lockstep instead: one rollout per iteration,
then the barrier and the weights of the next version (`_sync_loop`); or work
items taken from the coordinator one at a time (`_work_loop`, ES). IMPALA's
actors send one fragment per env against a memory's credit and never wait
for the learner (`_fragment_loop`, `aiorl.runtime.fragments`).

Every loop measures its actor's idle time: the seconds spent waiting
(credits, writes, barriers, weights) over the loop's wall time.
"""
from __future__ import annotations

import asyncio
import time

import numpy as np

from aiorl.envs import EnvRunner
from aiorl.replay.frame_sender import FrameSender
from aiorl.replay.frames import frame_layout
from aiorl.runtime.algorithm import build_algorithm
from aiorl.runtime.fragments import ActorCredits
from aiorl.runtime.phase import Phase
from aiorl.runtime.role import Offload, Role
from aiorl.wire import Connection, connect

# Waits whose liveness comes from heartbeats and connection loss, not a timer.
UNBOUNDED_S = 365 * 24 * 3600.0


class IdleClock:
    """Seconds an actor waits (``with clock:`` around each wait) over its loop's wall time."""

    def __init__(self):
        self.idle_s = 0.0
        self.started: float | None = None
        self.ended: float | None = None
        self._t0: float | None = None  # start of the wait in progress

    def start(self) -> None:
        self.started = time.monotonic()

    def stop(self) -> None:
        if self.started is not None and self.ended is None:
            self.ended = time.monotonic()

    def __enter__(self):
        self._t0 = time.monotonic()

    def __exit__(self, *exc) -> None:
        self.idle_s += time.monotonic() - self._t0
        self._t0 = None

    @property
    def wall_s(self) -> float:
        if self.started is None:
            return 0.0
        return (self.ended or time.monotonic()) - self.started

    def fraction(self) -> float | None:
        """Counting the wait in progress: an actor held back for minutes reports it while it waits."""
        wall = self.wall_s
        waiting = time.monotonic() - self._t0 if self._t0 is not None and self.ended is None else 0.0
        return round(min(1.0, (self.idle_s + waiting) / wall), 6) if wall > 0 else None


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
        self.frames: FrameSender | None = None
        self.payload_bytes = 0  # array bytes of the batches sent (frame layout: frames once)
        self.idle = IdleClock()

    def heartbeat_extra(self) -> dict:
        returns, self.episode_returns = self.episode_returns, []
        lengths, self.episode_lengths = self.episode_lengths, []
        return {"episode_returns": returns, "episode_lengths": lengths}

    def metrics(self) -> dict:
        version = self.policy.weights_version if hasattr(self, "policy") else -1
        return {"weights_version": version, "weights_lag": max(0, self.weights_version_seen - version),
                "idle_fraction": self.idle.fraction()}

    async def cleanup(self) -> None:
        if self._pull is not None:
            self._pull.cancel()
        for conn in self.memories:
            conn.abort()

    async def main(self) -> dict:
        cfg = self.cfg
        algo = build_algorithm(cfg)
        seed = cfg.run.seed + 10_000 * (self.index + 1)
        self.policy = algo.make_actor(self.index, cfg.cluster.actors, seed)
        layout = frame_layout(cfg, algo)
        if layout is not None:
            # Observations travel as frame ids; the policy still sees stacks where it needs them.
            self.frames = FrameSender(layout, cfg.env.num_envs, len(self.start_info["memories"]),
                                      algo.lookback_steps(), cfg.cluster.frame_compression)
            self.policy.decode_observations = self.frames.decode
        work = algo.is_synchronous(cfg) and algo.work_items(cfg) is not None
        # work items: the policy steps its own envs
        self.runner = None if work else EnvRunner(cfg.env, cfg.env.num_envs, seed, frames=self.frames)
        for host, port in self.start_info["memories"]:
            self.memories.append(await connect(host, port, token=self.token, name=self.name, ssl=self.ssl_client))
        self.sent = [{"batches": 0, "transitions": 0} for _ in self.memories]
        try:
            if work:
                await self._work_loop()
            elif algo.is_synchronous(cfg):
                await self._sync_loop()
            elif algo.fragment_queue(cfg) is not None:
                await self._fragment_loop()
            else:
                # A steady stream of batches nobody waits on: let a few share each write.
                # (A synchronous rollout is waited on, so it goes at once.)
                for conn in self.memories:
                    conn.flush_delay_s = cfg.cluster.actor_flush_delay_s
                await self._async_loop()
            batch, priorities = self.policy.flush()
            if batch:
                await self._send(batch, priorities)
            self.idle.stop()
            for i, conn in enumerate(self.memories):
                await conn.send("actor_done", {"actor": self.index, **self.sent[i]})
        finally:
            if self.runner is not None:
                self.runner.close()
        return {"env_steps": self.counters["env_steps"], "memories": self.sent, "batches": self.batches,
                "payload_bytes": self.payload_bytes,
                "frames_sent": self.frames.frames_sent if self.frames is not None else None,
                "weights_version": self.policy.weights_version,
                "idle_s": round(self.idle.idle_s, 3), "loop_s": round(self.idle.wall_s, 3),
                "idle_fraction": self.idle.fraction(),
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
        meta = {"actor": self.index, "seq": self.sent[m]["batches"]}
        if self.frames is not None:
            arrays, meta["keep_from"] = self.frames.message(m, batch)
        else:
            arrays = dict(batch)
        if priorities is not None:
            arrays["priorities"] = np.asarray(priorities, np.float64)
        self.payload_bytes += sum(a.nbytes for a in arrays.values())
        with self.idle:
            await self.memories[m].send("batch", meta, arrays)
        self._count_sent(m, batch)

    def _count_sent(self, m: int, batch: dict, transitions: int | None = None) -> None:
        """The actor's own account of what memory `m` got, checked against the memory's at the end."""
        self.sent[m]["batches"] += 1
        self.sent[m]["transitions"] += len(next(iter(batch.values()))) if transitions is None else transitions
        self.batches += 1

    async def _async_loop(self) -> None:
        self.idle.start()
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
                self._pull = asyncio.create_task(self._pull_weights())

    async def _pull_weights(self) -> None:
        reply = await self._request_or_lost("get_weights", {"have": self.policy.weights_version})
        if reply.arrays:
            self._pending_weights = (dict(reply.arrays), int(reply.meta["version"]))

    async def _fragment_loop(self) -> None:
        """Roll out, then send one fragment per env to a memory that gave a credit; weights are
        pulled every `sync_interval` messages (one pull in flight) and applied between rollouts,
        so each message is acted with one version."""
        # Acting with the learner's weights from the first fragment on (version 0).
        reply = await self.coordinator.request("get_weights", {"have": -1, "min_version": 0},
                                               timeout_s=UNBOUNDED_S)
        if reply.meta.get("stop"):
            return
        self.policy.set_weights(dict(reply.arrays), int(reply.meta["version"]))
        credits = ActorCredits(len(self.memories))
        steps = self.cfg.agent.sample_batch_size * self.cfg.env.num_envs
        async with asyncio.TaskGroup() as tg:
            readers = [tg.create_task(credits.read(m, conn)) for m, conn in enumerate(self.memories)]
            self.idle.start()
            try:
                while self.phase == Phase.RUNNING:
                    if self._pending_weights is not None:
                        self.policy.set_weights(*self._pending_weights)
                        self._pending_weights = None
                    fragments, _ = self.policy.postprocess(await self._rollout())
                    with self.idle:
                        m = await credits.acquire()
                    meta = {"seq": self.sent[m]["batches"], "weights_version": self.policy.weights_version}
                    arrays = fragments
                    if self.frames is not None:
                        arrays, meta["keep_from"] = self.frames.message(m, fragments)
                    self.payload_bytes += sum(a.nbytes for a in arrays.values())
                    with self.idle:
                        await self.memories[m].send("fragment", meta, arrays)
                    self._count_sent(m, fragments, steps)
                    if (self.batches % self.cfg.agent.sync_interval == 0
                            and (self._pull is None or self._pull.done())):
                        self._pull = asyncio.create_task(self._pull_weights())
            finally:
                for reader in readers:
                    reader.cancel()

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
        self.idle.start()
        while self.phase == Phase.RUNNING:
            started = time.monotonic()
            rollout = await self._rollout()
            batch, _ = self.policy.postprocess(rollout)
            with self.idle:
                await memory.send("rollout", {"actor": self.index, "iteration": iteration,
                                              "weights_version": self.policy.weights_version}, batch)
            self._count_sent(m, batch)
            self.iterations.append({"iteration": iteration, "weights_version": self.policy.weights_version,
                                    "started_monotonic": started})
            with self.idle:
                reply = await self.coordinator.request(
                    "barrier", {"name": "iteration", "generation": iteration}, timeout_s=UNBOUNDED_S)
            if reply.meta.get("stop"):
                break  # the run stopped while this actor waited for the others
            with self.idle:
                reply = await self.coordinator.request(
                    "get_weights", {"have": self.policy.weights_version, "min_version": iteration + 1},
                    timeout_s=UNBOUNDED_S)
            if reply.meta.get("stop"):
                break
            self.policy.set_weights(dict(reply.arrays), int(reply.meta["version"]))
            iteration += 1

    async def _work_loop(self) -> None:
        """Take work items from the coordinator until the run stops; the result of item i
        goes to memory i % memories. Each request reports the previous item done."""
        done = None
        self.idle.start()
        while self.phase == Phase.RUNNING:
            with self.idle:
                reply = await self.coordinator.request("work", {"done": done}, timeout_s=UNBOUNDED_S)
            if reply.meta.get("stop"):
                break
            iteration, item = int(reply.meta["iteration"]), int(reply.meta["item"])
            done = [iteration, item]
            if self.policy.weights_version < iteration:
                with self.idle:
                    reply = await self.coordinator.request(
                        "get_weights", {"have": self.policy.weights_version, "min_version": iteration},
                        timeout_s=UNBOUNDED_S)
                if reply.meta.get("stop"):
                    break
                self.policy.set_weights(dict(reply.arrays), int(reply.meta["version"]))
            if self.policy.weights_version != iteration:
                continue  # that iteration ended while this actor was away: the item is not wanted
            started = time.monotonic()
            result = await self.offload(self.policy.run_work, iteration, item)
            self.counters["env_steps"] += result.env_steps
            self.episode_returns.extend(result.episode_returns)
            self.episode_lengths.extend(result.episode_lengths)
            m = item % len(self.memories)
            with self.idle:
                await self.memories[m].send("rollout", {"actor": self.index, "iteration": iteration, "item": item,
                                                        "weights_version": self.policy.weights_version},
                                            result.batch)
            self._count_sent(m, result.batch)
            self.iterations.append({"iteration": iteration, "item": item,
                                    "weights_version": self.policy.weights_version,
                                    "started_monotonic": started})
            del self.iterations[:-1000]
