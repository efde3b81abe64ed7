"""The compiled frame store (FramePool, FrameStream) against its numpy oracle, and its edges."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aiorl._ext import framestore
from aiorl.replay import FramePool, FrameStream, reference


def test_the_compiled_module_is_what_replay_exports():
    assert FramePool is framestore.FramePool and framestore.__file__.endswith((".so", ".pyd"))


def frames_of(values, shape=(2, 3), dtype=np.uint8):
    return np.stack([np.full(shape, v, dtype) for v in values]) if len(values) else np.zeros((0,) + shape, dtype)


def test_slots_are_reused_last_freed_first_and_counts_free_them():
    pool = FramePool((2, 3), "uint8", max_frames=16, run_frames=1)
    slots = pool.add(frames_of([1, 2, 3]))
    assert slots.tolist() == [0, 1, 2] and len(pool) == 3
    pool.incref([0, 0])
    pool.decref([0, 1, 2])
    assert len(pool) == 1 and pool.refcount([0, 1, 2]).tolist() == [2, 0, 0] and pool.free_runs == 2
    # LIFO: slot 2 was freed last, then 1... (decref went 0, 1, 2: 1 then 2 hit zero)
    assert pool.add(frames_of([7, 8, 9])).tolist() == [2, 1, 3]
    assert pool.take(np.array([[2, 1], [3, 0]]))[:, :, 0, 0].tolist() == [[7, 8], [9, 1]]


def test_a_frame_goes_after_its_predecessor_so_streams_stay_contiguous():
    pool = FramePool((1,), "uint8", max_frames=64, run_frames=4)
    # Two streams interleaved (a0 b0 a1 b1 ...): a0, b0 share the tail run; a1 cannot follow a0
    # there (b0 took the slot) and opens a run of its own; b1 follows b0.
    a0, b0 = pool.add(frames_of([10, 20], (1,)))
    a1, b1 = pool.add(frames_of([11, 21], (1,)), after=[a0, b0])
    assert [a0, b0, a1, b1] == [0, 1, 4, 2]
    a2, a3, b2 = pool.add(frames_of([12, 13, 22], (1,)), after=[a1, -2, b1])  # a3 after a2 (frame 0 here)
    assert [a2, a3, b2] == [5, 6, 3]
    b3 = pool.add(frames_of([23], (1,)), after=[b2])[0]  # run 0 is full: a run of its own
    assert b3 == 8 and pool.slots == 12
    # A run is freed once all its frames are, and reused first, from its start.
    pool.decref([a0, b0, b1])
    assert pool.free_runs == 0
    pool.decref([b2])
    assert pool.free_runs == 1 and pool.add(frames_of([30], (1,)))[0] == 0
    with pytest.raises(ValueError, match="after must have one entry per frame"):
        pool.add(frames_of([1], (1,)), after=[-2])  # the frame before the first one of the call


def test_gather_rebuilds_stacks_from_a_table():
    pool = FramePool((2, 2), "int16", max_frames=8)
    pool.add(frames_of([10, 11, 12], (2, 2), np.int16))
    table = np.array([[0, 1], [1, 2], [2, 2]], np.int64)
    other = table[::-1].copy()
    out, out2 = pool.gather([table, other], np.array([2, 0, 2]))
    assert out.shape == (3, 2, 2, 2) and out.dtype == np.int16
    assert out[:, :, 0, 0].tolist() == [[12, 12], [10, 11], [12, 12]]
    assert out2[:, :, 0, 0].tolist() == [[10, 11], [12, 12], [10, 11]]
    dest = np.empty_like(out)
    assert pool.gather([table], np.array([2, 0, 2]), [dest])[0] is dest and np.array_equal(dest, out)
    with pytest.raises(ValueError, match="out of range"):
        pool.gather([table], np.array([3]))
    with pytest.raises(ValueError, match="never opened"):
        pool.gather([np.array([[5000, 0]])], np.array([0]))
    with pytest.raises(ValueError, match="of one shape"):
        pool.gather([table, table[:2]], np.array([0]))


def test_errors_name_the_problem_and_change_nothing():
    pool = FramePool((2, 3), "uint8", max_frames=2)
    with pytest.raises(ValueError, match=r"expected frames \(n, 2, 3\) uint8"):
        pool.add(np.zeros((1, 3, 2), np.uint8))
    pool.add(frames_of([1]))
    with pytest.raises(ValueError, match="not live"):
        pool.incref([0, 1])
    assert pool.refcount([0]).tolist() == [1]
    with pytest.raises(MemoryError, match="do not fit"):
        pool.add(frames_of([2, 3]))
    assert len(pool) == 1
    with pytest.raises(ValueError, match="below zero"):
        pool.decref([0, 0])


@pytest.mark.parametrize("block", [1, 2, 8])
def test_blocks_open_as_the_pool_grows(block):
    pool = FramePool((3,), "float32", max_frames=9, block_frames=block, run_frames=1)
    slots = pool.add(np.arange(27, dtype=np.float32).reshape(9, 3))
    assert slots.tolist() == list(range(9)) and pool.block_frames == block
    assert 9 * 12 <= pool.allocated_bytes <= (10 + block) * 12  # blocks for the runs this add could open
    assert np.array_equal(pool.take(slots[::-1]), np.arange(27, dtype=np.float32).reshape(9, 3)[::-1])


def test_stream_holds_ids_until_keep_from_passes_them():
    pool = FramePool((2, 3), "uint8", max_frames=32)
    stream = FrameStream(pool, 4)
    stream.check(frames_of([0, 1]), [0, 1], [0, 1, 1], 0)
    assert stream.admit(frames_of([0, 1]), [0, 1], [0, 1, 1], 0).tolist() == [0, 1, 1]
    assert stream.held == 2 and stream.holds(1) and not stream.holds(2)
    # id 4 lands where id 0 is held (4 mod 4): only legal once keep_from passed 0.
    with pytest.raises(ValueError, match="would displace held id 0"):
        stream.check(frames_of([4]), [4], [4], 0)
    stream.check(frames_of([4]), [4], [1, 4], 1)
    assert stream.admit(frames_of([4]), [4], [1, 4], 1).tolist() == [1, 2]  # the tail run's next slot
    assert stream.held == 2 and stream.keep_from == 1
    for frames, ids, refs, keep, match in [
        (frames_of([5]), [5], [5], 0, "never decreases"),
        (frames_of([1]), [1], [1], 1, "already held"),
        (frames_of([9]), [9], [9], 1, "would displace held id 1"),
        (frames_of([]), [], [3], 1, "neither held nor sent"),
        (frames_of([]), [], [1], 2, "below keep_from"),
        (frames_of([6, 5]), [6, 5], [5], 1, "strictly increasing"),
        (frames_of([5, 9]), [5, 9], [5], 5, "span more than the window"),
        (frames_of([5]), [5, 6], [5], 1, "frames: expected"),
    ]:
        with pytest.raises(ValueError, match=match):
            stream.check(frames, ids, refs, keep)
    assert stream.held == 2 and stream.keep_from == 1 and len(pool) == 2
    stream.release()
    assert stream.held == 0 and len(pool) == 0


@st.composite
def operations(draw):
    """A random life of a pool with two streams: messages, row references taken and dropped."""
    window = draw(st.sampled_from([1, 2, 4, 8]))
    ops, next_id, keep = [], [0, 0], [0, 0]
    for _ in range(draw(st.integers(1, 30))):
        s = draw(st.integers(0, 1))
        kind = draw(st.sampled_from(["message", "message", "rows", "drop", "release"]))
        if kind == "message":
            keep[s] = min(next_id[s], keep[s] + draw(st.integers(0, 3)))
            count = draw(st.integers(0, 3))
            # Mostly fresh ids above keep_from, sometimes a stale or repeated one (both must fail alike).
            ids = list(range(next_id[s], next_id[s] + count))
            if draw(st.booleans()) and next_id[s] > 0:
                ids = [draw(st.integers(max(0, next_id[s] - 3), next_id[s] + 2))] + ids
            next_id[s] += count
            refs = draw(st.lists(st.integers(keep[s], max(keep[s], next_id[s] + 1)), max_size=4))
            ops.append(
                (
                    "message",
                    s,
                    ids,
                    refs,
                    keep[s] - draw(st.integers(0, 1)) * draw(st.booleans()),
                    draw(st.integers(0, 255)),
                )
            )
        else:
            ops.append((kind, s, draw(st.integers(0, 10**6))))
    return window, ops


@settings(max_examples=150, deadline=None)
@given(operations(), st.sampled_from([1, 2, 3, 64]), st.sampled_from([1, 2, 16]), st.integers(1, 3))
def test_compiled_store_matches_the_oracle(case, max_frames, run_frames, stack):
    window, ops = case
    pools = [
        FramePool((1, 2), "uint8", max_frames, block_frames=2, run_frames=run_frames),
        reference.FramePool((1, 2), "uint8", max_frames, block_frames=2, run_frames=run_frames),
    ]
    streams = [
        [FrameStream(pools[0], window, stack) for _ in range(2)],
        [reference.FrameStream(pools[1], window, stack) for _ in range(2)],
    ]
    rows = [[], []]  # slot references each side took, as rows of a replay would
    for op in ops:
        outcomes = []
        for side in range(2):
            pool, stream = pools[side], streams[side][op[1]]
            try:
                if op[0] == "message":
                    _, _, ids, refs, keep, value = op
                    frames = np.full((len(ids), 1, 2), value, np.uint8)
                    stream.check(frames, ids, refs, keep)
                    slots = stream.admit(frames, ids, refs, keep)
                    pool.incref(slots)
                    rows[side].append(slots)
                    outcomes.append(("ok", slots.tolist()))
                elif op[0] == "drop" and rows[side]:
                    pool.decref(rows[side].pop(op[2] % len(rows[side])))
                    outcomes.append("dropped")
                elif op[0] == "release":
                    stream.release()
                    outcomes.append("released")
                else:
                    outcomes.append("nothing")
            except (ValueError, MemoryError) as exc:
                outcomes.append(type(exc).__name__)
        assert outcomes[0] == outcomes[1], op
        assert len(pools[0]) == len(pools[1]) and pools[0].free_runs == pools[1].free_runs
        assert [s.held for s in streams[0]] == [s.held for s in streams[1]]
    opened = np.arange(pools[1].slots)
    assert np.array_equal(pools[0].refcount(opened), pools[1].refcount(opened))
    live = opened[pools[1].refcount(opened) > 0]
    assert np.array_equal(pools[0].take(live), pools[1].take(live))
    for r in rows[0]:
        table = r.reshape(-1, 1)
        assert np.array_equal(
            pools[0].gather([table, table], np.arange(r.size)), pools[1].gather([table, table], np.arange(r.size))
        )
