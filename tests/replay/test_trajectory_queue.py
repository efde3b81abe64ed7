"""The trajectory queue (whole fragments, FIFO, bounded, fresh batches), the room it gives the
memory's actor credits, and the memory's fragment hub, without sockets."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aiorl.replay.trajectory_queue import QueueFull, QueueSpec, TrajectoryQueue
from aiorl.runtime.fragments import FragmentHub, LagMeter, QueueRoom
from aiorl.runtime.messages import BadMessage, check

SPEC = {"obs": ((3,), "<f4"), "action": ((), "<i8"), "terminated": ((), "|b1")}
T = 4


def fragments(n, start=0, spec=SPEC):
    """n fragments whose every value encodes (fragment, step): obs[i, t] = 100 * (start + i) + t."""
    code = 100 * (start + np.arange(n))[:, None] + np.arange(T)[None, :]
    return {
        "obs": np.repeat(code[..., None], 3, axis=2).astype(np.float32),
        "action": code.astype(np.int64),
        "terminated": (code % 3 == 0),
    }


def ids(batch):
    return [int(x) // 100 for x in batch["action"][:, 0]]


# Fields a fragment holds once (a recurrent state at its first step): they encode the fragment too.
ONCE = {"state": ((2,), "<f4"), "label": ((), "<i8")}


def with_once(n, start=0):
    """`fragments(n, start)` plus per-fragment fields: state[i] = (id, -id), label[i] = id."""
    code = start + np.arange(n)
    return {**fragments(n, start), "state": np.stack([code, -code], axis=1).astype(np.float32), "label": code}


def assert_aligned(batch, expect_ids):
    """Every field of each fragment of `batch` is that fragment's: per step and per fragment."""
    assert ids(batch) == expect_ids
    n = len(expect_ids)
    code = 100 * np.asarray(expect_ids, np.int64)[:, None] + np.arange(T)[None, :]
    np.testing.assert_array_equal(batch["action"], code.reshape(n, T))
    np.testing.assert_array_equal(batch["obs"][..., 0], code.reshape(n, T))
    np.testing.assert_array_equal(batch["label"], expect_ids)
    np.testing.assert_array_equal(
        batch["state"].reshape(n, 2), np.stack([expect_ids, np.negative(expect_ids)], 1).reshape(n, 2)
    )


def test_fifo_whole_fragments_with_their_origin():
    q = TrajectoryQueue(8, SPEC, T)
    q.push(fragments(3, 0), version=5, actor=1)
    q.push(fragments(2, 3), version=6, actor=0, envs=[4, 7])
    assert len(q) == 5 and q.free == 3
    batch = q.take(4)
    assert ids(batch) == [0, 1, 2, 3]
    np.testing.assert_array_equal(batch["obs"], fragments(4)["obs"])
    np.testing.assert_array_equal(batch["terminated"], fragments(4)["terminated"])
    assert batch["weights_version"].tolist() == [5, 5, 5, 6]
    assert batch["actor"].tolist() == [1, 1, 1, 0] and batch["env"].tolist() == [0, 1, 2, 4]
    assert batch["obs"].shape == (4, T, 3) and batch["obs"].dtype == np.float32
    assert ids(q.take(1)) == [4] and len(q) == 0
    assert (q.pushed, q.taken) == (5, 5)


def test_batches_are_fresh_arrays_not_views_of_storage():
    q = TrajectoryQueue(4, SPEC, T)
    q.push(fragments(4, 0), version=0, actor=0)
    batch = q.take(2)
    copy = {k: v.copy() for k, v in batch.items()}
    for array in batch.values():
        assert array.base is None or not any(np.shares_memory(array, s) for s in q._storage.values())
    # A later insert reuses the freed slots; and the storage is overwritten outright.
    q.push(fragments(2, 10), version=1, actor=1)
    for storage in q._storage.values():
        storage[...] = 1
    for name in copy:
        np.testing.assert_array_equal(batch[name], copy[name])


def test_throttle_refuses_overflow_and_drop_oldest_counts():
    q = TrajectoryQueue(4, SPEC, T, full="throttle")
    q.push(fragments(3), version=0, actor=0)
    with pytest.raises(QueueFull, match="2 fragments pushed with room for 1"):
        q.push(fragments(2, 3), version=0, actor=0)
    assert len(q) == 3 and q.dropped_full == 0  # nothing changed
    q = TrajectoryQueue(4, SPEC, T, full="drop_oldest")
    q.push(fragments(3), version=0, actor=0)
    assert q.push(fragments(3, 3), version=1, actor=0) == 2
    assert q.dropped_full == 2 and ids(q.take(4)) == [2, 3, 4, 5]
    with pytest.raises(QueueFull, match="can never fit"):
        q.push(fragments(5), version=0, actor=0)


def test_drop_older_from_anywhere_frees_room():
    q = TrajectoryQueue(6, SPEC, T)
    for i, version in enumerate([3, 1, 4, 1, 5, 2]):
        q.push(fragments(1, i), version=version, actor=0)
    assert q.drop_older(3) == 3 and q.dropped_lag == 3
    assert q.versions().tolist() == [3, 4, 5] and q.free == 3
    q.push(fragments(3, 6), version=6, actor=0)
    assert ids(q.take(6)) == [0, 2, 4, 6, 7, 8]
    assert q.drop_older(100) == 0


def test_push_is_checked_whole_before_anything_changes():
    q = TrajectoryQueue(8, SPEC, T)
    good = fragments(2)
    for bad, match in [
        ({**good, "obs": good["obs"][:, :3]}, r"'obs': expected shape \(2, 4, 3\)"),
        ({**good, "action": good["action"].astype(np.int32)}, "'action': expected dtype int64"),
        ({**good, "terminated": good["terminated"][:1]}, r"'terminated': expected shape \(2, 4\)"),
        ({k: v for k, v in good.items() if k != "action"}, r"missing \['action'\]"),
        ({**good, "extra": good["action"]}, r"unexpected \['extra'\]"),
    ]:
        with pytest.raises(ValueError, match=match):
            q.push(bad, version=0, actor=0)
    assert len(q) == 0 and q.pushed == 0
    with pytest.raises(ValueError, match="reserved"):
        TrajectoryQueue(2, {**SPEC, "actor": ((), "<i8")}, T)
    with pytest.raises(ValueError, match=r"take\(3\) from a queue holding 0"):
        q.take(3)


def test_per_fragment_fields_are_stored_once_and_checked_like_the_others():
    q = TrajectoryQueue(8, SPEC, T, per_fragment=ONCE)
    assert q._storage["state"].shape == (8, 2) and q._storage["label"].shape == (8,)
    good = with_once(2)
    for bad, match in [
        ({**good, "state": np.repeat(good["state"][:, None], T, axis=1)}, r"'state': expected shape \(2, 2\)"),
        ({**good, "state": good["state"][:1]}, r"'state': expected shape \(2, 2\)"),
        ({**good, "state": good["state"][:, :1]}, r"'state': expected shape \(2, 2\)"),
        ({**good, "state": good["state"].astype(np.float64)}, "'state': expected dtype float32"),
        ({**good, "label": good["label"][:, None]}, r"'label': expected shape \(2,\)"),
        ({**good, "label": np.int64(0)}, "'label': expected dtype int64"),
        ({k: v for k, v in good.items() if k != "state"}, r"missing \['state'\]"),
    ]:
        with pytest.raises(ValueError, match=match):
            q.push(bad, version=0, actor=0)
    assert len(q) == 0 and q.pushed == 0
    q.push(good, version=0, actor=0)
    assert_aligned(q.take(2), [0, 1])
    with pytest.raises(ValueError, match=r"both per step and per fragment"):
        TrajectoryQueue(2, SPEC, T, per_fragment={"obs": ((3,), "<f4")})
    with pytest.raises(ValueError, match="reserved"):
        TrajectoryQueue(2, SPEC, T, per_fragment={"env": ((), "<i8")})


OPS = st.lists(
    st.one_of(
        st.tuples(st.just("push"), st.integers(1, 4), st.integers(0, 6)),
        st.tuples(st.just("drop_older"), st.integers(0, 7)),
        st.tuples(st.just("take"), st.integers(0, 5)),
    ),
    max_size=30,
)


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 6), st.sampled_from(["throttle", "drop_oldest"]), OPS)
def test_per_fragment_fields_stay_with_their_fragment_under_drops_and_takes(capacity, full, ops):
    """Against a plain FIFO of (id, version): pushes (refused or dropping the oldest when full),
    drops by version from anywhere, takes; every batch holds the model's fragments, oldest first,
    each with its own per-step rows and per-fragment fields."""
    q = TrajectoryQueue(capacity, SPEC, T, full, per_fragment=ONCE)
    model: list[tuple[int, int]] = []
    next_id = 0
    for op in ops:
        if op[0] == "push":
            _, n, version = op
            free = capacity - len(model)
            if n > capacity or (full == "throttle" and n > free):
                with pytest.raises(QueueFull):
                    q.push(with_once(n, next_id), version=version, actor=0)
                continue
            assert q.push(with_once(n, next_id), version=version, actor=0) == max(0, n - free)
            model = model[max(0, n - free) :] + [(next_id + i, version) for i in range(n)]
            next_id += n
        elif op[0] == "drop_older":
            kept = [(i, v) for i, v in model if v >= op[1]]
            assert q.drop_older(op[1]) == len(model) - len(kept)
            model = kept
        else:
            k = min(op[1], len(model))
            batch = q.take(k)
            assert_aligned(batch, [i for i, _ in model[:k]])
            assert batch["weights_version"].tolist() == [v for _, v in model[:k]]
            model = model[k:]
        assert len(q) == len(model)
    assert_aligned(q.take(len(model)), [i for i, _ in model])


def test_queue_room_grants_credits_while_the_queue_has_room_for_them():
    q = TrajectoryQueue(8, SPEC, T)
    room = QueueRoom(q, per_message=2, throttle=True)
    granted = 0
    while granted < 10 and room.can_grant():  # (bounded: a room that never fills fails, not hangs)
        room.grant()
        granted += 1
    # 8 fragments of room, 2 per message: four credits.
    assert granted == 4 and room.reserved == 4 and room.throttled == 0
    q.push(fragments(2), version=0, actor=0)
    room.inserted_rows(2 * T, with_credit=True)  # its message is queued now: still no room
    assert room.reserved == 3 and not room.can_grant()
    room.hold()  # an actor out of credits was refused one
    q.take(2)  # a learner took it
    assert room.can_grant()
    room.grant()
    assert room.throttled == 1  # that grant waited for room
    room.release(2)  # an actor went away holding two credits: room for two more
    for _ in range(2):
        assert room.can_grant()
        room.grant()
    assert not room.can_grant() and room.reserved == 4 and room.throttled == 1
    room.inserted_rows(2 * T, with_credit=False)
    assert room.reserved == 4
    free = QueueRoom(TrajectoryQueue(2, SPEC, T, "drop_oldest"), per_message=2, throttle=False)
    for _ in range(5):  # drop_oldest: credits never wait for room
        assert free.can_grant()
        free.grant()


def hub(capacity=8, full="throttle", max_lag=None, per_batch=2, envs=2):
    return FragmentHub(SPEC, T, envs, QueueSpec(capacity, full, max_lag, per_batch))


def test_hub_checks_messages_and_filters_lag():
    with pytest.raises(BadMessage, match=r"fragment.weights_version must be an integer"):
        check("fragment", {"seq": 0, "weights_version": "1"})
    with pytest.raises(BadMessage, match=r"fragment without its 'weights_version' field"):
        check("fragment", {"seq": 0})
    with pytest.raises(BadMessage, match=r"credit.version must be an integer in \[-1"):
        check("credit", {"n": 1, "version": -2})
    h = hub(max_lag=1)
    with pytest.raises(ValueError, match="one fragment per env \\(2\\), got 3"):
        h.ingest(0, 0, fragments(3))
    h.ingest(0, 0, fragments(2))
    h.saw_version(1)
    assert len(h.queue) == 2  # lag 1: kept
    h.saw_version(2)
    assert len(h.queue) == 0 and h.queue.dropped_lag == 2
    h.ingest(0, 0, fragments(2))
    assert len(h.queue) == 0  # stale on arrival
    h.ingest(0, 2, fragments(2, 5))
    assert h.ready()
    batch, meta = h.take()
    assert ids(batch) == [5, 6] and meta == {"known_version": 2}
    assert h.metrics()["queue/dropped_lag"] == 4


def test_lag_meter():
    lag = LagMeter()
    lag.add(5, np.array([5, 3, 4]))
    lag.add(7, np.array([1]))
    assert lag.metrics() == {"policy_lag_mean": 6.0, "policy_lag_max": 6.0}
    assert lag.stats() == {"batches": 2, "fragments": 4, "mean": 2.25, "max": 6}


@pytest.mark.parametrize("full, compression", [("throttle", "none"), ("drop_oldest", "lz4")])
def test_frame_layout_queue_hands_out_exactly_the_naive_batches(full, compression):
    """Two actors' stacked-frame envs, each rollout queued as its fragments both ways: stacks
    per step (TrajectoryQueue) and frames sent once (FrameSender -> FrameTrajectoryQueue).
    Pushes, takes, overflow drops and lag drops interleave; every batch is the same, and once
    everything left and the streams are released the pool holds nothing."""
    from test_replay_frames import Jumbled, env_config

    from aiorl.envs import EnvRunner
    from aiorl.replay.frame_sender import FrameSender
    from aiorl.replay.frames import FrameLayout
    from aiorl.replay.trajectory_queue import FrameTrajectoryQueue

    stack, envs, steps = 3, 2, 5
    frame_spec = {
        "obs": ((stack, 1, 2), "|u1"),
        "next_obs": ((stack, 1, 2), "|u1"),
        "reward": ((), "<f4"),
        "terminated": ((), "|b1"),
        "truncated": ((), "|b1"),
    }
    layout = FrameLayout.for_spec(frame_spec, ("obs", "next_obs"), envs, steps, 0)
    capacity = 6 if full == "drop_oldest" else 64
    once = {"state": ((2,), "<f4")}  # a field each fragment holds once rides beside the frames
    naive_q = TrajectoryQueue(capacity, frame_spec, steps, full, per_fragment=once)
    frame_q = FrameTrajectoryQueue(capacity, frame_spec, steps, layout, full, max_streams=2, per_fragment=once)
    actors = []
    for a in range(2):
        sender = FrameSender(layout, envs, 1, 0, compression)
        runners = [
            EnvRunner(env_config(stack, True), envs, seed=10 + a),
            EnvRunner(env_config(stack, True), envs, seed=10 + a, frames=sender),
        ]
        for runner in runners:
            runner.envs.envs = [Jumbled(env) for env in runner.envs.envs]
            for i, env in enumerate(runner.envs.envs):
                env.np_random = np.random.default_rng(a * 7 + i)
        actors.append((sender, runners, frame_q.stream(), np.random.default_rng(a)))
    rng = np.random.default_rng(0)

    def fragments_of(rollout):
        return {name: np.ascontiguousarray(np.swapaxes(rollout[name], 0, 1)) for name in frame_spec}

    version = 0
    for round_ in range(40):
        a = int(rng.integers(2))
        sender, (naive, framed), stream, actions = actors[a]
        act = actions.integers(0, 2, (steps, envs))
        it = iter(act)
        plain = fragments_of(naive.rollout(lambda obs: next(it), steps))
        it = iter(act)
        ids = fragments_of(framed.rollout(lambda obs: next(it), steps))
        if full == "throttle" and naive_q.free < envs:
            naive_q.take(envs), frame_q.take(envs)
        state = np.stack([np.full(envs, round_), np.arange(envs)], axis=1).astype(np.float32)
        plain["state"] = state
        arrays, keep_from = sender.message(0, ids)
        arrays["state"] = state
        assert naive_q.push(plain, version, a) == frame_q.push(arrays, version, a, stream=stream, keep_from=keep_from)
        if round_ % 7 == 3:
            version += 2
            assert naive_q.drop_older(version - 1) == frame_q.drop_older(version - 1)
        n = int(rng.integers(0, len(naive_q) + 1))
        got, want = frame_q.take(n), naive_q.take(n)
        assert set(got) == set(want)
        for name in want:
            np.testing.assert_array_equal(got[name], want[name], err_msg=name)
        assert got["obs"].shape == (n, steps, stack, 1, 2) and got["obs"].dtype == np.uint8
        assert got["state"].shape == (n, 2)
    assert naive_q.dropped_lag > 0 and (full == "throttle" or naive_q.dropped_full > 0)
    frame_q.take(len(frame_q))
    for _sender, _runners, stream, _ in actors:
        stream.release()
    assert len(frame_q.pool) == 0
