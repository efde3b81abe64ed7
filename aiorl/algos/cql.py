"""Discrete CQL, conservative Q-learning (Kumar et al. 2020, "Conservative Q-learning for offline
reinforcement learning", the CQL(H) loss on a DQN head; d3rlpy's ``DiscreteCQL``): DQN on
``offline.dataset`` with a term that holds Q down on the actions the dataset did not take.

Reads top to bottom: the conservative term, the learner, the builder; its config (the model
section and its checks) is `aiorl.algos.cql_config`, which loads without torch. The shared
offline Q pieces (no actors, the target network, the exported policy) are in
`aiorl.algos.lib.offline_q`; the network and the n-step double-Q target are Ape-X DQN's.

On a row (s_t, a_t, R_t, s_{t+m}, d_t) with m <= n steps (the dataset's n-step rows: R_t the
discounted reward of the window, d_t = gamma^m or 0 after termination):

    y_t = R_t + d_t * Q_target(s_{t+m}, argmax_a Q_online(s_{t+m}, a))     (Q_target's own max
                                                                              without double Q)
    L   = mean_i huber(y_i - Q(s_i, a_i))
        + alpha * mean_i [ logsumexp_a Q(s_i, a) - Q(s_i, a_i) ]

The second term (``alpha``) is >= 0 and falls as Q(s, a_data) rises above the soft maximum of
Q(s, .): it pushes Q down on every action in proportion to softmax(Q) and up on the dataset's
one, so that an action the log never took in s cannot look better than it from extrapolation
alone. alpha = 0 is DQN on the dataset; the larger alpha, the closer the greedy policy stays to
the dataset's actions. The term is in units of Q, so alpha scales with the rewards (d3rlpy's
default, 1.0, suits rewards of about 1 a step). The acting policy (evaluation, export,
`aiorl eval`) is greedy in Q_online.
"""

from __future__ import annotations

import numpy as np
import torch

from aiorl.algos.apex_dqn import n_step_q_target
from aiorl.algos.cql_config import CQLSettings
from aiorl.algos.lib.common import td_loss
from aiorl.algos.lib.networks import GreedyPolicy, QNetwork
from aiorl.algos.lib.offline_q import OfflineQAlgorithm, OfflineQLearner
from aiorl.runtime.algorithm import LearnerResult

# --------------------------------------------------------------------------
# Logic: the conservative term


def conservative_term(q_all: torch.Tensor, q_taken: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """``mean_i w_i * (logsumexp_a Q(s_i, a) - Q(s_i, a_i))`` (w: the rows' importance weights, 1
    on a uniform sample)."""
    return (weights * (torch.logsumexp(q_all, dim=1) - q_taken)).mean()


# --------------------------------------------------------------------------
# Learning


class CQLLearner(OfflineQLearner):
    def step(self, batch):
        if self.dp.stopped:
            return LearnerResult(stop=True)
        m = self.m
        obs, next_obs, action, reward, discount, weights = self.tensors(batch, torch.int64)
        if m.double_q:  # one online pass over s_t and s_{t+m} together
            q_both = self.online(torch.cat([obs, next_obs]))
            q_all, q_next_online = q_both[: len(obs)], q_both[len(obs) :].detach()
        else:
            q_all, q_next_online = self.online(obs), None
        q_t = q_all.gather(1, action[:, None]).squeeze(1)
        with torch.no_grad():
            y = n_step_q_target(reward, discount, self.target(next_obs), q_next_online)
        td = y - q_t
        q_loss = td_loss(td, weights, m.loss, m.huber_delta)
        conservative = conservative_term(q_all, q_t, weights)

        norms = self.apply([("loss", q_loss + m.alpha * conservative, self.params, self.optimizer)])
        if norms is None:
            return LearnerResult(stop=True)  # a peer's data ended: nothing applied
        self.update_target()

        priorities = td.detach().abs().cpu().numpy().astype(np.float64)
        metrics = {
            "losses/td_loss": float(q_loss.detach()),
            "losses/conservative_loss": float(conservative.detach()),
            "losses/grad_norm": norms["loss"],
            "values/q_mean": float(q_t.detach().mean()),
            "values/td_abs_mean": float(priorities.mean()),
        }
        return LearnerResult(metrics, priorities)


# --------------------------------------------------------------------------
# Builder


class CQL(CQLSettings, OfflineQAlgorithm):
    def network(self) -> QNetwork:
        return QNetwork(self.env_spec.observation_space, self.num_actions, self.layers, self.cfg.model.dueling)

    def policy_of(self, network: QNetwork) -> GreedyPolicy:
        return GreedyPolicy(network)

    def make_learner(self, learner_index, num_learners, seed, rendezvous=None):
        return CQLLearner(self, learner_index, num_learners, seed, rendezvous)


ALGORITHM = CQL
