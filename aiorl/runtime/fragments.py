"""The fragment flow of asynchronous on-policy algorithms (IMPALA), in pieces the roles own.

    actor --fragment (one per env, one weights version)--> memory: TrajectoryQueue
          <--credit------------------------------------
    memory --samples (whole fragments, fresh arrays)--> learner
           <--credit (with the learner's weights version)--

- `QueueRoom` (memory): the trajectory queue's side of the memory host's actor
  credits, the mechanism the samples-per-insert limiter drives
  (`aiorl.runtime.ratelimit`, `aiorl.runtime.memory.flow`): an actor
  sends a fragment message only against a credit, each actor holds up to
  ``cluster.actor_credits``, and a credit goes out only when the room says so. Under
  ``throttle`` that is while the queue has room for what every outstanding
  credit may bring, so the queue never overflows and actors wait (Reverb's
  rate limiter blocks the writer the same way); under ``drop_oldest`` always,
  and a full queue drops its oldest fragments.
- `FragmentHub` (memory): the queue, its room, and the newest weights
  version the memory knows of (from learners' credits); fragments more than
  ``max_policy_lag`` versions older are dropped, counted.
- `LagMeter` (learner): policy lag per batch, the learner's weights version
  minus each fragment's.

Message fields are checked by `aiorl.runtime.messages` where they arrive; a
fragment message that breaks the queue's rules raises ValueError here, which
the memory host turns into a protocol error of that one connection.
"""

from __future__ import annotations

import numpy as np

from aiorl.replay.trajectory_queue import FrameTrajectoryQueue, QueueFull, QueueSpec, TrajectoryQueue
from aiorl.runtime.ratelimit import ACTOR_CREDITS

# --------------------------------------------------------------------------
# Memory side


class QueueRoom:
    """Whether one more actor credit (one fragment message: `per_message` fragments) may go out.

    The interface of `aiorl.runtime.ratelimit.SampleToInsertRatio` as the memory host uses it:
    `can_grant`, `grant`, `release`, `inserted_rows`, `sampled_rows`."""

    def __init__(self, queue: TrajectoryQueue, per_message: int, throttle: bool, actor_credits: int = ACTOR_CREDITS):
        self.queue, self.per_message, self.throttle = queue, per_message, throttle
        self.actor_credits = actor_credits  # per actor; the queue's room bounds them all together
        self.reserved = 0  # credits granted and not yet used
        self.throttled = 0  # grants that waited for room
        self._blocked = False

    def __repr__(self) -> str:
        return f"<QueueRoom queued={len(self.queue)} reserved={self.reserved} throttled={self.throttled}>"

    def can_grant(self) -> bool:
        return not self.throttle or len(self.queue) + (self.reserved + 1) * self.per_message <= self.queue.capacity

    def hold(self) -> None:
        """An actor out of credits was refused one for want of room: its next grant counts as throttled
        (credits run deeper than the room, so a refusal alone says nothing: the actor may hold several)."""
        self._blocked = True

    def grant(self) -> None:
        self.reserved += 1
        if self._blocked:
            self.throttled += 1
            self._blocked = False

    def release(self, credits: int = 1) -> None:
        """Credits that will not bring a message after all (their actor went away)."""
        self.reserved = max(0, self.reserved - credits)

    def inserted_rows(self, rows: int, with_credit: bool) -> None:
        if with_credit:
            self.release()

    def sampled_rows(self, rows: int) -> None:
        pass  # the room a batch frees is read off the queue


class FragmentHub:
    """One memory host's trajectory queue, actor credits and policy-lag filter.

    `spec`: the fields of each step; `per_fragment`: those each fragment holds once
    (`Algorithm.per_fragment_spec`).

    With a frame layout (`aiorl.replay.frames`), observations arrive as frame ids, each
    frame once per actor connection (`join` gives the connection its frame stream).
    """

    def __init__(
        self,
        spec: dict,
        steps: int,
        num_envs: int,
        qspec: QueueSpec,
        layout=None,
        actors: int = 1,
        actor_credits: int = ACTOR_CREDITS,
        per_fragment: dict | None = None,
    ):
        self.qspec = qspec
        self.num_envs = num_envs
        if layout is None:
            self.queue = TrajectoryQueue(qspec.capacity, spec, steps, qspec.full, per_fragment)
        else:
            # Each actor connection's frame stream; room for restarted actors' lingering ones.
            self.queue = FrameTrajectoryQueue(
                qspec.capacity, spec, steps, layout, qspec.full, max_streams=2 * actors, per_fragment=per_fragment
            )
        self.room = QueueRoom(self.queue, num_envs, qspec.full == "throttle", actor_credits)
        self.known_version = -1  # newest weights version heard of
        self.messages = 0
        self.handoff_lag_max = 0  # worst policy lag a batch was handed out with (known version - fragment's)

    def __repr__(self) -> str:
        return f"<FragmentHub {self.queue!r} {self.room!r} known_version={self.known_version}>"

    def stream(self):
        """A new actor connection's frame stream (frame ids start over with it); None without frames."""
        return self.queue.stream() if isinstance(self.queue, FrameTrajectoryQueue) else None

    def ingest(
        self,
        actor_index: int,
        version: int,
        arrays: dict,
        stream=None,
        keep_from: int | None = None,
        values=None,
        drop_all: bool = False,
    ) -> tuple[int, list[str]]:
        """A fragment message (its credit checked by the caller): one fragment per env, checked
        whole, then queued but for the fragments holding a value `values` refuses (a `RowSpec`'s
        `bad_rows`), or all of them with `drop_all`. Returns how many were left out, and the
        fields `values` refused. Frames are kept whatever is left out: the actor's later
        messages lean on them."""
        frame_keys = ("frames", "frames_lz4", "frame_ids")
        frames = isinstance(self.queue, FrameTrajectoryQueue)
        rows = {k: v for k, v in arrays.items() if k not in frame_keys} if frames else arrays
        n = self.queue.check(rows)
        if n != self.num_envs:
            raise ValueError(f"a fragment message holds one fragment per env ({self.num_envs}), got {n}")
        if drop_all:
            bad, fields = np.ones(n, np.bool_), []
        else:
            bad, fields = (values.bad_rows(rows) if values is not None else None) or (None, [])
        envs = None
        if bad is not None:
            envs = np.flatnonzero(~bad)
            arrays = {k: v if k in frame_keys else v[envs] for k, v in arrays.items()}
        try:
            if frames:
                if keep_from is None:
                    raise ValueError("fragment without its 'keep_from' field (the frame layout needs it)")
                self.queue.push(arrays, version, actor_index, envs, stream=stream, keep_from=keep_from)
            else:
                self.queue.push(arrays, version, actor_index, envs)
        except QueueFull as exc:
            raise ValueError(str(exc)) from None
        self.messages += 1
        self._drop_stale()
        return (0 if bad is None else int(bad.sum())), fields

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

    def metrics(self) -> dict:
        q = self.queue
        return {
            "queue/fragments": len(q),
            "queue/capacity": q.capacity,
            "queue/pushed": q.pushed,
            "queue/taken": q.taken,
            "queue/dropped_full": q.dropped_full,
            "queue/dropped_lag": q.dropped_lag,
            "queue/throttled": self.room.throttled,
        }

    def stats(self) -> dict:
        q = self.queue
        return {
            "full": q.full,
            "capacity": q.capacity,
            "messages": self.messages,
            "pushed": q.pushed,
            "taken": q.taken,
            "dropped_full": q.dropped_full,
            "dropped_lag": q.dropped_lag,
            "left_at_end": len(q),
            "throttled": self.room.throttled,
            "known_version": self.known_version,
            "handoff_lag_max": self.handoff_lag_max,
        }


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
        return {
            "batches": self.batches,
            "fragments": self.fragments,
            "mean": self.total / self.fragments if self.fragments else None,
            "max": self.max,
        }
