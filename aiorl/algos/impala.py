"""IMPALA (Espeholt et al. 2018): asynchronous actor-critic with V-trace off-policy correction.

Reads top to bottom: the loss, the acting policy, the learner, the builder; its
config (the model section, the `agent` defaults and their checks) is
`aiorl.algos.impala_config`, which loads without torch.

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

Recurrent policies (``model.recurrent``): each actor keeps a state per env, zeroed when
the env starts an episode, and sends with each fragment, once, the state its first step
was acted from (field ``state``, ``[state_size]`` per fragment: `per_fragment_spec`; the
rest of a fragment's states follow from it, so sending them would only cost bytes). The
learner unrolls the network over each fragment from that state, zeroing it before every
step that follows an episode end (terminated or truncated): truncated backpropagation
through the fragment. V(obs after step t) reads the state after step t.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch

from aiorl.algos.impala_config import ImpalaConfig, ImpalaSettings
from aiorl.algos.lib.actor_critic import (
    ActorCritic,
    CategoricalHead,
    EnvStates,
    GaussianHead,
    acting_module,
    check_action_space,
)
from aiorl.algos.lib.checks import check_recurrent
from aiorl.algos.lib.common import (
    ActorCriticLearner,
    as_tensor,
    load_numpy_state,
    setup_torch,
    shapes_only,
    weights_spec_of_module,
)
from aiorl.algos.lib.layers import parse_network
from aiorl.algos.lib.networks import check_observation_space, is_image
from aiorl.algos.lib.numpy_forward import compile_numpy, probe_observations
from aiorl.algos.lib.optimizers import Adam, RMSprop
from aiorl.replay import vtrace
from aiorl.runtime.algorithm import ActorPolicy, Algorithm, LearnerResult

DEFAULT_NETWORK = ["linear:64", "tanh", "linear:64", "tanh"]


# --------------------------------------------------------------------------
# Logic: the loss


def behaviour_log_prob(net: ActorCritic, batch, action: torch.Tensor, device) -> torch.Tensor:
    """log mu(a_t|x_t) of the actors' policy, flat [B*T]: from their logits (Discrete) or as sent (Box)."""
    if "behaviour_logits" in batch:
        logits = as_tensor(batch["behaviour_logits"], device)
        return net.head.log_prob(logits.reshape(-1, logits.shape[-1]), action)
    return as_tensor(batch["behaviour_logp"], device).reshape(-1)


def episode_starts(terminated: np.ndarray, truncated: np.ndarray) -> np.ndarray:
    """[B, T] bool: step t > 0 starts an episode (step t - 1 ended one); step 0 is False (the
    actor's state for it is already reset)."""
    first = np.zeros(terminated.shape, np.bool_)
    first[:, 1:] = terminated[:, :-1] | truncated[:, :-1]
    return first


class OutputGradient(torch.autograd.Function):
    """A loss whose gradient with respect to the network's outputs (logits, values) was worked
    out in closed form beside it (`categorical_terms`); autograd goes on from there through the
    network. One node where the loss written out in torch ops takes about twenty, each with its
    own dispatch forward and backward: on CartPole's MLP at 160 rows they were a third of a step."""

    @staticmethod
    def forward(ctx, logits, values, loss, grad_logits, grad_values):
        ctx.save_for_backward(grad_logits, grad_values)
        return loss.clone()

    @staticmethod
    def backward(ctx, grad_loss):
        grad_logits, grad_values = ctx.saved_tensors
        return grad_logits * grad_loss, grad_values * grad_loss, None, None, None


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """log pi(.|x) of Categorical logits [N, A], float64 numpy."""
    z = logits.astype(np.float64)
    z -= z.max(axis=1, keepdims=True)
    z -= np.log(np.exp(z).sum(axis=1, keepdims=True))
    return z


def categorical_terms(log_pi, action, values, vs, pg_advantages, m: ImpalaConfig):
    """The loss of the module docstring for Discrete actions (numpy, float64), its three parts,
    and its gradient with respect to the logits and the values. With p = pi(.|x_i) from
    `log_pi` [N, A], H_i = -sum_k p_k log p_k, one-hot e_a of the action taken and A_i the
    policy-gradient advantage:

        dL/dlogits_i = (A_i (p - e_a) + entropy_coef p (log p + H_i)) / N
        dL/dV_i      = value_coef (V_i - vs_i) / N
    """
    n = len(vs)
    rows = np.arange(n)
    p = np.exp(log_pi)
    entropy = -(p * log_pi).sum(axis=1)
    policy_loss = -float(np.dot(pg_advantages, log_pi[rows, action])) / n
    diff = values - vs
    value_loss = 0.5 * float(np.dot(diff, diff)) / n
    entropy_mean = float(entropy.mean())
    loss = policy_loss + m.value_coef * value_loss - m.entropy_coef * entropy_mean
    grad_logits = p * (pg_advantages + m.entropy_coef * entropy)[:, None] + m.entropy_coef * (p * log_pi)
    grad_logits[rows, action] -= pg_advantages
    grad_logits /= n
    grad_values = diff * (m.value_coef / n)
    return loss, (policy_loss, value_loss, entropy_mean), grad_logits, grad_values


def variance(x: np.ndarray) -> float:
    centred = x - x.mean()
    return float(np.dot(centred, centred)) / len(x)


def impala_loss(net: ActorCritic, m: ImpalaConfig, batch, device):
    """(loss, metrics) of one batch of fragments; see the module docstring."""
    obs = np.asarray(batch["obs"])
    B, T = obs.shape[:2]
    N = B * T
    terminated, truncated = np.asarray(batch["terminated"]), np.asarray(batch["truncated"])
    # V of the observation after each fragment, and of every final observation a time limit cut.
    need = truncated & ~terminated
    need[:, -1] = True
    flat = np.flatnonzero(need)
    next_obs = np.asarray(batch["next_obs"])
    next_obs = next_obs.reshape((N,) + next_obs.shape[2:])[flat]
    if net.recurrent is not None:
        state0 = as_tensor(batch["state"], device)
        first = torch.as_tensor(episode_starts(terminated, truncated), device=device)
        params, values, after = net.unroll(as_tensor(obs, device), state0, first)
        with torch.no_grad():
            v_boot = net.value_step(as_tensor(next_obs, device), after.detach().reshape(N, -1)[flat])
    else:
        # One forward for the steps and the observations to bootstrap from (no gradient flows
        # into the latter: only the first N rows enter the loss).
        rows = np.concatenate([obs.reshape((N,) + obs.shape[2:]), next_obs])
        params, values = net(as_tensor(rows, device))
        params, values, v_boot = params[:N], values[:N], values[N:].detach()
    v_next = np.zeros(N, np.float32)
    v_next[flat] = v_boot.cpu().numpy()
    v_next = v_next.reshape(B, T)
    values_np = values.detach().cpu().numpy().reshape(-1)
    categorical = type(net.head) is CategoricalHead
    if categorical:  # log pi and log mu in numpy: a few small arrays, no torch call
        action = np.asarray(batch["action"]).reshape(-1)
        log_pi = log_softmax(params.detach().cpu().numpy())
        behaviour = np.asarray(batch["behaviour_logits"])
        logp_mu = log_softmax(behaviour.reshape(N, -1))[np.arange(N), action]
        log_rhos = (log_pi[np.arange(N), action] - logp_mu).astype(np.float32).reshape(B, T)
    else:
        action = as_tensor(batch["action"], device)
        action = action.reshape((N,) + action.shape[2:])
        with torch.no_grad():
            logp = net.head.log_prob(params.detach(), action)
            log_rhos = (logp - behaviour_log_prob(net, batch, action, device)).reshape(B, T).cpu().numpy()
    reward = np.asarray(batch["reward"])
    if m.reward_scale != 1.0:
        reward = reward * np.float32(m.reward_scale)
    vs, pg_advantages = vtrace(
        log_rhos,
        reward,
        values_np.reshape(B, T),
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
    vs, pg_advantages = vs.reshape(-1), pg_advantages.reshape(-1)
    if categorical:
        value, parts, grad_logits, grad_values = categorical_terms(
            log_pi, action, values_np.astype(np.float64), vs.astype(np.float64), pg_advantages.astype(np.float64), m
        )
        loss = OutputGradient.apply(
            params,
            values,
            torch.tensor(value, dtype=params.dtype, device=device),
            torch.from_numpy(grad_logits.astype(np.float32)).to(device),
            torch.from_numpy(grad_values.astype(np.float32)).to(device),
        )
    else:
        vs_t, pg_t = torch.from_numpy(vs).to(device), torch.from_numpy(pg_advantages).to(device)
        logp = net.head.log_prob(params, action)
        entropy = net.head.entropy(params).mean()
        policy_loss = -(pg_t * logp).mean()
        value_loss = 0.5 * (vs_t - values).pow(2).mean()
        loss = policy_loss + m.value_coef * value_loss - m.entropy_coef * entropy
        parts = torch.stack([policy_loss, value_loss, entropy]).tolist()
    rhos = np.exp(log_rhos)
    vs_var = variance(vs)
    metrics = {
        "losses/policy_loss": parts[0],
        "losses/value_loss": parts[1],
        "losses/entropy": parts[2],
        "vtrace/rho_mean": float(rhos.mean()),
        "vtrace/rho_clipped_fraction": float((rhos > m.rho_bar).mean()),
        "values/explained_variance": 1.0 - variance(vs - values_np) / vs_var if vs_var > 0 else 0.0,
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
        # Acting on CPU: a small MLP runs in numpy (torch's per-call cost dominates at a few rows).
        self.fast = compile_numpy(self.net, probe_observations(algo.env_spec.observation_space, seed=seed))
        self.gaussian = isinstance(self.net.head, GaussianHead)
        self.action_shape = algo.env_spec.action_space.shape
        self.rng = np.random.default_rng(seed)
        self.steps: list[tuple[np.ndarray, ...]] = []  # (action, logits or log-prob) per step
        self.recurrent = self.net.recurrent is not None
        self.state0: np.ndarray | None = None  # recurrent: the state the fragments' first step was acted from
        self.states = EnvStates(self.net)

    def __repr__(self) -> str:
        return f"<ImpalaActor weights_version={self.weights_version} steps_held={len(self.steps)}>"

    def begin_episodes(self, started: np.ndarray) -> None:
        self.states.reset(started)

    def act(self, obs: np.ndarray) -> np.ndarray:
        if self.recurrent:
            params, _, _, before = self.states.step(obs)
        elif self.fast is not None:
            params = self.fast.policy_params(obs)
        else:
            with torch.inference_mode():
                params = self.net.policy_params(torch.as_tensor(obs)).numpy()
        action, logp = self.net.head.sample(params, self.rng)
        if self.recurrent and not self.steps:
            self.state0 = before
        self.steps.append((action, logp if self.gaussian else params))
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
        fragments = {name: np.ascontiguousarray(np.swapaxes(x, 0, 1)) for name, x in time_major.items()}
        if self.recurrent:  # once per fragment: the learner unrolls from it
            fragments["state"] = np.array(self.state0, np.float32)
        return fragments, None

    def set_weights(self, weights, version):
        load_numpy_state(self.net, weights, "net")
        if self.fast is not None:
            self.fast.refresh()
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
            self.optimizer = Adam(self.params, lr=m.learning_rate, eps=m.optimizer_eps)
        else:
            self.optimizer = RMSprop(
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


class Impala(ImpalaSettings, Algorithm):
    def __init__(self, cfg, env_spec):
        super().__init__(cfg, env_spec)
        check_observation_space(env_spec.observation_space, "env.id")
        check_action_space(env_spec.action_space, self.name)
        default = ["nature_cnn"] if is_image(env_spec.observation_space) else DEFAULT_NETWORK
        self.layers = parse_network(cfg.model.network or default, "model.network")
        self.state_size = shapes_only(self.network).state_size  # shape errors surface now

    def network(self) -> ActorCritic:
        m = self.cfg.model
        return ActorCritic(
            self.env_spec.observation_space,
            self.env_spec.action_space,
            self.layers,
            shared=m.shared_torso,
            log_std_init=m.log_std_init,
            recurrent=check_recurrent(m.recurrent),
        )

    def acting_module(self) -> torch.nn.Module:
        return acting_module(self.network())

    def weights_spec(self):
        return weights_spec_of_module(shapes_only(self.network), "net")

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

    def per_fragment_spec(self):
        """Recurrent: ``state`` (float32 [state_size]), the state a fragment's first step was acted
        from; feed-forward: nothing."""
        if self.cfg.model.recurrent is None:
            return {}
        return {"state": ((self.state_size,), "<f4")}

    def make_actor(self, actor_index, num_actors, seed):
        return ImpalaActor(self, seed)

    def make_learner(self, learner_index, num_learners, seed, rendezvous=None):
        return ImpalaLearner(self, learner_index, num_learners, seed, rendezvous)


ALGORITHM = Impala
