"""Learner: pulls batches from every memory with credits, trains, ships
priorities back to the memory each batch came from, and (learner 0) publishes
weights, checkpoints and exports the policy.

Training runs in a worker thread (torch releases the GIL), so heartbeats and
incoming batches keep flowing while a step computes. A learner holds at most
``cluster.learner_credits`` batches requested-but-unconsumed per memory: no
learner starves whatever the learner/memory counts, and memories never sample
ahead of demand.

Checkpoints (learner 0; `aiorl.checkpoint`): every ``run.checkpoint_interval_s``
seconds and/or ``run.checkpoint_every`` learner steps, at shutdown, and when
the role ends abnormally (coordinator lost, told to exit early, a second
signal, its step failed because a data-parallel peer died) if it still can;
weights holding NaN or infinities are never checkpointed. Each records the
run's counters and return window from the coordinator, so that ``--resume``
continues them. The state is serialized between two steps (training waits
that long); the file is written in the background. A resumed run's learners
all load the checkpoint it continues from.

A memory host that goes away (it may be restarted) is skipped; when the
coordinator announces its new address the learner reconnects and grants its
credits again.
"""
from __future__ import annotations

import asyncio
import threading
import time

import numpy as np

from aiorl import checkpoint
from aiorl.rundir import Identity
from aiorl.runtime.algorithm import build_algorithm, get_algorithm
from aiorl.runtime.phase import Phase, last_checkpoint_budget_s
from aiorl.runtime.role import Offload, Role
from aiorl.wire import Connection, ConnectionClosed, connect

_END = None  # a memory finished sending
_AWAY = "away"  # a memory's connection closed before its end
_WAKE = "wake"  # the phase changed


class LearnerRole(Role):
    kind = "learner"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # Checkpoints are written with torch. Importing it holds the GIL for seconds, so it
        # happens now, before heartbeats start, and not in the middle of the run (an algorithm
        # that never imports torch itself, like random_agent, would otherwise miss heartbeats).
        import torch  # noqa: F401
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
        self.core = None
        self.identity = Identity.from_env()
        self.step_base = 0  # this learner's steps before this launch (a resumed run)
        self.core_lock = threading.Lock()  # held by a step; a checkpoint never sees half a step
        self.last_checkpoint_t = time.monotonic()
        self._writing: asyncio.Task | None = None
        self._links: set[asyncio.Task] = set()  # readers of memory hosts that came back
        self.away: set[int] = set()
        self.earlier_per_memory: list[dict] = []
        self.synchronous = get_algorithm(self.cfg.algo).is_synchronous(self.cfg)

    def metrics(self) -> dict:
        return {**self.last_metrics, "wait_s": round(self.wait_s, 3), "train_s": round(self.train_s, 3),
                "queue_depth": self.queue.qsize()}

    async def cleanup(self) -> None:
        if self._publish is not None and not self._publish.done():
            self._publish.cancel()
        if self._publish is not None:
            await asyncio.gather(self._publish, return_exceptions=True)  # its error was the run's end
        for task in self._links:
            task.cancel()
        for conn in self.memories:
            if conn is not None:
                conn.abort()

    def _spawn(self, coro) -> None:
        task = asyncio.create_task(coro)
        self._links.add(task)
        task.add_done_callback(self._links.discard)

    @property
    def total_steps(self) -> int:
        """This learner's steps over the whole run, earlier launches included."""
        return self.step_base + self.counters["learner_steps"]

    def beta(self) -> float:
        a = self.cfg.agent
        if a.prioritized_replay_beta_final is None or not a.scheduled_global_steps:
            return a.prioritized_replay_beta
        frac = min(1.0, self.total_steps / a.scheduled_global_steps)
        return a.prioritized_replay_beta + frac * (a.prioritized_replay_beta_final - a.prioritized_replay_beta)

    async def main(self) -> dict:
        cfg = self.cfg
        algo = build_algorithm(cfg)
        core = await asyncio.to_thread(
            algo.make_learner, self.index, cfg.cluster.learners, cfg.run.seed + 100 * (self.index + 1),
            self.start_info.get("rendezvous"))
        if self.identity.resume_from:
            meta = await asyncio.to_thread(core.load_checkpoint, self.identity.resume_from)
            self.step_base = int(meta["learner_steps"])
            self.log.info("resumed from %s (%d learner steps)", self.identity.resume_from, self.step_base)
        self.core = core
        self.memories = [None] * len(self.start_info["memories"])
        self.per_memory = [self._memory_account() for _ in self.memories]
        for m, address in enumerate(self.start_info["memories"]):
            if address is not None:
                try:
                    self.memories[m] = await connect(address[0], address[1], token=self.token, name=self.name,
                                                     ssl=self.ssl_client)
                    continue
                except (OSError, TimeoutError) as exc:
                    self.log.warning("memory-%d at %s:%s unreachable (%s); going on without it", m, *address, exc)
            self.away.add(m)  # it may be restarting: it is announced when back
        if self.index == 0:
            await self._publish_weights()  # the first version: actors start from the learner's weights
        async with asyncio.TaskGroup() as tg:
            for m, conn in enumerate(self.memories):
                if conn is not None:
                    tg.create_task(self._reader(m, conn))
            if self.synchronous:
                await self._sync_loop()
            else:
                await self._async_loop()
        await asyncio.to_thread(self.core.finish)
        for m, conn in enumerate(self.memories):
            if conn is not None and m not in self.away:
                try:
                    await conn.send("learner_done", {"learner": self.index, **self.per_memory[m]})
                except ConnectionClosed:
                    pass
        if self.index == 0:
            await self._finish_outputs()
        await asyncio.to_thread(self.core.close)
        return {"learner_steps": self.counters["learner_steps"], "total_learner_steps": self.total_steps,
                "memories": self.per_memory, "earlier_connections": self.earlier_per_memory,
                "published": self.published, "checkpoints": self.checkpoints,
                "unused_batches": self.unused_batches}

    @staticmethod
    def _memory_account() -> dict:
        return {"batches": 0, "priority_messages": 0, "priorities": 0}

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
            if not self.synchronous and self.memories[m] is conn:
                self.log.error("memory-%d went away (%s); going on with the others", m, exc)
                self.queue.put_nowait((m, _AWAY))
                return
            self.log.error("lost memory %d: %s", m, exc)
        self.queue.put_nowait((m, _END))

    def _set_phase(self, phase: Phase) -> None:
        super()._set_phase(phase)
        if not self.synchronous:
            self.queue.put_nowait((None, _WAKE))  # a loop waiting on memories that went away re-checks

    def on_control(self, msg) -> None:
        if msg.kind != "memories" or self.synchronous:
            return super().on_control(msg)
        for m, address in enumerate(msg.meta.get("memories", [])):
            if address and m in self.away:
                self.log.info("memory-%d is back at %s:%s; reconnecting", m, *address)
                self._spawn(self._rejoin_memory(m, address))

    async def _rejoin_memory(self, m: int, address) -> None:
        try:
            conn = await connect(address[0], address[1], token=self.token, name=self.name, ssl=self.ssl_client)
        except (OSError, TimeoutError) as exc:
            self.log.error("cannot reconnect to memory-%d at %s:%s: %s", m, *address, exc)
            return
        self.earlier_per_memory.append({"memory": m, **self.per_memory[m]})
        self.per_memory[m] = self._memory_account()
        self.memories[m] = conn
        self.away.discard(m)
        self._spawn(self._reader(m, conn))
        try:
            await conn.send("credit", {"n": self.cfg.cluster.learner_credits, "beta": self.beta()})
        except ConnectionClosed:
            pass  # gone again: its reader reports it

    async def _train(self, m: int | None, batch: dict) -> bool:
        """One step on `batch`; True when the priorities sent also returned its credit."""
        if self.stopped:
            self.unused_batches += 1
            return False
        t0 = time.perf_counter()
        step = self.total_steps + 1
        try:
            result = await self.offload(self._locked_step, batch)
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

    def _locked_step(self, batch):
        with self.core_lock:
            return self.core.step(batch)

    async def _maybe_checkpoint(self) -> None:
        r = self.cfg.run
        if self.index != 0:
            return
        by_steps = r.checkpoint_every and self.total_steps % r.checkpoint_every == 0
        by_time = (r.checkpoint_interval_s is not None
                   and time.monotonic() - self.last_checkpoint_t >= r.checkpoint_interval_s)
        if by_steps or by_time:
            await self._checkpoint("periodic")

    async def _next(self):
        t0 = time.perf_counter()
        item = await self.queue.get()
        self.wait_s += time.perf_counter() - t0
        return item

    async def _async_loop(self) -> None:
        credits = self.cfg.cluster.learner_credits
        for conn in self.memories:
            if conn is not None:
                await conn.send("credit", {"n": credits, "beta": self.beta()})
        ended: set[int] = set()
        # Until every memory sent its end; one that went away counts once the run drains
        # (it is not coming back to send one).
        while len(ended | (self.away if self.phase >= Phase.DRAINING else set())) < len(self.memories):
            m, msg = await self._next()
            if msg is _WAKE:
                continue
            if msg is _AWAY:
                self.away.add(m)
                continue
            if msg is _END:
                ended.add(m)
                continue
            if m in self.away:
                continue  # a batch of a connection that closed since
            try:
                if not await self._train(m, msg.arrays):
                    await self.memories[m].send("credit", {"n": 1, "beta": self.beta()})
            except ConnectionClosed:
                pass  # that memory is gone; its reader reports it
            if (self.index == 0 and self.counters["learner_steps"] % self.cfg.agent.publish_interval == 0
                    and (self._publish is None or self._publish.done())):
                self._publish = asyncio.create_task(self._publish_weights())
        if self._publish is not None:
            await self._publish

    async def _sync_loop(self) -> None:
        """Iteration k: one aggregate from every memory, one step, publish version k+1."""
        iteration = 0
        open_memories = set(range(len(self.memories)))
        while open_memories:
            for m in open_memories:
                await self.memories[m].send("credit", {"n": 1, "iteration": iteration})
            parts = []
            waiting = set(open_memories)
            while waiting:
                m, msg = await self._next()
                if msg is _END:
                    open_memories.discard(m)
                    waiting.discard(m)
                    continue
                waiting.discard(m)
                self.per_memory[m]["batches"] += 1
                if not msg.meta.get("empty"):
                    parts.append(msg.arrays)
            if not parts or len(open_memories) < len(self.memories):
                break  # the run is draining: an incomplete iteration is not trained on
            batch = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
            await self._train(None, batch)
            if self.index == 0:
                await self._publish_weights()
            iteration += 1
        # Drain the ends of memories still open.
        while open_memories:
            m, msg = await self._next()
            if msg is _END:
                open_memories.discard(m)

    async def _publish_weights(self) -> None:
        weights = self.core.get_weights()
        reply = await self._request_or_lost("publish", {"learner_steps": self.counters["learner_steps"]},
                                            arrays=weights)
        self.published += 1
        self.log.debug("published weights version %s", reply.meta.get("version"))

    async def _run_state(self) -> dict:
        """The run's counters and return window, to record in a checkpoint."""
        try:
            reply = await self.coordinator.request("run_state", {"counters": dict(self.counters)},
                                                   timeout_s=self.cfg.cluster.coordinator_timeout_s)
            return dict(reply.meta)
        except Exception as exc:  # the coordinator is gone: the last counters a heartbeat brought
            self.log.warning("checkpoint without the coordinator's run state (%r); using the last heartbeat's", exc)
            return dict(self.run_counters)

    async def _checkpoint(self, reason: str, coordinator: bool = True) -> None:
        """Serialize the core between steps (training waits), write the file in the background."""
        self.last_checkpoint_t = time.monotonic()
        if self._writing is not None:
            await self._writing  # one file at a time
        run_state = await self._run_state() if coordinator else dict(self.run_counters)
        lock_timeout_s = self.cfg.cluster.phase_timeout_s

        def serialize():
            # Bounded: a step stuck in a collective with a dead peer must not hold up the exit.
            if not self.core_lock.acquire(timeout=lock_timeout_s):
                raise TimeoutError(f"a learner step held the core for over {lock_timeout_s:g} s")
            try:
                state = self.core.state_dict()
                return None if state is None else checkpoint.serialize(state)
            finally:
                self.core_lock.release()

        try:
            payload = await asyncio.to_thread(serialize)
        except checkpoint.CheckpointError as exc:
            self.log.error("checkpoint at learner step %d (%s): %s", self.total_steps, reason, exc)
            return
        if payload is None:
            return
        meta = self.identity.stamp({"reason": reason, "run": run_state, "algo": self.cfg.algo,
                                    "config_hash": self.cfg.config_hash(), "time": time.time()})
        steps, keep, directory = self.total_steps, self.cfg.run.keep_checkpoints, self.run_dir / "checkpoints"

        async def write():
            try:
                path = await asyncio.to_thread(checkpoint.write_file, directory, steps, payload, meta, keep)
            except OSError as exc:  # a full disk costs this checkpoint, not the run
                self.log.error("checkpoint at learner step %d not written: %s", steps, exc)
                return
            self.checkpoints.append(str(path))
            self.log.info("checkpoint %s (%s)", path.name, reason)

        self._writing = asyncio.create_task(write())

    async def _checkpoint_written(self) -> None:
        if self._writing is not None:
            await self._writing

    async def on_abnormal_end(self, why: str) -> None:
        if self.index != 0 or self.core is None:
            return
        try:
            # Bounded: once the coordinator is gone, a launcher gives roles this long beyond the
            # coordinator timeout.
            async with asyncio.timeout(last_checkpoint_budget_s(self.cfg.cluster)):
                # A step still running in its thread holds the lock: the checkpoint waits for it.
                await self._checkpoint(f"abnormal end: {why}", coordinator=False)
                await self._checkpoint_written()
        except Exception as exc:
            self.log.error("could not write a checkpoint at the abnormal end (%r)", exc)

    async def _finish_outputs(self) -> None:
        await self._publish_weights()
        await self._checkpoint("final")
        await self._checkpoint_written()
        directory = self.run_dir / "policy"
        directory.mkdir(parents=True, exist_ok=True)
        path = await asyncio.to_thread(self.core.export_policy, str(directory))
        if path:
            self.log.info("exported policy to %s", path)
