"""Config checks shared by the algorithms' settings (`aiorl/algos/*_config.py`); no torch."""

from __future__ import annotations

import re

from aiorl.config import ConfigError


def check_common(model, key: str = "model") -> None:
    """Values every Ape-X model section has; raise ConfigError naming the key."""
    if model.n_step < 1:
        raise ConfigError(f"{key}.n_step: must be at least 1, got {model.n_step}")
    if not 0 < model.gamma <= 1:
        raise ConfigError(f"{key}.gamma: expected a value in (0, 1], got {model.gamma}")
    if model.torch_threads < 1:
        raise ConfigError(f"{key}.torch_threads: must be at least 1, got {model.torch_threads}")
    if model.grad_clip_norm is not None and model.grad_clip_norm <= 0:
        raise ConfigError(
            f"{key}.grad_clip_norm: must be > 0 (or null to turn clipping off), got {model.grad_clip_norm}"
        )
    if model.loss not in ("huber", "mse"):
        raise ConfigError(f"{key}.loss: expected 'huber' or 'mse', got {model.loss!r}")
    if model.huber_delta <= 0:
        raise ConfigError(f"{key}.huber_delta: must be > 0, got {model.huber_delta}")
    if not re.fullmatch(r"auto|cpu|cuda(:\d+)?", model.device):
        raise ConfigError(f"{key}.device: expected 'auto', 'cpu', 'cuda' or 'cuda:N', got {model.device!r}")


def check_q_learning(model, key: str = "model") -> None:
    """Values every Q-learning model section (Ape-X DQN, R2D2) has: a target period and the
    per-slot epsilon-greedy schedule; raise ConfigError naming the key."""
    check_positive(model.learning_rate, f"{key}.learning_rate")
    check_positive(model.adam_eps, f"{key}.adam_eps")
    if model.sync_target_frequency < 1:
        raise ConfigError(f"{key}.sync_target_frequency: must be at least 1, got {model.sync_target_frequency}")
    if not 0 <= model.exploration_eps <= 1:
        raise ConfigError(f"{key}.exploration_eps: expected a value in [0, 1], got {model.exploration_eps}")
    if model.exploration_alpha < 0:
        raise ConfigError(f"{key}.exploration_alpha: must be >= 0, got {model.exploration_alpha}")


def check_positive(value: float, key: str) -> None:
    if not value > 0:
        raise ConfigError(f"{key}: must be > 0, got {value}")


RECURRENT_TYPES = ("lstm", "gru")


def check_recurrent(recurrent) -> tuple[str, int] | None:
    """``model.recurrent`` ({type: lstm | gru, hidden: N} or null) as (type, hidden); ConfigError
    naming the value and what was expected."""
    if recurrent is None:
        return None
    if not isinstance(recurrent, dict) or set(recurrent) - {"type", "hidden"} or "type" not in recurrent:
        raise ConfigError(f"model.recurrent: expected {{type: lstm | gru, hidden: N}} (or null), got {recurrent!r}")
    kind, hidden = recurrent["type"], recurrent.get("hidden", 64)
    if kind not in RECURRENT_TYPES:
        raise ConfigError(f"model.recurrent.type: expected 'lstm' or 'gru', got {kind!r}")
    if isinstance(hidden, bool) or not isinstance(hidden, int) or hidden <= 0:
        raise ConfigError(f"model.recurrent.hidden: expected an integer > 0 (the state's width), got {hidden!r}")
    return kind, hidden
