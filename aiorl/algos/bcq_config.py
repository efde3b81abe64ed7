"""Discrete BCQ's config side (`aiorl.algos.bcq` is the algorithm): its model section and the
checks of it, which CQL's config shares (`check_offline_q`). No torch: loading a config imports
this module only."""

from __future__ import annotations

from dataclasses import dataclass

from aiorl.algos.lib.checks import check_common, check_positive
from aiorl.algos.lib.layers import parse_network
from aiorl.algos.lib.offline_starter import CARTPOLE_DATASET_STARTER
from aiorl.config import ConfigError, doc
from aiorl.runtime.algorithm import AlgorithmSettings


@dataclass
class BCQConfig:
    network: list = doc(
        "Torso layers, e.g. ['linear:64', 'relu'] (see aiorl/algos/lib/networks.py); empty: two relu layers of 256.",
        default_factory=list,
    )
    shared_torso: bool = doc(
        "One torso under the Q head and the behaviour head (Fujimoto et al. 2019); false: the behaviour head "
        "has a torso of its own (EasyRL's generative model).",
        default=True,
    )
    ratio_threshold: float = doc(
        "Actions a with pi_b(a|s) / max_a' pi_b(a'|s) <= this are never chosen (in the target's argmax and in "
        "acting), in [0, 1): 0 is DQN on the dataset, towards 1 is behaviour cloning.",
        default=0.3,
    )
    behaviour_logit_penalty: float = doc(
        "Weight of the mean squared behaviour logits added to its cross-entropy (>= 0), which keeps the logits "
        "from running off on actions the dataset always takes.",
        default=0.01,
    )
    dueling: bool = doc("Dueling Q head: Q = V + A - mean(A).", default=True)
    double_q: bool = doc(
        "Double Q: the online net picks the next action (among the allowed ones), the target net values it.",
        default=True,
    )
    n_step: int = doc("n of the n-step returns the dataset's rows are made of.", default=1)
    gamma: float = doc("Discount per env step, in (0, 1].", default=0.99)
    learning_rate: float = doc("Adam step size.", default=1e-3)
    adam_eps: float = doc("Adam epsilon.", default=1e-8)
    grad_clip_norm: float | None = doc("Clip the global gradient norm to this (null: no clipping).", default=40.0)
    loss: str = doc("TD loss: 'huber' or 'mse'.", default="huber")
    huber_delta: float = doc("Huber loss threshold.", default=1.0)
    sync_target_frequency: int = doc(
        "Copy the online net to the target net every this many learner steps.", default=1000
    )
    tau: float | None = doc("Soft target update weight per step instead of periodic copies (null: off).", default=None)
    device: str = doc("Learner device: 'cpu', 'cuda', 'cuda:N' or 'auto'.", default="cpu")
    torch_threads: int = doc("torch intra-op threads in each learner process.", default=1)


def check_offline_q(m, key: str = "model") -> None:
    """The keys bcq's and cql's model sections share; ConfigError naming the key."""
    check_common(m, key)
    check_positive(m.learning_rate, f"{key}.learning_rate")
    check_positive(m.adam_eps, f"{key}.adam_eps")
    if m.sync_target_frequency < 1:
        raise ConfigError(f"{key}.sync_target_frequency: must be at least 1, got {m.sync_target_frequency}")
    if m.tau is not None and not 0 < m.tau <= 1:
        raise ConfigError(f"{key}.tau: expected a value in (0, 1] (or null), got {m.tau}")
    parse_network(m.network, f"{key}.network")


class BCQSettings(AlgorithmSettings):
    name = "bcq"
    offline_only = True
    # The dataset's rows uniformly, as Fujimoto et al. and d3rlpy sample them.
    agent_defaults = {"batch_size": 256, "prioritized_replay": False}
    starter = dict(CARTPOLE_DATASET_STARTER)
    model_config = BCQConfig
    panel_metrics = (
        ("td loss", "learner/losses/td_loss"),
        ("behaviour loss", "learner/losses/behaviour_loss"),
        ("allowed actions", "learner/values/allowed_actions_mean"),
    )

    @classmethod
    def validate(cls, cfg):
        m = cfg.model
        check_offline_q(m)
        if not 0 <= m.ratio_threshold < 1:
            raise ConfigError(
                f"model.ratio_threshold: expected a value in [0, 1) (0: every action allowed), got {m.ratio_threshold}"
            )
        if not m.behaviour_logit_penalty >= 0:
            raise ConfigError(f"model.behaviour_logit_penalty: must be >= 0, got {m.behaviour_logit_penalty}")


SETTINGS = BCQSettings
