"""IMPALA (Espeholt et al. 2018): asynchronous actor-critic with V-trace off-policy correction.

Reads top to bottom: config, the loss, the acting policy, the learner, the builder.

Actors never wait for the learner: each acts with the newest weights it has
(pulled every ``agent.sync_interval`` fragment messages while no pull is in
flight), steps its ``env.num_envs`` environments ``agent.sample_batch_size``
(T) steps, and sends one fragment per env, all acted with one weights
version, with the behaviour policy's logits (Discrete) or the log-probability
of each sampled action (Box). A fragment end is not an episode end: episode
ends inside a fragment are flagged per step, ``terminated`` apart from
``truncated``. Memories queue whole fragments (`aiorl.replay.trajectory_queue`);
a learner takes batches of ``agent.batch_size / T`` fragments, oldest first.

Per fragment, with rho_t = pi(a_t|x_t) / mu(a_t|x_t) (pi: the learner's
policy now, mu: the actor's), V-trace targets (`aiorl.replay.vtrace`, compiled):

    vs_t  = V(x_t) + sum_{s>=t} gamma^(s-t) (prod_{i<s} c_i) delta_s,
    delta_s = min(rho_bar, rho_s) (r_s + gamma V(x_{s+1}) - V(x_s)),  c_i = lambda min(c_bar, rho_i)

cut at episode ends (terminated: V(x_{s+1}) = 0; truncated: V(final obs)) and
bootstrapped from V(obs after the fragment). Loss on a batch of B fragments:

    A_t     = min(pg_rho_bar, rho_t) (r_t + gamma vs_{t+1} - V(x_t))    (no gradient)
    L_pi    = -mean(A_t log pi(a_t|x_t))
    L_V     = 0.5 mean((vs_t - V(x_t))^2)
    loss    = L_pi + value_coef L_V - entropy_coef mean(entropy)

RMSProp (or Adam), the global gradient norm clipped. Several learners
average gradients through ``torch.distributed`` each step, as Ape-X does.
"""

from __future__ import annotations

from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import torch

from aiorl.algos.lib.actor_critic import ActorCritic, GaussianHead, check_action_space
from aiorl.algos.lib.common import (
    ActorCriticLearner,
    as_tensor,
    check_positive,
    load_numpy_state,
    make_adam,
    setup_torch,
    state_to_numpy,
    weights_spec_of,
)
from aiorl.algos.lib.networks import check_observation_space, is_image, parse_network
from aiorl.config import ConfigError, doc
from aiorl.replay import vtrace
from aiorl.replay.trajectory_queue import FULL_POLICIES, QueueSpec
from aiorl.runtime.algorithm import ActorPolicy, Algorithm, LearnerResult

DEFAULT_NETWORK = ["linear:64", "tanh", "linear:64", "tanh"]
OPTIMIZERS = ("rmsprop", "adam")


@dataclass
class ImpalaConfig:
    network: list = doc(
        "Torso layers (see aiorl/algos/lib/networks.py), used for the policy and the value "
        "torso; empty: nature_cnn for images, two tanh layers of 64 otherwise.",
        default_factory=list,
    )
    shared_torso: bool = doc("One torso for policy and value (else two of the same shape).", default=False)
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


# --------------------------------------------------------------------------
# Logic: the loss


def behaviour_log_prob(net: ActorCritic, batch, action: torch.Tensor, device) -> torch.Tensor:
    """log mu(a_t|x_t) of the actors' policy, flat [B*T]: from their logits (Discrete) or as sent (Box)."""
    if "behaviour_logits" in batch:
        logits = as_tensor(batch["behaviour_logits"], device)
        return net.head.log_prob(logits.reshape(-1, logits.shape[-1]), action)
    return as_tensor(batch["behaviour_logp"], device).reshape(-1)


def impala_loss(net: ActorCritic, m: ImpalaConfig, batch, device):
    """(loss, metrics) of one batch of fragments; see the module docstring."""
    obs = as_tensor(batch["obs"], device)
    B, T = obs.shape[:2]
    params, values = net(obs.reshape((B * T,) + obs.shape[2:]))
    action = as_tensor(batch["action"], device)
    action = action.reshape((B * T,) + action.shape[2:])
    logp = net.head.log_prob(params, action)
    entropy = net.head.entropy(params).mean()
    terminated, truncated = np.asarray(batch["terminated"]), np.asarray(batch["truncated"])
    with torch.no_grad():
        log_rhos = (logp - behaviour_log_prob(net, batch, action, device)).reshape(B, T)
        # V of the observation after each fragment, and of every final observation a time limit cut.
        need = truncated & ~terminated
        need[:, -1] = True
        flat = np.flatnonzero(need)
        next_obs = np.asarray(batch["next_obs"])
        next_obs = next_obs.reshape((B * T,) + next_obs.shape[2:])[flat]
        v_next = np.zeros(B * T, np.float32)
        v_next[flat] = net.value(as_tensor(next_obs, device)).cpu().numpy()
        v_next = v_next.reshape(B, T)
        values_np = values.detach().reshape(B, T).cpu().numpy()
    reward = np.asarray(batch["reward"])
    if m.reward_scale != 1.0:
        reward = reward * np.float32(m.reward_scale)
    vs, pg_advantages = vtrace(
        log_rhos.cpu().numpy(),
        reward,
        values_np,
        v_next[:, -1].copy(),
        terminated,
        truncated,
        m.gamma,
        m.rho_bar,
        m.c_bar,
        m.pg_rho_bar,
        v_next,
        m.vtrace_lambda,
    )
    vs_t = torch.as_tensor(vs, device=device).reshape(-1)
    pg_t = torch.as_tensor(pg_advantages, device=device).reshape(-1)
    policy_loss = -(pg_t * logp).mean()
    value_loss = 0.5 * (vs_t - values).pow(2).mean()
    loss = policy_loss + m.value_coef * value_loss - m.entropy_coef * entropy
    with torch.no_grad():
        rhos = log_rhos.exp()
        residual = np.var(vs - values_np)
        explained = 1.0 - residual / np.var(vs) if np.var(vs) > 0 else 0.0
        metrics = {
            "losses/policy_loss": float(policy_loss),
            "losses/value_loss": float(value_loss),
            "losses/entropy": float(entropy),
            "vtrace/rho_mean": float(rhos.mean()),
            "vtrace/rho_clipped_fraction": float((rhos > m.rho_bar).float().mean()),
            "values/explained_variance": float(explained),
        }
    return loss, metrics


# --------------------------------------------------------------------------
# Acting


class ImpalaActor(ActorPolicy):
    """Samples actions with the behaviour policy, remembers what V-trace needs of it, and
    turns a ``[T, num_envs]`` rollout into one fragment per env (``[num_envs, T, ...]``)."""

    def __init__(self, algo: Impala, seed: int):
        m = algo.cfg.model
        setup_torch(m.torch_threads, seed)
        self.net = algo.network().eval()
        self.gaussian = isinstance(self.net.head, GaussianHead)
        self.action_shape = algo.env_spec.action_space.shape
        self.rng = np.random.default_rng(seed)
        self.steps: list[tuple[np.ndarray, np.ndarray]] = []  # (action, logits or log-prob) per step

    def __repr__(self) -> str:
        return f"<ImpalaActor weights_version={self.weights_version} steps_held={len(self.steps)}>"

    @torch.no_grad()
    def act(self, obs: np.ndarray) -> np.ndarray:
        params = self.net.policy_params(torch.as_tensor(obs))
        action, logp = self.net.head.sample(params, self.rng)
        self.steps.append((action, logp if self.gaussian else params.numpy()))
        if self.gaussian:
            return self.net.head.clip_to_bounds(action).reshape((len(obs),) + self.action_shape)
        return action

    def postprocess(self, rollout):
        T = rollout["reward"].shape[0]
        if len(self.steps) != T:
            raise RuntimeError(f"ImpalaActor: {len(self.steps)} acted steps for a rollout of {T}")
        # The unclipped sample is what the behaviour log-probability is of (Box actions).
        time_major = {
            "obs": rollout["obs"],
            "next_obs": rollout["next_obs"],
            "action": np.stack([s[0] for s in self.steps]),
            "reward": rollout["reward"],
            "terminated": rollout["terminated"],
            "truncated": rollout["truncated"],
            ("behaviour_logp" if self.gaussian else "behaviour_logits"): np.stack([s[1] for s in self.steps]),
        }
        self.steps = []
        # [T, E, ...] -> [E, T, ...]: row e is env e's fragment, contiguous.
        return {name: np.ascontiguousarray(np.swapaxes(x, 0, 1)) for name, x in time_major.items()}, None

    def set_weights(self, weights, version):
        load_numpy_state(self.net, weights, "net")
        self.weights_version = version


# --------------------------------------------------------------------------
# Learning


class ImpalaLearner(ActorCriticLearner):
    """One optimizer step per batch of fragments; several learners average each step's gradient."""

    def __init__(self, algo: Impala, learner_index: int, num_learners: int, seed: int, rendezvous: str | None):
        super().__init__(algo, learner_index, num_learners, seed)
        m = self.m
        self.net = algo.network().to(self.device)
        self.params = [p for p in self.net.parameters() if p.requires_grad]
        if m.optimizer == "adam":
            self.optimizer = make_adam(self.params, m.learning_rate, m.optimizer_eps)
        else:
            self.optimizer = torch.optim.RMSprop(
                self.params, lr=m.learning_rate, alpha=m.rmsprop_alpha, eps=m.optimizer_eps, momentum=m.rmsprop_momentum
            )
        self.join(self.params, [self.net], learner_index, num_learners, rendezvous)
        self.schedule = algo.cfg.agent.scheduled_timesteps if m.lr_annealing else None

    def step(self, batch):
        if self.dp.stopped:
            return LearnerResult(stop=True)
        self.anneal_lr()
        for _ in range(self.m.epochs):
            loss, metrics = impala_loss(self.net, self.m, batch, self.device)
            norms = self.apply([("loss", loss, self.params, self.optimizer)])
            if norms is None:
                return LearnerResult(stop=True)  # a peer's data ended: nothing applied
        rows = int(np.prod(np.shape(batch["reward"])))
        self.iterations += 1
        self.env_steps_trained += rows * self.dp.world  # every learner's batch is as large
        metrics.update(
            {"losses/grad_norm": norms["loss"], "policy/learning_rate": self.optimizer.param_groups[0]["lr"]}
        )
        if isinstance(self.net.head, GaussianHead):
            metrics["policy/log_std_mean"] = float(self.net.head.log_std.detach().mean())
        return LearnerResult(metrics)


# --------------------------------------------------------------------------
# Builder


class Impala(Algorithm):
    name = "impala"
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

    def __init__(self, cfg, env_spec):
        super().__init__(cfg, env_spec)
        check_observation_space(env_spec.observation_space, "env.id")
        check_action_space(env_spec.action_space, self.name)
        default = ["nature_cnn"] if is_image(env_spec.observation_space) else DEFAULT_NETWORK
        self.layers = parse_network(cfg.model.network or default, "model.network")
        self.network()  # shape errors surface now

    def network(self) -> ActorCritic:
        m = self.cfg.model
        return ActorCritic(
            self.env_spec.observation_space,
            self.env_spec.action_space,
            self.layers,
            shared=m.shared_torso,
            log_std_init=m.log_std_init,
        )

    def weights_spec(self):
        return weights_spec_of(state_to_numpy(self.network(), "net"))

    def transition_spec(self):
        """One step of a fragment; memories store fragments of agent.sample_batch_size steps."""
        obs_space, action_space = self.env_spec.observation_space, self.env_spec.action_space
        obs = (tuple(obs_space.shape), np.dtype(obs_space.dtype).str)
        if isinstance(action_space, gym.spaces.Discrete):
            action, behaviour = ((), "<i8"), {"behaviour_logits": ((int(action_space.n),), "<f4")}
        else:
            action, behaviour = ((int(np.prod(action_space.shape)),), "<f4"), {"behaviour_logp": ((), "<f4")}
        return {
            "obs": obs,
            "next_obs": obs,
            "action": action,
            "reward": ((), "<f4"),
            "terminated": ((), "|b1"),
            "truncated": ((), "|b1"),
            **behaviour,
        }

    def make_actor(self, actor_index, num_actors, seed):
        return ImpalaActor(self, seed)

    def make_learner(self, learner_index, num_learners, seed, rendezvous=None):
        return ImpalaLearner(self, learner_index, num_learners, seed, rendezvous)


ALGORITHM = Impala
