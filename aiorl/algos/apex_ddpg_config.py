"""Ape-X DDPG's config side (`aiorl.algos.apex_ddpg` is the algorithm): its model section and
the checks of it. No torch: loading a config imports this module only."""

from __future__ import annotations

from dataclasses import dataclass

from aiorl.algos.lib.checks import check_common, check_positive
from aiorl.algos.lib.layers import parse_network
from aiorl.config import ConfigError, doc
from aiorl.runtime.algorithm import AlgorithmSettings


@dataclass
class ApexDDPGConfig:
    actor_network: list = doc(
        "Actor torso layers (see aiorl/algos/lib/networks.py); empty: nature_cnn for "
        "images, two relu layers of 256 otherwise.",
        default_factory=list,
    )
    critic_network: list = doc(
        "Critic layers; the action joins where features become flat (at the input "
        "for vector observations). Empty: as actor_network's default.",
        default_factory=list,
    )
    n_step: int = doc("n of the n-step returns (actors' adjustment).", default=3)
    gamma: float = doc("Discount per env step, in (0, 1].", default=0.99)
    actor_learning_rate: float = doc("Adam step size of the actor.", default=1e-4)
    critic_learning_rate: float = doc("Adam step size of the critic.", default=1e-3)
    adam_eps: float = doc("Adam epsilon.", default=1e-8)
    grad_clip_norm: float | None = doc("Clip each network's global gradient norm (null: no clipping).", default=None)
    loss: str = doc("Critic loss: 'mse' or 'huber'.", default="mse")
    huber_delta: float = doc("Huber loss threshold.", default=1.0)
    tau: float = doc("Soft target update weight per learner step, in (0, 1].", default=0.005)
    exploration: str = doc("Exploration noise: 'gaussian' or 'ou' (Ornstein-Uhlenbeck), per actor.", default="gaussian")
    exploration_sigma: float = doc("Noise scale as a fraction of each action's half range.", default=0.1)
    ou_theta: float = doc("Mean reversion of the OU noise per step.", default=0.15)
    device: str = doc("Learner device: 'cpu', 'cuda', 'cuda:N' or 'auto' (actors always use the CPU).", default="cpu")
    torch_threads: int = doc("torch intra-op threads in each actor and learner process.", default=1)


class ApexDDPGSettings(AlgorithmSettings):
    name = "apex_ddpg"
    starter = {
        "env.id": "Pendulum-v1",
        "agent.scheduled_global_steps": 5000,
        "run.eval_every": 500,
        "run.eval_episodes": 10,
    }
    model_config = ApexDDPGConfig
    panel_metrics = (
        ("critic loss", "learner/losses/critic_loss"),
        ("actor loss", "learner/losses/actor_loss"),
        ("weights lag", "weights_lag_max"),
    )

    @classmethod
    def validate(cls, cfg):
        m = cfg.model
        check_common(m)
        check_positive(m.actor_learning_rate, "model.actor_learning_rate")
        check_positive(m.critic_learning_rate, "model.critic_learning_rate")
        check_positive(m.adam_eps, "model.adam_eps")
        if not 0 < m.tau <= 1:
            raise ConfigError(f"model.tau: expected a value in (0, 1], got {m.tau}")
        if m.exploration not in ("gaussian", "ou"):
            raise ConfigError(f"model.exploration: expected 'gaussian' or 'ou', got {m.exploration!r}")
        if m.exploration_sigma < 0:
            raise ConfigError(f"model.exploration_sigma: must be >= 0, got {m.exploration_sigma}")
        if not 0 < m.ou_theta <= 1:
            raise ConfigError(f"model.ou_theta: expected a value in (0, 1], got {m.ou_theta}")
        parse_network(m.actor_network, "model.actor_network")
        parse_network(m.critic_network, "model.critic_network")


SETTINGS = ApexDDPGSettings
