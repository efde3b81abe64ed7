"""Ape-X DDPG (Horgan et al. 2018; Lillicrap et al. 2016): a deterministic
actor and a Q critic over distributed prioritized replay.

Reads top to bottom: the n-step critic target, exploration noise, the acting
policy, the learner, the builder; its config (the model section and its checks)
is `aiorl.algos.apex_ddpg_config`, which loads without torch.

Critic target of a replay row (s_t, a_t, R_t, s_{t+m}, d_t), m <= n:

    y_t = R_t + d_t * Q'(s_{t+m}, mu'(s_{t+m}))

with ``d_t`` = gamma^m from the replay core's n-step adjustment (0 when the
episode terminated inside the window; truncation still bootstraps). EasyRL
discounted the bootstrap by gamma whatever the window length, a bug fixed
here. The critic loss is importance-weighted (MSE or Huber); the actor
maximizes ``mean_i Q(s_i, mu(s_i))``. Both gradients are computed from the
same parameters, then applied together (one all-reduce for data-parallel
learners); targets follow by Polyak averaging with ``tau``. Priorities are
|y_t - Q(s_t, a_t)|.
"""

from __future__ import annotations

import copy

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from aiorl.algos.apex_ddpg_config import ApexDDPGSettings
from aiorl.algos.lib.common import (
    ApexLearner,
    NStepPolicy,
    as_tensor,
    hard_update,
    load_numpy_state,
    nstep_batch_rows,
    setup_torch,
    shapes_only,
    soft_update,
    state_to_numpy,
    td_loss,
    weights_spec_of_module,
)
from aiorl.algos.lib.layers import parse_network
from aiorl.algos.lib.networks import DEFAULT_MLP, Critic, DeterministicActor, check_observation_space, is_image
from aiorl.algos.lib.numpy_forward import compile_numpy, probe_observations
from aiorl.algos.lib.optimizers import Adam
from aiorl.config import ConfigError
from aiorl.runtime.algorithm import Algorithm, LearnerResult

# --------------------------------------------------------------------------
# Logic: target and exploration


def n_step_critic_target(reward: torch.Tensor, discount: torch.Tensor, q_next_target: torch.Tensor) -> torch.Tensor:
    """``R + discount * Q'(s', mu'(s'))``; ``discount`` is gamma^m, 0 after termination."""
    return reward + discount * q_next_target


class GaussianNoise:
    """Independent N(0, sigma^2) per step, in units of the action half range."""

    def __init__(self, shape: tuple[int, ...], sigma: float, rng: np.random.Generator):
        self.shape, self.sigma, self.rng = shape, sigma, rng

    def __call__(self) -> np.ndarray:
        return self.sigma * self.rng.standard_normal(self.shape)


class OUNoise:
    """Ornstein-Uhlenbeck: ``x <- x - theta * x + sigma * N(0, 1)`` per step and env.

    The process runs on across episode ends (the acting policy does not see
    them); its mean reversion forgets the previous episode within ~1/theta steps.
    """

    def __init__(self, shape: tuple[int, ...], sigma: float, theta: float, rng: np.random.Generator):
        self.sigma, self.theta, self.rng = sigma, theta, rng
        self.state = np.zeros(shape)

    def __call__(self) -> np.ndarray:
        self.state += -self.theta * self.state + self.sigma * self.rng.standard_normal(self.state.shape)
        return self.state.copy()


# --------------------------------------------------------------------------
# Acting


class DDPGActor(NStepPolicy):
    def __init__(self, algo: ApexDDPG, actor_index: int, seed: int):
        m = algo.cfg.model
        super().__init__(m.n_step, m.gamma)
        setup_torch(m.torch_threads, seed)
        self.actor = algo.actor_network().eval()
        # Acting on CPU: a small MLP runs in numpy (torch's per-call cost dominates at a few rows).
        self.fast = compile_numpy(
            nn.Sequential(self.actor.torso, self.actor.out, nn.Tanh()),
            probe_observations(algo.env_spec.observation_space, seed=seed),
        )
        self.critic = algo.critic_network().eval()  # for initial priorities
        self.space = algo.env_spec.action_space
        self.model = m
        self.rng = np.random.default_rng(seed)
        self.noise = None  # made for the number of envs of the first `act`
        self.device = torch.device("cpu")

    def __repr__(self) -> str:
        return f"<DDPGActor noise={type(self.noise).__name__} weights_version={self.weights_version}>"

    def _make_noise(self, num_envs: int):
        m = self.model
        shape = (num_envs, int(np.prod(self.space.shape)))
        if m.exploration == "ou":
            return OUNoise(shape, m.exploration_sigma, m.ou_theta, self.rng)
        return GaussianNoise(shape, m.exploration_sigma, self.rng)

    def act(self, obs: np.ndarray) -> np.ndarray:
        if self.fast is not None:
            unit = self.fast(obs)
        else:
            with torch.inference_mode():
                unit = self.actor.unit(as_tensor(obs, self.device)).numpy()
        if self.noise is None:
            self.noise = self._make_noise(len(obs))
        unit = np.clip(unit + self.noise(), -1.0, 1.0)
        low, high = self.space.low.reshape(-1), self.space.high.reshape(-1)
        action = np.clip((high + low) / 2 + (high - low) / 2 * unit, low, high)  # no rounding past a bound
        return action.reshape((len(obs),) + self.space.shape).astype(self.space.dtype)

    @torch.no_grad()
    def priorities(self, batch):
        """|TD| with the actor's copies of mu and Q standing in for the targets."""
        next_obs = as_tensor(batch["next_obs"], self.device)
        y = n_step_critic_target(
            as_tensor(batch["reward"], self.device),
            as_tensor(batch["discount"], self.device),
            self.critic.q_unit(next_obs, self.actor.unit(next_obs)),
        )
        q = self.critic(as_tensor(batch["obs"], self.device), as_tensor(batch["action"], self.device, torch.float32))
        return (y - q).abs().numpy().astype(np.float64)

    def set_weights(self, weights, version):
        load_numpy_state(self.actor, weights, "actor")
        load_numpy_state(self.critic, weights, "critic")
        if self.fast is not None:
            self.fast.refresh()
        self.weights_version = version


# --------------------------------------------------------------------------
# Learning


class DDPGLearner(ApexLearner):
    checkpoint_items = {
        name: name
        for name in ("actor", "critic", "actor_target", "critic_target", "actor_optimizer", "critic_optimizer")
    }

    def __init__(self, algo: ApexDDPG, learner_index: int, num_learners: int, seed: int, rendezvous: str | None):
        super().__init__(algo, learner_index, num_learners, seed)
        m = self.m
        self.actor = algo.actor_network().to(self.device)
        self.critic = algo.critic_network().to(self.device)
        self.actor_target = copy.deepcopy(self.actor).requires_grad_(False)
        self.critic_target = copy.deepcopy(self.critic).requires_grad_(False)
        self.actor_params = list(self.actor.parameters())
        self.critic_params = list(self.critic.parameters())
        self.actor_optimizer = Adam(self.actor_params, lr=m.actor_learning_rate, eps=m.adam_eps)
        self.critic_optimizer = Adam(self.critic_params, lr=m.critic_learning_rate, eps=m.adam_eps)
        self.join(
            self.critic_params + self.actor_params, [self.actor, self.critic], learner_index, num_learners, rendezvous
        )
        hard_update(self.actor_target, self.actor)
        hard_update(self.critic_target, self.critic)

    def step(self, batch):
        if self.dp.stopped:
            return LearnerResult(stop=True)
        obs, next_obs, action, reward, discount, weights = self.tensors(batch, torch.float32)
        with torch.no_grad():
            q_next = self.critic_target.q_unit(next_obs, self.actor_target.unit(next_obs))
            y = n_step_critic_target(reward, discount, q_next)
        q_t = self.critic(obs, action)
        td = y - q_t
        critic_loss = td_loss(td, weights, self.m.loss, self.m.huber_delta)
        actor_loss = -self.critic.q_unit(obs, self.actor.unit(obs)).mean()

        # Both gradients from the same parameters (the actor's only reaches the actor).
        norms = self.apply(
            [
                ("critic loss", critic_loss, self.critic_params, self.critic_optimizer),
                ("actor loss", actor_loss, self.actor_params, self.actor_optimizer),
            ]
        )
        if norms is None:
            return LearnerResult(stop=True)  # a peer's data ended: nothing applied
        soft_update(self.critic_target, self.critic, self.m.tau)
        soft_update(self.actor_target, self.actor, self.m.tau)

        priorities = td.detach().abs().cpu().numpy().astype(np.float64)
        metrics = {
            "losses/critic_loss": float(critic_loss.detach()),
            "losses/actor_loss": float(actor_loss.detach()),
            "losses/critic_grad_norm": norms["critic loss"],
            "losses/actor_grad_norm": norms["actor loss"],
            "values/q_mean": float(q_t.detach().mean()),
            "values/td_abs_mean": float(priorities.mean()),
        }
        return LearnerResult(metrics, priorities)

    def get_weights(self):
        return {**state_to_numpy(self.actor, "actor"), **state_to_numpy(self.critic, "critic")}

    def acting_policy(self):
        return copy.deepcopy(self.actor).cpu(), self.algo.policy_meta(self.learner_steps)


# --------------------------------------------------------------------------
# Builder


class ApexDDPG(ApexDDPGSettings, Algorithm):
    def __init__(self, cfg, env_spec):
        super().__init__(cfg, env_spec)
        obs_space, action_space = env_spec.observation_space, env_spec.action_space
        check_observation_space(obs_space, "env.id")
        if not isinstance(action_space, gym.spaces.Box):
            raise ConfigError(
                f"env.id: apex_ddpg needs a Box action space; {env_spec.id} has {action_space} "
                "(use apex_dqn for Discrete actions)"
            )
        if not (np.all(np.isfinite(action_space.low)) and np.all(np.isfinite(action_space.high))):
            raise ConfigError(f"env.id: apex_ddpg needs bounded actions; {env_spec.id} has {action_space}")
        fixed = np.flatnonzero((action_space.high - action_space.low).reshape(-1) <= 0)
        if len(fixed):
            # The rescaling to [-1, 1] divides by high - low: 0/0 gives NaN actions.
            raise ConfigError(
                f"env.id: apex_ddpg needs low < high in every action dimension; {env_spec.id} has "
                f"low == high in dimension(s) {fixed.tolist()} of {action_space} (such a dimension "
                "is no choice: remove it with a gymnasium ActionWrapper)"
            )
        default = ["nature_cnn"] if is_image(obs_space) else DEFAULT_MLP
        m = cfg.model
        self.actor_layers = parse_network(m.actor_network or default, "model.actor_network")
        self.critic_layers = parse_network(m.critic_network or default, "model.critic_network")
        shapes_only(self.actor_network)  # shape errors surface now
        shapes_only(self.critic_network)

    def actor_network(self) -> DeterministicActor:
        return DeterministicActor(self.env_spec.observation_space, self.env_spec.action_space, self.actor_layers)

    def acting_module(self) -> DeterministicActor:
        return self.actor_network()

    def critic_network(self) -> Critic:
        return Critic(self.env_spec.observation_space, self.env_spec.action_space, self.critic_layers)

    def transition_spec(self):
        obs_space, action_space = self.env_spec.observation_space, self.env_spec.action_space
        obs = (tuple(obs_space.shape), np.dtype(obs_space.dtype).str)
        action = (tuple(action_space.shape), np.dtype(action_space.dtype).str)
        return {
            "obs": obs,
            "action": action,
            "reward": ((), "<f4"),
            "next_obs": obs,
            "done": ((), "|b1"),
            "discount": ((), "<f4"),
        }

    def max_batch_rows(self):
        return nstep_batch_rows(self.cfg, self.cfg.model.n_step)

    def weights_spec(self):
        return {
            **weights_spec_of_module(shapes_only(self.actor_network), "actor"),
            **weights_spec_of_module(shapes_only(self.critic_network), "critic"),
        }

    def policy_meta(self, learner_steps: int) -> dict:
        obs_space, action_space = self.env_spec.observation_space, self.env_spec.action_space
        return {
            "algo": self.name,
            "env_id": self.env_spec.id,
            "learner_steps": learner_steps,
            "observation_shape": list(obs_space.shape),
            "observation_dtype": np.dtype(obs_space.dtype).str,
            "action": {
                "kind": "box",
                "shape": list(action_space.shape),
                "low": action_space.low.reshape(-1).tolist(),
                "high": action_space.high.reshape(-1).tolist(),
            },
            "signature": "obs[B, *observation_shape] -> float32 actions[B, prod(action_shape)]",
            "rebuild": self.policy_record(),
        }

    def make_actor(self, actor_index, num_actors, seed):
        return DDPGActor(self, actor_index, seed)

    def make_learner(self, learner_index, num_learners, seed, rendezvous=None):
        return DDPGLearner(self, learner_index, num_learners, seed, rendezvous)


ALGORITHM = ApexDDPG
