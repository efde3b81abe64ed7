"""ReplayBuffer (uniform) and the batch validation every buffer shares."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aiorl.replay import PrioritizedReplayBuffer, ReplayBuffer, reference

SPEC = {"obs": ((2, 3), "uint8"), "action": ((), "int64"), "reward": ((), "float32"), "done": ((), "bool")}


def make_batch(n, start=0):
    rows = np.arange(start, start + n)
    return {
        "obs": (rows[:, None, None] + np.zeros((1, 2, 3), int)).astype(np.uint8) % 251,
        "action": rows.astype(np.int64),
        "reward": rows.astype(np.float32) / 2,
        "done": rows % 3 == 0,
    }


def test_storage_keeps_each_fields_dtype_and_sample_copies():
    buf = ReplayBuffer(8, SPEC, seed=0)
    assert buf.add(make_batch(5)).tolist() == [0, 1, 2, 3, 4]
    assert len(buf) == 5 and buf.capacity == 8
    out = buf.sample(64)
    assert set(out) == set(SPEC) | {"indices"}
    assert out["obs"].dtype == np.uint8 and out["obs"].shape == (64, 2, 3)
    assert out["action"].dtype == np.int64 and out["done"].dtype == np.bool_
    assert out["indices"].dtype == np.int64
    # Rows are consistent with the slot they came from (row i has action i here).
    assert np.array_equal(out["action"], out["indices"])
    assert np.array_equal(out["obs"][:, 0, 0], out["indices"].astype(np.uint8))
    # Copies, not views: scribbling on a sample leaves the buffer alone.
    stored = buf.state_dict()["field.obs"]
    assert not np.shares_memory(out["obs"], stored)
    out["obs"][:] = 99
    assert buf.state_dict()["field.obs"][:, 0, 0].tolist() == [0, 1, 2, 3, 4]


def test_every_stored_slot_can_be_sampled_and_no_other():
    buf = ReplayBuffer(10, SPEC, seed=1)
    buf.add(make_batch(7))
    drawn = buf.sample(2000)["indices"]
    assert set(drawn.tolist()) == set(range(7))


@pytest.mark.parametrize("capacity", [1, 8, 64])
def test_power_of_two_and_one_filled_exactly_then_wrapped(capacity):
    buf = ReplayBuffer(capacity, SPEC, seed=2)
    assert buf.add(make_batch(capacity)).tolist() == list(range(capacity))
    assert len(buf) == capacity
    assert set(buf.sample(50 * capacity)["indices"].tolist()) == set(range(capacity))
    # Wrap: the next rows overwrite the oldest slots, in order.
    k = max(1, capacity // 2)
    assert buf.add(make_batch(k, start=100)).tolist() == list(range(k))
    assert len(buf) == capacity
    actions = buf.state_dict()["field.action"]
    assert actions[:k].tolist() == list(range(100, 100 + k))
    assert actions[k:].tolist() == list(range(k, capacity))


def test_wrapping_batch_splits_across_the_end():
    buf = ReplayBuffer(5, SPEC, seed=0)
    buf.add(make_batch(3))
    assert buf.add(make_batch(4, start=10)).tolist() == [3, 4, 0, 1]
    assert buf.state_dict()["field.action"].tolist() == [12, 13, 2, 10, 11]
    assert buf.added == 7


def test_single_element_batches():
    buf = ReplayBuffer(3, SPEC, seed=0)
    for i in range(5):
        assert buf.add(make_batch(1, start=i)).tolist() == [i % 3]
    assert buf.state_dict()["field.action"].tolist() == [3, 4, 2]
    one = buf.sample(1)
    assert one["obs"].shape == (1, 2, 3)


def test_empty_batch_is_a_no_op():
    buf = ReplayBuffer(3, SPEC, seed=0)
    assert buf.add(make_batch(0)).tolist() == []
    assert len(buf) == 0


def test_same_kind_casts_are_accepted():
    buf = ReplayBuffer(4, {"x": ((2,), "float32"), "a": ((), "int32")}, seed=0)
    buf.add({"x": np.ones((2, 2), np.float64), "a": np.array([1, 2], np.int64)})
    out = buf.sample(4)
    assert out["x"].dtype == np.float32 and out["a"].dtype == np.int32
    # Python lists and non-contiguous arrays work too.
    buf.add({"x": np.ones((2, 4), np.float32)[:, ::2], "a": [3, 4]})
    assert len(buf) == 4


BAD_BATCHES = [
    (lambda b: b.pop("reward"), r"missing fields \['reward'\]"),
    (lambda b: b.update(extra=np.zeros(4)), r"unexpected fields \['extra'\]"),
    (
        lambda b: b.update(obs=np.zeros((4, 3, 2), np.uint8)),
        r"field 'obs': expected shape \(n, 2, 3\) uint8, got shape \(4, 3, 2\) uint8",
    ),
    (
        lambda b: b.update(obs=np.zeros((4, 2, 3), np.float32)),
        r"field 'obs': expected \(n, 2, 3\) uint8 \(or a dtype that casts to it same_kind\), got \(4, 2, 3\) float32",
    ),
    (lambda b: b.update(action=np.zeros(4, np.float64)), r"field 'action'.*got \(4,\) float64"),
    (lambda b: b.update(action=np.zeros(3, np.int64)), r"field 'action' has 3 rows but field 'obs' has 4"),
    (
        lambda b: b.update(reward=np.float32(1.0)),
        r"field 'reward': expected shape \(n,\) float32, got shape \(\) float32",
    ),
]


@pytest.mark.parametrize("mutate, message", BAD_BATCHES)
@pytest.mark.parametrize("cls", [ReplayBuffer, PrioritizedReplayBuffer])
def test_bad_batches_name_the_field_and_write_nothing(cls, mutate, message):
    buf = ReplayBuffer(8, SPEC) if cls is ReplayBuffer else PrioritizedReplayBuffer(8, SPEC, alpha=0.6)
    buf.add(make_batch(2))
    batch = make_batch(4)
    mutate(batch)
    with pytest.raises(ValueError, match=message):
        buf.add(batch)
    assert len(buf) == 2 and buf.added == 2


def test_batch_larger_than_capacity_and_non_dict():
    buf = ReplayBuffer(3, SPEC)
    with pytest.raises(ValueError, match="batch of 4 rows is larger than the capacity 3"):
        buf.add(make_batch(4))
    with pytest.raises(ValueError, match="expected a dict of arrays, got list"):
        buf.add([1, 2])
    with pytest.raises(ValueError, match="the buffer is empty"):
        buf.sample(1)
    buf.add(make_batch(1))
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        buf.sample(0)


@pytest.mark.parametrize(
    "spec, message",
    [
        ({}, "spec must be a non-empty dict"),
        ({"obs": ((4,), "object")}, r"spec\['obs'\] dtype must be bool or numeric, got object"),
        ({"obs": ((0,), "float32")}, r"spec\['obs'\] must be \(shape tuple of positive ints, dtype\)"),
        ({"obs": (4, "float32")}, r"spec\['obs'\] must be \(shape tuple"),
        ({"indices": ((), "int64")}, "clashes with a key sample"),
        ({"obs": ((4,), "not-a-dtype")}, r"spec\['obs'\] must be"),
    ],
)
def test_bad_specs(spec, message):
    with pytest.raises(ValueError, match=message):
        ReplayBuffer(4, spec)
    with pytest.raises(ValueError, match="capacity must be >= 1"):
        ReplayBuffer(0, SPEC)


@settings(max_examples=40, deadline=None)
@given(
    capacity=st.one_of(st.sampled_from([1, 2, 8, 64]), st.integers(1, 300)),
    chunks=st.lists(st.integers(0, 300), min_size=1, max_size=8),
    seed=st.integers(0, 2**32 - 1),
)
def test_matches_reference(capacity, chunks, seed):
    buf, oracle = ReplayBuffer(capacity, SPEC, seed=seed), reference.ReplayBuffer(capacity, SPEC, seed=seed)
    start = 0
    for n in chunks:
        n = min(n, capacity)
        batch = make_batch(n, start)
        start += n
        assert np.array_equal(buf.add(batch), oracle.add(batch))
        if len(buf):
            got, want = buf.sample(33), oracle.sample(33)
            for key in want:
                assert np.array_equal(got[key], want[key]), key


def test_snapshot_round_trip(tmp_path):
    buf = ReplayBuffer(6, SPEC, seed=3)
    buf.add(make_batch(4))
    buf.add(make_batch(4, start=50))  # wrapped: slots hold rows 52, 53, 2, 3, 50, 51
    path = tmp_path / "uniform.npz"
    buf.save(path)
    restored = ReplayBuffer(6, SPEC, seed=99)
    restored.load(path)
    assert len(restored) == 6 and restored.added == 8
    for key, value in buf.state_dict().items():
        assert np.array_equal(restored.state_dict()[key], value), key
    # The rng state travels too: both continue with the same draws, and the ring with the same slot.
    a, b = buf.sample(20), restored.sample(20)
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert buf.add(make_batch(1)).tolist() == restored.add(make_batch(1)).tolist() == [2]
    # Plain npz arrays: readable without pickle.
    with np.load(path, allow_pickle=False) as npz:
        assert sorted(npz.files) == sorted(buf.state_dict()) and npz["field.obs"].dtype == np.uint8


def test_snapshot_mismatch_is_rejected(tmp_path):
    buf = ReplayBuffer(6, SPEC, seed=3)
    buf.add(make_batch(3))
    state = dict(buf.state_dict())
    with pytest.raises(ValueError, match="snapshot capacity is 6, this buffer has 7"):
        ReplayBuffer(7, SPEC).load_state_dict(state)
    other_spec = dict(SPEC, reward=((), "float64"))
    with pytest.raises(ValueError, match="snapshot spec is"):
        ReplayBuffer(6, other_spec).load_state_dict(state)
    with pytest.raises(ValueError, match="snapshot kind is 'ReplayBuffer', this buffer has 'PrioritizedReplayBuffer'"):
        PrioritizedReplayBuffer(6, SPEC, alpha=0.5).load_state_dict(state)
    state["field.obs"] = state["field.obs"][:2]
    with pytest.raises(ValueError, match=r"snapshot 'field.obs': expected \(3, 2, 3\) uint8, got \(2, 2, 3\) uint8"):
        ReplayBuffer(6, SPEC).load_state_dict(state)
    with pytest.raises(ValueError, match="'meta'"):
        ReplayBuffer(6, SPEC).load_state_dict({})
    target = ReplayBuffer(6, SPEC)
    target.add(make_batch(1))
    with pytest.raises(ValueError):
        target.load_state_dict(state)
    assert len(target) == 1, "a rejected snapshot leaves the buffer as it was"


@pytest.mark.parametrize("cls", [ReplayBuffer, PrioritizedReplayBuffer])
def test_large_sampled_fields_reuse_memory_only_once_released(cls):
    """Fields of 1 MiB or more per sample are written into recycled memory: never while
    any view of an earlier batch is alive, and the rows are the stored ones."""
    spec = {"frame": ((4096,), "uint8"), "action": ((), "int64")}
    buf = cls(64, spec, 0.6, seed=0) if cls is PrioritizedReplayBuffer else cls(64, spec, seed=0)
    rows = np.arange(64)
    buf.add({"frame": (rows[:, None] * 7 + np.arange(4096)).astype(np.uint8), "action": rows})
    sample = (lambda: buf.sample(300, 0.4)) if cls is PrioritizedReplayBuffer else (lambda: buf.sample(300))

    first = sample()
    kept = first["frame"].copy()
    first_ptr = first["frame"].ctypes.data
    second = sample()
    assert second["frame"].ctypes.data != first_ptr
    assert np.array_equal(first["frame"], kept)  # the second sample did not write over it
    for out in (first, second):
        expected = (out["indices"][:, None] * 7 + np.arange(4096)).astype(np.uint8)
        assert np.array_equal(out["frame"], expected)

    del first
    third = sample()  # the first batch's memory is free again: reused
    assert third["frame"].ctypes.data == first_ptr
    view = third["frame"][10:20]  # a view keeps the memory in use
    view_rows = view.copy()
    del third
    fourth = sample()
    assert fourth["frame"].ctypes.data not in (first_ptr, second["frame"].ctypes.data)
    assert np.array_equal(view, view_rows)
