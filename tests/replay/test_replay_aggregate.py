"""AggregateBuffer: exactly one part per producer per round, handed out in producer-id order."""

import numpy as np
import pytest

from aiorl.replay import AggregateBuffer

SPEC = {"obs": ((2,), "uint8"), "reward": ((), "float32")}


def part(producer, n):
    return {"obs": np.full((n, 2), producer, np.uint8), "reward": np.full(n, producer, np.float32)}


def test_round_collects_one_part_per_producer_in_id_order():
    agg = AggregateBuffer(3, SPEC)
    agg.add(2, part(2, 1))
    agg.add(0, part(0, 2))
    assert not agg.complete and agg.missing == [1] and agg.received == [0, 2] and len(agg) == 3
    with pytest.raises(ValueError, match=r"round incomplete: missing producers \[1\]"):
        agg.take()
    agg.add(1, part(1, 3))
    assert agg.complete
    out = agg.take()
    assert out["obs"].dtype == np.uint8 and out["obs"][:, 0].tolist() == [0, 0, 1, 1, 1, 2]
    assert out["reward"].tolist() == [0, 0, 1, 1, 1, 2]
    # The next round starts empty.
    assert not agg.complete and agg.missing == [0, 1, 2] and len(agg) == 0


def test_parts_are_copied_and_the_aggregate_is_fresh():
    agg = AggregateBuffer(1, SPEC)
    given = part(0, 2)
    agg.add(0, given)
    given["obs"][:] = 9  # the caller reuses its buffer
    out = agg.take()
    assert out["obs"].tolist() == [[0, 0], [0, 0]]
    assert not np.shares_memory(out["obs"], given["obs"])


def test_second_part_in_a_round_and_bad_ids_are_rejected():
    agg = AggregateBuffer(2, SPEC)
    agg.add(1, part(1, 1))
    with pytest.raises(ValueError, match="producer 1 already delivered its part this round"):
        agg.add(1, part(1, 1))
    with pytest.raises(ValueError, match=r"producer id 2 is out of range \[0, 2\)"):
        agg.add(2, part(2, 1))
    with pytest.raises(ValueError, match=r"producer id -1 is out of range"):
        agg.add(-1, part(0, 1))
    with pytest.raises(ValueError, match=r"\(producer 0\): field 'obs': expected shape \(n, 2\) uint8"):
        agg.add(0, {"obs": np.zeros((1, 3), np.uint8), "reward": np.zeros(1, np.float32)})
    assert agg.received == [1]


def test_dropped_producer_is_not_waited_for():
    agg = AggregateBuffer(3, SPEC)
    agg.add(0, part(0, 1))
    agg.add(1, part(1, 1))
    agg.drop(1)  # died after delivering: its part is kept
    agg.drop(2)  # died before delivering
    assert agg.complete and agg.live == [0]
    assert agg.take()["reward"].tolist() == [0, 1]
    with pytest.raises(ValueError, match="producer 2 was dropped"):
        agg.add(2, part(2, 1))
    agg.revive(2)
    agg.add(0, part(0, 1))
    assert agg.missing == [2]
    agg.drop(0)
    agg.drop(2)
    # Everyone dropped: the part already here is the whole round.
    assert agg.complete and agg.take()["reward"].tolist() == [0]
    # An empty round with nobody left to deliver is never complete.
    assert not agg.complete and agg.missing == []
    with pytest.raises(ValueError, match="round incomplete"):
        agg.take()


def test_snapshot_round_trip(tmp_path):
    agg = AggregateBuffer(3, SPEC)
    agg.add(2, part(2, 2))
    agg.drop(0)
    path = tmp_path / "agg.npz"
    agg.save(path)
    restored = AggregateBuffer(3, SPEC)
    restored.load(path)
    assert restored.received == [2] and restored.missing == [1] and restored.live == [1, 2]
    restored.add(1, part(1, 1))
    assert restored.take()["reward"].tolist() == [1, 2, 2]
    with pytest.raises(ValueError, match="snapshot num_parts is 3, this buffer has 4"):
        AggregateBuffer(4, SPEC).load_state_dict(agg.state_dict())


def test_bad_construction():
    with pytest.raises(ValueError, match="num_parts must be >= 1"):
        AggregateBuffer(0, SPEC)
    with pytest.raises(ValueError, match="spec must be a non-empty dict"):
        AggregateBuffer(1, {})
