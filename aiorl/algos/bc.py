"""Behaviour cloning: the policy that most likely took the dataset's actions, learned from
``offline.dataset`` alone (no env step, no reward).

Reads top to bottom: the loss, the learner, the builder; its config (the model section and
its checks) is `aiorl.algos.bc_config`, which loads without torch. The shared offline pieces
(no actors, the policy network, the acting policy) are in `aiorl.algos.lib.offline`.

On a batch of dataset rows (s_i, a_i), i = 1..B, it minimises the negative log-likelihood

    L_bc = -(1/B) sum_i log pi(a_i | s_i)

- Discrete(n): pi(.|s) = softmax(logits(s)), so L_bc is the cross-entropy between the
  policy and the dataset's actions; the acting policy is argmax_a logits(s, a).
- Box: pi(.|s) = N(mu(s), diag(sigma^2)), sigma = exp(log_std) one learned value per
  action dimension, independent of s (``model.log_std_init`` to start), so that

      -log pi(a|s) = sum_j [ (a_j - mu_j(s))^2 / (2 sigma_j^2) + log sigma_j ] + const:

  a squared error on the mean, weighed by how spread the dataset's actions are; the acting
  policy is mu(s), clipped to the action bounds.

Rows are sampled uniformly (``agent.prioritized_replay`` off by default; bc gives no
priorities back, so on a prioritized replay every row keeps priority 1). A policy cloned this
way scores about what the behaviour's own greedy (most likely) action scores: the noise that
chose the other actions is averaged out, the mistakes the behaviour makes on purpose are not.
"""

from __future__ import annotations

import torch

from aiorl.algos.bc_config import BCSettings
from aiorl.algos.lib.offline import OfflineAlgorithm, OfflinePolicyLearner
from aiorl.algos.lib.optimizers import Adam
from aiorl.runtime.algorithm import LearnerResult

# --------------------------------------------------------------------------
# Logic: the loss


def bc_loss(log_prob: torch.Tensor) -> torch.Tensor:
    """``-mean_i log pi(a_i|s_i)``: the negative log-likelihood of the dataset's actions."""
    return -log_prob.mean()


# --------------------------------------------------------------------------
# Learning


class BCLearner(OfflinePolicyLearner):
    checkpoint_items = {"policy": "policy", "optimizer": "optimizer"}

    def __init__(self, algo: BC, learner_index: int, num_learners: int, seed: int, rendezvous: str | None):
        super().__init__(algo, learner_index, num_learners, seed)
        self.params = list(self.policy.parameters())
        self.optimizer = Adam(self.params, lr=self.m.learning_rate, eps=self.m.adam_eps)
        self.join(self.params, [self.policy], learner_index, num_learners, rendezvous)

    def step(self, batch):
        if self.dp.stopped:
            return LearnerResult(stop=True)
        obs, action = self.obs_and_action(batch)
        params = self.policy.policy_params(obs)
        loss = bc_loss(self.policy.head.log_prob(params, action))
        norms = self.apply([("policy loss", loss, self.params, self.optimizer)])
        if norms is None:
            return LearnerResult(stop=True)  # a peer's data ended: nothing applied
        return LearnerResult(
            {
                "losses/policy_loss": float(loss.detach()),
                "losses/grad_norm": norms["policy loss"],
                "values/entropy": float(self.policy.head.entropy(params.detach()).detach().mean()),
            }
        )


# --------------------------------------------------------------------------
# Builder


class BC(BCSettings, OfflineAlgorithm):
    dataset_fields = ("obs", "action")

    def make_learner(self, learner_index, num_learners, seed, rendezvous=None):
        return BCLearner(self, learner_index, num_learners, seed, rendezvous)


ALGORITHM = BC
