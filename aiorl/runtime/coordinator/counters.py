"""The run's counters and its stop: global counters summed over every role's (retired
incarnations included), the last 100 episodes' returns, learner 0's evaluations, the
run's clock, the stop criteria, and the stop once decided.

A resumed run (``AIORL_RESUME_FROM``, see `aiorl.io.rundir`) starts its global
counters, return window and clock from the checkpoint's, its learner steps from learner
0's own count (`aiorl.io.rundir.resumed_counters`), where its learners start. A learner
that stopped on its share of ``agent.scheduled_global_steps`` says so with its counters
(`BUDGET_REACHED`); once every learner has, the run has reached its budget, whatever its
totals say: no more learner steps can come.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time

import numpy as np

from aiorl.config import Config
from aiorl.io import checkpoint
from aiorl.io.rundir import resumed_counters
from aiorl.runtime.coordinator.roster import RoleRecord
from aiorl.runtime.dataset_source import run_dataset
from aiorl.runtime.evaluator import evaluation_on

log = logging.getLogger("aiorl.coordinator")

COUNTERS = ("env_steps", "learner_steps")
# A learner's word, sent with its counters (1) once it stopped on its share of the step budget;
# kept apart from them (`RunCounters.set_counters`), never summed.
BUDGET_REACHED = "budget_reached"
# Each counter comes only from the role kind that owns it.
OWNERS = {"env_steps": "actor", "learner_steps": "learner", BUDGET_REACHED: "learner"}
# The most a role's counter can grow per second of the coordinator's time, plus a step's worth:
# far above any real role (a vectorized ALE actor makes ~50k env steps/s, a small learner a few
# thousand steps/s), far below a forged total (10**12 learner steps in one heartbeat).
MAX_GROWTH_PER_S = {"env_steps": 10_000_000, "learner_steps": 100_000, BUDGET_REACHED: 0}
MAX_GROWTH = {"env_steps": 1_000_000, "learner_steps": 10_000, BUDGET_REACHED: 1}


def owned_counters(record: RoleRecord, counters: dict, now: float) -> tuple[dict, list[str]]:
    """`record`'s counters with what `counters` may change of them: only the keys its kind owns,
    only growing, by a plausible amount since they were last accepted; and why the rest was
    refused. The counters accepted are stamped `now` (loop time)."""
    accepted, refused = dict(record.counters), []
    dt = max(0.0, now - record.counters_time)
    for key, value in counters.items():
        owner = OWNERS.get(key)
        old = record.counters.get(key, 0)
        if owner != record.kind:
            refused.append(f"{key}: only {owner or 'no role'}s count it, not {record.name}")
        elif value < old:
            refused.append(f"{key}: went down from {old} to {value}")
        elif value - old > MAX_GROWTH[key] + MAX_GROWTH_PER_S[key] * dt:
            refused.append(f"{key}: grew by {value - old} in {dt:.1f} s, more than a role can")
        else:
            accepted[key] = value
    if not refused:  # a refused burst is judged again against the time since the last accepted
        record.counters_time = now
    return accepted, refused


class RunCounters:
    """Counters, returns, evaluations and the clock of the whole run."""

    def __init__(self):
        self.base = {"env_steps": 0, "learner_steps": 0, "episodes": 0}  # from the checkpoint resumed
        self._totals = dict.fromkeys(COUNTERS, 0)  # over every role's counters, retired ones too
        self.returns = collections.deque(maxlen=100)
        self.lengths = collections.deque(maxlen=100)
        self.episodes = 0
        self.evaluation: dict | None = None  # learner 0's last and best evaluations (aiorl.runtime.evaluator)
        self.evaluations_seen = 0  # the newest evaluation's number (n) taken
        self.evaluation_rows: list[dict] = []  # evaluations taken that no metrics row holds yet
        self.top: dict | None = None  # the evaluation taken with the highest mean return (the first of equals)
        self.t_start = time.time()
        self.t_running: float | None = None
        self.resumed_from: dict | None = None
        self.at_budget: set[str] = set()  # the learners that said they reached their share of the budget

    def resume(self, path: str, learners: int) -> dict:
        """Start counters, returns and clock where the checkpoint at `path` left them, the learner
        steps where this launch's `learners` start (`resumed_counters`); return that run state."""
        run = resumed_counters(checkpoint.read_meta(path), learners)
        for key in self.base:
            self.base[key] = int(run.get(key, 0))
        self.episodes = self.base["episodes"]
        self.returns.extend(float(r) for r in run.get("returns", ()))
        self.lengths.extend(int(n) for n in run.get("lengths", ()))
        self.t_start -= float(run.get("time_s", 0.0))
        self.resumed_from = {"checkpoint": path, **self.base}
        log.info(
            "resuming from %s: env_steps %d, learner_steps %d, episodes %d",
            path,
            self.base["env_steps"],
            self.base["learner_steps"],
            self.base["episodes"],
        )
        return run

    @property
    def env_steps(self) -> int:
        return self.base["env_steps"] + self._totals["env_steps"]

    @property
    def learner_steps(self) -> int:
        return self.base["learner_steps"] + self._totals["learner_steps"]

    def set_counters(self, record: RoleRecord, counters: dict) -> None:
        """A role's new counters, and the run's totals moved by the difference.

        Every heartbeat reply carries the totals: summing every role's counters
        for each one made a heartbeat cost O(roles), a round of them O(roles^2)
        (a third of the coordinator's time at 512 actors, bench/scale.py).
        A restart moves counters to ``retired``, which leaves the totals as they are.
        A learner's `BUDGET_REACHED` is taken out of them (summary.json lists a role's counters).
        """
        counters = dict(counters)
        if counters.pop(BUDGET_REACHED, 0) and record.kind == "learner":
            self.at_budget.add(record.name)
        totals, old = self._totals, record.counters
        for key in COUNTERS:
            totals[key] += counters.get(key, 0) - old.get(key, 0)
        record.counters = counters

    def add_episodes(self, returns: list, lengths) -> None:
        self.returns.extend(returns)
        self.lengths.extend(lengths)
        self.episodes += len(returns)

    def add_evaluation(self, summary: dict) -> None:
        """Learner 0's evaluations as its heartbeat carries them (`Evaluator.summary`): each one not
        taken yet (by its number) makes a metrics row, however many one heartbeat brings."""
        new = summary.get("new")
        if new is None:  # a learner that sends only its last one
            new = [] if summary["last"] is None else [summary["last"]]
        for evaluation in sorted(new, key=lambda e: e["n"]):
            if evaluation["n"] > self.evaluations_seen:
                self.evaluations_seen = evaluation["n"]
                self.evaluation_rows.append(evaluation)
                scored = evaluation["return_mean"] is not None  # an offline run's estimates alone: no return
                if scored and (self.top is None or evaluation["return_mean"] > self.top["return_mean"]):
                    self.top = evaluation
        self.evaluation = {k: v for k, v in summary.items() if k != "new"}

    def take_evaluation_rows(self) -> list[dict]:
        """The evaluations taken since the last call, oldest first."""
        rows, self.evaluation_rows = self.evaluation_rows, []
        return rows

    def epochs(self, cfg: Config) -> float | None:
        """An offline run's passes over its dataset so far: rows the learners sampled (every learner
        step one batch) over the dataset's rows (read by memory host 0 already); None online."""
        if cfg.offline.dataset is None:
            return None
        return self.learner_steps * cfg.agent.batch_size / len(run_dataset(cfg))

    def return_mean(self) -> float | None:
        return float(np.mean(self.returns)) if self.returns else None

    def run_state(self, weights_version: int) -> dict:
        """What a checkpoint records of the run, so that a resume continues it."""
        return {
            "env_steps": self.env_steps,
            "learner_steps": self.learner_steps,
            "episodes": self.episodes,
            "weights_version": weights_version,
            "returns": list(self.returns),
            "lengths": list(self.lengths),
            "time_s": round(time.time() - self.t_start, 3),
        }


def metrics_step(cfg: Config) -> str:
    """The counter metrics rows are logged at (TensorBoard's step): env steps, or an offline run's
    learner steps (it takes no env step)."""
    return "env_steps" if cfg.offline.dataset is None else "learner_steps"


def stop_criterion(cfg: Config, counters: RunCounters) -> tuple[str, str | None] | None:
    """Why the run should stop now by its criteria (`agent.*`), with the counter that reached its
    budget (None: a return reached its target); None: go on."""
    a = cfg.agent
    if a.scheduled_timesteps is not None and counters.env_steps >= a.scheduled_timesteps:
        return f"reached scheduled_timesteps ({counters.env_steps} >= {a.scheduled_timesteps})", "env_steps"
    if a.scheduled_global_steps is not None and counters.learner_steps >= a.scheduled_global_steps:
        return (
            f"reached scheduled_global_steps ({counters.learner_steps} >= {a.scheduled_global_steps})",
            "learner_steps",
        )
    epochs = counters.epochs(cfg)
    if cfg.offline.epochs is not None and epochs is not None and epochs >= cfg.offline.epochs:
        return (
            f"reached offline.epochs ({epochs:.3g} passes over the dataset's {len(run_dataset(cfg))} rows: "
            f"{counters.learner_steps} learner steps x agent.batch_size {a.batch_size} >= {cfg.offline.epochs})",
            "learner_steps",
        )
    if a.scheduled_global_steps is not None and len(counters.at_budget) >= cfg.cluster.learners:
        # Every learner stopped on its share: the totals may be short (a learner's counters refused,
        # a resume's start), and waiting for the rest would be for ever.
        return (
            f"reached scheduled_global_steps (every learner took its share of {a.scheduled_global_steps}; "
            f"the run counted {counters.learner_steps})",
            "learner_steps",
        )
    if a.target_return is not None and evaluation_on(cfg):
        hit = counters.top  # of every evaluation this launch: two in one heartbeat are both held to it
        if hit is not None and hit["return_mean"] >= a.target_return:
            return (
                f"evaluation {hit['n']} (learner step {hit['learner_steps']}): mean return "
                f"{hit['return_mean']:.1f} >= target_return {a.target_return}",
                None,
            )
        return None
    returns = counters.returns
    if a.target_return is not None and len(returns) >= min(100, returns.maxlen):
        mean = float(np.mean(returns))
        if mean >= a.target_return:
            return (
                f"mean return of the last {len(returns)} episodes {mean:.1f} >= target_return {a.target_return}",
                None,
            )
    return None


class Stop:
    """The run's stop, once decided: why, at which counters, and whether it is a failure."""

    def __init__(self):
        self.reason: str | None = None
        # The counters the stop was decided on; the final ones are larger by the work in flight
        # then (a learner trains the batches it holds credits for). A budget's stop records only
        # its counter: the other is as old as its owners' last heartbeat (0 for a quick run).
        self.at: dict | None = None
        self.event = asyncio.Event()
        self.failures: list[str] = []  # run-level; lost and failed roles are added at the end
        self.by_failure = False
        self.interrupted_by: str | None = None  # the signal that stopped the run

    def begin(
        self,
        reason: str,
        counters: RunCounters,
        failed: bool = False,
        listed_later: bool = False,
        counter: str | None = None,
    ) -> None:
        """Stop the run; `failed`: because something went wrong (`listed_later`: a role's loss,
        which the outcome lists at the end); `counter`: the one whose budget was reached."""
        if failed:
            self.by_failure = True
            if not listed_later:
                self.failures.append(reason)
        if self.event.is_set():
            return
        log.info("stopping: %s", reason)
        self.reason = reason
        self.at = {"env_steps": counters.env_steps, "learner_steps": counters.learner_steps}
        if counter is not None:
            self.at = {counter: self.at[counter]}
        self.event.set()
