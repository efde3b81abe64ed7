"""The frame layout end to end (env runner -> FrameSender -> messages -> FrameReplayBuffer)
against the naive layout (every row stores its obs and next_obs stacks)."""

import gymnasium as gym
import lz4.block
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aiorl.config import EnvConfig
from aiorl.envs import EnvRunner
from aiorl.replay import NStep, PrioritizedReplayBuffer, ReplayBuffer
from aiorl.replay.frame_sender import FrameSender
from aiorl.replay.frames import FrameLayout, FrameReplayBuffer

TOY = "AiorlToyFrames-v0"


class ToyFrames(gym.Env):
    """Tiny frames from a two-value alphabet (equal frames are common); episodes end at random,
    by termination or truncation; now and then an observation is no continuation at all."""

    observation_space = gym.spaces.Box(0, 1, (1, 2), np.uint8)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, end_p=0.15):
        self.end_p = end_p

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self.np_random.integers(0, 2, (1, 2), dtype=np.uint8), {}

    def step(self, action):
        obs = self.np_random.integers(0, 2, (1, 2), dtype=np.uint8)
        u = self.np_random.random()
        return obs, float(action) + u, u < self.end_p, self.end_p <= u < 1.6 * self.end_p, {}


class Jumbled(gym.ObservationWrapper):
    """Replaces the stack by a random one now and then (not a shift of the last: the sender
    must notice and send it whole)."""

    def observation(self, obs):
        if self.np_random.random() < 0.1:
            return self.np_random.integers(0, 2, obs.shape, dtype=np.uint8)
        return obs


if TOY not in gym.registry:
    gym.register(TOY, entry_point=ToyFrames)


def env_config(stack, jumbled):
    return EnvConfig(id=TOY, wrappers=[{"FrameStackObservation": {"stack_size": stack}}])


class Actor:
    """One actor's envs, n-step and (frame layout) sender, both layouts side by side."""

    def __init__(self, index, stack, envs, n, memories, steps, jumbled, compression="none"):
        cfg = env_config(stack, jumbled)
        self.naive = EnvRunner(cfg, envs, seed=100 * index)
        spec = {"obs": ((stack, 1, 2), "uint8"), "next_obs": ((stack, 1, 2), "uint8")}
        self.layout = FrameLayout.for_spec(spec, ("obs", "next_obs"), envs, steps, n - 1)
        self.sender = FrameSender(self.layout, envs, memories, n - 1, compression)
        self.framed = EnvRunner(cfg, envs, seed=100 * index, frames=self.sender)
        if jumbled:
            for runner in (self.naive, self.framed):
                runner.envs.envs = [Jumbled(env) for env in runner.envs.envs]
                for i, env in enumerate(runner.envs.envs):
                    env.np_random = np.random.default_rng(index * 7 + i)
        self.nsteps = [NStep(n, 0.9), NStep(n, 0.9)]
        self.batches = 0
        self.rng = np.random.default_rng(index)

    def chunk(self, steps, flush=False):
        """(naive rows, frame-layout rows) of the next `steps` env steps (or of a flush)."""
        if flush:
            return self.nsteps[0].flush(), self.nsteps[1].flush()
        actions = self.rng.integers(0, 2, (steps, len(self.naive.obs)))
        it = [iter(actions), iter(actions.copy())]
        out = []
        for side, runner in enumerate((self.naive, self.framed)):
            r = runner.rollout(lambda obs, it=it[side]: next(it), steps)
            out.append(
                self.nsteps[side].add(
                    r["obs"], r["action"], r["reward"], r["next_obs"], r["terminated"], r["truncated"]
                )
            )
        return out


@st.composite
def scenarios(draw):
    return dict(
        stack=draw(st.integers(1, 4)),
        envs=draw(st.integers(1, 3)),
        n=draw(st.integers(1, 4)),
        actors=draw(st.integers(1, 2)),
        memories=draw(st.integers(1, 2)),
        steps=draw(st.integers(1, 5)),
        rounds=draw(st.integers(1, 12)),
        capacity=draw(st.sampled_from([16, 17, 32, 64])),
        prioritized=draw(st.booleans()),
        jumbled=draw(st.booleans()),
        seed=draw(st.integers(0, 1000)),
        compression=draw(st.sampled_from(["none", "lz4"])),
    )


def check_counts(buffers, actors, memory):
    """Every frame's count is the rows' references plus the one pin of a stream holding it."""
    buf = buffers[memory]
    counts = buf.pool.refcount(np.arange(buf.pool.slots))
    expected = buf.row_references()
    for actor in actors:
        stream = actor.streams[memory]
        # The sender's mirror of what this memory holds (ids >= its keep_from).
        held = actor.sender._held[memory]
        ids = held[(held >= stream.keep_from)]
        assert all(stream.holds(int(i)) for i in ids) and len(ids) == stream.held
        if len(ids):
            pinned = stream.admit(np.zeros((0, 1, 2), np.uint8), [], ids, stream.keep_from)
            np.add.at(expected, pinned, 1)
    assert np.array_equal(counts, expected)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_frame_layout_samples_exactly_what_the_naive_layout_samples(s):
    k, n, memories = s["stack"], s["n"], s["memories"]
    spec = {
        "obs": ((k, 1, 2), "uint8"),
        "action": ((), "int64"),
        "reward": ((), "float32"),
        "next_obs": ((k, 1, 2), "uint8"),
        "done": ((), "bool"),
        "discount": ((), "float32"),
    }
    actors = [
        Actor(i, k, s["envs"], n, memories, s["steps"], s["jumbled"], s["compression"]) for i in range(s["actors"])
    ]
    layout = actors[0].layout
    capacity = max(s["capacity"], s["steps"] * s["envs"] * 2)
    alpha = 0.6 if s["prioritized"] else None

    def naive_buffer(m):
        if alpha is None:
            return ReplayBuffer(capacity, spec, seed=s["seed"] + m)
        return PrioritizedReplayBuffer(capacity, spec, alpha=alpha, seed=s["seed"] + m)

    naive = [naive_buffer(m) for m in range(memories)]
    framed = [
        FrameReplayBuffer(capacity, spec, layout, alpha=alpha, seed=s["seed"] + m, max_streams=2)
        for m in range(memories)
    ]
    for actor in actors:
        actor.streams = [buf.stream() for buf in framed]
    rng = np.random.default_rng(s["seed"])
    schedule = [(i, False) for i in rng.integers(0, len(actors), s["rounds"])] + [(i, True) for i in range(len(actors))]
    for a, flush in schedule:
        actor = actors[a]
        rows, refs = actor.chunk(s["steps"], flush)
        if not rows or not len(rows["reward"]):
            continue
        # The runner's ids decode to exactly the naive rows (what the policy's priorities see).
        decoded = actor.sender.decode(refs)
        for key in rows:
            assert np.array_equal(decoded[key], rows[key]), key
        m = actor.batches % memories
        actor.batches += 1
        arrays, keep_from = actor.sender.message(m, refs)
        assert set(arrays) == set(spec) | {"frames" if s["compression"] == "none" else "frames_lz4", "frame_ids"}
        priorities = rng.random(len(rows["reward"])) if alpha else None
        naive[m].add(rows, priorities) if alpha else naive[m].add(rows)
        framed[m].add(arrays, priorities, stream=actor.streams[m], keep_from=keep_from)
        for mm in range(memories):
            if not len(naive[mm]):
                continue
            assert len(framed[mm]) == len(naive[mm])
            batch = int(rng.integers(1, 9))
            beta = float(rng.random())
            want = naive[mm].sample(batch, beta) if alpha else naive[mm].sample(batch)
            got = framed[mm].sample(batch, beta) if alpha else framed[mm].sample(batch)
            assert list(got) == list(want)
            for key in want:
                assert got[key].dtype == want[key].dtype and np.array_equal(got[key], want[key]), key
            if alpha:
                new = rng.random(batch) * 3
                assert framed[mm].update_priorities(want["indices"], new, want["generations"]) == naive[
                    mm
                ].update_priorities(want["indices"], new, want["generations"])
            check_counts(framed, actors, mm)
    for m, buf in enumerate(framed):
        # Frames alive stay within the rows' worth plus what the streams hold.
        assert len(buf.pool) <= len(buf) * 2 * k + sum(actor.streams[m].held for actor in actors)
        for actor in actors:
            actor.streams[m].release()
        assert len(buf.pool) == len(
            np.unique(np.concatenate([t[: len(buf)].reshape(-1) for t in buf._tables.values()]))
        )


def make_message(layout, stream_refs, frames_ids, n=2):
    rows = {
        "obs": np.array(stream_refs[0], np.int64).reshape(n, -1),
        "next_obs": np.array(stream_refs[1], np.int64).reshape(n, -1),
        "action": np.zeros(n, np.int64),
    }
    rows["frames"] = np.zeros((len(frames_ids),) + layout.frame_shape, layout.dtype)
    rows["frame_ids"] = np.array(frames_ids, np.int64)
    return rows


def test_a_bad_message_changes_nothing():
    spec = {"obs": ((2, 3), "uint8"), "next_obs": ((2, 3), "uint8"), "action": ((), "int64")}
    layout = FrameLayout.for_spec(spec, ("obs", "next_obs"), 1, 4, 0)
    buf = FrameReplayBuffer(4, spec, layout, alpha=0.6)
    stream = buf.stream()
    good = make_message(layout, ([0, 1, 1, 2], [1, 2, 2, 3]), [0, 1, 2, 3])
    buf.add(good, stream=stream, keep_from=0)
    state = (len(buf), len(buf.pool), stream.held, buf.rows.tree.total)
    bad = [
        (make_message(layout, ([2, 3, 3, 4], [3, 4, 4, 9]), [4]), 1, "neither held nor sent"),
        (make_message(layout, ([2, 3, 3, 4], [3, 4, 4, 5]), [4, 5]), 3, "below keep_from"),
        (make_message(layout, ([2, 3, 3, 4], [3, 4, 4, 5]), [4, 5]), "1", "keep_from must be an integer"),
        (
            {**make_message(layout, ([2, 3, 3, 4], [3, 4, 4, 5]), [4, 5]), "action": np.zeros(3, np.int64)},
            1,
            r"field 'obs': expected \(3, 2\)",
        ),
        ({k: v for k, v in good.items() if k != "frame_ids"}, 1, "lacks 'frame_ids'"),
    ]
    for message, keep_from, match in bad:
        with pytest.raises(ValueError, match=match):
            buf.add(message, stream=stream, keep_from=keep_from)
        assert (len(buf), len(buf.pool), stream.held, buf.rows.tree.total) == state
    # Priorities are checked by the ring before any frame is touched.
    with pytest.raises(ValueError, match="priorities"):
        buf.add(make_message(layout, ([2, 3, 3, 4], [3, 4, 4, 5]), [4, 5]), [1.0, -1.0], stream=stream, keep_from=1)
    assert (len(buf), len(buf.pool), stream.held, buf.rows.tree.total) == state


def test_compressed_frames_are_checked_before_they_are_unpacked():
    spec = {"obs": ((2, 3), "uint8"), "next_obs": ((2, 3), "uint8"), "action": ((), "int64")}
    layout = FrameLayout.for_spec(spec, ("obs", "next_obs"), 1, 4, 0)
    buf = FrameReplayBuffer(4, spec, layout)
    stream = buf.stream()
    message = make_message(layout, ([0, 1, 1, 2], [1, 2, 2, 3]), [0, 1, 2, 3])
    frames = np.arange(12, dtype=np.uint8).reshape(4, 3)
    packed = np.frombuffer(lz4.block.compress(frames, store_size=False), np.uint8)
    del message["frames"]
    for blob, ids, match in [
        (packed[:-1], [0, 1, 2, 3], "not an lz4 block of 4 frames"),
        (packed, [0, 1, 2], "not an lz4 block of 3 frames"),
        (packed, list(range(9)), "9 frame ids for 2 rows"),  # more than 2 rows x 2 fields x 2 frames
        (packed.astype(np.int16), [0, 1, 2, 3], "1-d uint8"),
    ]:
        with pytest.raises(ValueError, match=match):
            buf.add({**message, "frames_lz4": blob, "frame_ids": np.array(ids)}, stream=stream, keep_from=0)
        assert len(buf) == 0 and len(buf.pool) == 0
    buf.add({**message, "frames_lz4": packed}, stream=stream, keep_from=0)
    got = buf.sample(8)
    for row, obs, next_obs in zip(got["indices"], got["obs"], got["next_obs"]):
        assert np.array_equal(obs, frames[[row, row + 1]]) and np.array_equal(next_obs, frames[[row + 1, row + 2]])


def test_evicted_rows_release_their_frames():
    spec = {"obs": ((2, 3), "uint8"), "next_obs": ((2, 3), "uint8"), "action": ((), "int64")}
    layout = FrameLayout.for_spec(spec, ("obs", "next_obs"), 1, 2, 0)
    buf = FrameReplayBuffer(2, spec, layout)
    stream = buf.stream()
    for t in range(0, 40, 2):
        message = make_message(
            layout,
            ([t, t + 1, t + 1, t + 2], [t + 1, t + 2, t + 2, t + 3]),
            [i for i in range(t, t + 4) if not stream.holds(i)],
        )
        buf.add(message, stream=stream, keep_from=t)
    # The two rows left reference ids 38..41, which the stream holds too (ids >= keep_from 38).
    assert len(buf) == 2 and len(buf.pool) == 4 and buf.pool.slots <= 2 * buf.pool.run_frames  # 20 messages later
    stream.release()
    assert len(buf.pool) == 4  # the rows still reference all four
    assert buf.sample(3)["obs"].shape == (3, 2, 3)


def test_layout_window_covers_what_a_stream_references():
    spec = {"obs": ((4, 84, 84), "uint8"), "next_obs": ((4, 84, 84), "uint8")}
    layout = FrameLayout.for_spec(spec, ("obs", "next_obs"), 8, 50, 2)
    assert layout.stack == 4 and layout.frame_shape == (84, 84) and layout.dtype == np.uint8
    assert layout.window == 4096  # 2 * 8 envs * 4 * (50 + 2 + 4) = 3584, rounded up
    assert layout.wire_spec({**spec, "action": ((), "<i8")}) == {
        "obs": ((4,), "<i8"),
        "next_obs": ((4,), "<i8"),
        "action": ((), "<i8"),
    }
    assert layout.max_frames(10) == 80 and layout.frame_bytes == 7056
    with pytest.raises(ValueError, match="expected \\(stack, \\*frame\\)"):
        FrameLayout.for_spec({"obs": ((4,), "float32")}, ("obs",), 1, 1, 0)
