"""Learner: pulls batches from every memory with credits, trains, ships
priorities back to the memory each batch came from, and (learner 0) publishes
weights; learner 0's checkpoints, evaluations and exported policy are a part it
owns and calls at named moments (`aiorl.runtime.learner_outputs`).

Training runs in a worker thread (torch releases the GIL), so heartbeats and
incoming batches keep flowing while a step computes. A learner holds at most
``cluster.learner_credits`` batches requested-but-unconsumed per memory: no
learner starves whatever the learner/memory counts, and memories never sample
ahead of demand.

Weights are copied between two steps (never while a step runs in the worker
thread, which would tear them across two parameter versions) and published
from that copy. A memory connection that ends before the memory's ``end``
message fails a synchronous learner (it would otherwise wait for its rounds
forever); an asynchronous one goes on with the other memories (below).

A memory host that goes away (it may be restarted) is skipped; when the
coordinator announces its new address the learner reconnects and grants its
credits again.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import threading
import time

import numpy as np

from aiorl.core.ratelog import RateLimitedLog
from aiorl.io.rundir import Identity
from aiorl.runtime import rendezvous
from aiorl.runtime.algorithm import PeerNotFinite
from aiorl.runtime.coordinator.counters import BUDGET_REACHED
from aiorl.runtime.dataset_source import epoch_steps
from aiorl.runtime.fragments import LagMeter
from aiorl.runtime.learner_outputs import LearnerAccess, LearnerOutputs
from aiorl.runtime.phase import Phase
from aiorl.runtime.role import Offload, Role
from aiorl.wire import Connection, ConnectionClosed
from aiorl.wire.names import safe_text

_END = None  # a memory finished sending
_AWAY = "away"  # a memory's connection closed before its end
_WAKE = "wake"  # the phase changed


def holds_non_finite(batch: dict) -> bool:
    """Does a float array of `batch` hold a NaN or an infinity?"""
    return any(v.dtype.kind == "f" and v.size and not np.isfinite(v).all() for v in batch.values())


def _source(m: int | None) -> str:
    """Where a batch came from, for a message (only on the error paths: not every step)."""
    return f"memory-{m}" if m is not None else "every memory (synchronous aggregate)"


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
        self.stopped = False  # a data-parallel peer ran out of data: no more steps
        # Inline while steps are quick, never with data-parallel peers: a collective
        # may wait on a slow peer for long, and the loop must keep heartbeating.
        self.offload = Offload(allowed=self.cfg.cluster.learners == 1)
        self.unused_batches = 0
        self.batches_dropped = 0  # not applied: non-finite values in this batch (or a peer's) made the loss so
        self._log_dropped = RateLimitedLog(self.log, logging.WARNING, burst=10, per_s=0.5)
        self.batches_queued = 0
        self.queue_depth_max = 0  # batches received and not yet trained on, worst case
        self.iterations: list[dict] = []  # synchronous algorithms: one entry per iteration trained
        self.published_version = -1  # learner 0: the newest version it published
        self.lag = LagMeter()  # fragments (IMPALA): policy lag of each batch
        self.last_beta: float | None = None
        self.core = None
        self.step_base = 0  # this learner's steps before this launch (a resumed run)
        self.core_lock = threading.Lock()  # held by a step; a checkpoint never sees half a step
        self._links: set[asyncio.Task] = set()  # readers of memory hosts that came back
        self.away: set[int] = set()
        self.earlier_per_memory: list[dict] = []
        self.synchronous = self.cfg.algorithm.is_synchronous(self.cfg)
        access = LearnerAccess(
            lock=self.core_lock,
            core=lambda: self.core,
            launch_steps=lambda: self.counters["learner_steps"],
            run_counters=lambda: self.run_counters,
            run_state=lambda t: self.coordinator.request("run_state", {"counters": dict(self.counters)}, timeout_s=t),
            publish=self._publish_weights,
            spawn=self.spawn,
        )
        self.outputs = LearnerOutputs(self.cfg, self.run_dir, self.index, Identity.from_env(), self.log, access)

    def register_extra(self) -> dict:
        self.outputs.start()
        c = self.cfg.cluster
        if self.index != 0 or c.learners < 2:
            return {}
        # Bound now and kept open for the TCPStore: see aiorl.runtime.rendezvous.
        host = c.advertise_host or self.coordinator_address()[0]
        return {"rendezvous": rendezvous.listen(host, c.rendezvous_port)}

    def metrics(self) -> dict:
        return {
            **self.last_metrics,
            "wait_s": round(self.wait_s, 3),
            "train_s": round(self.train_s, 3),
            "queue_depth": self.queue.qsize(),
            "batches_dropped": self.batches_dropped,
        }

    def heartbeat_extra(self) -> dict:
        return self.outputs.heartbeat()

    def heartbeat_answered(self, meta: dict) -> None:
        self.outputs.reported(meta.get("evaluation"))

    async def on_abnormal_end(self, why: str) -> None:
        await self.outputs.abnormal_end(why)

    async def cleanup(self) -> None:
        self.outputs.interrupt()  # an evaluation in flight ends at its next env step
        if self._publish is not None:
            self._publish.cancel()  # nothing to a task done
            await asyncio.gather(self._publish, return_exceptions=True)  # its error was the run's end
        for task in self._links:
            task.cancel()
        for conn in self.memories:
            if conn is not None:
                conn.abort()
        await self.outputs.close()

    def _spawn(self, coro, name: str) -> None:
        task = self.spawn(coro, name)  # one that raises fails the learner, loudly
        self._links.add(task)
        task.add_done_callback(self._links.discard)

    @property
    def total_steps(self) -> int:
        """This learner's steps over the whole run, earlier launches included."""
        return self.step_base + self.counters["learner_steps"]

    @property
    def budget_share(self) -> int | None:
        """This learner's share of ``scheduled_global_steps`` (None: no such budget). Data-parallel
        learners step together, so each stops at the same step (one waiting for another that
        stopped would hang); their sum is the budget rounded up to a multiple of the learners."""
        budget = self.cfg.agent.scheduled_global_steps
        epochs = epoch_steps(self.cfg)
        if epochs is not None:
            budget = epochs if budget is None else min(budget, epochs)
        return None if budget is None else -(-budget // self.cfg.cluster.learners)

    @property
    def budget_reached(self) -> bool:
        """This learner's share of the budget is done: it takes no more steps, so the run stops at
        its budget, not a heartbeat of steps past it."""
        return self.budget_share is not None and self.total_steps >= self.budget_share

    def note_budget(self) -> bool:
        """Whether this learner's share of the budget is done; if so its counters say it
        (`BUDGET_REACHED`): the coordinator ends the run once every learner's do, whatever its
        totals, which wait for no steps that can no longer come."""
        if not self.budget_reached:
            return False
        self.counters[BUDGET_REACHED] = 1
        return True

    def beta(self) -> float:
        """PER's beta, annealed linearly to ``prioritized_replay_beta_final`` over the run's schedule."""
        a = self.cfg.agent
        if a.prioritized_replay_beta_final is None:
            return a.prioritized_replay_beta
        frac = self.schedule_progress()
        self.last_beta = a.prioritized_replay_beta + frac * (
            a.prioritized_replay_beta_final - a.prioritized_replay_beta
        )
        return self.last_beta

    def schedule_progress(self) -> float:
        """How far the run is toward the stop criterion that ends it, in [0, 1].

        The larger of the run's learner steps over ``scheduled_global_steps``
        (the sum over every learner: what the coordinator stops on) and its env
        steps over ``scheduled_timesteps``. Learner steps: this learner's over
        its share of the budget, where it stops (data-parallel learners step
        together); env steps: the run's totals, which come with each heartbeat reply.
        """
        a = self.cfg.agent
        totals = self.run_counters
        frac = 0.0
        if a.scheduled_global_steps:
            # Data-parallel learners step together, each to its share of the budget (`budget_reached`).
            frac = self.total_steps / self.budget_share
        if a.scheduled_timesteps:
            frac = max(frac, totals.get("env_steps", 0) / a.scheduled_timesteps)
        return min(1.0, frac)

    async def main(self) -> dict:
        cfg = self.cfg
        algo = self.algorithm()
        core = await asyncio.to_thread(
            algo.make_learner,
            self.index,
            cfg.cluster.learners,
            cfg.run.seed + 100 * (self.index + 1),
            self.start_info.get("rendezvous"),
        )
        self.step_base = await self.outputs.resume(core)
        self.core = core
        self.memories = [None] * len(self.start_info["memories"])
        self.per_memory = [self._memory_account() for _ in self.memories]
        for m, address in enumerate(self.start_info["memories"]):
            if address is not None:
                try:
                    self.memories[m] = await self.attach_memory(address)
                    continue
                except (OSError, TimeoutError) as exc:
                    self.log.warning("memory-%d at %s:%s unreachable (%s); going on without it", m, *address[:2], exc)
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
        await self.outputs.finish(signalled=self._signals > 0)
        digest = weights_digest(self.core.get_weights())  # data-parallel learners end equal
        await asyncio.to_thread(self.core.close)
        outputs = self.outputs.summary()
        return {
            "learner_steps": self.counters["learner_steps"],
            "total_learner_steps": self.total_steps,
            "memories": self.per_memory,
            "earlier_connections": self.earlier_per_memory,
            "published": self.published,
            "checkpoints": outputs["checkpoints"],
            "unused_batches": self.unused_batches,
            "batches_dropped": self.batches_dropped,
            "iterations": self.iterations,
            "prioritized_replay_beta_last": self.last_beta,
            "queue_depth_max": self.queue_depth_max,
            "weights_digest": digest,
            "policy_lag": self.lag.stats() if self.lag.batches else None,
            "evaluation": outputs["evaluation"],
        }

    @staticmethod
    def _memory_account() -> dict:
        return {"batches": 0, "priority_messages": 0, "priorities": 0}

    async def _reader(self, m: int, conn: Connection) -> None:
        """Batches of memory `m` into the queue, then its end; a memory that goes away first
        fails a synchronous learner, and is skipped by an asynchronous one (it may come back)."""
        lost = None
        try:
            async for msg in conn:
                if msg.kind == "samples":
                    self.queue.put_nowait((m, msg))
                    self.batches_queued += 1  # the queue also carries phase wake-ups and ends
                    self.queue_depth_max = max(self.queue_depth_max, self.batches_queued)
                elif msg.kind == "end":
                    break
                else:
                    raise RuntimeError(f"memory {m} sent an unexpected {safe_text(msg.kind, 40)!r} message")
            else:
                lost = "the connection closed before its end message"
        except ConnectionClosed as exc:
            lost = str(exc)
        if lost is not None:
            if not self.synchronous and self.memories[m] is conn:
                self.log.error("memory-%d went away (%s); going on with the others", m, lost)
                self.queue.put_nowait((m, _AWAY))
                return
            raise RuntimeError(f"lost memory {m} before its end message: {lost}")
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
                self.log.info("memory-%d is back at %s:%s; reconnecting", m, *address[:2])
                self._spawn(self._rejoin_memory(m, address), f"reconnect to memory-{m}")

    async def _rejoin_memory(self, m: int, address) -> None:
        try:
            conn = await self.attach_memory(address)
        except (OSError, TimeoutError) as exc:
            self.log.error("cannot reconnect to memory-%d at %s:%s: %s", m, *address[:2], exc)
            return
        self.earlier_per_memory.append({"memory": m, **self.per_memory[m]})
        self.per_memory[m] = self._memory_account()
        self.memories[m] = conn
        self.away.discard(m)
        self._spawn(self._reader(m, conn), f"reader of memory-{m}")
        try:
            await conn.send(
                "credit",
                {"n": self.cfg.cluster.learner_credits, "beta": self.beta(), "version": self.weights_version()},
            )
        except ConnectionClosed:
            pass  # gone again: its reader reports it

    async def _train(self, m: int | None, batch: dict, checkpoint_now: bool = True) -> bool:
        """One step on `batch`; True when the priorities sent also returned its credit.
        `checkpoint_now=False`: the caller calls the outputs' `after_step` (after publishing)."""
        if self.stopped or self.budget_reached:
            self.unused_batches += 1
            return False
        t0 = time.perf_counter()
        step = self.total_steps + 1
        if "weights_version" in batch:  # whole fragments, each acted with one version
            self.lag.add(self.weights_version(), batch["weights_version"])
        try:
            result = await self.offload(self._locked_step, batch)
        except FloatingPointError as exc:
            # Finite data and a non-finite loss: the model diverged, which ends the run. Non-finite
            # data (memory hosts drop such rows; this is the last line) costs only that batch.
            if not (holds_non_finite(batch) or isinstance(exc, PeerNotFinite)):
                raise RuntimeError(f"learner step {step} on a batch from {_source(m)}: {exc}") from exc
            self.batches_dropped += 1
            self._log_dropped("dropped a batch from %s, not applied: %s", _source(m), exc)
            return False
        except Exception as exc:
            raise RuntimeError(f"learner step {step} on a batch from {_source(m)}: {exc}") from exc
        self.train_s += time.perf_counter() - t0
        if result.stop:
            self.stopped = True
            self.unused_batches += 1
            self.log.info("a data-parallel peer ran out of data; stopping after %d steps", step - 1)
            return False
        self.counters["learner_steps"] += 1
        if self.note_budget():
            self.log.info("scheduled_global_steps reached: no more steps; waiting for the stop")
            self.beat_now()
        self.last_metrics = {k: float(v) for k, v in result.metrics.items()}
        if self.lag.batches:
            self.last_metrics.update(self.lag.metrics())
        credited = False
        if m is not None:
            self.per_memory[m]["batches"] += 1
            if result.priorities is not None and "generations" in batch:
                # The batch's credit rides on its priorities: one message instead of two.
                await self.memories[m].send(
                    "priorities",
                    {"credit": 1, "beta": self.beta()},
                    {
                        "indices": batch["indices"],
                        "generations": batch["generations"],
                        "priorities": np.asarray(result.priorities, np.float64),
                    },
                )
                self.per_memory[m]["priority_messages"] += 1
                self.per_memory[m]["priorities"] += len(batch["indices"])
                credited = True
        if checkpoint_now:
            await self.outputs.after_step()
        return credited

    def _locked_step(self, batch):
        with self.core_lock:
            return self.core.step(batch)

    async def _next(self):
        t0 = time.perf_counter()
        item = await self.queue.get()
        self.wait_s += time.perf_counter() - t0
        if item[1] is not _END and item[1] is not _AWAY and item[1] is not _WAKE:  # a batch, not a marker
            self.batches_queued -= 1
        return item

    def weights_version(self) -> int:
        """The newest weights version this learner's weights are at least as new as."""
        return max(self.published_version, self.weights_version_seen)

    async def _async_loop(self) -> None:
        credits = self.cfg.cluster.learner_credits
        for conn in self.memories:
            if conn is not None:
                await conn.send("credit", {"n": credits, "beta": self.beta(), "version": self.weights_version()})
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
                # At the budget a batch's credit is kept: the memory sends no more to skip.
                if not await self._train(m, msg.arrays) and not self.budget_reached:
                    await self.memories[m].send(
                        "credit", {"n": 1, "beta": self.beta(), "version": self.weights_version()}
                    )
            except ConnectionClosed:
                pass  # that memory is gone; its reader reports it
            if (
                self.index == 0
                and self.counters["learner_steps"] % self.cfg.agent.publish_interval == 0
                and (self._publish is None or self._publish.done())
            ):
                # Copied now, between two steps; the publish task must not read them later,
                # while the next step changes them in a worker thread.
                self._publish = self.spawn(self._publish_weights(self.core.get_weights()), "weights publish")
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
            await self._ask_round(open_memories, iteration)
            parts, versions, ended, final = [], [], [], False
            waiting = set(open_memories)
            while waiting:
                m, msg = await self._next()
                waiting.discard(m)
                if msg is _END:
                    open_memories.discard(m)
                    ended.append(m)
                    continue
                if int(msg.meta.get("iteration", -1)) != iteration:
                    raise RuntimeError(
                        f"memory-{m} sent iteration {msg.meta.get('iteration')} for iteration {iteration}"
                    )
                self.per_memory[m]["batches"] += 1
                if msg.meta.get("versions"):
                    versions.extend(msg.meta["versions"])
                if not msg.meta.get("empty"):
                    parts.append((m, msg.arrays))
                final = final or bool(msg.meta.get("final"))
            if ended:
                if parts:
                    self.log.info(
                        "iteration %d is incomplete at the end of the run (memory %s ended): %d rows discarded",
                        iteration,
                        ", ".join(map(str, sorted(ended))),
                        sum(len(next(iter(p.values()))) for _, p in parts),
                    )
                break
            if not parts and (final or self.phase > Phase.RUNNING):
                self.log.info("iteration %d: no actor delivered a rollout; waiting for the end", iteration)
                break
            if not parts:
                # Every actor was away (restarting) for this iteration: no step, and the same
                # weights under the next version, which the restarted actors wait for.
                self.log.warning("iteration %d: every actor was away (restarting); no step", iteration)
                if self.index == 0:
                    await self._publish_weights()
                iteration += 1
                continue
            if self.budget_reached:
                # Past the budget no step and no new weights: the actors wait for them, and the
                # coordinator (told by the heartbeat sent at the budget) stops the run.
                self.unused_batches += len(parts)
                iteration += 1
                continue
            # In memory order, not arrival order: the same rounds make the same batch (and the
            # same minibatches), so a synchronous run is deterministic for its seed.
            parts = [p for _, p in sorted(parts, key=lambda part: part[0])]
            batch = parts[0] if len(parts) == 1 else {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
            rows = len(next(iter(batch.values())))
            lag = iteration - min(versions) if versions else None
            await self._train(None, batch, checkpoint_now=False)
            if self.stopped:
                break
            if self.index == 0:
                # Publish first: the actors wait for this version, not for the checkpoint
                # (the coordinator's run state and the serialization then overlap their rollouts).
                await self._publish_weights()
            await self.outputs.after_step()
            self.last_metrics["policy_lag"] = float(lag) if lag is not None else -1.0
            self.iterations.append(
                {
                    "iteration": iteration,
                    "rows": rows,
                    "versions": [min(versions), max(versions)] if versions else None,
                    "policy_lag": lag,
                    "weights_digest": weights_digest(self.core.get_weights()),
                }
            )
            del self.iterations[:-1000]
            self.log.info("iteration %d: %d rows, policy lag %s", iteration, rows, lag)
            iteration += 1
        # Memories still open may hold later rounds (a final empty one, or a round that was
        # incomplete elsewhere): ask on, an iteration at a time, until each answers its end, so
        # that none waits forever for a credit this learner would never send.
        while open_memories:
            iteration += 1
            await self._ask_round(open_memories, iteration)
            waiting = set(open_memories)
            while waiting:
                m, msg = await self._next()
                waiting.discard(m)
                if msg is _END:
                    open_memories.discard(m)
                elif not msg.meta.get("empty"):
                    self.unused_batches += 1

    async def _ask_round(self, memories: set[int], iteration: int) -> None:
        """Ask each of `memories` for this learner's share of round `iteration`."""
        for m in memories:
            try:
                await self.memories[m].send("credit", {"n": 1, "iteration": iteration})
            except ConnectionClosed:
                pass  # its reader reports the loss and ends it

    async def _publish_weights(self, weights: dict | None = None) -> None:
        """Publish `weights` (taken between steps), or the current ones when no step is running."""
        if weights is None:
            weights = self.core.get_weights()
        reply = await self._request_or_lost(
            "publish", {"learner_steps": self.counters["learner_steps"]}, arrays=weights
        )
        self.published += 1
        self.published_version = int(reply.meta.get("version", self.published_version))
        self.log.debug("published weights version %s", reply.meta.get("version"))
