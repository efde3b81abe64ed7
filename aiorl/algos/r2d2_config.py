"""R2D2's config side (`aiorl.algos.r2d2` is the algorithm): its model section and the checks
of it. No torch: loading a config imports this module only."""

from __future__ import annotations

from dataclasses import dataclass

from aiorl.algos.lib.checks import check_common, check_positive, check_q_learning, check_recurrent
from aiorl.algos.lib.layers import parse_network
from aiorl.config import ConfigError, doc
from aiorl.runtime.algorithm import AlgorithmSettings

START_STATES = ("stored", "zero")


@dataclass
class R2D2Config:
    network: list = doc(
        "Torso layers before the recurrent core, e.g. ['linear:64', 'relu'] (see aiorl/algos/lib/networks.py); "
        "empty: nature_cnn for images, ['linear:256', 'relu'] otherwise.",
        default_factory=list,
    )
    recurrent: dict | None = doc(
        "The recurrent core after the torso: {type: lstm | gru, hidden: N}; null: a feed-forward Q network "
        "trained on the same sequences (a baseline without memory).",
        default_factory=lambda: {"type": "lstm", "hidden": 256},
    )
    dueling: bool = doc("Dueling head: Q = V + A - mean(A).", default=True)
    sequence_length: int = doc("m: env steps per replayed sequence, burn-in included.", default=80)
    sequence_overlap: int | None = doc(
        "Steps two consecutive sequences of an episode share (null: m / 2, rounded down).", default=None
    )
    burn_in: int = doc(
        "l: the first steps of each sequence only compute the recurrent state (no loss, no gradient).",
        default=40,
    )
    start_state: str = doc(
        "The state a sequence is unrolled from: 'stored' (the actor's, sent with the sequence) or 'zero'.",
        default="stored",
    )
    n_step: int = doc("n of the n-step double-Q targets, computed along each sequence.", default=5)
    gamma: float = doc("Discount per env step, in (0, 1].", default=0.997)
    value_rescaling: bool = doc(
        "Targets through h(x) = sign(x)(sqrt(|x| + 1) - 1) + eps x and its inverse (Pohlen et al. 2018).",
        default=True,
    )
    value_rescaling_eps: float = doc("eps of the value rescaling h.", default=1e-3)
    priority_eta: float = doc(
        "Sequence priority eta * max|delta| + (1 - eta) * mean|delta| over its trained steps.", default=0.9
    )
    learning_rate: float = doc("Adam step size.", default=1e-4)
    adam_eps: float = doc("Adam epsilon.", default=1e-3)
    grad_clip_norm: float | None = doc("Clip the global gradient norm to this (null: no clipping).", default=40.0)
    loss: str = doc("TD loss per step: 'mse' (the paper's) or 'huber'.", default="mse")
    huber_delta: float = doc("Huber loss threshold.", default=1.0)
    sync_target_frequency: int = doc(
        "Copy the online net to the target net every this many learner steps.", default=2500
    )
    exploration_eps: float = doc("Base epsilon of the per-env-slot epsilon-greedy schedule.", default=0.4)
    exploration_alpha: float = doc(
        "Spread of the epsilons over the S = actors x num_envs env slots: eps^(1 + alpha * j / (S - 1)) for slot j.",
        default=7.0,
    )
    device: str = doc("Learner device: 'cpu', 'cuda', 'cuda:N' or 'auto' (actors always use the CPU).", default="cpu")
    torch_threads: int = doc("torch intra-op threads in each actor and learner process.", default=1)


def sequence_overlap(m) -> int:
    """The overlap in steps: ``model.sequence_overlap``, or m / 2 when null."""
    return m.sequence_length // 2 if m.sequence_overlap is None else m.sequence_overlap


class R2D2Settings(AlgorithmSettings):
    name = "r2d2"
    # A replay row is one sequence: batch sizes and buffer sizes count sequences.
    agent_defaults = {"batch_size": 64, "buffer_size": 10_000, "learning_starts": 100}
    starter = {
        "env.wrappers": ["mask_velocity"],
        "agent.scheduled_global_steps": 5000,
        "run.eval_every": 250,
        "run.eval_episodes": 10,
    }
    model_config = R2D2Config
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
        check_positive(m.value_rescaling_eps, "model.value_rescaling_eps")
        check_recurrent(m.recurrent)
        parse_network(m.network, "model.network")
        if m.sequence_length < 2:
            raise ConfigError(f"model.sequence_length: must be at least 2, got {m.sequence_length}")
        overlap = sequence_overlap(m)
        if not 0 <= overlap < m.sequence_length:
            raise ConfigError(
                f"model.sequence_overlap: expected 0 <= overlap < sequence_length ({m.sequence_length}), got {overlap}"
            )
        if not 0 <= m.burn_in < m.sequence_length:
            raise ConfigError(
                f"model.burn_in: expected 0 <= burn_in < sequence_length ({m.sequence_length}), got {m.burn_in}"
            )
        if m.start_state not in START_STATES:
            raise ConfigError(f"model.start_state: expected 'stored' or 'zero', got {m.start_state!r}")
        if not 0 <= m.priority_eta <= 1:
            raise ConfigError(f"model.priority_eta: expected a value in [0, 1], got {m.priority_eta}")


SETTINGS = R2D2Settings
