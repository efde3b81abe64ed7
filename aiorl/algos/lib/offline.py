"""What the offline algorithms that learn a policy straight from a dataset's actions share
(bc, marwil): the builder's side (`OfflineAlgorithm`), the learner's (`OfflinePolicyLearner`)
and the networks.

An offline algorithm learns from ``offline.dataset`` only: memory hosts serve the dataset's
rows (`aiorl.runtime.memory.dataset_store`), learners sample them as Ape-X learners sample a
replay, and no actor starts (`OfflineAlgorithm.make_actor` refuses in one line). Its transition
spec names fields of `aiorl.offline.rows.OFFLINE_FIELDS` only, the rows a dataset store gives.

The policy is an `ActorCritic` without its critic (``model.network``'s torso, then a
categorical head for Discrete actions, a diagonal Gaussian with a state-independent learned
log-std for Box actions); the acting policy (evaluation, export, `aiorl eval`) is its
`DeterministicPolicy`: the argmax action (Discrete), the mean clipped to the bounds (Box).
"""

from __future__ import annotations

import copy
from typing import ClassVar

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from aiorl.algos.lib.actor_critic import ActorCritic, DeterministicPolicy, policy_meta
from aiorl.algos.lib.common import ApexLearner, as_tensor, shapes_only, weights_spec_of_module
from aiorl.algos.lib.layers import Layer, parse_network
from aiorl.algos.lib.networks import DEFAULT_MLP, Torso, check_observation_space, torch_dtype
from aiorl.config import ConfigError
from aiorl.offline.rows import OFFLINE_FIELDS
from aiorl.runtime.algorithm import Algorithm, Spec

#: What `OfflineAlgorithm.supported_actions` says, in the refusal's one line.
DISCRETE_AND_BOX = "Discrete (numbered from 0) and float Box action spaces"


def check_policy_action_space(env_spec, algo: str) -> None:
    """Discrete actions numbered from 0 (a categorical head's outputs are the actions) or float
    Box actions; anything else a ConfigError in one line naming the space and what is supported."""
    space = env_spec.action_space
    if isinstance(space, gym.spaces.Discrete) and int(space.start) == 0:
        return
    if isinstance(space, gym.spaces.Box) and np.issubdtype(space.dtype, np.floating):
        return
    raise ConfigError(f"algo: {algo} supports {DISCRETE_AND_BOX}; {env_spec.id} has {space}")


class ValueNetwork(nn.Module):
    """V(s): a torso and one linear output."""

    def __init__(self, obs_space: gym.Space, layers: list[Layer]):
        super().__init__()
        self.torso = Torso(obs_space, layers)
        self.out = nn.Linear(self.torso.features, 1)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.out(self.torso(obs)).squeeze(1)


class OfflineAlgorithm(Algorithm):
    """Builder of an offline policy-learning algorithm: checks the spaces, builds the policy
    network, refuses actors, and gives the spec, weights spec and policy meta.

    A subclass names the dataset fields its learner reads in `dataset_fields` and builds its
    learner in `make_learner`."""

    offline_only: ClassVar[bool] = True
    #: The row fields its learner reads, each one of `OFFLINE_FIELDS`.
    dataset_fields: ClassVar[tuple[str, ...]] = ("obs", "action")

    def __init__(self, cfg, env_spec):
        super().__init__(cfg, env_spec)
        check_observation_space(env_spec.observation_space, "env.id")
        check_policy_action_space(env_spec, self.name)
        self.layers = parse_network(cfg.model.network or DEFAULT_MLP, "model.network")
        shapes_only(self.policy_network)  # shape errors (a conv on vectors) surface now

    def policy_network(self) -> ActorCritic:
        """pi(a|s): the torso and the action head, no critic."""
        return ActorCritic(
            self.env_spec.observation_space,
            self.env_spec.action_space,
            self.layers,
            critic=False,
            log_std_init=float(getattr(self.cfg.model, "log_std_init", 0.0)),
        )

    def acting_module(self) -> DeterministicPolicy:
        return DeterministicPolicy(self.policy_network())

    def transition_spec(self) -> Spec:
        obs_space, action_space = self.env_spec.observation_space, self.env_spec.action_space
        obs = (tuple(obs_space.shape), np.dtype(obs_space.dtype).str)
        every = {
            "obs": obs,
            "next_obs": obs,
            "action": (tuple(action_space.shape), np.dtype(action_space.dtype).str),
            "reward": ((), "<f4"),
            "done": ((), "|b1"),
            "discount": ((), "<f4"),
            "mc_return": ((), "<f4"),
        }
        unknown = [name for name in self.dataset_fields if name not in every or name not in OFFLINE_FIELDS]
        if unknown:
            raise TypeError(f"{type(self).__name__}.dataset_fields: no dataset gives {', '.join(unknown)}")
        return {name: every[name] for name in self.dataset_fields}

    def weights_spec(self):
        return weights_spec_of_module(shapes_only(self.acting_module), "policy")

    def policy_meta(self, learner_steps: int) -> dict:
        return policy_meta(self.name, self.env_spec, learner_steps, rebuild=self.policy_record())

    def make_actor(self, actor_index, num_actors, seed):
        raise ConfigError(
            f"algo: {self.name} learns from offline.dataset only; it starts no actors (cluster.actors: 0)"
        )


class OfflinePolicyLearner(ApexLearner):
    """An `ApexLearner` whose policy is ``self.policy`` (an `ActorCritic` without critic, built
    by `OfflinePolicyLearner.__init__`): batch tensors, log-probabilities of the dataset's
    actions, the weights and the exported acting policy. Subclasses add their losses, other
    networks and optimizers, then `join`."""

    algo: OfflineAlgorithm

    def __init__(self, algo: OfflineAlgorithm, learner_index: int, num_learners: int, seed: int):
        super().__init__(algo, learner_index, num_learners, seed)
        self.policy = algo.policy_network().to(self.device)
        self.action_dtype = torch_dtype(algo.env_spec.action_space)

    def obs_and_action(self, batch) -> tuple[torch.Tensor, torch.Tensor]:
        return as_tensor(batch["obs"], self.device), as_tensor(batch["action"], self.device, self.action_dtype)

    def get_weights(self):
        # No actor acts on them: learner 0 publishes (and a digest compares) the acting policy's.
        return {f"policy.{k}": v.detach().cpu().numpy().copy() for k, v in self.acting().state_dict().items()}

    def acting(self) -> DeterministicPolicy:
        return DeterministicPolicy(self.policy)

    def acting_policy(self):
        return DeterministicPolicy(copy.deepcopy(self.policy).cpu()), self.algo.policy_meta(self.learner_steps)
