"""Learner 0's outputs (`aiorl.runtime.learner_outputs.LearnerOutputs`) driven alone, through the moments
its learner calls (`after_step`, `finish`, `abnormal_end`, `summary`), with a fake `LearnerAccess`: a core
of one tensor, counts the test sets, a coordinator that answers or is gone.
"""

from __future__ import annotations

import asyncio
import logging
import threading

import pytest
import torch

from aiorl.experiment.loading import load_config
from aiorl.io import checkpoint
from aiorl.io.rundir import Identity
from aiorl.runtime.learner_outputs import MAX_WAITING, LearnerAccess, LearnerOutputs
from aiorl.wire import Message


class Core:
    """One weight tensor; `value` sets it (NaN: a diverged model)."""

    def __init__(self):
        self.weight = torch.zeros(4)
        self.exported: list[str] = []

    def state_dict(self):
        return {"weight": self.weight.clone()}

    def acting_policy(self):
        return f"policy {float(self.weight[0])}", {}

    def export_policy(self, directory: str) -> str:
        self.exported.append(directory)
        return f"{directory}/policy.pt2"

    def load_checkpoint(self, path: str) -> dict:
        meta, state = checkpoint.load(path)
        self.weight = state["weight"]
        return meta


class Learner:
    """What a `LearnerRole` hands its outputs: the state the accessor's callables read, and what it
    was asked to do (publishes, run_state requests)."""

    def __init__(self, coordinator_up: bool = True):
        self.core = Core()
        self.launch_steps = 0
        self.run_counters = {"env_steps": 5, "episodes": 1}
        self.coordinator_up = coordinator_up
        self.asked: list[float] = []
        self.published: list[float] = []  # the weight at each publish

    async def run_state(self, timeout_s: float):
        self.asked.append(timeout_s)
        if not self.coordinator_up:
            raise ConnectionError("coordinator gone")
        return Message("ok", {"env_steps": 7, "returns": [1.0]}, {}, 1)

    async def publish(self):
        self.published.append(float(self.core.weight[0]))

    def access(self) -> LearnerAccess:
        return LearnerAccess(
            lock=threading.Lock(),
            core=lambda: self.core,
            launch_steps=lambda: self.launch_steps,
            run_counters=lambda: self.run_counters,
            run_state=self.run_state,
            publish=self.publish,
            spawn=lambda coro, name: asyncio.get_running_loop().create_task(coro, name=name),
        )


def outputs_of(
    tmp_path, learner: Learner, index: int = 0, synchronous: bool = False, resume_from: str | None = None, **run
) -> LearnerOutputs:
    data = {"algo": "random_agent", "agent": {"publish_interval": 4}, "run": {"tensorboard": False, **run}}
    if synchronous:
        data["model"] = {"synchronous": True}
    cfg = load_config(data=data, overrides=[f"run.dir={tmp_path}"])
    identity = Identity(run_id="run", launch_id="launch", resume_from=resume_from)
    return LearnerOutputs(cfg, tmp_path, index, identity, logging.getLogger("test.outputs"), learner.access())


async def steps(outputs: LearnerOutputs, learner: Learner, upto: int) -> None:
    """The learner's steps up to `upto`, each followed by the outputs' moment between two steps."""
    while learner.launch_steps < upto:
        learner.launch_steps += 1
        learner.core.weight += 1
        await outputs.after_step()


def written(tmp_path) -> list[tuple[int, str]]:
    return [
        (m["learner_steps"], m["reason"])
        for m in map(checkpoint.read_meta, checkpoint.list_checkpoints(tmp_path / "checkpoints"))
    ]


async def test_the_first_checkpoint_comes_at_the_first_publish_then_by_the_interval(tmp_path):
    learner = Learner()
    outputs = outputs_of(tmp_path, learner, checkpoint_interval_s=3600.0)
    await steps(outputs, learner, 3)
    assert written(tmp_path) == []  # before the first publication (publish_interval 4): none
    await steps(outputs, learner, 4)
    await steps(outputs, learner, 9)  # the interval not reached: no other
    await asyncio.sleep(0.2)  # the file is written in the background
    assert written(tmp_path) == [(4, "first")]
    meta = checkpoint.read_meta(checkpoint.list_checkpoints(tmp_path / "checkpoints")[0])
    # The coordinator's, the run's learner steps learner 0's own count.
    assert meta["run"] == {"env_steps": 7, "returns": [1.0], "learner_steps": 4} and meta["run_id"] == "run"


async def test_a_synchronous_learner_checkpoints_after_its_first_iteration_and_none_with_both_off(tmp_path):
    learner = Learner()
    outputs = outputs_of(tmp_path / "sync", learner, checkpoint_interval_s=3600.0, synchronous=True)
    await steps(outputs, learner, 1)
    await asyncio.sleep(0.2)
    assert written(tmp_path / "sync") == [(1, "first")]
    learner = Learner()
    outputs = outputs_of(tmp_path / "off", learner, checkpoint_interval_s=None, checkpoint_every=None)
    await steps(outputs, learner, 8)
    assert written(tmp_path / "off") == [] and learner.asked == []


async def test_checkpoint_every_counts_the_runs_steps_and_only_learner_0_writes(tmp_path):
    learner = Learner()
    outputs = outputs_of(tmp_path / "0", learner, checkpoint_interval_s=None, checkpoint_every=3)
    await steps(outputs, learner, 7)
    await asyncio.sleep(0.2)
    # The one at step 3 came before the first publication, and so is the first.
    assert written(tmp_path / "0") == [(3, "periodic"), (6, "periodic")]
    other = Learner()
    outputs = outputs_of(tmp_path / "1", other, index=1, checkpoint_interval_s=None, checkpoint_every=3)
    await steps(outputs, other, 7)
    await outputs.finish(signalled=False)
    await outputs.abnormal_end("test")
    assert not (tmp_path / "1" / "checkpoints").exists() and other.published == [] and other.core.exported == []
    assert outputs.summary() == {"checkpoints": [], "evaluation": None}


async def test_weights_holding_nan_are_never_checkpointed(tmp_path, caplog):
    learner = Learner()
    outputs = outputs_of(tmp_path, learner, checkpoint_interval_s=3600.0)
    learner.core.weight[2] = float("nan")
    with caplog.at_level(logging.ERROR, "test.outputs"):
        await steps(outputs, learner, 4)
        await outputs.abnormal_end("lost the coordinator")
        await outputs.finish(signalled=True)
    assert written(tmp_path) == [] and outputs.summary()["checkpoints"] == []
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert any("(first)" in e and "NaN" in e for e in errors) and any("(final)" in e and "NaN" in e for e in errors)
    assert learner.published == [4.0] and learner.core.exported  # published and exported all the same


async def test_finish_publishes_then_checkpoints_then_exports_and_the_summary_lists_the_files(tmp_path):
    learner = Learner()
    outputs = outputs_of(tmp_path, learner, checkpoint_interval_s=3600.0)
    await steps(outputs, learner, 5)
    await outputs.finish(signalled=False)
    assert learner.published == [5.0]
    assert written(tmp_path) == [(4, "first"), (5, "final")]
    assert learner.core.exported == [str(tmp_path / "policy")]
    summary = outputs.summary()
    assert set(summary) == {"checkpoints", "evaluation"} and summary["evaluation"] is None
    assert [p.rsplit("/", 1)[1] for p in summary["checkpoints"]] == [
        checkpoint.checkpoint_name(4),
        checkpoint.checkpoint_name(5),
    ]


async def test_an_abnormal_end_checkpoints_the_last_heartbeats_counters_without_the_coordinator(tmp_path, caplog):
    learner = Learner()
    outputs = outputs_of(tmp_path, learner, checkpoint_interval_s=None, checkpoint_every=None)
    await steps(outputs, learner, 6)
    await outputs.abnormal_end("lost the coordinator: gone")
    (path,) = checkpoint.list_checkpoints(tmp_path / "checkpoints")
    meta = checkpoint.read_meta(path)
    assert meta["reason"] == "abnormal end: lost the coordinator: gone" and meta["learner_steps"] == 6
    assert (
        meta["run"] == {**learner.run_counters, "learner_steps": 6} and learner.asked == []
    )  # not asked: it may be gone
    learner.core = None  # an end before the core was built: nothing to save, and no error for it
    with caplog.at_level(logging.ERROR, "test.outputs"):
        await outputs.abnormal_end("failed")
    assert len(checkpoint.list_checkpoints(tmp_path / "checkpoints")) == 1
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


async def test_a_checkpoint_without_the_coordinator_records_the_last_heartbeats_counters(tmp_path, caplog):
    learner = Learner(coordinator_up=False)
    outputs = outputs_of(tmp_path, learner, checkpoint_interval_s=3600.0)
    with caplog.at_level(logging.WARNING, "test.outputs"):
        await steps(outputs, learner, 4)
        await asyncio.sleep(0.2)
    (path,) = checkpoint.list_checkpoints(tmp_path / "checkpoints")
    assert checkpoint.read_meta(path)["run"] == {**learner.run_counters, "learner_steps": 4}
    assert learner.asked == [outputs.cfg.cluster.coordinator_timeout_s]
    assert any("without the coordinator's run state" in r.getMessage() for r in caplog.records)


async def test_a_resumed_launch_loads_its_checkpoint_and_its_files_go_on_from_its_steps(tmp_path):
    first = Learner()
    outputs = outputs_of(tmp_path, first, checkpoint_interval_s=None, checkpoint_every=None)
    await steps(outputs, first, 6)
    await outputs.finish(signalled=False)
    (path,) = checkpoint.list_checkpoints(tmp_path / "checkpoints")
    learner = Learner()
    outputs = outputs_of(tmp_path, learner, checkpoint_interval_s=3600.0, resume_from=str(path))
    assert await outputs.resume(learner.core) == 6  # the role's step base
    assert float(learner.core.weight[0]) == 6.0  # the weights loaded into the core it was given
    await steps(outputs, learner, 4)  # this launch's first publication: its first checkpoint
    await asyncio.sleep(0.2)
    assert written(tmp_path)[-1] == (10, "first")
    fresh = outputs_of(tmp_path / "fresh", Learner())
    assert await fresh.resume(Core()) == 0  # a launch that does not resume


# --------------------------------------------------------------------------
# evaluations during training: the copies waiting for the evaluation process


class FakeEvaluator:
    """Scores what it is given when the test lets it (`go`), recording each call's arguments; due at
    no step (the test takes the copies)."""

    def __init__(self):
        self.runs: list[tuple] = []
        self.skipped = 0
        self.go = threading.Event()
        self.last_step = None

    def due(self, learner_steps):
        return False

    def mark(self, learner_steps):
        self.last_step = learner_steps
        return 0.0

    def interrupt(self):
        pass

    def run(self, policy, meta, learner_steps, env_steps, copy_s, due_t, policy_time):
        assert self.go.wait(30)
        self.runs.append((policy, learner_steps, env_steps, due_t))
        return {}

    def skip(self):
        self.skipped += 1


def test_copies_wait_for_the_evaluation_in_flight_a_few_at_most(tmp_path):
    async def scenario():
        learner = Learner()
        outputs = outputs_of(tmp_path, learner, eval_every=1000)
        ev = outputs.evaluator = FakeEvaluator()  # the evaluation process, played by the test
        try:
            for k in range(1, 3 + MAX_WAITING):
                learner.core.weight[0] = 1000 * k  # the copy is of the policy at the step it came due
                await outputs._take_policy(1000 * k, float(k))
                await asyncio.sleep(0.01)  # the first one is in flight, blocked
                if k == 3:  # two due while one is scored (ES's start on a busy machine): none skipped
                    assert ev.skipped == 0
            assert ev.skipped == 1  # one more than MAX_WAITING came due meanwhile: the oldest was dropped
        finally:
            ev.go.set()  # a failed check leaves no thread waiting
        await asyncio.wait_for(outputs._evaluating, 30)
        return ev.runs

    runs = asyncio.run(scenario())
    # The first, then the newest MAX_WAITING, oldest first; each of the policy at its step.
    assert runs == [("policy 1000.0", 1000, 5, 1.0)] + [
        (f"policy {1000.0 * k}", 1000 * k, 5, float(k)) for k in range(3, 3 + MAX_WAITING)
    ]


@pytest.mark.parametrize("signalled", [False, True])
async def test_the_final_evaluation_scores_the_final_policy_unless_a_signal_asks_for_a_prompt_end(tmp_path, signalled):
    learner = Learner()
    outputs = outputs_of(tmp_path, learner, eval_every=1000, checkpoint_interval_s=None)
    ev = outputs.evaluator = FakeEvaluator()
    ev.go.set()
    await steps(outputs, learner, 3)
    await outputs.finish(signalled=signalled)
    assert ev.runs == ([] if signalled else [("policy 3.0", 3, 5, 0.0)])
