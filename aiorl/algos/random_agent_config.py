"""The random agent's config side (`aiorl.algos.random_agent` is the algorithm): its model
section and the checks of it, in a module of its own like every algorithm's (the registry
lists the algorithms by these modules)."""

from __future__ import annotations

from dataclasses import dataclass

from aiorl.config import ConfigError, doc
from aiorl.runtime.algorithm import AlgorithmSettings


@dataclass
class RandomAgentConfig:
    n_step: int = doc("n of the n-step adjustment applied by actors.", default=1)
    gamma: float = doc("Discount of the n-step returns.", default=0.99)
    learning_rate: float = doc("Step size of the learner's running mean.", default=0.1)
    synchronous: bool = doc("Run as a synchronous (barrier) algorithm.", default=False)
    learner_step_sleep_s: float = doc(
        "Seconds each learner step blocks without the GIL, standing in for a long torch step.", default=0.0
    )


class RandomAgentSettings(AlgorithmSettings):
    name = "random_agent"
    starter = {"agent.scheduled_timesteps": 10000}
    model_config = RandomAgentConfig
    panel_metrics = (("loss", "learner/loss"),)

    @classmethod
    def is_synchronous(cls, cfg):
        return bool(cfg.model.synchronous)

    @classmethod
    def validate(cls, cfg):
        if cfg.model.n_step < 1:
            raise ConfigError(f"model.n_step: must be at least 1, got {cfg.model.n_step}")
        if not 0 < cfg.model.gamma <= 1:
            raise ConfigError(f"model.gamma: expected a value in (0, 1], got {cfg.model.gamma}")


SETTINGS = RandomAgentSettings
