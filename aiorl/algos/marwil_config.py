"""MARWIL's config side (`aiorl.algos.marwil` is the algorithm): its model section and the
checks of it (the keys it shares with bc checked by `aiorl.algos.bc_config.check_policy_model`).
No torch: loading a config imports this module only."""

from __future__ import annotations

from dataclasses import dataclass

from aiorl.algos.bc_config import check_policy_model
from aiorl.algos.lib.checks import check_positive
from aiorl.algos.lib.layers import parse_network
from aiorl.algos.lib.offline_starter import CARTPOLE_DATASET_STARTER
from aiorl.config import ConfigError, doc
from aiorl.runtime.algorithm import AlgorithmSettings


@dataclass
class MARWILConfig:
    network: list = doc(
        "Policy torso layers, e.g. ['linear:64', 'relu'] (see aiorl/algos/lib/networks.py); empty: two relu "
        "layers of 256.",
        default_factory=list,
    )
    value_network: list = doc("Layers of the state value V. Empty: as network.", default_factory=list)
    gamma: float = doc("Discount of the Monte Carlo returns (mc_return) V regresses on.", default=0.99)
    beta: float = doc(
        "Inverse temperature of the weights exp(beta * A / c), >= 0: 0 is behaviour cloning (bc).", default=1.0
    )
    max_weight: float = doc("Upper clip of the weights exp(beta * A / c), > 0.", default=100.0)
    moving_average_rate: float = doc(
        "Update rate of c^2, the moving average of the squared advantage: c^2 += rate * (mean A^2 - c^2) "
        "every learner step, in (0, 1].",
        default=1e-3,
    )
    moving_average_start: float = doc("c^2 before the first step (> 0).", default=100.0)
    learning_rate: float = doc("Adam step size of the policy.", default=3e-4)
    value_learning_rate: float = doc("Adam step size of V.", default=1e-3)
    adam_eps: float = doc("Adam epsilon.", default=1e-8)
    grad_clip_norm: float | None = doc(
        "Clip the global gradient norm of each network to this (null: no clipping).", default=None
    )
    log_std_init: float = doc(
        "Box actions: the initial log standard deviation of the Gaussian policy (learned, one per action "
        "dimension, state-independent).",
        default=0.0,
    )
    device: str = doc("Learner device: 'cpu', 'cuda', 'cuda:N' or 'auto'.", default="cpu")
    torch_threads: int = doc("torch intra-op threads in each learner process.", default=1)


class MARWILSettings(AlgorithmSettings):
    name = "marwil"
    offline_only = True
    # A dataset's rows are sampled uniformly: marwil gives no priorities back.
    agent_defaults = {"batch_size": 256, "prioritized_replay": False}
    starter = dict(CARTPOLE_DATASET_STARTER)
    model_config = MARWILConfig
    panel_metrics = (
        ("policy loss", "learner/losses/policy_loss"),
        ("value loss", "learner/losses/value_loss"),
        ("weight mean", "learner/values/weight_mean"),
    )

    @classmethod
    def validate(cls, cfg):
        m = cfg.model
        check_policy_model(m)
        if not 0 < m.gamma <= 1:
            raise ConfigError(f"model.gamma: expected a value in (0, 1], got {m.gamma}")
        if not m.beta >= 0:
            raise ConfigError(f"model.beta: must be >= 0 (0: behaviour cloning), got {m.beta}")
        check_positive(m.max_weight, "model.max_weight")
        if not 0 < m.moving_average_rate <= 1:
            raise ConfigError(f"model.moving_average_rate: expected a value in (0, 1], got {m.moving_average_rate}")
        check_positive(m.moving_average_start, "model.moving_average_start")
        check_positive(m.value_learning_rate, "model.value_learning_rate")
        parse_network(m.value_network, "model.value_network")


SETTINGS = MARWILSettings
