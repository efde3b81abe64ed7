"""R2D2 (Kapturowski et al. 2019): Ape-X's distributed prioritized replay for a recurrent Q network.

Reads top to bottom: the value rescaling, the network, the sequence loss, the acting policy,
the learner, the builder; its config (the model section and its checks) is
`aiorl.algos.r2d2_config`, which loads without torch.

Actors act epsilon-greedily, one fixed epsilon per env slot (as Ape-X DQN), keeping an LSTM
or GRU state per env that is zeroed at every episode start. The sequence adder
(`aiorl.replay.SequenceAdder`, compiled) cuts each env's stream into sequences of m steps
starting every m - overlap steps of an episode, each with the state the actor acted from at
its first step; a sequence never crosses an episode end (it is padded and masked), and is
``terminal`` only when its last step terminated. One sequence is one replay row; new rows
take the replay's running max priority (actors send none). In the frame layout
(`aiorl.replay.frames`, stacked pixel frames) a row's observations travel and are stored as
``(m + 1, k)`` frame ids, each frame once, the padding pointing at the last real observation.

The learner unrolls both networks over each sequence from its start state (the stored one,
or zeros with ``model.start_state: zero``). The first l steps (burn-in) only compute the
state, without gradient. On the remaining steps t < L (L: the sequence's real steps), with
k = min(n, L - t) and h the invertible value rescaling:

    y_t   = h( sum_{j<k} gamma^j r_{t+j} + d_t * h^-1( Q_target(o_{t+k}, argmax_a Q_online(o_{t+k}, a)) ) )
    d_t   = gamma^k, or 0 when t + k = L and the sequence is terminal (truncation bootstraps)
    loss  = mean_i w_i * mean_{t valid} l(y_t - Q_online(o_t, a_t))

with importance weights w_i and l squared (or Huber). The new priority of a sequence is
``eta * max_t |delta_t| + (1 - eta) * mean_t |delta_t|`` over its trained steps (0 when it
has none: an episode end inside the burn-in). The target network is a copy of the online
one, refreshed every ``sync_target_frequency`` learner steps.
"""

from __future__ import annotations

import copy

import numpy as np
import torch
from torch import nn

from aiorl.algos.apex_dqn import slot_epsilons
from aiorl.algos.lib.actor_critic import EnvStates, RecurrentCore, policy_meta
from aiorl.algos.lib.checks import check_recurrent
from aiorl.algos.lib.common import (
    ApexLearner,
    as_tensor,
    hard_update,
    load_numpy_state,
    setup_torch,
    shapes_only,
    state_to_numpy,
    weights_spec_of_module,
)
from aiorl.algos.lib.layers import parse_network
from aiorl.algos.lib.networks import DuelingHead, Torso, check_observation_space, discrete_actions, is_image
from aiorl.algos.lib.optimizers import Adam
from aiorl.algos.r2d2_config import R2D2Settings, sequence_overlap
from aiorl.replay import SequenceAdder
from aiorl.replay.frames import frame_layout
from aiorl.runtime.algorithm import ActorPolicy, Algorithm, LearnerResult

# --------------------------------------------------------------------------
# Logic: value rescaling


def h(x: torch.Tensor, eps: float) -> torch.Tensor:
    """h(x) = sign(x) (sqrt(|x| + 1) - 1) + eps x: squashes returns so one network fits their range."""
    return torch.sign(x) * (torch.sqrt(x.abs() + 1.0) - 1.0) + eps * x


def h_inverse(x: torch.Tensor, eps: float) -> torch.Tensor:
    """h^-1(x) = sign(x) (((sqrt(1 + 4 eps (|x| + 1 + eps)) - 1) / (2 eps))^2 - 1)."""
    root = (torch.sqrt(1.0 + 4.0 * eps * (x.abs() + 1.0 + eps)) - 1.0) / (2.0 * eps)
    return torch.sign(x) * (root.pow(2) - 1.0)


def sequence_priority(td_abs: torch.Tensor, valid: torch.Tensor, eta: float) -> torch.Tensor:
    """``eta * max + (1 - eta) * mean`` of |delta| over each row's valid steps ([B, T] -> [B]); 0 with none."""
    count = valid.sum(dim=1)
    masked = torch.where(valid, td_abs, torch.zeros_like(td_abs))
    mean = masked.sum(dim=1) / count.clamp(min=1)
    return eta * masked.max(dim=1).values + (1.0 - eta) * mean


# --------------------------------------------------------------------------
# Network


class RecurrentQNetwork(nn.Module):
    """Torso -> LSTM / GRU core (`RecurrentCore`; none for the feed-forward baseline) -> dueling
    or linear head. The state travels as one flat float32 vector per row (``state_size`` wide,
    0 without a core)."""

    def __init__(self, obs_space, num_actions: int, layers, recurrent: tuple[str, int] | None, dueling: bool):
        super().__init__()
        self.torso = Torso(obs_space, layers)
        features = self.torso.features
        self.recurrent = recurrent
        self.core = None if recurrent is None else RecurrentCore(recurrent[0], features, recurrent[1])
        if self.core is not None:
            features = self.core.features
        self.state_size = 0 if self.core is None else self.core.state_size
        self.head = DuelingHead(features, num_actions) if dueling else nn.Linear(features, num_actions)

    def initial_state(self, rows: int) -> np.ndarray:
        """The state at an episode's start: zeros, float32 [rows, state_size]."""
        return np.zeros((rows, self.state_size), np.float32)

    def step(self, obs: torch.Tensor, state: torch.Tensor):
        """(Q [B, A], None, features, next state) of one step: `EnvStates`'s contract."""
        x = self.torso(obs)
        if self.core is not None:
            x, state = self.core(x, state)
        return self.head(x), None, x, state

    def _features(self, obs: torch.Tensor, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        B, T = obs.shape[:2]
        x = self.torso(obs.reshape((B * T,) + obs.shape[2:])).reshape(B, T, -1)
        if self.core is None:
            return x, state
        # Sequences never cross an episode's start (they end padded), so the core runs them
        # through in one go; the torso and the head see every step at once.
        return self.core.sequence(x, state)

    def advance(self, obs: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        """The state after the steps ``obs [B, T, ...]`` from `state` (no head: the burn-in)."""
        if obs.shape[1] == 0 or self.core is None:
            return state
        return self._features(obs, state)[1]

    def unroll(self, obs: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        """Q ``[B, T, A]`` of the steps ``obs [B, T, ...]`` from `state`."""
        x, _ = self._features(obs, state)
        B, T = x.shape[:2]
        return self.head(x.reshape(B * T, -1)).reshape(B, T, -1)


class GreedySequencePolicy(nn.Module):
    """Exported policy: ``(obs [B, ...], state float32 [B, state_size]) -> (int64 argmax_a Q, next
    state)``; without a core, ``obs -> actions`` as Ape-X DQN's."""

    def __init__(self, q: RecurrentQNetwork):
        super().__init__()
        self.q = q
        self.state_size = q.state_size

    def forward(self, obs: torch.Tensor, state: torch.Tensor | None = None):
        if self.q.core is None:
            return self.q.head(self.q.torso(obs)).argmax(dim=1)
        q, _, _, state = self.q.step(obs, state)
        return q.argmax(dim=1), state


# --------------------------------------------------------------------------
# Logic: the loss over a batch of sequences


def sequence_td(
    q_online: torch.Tensor,
    q_target: torch.Tensor,
    action: torch.Tensor,
    reward: torch.Tensor,
    mask: torch.Tensor,
    terminal: torch.Tensor,
    n: int,
    gamma: float,
    rescale_eps: float | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(delta [B, T], valid [B, T]) of the trained steps of a batch of sequences after burn-in.

    q_online, q_target: ``[B, T + 1, A]``, Q of the T trained steps and of the observation after
    the last; action, reward, mask: ``[B, T]``; terminal ``[B]``. Targets as in the module
    docstring (`rescale_eps` None: no rescaling); the target carries no gradient.
    """
    B, T = reward.shape
    valid = mask
    length = mask.sum(dim=1, keepdim=True)  # real steps in this part, a prefix
    t = torch.arange(T, device=reward.device).expand(B, T)
    k = (length - t).clamp(min=0, max=n)  # steps in each target's window
    boot = t + k
    padded = torch.cat([reward, reward.new_zeros(B, n)], dim=1)
    ret = torch.zeros_like(reward)
    for j in range(n):  # rewards past the end are zero padding
        ret = ret + (gamma**j) * torch.where(j < k, padded[:, j : j + T], torch.zeros_like(reward))
    ends_episode = (boot == length) & terminal[:, None]
    discount = torch.where(ends_episode, torch.zeros_like(reward), torch.pow(gamma, k.to(reward.dtype)))
    with torch.no_grad():
        index = boot[..., None].expand(B, T, q_online.shape[2])
        best = q_online.detach().gather(1, index).argmax(dim=2, keepdim=True)
        bootstrap = q_target.gather(1, index).gather(2, best).squeeze(2)
        if rescale_eps is None:
            y = ret + discount * bootstrap
        else:
            y = h(ret + discount * h_inverse(bootstrap, rescale_eps), rescale_eps)
    q_taken = q_online[:, :T].gather(2, action[..., None]).squeeze(2)
    delta = torch.where(valid, y - q_taken, torch.zeros_like(q_taken))
    return delta, valid


def masked_loss(delta: torch.Tensor, valid: torch.Tensor, weights: torch.Tensor, kind: str, huber_delta: float):
    """``mean_i w_i * mean_{t valid} l(delta_it)``: each sequence counts once whatever its length."""
    if kind == "huber":
        per_step = nn.functional.huber_loss(delta, torch.zeros_like(delta), reduction="none", delta=huber_delta)
    else:
        per_step = 0.5 * delta.pow(2)
    per_step = torch.where(valid, per_step, torch.zeros_like(per_step))
    per_row = per_step.sum(dim=1) / valid.sum(dim=1).clamp(min=1)
    return (weights * per_row).mean()


# --------------------------------------------------------------------------
# Acting


def pad_with_last_observation(obs: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """``obs [n, m + 1, ...]`` with every step after each row's last real observation (index
    L = its mask's count) replaced by that observation.

    In the frame layout the adder's zero padding would be frame id 0, which the memory has long
    released (it refuses the row); the padded steps are masked and, the core being causal, never
    reach a trained step's Q, so any real observation serves.
    """
    last = mask.sum(axis=1)
    steps = np.minimum(np.arange(obs.shape[1]), last[:, None])
    return np.take_along_axis(obs, steps.reshape(steps.shape + (1,) * (obs.ndim - 2)), axis=1)


class R2D2Actor(ActorPolicy):
    def __init__(self, algo: R2D2, actor_index: int, num_actors: int, seed: int):
        m = algo.cfg.model
        setup_torch(m.torch_threads, seed)
        self.q = algo.q_network().eval()
        self.states = EnvStates(self.q)
        self.recurrent = self.q.core is not None
        self.num_actions = algo.num_actions
        self.epsilons = slot_epsilons(
            actor_index, num_actors, algo.cfg.env.num_envs, m.exploration_eps, m.exploration_alpha
        )
        self.rng = np.random.default_rng(seed)
        self.adder = SequenceAdder(m.sequence_length, sequence_overlap(m))
        self.frame_refs = frame_layout(algo.cfg, algo) is not None  # obs arrive as frame ids
        self.acted_from: list[np.ndarray] = []  # per step of the rollout, each env's state before it

    def __repr__(self) -> str:
        spread = f"{self.epsilons.max():.4g}..{self.epsilons.min():.4g}"
        return f"<R2D2Actor epsilons={spread} held={self.adder.held.tolist()} weights_version={self.weights_version}>"

    def begin_episodes(self, started: np.ndarray) -> None:
        self.states.reset(started)

    def act(self, obs: np.ndarray) -> np.ndarray:
        q, _, _, before = self.states.step(obs)
        self.acted_from.append(before)
        u = self.rng.random((2, len(obs)))
        random = (u[1] * self.num_actions).astype(np.int64)
        return np.where(u[0] < self.epsilons, random, q.argmax(axis=1)).astype(np.int64)

    def postprocess(self, rollout):
        T = rollout["reward"].shape[0]
        if len(self.acted_from) != T:
            raise RuntimeError(f"R2D2Actor: {len(self.acted_from)} acted steps for a rollout of {T}")
        states = np.stack(self.acted_from)
        self.acted_from = []
        batch = self.adder.add(
            rollout["obs"],
            rollout["action"],
            rollout["reward"],
            rollout["next_obs"],
            rollout["terminated"],
            rollout["truncated"],
            states,
        )
        return self._rows(batch), None

    def flush(self):
        return self._rows(self.adder.flush()), None

    def _rows(self, batch: dict) -> dict:
        if not batch or len(batch["env"]) == 0:
            return {}
        batch["epsilon"] = self.epsilons[batch.pop("env")].astype(np.float32)
        if self.frame_refs:
            batch["obs"] = pad_with_last_observation(batch["obs"], batch["mask"])
        if not self.recurrent:
            del batch["state"]
        return batch

    def set_weights(self, weights, version):
        load_numpy_state(self.q, weights, "q")
        self.weights_version = version


# --------------------------------------------------------------------------
# Learning


class R2D2Learner(ApexLearner):
    checkpoint_items = {"model": "online", "target": "target", "optimizer": "optimizer"}

    def __init__(self, algo: R2D2, learner_index: int, num_learners: int, seed: int, rendezvous: str | None):
        super().__init__(algo, learner_index, num_learners, seed)
        self.online = algo.q_network().to(self.device)
        self.target = copy.deepcopy(self.online).requires_grad_(False)
        self.params = list(self.online.parameters())
        self.optimizer = Adam(self.params, lr=self.m.learning_rate, eps=self.m.adam_eps)
        self.join(self.params, [self.online], learner_index, num_learners, rendezvous)
        hard_update(self.target, self.online)

    def start_state(self, batch, rows: int) -> torch.Tensor:
        if self.m.start_state == "stored" and "state" in batch:
            return as_tensor(batch["state"], self.device, torch.float32)
        return torch.zeros(rows, self.online.state_size, device=self.device)

    def losses(self, batch):
        """(loss, delta [B, T], valid [B, T], Q of the taken actions) of a batch of sequences."""
        m, dev, burn = self.m, self.device, self.m.burn_in
        obs = as_tensor(batch["obs"], dev)
        action = as_tensor(batch["action"], dev, torch.int64)
        reward = as_tensor(batch["reward"], dev, torch.float32)
        mask = as_tensor(batch["mask"], dev, torch.bool)
        terminal = as_tensor(batch["terminal"], dev, torch.bool)
        weights = as_tensor(batch["weights"], dev, torch.float32) if "weights" in batch else torch.ones(len(obs))
        state = self.start_state(batch, len(obs))
        with torch.no_grad():  # burn-in: the state only, for both networks
            online_state = self.online.advance(obs[:, :burn], state)
            target_state = self.target.advance(obs[:, :burn], state)
            q_target = self.target.unroll(obs[:, burn:], target_state)
        q_online = self.online.unroll(obs[:, burn:], online_state)
        eps = m.value_rescaling_eps if m.value_rescaling else None
        delta, valid = sequence_td(
            q_online,
            q_target,
            action[:, burn:],
            reward[:, burn:],
            mask[:, burn:],
            terminal,
            m.n_step,
            m.gamma,
            eps,
        )
        loss = masked_loss(delta, valid, weights.to(dev), m.loss, m.huber_delta)
        return loss, delta, valid, q_online

    def step(self, batch):
        if self.dp.stopped:
            return LearnerResult(stop=True)
        loss, delta, valid, q_online = self.losses(batch)
        norms = self.apply([("loss", loss, self.params, self.optimizer)])
        if norms is None:
            return LearnerResult(stop=True)  # a peer's data ended: nothing applied
        if self.learner_steps % self.m.sync_target_frequency == 0:
            hard_update(self.target, self.online)
        td_abs = delta.detach().abs()
        priorities = sequence_priority(td_abs, valid, self.m.priority_eta).cpu().numpy().astype(np.float64)
        trained = int(valid.sum())
        metrics = {
            "losses/td_loss": float(loss.detach()),
            "losses/grad_norm": norms["loss"],
            "values/q_max_mean": float(q_online.detach().max(dim=2).values.mean()),
            "values/td_abs_mean": float(td_abs.sum() / max(trained, 1)),
            "values/trained_steps_per_sequence": trained / len(priorities),
        }
        if "epsilon" in batch:
            metrics["values/sampled_epsilon_mean"] = float(np.mean(batch["epsilon"]))
        return LearnerResult(metrics, priorities)

    def get_weights(self):
        return state_to_numpy(self.online, "q")

    def acting_policy(self):
        return GreedySequencePolicy(copy.deepcopy(self.online).cpu()), self.algo.policy_meta(self.learner_steps)


# --------------------------------------------------------------------------
# Builder


class R2D2(R2D2Settings, Algorithm):
    def __init__(self, cfg, env_spec):
        super().__init__(cfg, env_spec)
        obs_space = env_spec.observation_space
        check_observation_space(obs_space, "env.id")
        self.num_actions = discrete_actions(env_spec, "r2d2")
        network = cfg.model.network or (["nature_cnn"] if is_image(obs_space) else ["linear:256", "relu"])
        self.layers = parse_network(network, "model.network")
        self.recurrent = check_recurrent(cfg.model.recurrent)
        self.state_size = shapes_only(self.q_network).state_size

    def q_network(self) -> RecurrentQNetwork:
        m = self.cfg.model
        return RecurrentQNetwork(
            self.env_spec.observation_space, self.num_actions, self.layers, self.recurrent, m.dueling
        )

    def acting_module(self) -> GreedySequencePolicy:
        return GreedySequencePolicy(self.q_network())

    def lookback_steps(self) -> int:
        return self.cfg.model.sequence_length - 1

    def transition_spec(self):
        """One row per sequence of m steps (see the module docstring of `aiorl._ext.sequence`).
        Each (step, env) closes at most one sequence, so the default `max_batch_rows` (one
        rollout's steps x envs) bounds a batch."""
        m = self.cfg.model.sequence_length
        space = self.env_spec.observation_space
        spec = {
            "obs": ((m + 1, *space.shape), np.dtype(space.dtype).str),
            "action": ((m,), "<i8"),
            "reward": ((m,), "<f4"),
            "mask": ((m,), "|b1"),
            "terminal": ((), "|b1"),
            "epsilon": ((), "<f4"),
        }
        if self.state_size:
            spec["state"] = ((self.state_size,), "<f4")
        return spec

    def weights_spec(self):
        return weights_spec_of_module(shapes_only(self.q_network), "q")

    def policy_meta(self, learner_steps: int) -> dict:
        recurrent = None
        if self.recurrent is not None:
            kind, hidden = self.recurrent
            recurrent = {"type": kind, "hidden": hidden, "state_size": self.state_size}
        return policy_meta(self.name, self.env_spec, learner_steps, recurrent=recurrent, rebuild=self.policy_record())

    def make_actor(self, actor_index, num_actors, seed):
        return R2D2Actor(self, actor_index, num_actors, seed)

    def make_learner(self, learner_index, num_learners, seed, rendezvous=None):
        return R2D2Learner(self, learner_index, num_learners, seed, rendezvous)


ALGORITHM = R2D2
