"""What the offline Q-learning algorithms share (bcq, cql): the builder's side
(`OfflineQAlgorithm`) and the learner's (`OfflineQLearner`).

They learn from ``offline.dataset`` only: memory hosts serve the dataset's n-step rows
(`aiorl.offline.rows.offline_rows`, ``model.n_step`` and ``model.gamma``), learners sample them
as Ape-X learners sample a replay, and no actor starts (`OfflineQAlgorithm.make_actor` refuses in
one line). Discrete actions only: the Q head has one output per action. The learner keeps an
online network, its target copy (periodic copies, or Polyak averaging with ``model.tau``) and one
Adam over the online network; what it publishes and exports is the acting policy the algorithm
wraps around the online network (`OfflineQAlgorithm.policy_of`).
"""

from __future__ import annotations

import copy
from typing import ClassVar

import gymnasium as gym
import numpy as np
from torch import nn

from aiorl.algos.lib.actor_critic import policy_meta
from aiorl.algos.lib.common import ApexLearner, hard_update, shapes_only, soft_update, weights_spec_of_module
from aiorl.algos.lib.layers import parse_network
from aiorl.algos.lib.networks import DEFAULT_MLP, check_observation_space
from aiorl.algos.lib.optimizers import Adam
from aiorl.config import ConfigError
from aiorl.runtime.algorithm import Algorithm, Spec

#: What an offline Q-learning algorithm says about action spaces, in the refusal's one line.
DISCRETE_ONLY = "Discrete action spaces numbered from 0 only (its Q head has one output per action)"


def check_discrete_actions(env_spec, algo: str) -> int:
    """The number of actions of a Discrete space numbered from 0; anything else a ConfigError in one
    line naming the space and what is supported."""
    space = env_spec.action_space
    if isinstance(space, gym.spaces.Discrete) and int(space.start) == 0:
        return int(space.n)
    raise ConfigError(f"algo: {algo} supports {DISCRETE_ONLY}; {env_spec.id} has {space}")


class OfflineQAlgorithm(Algorithm):
    """Builder of an offline Q-learning algorithm: checks the spaces, parses the torso, refuses
    actors, and gives the spec, the weights spec and the policy meta. A subclass builds its online
    network (`network`), the acting policy around one (`policy_of`) and its learner."""

    offline_only: ClassVar[bool] = True

    def __init__(self, cfg, env_spec):
        super().__init__(cfg, env_spec)
        check_observation_space(env_spec.observation_space, "env.id")
        self.num_actions = check_discrete_actions(env_spec, self.name)
        self.layers = parse_network(cfg.model.network or DEFAULT_MLP, "model.network")
        shapes_only(self.acting_module)  # shape errors (a conv on vectors) surface now

    def network(self) -> nn.Module:
        """A fresh online network (the target network is a copy of it)."""
        raise NotImplementedError

    def policy_of(self, network: nn.Module) -> nn.Module:
        """The acting policy (obs batch -> int64 actions) around `network`, sharing its parameters."""
        raise NotImplementedError

    def acting_module(self) -> nn.Module:
        return self.policy_of(self.network())

    def transition_spec(self) -> Spec:
        # Only fields of aiorl.offline.rows.OFFLINE_FIELDS: the rows a dataset store gives.
        space = self.env_spec.observation_space
        obs = (tuple(space.shape), np.dtype(space.dtype).str)
        return {
            "obs": obs,
            "action": ((), "<i8"),
            "reward": ((), "<f4"),
            "next_obs": obs,
            "discount": ((), "<f4"),
        }

    def weights_spec(self):
        return weights_spec_of_module(shapes_only(self.acting_module), "policy")

    def policy_meta(self, learner_steps: int) -> dict:
        return policy_meta(self.name, self.env_spec, learner_steps, rebuild=self.policy_record())

    def make_actor(self, actor_index, num_actors, seed):
        raise ConfigError(
            f"algo: {self.name} learns from offline.dataset only; it starts no actors (cluster.actors: 0)"
        )


class OfflineQLearner(ApexLearner):
    """An `ApexLearner` with the algorithm's online network in ``self.online``, its target copy
    in ``self.target`` and one Adam over the online parameters; subclasses write `step` (calling
    `update_target` after each applied step)."""

    algo: OfflineQAlgorithm
    checkpoint_items = {"model": "online", "target": "target", "optimizer": "optimizer"}

    def __init__(self, algo: OfflineQAlgorithm, learner_index: int, num_learners: int, seed: int, rendezvous):
        super().__init__(algo, learner_index, num_learners, seed)
        self.online = algo.network().to(self.device)
        self.target = copy.deepcopy(self.online).requires_grad_(False)
        self.params = list(self.online.parameters())
        self.optimizer = Adam(self.params, lr=self.m.learning_rate, eps=self.m.adam_eps)
        self.join(self.params, [self.online], learner_index, num_learners, rendezvous)
        hard_update(self.target, self.online)

    def update_target(self) -> None:
        if self.m.tau is not None:
            soft_update(self.target, self.online, self.m.tau)
        elif self.learner_steps % self.m.sync_target_frequency == 0:
            hard_update(self.target, self.online)

    def get_weights(self):
        # No actor acts on them: learner 0 publishes (and a digest compares) the acting policy's.
        policy = self.algo.policy_of(self.online)
        return {f"policy.{k}": v.detach().cpu().numpy().copy() for k, v in policy.state_dict().items()}

    def acting_policy(self):
        policy = self.algo.policy_of(copy.deepcopy(self.online).cpu())
        return policy, self.algo.policy_meta(self.learner_steps)
