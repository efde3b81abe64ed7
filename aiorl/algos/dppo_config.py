"""Distributed PPO's config side (`aiorl.algos.dppo` is the algorithm): its model section and
the checks of it. No torch: loading a config imports this module only."""

from __future__ import annotations

from dataclasses import dataclass

from aiorl.algos.lib.checks import check_positive, check_recurrent
from aiorl.algos.lib.layers import parse_network
from aiorl.config import ConfigError, doc
from aiorl.runtime.algorithm import AlgorithmSettings


@dataclass
class DPPOConfig:
    network: list = doc(
        "Torso layers (see aiorl/algos/lib/networks.py), used for the policy and the value "
        "torso; empty: nature_cnn for images, two tanh layers of 64 otherwise.",
        default_factory=list,
    )
    shared_torso: bool = doc("One torso for policy and value (else two of the same shape).", default=False)
    recurrent: dict | None = doc(
        "A recurrent policy: {type: lstm | gru, hidden: N} puts an LSTM or GRU cell of N units after "
        "the torso (each torso); actors carry its state per env, reset at every episode start, and "
        "learners unroll each env's rollout from its first step's state, in minibatches of whole "
        "rollouts (null: feed-forward).",
        default=None,
    )
    gamma: float = doc("Discount per env step, in (0, 1].", default=0.99)
    gae_lambda: float = doc("GAE lambda, in [0, 1].", default=0.95)
    clip_ratio: float = doc("PPO clip epsilon: the ratio is clipped to [1 - eps, 1 + eps].", default=0.2)
    value_clip: float | None = doc("Clip the value change per iteration to +-this (null: off).", default=None)
    value_coef: float = doc("Weight of the value loss.", default=0.5)
    entropy_coef: float = doc("Weight of the entropy bonus.", default=0.0)
    learning_rate: float = doc("Adam step size.", default=3e-4)
    lr_annealing: bool = doc(
        "Anneal the step size linearly to 0 over agent.scheduled_timesteps env steps.", default=False
    )
    adam_eps: float = doc("Adam epsilon.", default=1e-5)
    epochs: int = doc("Passes over each iteration's rows (minibatches of about agent.batch_size rows).", default=10)
    grad_clip_norm: float | None = doc("Clip the global gradient norm to this (null: no clipping).", default=0.5)
    normalize_advantages: bool = doc("Normalize advantages to mean 0, std 1 within each minibatch.", default=True)
    obs_norm: bool = doc(
        "Normalize vector observations by running mean/std (merged over every actor's "
        "rows each iteration; part of the weights and of the exported policy).",
        default=False,
    )
    obs_norm_clip: float = doc("Clip normalized observations to +-this.", default=10.0)
    reward_scale: float = doc("Rewards are multiplied by this before GAE (returns reported unscaled).", default=1.0)
    log_std_init: float = doc("Initial log standard deviation of the Gaussian policy (Box actions).", default=0.0)
    sde: bool = doc(
        "Generalized state-dependent exploration (gSDE, Box actions): the exploration noise is a "
        "linear function of the policy's features, redrawn every model.sde_sample_freq steps, "
        "its scale learned per feature and action (log_std_init is its initial log); see "
        "aiorl/algos/lib/actor_critic.py SDEHead.",
        default=False,
    )
    sde_sample_freq: int = doc(
        "With model.sde: steps between two draws of the exploration matrices (and at every new weights version).",
        default=4,
    )
    device: str = doc("Learner device: 'cpu', 'cuda', 'cuda:N' or 'auto' (actors always use the CPU).", default="cpu")
    torch_threads: int = doc("torch intra-op threads in each actor and learner process.", default=1)


class DPPOSettings(AlgorithmSettings):
    name = "dppo"
    starter = {"agent.scheduled_timesteps": 100000, "run.eval_every": 20, "run.eval_episodes": 10}
    model_config = DPPOConfig
    panel_metrics = (
        ("policy loss", "learner/losses/policy_loss"),
        ("entropy", "learner/losses/entropy"),
        ("value loss", "learner/losses/value_loss"),
        ("policy lag", "learner/policy_lag"),
    )
    synchronous = True

    @classmethod
    def validate(cls, cfg):
        m, a = cfg.model, cfg.agent
        if not 0 < m.gamma <= 1:
            raise ConfigError(f"model.gamma: expected a value in (0, 1], got {m.gamma}")
        if not 0 <= m.gae_lambda <= 1:
            raise ConfigError(f"model.gae_lambda: expected a value in [0, 1], got {m.gae_lambda}")
        if not 0 < m.clip_ratio < 1:
            raise ConfigError(f"model.clip_ratio: expected a value in (0, 1), got {m.clip_ratio}")
        if m.value_clip is not None:
            check_positive(m.value_clip, "model.value_clip")
        if m.value_coef < 0 or m.entropy_coef < 0:
            raise ConfigError(
                f"model.value_coef and model.entropy_coef must be >= 0, got {m.value_coef} and {m.entropy_coef}"
            )
        check_positive(m.learning_rate, "model.learning_rate")
        check_positive(m.adam_eps, "model.adam_eps")
        check_positive(m.obs_norm_clip, "model.obs_norm_clip")
        check_positive(m.reward_scale, "model.reward_scale")
        if m.epochs < 1:
            raise ConfigError(f"model.epochs: must be at least 1, got {m.epochs}")
        if m.grad_clip_norm is not None:
            check_positive(m.grad_clip_norm, "model.grad_clip_norm")
        if m.lr_annealing and a.scheduled_timesteps is None:
            raise ConfigError("model.lr_annealing anneals over agent.scheduled_timesteps, which is not set")
        if m.torch_threads < 1:
            raise ConfigError(f"model.torch_threads: must be at least 1, got {m.torch_threads}")
        if m.sde_sample_freq < 1:
            raise ConfigError(f"model.sde_sample_freq: must be at least 1, got {m.sde_sample_freq}")
        rows = a.sample_batch_size * cfg.env.num_envs
        if rows < cfg.cluster.learners:
            raise ConfigError(
                f"agent.sample_batch_size x env.num_envs ({rows} rows per actor) must be at least "
                f"cluster.learners ({cfg.cluster.learners}): every learner trains on a share of "
                "each rollout"
            )
        parse_network(m.network, "model.network")
        if check_recurrent(m.recurrent) is not None:
            if m.sde:
                raise ConfigError("model.sde: not with model.recurrent (gSDE's noise reads feed-forward features)")
            if a.batch_size < a.sample_batch_size:
                raise ConfigError(
                    f"agent.batch_size ({a.batch_size} rows per minibatch) must be at least "
                    f"agent.sample_batch_size ({a.sample_batch_size}) with model.recurrent: a minibatch "
                    "holds whole rollouts of one env"
                )


SETTINGS = DPPOSettings
