"""The run's learner steps are one truth across a checkpoint and a resume, values only (no processes):
what learner 0's checkpoint records of the run, what a resumed coordinator starts its totals from,
and what each resumed learner counts from agree; and the coordinator ends a run whose every learner
says it stopped on its share of ``agent.scheduled_global_steps``."""

from __future__ import annotations

import pytest
import torch
from test_learner_outputs import Learner, outputs_of, steps
from test_learner_runtime import make_learner

from aiorl.experiment.loading import load_config
from aiorl.io import checkpoint
from aiorl.io.rundir import resumed_counters, run_learner_steps
from aiorl.runtime.algorithm import LearnerResult
from aiorl.runtime.coordinator.counters import BUDGET_REACHED, RunCounters, owned_counters, stop_criterion
from aiorl.runtime.coordinator.roster import RoleRecord

BUDGET = 200


class OneStepCore:
    def step(self, batch):
        return LearnerResult({"loss": 0.0}, None)


def budget_cfg(learners: int = 1):
    return load_config(
        data={"algo": "random_agent", "agent": {"scheduled_global_steps": BUDGET}, "cluster": {"learners": learners}}
    )


def record(name: str) -> RoleRecord:
    return RoleRecord(name=name, kind=name.split("-")[0], index=int(name.split("-")[1]))


def stale_checkpoint(tmp_path, own: int = 100, recorded: int = 95):
    """A checkpoint as an abnormal end wrote it before: learner 0 at `own` steps, the run's totals
    of its last heartbeat (`recorded` learner steps) beside them."""
    run = {"env_steps": 5000, "learner_steps": recorded, "episodes": 40, "returns": [9.0], "time_s": 12.0}
    return checkpoint.save(tmp_path, own, {"weight": torch.zeros(2)}, {"run": run}, keep=3)


def test_the_runs_learner_steps_start_from_learner_0s_own_count_for_each_learner():
    meta = {"learner_steps": 100, "run": {"env_steps": 5000, "learner_steps": 95, "episodes": 40}}
    assert resumed_counters(meta, 1) == {"env_steps": 5000, "learner_steps": 100, "episodes": 40}
    assert resumed_counters(meta, 2)["learner_steps"] == 200  # data-parallel learners step together
    assert resumed_counters({"learner_steps": 7}, 1) == {"learner_steps": 7}  # a checkpoint without run state
    assert meta["run"]["learner_steps"] == 95  # the meta read is left as it is
    assert run_learner_steps(100, 3) == 300


@pytest.mark.parametrize("learners", [1, 2])
def test_a_resumed_coordinator_reaches_the_budget_where_its_learners_stop(tmp_path, learners):
    path = stale_checkpoint(tmp_path)
    counters = RunCounters()
    run = counters.resume(str(path), learners)
    assert counters.base == {"env_steps": 5000, "learner_steps": 100 * learners, "episodes": 40}
    assert run["learner_steps"] == counters.resumed_from["learner_steps"] == 100 * learners
    cfg = budget_cfg(learners)
    share = -(-BUDGET // learners)  # where each learner stops (`LearnerRole.budget_share`)
    for i in range(learners):  # each resumed learner counts from learner 0's 100 to its share
        counters.set_counters(record(f"learner-{i}"), {"learner_steps": share - 100})
    assert counters.learner_steps >= BUDGET
    reason, counter = stop_criterion(cfg, counters)
    assert reason.startswith("reached scheduled_global_steps") and counter == "learner_steps"


async def test_every_checkpoint_records_the_runs_learner_steps_as_learner_0_counts_them(tmp_path):
    # The coordinator's totals (as the last heartbeat or its run_state reply brought them) are older
    # than learner 0's own count: the checkpoint records learner 0's.
    learner = Learner(coordinator_up=False)
    learner.run_counters = {"env_steps": 5, "learner_steps": 3, "episodes": 1}
    outputs = outputs_of(tmp_path / "gone", learner, checkpoint_interval_s=None, checkpoint_every=None)
    await steps(outputs, learner, 6)
    await outputs.abnormal_end("lost the coordinator: gone")
    (path,) = checkpoint.list_checkpoints(tmp_path / "gone" / "checkpoints")
    meta = checkpoint.read_meta(path)
    assert meta["learner_steps"] == 6 and meta["run"] == {"env_steps": 5, "learner_steps": 6, "episodes": 1}

    # Two data-parallel learners, resumed at learner 0's 6: the next checkpoint records both.
    resumed = Learner()
    outputs = outputs_of(
        tmp_path / "gone", resumed, checkpoint_interval_s=None, checkpoint_every=None, resume_from=str(path)
    )
    outputs.cfg.cluster.learners = 2
    assert await outputs.resume(resumed.core) == 6
    await steps(outputs, resumed, 4)
    await outputs.finish(signalled=False)
    final = checkpoint.read_meta(checkpoint.list_checkpoints(tmp_path / "gone" / "checkpoints")[-1])
    assert final["reason"] == "final" and final["learner_steps"] == 10 and final["run"]["learner_steps"] == 20
    assert final["run"]["env_steps"] == 7  # the coordinator's reply for the rest


def test_the_run_stops_when_every_learner_says_its_budget_is_reached():
    cfg = budget_cfg(2)
    counters = RunCounters()
    # Resumed at learner 0's 20 steps, each learner's share is 80 more; the run's totals started
    # at 20, not 2 x 20 (whatever the cause): they can never reach the budget.
    counters.base["learner_steps"] = 20
    first, second = record("learner-0"), record("learner-1")
    accepted, refused = owned_counters(first, {"learner_steps": 80, BUDGET_REACHED: 1}, 1.0)
    assert not refused
    counters.set_counters(first, accepted)
    assert first.counters == {"learner_steps": 80}  # the word is not a counter: summary.json is unchanged
    assert counters.learner_steps == 100 and stop_criterion(cfg, counters) is None  # one learner of two
    counters.set_counters(second, {"learner_steps": 80})
    assert stop_criterion(cfg, counters) is None  # its share done, but not said
    counters.set_counters(second, {"learner_steps": 80, BUDGET_REACHED: 1})
    assert counters.learner_steps == 180
    assert stop_criterion(cfg, counters) == (
        f"reached scheduled_global_steps (every learner took its share of {BUDGET}; the run counted 180)",
        "learner_steps",
    )


def test_without_a_step_budget_the_learners_word_stops_nothing():
    counters = RunCounters()
    counters.set_counters(record("learner-0"), {"learner_steps": 150, BUDGET_REACHED: 1})
    assert counters.at_budget == {"learner-0"}
    assert stop_criterion(load_config(data={"algo": "random_agent"}), counters) is None
    counters.set_counters(record("actor-0"), {"env_steps": 5, BUDGET_REACHED: 1})  # not a learner's
    assert counters.at_budget == {"learner-0"}


def test_only_a_learner_says_its_budget_is_reached_and_only_once():
    actor = record("actor-0")
    _, refused = owned_counters(actor, {BUDGET_REACHED: 1}, 1.0)
    assert refused == [f"{BUDGET_REACHED}: only learners count it, not actor-0"]
    learner = record("learner-0")
    _, refused = owned_counters(learner, {BUDGET_REACHED: 2}, 1.0)
    assert refused and "grew by 2" in refused[0]


async def test_a_learner_at_its_budget_says_so_with_its_counters(tmp_path):
    learner = make_learner(tmp_path, ["agent.scheduled_global_steps=3"])
    assert BUDGET_REACHED not in learner.counters
    learner.step_base = 2
    learner.counters["learner_steps"] = 0

    learner.core = OneStepCore()
    await learner._train(None, {}, checkpoint_now=False)
    assert learner.counters == {"learner_steps": 1, BUDGET_REACHED: 1}
    assert not await learner._train(None, {}, checkpoint_now=False)  # no step past it
    assert learner.counters == {"learner_steps": 1, BUDGET_REACHED: 1}
