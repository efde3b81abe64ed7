"""Ape-X DQN (Horgan et al. 2018): distributed prioritized replay for DQN.

Reads top to bottom: the n-step double-Q target and loss, the acting policy,
the learner, the builder; its config (the model section and its checks) is
`aiorl.algos.apex_dqn_config`, which loads without torch.

Target of a replay row (s_t, a_t, R_t, s_{t+m}, d_t) with m <= n steps:

    y_t = R_t + d_t * Q_target(s_{t+m}, argmax_a Q_online(s_{t+m}, a))

where ``R_t = sum_{k<m} gamma^k r_{t+k}`` and ``d_t`` (the row's
``discount``, from the replay core's n-step adjustment) is gamma^m, or 0
when the episode terminated inside the window. A window cut by truncation
(time limit) still bootstraps from the final observation with gamma^m.
The loss is ``mean_i w_i * huber(y_i - Q_online(s_i, a_i))`` with the
importance weights w_i of prioritized replay; |y_i - Q(s_i, a_i)| goes back
as the new priorities. Every env slot (actor i's env e is slot
``j = i * num_envs + e`` of ``S = actors * num_envs``) explores with its own
fixed ``eps_j = eps^(1 + alpha * j / (S - 1))``, as R2D2 and SEED RL spread
Ape-X's per-actor epsilons: one actor with 8 envs explores like 8 actors.
Each row keeps its slot's epsilon (field ``epsilon``) for diagnostics.
Actors send the |TD| of their own network as initial priorities.
"""

from __future__ import annotations

import copy

import numpy as np
import torch

from aiorl.algos.apex_dqn_config import ApexDQNSettings
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
from aiorl.algos.lib.networks import (
    DEFAULT_MLP,
    GreedyPolicy,
    QNetwork,
    check_observation_space,
    discrete_actions,
    is_image,
)
from aiorl.algos.lib.numpy_forward import compile_numpy, probe_observations
from aiorl.algos.lib.optimizers import Adam
from aiorl.runtime.algorithm import Algorithm, LearnerResult

# --------------------------------------------------------------------------
# Logic: exploration, target, loss


def actor_epsilon(actor_index: int, num_actors: int, eps: float, alpha: float) -> float:
    """Ape-X per-actor epsilon ``eps^(1 + alpha * i / (N - 1))``; a single actor uses ``eps``."""
    if num_actors <= 1:
        return eps
    return eps ** (1 + alpha * actor_index / (num_actors - 1))


def slot_epsilons(actor_index: int, num_actors: int, num_envs: int, eps: float, alpha: float) -> np.ndarray:
    """The epsilons of actor `actor_index`'s envs: Ape-X's schedule over all S = actors x num_envs
    slots, slot ``actor_index * num_envs + e`` for env e."""
    slots = num_actors * num_envs
    first = actor_index * num_envs
    return np.array([actor_epsilon(first + e, slots, eps, alpha) for e in range(num_envs)])


def n_step_q_target(
    reward: torch.Tensor, discount: torch.Tensor, q_next_target: torch.Tensor, q_next_online: torch.Tensor | None
) -> torch.Tensor:
    """``R + discount * Q_target(s', a*)``: with `q_next_online` (double Q),
    ``a* = argmax_a Q_online(s', a)``; without it, ``a* = argmax_a Q_target(s', a)``.
    ``discount`` is gamma^m, and 0 after termination (no bootstrap)."""
    if q_next_online is None:
        bootstrap = q_next_target.max(dim=1).values
    else:
        best = q_next_online.argmax(dim=1, keepdim=True)
        bootstrap = q_next_target.gather(1, best).squeeze(1)
    return reward + discount * bootstrap


# --------------------------------------------------------------------------
# Acting


class DQNActor(NStepPolicy):
    def __init__(self, algo: ApexDQN, actor_index: int, num_actors: int, seed: int):
        m = algo.cfg.model
        super().__init__(m.n_step, m.gamma)
        setup_torch(m.torch_threads, seed)
        self.q = algo.q_network().eval()
        # Acting on CPU: a small MLP runs in numpy (torch's per-call cost dominates at a few rows).
        self.fast = compile_numpy(self.q, probe_observations(algo.env_spec.observation_space, seed=seed))
        self.num_actions = algo.num_actions
        self.epsilons = slot_epsilons(
            actor_index, num_actors, algo.cfg.env.num_envs, m.exploration_eps, m.exploration_alpha
        )
        self.rng = np.random.default_rng(seed)
        self.device = torch.device("cpu")

    def __repr__(self) -> str:
        spread = f"{self.epsilons.max():.4g}..{self.epsilons.min():.4g}"
        return f"<DQNActor epsilons={spread} weights_version={self.weights_version}>"

    def act(self, obs: np.ndarray) -> np.ndarray:
        """Epsilon-greedy per env slot (one epsilon broadcasts over any batch)."""
        if self.fast is not None:
            greedy = self.fast(obs).argmax(axis=1)
        else:
            with torch.inference_mode():
                greedy = self.q(as_tensor(obs, self.device)).argmax(dim=1).numpy()
        # One draw for both choices: whether to explore, and the uniform action if so.
        u = self.rng.random((2, len(obs)))
        random = (u[1] * self.num_actions).astype(np.int64)
        return np.where(u[0] < self.epsilons, random, greedy).astype(np.int64)

    def postprocess(self, rollout):
        # The n-step kernel gives each row the action of its window's first step:
        # riding beside the action, the env index comes out with the row, and so
        # does the epsilon that chose it.
        T, E = rollout["action"].shape
        tagged = np.stack([rollout["action"], np.broadcast_to(np.arange(E), (T, E))], axis=-1)
        batch = self.nstep.add(
            rollout["obs"], tagged, rollout["reward"], rollout["next_obs"], rollout["terminated"], rollout["truncated"]
        )
        return self._with_priorities(self._untag(batch))

    def flush(self):
        return self._with_priorities(self._untag(self.nstep.flush()))

    def _untag(self, batch: dict) -> dict:
        if batch:
            tagged = batch["action"]
            batch["action"] = np.ascontiguousarray(tagged[:, 0])
            batch["epsilon"] = self.epsilons[tagged[:, 1]].astype(np.float32)
        return batch

    @torch.no_grad()
    def priorities(self, batch):
        """|TD| with the actor's network standing in for both online and target."""
        q_all = self.q(as_tensor(batch["obs"], self.device))
        q = q_all.gather(1, as_tensor(batch["action"], self.device, torch.int64)[:, None]).squeeze(1)
        q_next = self.q(as_tensor(batch["next_obs"], self.device))
        y = n_step_q_target(
            as_tensor(batch["reward"], self.device), as_tensor(batch["discount"], self.device), q_next, q_next
        )
        return (y - q).abs().numpy().astype(np.float64)

    def set_weights(self, weights, version):
        load_numpy_state(self.q, weights, "q")
        if self.fast is not None:
            self.fast.refresh()
        self.weights_version = version


# --------------------------------------------------------------------------
# Learning


class DQNLearner(ApexLearner):
    checkpoint_items = {"model": "online", "target": "target", "optimizer": "optimizer"}

    def __init__(self, algo: ApexDQN, learner_index: int, num_learners: int, seed: int, rendezvous: str | None):
        super().__init__(algo, learner_index, num_learners, seed)
        self.online = algo.q_network().to(self.device)
        self.target = copy.deepcopy(self.online).requires_grad_(False)
        self.params = list(self.online.parameters())
        self.optimizer = Adam(self.params, lr=self.m.learning_rate, eps=self.m.adam_eps)
        self.join(self.params, [self.online], learner_index, num_learners, rendezvous)
        hard_update(self.target, self.online)

    def step(self, batch):
        if self.dp.stopped:
            return LearnerResult(stop=True)
        obs, next_obs, action, reward, discount, weights = self.tensors(batch, torch.int64)
        if self.m.double_q:  # one online pass over s_t and s_{t+m} together
            q_both = self.online(torch.cat([obs, next_obs]))
            q_all, q_next_online = q_both[: len(obs)], q_both[len(obs) :].detach()
        else:
            q_all, q_next_online = self.online(obs), None
        q_t = q_all.gather(1, action[:, None]).squeeze(1)
        with torch.no_grad():
            y = n_step_q_target(reward, discount, self.target(next_obs), q_next_online)
        td = y - q_t
        loss = td_loss(td, weights, self.m.loss, self.m.huber_delta)

        norms = self.apply([("loss", loss, self.params, self.optimizer)])
        if norms is None:
            return LearnerResult(stop=True)  # a peer's data ended: nothing applied
        if self.m.tau is not None:
            soft_update(self.target, self.online, self.m.tau)
        elif self.learner_steps % self.m.sync_target_frequency == 0:
            hard_update(self.target, self.online)

        priorities = td.detach().abs().cpu().numpy().astype(np.float64)
        metrics = {
            "losses/td_loss": float(loss.detach()),
            "losses/grad_norm": norms["loss"],
            "values/q_mean": float(q_t.detach().mean()),
            "values/td_abs_mean": float(priorities.mean()),
        }
        if "epsilon" in batch:  # which exploration the sampled rows came from
            metrics["values/sampled_epsilon_mean"] = float(np.mean(batch["epsilon"]))
        return LearnerResult(metrics, priorities)

    def get_weights(self):
        return state_to_numpy(self.online, "q")

    def acting_policy(self):
        return GreedyPolicy(copy.deepcopy(self.online).cpu()), self.algo.policy_meta(self.learner_steps)


# --------------------------------------------------------------------------
# Builder


class ApexDQN(ApexDQNSettings, Algorithm):
    def __init__(self, cfg, env_spec):
        super().__init__(cfg, env_spec)
        obs_space = env_spec.observation_space
        check_observation_space(obs_space, "env.id")
        self.num_actions = discrete_actions(env_spec, "apex_dqn", " (use apex_ddpg for Box actions)")
        spec = cfg.model.network or (["nature_cnn"] if is_image(obs_space) else DEFAULT_MLP)
        self.layers = parse_network(spec, "model.network")
        shapes_only(self.q_network)  # shape errors (a conv on vectors, a kernel too large) surface now

    def q_network(self) -> QNetwork:
        return QNetwork(self.env_spec.observation_space, self.num_actions, self.layers, self.cfg.model.dueling)

    def acting_module(self) -> GreedyPolicy:
        return GreedyPolicy(self.q_network())

    def transition_spec(self):
        space = self.env_spec.observation_space
        obs = (tuple(space.shape), np.dtype(space.dtype).str)
        return {
            "obs": obs,
            "action": ((), "<i8"),
            "reward": ((), "<f4"),
            "next_obs": obs,
            "done": ((), "|b1"),
            "discount": ((), "<f4"),
            "epsilon": ((), "<f4"),
        }

    def max_batch_rows(self):
        return nstep_batch_rows(self.cfg, self.cfg.model.n_step)

    def weights_spec(self):
        return weights_spec_of_module(shapes_only(self.q_network), "q")

    def policy_meta(self, learner_steps: int) -> dict:
        space = self.env_spec.observation_space
        return {
            "algo": self.name,
            "env_id": self.env_spec.id,
            "learner_steps": learner_steps,
            "observation_shape": list(space.shape),
            "observation_dtype": np.dtype(space.dtype).str,
            "action": {"kind": "discrete", "n": self.num_actions},
            "signature": "obs[B, *observation_shape] -> int64 actions[B]",
            "rebuild": self.policy_record(),
        }

    def make_actor(self, actor_index, num_actors, seed):
        return DQNActor(self, actor_index, num_actors, seed)

    def make_learner(self, learner_index, num_learners, seed, rendezvous=None):
        return DQNLearner(self, learner_index, num_learners, seed, rendezvous)


ALGORITHM = ApexDQN
