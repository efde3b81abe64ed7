"""Actor: steps its environments with the algorithm's policy and streams the
postprocessed batches to the memory hosts.

Env stepping and acting run one rollout of ``sample_batch_size`` steps at a
time: on the loop thread while a rollout is quick, in a worker thread otherwise
(`Offload`), so the loop keeps answering the coordinator. Batches go round-robin over all memories, each with a
per-(actor, memory) sequence number that lets memories prove nothing was lost
or duplicated. Weights are pulled when the coordinator reports a newer
version, at most one request in flight, and applied between rollouts (never
while the policy is acting in the worker thread).

With a rate limit (``agent.samples_per_insert``) an actor sends a batch only
against a memory's credit and takes the next rollout only once it holds one
(the time spent waiting is ``blocked_s``). A memory host that goes away is
skipped until the coordinator announces its new address; the batches it
would have had go to the others, none is dropped. A restarted actor (or a
resumed run) seeds its policy and envs afresh from the run seed, its index,
the attempt and its restart count, so that it does not replay the episodes
of its predecessor.

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
from aiorl.io.rundir import Identity
from aiorl.replay.frame_sender import FrameSender
from aiorl.replay.frames import frame_layout
from aiorl.runtime import messages
from aiorl.runtime.env_faults import EnvFaults, nonfinite_rows
from aiorl.runtime.phase import Phase
from aiorl.runtime.role import DivergedWeights, Offload, OwnInconsistency, Role
from aiorl.wire import Connection, ConnectionClosed

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
        self.memories: list[Connection | None] = []  # None while that memory host is away
        self.sent = []  # per memory: batches, transitions (of the current connection)
        self.earlier_sent: list[dict] = []  # accounts of connections to memory hosts that went away
        self.credits: list[int] | None = None  # per memory, with a rate limit
        self.memories_changed = asyncio.Event()
        self.blocked_s = 0.0
        self.credit_waits = 0  # times the next batch found no credit and waited (blocked_s counts how long)
        self._links: set[asyncio.Task] = set()
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
        self.fragment_flow = False  # IMPALA: fragment messages, each against a credit
        self.own_rows: messages.RowSpec | None = None  # the spec memories check rollouts against
        self.rows_checked: set[str] = set()  # message kinds whose first rows matched it
        self.env_faults = EnvFaults(self.cfg.env.id, self.name)  # the env's NaN and inf, dropped and counted

    def heartbeat_extra(self) -> dict:
        returns, self.episode_returns = self.episode_returns, []
        lengths, self.episode_lengths = self.episode_lengths, []
        return {"episode_returns": returns, "episode_lengths": lengths}

    def metrics(self) -> dict:
        version = self.policy.weights_version if hasattr(self, "policy") else -1
        return {
            "weights_version": version,
            "weights_lag": max(0, self.weights_version_seen - version),
            "blocked_s": round(self.blocked_s, 3),
            "idle_fraction": self.idle.fraction(),
            **self.env_faults.stats(),
        }

    async def cleanup(self) -> None:
        if self._pull is not None:
            self._pull.cancel()
        for task in self._links:
            task.cancel()
        for conn in self.memories:
            if conn is not None:
                conn.abort()

    def seed(self) -> int:
        """The run's seed for this actor; a restart or a resume gets fresh ones."""
        base = self.cfg.run.seed + 10_000 * (self.index + 1)
        attempt, restarts = Identity.from_env().attempt, int(self.registration.get("restarts", 0))
        if attempt == 1 and restarts == 0:
            return base
        return int(np.random.SeedSequence([base, attempt, restarts]).generate_state(1)[0])

    # ------------------------------------------------------------------ memory hosts

    async def _connect_memory(self, m: int, address) -> None:
        conn = await self.attach_memory(address)
        if self.memories[m] is not None:
            self.memories[m].abort()
        if self.frames is not None:
            self.frames.forget(m)  # a new connection is a new frame stream: it holds nothing yet
        if self.sent[m]["batches"]:
            self.earlier_sent.append({"memory": m, **self.sent[m]})
        self.memories[m] = conn
        self.sent[m] = {"batches": 0, "transitions": 0}
        if self.credits is not None:
            self.credits[m] = 0
        if not self.synchronous and not self.fragment_flow:  # a fragment message goes at once
            conn.flush_delay_s = self.cfg.cluster.actor_flush_delay_s
        task = self.spawn(self._read_memory(m, conn), f"reader of memory-{m}")
        self._links.add(task)
        task.add_done_callback(self._links.discard)
        self.memories_changed.set()

    async def _read_memory(self, m: int, conn: Connection) -> None:
        """Credits from memory `m`; its connection closing marks it away."""
        try:
            async for msg in conn:
                fields = messages.check(msg.kind, msg.meta, {"credit"})
                if self.credits is not None:
                    self.credits[m] += fields.get("n", 1)
                    self.memories_changed.set()
        except ConnectionClosed:
            pass
        except messages.BadMessage as exc:
            self.log.error("closing connection to memory-%d: bad message: %s", m, exc)
            conn.abort()
        self._memory_away(m, conn)

    def _memory_away(self, m: int, conn: Connection) -> None:
        if self.memories[m] is conn:
            if self.phase <= Phase.RUNNING:  # later, memories closing is the normal end
                self.log.warning("memory-%d went away; its share goes to the other memory hosts", m)
            self.memories[m] = None
            self.memories_changed.set()

    def _set_phase(self, phase: Phase) -> None:
        super()._set_phase(phase)
        self.memories_changed.set()  # an actor waiting for a credit stops waiting when the run stops

    def on_control(self, msg) -> None:
        if msg.kind != "memories":
            return super().on_control(msg)
        for m, address in enumerate(msg.meta.get("memories", [])):
            if address and m < len(self.memories) and self.memories[m] is None:
                self.log.info("memory-%d is back at %s:%s; reconnecting", m, *address[:2])
                task = asyncio.create_task(self._reconnect_memory(m, address))
                self._links.add(task)
                task.add_done_callback(self._links.discard)

    async def _reconnect_memory(self, m: int, address) -> None:
        try:
            await self._connect_memory(m, address)
        except (OSError, TimeoutError) as exc:
            self.log.error("cannot reconnect to memory-%d at %s:%s: %s", m, *address[:2], exc)

    def _usable(self, m: int, need_credit: bool) -> bool:
        return self.memories[m] is not None and (not need_credit or self.credits is None or self.credits[m] > 0)

    async def _acquire(self, need_credit: bool = True, or_stop: bool = False) -> int | None:
        """The memory the next batch goes to: round-robin over the reachable ones; with a rate limit,
        one that granted a credit (waiting, without stepping, until one does). `or_stop`: once the
        run stops, None rather than a memory without a credit (fragments go only against one)."""
        n = len(self.memories)
        t0 = None
        while True:
            for k in range(n):
                m = (self.batches + k) % n
                if self._usable(m, need_credit):
                    if t0 is not None:
                        self.blocked_s += time.perf_counter() - t0
                    if need_credit and self.credits is not None:
                        self.credits[m] -= 1
                    return m
            if need_credit and self.phase != Phase.RUNNING:
                if or_stop:
                    return None
                need_credit = False  # stopping: the last batches go without credit
                continue
            if t0 is None:
                t0 = time.perf_counter()
                self.credit_waits += need_credit and self.credits is not None
            self.memories_changed.clear()
            await self.memories_changed.wait()

    async def main(self) -> dict:
        cfg = self.cfg
        algo = self.algorithm()
        seed = self.seed()
        self.policy = algo.make_actor(self.index, cfg.cluster.actors, seed)
        layout = frame_layout(cfg, algo)
        if layout is None and algo.is_synchronous(cfg):  # rollouts, checked by memories as here
            self.own_rows = messages.RowSpec(algo.transition_spec())
        if layout is not None:
            # Observations travel as frame ids; the policy still sees stacks where it needs them.
            self.frames = FrameSender(
                layout,
                cfg.env.num_envs,
                len(self.start_info["memories"]),
                algo.lookback_steps(),
                cfg.cluster.frame_compression,
            )
            self.policy.decode_observations = self.frames.decode
        work = algo.is_synchronous(cfg) and algo.work_items(cfg) is not None
        # work items: the policy steps its own envs
        self.runner = None if work else EnvRunner(cfg.env, cfg.env.num_envs, seed, frames=self.frames)
        # A steady stream of batches nobody waits on lets a few share each write;
        # a synchronous rollout is waited on, so it goes at once.
        self.synchronous = algo.is_synchronous(cfg)
        self.fragment_flow = algo.fragment_queue(cfg) is not None
        addresses = self.start_info["memories"]
        self.memories = [None] * len(addresses)
        self.sent = [{"batches": 0, "transitions": 0} for _ in addresses]
        if (cfg.agent.samples_per_insert is not None or self.fragment_flow) and not self.synchronous:
            self.credits = [0] * len(addresses)
        for m, address in enumerate(addresses):
            if address:
                try:
                    await self._connect_memory(m, address)
                except (OSError, TimeoutError) as exc:  # gone since: it comes back with a new address
                    self.log.warning("memory-%d at %s:%s unreachable (%s); going on without it", m, *address[:2], exc)
        try:
            if work:
                await self._work_loop()
            elif self.synchronous:
                await self._sync_loop()
            elif self.fragment_flow:
                await self._fragment_loop()
            else:
                await self._async_loop()
            batch, priorities = self.env_faults.drop_rows(*self.policy.flush())
            if batch:
                await self._send(batch, priorities, need_credit=False)
            self.idle.stop()
            for i, conn in enumerate(self.memories):
                if conn is not None:
                    await conn.send("actor_done", {"actor": self.index, **self.sent[i]})
        finally:
            if self.runner is not None:
                self.runner.close()
        return {
            "env_steps": self.counters["env_steps"],
            "memories": self.sent,
            "batches": self.batches,
            "earlier_connections": self.earlier_sent,
            "blocked_s": round(self.blocked_s, 3),
            "credit_waits": self.credit_waits,
            "payload_bytes": self.payload_bytes,
            "frames_sent": self.frames.frames_sent if self.frames is not None else None,
            "weights_version": self.policy.weights_version,
            "idle_s": round(self.idle.idle_s, 3),
            "loop_s": round(self.idle.wall_s, 3),
            "idle_fraction": self.idle.fraction(),
            "iterations": self.iterations[-1000:],
            **self.env_faults.stats(),
        }

    async def _rollout(self):
        rollout = await self.offload(
            self.runner.rollout, self.policy.act, self.cfg.agent.sample_batch_size, self.policy.begin_episodes
        )
        self.counters["env_steps"] = self.runner.env_steps
        self._add_episodes(*self.runner.pop_episodes())
        self.env_faults.check_rollout(rollout)
        return rollout

    def _add_episodes(self, returns: list[float], lengths: list[int]) -> None:
        returns, lengths = self.env_faults.finite_episodes(returns, lengths)
        self.episode_returns.extend(returns)
        self.episode_lengths.extend(lengths)

    async def _send(self, batch: dict, priorities, m: int | None = None, need_credit: bool = True) -> None:
        """Send to memory `m` (its credit already taken), or to the next one that can take it."""
        while True:
            if m is None:
                m = await self._acquire(need_credit)
            conn = self.memories[m]
            if conn is not None:
                meta = {"actor": self.index, "seq": self.sent[m]["batches"]}
                if self.frames is not None:  # the frames memory `m` lacks travel with the rows
                    arrays, meta["keep_from"] = self.frames.message(m, batch)
                else:
                    arrays = dict(batch)
                if priorities is not None:
                    arrays["priorities"] = self._finite(np.asarray(priorities, np.float64), batch)
                try:
                    with self.idle:
                        await conn.send("batch", meta, arrays)
                    self.payload_bytes += sum(a.nbytes for a in arrays.values())
                    self._count_sent(m, batch)
                    return
                except ConnectionClosed:
                    self._memory_away(m, conn)  # gone since: the batch goes elsewhere
            m, need_credit = None, False

    def _finite(self, priorities: np.ndarray, batch: dict) -> np.ndarray:
        """Rows the env made non-finite go on to be dropped and counted by the memory host; a
        non-finite priority of a finite row can only come from the weights."""
        bad = ~np.isfinite(priorities)
        if bad.any():
            found = nonfinite_rows(batch, len(bad))
            if found is not None:
                bad &= ~found[0]
        if bad.any():
            bad = np.count_nonzero(bad)
            raise DivergedWeights(
                f"{bad} of {len(priorities)} initial priorities of finite rows are non-finite with weights "
                f"version {self.policy.weights_version}: the learner's weights diverged (a lower "
                "model.learning_rate or a gradient clip may help)"
            )
        return priorities

    def _count_sent(self, m: int, batch: dict, transitions: int | None = None) -> None:
        """The actor's own account of what memory `m` got, checked against the memory's at the end."""
        self.sent[m]["batches"] += 1
        self.sent[m]["transitions"] += len(next(iter(batch.values()))) if transitions is None else transitions
        self.batches += 1

    async def _async_loop(self) -> None:
        # The start reply can come before the RUNNING broadcast: a quick set-up must not find
        # the run "not running" and stop at once.
        await self.wait_phase(Phase.RUNNING)
        self.idle.start()
        while self.phase == Phase.RUNNING:
            if await self._budget_reached():
                break
            if self._pending_weights is not None:
                self.policy.set_weights(*self._pending_weights)
                self._pending_weights = None
            with self.idle:
                m = await self._acquire()  # with a rate limit: no stepping without a credit
            rollout = await self._rollout()
            batch, priorities = self.env_faults.drop_rows(*self.policy.postprocess(rollout))
            if batch:
                await self._send(batch, priorities, m)
            elif self.credits is not None:
                self.credits[m] += 1  # nothing to send (n-step windows still open): keep it
            if (
                self.batches % self.cfg.agent.sync_interval == 0
                and self.weights_version_seen > self.policy.weights_version
                and (self._pull is None or self._pull.done())
            ):
                self._pull = self.spawn(self._pull_weights(), "weights pull")

    async def _budget_reached(self) -> bool:
        """At ``scheduled_timesteps`` by what this actor knows (`run_total_reached`): no more
        rollouts. It tells the coordinator at once and waits for the stop, so the run ends at
        most one rollout per actor, and what the others step until their next heartbeat,
        past its budget. Synchronous actors finish their iteration instead (rounds are whole)."""
        if not self.run_total_reached("env_steps", self.cfg.agent.scheduled_timesteps):
            return False
        self.log.info("scheduled_timesteps reached: no more rollouts; waiting for the stop")
        self.beat_now()
        with self.idle:
            await self.wait_phase(Phase.STOPPING)
        return True

    async def _pull_weights(self) -> None:
        reply = await self._request_or_lost("get_weights", {"have": self.policy.weights_version})
        if reply.arrays:
            self._pending_weights = (dict(reply.arrays), int(reply.meta["version"]))

    async def _fragment_loop(self) -> None:
        """Roll out, then send one fragment per env to a memory that gave a credit; weights are
        pulled every `sync_interval` messages (one pull in flight) and applied between rollouts,
        so each message is acted with one version. Once the run stops, a rollout still waiting
        for a credit is not sent."""
        # Acting with the learner's weights from the first fragment on (version 0).
        reply = await self.coordinator.request("get_weights", {"have": -1, "min_version": 0}, timeout_s=UNBOUNDED_S)
        if reply.meta.get("stop"):
            return
        self.policy.set_weights(dict(reply.arrays), int(reply.meta["version"]))
        await self.wait_phase(Phase.RUNNING)
        self.idle.start()
        while self.phase == Phase.RUNNING:
            if await self._budget_reached():
                break
            if self._pending_weights is not None:
                self.policy.set_weights(*self._pending_weights)
                self._pending_weights = None
            fragments, _ = self.policy.postprocess(await self._rollout())
            if not await self._send_fragments(fragments):
                break
            # Not only when a heartbeat said there is a newer version: that lags by a heartbeat.
            if self.batches % self.cfg.agent.sync_interval == 0 and (self._pull is None or self._pull.done()):
                self._pull = self.spawn(self._pull_weights(), "weights pull")

    async def _send_fragments(self, fragments: dict) -> bool:
        """One fragment message, against a credit of whichever memory host gives one first; a
        host that goes away mid-send costs its credit, and the message goes to another. False:
        the run stopped first."""
        steps = self.cfg.agent.sample_batch_size * self.cfg.env.num_envs
        while True:
            with self.idle:
                m = await self._acquire(or_stop=True)
            if m is None:
                return False
            conn = self.memories[m]
            meta = {"seq": self.sent[m]["batches"], "weights_version": self.policy.weights_version}
            arrays = fragments
            if self.frames is not None:  # the frames memory `m` lacks travel with the fragments
                arrays, meta["keep_from"] = self.frames.message(m, fragments)
            try:
                with self.idle:
                    await conn.send("fragment", meta, arrays)
            except ConnectionClosed:
                self._memory_away(m, conn)
                continue
            self.payload_bytes += sum(a.nbytes for a in arrays.values())
            self._count_sent(m, fragments, steps)
            return True

    def _check_own_rows(self, kind: str, arrays: dict) -> None:
        """The first rows of each kind against the algorithm's own spec, before they leave: a
        memory host refuses rows that miss it by closing the connection (as it would a hostile
        peer's), and the actor, its rows never counted, would wait on the round for ever."""
        if self.own_rows is None or kind in self.rows_checked:
            return
        try:
            self.own_rows.rows(kind, arrays)
        except messages.BadMessage as exc:
            raise OwnInconsistency(
                f"{self.cfg.algo}'s actor built a {kind} its own transition_spec() refuses ({exc}): "
                "a bug in the algorithm, not in this run"
            ) from None
        self.rows_checked.add(kind)

    async def _sync_loop(self) -> None:
        """One rollout per iteration; no iteration starts before its weights are published."""
        m = self.index % len(self.memories)
        memory = self.memories[m]
        # On-policy: iteration k acts with the learner's weights of version k; a restarted actor
        # joins at the iteration the coordinator gave it, the one after the newest weights.
        iteration = int(self.registration.get("iteration", 0))
        reply = await self.coordinator.request(
            "get_weights", {"have": -1, "min_version": iteration}, timeout_s=UNBOUNDED_S
        )
        if reply.meta.get("stop"):
            return
        self.policy.set_weights(dict(reply.arrays), int(reply.meta["version"]))
        self.idle.start()
        while self.phase == Phase.RUNNING:
            started = time.monotonic()
            rollout = await self._rollout()
            batch, _ = self.policy.postprocess(rollout)
            self._check_own_rows("rollout", batch)
            with self.idle:
                await memory.send(
                    "rollout",
                    {"actor": self.index, "iteration": iteration, "weights_version": self.policy.weights_version},
                    batch,
                )
            self._count_sent(m, batch)
            self.iterations.append(
                {"iteration": iteration, "weights_version": self.policy.weights_version, "started_monotonic": started}
            )
            with self.idle:
                reply = await self.coordinator.request(
                    "barrier", {"name": "iteration", "generation": iteration}, timeout_s=UNBOUNDED_S
                )
            if reply.meta.get("stop"):
                break  # the run stopped while this actor waited for the others
            with self.idle:
                reply = await self.coordinator.request(
                    "get_weights",
                    {"have": self.policy.weights_version, "min_version": iteration + 1},
                    timeout_s=UNBOUNDED_S,
                )
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
                        "get_weights",
                        {"have": self.policy.weights_version, "min_version": iteration},
                        timeout_s=UNBOUNDED_S,
                    )
                if reply.meta.get("stop"):
                    break
                self.policy.set_weights(dict(reply.arrays), int(reply.meta["version"]))
            if self.policy.weights_version != iteration:
                continue  # that iteration ended while this actor was away: the item is not wanted
            started = time.monotonic()
            result = await self.offload(self.policy.run_work, iteration, item)
            self.counters["env_steps"] += result.env_steps
            self._add_episodes(result.episode_returns, result.episode_lengths)
            m = item % len(self.memories)
            self._check_own_rows("rollout", result.batch)
            with self.idle:
                await self.memories[m].send(
                    "rollout",
                    {
                        "actor": self.index,
                        "iteration": iteration,
                        "item": item,
                        "weights_version": self.policy.weights_version,
                    },
                    result.batch,
                )
            self._count_sent(m, result.batch)
            self.iterations.append(
                {
                    "iteration": iteration,
                    "item": item,
                    "weights_version": self.policy.weights_version,
                    "started_monotonic": started,
                }
            )
            del self.iterations[:-1000]
