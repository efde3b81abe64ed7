"""IMPALA's config side (`aiorl.algos.impala` is the algorithm): its model section, its
`agent` defaults, its trajectory queue and the checks of them. No torch: loading a config
imports this module only."""

from __future__ import annotations

from dataclasses import dataclass

from aiorl.algos.lib.checks import check_positive, check_recurrent
from aiorl.algos.lib.layers import parse_network
from aiorl.config import ConfigError, doc
from aiorl.replay.trajectory_queue import FULL_POLICIES, QueueSpec
from aiorl.runtime.algorithm import AlgorithmSettings

OPTIMIZERS = ("rmsprop", "adam")


@dataclass
class ImpalaConfig:
    network: list = doc(
        "Torso layers (see aiorl/algos/lib/networks.py), used for the policy and the value "
        "torso; empty: nature_cnn for images, two tanh layers of 64 otherwise.",
        default_factory=list,
    )
    shared_torso: bool = doc("One torso for policy and value (else two of the same shape).", default=False)
    recurrent: dict | None = doc(
        "A recurrent policy: {type: lstm | gru, hidden: N} puts an LSTM or GRU cell of N units after "
        "the torso (each torso); actors carry its state per env, reset at every episode start, and "
        "learners unroll each fragment from its first step's state (null: feed-forward).",
        default=None,
    )
    gamma: float = doc("Discount per env step, in (0, 1].", default=0.99)
    rho_bar: float = doc("V-trace: importance weights in the value targets clipped to this (.inf: off).", default=1.0)
    c_bar: float = doc("V-trace: trace-cutting weights clipped to this (.inf: off).", default=1.0)
    pg_rho_bar: float | None = doc(
        "Importance weights of the policy gradient clipped to this (null: rho_bar).", default=None
    )
    vtrace_lambda: float = doc(
        "V-trace lambda in [0, 1]: traces c_i = lambda * min(c_bar, rho_i) (the paper's Remark 1; 1: none).",
        default=1.0,
    )
    value_coef: float = doc("Weight of the value loss.", default=0.5)
    entropy_coef: float = doc("Weight of the entropy bonus.", default=0.01)
    reward_scale: float = doc("Rewards are multiplied by this before V-trace (returns reported unscaled).", default=1.0)
    optimizer: str = doc("'rmsprop' (the paper's) or 'adam'.", default="rmsprop")
    learning_rate: float = doc("Step size.", default=6e-4)
    lr_annealing: bool = doc(
        "Anneal the step size linearly to 0 over agent.scheduled_timesteps env steps trained on.", default=False
    )
    rmsprop_alpha: float = doc("RMSProp decay of the squared-gradient average.", default=0.99)
    rmsprop_momentum: float = doc("RMSProp momentum.", default=0.0)
    optimizer_eps: float = doc("Epsilon of RMSProp or Adam (torch adds it outside the square root).", default=0.01)
    epochs: int = doc(
        "Optimizer steps on each batch, its V-trace targets recomputed with the current weights "
        "before each (1: the paper's IMPALA).",
        default=1,
    )
    grad_clip_norm: float | None = doc("Clip the global gradient norm to this (null: no clipping).", default=40.0)
    queue_capacity: int = doc("Fragments each memory host's trajectory queue holds.", default=64)
    queue_full: str = doc(
        "When a trajectory queue is full: 'throttle' (actors wait for credit) or "
        "'drop_oldest' (the oldest fragments are dropped, counted).",
        default="throttle",
    )
    max_policy_lag: int | None = doc(
        "Fragments acted with weights more than this many versions older than "
        "the newest are dropped, counted (null: no bound).",
        default=None,
    )
    log_std_init: float = doc("Initial log standard deviation of the Gaussian policy (Box actions).", default=0.0)
    device: str = doc("Learner device: 'cpu', 'cuda', 'cuda:N' or 'auto' (actors always use the CPU).", default="cpu")
    torch_threads: int = doc("torch intra-op threads in each actor and learner process.", default=1)


class ImpalaSettings(AlgorithmSettings):
    name = "impala"
    starter = {"agent.scheduled_timesteps": 200000, "run.eval_every": 100, "run.eval_episodes": 10}
    model_config = ImpalaConfig
    # The paper's unroll length and batch (32 fragments of 20 steps): the shared defaults
    # (batch 32, rollouts of 64) are not whole fragments.
    agent_defaults = {"sample_batch_size": 20, "batch_size": 640}

    @classmethod
    def fragment_queue(cls, cfg):
        m, a = cfg.model, cfg.agent
        return QueueSpec(
            capacity=m.queue_capacity,
            full=m.queue_full,
            max_policy_lag=m.max_policy_lag,
            fragments_per_batch=a.batch_size // a.sample_batch_size,
        )

    @classmethod
    def validate(cls, cfg):
        m, a = cfg.model, cfg.agent
        if not 0 < m.gamma <= 1:
            raise ConfigError(f"model.gamma: expected a value in (0, 1], got {m.gamma}")
        if not 0 <= m.vtrace_lambda <= 1:
            raise ConfigError(f"model.vtrace_lambda: expected a value in [0, 1], got {m.vtrace_lambda}")
        for key in ("rho_bar", "c_bar", "pg_rho_bar"):
            if getattr(m, key) is not None:
                check_positive(getattr(m, key), f"model.{key}")
        if m.value_coef < 0 or m.entropy_coef < 0:
            raise ConfigError(
                f"model.value_coef and model.entropy_coef must be >= 0, got {m.value_coef} and {m.entropy_coef}"
            )
        if m.optimizer not in OPTIMIZERS:
            raise ConfigError(f"model.optimizer: expected 'rmsprop' or 'adam', got {m.optimizer!r}")
        check_positive(m.learning_rate, "model.learning_rate")
        check_positive(m.optimizer_eps, "model.optimizer_eps")
        check_positive(m.reward_scale, "model.reward_scale")
        if not 0 <= m.rmsprop_alpha < 1 or m.rmsprop_momentum < 0:
            raise ConfigError(
                f"model.rmsprop_alpha must be in [0, 1) and model.rmsprop_momentum >= 0, got "
                f"{m.rmsprop_alpha} and {m.rmsprop_momentum}"
            )
        if m.grad_clip_norm is not None:
            check_positive(m.grad_clip_norm, "model.grad_clip_norm")
        if m.lr_annealing and a.scheduled_timesteps is None:
            raise ConfigError("model.lr_annealing anneals over agent.scheduled_timesteps, which is not set")
        if m.queue_full not in FULL_POLICIES:
            raise ConfigError(f"model.queue_full: expected 'throttle' or 'drop_oldest', got {m.queue_full!r}")
        if m.max_policy_lag is not None and m.max_policy_lag < 0:
            raise ConfigError(f"model.max_policy_lag: must be >= 0 (or null: no bound), got {m.max_policy_lag}")
        if m.epochs < 1:
            raise ConfigError(f"model.epochs: must be at least 1, got {m.epochs}")
        if m.torch_threads < 1:
            raise ConfigError(f"model.torch_threads: must be at least 1, got {m.torch_threads}")
        if a.batch_size % a.sample_batch_size:
            raise ConfigError(
                f"agent.batch_size ({a.batch_size} transitions per learner batch) must be a multiple "
                f"of agent.sample_batch_size ({a.sample_batch_size}, the fragment length): "
                "learners train on whole fragments"
            )
        per_batch, envs = a.batch_size // a.sample_batch_size, cfg.env.num_envs
        # A message brings one fragment per env; a batch needs `per_batch` from one queue. Below
        # this size a throttled queue can hold fewer than a batch with no room for a message.
        least = per_batch + envs - 1 if m.queue_full == "throttle" else max(per_batch, envs)
        if m.queue_capacity < least:
            raise ConfigError(
                f"model.queue_capacity ({m.queue_capacity} fragments) must be at least {least}: a "
                f"learner batch takes {per_batch} fragments (agent.batch_size / "
                f"agent.sample_batch_size) from one memory's queue and an actor message brings "
                f"{envs} (env.num_envs)"
                + (
                    ", so a throttled queue short of a batch must still have room for a message"
                    if m.queue_full == "throttle"
                    else ""
                )
            )
        if a.samples_per_insert is not None:
            raise ConfigError(
                "agent.samples_per_insert: impala trains on each fragment once; the trajectory "
                "queue is governed by model.queue_full and model.max_policy_lag"
            )
        parse_network(m.network, "model.network")
        check_recurrent(m.recurrent)


SETTINGS = ImpalaSettings
