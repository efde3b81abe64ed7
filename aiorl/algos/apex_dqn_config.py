"""Ape-X DQN's config side (`aiorl.algos.apex_dqn` is the algorithm): its model section and
the checks of it. No torch: loading a config imports this module only."""

from __future__ import annotations

from dataclasses import dataclass

from aiorl.algos.lib.checks import check_common, check_q_learning
from aiorl.algos.lib.layers import parse_network
from aiorl.config import ConfigError, doc
from aiorl.runtime.algorithm import AlgorithmSettings


@dataclass
class ApexDQNConfig:
    network: list = doc(
        "Torso layers, e.g. ['linear:256', 'relu'] or ['nature_cnn'] (see aiorl/algos/lib/"
        "networks.py); empty: nature_cnn for images, two relu layers of 256 otherwise.",
        default_factory=list,
    )
    dueling: bool = doc("Dueling head: Q = V + A - mean(A).", default=True)
    double_q: bool = doc("Double Q: the online net picks the next action, the target net values it.", default=True)
    n_step: int = doc("n of the n-step returns (actors' adjustment).", default=3)
    gamma: float = doc("Discount per env step, in (0, 1].", default=0.99)
    learning_rate: float = doc("Adam step size.", default=1e-4)
    adam_eps: float = doc("Adam epsilon.", default=1.5e-4)
    grad_clip_norm: float | None = doc("Clip the global gradient norm to this (null: no clipping).", default=40.0)
    loss: str = doc("TD loss: 'huber' or 'mse'.", default="huber")
    huber_delta: float = doc("Huber loss threshold.", default=1.0)
    sync_target_frequency: int = doc(
        "Copy the online net to the target net every this many learner steps.", default=2500
    )
    tau: float | None = doc("Soft target update weight per step instead of periodic copies (null: off).", default=None)
    exploration_eps: float = doc("Base epsilon of the per-env-slot epsilon-greedy schedule.", default=0.4)
    exploration_alpha: float = doc(
        "Spread of the epsilons over the S = actors x num_envs env slots: eps^(1 + alpha * j / (S - 1)) for slot j.",
        default=7.0,
    )
    device: str = doc("Learner device: 'cpu', 'cuda', 'cuda:N' or 'auto' (actors always use the CPU).", default="cpu")
    torch_threads: int = doc("torch intra-op threads in each actor and learner process.", default=1)


class ApexDQNSettings(AlgorithmSettings):
    name = "apex_dqn"
    starter = {"agent.scheduled_global_steps": 30000, "run.eval_every": 1000, "run.eval_episodes": 10}
    model_config = ApexDQNConfig
    panel_metrics = (
        ("td loss", "learner/losses/td_loss"),
        ("epsilon (sampled)", "learner/values/sampled_epsilon_mean"),
        ("weights lag", "weights_lag_max"),
    )

    @classmethod
    def validate(cls, cfg):
        m = cfg.model
        check_common(m)
        check_q_learning(m)
        if m.tau is not None and not 0 < m.tau <= 1:
            raise ConfigError(f"model.tau: expected a value in (0, 1] (or null), got {m.tau}")
        parse_network(m.network, "model.network")


SETTINGS = ApexDQNSettings
