"""R2D2's pixel sequences in the frame layout: a sequence row's ``obs (m + 1, k, *frame)`` travels
and is stored as ``(m + 1, k)`` frame ids, each frame stored and sent once, and samples exactly
what the naive layout (every row storing its stacks) samples."""

import os

import gymnasium as gym
import numpy as np
import pytest
from apex_helpers import make_algo
from cluster_helpers import read_json, run
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_frame_limits import fits
from test_replay_frames import TOY, env_config

from aiorl.algos.lib.layers import parse_network
from aiorl.algos.r2d2 import pad_with_last_observation
from aiorl.envs import EnvRunner
from aiorl.replay import PrioritizedReplayBuffer, ReplayBuffer, SequenceAdder
from aiorl.replay.frame_sender import FrameSender
from aiorl.replay.frames import FrameLayout, FrameReplayBuffer, frame_layout
from aiorl.runtime import frame_limits

assert TOY in gym.registry  # registered by test_replay_frames: (1, 2) frames of 0s and 1s


def sequence_spec(m, k):
    return {
        "obs": ((m + 1, k, 1, 2), "uint8"),
        "action": ((m,), "int64"),
        "reward": ((m,), "float32"),
        "mask": ((m,), "bool"),
        "terminal": ((), "bool"),
    }


class SequenceActor:
    """One actor's envs and sequence adders, the naive and the frame layout side by side."""

    def __init__(self, k, envs, m, overlap, steps, seed):
        cfg = env_config(k, False)
        self.naive = EnvRunner(cfg, envs, seed=seed)
        self.layout = FrameLayout.for_spec(sequence_spec(m, k), ("obs",), envs, steps, m - 1, (k, 1, 2))
        self.sender = FrameSender(self.layout, envs, 1, m - 1)
        self.framed = EnvRunner(cfg, envs, seed=seed, frames=self.sender)
        self.adders = [SequenceAdder(m, overlap), SequenceAdder(m, overlap)]
        self.rng = np.random.default_rng(seed)

    def chunk(self, steps, flush=False):
        """(naive rows, frame-layout rows) of the next `steps` env steps (or of a flush), padded
        as the actor pads them in the frame layout."""
        out = []
        if flush:
            out = [adder.flush() for adder in self.adders]
        else:
            actions = self.rng.integers(0, 2, (steps, len(self.naive.obs)))
            for runner, adder in zip((self.naive, self.framed), self.adders):
                it = iter(actions)
                r = runner.rollout(lambda obs, it=it: next(it), steps)
                states = np.zeros((steps, len(actions[0]), 0), np.float32)
                args = (r["obs"], r["action"], r["reward"], r["next_obs"], r["terminated"], r["truncated"])
                out.append(adder.add(*args, states))
        for rows in out:
            for key in ("state", "env"):
                rows.pop(key, None)
            if len(rows.get("mask", ())):
                padded = pad_with_last_observation(rows["obs"], rows["mask"])
                # Padding never touches a real observation, the one after the last step included.
                real = np.arange(padded.shape[1]) <= rows["mask"].sum(axis=1)[:, None]
                assert np.array_equal(padded[real], rows["obs"][real])
                rows["obs"] = padded
        return out


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    k=st.integers(1, 4),
    envs=st.integers(1, 3),
    m=st.integers(2, 6),
    overlap_frac=st.floats(0, 0.99),
    steps=st.integers(1, 7),
    rounds=st.integers(1, 10),
    capacity=st.sampled_from([4, 7, 16]),
    prioritized=st.booleans(),
    seed=st.integers(0, 1000),
)
def test_frame_layout_samples_exactly_the_sequences_the_naive_layout_samples(
    k, envs, m, overlap_frac, steps, rounds, capacity, prioritized, seed
):
    overlap = int(overlap_frac * m)
    capacity = max(capacity, steps * envs + envs)  # one chunk's rows at most
    actor = SequenceActor(k, envs, m, overlap, steps, seed)
    layout = actor.layout
    assert layout.lead == (m + 1,) and layout.stack == k and layout.refs_per_row == (m + 1) * k
    spec = sequence_spec(m, k)
    alpha = 0.6 if prioritized else None
    naive = (
        PrioritizedReplayBuffer(capacity, spec, alpha=alpha, seed=seed)
        if alpha
        else ReplayBuffer(capacity, spec, seed=seed)
    )
    framed = FrameReplayBuffer(capacity, spec, layout, alpha=alpha, seed=seed)
    stream = framed.stream()
    rng = np.random.default_rng(seed)
    stored = 0
    for r in range(rounds + 1):
        rows, refs = actor.chunk(steps, flush=r == rounds)
        if not rows or not len(rows["mask"]):
            continue
        assert refs["obs"].shape == (len(rows["mask"]), m + 1, k) and refs["obs"].dtype == np.int64
        decoded = actor.sender.decode(refs)
        for key in rows:
            assert np.array_equal(decoded[key], rows[key]), key
        arrays, keep_from = actor.sender.message(0, refs)
        priorities = rng.random(len(rows["mask"])) + 0.1 if alpha else None
        naive.add(rows, priorities) if alpha else naive.add(rows)
        framed.add(arrays, priorities, stream=stream, keep_from=keep_from)
        stored += len(rows["mask"])
        batch = int(rng.integers(1, 6))
        beta = float(rng.random())
        want = naive.sample(batch, beta) if alpha else naive.sample(batch)
        got = framed.sample(batch, beta) if alpha else framed.sample(batch)
        assert list(got) == list(want)
        for key in want:
            assert got[key].dtype == want[key].dtype and np.array_equal(got[key], want[key]), key
        if alpha:
            new = rng.random(batch) * 3
            assert framed.update_priorities(want["indices"], new, want["generations"]) == naive.update_priorities(
                want["indices"], new, want["generations"]
            )
        # Each frame once: the pool holds what the rows reference (and the stream pins), no copy
        # per row or per overlapping sequence.
        live = np.unique(framed.row_references().nonzero()[0])
        assert len(framed.pool) <= actor.sender.frames_sent
        assert len(live) <= len(framed.pool) <= len(live) + stream.held
    stream.release()
    assert len(framed.pool) == len(np.unique(framed.row_references().nonzero()[0]))


def test_a_message_with_more_frames_than_its_rows_reference_is_refused():
    m, k = 3, 2
    spec = sequence_spec(m, k)
    layout = FrameLayout.for_spec(spec, ("obs",), 1, 4, m - 1, (k, 1, 2))
    assert layout.max_frames(2) == 2 * (m + 1) * k
    assert layout.max_frames(100) == layout.window == 32  # ids of one message span less than it
    buf = FrameReplayBuffer(8, spec, layout, alpha=0.6, seed=0)
    stream = buf.stream()
    rows = {
        "obs": np.arange(2 * (m + 1) * k, dtype=np.int64).reshape(2, m + 1, k),
        "action": np.zeros((2, m), np.int64),
        "reward": np.zeros((2, m), np.float32),
        "mask": np.ones((2, m), bool),
        "terminal": np.zeros(2, bool),
    }
    count = layout.max_frames(2) + 1
    message = {**rows, "frames": np.zeros((count, 1, 2), np.uint8), "frame_ids": np.arange(count, dtype=np.int64)}
    with pytest.raises(ValueError, match=r"frame ids for 2 rows \(at most 16\)"):
        buf.add(message, None, stream=stream, keep_from=0)
    # Ids past the window are refused too, and neither message changed anything.
    far = {**rows, "frames": np.zeros((2, 1, 2), np.uint8), "frame_ids": np.array([0, layout.window])}
    far["obs"] = np.where(np.arange(2 * (m + 1) * k).reshape(2, m + 1, k) % 2, layout.window, 0)
    with pytest.raises(ValueError, match="span more than the window"):
        buf.add(far, None, stream=stream, keep_from=0)
    assert len(buf) == 0 and len(buf.pool) == 0 and stream.held == 0
    # The rows' worth is accepted: every frame once.
    message = {**rows, "frames": np.zeros((count - 1, 1, 2), np.uint8), "frame_ids": np.arange(count - 1)}
    buf.add(message, None, stream=stream, keep_from=0)
    assert len(buf) == 2 and len(buf.pool) == count - 1
    assert buf.sample(3, 0.4)["obs"].shape == (3, m + 1, k, 1, 2)


# A pixel env small enough for 2 cores: 36x36 grey frames (nature_cnn's smallest input), random
# but for a few equal neighbours, 20-step episodes. Written out as a module for the cluster run.
GREY_ENV = """
import gymnasium as gym
import numpy as np


class Grey(gym.Env):
    observation_space = gym.spaces.Box(0, 255, (36, 36), np.uint8)
    action_space = gym.spaces.Discrete(3)

    def frame(self):
        return self.np_random.integers(0, 256, (36, 36), dtype=np.uint8)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self.frame(), {}

    def step(self, action):
        self.t += 1
        return self.frame(), float(action == 1), False, self.t >= 20, {}
"""
GREY_ID = "AiorlTestGrey-v0"
if GREY_ID not in gym.registry:
    namespace = {}
    exec(GREY_ENV, namespace)
    gym.register(GREY_ID, entry_point=namespace["Grey"])

PIXELS = {"wrappers": [{"FrameStackObservation": {"stack_size": 3}}], "num_envs": 2}
PIXEL_MODEL = {
    "recurrent": {"type": "lstm", "hidden": 8},
    "sequence_length": 6,  # starts every 3 steps: the last of each 20-step episode is padded
    "burn_in": 1,
    "n_step": 2,
}


def test_r2d2_on_stacked_images_uses_the_frame_layout_and_its_limits_and_learns_from_the_samples():
    algo = make_algo(
        "r2d2",
        GREY_ID,
        PIXEL_MODEL,
        env=PIXELS,
        agent={"sample_batch_size": 6, "batch_size": 4, "replay_layout": "frames"},
    )
    cfg, m = algo.cfg, 6
    layout = frame_layout(cfg, algo)
    assert layout is not None and layout.lead == (m + 1,) and layout.stack == 3 and layout.frame_shape == (36, 36)
    assert algo.layers == parse_network(["nature_cnn"], "model.network")
    assert algo.transition_spec()["obs"] == ((m + 1, 3, 36, 36), "|u1")
    actor = algo.make_actor(0, 1, seed=0)
    sender = FrameSender(layout, 2, 1, algo.lookback_steps())
    runner = EnvRunner(cfg.env, 2, seed=0, frames=sender)
    spec = algo.transition_spec()
    buf = FrameReplayBuffer(64, spec, layout, alpha=0.6, seed=0)
    stream = buf.stream()
    to_memory = frame_limits.actor_to_memory(cfg, algo)
    rows_sent = 0
    try:
        for _ in range(8):  # 20-step episodes: some sequences end padded
            batch, _ = actor.postprocess(runner.rollout(actor.act, 6, actor.begin_episodes))
            if not batch:
                continue
            assert batch["obs"].shape[1:] == (m + 1, 3) and batch["obs"].dtype == np.int64
            arrays, keep_from = sender.message(0, batch)
            assert fits(arrays, to_memory)
            buf.add(arrays, None, stream=stream, keep_from=keep_from)
            rows_sent += len(batch["mask"])
    finally:
        runner.close()
    assert rows_sent >= 8 and not buf.rows.sample(64, 0.4)["mask"].all()
    # Each frame sent once: one new frame per env step plus each reset's stack, far below
    # what the rows reference.
    assert sender.frames_sent <= 8 * 6 * 2 + 3 * 2 * (1 + 8 * 6 // 20)
    assert sender.frames_sent < rows_sent * layout.refs_per_row / 3
    sample = buf.sample(cfg.agent.batch_size, 0.4)
    assert sample["obs"].shape == (4, m + 1, 3, 36, 36)
    assert fits(sample, frame_limits.memory_to_learner(cfg, algo))
    learner = algo.make_learner(0, 1, seed=0)
    result = learner.step(sample)
    assert result.priorities.shape == (4,) and np.isfinite(result.metrics["losses/td_loss"])


@pytest.mark.cluster
def test_an_r2d2_pixel_run_in_the_frame_layout_sends_and_stores_each_frame_once(tmp_path, monkeypatch):
    (tmp_path / "grey_env.py").write_text(GREY_ENV)
    # The role processes import the env module by name (env.id module:Class).
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    config = {
        "algo": "r2d2",
        "env": {"id": "grey_env:Grey", **PIXELS},
        "agent": {
            "sample_batch_size": 10,
            "batch_size": 8,
            "buffer_size": 400,
            "learning_starts": 16,
            "scheduled_global_steps": 12,
            "replay_layout": "frames",
            # The limiter holds the actor to what 12 learner steps sample (plus its band), so that
            # the 400 rows below are never filled however long the learner takes to start: without
            # it a quiet machine's actor sent 504 rows before the run stopped.
            "samples_per_insert": 1.0,
        },
        "cluster": {"actors": 1, "memories": 1, "learners": 1, "actor_credits": 2},
        "model": {**PIXEL_MODEL, "device": "cpu"},
        "run": {"eval_every": None},
    }
    code, out, run_dir = run(tmp_path, config, timeout_s=300)
    assert code == 0, out
    summary = read_json(run_dir / "summary.json")
    assert summary["ok"] and summary["learner_steps"] >= 12, summary
    actor = summary["roles"]["actor-0"]["stats"]
    rows = actor["memories"][0]["transitions"]
    steps = actor["env_steps"]
    memory = summary["roles"]["memory-0"]["stats"]
    assert memory["inserted"] == rows >= 16
    # Sent once: one new frame per env step, plus the first stack of each 20-step episode of
    # each of the 2 envs; rows of 7 observations of 3 frames would have carried 21 each.
    assert actor["frames_sent"] <= steps + 3 * 2 * (1 + steps // (2 * 20)), actor
    assert actor["frames_sent"] < rows * 21 / 3
    # Stored once: every frame sent is referenced by some row, nothing evicted (400 rows of
    # room), and the pool holds exactly the frames sent, not one per referencing row.
    assert memory["replay_size"] == rows and memory["replay_frames"] == actor["frames_sent"], memory
