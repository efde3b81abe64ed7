"""Off-policy evaluation during training: at each evaluation (run.eval_every, run.eval_interval_s)
the evaluation process (`aiorl.evaluation.worker`) scores the learner's current policy on the
held-out dataset ``offline.eval_dataset`` too, beside its episodes' return when the run has an
env. The coordinator writes the estimates as ``ope/<name>`` metrics (`OPE_KEYS`,
`aiorl.runtime.evaluator.evaluation_row`).

The target is the policy as evaluation episodes run it: greedy (a greedy target gives weight 0
to every logged episode that leaves its action once, so IPS and WIPS are often undefined here,
None; SIPS, SWIPS, DR and FQE are the ones to watch). The discount is the algorithm's
``model.gamma`` (0.99 when it has none). The behaviour probabilities are found once, at the
start (recorded, or cloned); FQE's model is fitted fully at the first evaluation and then goes on
from the previous one for `LATER_FQE_ITERATIONS` (consecutive policies differ little), so an
evaluation costs a fraction of a second of FQE past the first. No bootstrap intervals: `aiorl ope`
gives them for a policy kept.
"""

from __future__ import annotations

import logging
import time

from aiorl.config import Config
from aiorl.offline.dataset import Dataset
from aiorl.offline.formats import load_dataset
from aiorl.ope.behaviour import behaviour_probabilities
from aiorl.ope.episodes import Trajectories
from aiorl.ope.fqe import FittedQ
from aiorl.ope.report import ESTIMATORS, effective_episodes, estimate_all, n_actions_of
from aiorl.ope.target import target_probabilities
from aiorl.runtime.evaluator import OPE_PREFIX

LATER_FQE_ITERATIONS = 60
DEFAULT_GAMMA = 0.99
#: The keys each evaluation's record gains (`TrainingOpe.score`); metrics.jsonl's ``ope/<name>``.
OPE_KEYS = tuple(f"{OPE_PREFIX}{name}" for name in (*ESTIMATORS, "effective_episodes", "seconds"))

log = logging.getLogger("aiorl.evaluation")


class TrainingOpe:
    """Scores policies on one held-out dataset, again and again."""

    def __init__(self, dataset: Dataset, gamma: float, seed: int = 0):
        self.dataset = dataset
        self.gamma = gamma
        self.n_actions = n_actions_of(dataset)
        self.behaviour, self.source = behaviour_probabilities(dataset, self.n_actions, seed=seed)
        self.fqe = FittedQ(dataset, gamma, seed=seed)
        self.scored = 0
        log.info(
            "off-policy evaluation on %s (%d rows, %d episodes): behaviour probabilities %s",
            dataset.source,
            len(dataset),
            Trajectories.of(dataset).count,
            self.source,
        )

    @classmethod
    def from_config(cls, cfg: Config) -> TrainingOpe | None:
        """The run's (offline.eval_dataset; None without one)."""
        if cfg.offline.eval_dataset is None:
            return None
        return cls(load_dataset(cfg.offline.eval_dataset), getattr(cfg.model, "gamma", DEFAULT_GAMMA), cfg.run.seed)

    def score(self, policy) -> dict[str, float | None]:
        """`policy`'s estimates (greedy), as `OPE_KEYS` of an evaluation's record."""
        t0 = time.perf_counter()
        target = target_probabilities(policy, self.dataset.obs, self.n_actions, 0.0)
        next_target = target_probabilities(policy, self.dataset.next_obs, self.n_actions, 0.0)
        q = self.fqe.fit(next_target, None if self.scored == 0 else LATER_FQE_ITERATIONS)
        self.scored += 1
        estimates = estimate_all(self.dataset, target, self.behaviour, self.gamma, q, bootstrap=0)
        out = {f"{OPE_PREFIX}{name}": None if e.value is None else round(e.value, 4) for name, e in estimates.items()}
        out[f"{OPE_PREFIX}effective_episodes"] = round(effective_episodes(self.dataset, target, self.behaviour), 2)
        out[f"{OPE_PREFIX}seconds"] = round(time.perf_counter() - t0, 3)
        return out
