"""IQL's config side (`aiorl.algos.iql` is the algorithm): its model section and the checks
of it. No torch: loading a config imports this module only."""

from __future__ import annotations

import re
from dataclasses import dataclass

from aiorl.algos.lib.checks import check_positive
from aiorl.algos.lib.layers import parse_network
from aiorl.config import ConfigError, doc
from aiorl.runtime.algorithm import AlgorithmSettings


@dataclass
class IQLConfig:
    actor_network: list = doc(
        "Actor torso layers (see aiorl/algos/lib/networks.py); empty: two relu layers of 256.",
        default_factory=list,
    )
    critic_network: list = doc(
        "Layers of each of the two Q critics (the action joins at the input). Empty: as actor_network's default.",
        default_factory=list,
    )
    value_network: list = doc("Layers of the state value V. Empty: as actor_network's default.", default_factory=list)
    n_step: int = doc("n of the n-step rows the dataset is read as (1: the paper's one-step target).", default=1)
    gamma: float = doc("Discount per env step, in (0, 1].", default=0.99)
    expectile: float = doc(
        "tau of the expectile regression of V on Q, in [0.5, 1): 0.5 fits the mean (SARSA), "
        "towards 1 the max over the dataset's actions.",
        default=0.7,
    )
    beta: float = doc(
        "Inverse temperature of the advantage weights exp(beta * A), >= 0: 0 is behaviour cloning.",
        default=3.0,
    )
    max_weight: float = doc("Upper clip of the advantage weights exp(beta * A), > 0.", default=100.0)
    reward_scale: float = doc("Rewards are multiplied by this before the Q target (> 0).", default=1.0)
    actor_learning_rate: float = doc("Adam step size of the actor.", default=3e-4)
    critic_learning_rate: float = doc("Adam step size of the two Q critics.", default=3e-4)
    value_learning_rate: float = doc("Adam step size of V.", default=3e-4)
    adam_eps: float = doc("Adam epsilon.", default=1e-8)
    grad_clip_norm: float | None = doc("Clip each network's global gradient norm (null: no clipping).", default=None)
    tau: float = doc("Soft target update weight of the Q targets per learner step, in (0, 1].", default=0.005)
    min_log_std: float = doc(
        "Lower clip of the actor's log standard deviation (in [-1, 1] action units).", default=-5.0
    )
    max_log_std: float = doc("Upper clip of the actor's log standard deviation.", default=2.0)
    device: str = doc("Learner device: 'cpu', 'cuda', 'cuda:N' or 'auto'.", default="cpu")
    torch_threads: int = doc("torch intra-op threads in each learner process.", default=1)


class IQLSettings(AlgorithmSettings):
    name = "iql"
    offline_only = True
    starter = {
        "env.id": "Pendulum-v1",
        "offline.dataset": "datasets/pendulum_ddpg",
        "agent.scheduled_global_steps": 10000,
        "agent.batch_size": 256,
        "run.eval_every": 2000,
        "run.eval_episodes": 10,
    }
    model_config = IQLConfig
    panel_metrics = (
        ("critic loss", "learner/losses/critic_loss"),
        ("value loss", "learner/losses/value_loss"),
        ("actor loss", "learner/losses/actor_loss"),
    )

    @classmethod
    def validate(cls, cfg):
        m = cfg.model
        _check_steps(m)
        _check_rates(m)
        if not re.fullmatch(r"auto|cpu|cuda(:\d+)?", m.device):
            raise ConfigError(f"model.device: expected 'auto', 'cpu', 'cuda' or 'cuda:N', got {m.device!r}")
        for key in ("actor_network", "critic_network", "value_network"):
            parse_network(getattr(m, key), f"model.{key}")


def _check_steps(m) -> None:
    """The return's and the losses' own values."""
    if m.n_step < 1:
        raise ConfigError(f"model.n_step: must be at least 1, got {m.n_step}")
    if not 0 < m.gamma <= 1:
        raise ConfigError(f"model.gamma: expected a value in (0, 1], got {m.gamma}")
    if not 0.5 <= m.expectile < 1:
        raise ConfigError(f"model.expectile: expected a value in [0.5, 1), got {m.expectile}")
    if m.beta < 0:
        raise ConfigError(f"model.beta: must be >= 0 (0: behaviour cloning), got {m.beta}")
    if not m.min_log_std < m.max_log_std:
        raise ConfigError(f"model.min_log_std: must be below model.max_log_std, got {m.min_log_std} >= {m.max_log_std}")
    if m.torch_threads < 1:
        raise ConfigError(f"model.torch_threads: must be at least 1, got {m.torch_threads}")


def _check_rates(m) -> None:
    """Step sizes, weights and clips: each positive."""
    for key in ("max_weight", "reward_scale", "actor_learning_rate", "critic_learning_rate"):
        check_positive(getattr(m, key), f"model.{key}")
    for key in ("value_learning_rate", "adam_eps"):
        check_positive(getattr(m, key), f"model.{key}")
    if m.grad_clip_norm is not None and m.grad_clip_norm <= 0:
        raise ConfigError(f"model.grad_clip_norm: must be > 0 (or null), got {m.grad_clip_norm}")
    if not 0 < m.tau <= 1:
        raise ConfigError(f"model.tau: expected a value in (0, 1], got {m.tau}")


SETTINGS = IQLSettings
