"""Discrete BCQ, batch-constrained Q-learning (Fujimoto et al. 2019, "Benchmarking batch deep
reinforcement learning algorithms"; EasyRL's ``BatchDQNModel``): DQN on ``offline.dataset``
that never picks an action the dataset's behaviour would hardly have taken.

Reads top to bottom: the filter, the target and the losses, the network and the acting policy,
the learner, the builder; its config (the model section and its checks) is
`aiorl.algos.bcq_config`, which loads without torch. The shared offline Q pieces (no actors,
the target network, the exported policy) are in `aiorl.algos.lib.offline_q`.

Beside Q(s, .) the network has a behaviour head, logits l(s, .) of pi_b(.|s), trained to imitate
the dataset's actions (on the Q head's torso with ``shared_torso``, else on a torso of its own).
An action is allowed in s when

    pi_b(a|s) / max_a' pi_b(a'|s) > tau        (tau = ``ratio_threshold``; at least the most likely)

which is ``l(s, a) - max_a' l(s, a') > log tau``: the softmax's normaliser cancels. On a row
(s_t, a_t, R_t, s_{t+m}, d_t) with m <= n steps (the dataset's n-step rows: R_t the discounted
reward of the window, d_t = gamma^m or 0 after termination):

    a*   = argmax over allowed a in s_{t+m} of Q_online(s_{t+m}, a)     (Q_target without double Q)
    y_t  = R_t + d_t * Q_target(s_{t+m}, a*)
    L    = mean_i huber(y_i - Q(s_i, a_i))
         + mean_i [ -log softmax(l(s_i))[a_i] ] + c * mean_{i,a} l(s_i, a)^2

(c = ``behaviour_logit_penalty``; the allowed set always comes from the online behaviour head,
the current estimate of pi_b). One Adam steps both heads. The acting policy (evaluation,
export, `aiorl eval`) is the same argmax over the allowed actions of Q_online. tau = 0 allows
every action (DQN on the dataset); tau towards 1 leaves only the behaviour's most likely action
(behaviour cloning).
"""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from aiorl.algos.apex_dqn import n_step_q_target
from aiorl.algos.bcq_config import BCQSettings
from aiorl.algos.lib.common import td_loss
from aiorl.algos.lib.layers import Layer
from aiorl.algos.lib.networks import DuelingHead, Torso
from aiorl.algos.lib.offline_q import OfflineQAlgorithm, OfflineQLearner
from aiorl.runtime.algorithm import LearnerResult

# The value an action the filter rules out takes in an argmax: below any finite Q, and (unlike
# -inf) a plain number in an exported program.
RULED_OUT = float(torch.finfo(torch.float32).min)

# --------------------------------------------------------------------------
# Logic: the filter, the target, the losses


def unlikely_actions(logits: torch.Tensor, ratio_threshold: float) -> torch.Tensor:
    """Bool [B, A]: ``pi_b(a|s) / max_a' pi_b(a'|s) <= ratio_threshold``, from pi_b's logits."""
    if ratio_threshold <= 0:
        return torch.zeros_like(logits, dtype=torch.bool)
    return logits - logits.amax(dim=1, keepdim=True) <= math.log(ratio_threshold)


def allowed_only(q: torch.Tensor, logits: torch.Tensor, ratio_threshold: float) -> torch.Tensor:
    """`q` with the actions `unlikely_actions` rules out set below every other value: its argmax is
    the best allowed action."""
    if ratio_threshold <= 0:
        return q
    return q.masked_fill(unlikely_actions(logits, ratio_threshold), RULED_OUT)


def bcq_target(
    reward: torch.Tensor,
    discount: torch.Tensor,
    q_next_target: torch.Tensor,
    q_next_online: torch.Tensor,
    logits_next: torch.Tensor,
    ratio_threshold: float,
    double_q: bool,
) -> torch.Tensor:
    """``R + discount * Q_target(s', a*)``, a* the best allowed action in s' by the online Q (double
    Q) or by the target Q."""
    chooser = q_next_online if double_q else q_next_target
    return n_step_q_target(reward, discount, q_next_target, allowed_only(chooser, logits_next, ratio_threshold))


def behaviour_loss(logits: torch.Tensor, action: torch.Tensor, logit_penalty: float) -> torch.Tensor:
    """Cross-entropy of the dataset's actions under softmax(logits), plus ``logit_penalty`` times
    the mean squared logit."""
    return nn.functional.cross_entropy(logits, action) + logit_penalty * logits.pow(2).mean()


# --------------------------------------------------------------------------
# Network and acting policy


class BCQNetwork(nn.Module):
    """obs -> (Q(s, .), behaviour logits l(s, .)), both [B, num_actions]."""

    def __init__(self, obs_space: gym.Space, num_actions: int, layers: list[Layer], dueling: bool, shared_torso: bool):
        super().__init__()
        self.torso = Torso(obs_space, layers)
        features = self.torso.features
        self.q_head = DuelingHead(features, num_actions) if dueling else nn.Linear(features, num_actions)
        self.behaviour_torso = None if shared_torso else Torso(obs_space, layers)
        self.behaviour_head = nn.Linear(features, num_actions)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.torso(obs)
        behaviour_x = x if self.behaviour_torso is None else self.behaviour_torso(obs)
        return self.q_head(x), self.behaviour_head(behaviour_x)


class BCQPolicy(nn.Module):
    """Exported BCQ policy: observations -> the best allowed action by Q (int64)."""

    def __init__(self, net: BCQNetwork, ratio_threshold: float):
        super().__init__()
        self.net = net
        self.ratio_threshold = ratio_threshold

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        q, logits = self.net(obs)
        return allowed_only(q, logits, self.ratio_threshold).argmax(dim=1)


# --------------------------------------------------------------------------
# Learning


class BCQLearner(OfflineQLearner):
    def step(self, batch):
        if self.dp.stopped:
            return LearnerResult(stop=True)
        m = self.m
        obs, next_obs, action, reward, discount, weights = self.tensors(batch, torch.int64)
        # One online pass over s_t and s_{t+m}: Q and logits of the batch, the filter of the next states.
        q_both, logits_both = self.online(torch.cat([obs, next_obs]))
        q_all, logits = q_both[: len(obs)], logits_both[: len(obs)]
        q_next_online, logits_next = q_both[len(obs) :].detach(), logits_both[len(obs) :].detach()
        q_t = q_all.gather(1, action[:, None]).squeeze(1)
        with torch.no_grad():
            q_next_target = self.target(next_obs)[0]
            y = bcq_target(reward, discount, q_next_target, q_next_online, logits_next, m.ratio_threshold, m.double_q)
        td = y - q_t
        q_loss = td_loss(td, weights, m.loss, m.huber_delta)
        imitation = behaviour_loss(logits, action, m.behaviour_logit_penalty)

        norms = self.apply([("loss", q_loss + imitation, self.params, self.optimizer)])
        if norms is None:
            return LearnerResult(stop=True)  # a peer's data ended: nothing applied
        self.update_target()

        priorities = td.detach().abs().cpu().numpy().astype(np.float64)
        allowed = ~unlikely_actions(logits.detach(), m.ratio_threshold)
        metrics = {
            "losses/td_loss": float(q_loss.detach()),
            "losses/behaviour_loss": float(imitation.detach()),
            "losses/grad_norm": norms["loss"],
            "values/q_mean": float(q_t.detach().mean()),
            "values/td_abs_mean": float(priorities.mean()),
            "values/allowed_actions_mean": float(allowed.sum(dim=1).float().mean()),
        }
        return LearnerResult(metrics, priorities)


# --------------------------------------------------------------------------
# Builder


class BCQ(BCQSettings, OfflineQAlgorithm):
    def network(self) -> BCQNetwork:
        m = self.cfg.model
        return BCQNetwork(self.env_spec.observation_space, self.num_actions, self.layers, m.dueling, m.shared_torso)

    def policy_of(self, network: BCQNetwork) -> BCQPolicy:
        return BCQPolicy(network, self.cfg.model.ratio_threshold)

    def make_learner(self, learner_index, num_learners, seed, rendezvous=None):
        return BCQLearner(self, learner_index, num_learners, seed, rendezvous)


ALGORITHM = BCQ
