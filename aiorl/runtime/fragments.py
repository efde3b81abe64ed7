"""The fragment flow of asynchronous on-policy algorithms (IMPALA), in pieces the roles own.

    actor --fragment (one per env, one weights version)--> memory: TrajectoryQueue
          <--credit------------------------------------
    memory --samples (whole fragments, fresh arrays)--> learner
           <--credit (with the learner's weights version)--

- `CreditGate` (memory): an actor sends a fragment message only against a
  credit from that memory. Each actor holds `INITIAL_CREDITS`, and gets one
  back for each message the memory took in. Under ``throttle`` a credit goes
  out only while the queue has room for what every outstanding credit may
  bring, so the queue never overflows and actors wait (Reverb's rate
  limiter blocks the writer the same way); under ``drop_oldest`` credits go
  back at once and a full queue drops its oldest fragments. Credits go out
  in the order actors asked for them.
- `FragmentHub` (memory): the queue, the gate, and the newest weights
  version the memory knows of (from learners' credits and heartbeats);
  fragments more than ``max_policy_lag`` versions older are dropped, counted.
- `ActorCredits` (actor): the credits each memory gave, spent round robin
  over the memories that have one.
- `LagMeter` (learner): policy lag per batch, the learner's weights version
  minus each fragment's.

Validation happens at the point of use: a message that breaks the protocol
raises ValueError, which closes only that connection.
"""
from __future__ import annotations

import asyncio
from collections import deque
import numpy as np

from aiorl.replay.trajectory_queue import FrameTrajectoryQueue, QueueFull, QueueSpec, TrajectoryQueue
from aiorl.wire import ConnectionClosed

# Fragment messages an actor may have in flight per memory: one on the wire while it rolls
# out the next.
INITIAL_CREDITS = 2
# Most credits one credit message may carry (a bound on a peer's claim).
MAX_CREDITS_PER_MESSAGE = 1024


def int_field(meta: dict, key: str, low: int = 0, high: int = 2 ** 62) -> int:
    """meta[key] as an int in [low, high]; ValueError naming the field otherwise."""
    value = meta.get(key)
    if type(value) is not int or not low <= value <= high:
        raise ValueError(f"meta field {key!r}: expected an integer in [{low}, {high}], got {value!r}")
    return value


# --------------------------------------------------------------------------
# Memory side


class CreditGate:
    """Which actor may send its next fragment message, and when (see the module docstring)."""

    def __init__(self, capacity: int, per_message: int, throttle: bool, initial: int = INITIAL_CREDITS):
        self.capacity, self.per_message, self.throttle, self.initial = capacity, per_message, throttle, initial
        self.requests: deque[str] = deque()  # one entry per credit owed, oldest first
        self.outstanding: dict[str, int] = {}  # credits granted and not yet used
        self.throttled = 0  # grants that waited for room
        self._blocked = False

    def __repr__(self) -> str:
        return (f"<CreditGate owed={len(self.requests)} outstanding={sum(self.outstanding.values())} "
                f"throttled={self.throttled}>")

    def join(self, actor: str) -> None:
        self.outstanding[actor] = 0
        self.requests.extend([actor] * self.initial)

    def leave(self, actor: str) -> None:
        """The actor's connection ended: what it was owed or promised is void."""
        self.outstanding.pop(actor, None)
        self.requests = deque(r for r in self.requests if r != actor)

    def used(self, actor: str) -> None:
        """A fragment message arrived from `actor`; it is owed a credit back."""
        if self.outstanding.get(actor, 0) < 1:
            raise ValueError(f"{actor} sent a fragment message without a credit")
        self.outstanding[actor] -= 1
        self.requests.append(actor)

    def promised(self) -> int:
        """Fragments the outstanding credits may still bring."""
        return sum(self.outstanding.values()) * self.per_message

    def head(self, queued: int) -> str | None:
        """The actor whose credit can go out now, given `queued` fragments in the queue."""
        if not self.requests:
            return None
        if self.throttle and queued + self.promised() + self.per_message > self.capacity:
            self._blocked = True
            return None
        return self.requests[0]

    def grant(self, actor: str) -> None:
        if not self.requests or self.requests[0] != actor:
            raise RuntimeError(f"CreditGate: {actor} is not next ({self!r})")
        self.requests.popleft()
        self.outstanding[actor] += 1
        if self._blocked:
            self.throttled += 1
            self._blocked = False


class FragmentHub:
    """One memory host's trajectory queue, actor credits and policy-lag filter.

    With a frame layout (`aiorl.replay.frames`), observations arrive as frame ids, each
    frame once per actor connection (`join` gives the connection its frame stream).
    """

    def __init__(self, spec: dict, steps: int, num_envs: int, qspec: QueueSpec, layout=None, actors: int = 1):
        self.qspec = qspec
        self.num_envs = num_envs
        if layout is None:
            self.queue = TrajectoryQueue(qspec.capacity, spec, steps, qspec.full)
        else:
            self.queue = FrameTrajectoryQueue(qspec.capacity, spec, steps, layout, qspec.full, max_streams=actors)
        self.streams: dict[str, object] = {}  # frame layout: each actor connection's FrameStream
        self.gate = CreditGate(qspec.capacity, num_envs, qspec.full == "throttle")
        self.known_version = -1  # newest weights version heard of
        self.messages = 0
        self.handoff_lag_max = 0  # worst policy lag a batch was handed out with (known version - fragment's)

    def __repr__(self) -> str:
        return f"<FragmentHub {self.queue!r} {self.gate!r} known_version={self.known_version}>"

    def join(self, actor: str) -> None:
        """An actor connected: its credits (and frame stream) start now."""
        self.gate.join(actor)
        if isinstance(self.queue, FrameTrajectoryQueue):
            self.streams[actor] = self.queue.stream()  # frame ids start over with every connection

    def leave(self, actor: str) -> None:
        self.gate.leave(actor)
        stream = self.streams.pop(actor, None)
        if stream is not None:
            stream.release()  # queued fragments keep the frames they reference

    def ingest(self, actor: str, actor_index: int, meta: dict, arrays: dict) -> int:
        """A fragment message from `actor`: one fragment per env, checked whole, then queued.
        Returns the fragments dropped to make room (drop_oldest)."""
        version = int_field(meta, "weights_version")
        frames = isinstance(self.queue, FrameTrajectoryQueue)
        rows = {k: v for k, v in arrays.items() if k not in ("frames", "frames_lz4", "frame_ids")} if frames \
            else arrays
        n = self.queue.check(rows)
        if n != self.num_envs:
            raise ValueError(f"a fragment message holds one fragment per env ({self.num_envs}), got {n}")
        self.gate.used(actor)
        try:
            if frames:
                dropped = self.queue.push(arrays, version, actor_index, stream=self.streams[actor],
                                          keep_from=int_field(meta, "keep_from"))
            else:
                dropped = self.queue.push(arrays, version, actor_index)
        except QueueFull as exc:
            raise ValueError(str(exc)) from None
        self.messages += 1
        self._drop_stale()
        return dropped

    def saw_version(self, version: int) -> None:
        """A weights version exists (a learner's credit, a heartbeat): older fragments may be stale now."""
        if version > self.known_version:
            self.known_version = version
            self._drop_stale()

    def _drop_stale(self) -> None:
        if self.qspec.max_policy_lag is not None and self.known_version >= 0:
            self.queue.drop_older(self.known_version - self.qspec.max_policy_lag)

    def ready(self) -> bool:
        return len(self.queue) >= self.qspec.fragments_per_batch

    def take(self) -> tuple[dict, dict]:
        """(batch, meta) of the next learner batch: the oldest fragments, fresh arrays."""
        batch = self.queue.take(self.qspec.fragments_per_batch)
        if self.known_version >= 0:
            lag = int(self.known_version - batch["weights_version"].min())
            self.handoff_lag_max = max(self.handoff_lag_max, lag)
        return batch, {"known_version": self.known_version}

    def next_credit(self, actor: str) -> bool:
        """Whether `actor`'s credit is the one to go out now."""
        return self.gate.head(len(self.queue)) == actor

    def metrics(self) -> dict:
        q = self.queue
        return {"queue/fragments": len(q), "queue/capacity": q.capacity, "queue/pushed": q.pushed,
                "queue/taken": q.taken, "queue/dropped_full": q.dropped_full, "queue/dropped_lag": q.dropped_lag,
                "queue/throttled": self.gate.throttled}

    def stats(self) -> dict:
        q = self.queue
        return {"full": q.full, "capacity": q.capacity, "messages": self.messages, "pushed": q.pushed,
                "taken": q.taken, "dropped_full": q.dropped_full, "dropped_lag": q.dropped_lag,
                "left_at_end": len(q), "throttled": self.gate.throttled, "known_version": self.known_version,
                "handoff_lag_max": self.handoff_lag_max}


# --------------------------------------------------------------------------
# Actor side


class ActorCredits:
    """The credits each memory gave this actor; `acquire` spends one, round robin."""

    def __init__(self, memories: int):
        self.credits = [0] * memories
        self.closed = [False] * memories
        self.received = 0
        self._next = 0
        self._changed = asyncio.Event()

    def __repr__(self) -> str:
        return f"<ActorCredits {self.credits} closed={self.closed}>"

    def add(self, m: int, meta: dict) -> None:
        self.credits[m] += int_field(meta, "n", 1, MAX_CREDITS_PER_MESSAGE)
        self.received += 1
        self._changed.set()

    async def read(self, m: int, conn) -> None:
        """Take memory `m`'s credit messages until its connection ends."""
        try:
            async for msg in conn:
                if msg.kind != "credit":
                    raise ValueError(f"unexpected message {msg.kind!r} from memory {m}")
                self.add(m, msg.meta)
        except ConnectionClosed:
            pass
        finally:
            self.closed[m] = True
            self._changed.set()

    async def acquire(self) -> int:
        """A memory to send the next fragment message to (waits for a credit)."""
        count = len(self.credits)
        while True:
            for k in range(count):
                m = (self._next + k) % count
                if self.credits[m] > 0 and not self.closed[m]:
                    self.credits[m] -= 1
                    self._next = m + 1
                    return m
            if all(self.closed):
                raise ConnectionClosed("every memory host closed its connection")
            self._changed.clear()
            await self._changed.wait()


# --------------------------------------------------------------------------
# Learner side


class LagMeter:
    """Policy lag of the fragments a learner trains on, in weights versions."""

    def __init__(self):
        self.batches = 0
        self.fragments = 0
        self.total = 0
        self.max = 0
        self.last_mean = 0.0
        self.last_max = 0

    def add(self, version: int, fragment_versions: np.ndarray) -> None:
        lag = version - np.asarray(fragment_versions, np.int64)
        if len(lag) == 0:
            return
        self.batches += 1
        self.fragments += len(lag)
        self.total += int(lag.sum())
        self.last_mean, self.last_max = float(lag.mean()), int(lag.max())
        self.max = max(self.max, self.last_max)

    def metrics(self) -> dict:
        return {"policy_lag_mean": self.last_mean, "policy_lag_max": float(self.last_max)}

    def stats(self) -> dict:
        return {"batches": self.batches, "fragments": self.fragments,
                "mean": self.total / self.fragments if self.fragments else None, "max": self.max}
