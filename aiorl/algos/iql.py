"""Implicit Q-learning (Kostrikov, Nair and Levine 2021), for Box actions: learns from a
dataset only, never querying Q at an action the dataset does not hold.

Reads top to bottom: the three losses, the networks, the learner, the builder; its config
(the model section and its checks) is `aiorl.algos.iql_config`, which loads without torch.

On a dataset row (s, a, R, s', d) (n-step: R the discounted reward sum, d = gamma^m, 0 when
the episode terminated inside the window), with twin critics Q_1, Q_2, their Polyak targets
Q'_1, Q'_2, a state value V and a Gaussian actor pi(a|s) = N(mu(s), sigma^2) on actions
rescaled to [-1, 1]:

    value:   L_V  = E[ |tau - 1(u < 0)| * u^2 ],        u = min_i Q'_i(s, a) - V(s)
    critics: L_Q  = sum_i E[ (R + d * V(s') - Q_i(s, a))^2 ]
    actor:   L_pi = -E[ min(exp(beta * A), max_weight) * log pi(a|s) ],  A = min_i Q'_i(s, a) - V(s)

The expectile tau (``model.expectile``) > 0.5 makes V an upper expectile of Q over the
dataset's actions at s: an in-sample stand-in for max_a Q(s, a), so that the critic target
R + d * V(s') needs no action from the policy (0.5: the behaviour's value, SARSA). The
actor is advantage-weighted regression: behaviour cloning of the dataset's actions, each
weighted by exp(beta * A) (``model.beta``; 0 is plain cloning), clipped at ``max_weight``
so that one row cannot dominate a batch. Advantages and targets carry no gradient. The
three gradients are taken from the same parameters and applied together; the critic
targets follow by Polyak averaging with ``tau``. The acting policy (evaluation, export) is
the actor's mean, center + half_range * tanh(f(s)), within the action bounds.
"""

from __future__ import annotations

import copy
import math

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from aiorl.algos.iql_config import IQLSettings
from aiorl.algos.lib.actor_critic import policy_meta
from aiorl.algos.lib.common import ApexLearner, hard_update, shapes_only, soft_update, weights_spec_of_module
from aiorl.algos.lib.layers import parse_network
from aiorl.algos.lib.networks import DEFAULT_MLP, Critic, DeterministicActor, check_observation_space
from aiorl.algos.lib.offline import ValueNetwork
from aiorl.algos.lib.optimizers import Adam
from aiorl.config import ConfigError
from aiorl.offline.rows import OFFLINE_FIELDS
from aiorl.runtime.algorithm import Algorithm, LearnerResult

# --------------------------------------------------------------------------
# Logic: the three losses


def expectile_loss(diff: torch.Tensor, expectile: float) -> torch.Tensor:
    """``mean |tau - 1(diff < 0)| * diff^2``: asymmetric squares, ``diff`` = target - prediction."""
    weight = torch.where(diff < 0, 1.0 - expectile, expectile)
    return (weight * diff.pow(2)).mean()


def advantage_weights(advantage: torch.Tensor, beta: float, max_weight: float) -> torch.Tensor:
    """``min(exp(beta * A), max_weight)`` (the exponent clipped first, so that it cannot overflow)."""
    return torch.exp(torch.clamp(beta * advantage, max=math.log(max_weight)))


def gaussian_log_prob(mean: torch.Tensor, log_std: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
    """log N(action; mean, exp(log_std)^2), summed over the action's dimensions."""
    z = (action - mean) * torch.exp(-log_std)
    return (-0.5 * z.pow(2) - log_std - 0.5 * math.log(2 * math.pi)).sum(dim=1)


# --------------------------------------------------------------------------
# Networks


class GaussianActor(nn.Module):
    """pi(a|s) = N(mu(s), sigma^2) in [-1, 1] action units, with mu the tanh output of a
    `DeterministicActor` (``mean``: the acting policy) and one state-independent log sigma
    per action dimension, clipped to [min_log_std, max_log_std]."""

    def __init__(self, mean: DeterministicActor, action_dim: int, min_log_std: float, max_log_std: float):
        super().__init__()
        self.mean = mean
        self.log_std = nn.Parameter(torch.zeros(action_dim))
        self.min_log_std, self.max_log_std = min_log_std, max_log_std

    def log_prob(self, obs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        """log pi of env-scale `action` (rows [B, action_dim]), taken in [-1, 1] units."""
        unit = self.mean.scale.to_unit(action.reshape(action.shape[0], -1)).clamp(-1.0, 1.0)
        log_std = self.log_std.clamp(self.min_log_std, self.max_log_std)
        return gaussian_log_prob(self.mean.unit(obs), log_std, unit)


# --------------------------------------------------------------------------
# Learning


class IQLLearner(ApexLearner):
    checkpoint_items = {
        name: name
        for name in (
            "actor",
            "critics",
            "critics_target",
            "value",
            "actor_optimizer",
            "critic_optimizer",
            "value_optimizer",
        )
    }

    def __init__(self, algo: IQL, learner_index: int, num_learners: int, seed: int, rendezvous: str | None):
        super().__init__(algo, learner_index, num_learners, seed)
        m = self.m
        self.actor = algo.gaussian_actor().to(self.device)
        self.critics = nn.ModuleList([algo.critic_network(), algo.critic_network()]).to(self.device)
        self.value = algo.value_network().to(self.device)
        self.critics_target = copy.deepcopy(self.critics).requires_grad_(False)
        self.actor_params = list(self.actor.parameters())
        self.critic_params = list(self.critics.parameters())
        self.value_params = list(self.value.parameters())
        self.actor_optimizer = Adam(self.actor_params, lr=m.actor_learning_rate, eps=m.adam_eps)
        self.critic_optimizer = Adam(self.critic_params, lr=m.critic_learning_rate, eps=m.adam_eps)
        self.value_optimizer = Adam(self.value_params, lr=m.value_learning_rate, eps=m.adam_eps)
        self.join(
            self.actor_params + self.critic_params + self.value_params,
            [self.actor, self.critics, self.value],
            learner_index,
            num_learners,
            rendezvous,
        )
        hard_update(self.critics_target, self.critics)

    def step(self, batch):
        if self.dp.stopped:
            return LearnerResult(stop=True)
        m = self.m
        obs, next_obs, action, reward, discount, _ = self.tensors(batch, torch.float32)
        with torch.no_grad():
            q_target = torch.min(self.critics_target[0](obs, action), self.critics_target[1](obs, action))
            y = m.reward_scale * reward + discount * self.value(next_obs)
        v = self.value(obs)
        value_loss = expectile_loss(q_target - v, m.expectile)
        q1, q2 = self.critics[0](obs, action), self.critics[1](obs, action)
        critic_loss = (y - q1).pow(2).mean() + (y - q2).pow(2).mean()
        advantage = q_target - v.detach()
        weights = advantage_weights(advantage, m.beta, m.max_weight)
        actor_loss = -(weights * self.actor.log_prob(obs, action)).mean()

        norms = self.apply(
            [
                ("value loss", value_loss, self.value_params, self.value_optimizer),
                ("critic loss", critic_loss, self.critic_params, self.critic_optimizer),
                ("actor loss", actor_loss, self.actor_params, self.actor_optimizer),
            ]
        )
        if norms is None:
            return LearnerResult(stop=True)  # a peer's data ended: nothing applied
        soft_update(self.critics_target, self.critics, m.tau)
        return LearnerResult(
            {
                "losses/value_loss": float(value_loss.detach()),
                "losses/critic_loss": float(critic_loss.detach()),
                "losses/actor_loss": float(actor_loss.detach()),
                "values/q_mean": float(q_target.mean()),
                "values/v_mean": float(v.detach().mean()),
                "values/advantage_mean": float(advantage.mean()),
                "values/weight_mean": float(weights.mean()),
                "values/weight_clipped_frac": float((weights >= m.max_weight * (1 - 1e-6)).float().mean()),
            }
        )

    def get_weights(self):
        # No actor acts on them: learner 0 publishes (and a digest compares) the acting policy's.
        return {f"actor.{k}": v.detach().cpu().numpy().copy() for k, v in self.actor.mean.state_dict().items()}

    def acting_policy(self):
        return copy.deepcopy(self.actor.mean).cpu(), self.algo.policy_meta(self.learner_steps)


# --------------------------------------------------------------------------
# Builder


class IQL(IQLSettings, Algorithm):
    def __init__(self, cfg, env_spec):
        super().__init__(cfg, env_spec)
        obs_space, space = env_spec.observation_space, env_spec.action_space
        check_observation_space(obs_space, "env.id")
        bounded = isinstance(space, gym.spaces.Box) and np.all(np.isfinite(space.low) & np.isfinite(space.high))
        if not bounded or np.any(space.high <= space.low):
            raise ConfigError(
                f"algo: iql supports bounded Box action spaces (low < high) only; {env_spec.id} has {space} "
                "(for Discrete actions use bc, bcq, cql or marwil)"
            )
        m = cfg.model
        self.actor_layers = parse_network(m.actor_network or DEFAULT_MLP, "model.actor_network")
        self.critic_layers = parse_network(m.critic_network or DEFAULT_MLP, "model.critic_network")
        self.value_layers = parse_network(m.value_network or DEFAULT_MLP, "model.value_network")
        for build in (self.acting_module, self.critic_network, self.value_network):
            shapes_only(build)  # shape errors surface now

    def acting_module(self) -> DeterministicActor:
        return DeterministicActor(self.env_spec.observation_space, self.env_spec.action_space, self.actor_layers)

    def gaussian_actor(self) -> GaussianActor:
        m = self.cfg.model
        dim = int(np.prod(self.env_spec.action_space.shape))
        return GaussianActor(self.acting_module(), dim, m.min_log_std, m.max_log_std)

    def critic_network(self) -> Critic:
        return Critic(self.env_spec.observation_space, self.env_spec.action_space, self.critic_layers)

    def value_network(self) -> ValueNetwork:
        return ValueNetwork(self.env_spec.observation_space, self.value_layers)

    def transition_spec(self):
        obs_space, action_space = self.env_spec.observation_space, self.env_spec.action_space
        obs = (tuple(obs_space.shape), np.dtype(obs_space.dtype).str)
        spec = {
            "obs": obs,
            "action": (tuple(action_space.shape), np.dtype(action_space.dtype).str),
            "reward": ((), "<f4"),
            "next_obs": obs,
            "done": ((), "|b1"),
            "discount": ((), "<f4"),
        }
        assert set(spec) <= set(OFFLINE_FIELDS)  # what a dataset store can give
        return spec

    def weights_spec(self):
        return weights_spec_of_module(shapes_only(self.acting_module), "actor")

    def policy_meta(self, learner_steps: int) -> dict:
        return policy_meta(self.name, self.env_spec, learner_steps, rebuild=self.policy_record())

    def make_actor(self, actor_index, num_actors, seed):
        raise ConfigError("algo: iql learns from offline.dataset only; it starts no actors (cluster.actors: 0)")

    def make_learner(self, learner_index, num_learners, seed, rendezvous=None):
        return IQLLearner(self, learner_index, num_learners, seed, rendezvous)


ALGORITHM = IQL
