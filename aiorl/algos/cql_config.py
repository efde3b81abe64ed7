"""Discrete CQL's config side (`aiorl.algos.cql` is the algorithm): its model section and the
checks of it (the keys it shares with bcq checked by `aiorl.algos.bcq_config.check_offline_q`).
No torch: loading a config imports this module only."""

from __future__ import annotations

from dataclasses import dataclass

from aiorl.algos.bcq_config import check_offline_q
from aiorl.algos.lib.offline_starter import CARTPOLE_DATASET_STARTER
from aiorl.config import ConfigError, doc
from aiorl.runtime.algorithm import AlgorithmSettings


@dataclass
class CQLConfig:
    network: list = doc(
        "Torso layers, e.g. ['linear:64', 'relu'] (see aiorl/algos/lib/networks.py); empty: two relu layers of 256.",
        default_factory=list,
    )
    alpha: float = doc(
        "Weight of the conservative term alpha * (logsumexp_a Q(s, a) - Q(s, a_data)) beside the TD loss, >= 0: "
        "0 is DQN on the dataset; larger values hold Q down on actions the dataset does not take (towards "
        "behaviour cloning). In units of the TD loss: scale it with the rewards.",
        default=1.0,
    )
    dueling: bool = doc("Dueling Q head: Q = V + A - mean(A).", default=True)
    double_q: bool = doc("Double Q: the online net picks the next action, the target net values it.", default=True)
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


class CQLSettings(AlgorithmSettings):
    name = "cql"
    offline_only = True
    # The dataset's rows uniformly, as Kumar et al. and d3rlpy sample them.
    agent_defaults = {"batch_size": 256, "prioritized_replay": False}
    starter = dict(CARTPOLE_DATASET_STARTER)
    model_config = CQLConfig
    panel_metrics = (
        ("td loss", "learner/losses/td_loss"),
        ("conservative", "learner/losses/conservative_loss"),
        ("q mean", "learner/values/q_mean"),
    )

    @classmethod
    def validate(cls, cfg):
        m = cfg.model
        check_offline_q(m)
        if not m.alpha >= 0:
            raise ConfigError(f"model.alpha: must be >= 0 (0: DQN on the dataset), got {m.alpha}")


SETTINGS = CQLSettings
