"""Behaviour cloning's config side (`aiorl.algos.bc` is the algorithm): its model section and
the checks of it, which MARWIL's config shares (`check_policy_model`). No torch: loading a
config imports this module only."""

from __future__ import annotations

import re
from dataclasses import dataclass

from aiorl.algos.lib.checks import check_positive
from aiorl.algos.lib.layers import parse_network
from aiorl.algos.lib.offline_starter import CARTPOLE_DATASET_STARTER
from aiorl.config import ConfigError, doc
from aiorl.runtime.algorithm import AlgorithmSettings


@dataclass
class BCConfig:
    network: list = doc(
        "Policy torso layers, e.g. ['linear:64', 'relu'] (see aiorl/algos/lib/networks.py); empty: two relu "
        "layers of 256.",
        default_factory=list,
    )
    learning_rate: float = doc("Adam step size.", default=3e-4)
    adam_eps: float = doc("Adam epsilon.", default=1e-8)
    grad_clip_norm: float | None = doc("Clip the global gradient norm to this (null: no clipping).", default=None)
    log_std_init: float = doc(
        "Box actions: the initial log standard deviation of the Gaussian policy (learned, one per action "
        "dimension, state-independent).",
        default=0.0,
    )
    device: str = doc("Learner device: 'cpu', 'cuda', 'cuda:N' or 'auto'.", default="cpu")
    torch_threads: int = doc("torch intra-op threads in each learner process.", default=1)


def check_policy_model(m, key: str = "model") -> None:
    """The keys bc's and marwil's model sections share; ConfigError naming the key."""
    check_positive(m.learning_rate, f"{key}.learning_rate")
    check_positive(m.adam_eps, f"{key}.adam_eps")
    if m.grad_clip_norm is not None and m.grad_clip_norm <= 0:
        raise ConfigError(f"{key}.grad_clip_norm: must be > 0 (or null to turn clipping off), got {m.grad_clip_norm}")
    if m.torch_threads < 1:
        raise ConfigError(f"{key}.torch_threads: must be at least 1, got {m.torch_threads}")
    if not re.fullmatch(r"auto|cpu|cuda(:\d+)?", m.device):
        raise ConfigError(f"{key}.device: expected 'auto', 'cpu', 'cuda' or 'cuda:N', got {m.device!r}")
    parse_network(m.network, f"{key}.network")


class BCSettings(AlgorithmSettings):
    name = "bc"
    offline_only = True
    # A dataset's rows are sampled uniformly: bc gives no priorities back.
    agent_defaults = {"batch_size": 256, "prioritized_replay": False}
    starter = dict(CARTPOLE_DATASET_STARTER)
    model_config = BCConfig
    panel_metrics = (
        ("policy loss", "learner/losses/policy_loss"),
        ("entropy", "learner/values/entropy"),
    )

    @classmethod
    def validate(cls, cfg):
        check_policy_model(cfg.model)


SETTINGS = BCSettings
