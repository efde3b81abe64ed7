"""MARWIL, monotonic advantage re-weighted imitation learning (Wang et al. 2018, "Exponentially
weighted imitation learning for batched historical data"): behaviour cloning in which each
dataset action counts by how much better than usual it turned out, learned from
``offline.dataset`` alone.

Reads top to bottom: the weights and losses, the learner, the builder; its config (the model
section and its checks) is `aiorl.algos.marwil_config`, which loads without torch. The shared
offline pieces (no actors, the policy network, the acting policy) are in
`aiorl.algos.lib.offline`.

On a batch of dataset rows (s_i, a_i, G_i), i = 1..B, where G_i = sum_{k>=0} gamma^k r_{t+k}
is the row's Monte Carlo return to its episode's end (the dataset's ``mc_return``):

    advantage:  A_i  = G_i - V(s_i)
    value:      L_V  = (1/2B) sum_i A_i^2
    norm:       c^2 <- c^2 + rate * ((1/B) sum_i A_i^2 - c^2)
    weights:    w_i  = min(exp(beta * A_i / (c + 1e-8)), max_weight)
    policy:     L_pi = -(1/B) sum_i w_i * log pi(a_i | s_i)

c^2 is a moving average of the squared advantage (``moving_average_rate``, from
``moving_average_start``), the normalisation RLlib and EasyRL use: beta then reads in units
of the advantage's typical size, whatever the reward scale. It is updated before the weights
are taken, from the batch's advantages. Advantages, c and the weights carry no gradient; the
weights are clipped (``max_weight``) so that one lucky row cannot dominate a batch.

pi is bc's policy (a categorical over Discrete actions, a diagonal Gaussian with a learned
state-independent std over Box actions; the acting policy is its argmax or its mean clipped
to the bounds) and V a separate network; each has its own Adam and its own gradient clip, so
that the value loss never moves the policy. With ``beta = 0`` every weight is exactly 1 and
the policy's loss, gradient and steps are bc's (the same seed gives the same policy). Each
data-parallel learner keeps c^2 from its own batches (the same start and rate: statistically
the same value, with no extra collective per step).
"""

from __future__ import annotations

import math

import torch

from aiorl.algos.lib.common import as_tensor, shapes_only
from aiorl.algos.lib.layers import parse_network
from aiorl.algos.lib.offline import OfflineAlgorithm, OfflinePolicyLearner, ValueNetwork
from aiorl.algos.lib.optimizers import Adam
from aiorl.algos.marwil_config import MARWILSettings
from aiorl.runtime.algorithm import LearnerResult

# --------------------------------------------------------------------------
# Logic: the weights and losses


def update_squared_norm(average: float, advantage: torch.Tensor, rate: float) -> float:
    """``c^2 + rate * (mean A^2 - c^2)``: the moving average of the squared advantage, one step."""
    return average + rate * (float(advantage.pow(2).mean()) - average)


def marwil_weights(advantage: torch.Tensor, beta: float, squared_norm: float, max_weight: float) -> torch.Tensor:
    """``min(exp(beta * A / (c + 1e-8)), max_weight)`` with ``c = sqrt(squared_norm)`` (the
    exponent clipped first, so that it cannot overflow)."""
    scaled = beta * advantage / (math.sqrt(squared_norm) + 1e-8)
    return torch.exp(torch.clamp(scaled, max=math.log(max_weight)))


def marwil_losses(
    log_prob: torch.Tensor, value: torch.Tensor, mc_return: torch.Tensor, weights: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(policy loss ``-mean w * log pi(a|s)``, value loss ``mean (G - V)^2 / 2``)."""
    return -(weights * log_prob).mean(), 0.5 * (mc_return - value).pow(2).mean()


# --------------------------------------------------------------------------
# Learning


class MARWILLearner(OfflinePolicyLearner):
    checkpoint_items = {
        "policy": "policy",
        "value": "value",
        "policy_optimizer": "policy_optimizer",
        "value_optimizer": "value_optimizer",
    }

    def __init__(self, algo: MARWIL, learner_index: int, num_learners: int, seed: int, rendezvous: str | None):
        super().__init__(algo, learner_index, num_learners, seed)
        m = self.m
        # Built after the policy: with the same seed the policy starts as bc's does.
        self.value = algo.value_network().to(self.device)
        self.policy_params = list(self.policy.parameters())
        self.value_params = list(self.value.parameters())
        self.policy_optimizer = Adam(self.policy_params, lr=m.learning_rate, eps=m.adam_eps)
        self.value_optimizer = Adam(self.value_params, lr=m.value_learning_rate, eps=m.adam_eps)
        self.squared_norm = float(m.moving_average_start)
        self.join(
            self.policy_params + self.value_params, [self.policy, self.value], learner_index, num_learners, rendezvous
        )

    def step(self, batch):
        if self.dp.stopped:
            return LearnerResult(stop=True)
        m = self.m
        obs, action = self.obs_and_action(batch)
        mc_return = as_tensor(batch["mc_return"], self.device, torch.float32)
        value = self.value(obs)
        advantage = mc_return - value.detach()
        self.squared_norm = update_squared_norm(self.squared_norm, advantage, m.moving_average_rate)
        weights = marwil_weights(advantage, m.beta, self.squared_norm, m.max_weight)
        params = self.policy.policy_params(obs)
        policy_loss, value_loss = marwil_losses(self.policy.head.log_prob(params, action), value, mc_return, weights)

        norms = self.apply(
            [
                ("policy loss", policy_loss, self.policy_params, self.policy_optimizer),
                ("value loss", value_loss, self.value_params, self.value_optimizer),
            ]
        )
        if norms is None:
            return LearnerResult(stop=True)  # a peer's data ended: nothing applied
        with torch.no_grad():  # a Box head's log-std is a parameter: no graph for a metric
            entropy = float(self.policy.head.entropy(params.detach()).mean())
        return LearnerResult(
            {
                "losses/policy_loss": float(policy_loss.detach()),
                "losses/value_loss": float(value_loss.detach()),
                "losses/policy_grad_norm": norms["policy loss"],
                "losses/value_grad_norm": norms["value loss"],
                "values/v_mean": float(value.detach().mean()),
                "values/advantage_mean": float(advantage.mean()),
                "values/advantage_norm": math.sqrt(self.squared_norm),
                "values/weight_mean": float(weights.mean()),
                "values/weight_clipped_frac": float((weights >= m.max_weight * (1 - 1e-6)).float().mean()),
                "values/entropy": entropy,
            }
        )

    def state_dict(self):
        return {**super().state_dict(), "squared_norm": self.squared_norm}

    def load_state_dict(self, state):
        super().load_state_dict(state)
        self.squared_norm = float(state["squared_norm"])


# --------------------------------------------------------------------------
# Builder


class MARWIL(MARWILSettings, OfflineAlgorithm):
    dataset_fields = ("obs", "action", "mc_return")

    def __init__(self, cfg, env_spec):
        super().__init__(cfg, env_spec)
        self.value_layers = parse_network(cfg.model.value_network, "model.value_network") or self.layers
        shapes_only(self.value_network)

    def value_network(self) -> ValueNetwork:
        return ValueNetwork(self.env_spec.observation_space, self.value_layers)

    def make_learner(self, learner_index, num_learners, seed, rendezvous=None):
        return MARWILLearner(self, learner_index, num_learners, seed, rendezvous)


ALGORITHM = MARWIL
