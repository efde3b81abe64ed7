"""Learner: pulls batches from every memory with credits, trains, ships
priorities back to the memory each batch came from, and (learner 0) publishes
weights, checkpoints and exports the policy.

Training runs in a worker thread (torch releases the GIL), so heartbeats and
incoming batches keep flowing while a step computes. A learner holds at most
``cluster.learner_credits`` batches requested-but-unconsumed per memory: no
learner starves whatever the learner/memory counts, and memories never sample
ahead of demand.
"""
from __future__ import annotations

import asyncio
import hashlib
import time

import numpy as np

from aiorl.runtime.algorithm import build_algorithm
from aiorl.runtime.fragments import LagMeter
from aiorl.runtime.role import Offload, Role
from aiorl.wire import Connection, ConnectionClosed, connect

_END = None


def weights_digest(weights: dict[str, np.ndarray]) -> str:
    """A short hash of named arrays: equal digests, equal weights (bit for bit)."""
    h = hashlib.sha256()
    for name in sorted(weights):
        h.update(name.encode())
        h.update(np.ascontiguousarray(weights[name]).tobytes())
    return h.hexdigest()[:16]


class LearnerRole(Role):
    kind = "learner"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.memories: list[Connection] = []
        self.queue: asyncio.Queue = asyncio.Queue()  # bounded by the credits granted
        self.per_memory: list[dict] = []
        self.counters = {"learner_steps": 0}
        self.last_metrics: dict = {}
        self.wait_s = 0.0
        self.train_s = 0.0
        self._publish: asyncio.Task | None = None
        self.published = 0
        self.checkpoints: list[str] = []
        self.stopped = False  # a data-parallel peer ran out of data: no more steps
        # Inline while steps are quick, never with data-parallel peers: a collective
        # may wait on a slow peer for long, and the loop must keep heartbeating.
        self.offload = Offload(allowed=self.cfg.cluster.learners == 1)
        self.unused_batches = 0
        self.iterations: list[dict] = []  # synchronous algorithms: one entry per iteration trained
        self.published_version = -1  # learner 0: the newest version it published
        self.lag = LagMeter()  # fragments (IMPALA): policy lag of each batch

    def metrics(self) -> dict:
        return {**self.last_metrics, "wait_s": round(self.wait_s, 3), "train_s": round(self.train_s, 3),
                "queue_depth": self.queue.qsize()}

    async def cleanup(self) -> None:
        for conn in self.memories:
            conn.abort()

    def beta(self) -> float:
        a = self.cfg.agent
        if a.prioritized_replay_beta_final is None or not a.scheduled_global_steps:
            return a.prioritized_replay_beta
        frac = min(1.0, self.counters["learner_steps"] / a.scheduled_global_steps)
        return a.prioritized_replay_beta + frac * (a.prioritized_replay_beta_final - a.prioritized_replay_beta)

    async def main(self) -> dict:
        cfg = self.cfg
        algo = build_algorithm(cfg)
        self.core = await asyncio.to_thread(
            algo.make_learner, self.index, cfg.cluster.learners, cfg.run.seed + 100 * (self.index + 1),
            self.start_info.get("rendezvous"))
        for host, port in self.start_info["memories"]:
            self.memories.append(await connect(host, port, token=self.token, name=self.name, ssl=self.ssl_client))
        self.per_memory = [{"batches": 0, "priority_messages": 0, "priorities": 0} for _ in self.memories]
        if self.index == 0:
            await self._publish_weights()  # version 0: actors start from the learner's weights
        async with asyncio.TaskGroup() as tg:
            for m, conn in enumerate(self.memories):
                tg.create_task(self._reader(m, conn))
            if algo.is_synchronous(cfg):
                await self._sync_loop()
            else:
                await self._async_loop()
        await asyncio.to_thread(self.core.finish)
        for m, conn in enumerate(self.memories):
            await conn.send("learner_done", {"learner": self.index, **self.per_memory[m]})
        if self.index == 0:
            await self._finish_outputs()
        digest = weights_digest(self.core.get_weights())  # data-parallel learners end equal
        await asyncio.to_thread(self.core.close)
        return {"learner_steps": self.counters["learner_steps"], "memories": self.per_memory,
                "weights_digest": digest,
                "published": self.published, "checkpoints": self.checkpoints,
                "unused_batches": self.unused_batches, "iterations": self.iterations,
                "policy_lag": self.lag.stats() if self.lag.batches else None}

    async def _reader(self, m: int, conn: Connection) -> None:
        try:
            async for msg in conn:
                if msg.kind == "samples":
                    self.queue.put_nowait((m, msg))
                elif msg.kind == "end":
                    break
                else:
                    self.log.warning("ignored %r from memory %d", msg.kind, m)
        except ConnectionClosed as exc:
            self.log.error("lost memory %d: %s", m, exc)
        self.queue.put_nowait((m, _END))

    async def _train(self, m: int | None, batch: dict) -> bool:
        """One step on `batch`; True when the priorities sent also returned its credit."""
        if self.stopped:
            self.unused_batches += 1
            return False
        t0 = time.perf_counter()
        step = self.counters["learner_steps"] + 1
        if "weights_version" in batch:  # whole fragments, each acted with one version
            self.lag.add(self.weights_version(), batch["weights_version"])
        try:
            result = await self.offload(self.core.step, batch)
        except Exception as exc:
            source = f"memory-{m}" if m is not None else "every memory (synchronous aggregate)"
            raise RuntimeError(f"learner step {step} on a batch from {source}: {exc}") from exc
        self.train_s += time.perf_counter() - t0
        if result.stop:
            self.stopped = True
            self.unused_batches += 1
            self.log.info("a data-parallel peer ran out of data; stopping after %d steps", step - 1)
            return False
        self.counters["learner_steps"] += 1
        self.last_metrics = {k: float(v) for k, v in result.metrics.items()}
        if self.lag.batches:
            self.last_metrics.update(self.lag.metrics())
        credited = False
        if m is not None:
            self.per_memory[m]["batches"] += 1
            if result.priorities is not None and "generations" in batch:
                # The batch's credit rides on its priorities: one message instead of two.
                await self.memories[m].send("priorities", {"credit": 1, "beta": self.beta()}, {
                    "indices": batch["indices"], "generations": batch["generations"],
                    "priorities": np.asarray(result.priorities, np.float64)})
                self.per_memory[m]["priority_messages"] += 1
                self.per_memory[m]["priorities"] += len(batch["indices"])
                credited = True
        await self._maybe_checkpoint()
        return credited

    async def _maybe_checkpoint(self) -> None:
        every = self.cfg.run.checkpoint_every
        if self.index == 0 and every and self.counters["learner_steps"] % every == 0:
            await self._checkpoint()

    async def _next(self):
        t0 = time.perf_counter()
        item = await self.queue.get()
        self.wait_s += time.perf_counter() - t0
        return item

    def weights_version(self) -> int:
        """The newest weights version this learner's weights are at least as new as."""
        return max(self.published_version, self.weights_version_seen)

    async def _async_loop(self) -> None:
        credits = self.cfg.cluster.learner_credits
        for conn in self.memories:
            await conn.send("credit", {"n": credits, "beta": self.beta(), "version": self.weights_version()})
        ended = 0
        while ended < len(self.memories):
            m, msg = await self._next()
            if msg is _END:
                ended += 1
                continue
            try:
                if not await self._train(m, msg.arrays):
                    await self.memories[m].send("credit", {"n": 1, "beta": self.beta(),
                                                           "version": self.weights_version()})
            except ConnectionClosed:
                pass  # that memory is gone; its reader reports it
            if (self.index == 0 and self.counters["learner_steps"] % self.cfg.agent.publish_interval == 0
                    and (self._publish is None or self._publish.done())):
                self._publish = asyncio.create_task(self._publish_weights())
        if self._publish is not None:
            await self._publish

    async def _sync_loop(self) -> None:
        """Iteration k: this learner's share of round k from every memory, one step, and
        learner 0 publishes version k+1 (what the actors wait for).

        The end of a run: a memory answers ``end`` for an iteration it will never
        have. Such an iteration is discarded whole, never trained on a fraction
        of the memories; every learner sees the same answers, so data-parallel
        learners stop at the same iteration.
        """
        iteration = 0
        open_memories = set(range(len(self.memories)))
        while True:
            for m in open_memories:
                try:
                    await self.memories[m].send("credit", {"n": 1, "iteration": iteration})
                except ConnectionClosed:
                    pass  # its reader reports the loss and ends it
            parts, versions, ended = [], [], []
            waiting = set(open_memories)
            while waiting:
                m, msg = await self._next()
                waiting.discard(m)
                if msg is _END:
                    open_memories.discard(m)
                    ended.append(m)
                    continue
                if int(msg.meta.get("iteration", -1)) != iteration:
                    raise RuntimeError(f"memory-{m} sent iteration {msg.meta.get('iteration')} "
                                       f"for iteration {iteration}")
                self.per_memory[m]["batches"] += 1
                if msg.meta.get("versions"):
                    versions.extend(msg.meta["versions"])
                if not msg.meta.get("empty"):
                    parts.append(msg.arrays)
            if ended:
                if parts:
                    self.log.info("iteration %d is incomplete at the end of the run (memory %s ended): "
                                  "%d rows discarded", iteration, ", ".join(map(str, sorted(ended))),
                                  sum(len(next(iter(p.values()))) for p in parts))
                break
            if not parts:
                self.log.info("iteration %d: no actor delivered a rollout; waiting for the end", iteration)
                break
            batch = parts[0] if len(parts) == 1 else {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
            rows = len(next(iter(batch.values())))
            lag = iteration - min(versions) if versions else None
            await self._train(None, batch)
            if self.stopped:
                break
            if self.index == 0:
                await self._publish_weights()
            self.last_metrics["policy_lag"] = float(lag) if lag is not None else -1.0
            self.iterations.append({"iteration": iteration, "rows": rows,
                                    "versions": [min(versions), max(versions)] if versions else None,
                                    "policy_lag": lag,
                                    "weights_digest": weights_digest(self.core.get_weights())})
            del self.iterations[:-1000]
            self.log.info("iteration %d: %d rows, policy lag %s", iteration, rows, lag)
            iteration += 1
        # Drain the ends of memories still open.
        while open_memories:
            m, msg = await self._next()
            if msg is _END:
                open_memories.discard(m)
            else:
                self.unused_batches += 1

    async def _publish_weights(self) -> None:
        weights = self.core.get_weights()
        reply = await self._request_or_lost("publish", {"learner_steps": self.counters["learner_steps"]},
                                            arrays=weights)
        self.published += 1
        self.published_version = int(reply.meta.get("version", self.published_version))
        self.log.debug("published weights version %s", reply.meta.get("version"))

    async def _checkpoint(self) -> None:
        directory = self.run_dir / "checkpoints"
        directory.mkdir(parents=True, exist_ok=True)
        path = await asyncio.to_thread(self.core.save_checkpoint, str(directory), dict(self.counters))
        if path:
            self.checkpoints.append(str(path))

    async def _finish_outputs(self) -> None:
        await self._publish_weights()
        await self._checkpoint()
        directory = self.run_dir / "policy"
        directory.mkdir(parents=True, exist_ok=True)
        path = await asyncio.to_thread(self.core.export_policy, str(directory))
        if path:
            self.log.info("exported policy to %s", path)
