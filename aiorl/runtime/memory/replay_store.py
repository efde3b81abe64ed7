"""Replay (`ReplayStore`): one shard of a uniform or prioritized replay buffer,
or of the frame layout's (`aiorl.replay.frames`), with its snapshots.

Actors send batches; each actor connection is accounted on its own (batches,
transitions, a sequence number from 0): a restarted actor's new connection
starts again at 0, and every transition accepted is counted in exactly one of
them. Rows with bad values or priorities are dropped or kept at priority 0
(`aiorl.runtime.memory.tally`); a message whose shape breaks the protocol
closes the connection instead.

Pull-based: a learner grants credits (one per batch it will consume); the
memory samples only against a credit, so it never samples ahead of demand,
and every learner is fed by every memory. Priority updates come back on the
same connection; updates to slots overwritten since sampling are counted as
stale, never silently dropped. With ``agent.samples_per_insert`` learners'
batches also wait for the ratio (`aiorl.runtime.memory.flow`).
"""

from __future__ import annotations

import math
import time

import numpy as np

from aiorl.replay import PrioritizedReplayBuffer, ReplayBuffer
from aiorl.replay.frames import FrameReplayBuffer
from aiorl.runtime.memory.links import ActorLink, LearnerLink
from aiorl.runtime.memory.store import Store, StoreParts, send_end
from aiorl.runtime.messages import PRIORITY_UPDATE, BadMessage, RowSpec
from aiorl.runtime.phase import Phase
from aiorl.runtime.ratelimit import RATIO_LOWER, SampleToInsertRatio
from aiorl.runtime.snapshot import ReplaySnapshots
from aiorl.wire import Connection, ConnectionClosed


def shard_capacity(cfg) -> int:
    """Rows one memory host's shard holds."""
    return cfg.agent.buffer_size // cfg.cluster.memories


def shard_threshold(cfg) -> int:
    """Rows one shard holds before it feeds a learner (its part of ``agent.learning_starts``)."""
    return max(1, math.ceil(cfg.agent.learning_starts / cfg.cluster.memories))


class ReplayStore(Store):
    actor_kind = "batch"

    def __init__(
        self,
        parts: StoreParts,
        replay,
        rows: RowSpec,
        *,
        capacity: int,
        threshold: int,
        batch_size: int,
        prioritized: bool,
        frames: bool = False,
    ):
        super().__init__(parts)
        self.replay = replay
        self.rows = rows
        self._capacity = capacity
        self.threshold = threshold
        self.batch_size = batch_size
        self.prioritized = prioritized  # rows come with priorities, learners send theirs back
        self.frames = frames  # the frame layout: each actor connection is a stream of frames
        self.learner_kinds = frozenset({"credit", "priorities"}) if prioritized else frozenset({"credit"})

    @classmethod
    def wanted(cls, cfg) -> bool:
        return True  # what an algorithm keeps unless it declares otherwise

    @classmethod
    def limiter(cls, cfg) -> SampleToInsertRatio | None:
        a, c = cfg.agent, cfg.cluster
        if a.samples_per_insert is None:
            return None
        return SampleToInsertRatio(
            a.samples_per_insert,
            shard_threshold(cfg),
            a.batch_size,
            a.sample_batch_size * cfg.env.num_envs,
            a.samples_per_insert_tolerance,
            actors=c.actors,  # every actor spreads its batches over every memory
            actor_credits=c.actor_credits,
            learner_credits=c.learners * c.learner_credits,
        )

    @classmethod
    def build(cls, cfg, algo, parts: StoreParts, rows: RowSpec, layout) -> ReplayStore:
        a, c = cfg.agent, cfg.cluster
        capacity = shard_capacity(cfg)
        seed = cfg.run.seed + 1000 + parts.index
        spec = algo.transition_spec()
        if layout is not None:
            replay = FrameReplayBuffer(
                capacity,
                spec,
                layout,
                alpha=a.prioritized_replay_alpha if a.prioritized_replay else None,
                eps=a.prioritized_replay_eps,
                seed=seed,
                max_streams=c.actors,
            )
        elif a.prioritized_replay:
            replay = PrioritizedReplayBuffer(
                capacity, spec, alpha=a.prioritized_replay_alpha, eps=a.prioritized_replay_eps, seed=seed
            )
        else:
            replay = ReplayBuffer(capacity, spec, seed=seed)
        return cls(
            parts,
            replay,
            rows,
            capacity=capacity,
            threshold=shard_threshold(cfg),
            batch_size=a.batch_size,
            prioritized=a.prioritized_replay,
            frames=layout is not None,
        )

    @classmethod
    def bytes_per_row(cls, cfg, algo, layout) -> int:
        """Each field of the transition spec, as the buffer stores it (one array per field,
        ``capacity`` rows), plus the sum tree's leaf of a prioritized replay; in the frame layout,
        a frame field's table of ids and at least one new frame per row (an env step makes one)."""
        spec = algo.transition_spec()
        frame_fields = () if layout is None else layout.fields
        row = sum(
            int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
            for name, (shape, dtype) in spec.items()
            if name not in frame_fields
        )
        if layout is not None:
            row += layout.refs_per_row * np.dtype(np.int64).itemsize + layout.frame_bytes
        if cfg.agent.prioritized_replay:
            row += np.dtype(np.float64).itemsize
        return row

    # ------------------------------------------------------------------ actors

    def actor_opened(self, link: ActorLink) -> None:
        if self.frames:
            link.frames = self.replay.stream()  # frame ids start over with every connection

    def accept(self, link: ActorLink, msg, fields: dict) -> None:
        seq = fields["seq"]
        if seq != link.next_seq:
            link.seq_errors += 1
            self.log.error("%s batch seq %d, expected %d", link.name, seq, link.next_seq)
        link.next_seq = seq + 1
        arrays = dict(msg.arrays)
        priorities = arrays.pop("priorities", None)
        frames = {k: arrays.pop(k) for k in ("frames", "frames_lz4", "frame_ids") if k in arrays}
        n = self.rows.rows("batch", arrays)
        if priorities is not None and (priorities.dtype != np.float64 or priorities.shape != (n,)):
            raise BadMessage(f"batch.priorities is {priorities.dtype}{list(priorities.shape)}, expected float64[{n}]")
        keep = self.tally.good_values(link, self.rows, arrays, n)
        if keep is not None:
            arrays = {k: v[keep] for k, v in arrays.items()}
            priorities = None if priorities is None else priorities[keep]
            n = int(keep.sum())
        if link.frames is not None:
            self._add_frames(link, {**arrays, **frames}, priorities, n, fields)
        elif frames:
            raise BadMessage(f"batch carries {sorted(frames)}, but this run does not use the frame layout")
        elif self.prioritized:
            n = self._add_prioritized(link, arrays, priorities, n)
        else:
            self.replay.add(arrays)
        self.tally.stored(link, n)
        self.flow.inserted(link, n)
        self.changed.fire()

    def _add_prioritized(self, link: ActorLink, arrays: dict, priorities, n: int) -> int:
        """Add rows; rows with a non-finite or negative priority are dropped and counted
        (one bad row must not cost the actor its connection). Returns the rows added."""
        try:
            self.replay.add(arrays, priorities)  # refuses the whole batch if a priority is bad
            return n
        except ValueError:
            good = None if priorities is None else np.isfinite(priorities) & (priorities >= 0)
            if good is None or good.all():
                raise  # not the priorities: a bug of ours
        bad = int(n - good.sum())
        self.tally.reject(link, bad, n, "dropped", "with a non-finite or negative priority")
        self.replay.add({k: v[good] for k, v in arrays.items()}, priorities[good])
        return n - bad

    def _add_frames(self, link: ActorLink, arrays: dict, priorities, n: int, fields: dict) -> None:
        """Frame layout: every row stays (later messages of the stream lean on this one's
        frames); a row with a non-finite or negative priority is stored at priority 0."""
        if "keep_from" not in fields:
            raise BadMessage("batch without its 'keep_from' field (the frame layout needs it)")
        if priorities is not None:
            good = np.isfinite(priorities) & (priorities >= 0)
            if not good.all():
                bad = int(n - good.sum())
                self.tally.reject(link, bad, n, "kept", "with a non-finite or negative priority at priority 0")
                priorities = np.where(good, priorities, 0.0)
        try:  # nothing is stored if any part of the message is invalid
            self.replay.add(arrays, priorities, stream=link.frames, keep_from=fields["keep_from"])
        except ValueError as exc:
            raise BadMessage(str(exc)) from None

    # ------------------------------------------------------------------ learners

    def on_priorities(self, link: LearnerLink, msg) -> None:
        arrays = msg.arrays
        n = PRIORITY_UPDATE.rows("priorities", arrays)
        link.priority_messages += 1
        try:  # refused whole (nothing written) if a priority or an index is bad
            stale = self.replay.update_priorities(arrays["indices"], arrays["priorities"], arrays.get("generations"))
        except ValueError:
            priorities = arrays["priorities"]
            good = np.isfinite(priorities) & (priorities >= 0)
            if good.all():
                raise BadMessage("priorities: an index is out of range") from None
            bad = int(n - good.sum())
            link.priorities_rejected += bad
            self.tally.log_peer("%s: ignored %d of %d priorities that are non-finite or negative", link.name, bad, n)
            arrays = {k: v[good] for k, v in arrays.items()}
            n -= bad
            stale = self.replay.update_priorities(arrays["indices"], arrays["priorities"], arrays.get("generations"))
        link.priorities_stale += int(stale)
        link.priorities_applied += n - int(stale)

    def _within_rate(self) -> bool:
        return self.flow.within_rate(len(self.replay))

    async def serve(self, conn: Connection, link: LearnerLink, learner_index: int) -> None:
        """Send one batch per credit while RUNNING or STOPPING, then ``end``."""
        draining = lambda: self.phase() >= Phase.DRAINING  # noqa: E731
        while True:
            ready = lambda: link.credits > 0 and len(self.replay) >= self.threshold  # noqa: E731
            # First the learner's request, then what the limiter holds it by (the shard's size or
            # the ratio): a wait that began for want of a request is the learner's, not the limiter's.
            await self.changed.wait_for(lambda: draining() or link.credits > 0)
            bound = None if draining() else self.flow.sample_bound(len(self.replay))
            t0 = time.perf_counter()
            await self.changed.wait_for(lambda: draining() or (ready() and self._within_rate()))
            if bound is not None:
                waited = time.perf_counter() - t0
                self.flow.held(bound, waited, link.name)
                if bound == RATIO_LOWER:  # the data was there: the ratio held it back
                    self.tally.sample_blocked_s += waited
            if draining():
                break
            link.credits -= 1
            batch = (
                self.replay.sample(self.batch_size, link.beta)
                if self.prioritized
                else self.replay.sample(self.batch_size)
            )
            rows = len(batch["indices"]) if "indices" in batch else 0
            self.tally.sampled += rows
            self.flow.sampled(rows)
            link.batches_sent += 1
            try:
                await conn.send("samples", {"memory": self.index}, batch)
            except ConnectionClosed:
                return  # the learner went away; its connection handler reports it
        await send_end(conn, link, self.index)

    # ------------------------------------------------------------------ the role's life

    def size(self) -> int:
        return len(self.replay)

    def capacity(self) -> int:
        return self._capacity

    def metrics(self) -> dict:
        return {"replay_frames": len(self.replay.pool)} if self.frames else {}

    def summary(self) -> dict:
        return {
            **super().summary(),
            "replay_size": len(self.replay),
            "replay_added": self.replay.added,
            # Frame layout: frames stored at the end, each once however many rows reference it.
            "replay_frames": len(self.replay.pool) if self.frames else None,
        }

    def restore(self, snapshots: ReplaySnapshots) -> None:
        restored = snapshots.restore(self.replay)
        if restored:
            self.flow.restored(restored)

    def snapshots_every(self, snapshots: ReplaySnapshots, interval_s: float):
        return snapshots.run_every(self.replay, interval_s)

    async def save(self, snapshots: ReplaySnapshots) -> None:
        await snapshots.save(self.replay)
