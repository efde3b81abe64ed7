"""Evolution strategies (Salimans et al. 2017, "Evolution Strategies as a
Scalable Alternative to Reinforcement Learning") on the coordinator's work items.

Reads top to bottom: the noise table, fitness shaping and the update, the
numpy policy, the acting side, the learner, the builder; its config (the model
section and its checks) is `aiorl.algos.es_config`, which loads without torch.

Iteration k, parameters theta_k (weights version k):

- the coordinator hands out work items 0..population-1; an actor taking item
  i draws its noise index j_i and env seed from (run.seed, k, i), so that
  eps_i = noise[j_i : j_i + dim] (the table is generated from
  ``model.noise_seed`` identically in every process: nothing large travels),
  and runs one episode each with theta + sigma * eps_i and theta - sigma * eps_i
  (antithetic; both from the same env seed). It sends only (j_i, the two
  returns, the two lengths, its observation moments). Which actor took an
  item changes nothing: a run is reproducible whatever the timing;
- learner 0 shapes the 2N returns by centered ranks u in [-0.5, 0.5] (ties
  share their mean rank) and estimates the ascent direction

      g = 1 / (2N) * sum_i (u_i+ - u_i-) * eps_i,

  then takes an Adam step on ``-g + weight_decay * theta`` and publishes
  theta_{k+1} with the merged observation-normalization statistics.

The policy is deterministic: argmax for Discrete actions, the mean clipped to
the bounds for Box actions (the same `DeterministicPolicy` that is exported).
Actors run it in numpy (an MLP of the ``model.network`` layers), a few times
faster than torch for one observation at a time.
"""

from __future__ import annotations

import copy
import hashlib
import logging

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from aiorl.algos.es_config import ESSettings, layers_of
from aiorl.algos.lib.actor_critic import (
    ActorCritic,
    DeterministicPolicy,
    check_action_space,
    obs_norm_size,
    policy_meta,
)
from aiorl.algos.lib.common import setup_torch, shapes_only
from aiorl.algos.lib.layers import NUMPY_ACTIVATIONS, parse_network
from aiorl.algos.lib.networks import OneHot, check_observation_space
from aiorl.config import ConfigError
from aiorl.envs import make_env
from aiorl.runtime.algorithm import ActorPolicy, Algorithm, LearnerCore, LearnerResult, WorkResult

# --------------------------------------------------------------------------
# Logic: the noise table, fitness shaping, the update


log = logging.getLogger(__name__)

#: Tables drawn for the warm spawner before it forks the roles (`ES.prefork`), by `noise_key`:
#: every role, the evaluation worker and each restart then shares one copy of its pages instead of
#: drawing its own (32 MB and 80 ms each at the default size, all roles at once on the way to the
#: first iteration).
_PREFORKED: dict[str, np.ndarray] = {}


def noise_key(seed: int, size: int) -> str:
    return f"noise_table/{seed}/{size}"


def draw_noise(seed: int, size: int) -> np.ndarray:
    noise = np.random.default_rng(seed).standard_normal(size, dtype=np.float32)
    noise.flags.writeable = False  # shared between processes copy-on-write: a write would unshare it
    return noise


class NoiseTable:
    """``size`` float32 N(0, 1) draws from ``numpy.random.default_rng(seed)`` (PCG64: the same on
    every platform and process), read-only."""

    def __init__(self, seed: int, size: int):
        self.seed, self.size = seed, size
        preforked = _PREFORKED.get(noise_key(seed, size))
        self.shared = preforked is not None
        self.noise = draw_noise(seed, size) if preforked is None else preforked

    def __repr__(self) -> str:
        return f"<NoiseTable seed={self.seed} size={self.size}>"

    def get(self, index: int, dim: int) -> np.ndarray:
        return self.noise[index : index + dim]

    def index_for(self, dim: int, *key: int) -> int:
        """A start index for `dim` entries, drawn from `key` (the same key, the same index)."""
        return int(np.random.default_rng(list(key)).integers(0, self.size - dim + 1))

    def digest(self) -> str:
        return hashlib.sha256(self.noise.tobytes()).hexdigest()


def centered_ranks(x: np.ndarray) -> np.ndarray:
    """Ranks of every entry of `x` scaled to [-0.5, 0.5]; tied entries share their mean rank."""
    flat = np.asarray(x, np.float64).ravel()
    if flat.size < 2:
        return np.zeros(np.shape(x), np.float64)
    values, inverse, counts = np.unique(flat, return_inverse=True, return_counts=True)
    first = np.concatenate([[0], np.cumsum(counts)[:-1]])
    mean_rank = first + (counts - 1) / 2.0
    return (mean_rank[inverse] / (flat.size - 1) - 0.5).reshape(np.shape(x))


def es_gradient(noise: NoiseTable, indices: np.ndarray, returns: np.ndarray, dim: int) -> np.ndarray:
    """``1/(2N) sum_i (u_i+ - u_i-) eps_i`` with u the centered ranks of the [N, 2] returns."""
    ranks = centered_ranks(returns)
    weights = ranks[:, 0] - ranks[:, 1]
    g = np.zeros(dim, np.float64)
    for w, j in zip(weights, indices):
        if w:
            g += w * noise.get(int(j), dim)
    return g / returns.size


class Adam:
    """Adam on a flat numpy vector (Kingma & Ba 2015); `step` returns theta minus the update."""

    def __init__(self, dim: int, lr: float, eps: float, beta1: float = 0.9, beta2: float = 0.999):
        self.lr, self.eps, self.beta1, self.beta2 = lr, eps, beta1, beta2
        self.m = np.zeros(dim, np.float64)
        self.v = np.zeros(dim, np.float64)
        self.t = 0

    def step(self, theta: np.ndarray, gradient: np.ndarray) -> np.ndarray:
        self.t += 1
        self.m = self.beta1 * self.m + (1 - self.beta1) * gradient
        self.v = self.beta2 * self.v + (1 - self.beta2) * gradient * gradient
        step = self.lr * np.sqrt(1 - self.beta2**self.t) / (1 - self.beta1**self.t)
        return theta - step * self.m / (np.sqrt(self.v) + self.eps)

    def state_dict(self) -> dict:
        return {"m": torch.from_numpy(self.m.copy()), "v": torch.from_numpy(self.v.copy()), "t": self.t}

    def load_state_dict(self, state: dict) -> None:
        self.m, self.v = np.asarray(state["m"], np.float64), np.asarray(state["v"], np.float64)
        self.t = int(state["t"])


# --------------------------------------------------------------------------
# The policy in numpy


def trainable(net: ActorCritic) -> list[nn.Parameter]:
    return [p for p in net.parameters() if p.requires_grad]


def get_flat(net: ActorCritic) -> np.ndarray:
    return torch.nn.utils.parameters_to_vector(trainable(net)).detach().numpy().astype(np.float32)


def set_flat(net: ActorCritic, theta: np.ndarray) -> None:
    torch.nn.utils.vector_to_parameters(torch.as_tensor(np.asarray(theta, np.float32)), trainable(net))


class NumpyPolicy:
    """`DeterministicPolicy` of an `ActorCritic` MLP, evaluated in numpy from a flat
    parameter vector (the order of ``trainable(net)``)."""

    def __init__(self, net: ActorCritic):
        self.ops: list[tuple] = []  # ("onehot", n) | ("linear", w_slice, w_shape, b_slice) | (activation,)
        offset = 0
        modules = [*net.pi_torso.net.modules()][1:] + [*net.head.modules()]
        for module in modules:
            if isinstance(module, OneHot):
                self.ops.append(("onehot", module.n))
            elif isinstance(module, nn.Linear):
                w = module.weight.numel()
                self.ops.append(
                    (
                        "linear",
                        slice(offset, offset + w),
                        tuple(module.weight.shape),
                        slice(offset + w, offset + w + module.bias.numel()),
                    )
                )
                offset += w + module.bias.numel()
            elif type(module).__name__.lower() in NUMPY_ACTIVATIONS:
                self.ops.append((type(module).__name__.lower(),))
        self.dim = offset
        head = net.head
        self.discrete = not hasattr(head, "log_std")
        if not self.discrete:
            self.low, self.high = head.low.numpy().astype(np.float64), head.high.numpy().astype(np.float64)
        norm = net.normalizer
        self.normalize, self.clip = norm.enabled, norm.clip
        self.theta = np.zeros(self.dim, np.float32)
        self.layers: list = []
        self.set_normalizer(norm.shift.numpy(), norm.scale.numpy())

    def set_normalizer(self, shift: np.ndarray, scale: np.ndarray) -> None:
        self.shift, self.scale = np.asarray(shift, np.float64), np.asarray(scale, np.float64)

    def set_theta(self, theta: np.ndarray) -> None:
        theta = np.asarray(theta, np.float64)
        self.layers = []
        for op in self.ops:
            if op[0] == "linear":
                self.layers.append(("linear", theta[op[1]].reshape(op[2]).T.copy(), theta[op[3]].copy()))
            else:
                self.layers.append(op)

    def __call__(self, obs: np.ndarray):
        x = np.asarray(obs, np.float64)
        if self.normalize:
            x = np.clip((x - self.shift) * self.scale, -self.clip, self.clip)
        for op in self.layers:
            kind = op[0]
            if kind == "linear":
                x = x @ op[1] + op[2]
            elif kind == "onehot":
                x = np.eye(op[1])[int(x)]
            else:
                x = NUMPY_ACTIVATIONS[kind](x)
        if self.discrete:
            return int(np.argmax(x))
        return np.clip(x, self.low, self.high)


# --------------------------------------------------------------------------
# Acting


def episode_seed(run_seed: int, iteration: int, item: int) -> int:
    """One env seed per (iteration, item): both perturbations of a pair see the same episode."""
    return int(np.random.SeedSequence([run_seed, iteration, item]).generate_state(1)[0] & 0x7FFFFFFF)


NOISE_KEY = 1  # keeps noise indices apart from episode seeds drawn from the same (seed, iteration, item)


class ESActor(ActorPolicy):
    def __init__(self, algo: ES, actor_index: int, seed: int):
        self.algo = algo
        self.m = algo.cfg.model
        self.noise = algo.noise_table()
        self.policy = NumpyPolicy(algo.network())
        self.env = make_env(algo.cfg.env)
        self.action_shape = algo.env_spec.action_space.shape
        self.obs_dim = algo.stats_dim
        self.theta: np.ndarray | None = None

    def __repr__(self) -> str:
        return f"<ESActor weights_version={self.weights_version} dim={self.policy.dim}>"

    def set_weights(self, weights, version):
        self.theta = np.asarray(weights["theta"], np.float32)
        self.policy.set_normalizer(weights["normalizer.shift"], weights["normalizer.scale"])
        self.weights_version = version

    def _episode(self, theta: np.ndarray, seed: int, stats: list[np.ndarray]) -> tuple[float, int]:
        self.policy.set_theta(theta)
        obs, _ = self.env.reset(seed=seed)
        total, length, done = 0.0, 0, False
        record = self.policy.normalize
        while not done:
            if record:
                x = np.asarray(obs, np.float64)
                stats[0] += x
                stats[1] += x * x
            action = self.policy(obs)
            if not self.policy.discrete:
                action = action.reshape(self.action_shape).astype(self.env.action_space.dtype)
            obs, reward, terminated, truncated, _ = self.env.step(action)
            total += float(reward)
            length += 1
            done = terminated or truncated or length >= self.m.episode_step_cap
        return total, length

    def run_work(self, iteration, item):
        dim = self.policy.dim
        run_seed = self.algo.cfg.run.seed
        index = self.noise.index_for(dim, run_seed, iteration, item, NOISE_KEY)
        eps = self.noise.get(index, dim)
        seed = episode_seed(run_seed, iteration, item)
        stats = [np.zeros(self.obs_dim), np.zeros(self.obs_dim)]
        r_pos, l_pos = self._episode(self.theta + self.m.sigma * eps, seed, stats)
        r_neg, l_neg = self._episode(self.theta - self.m.sigma * eps, seed, stats)
        counted = float(l_pos + l_neg) if self.policy.normalize else 0.0
        batch = {
            "noise_index": np.array([index], np.int64),
            "returns": np.array([[r_pos, r_neg]]),
            "lengths": np.array([[l_pos, l_neg]], np.int64),
            "obs_count": np.array([counted]),
            "obs_sum": stats[0][None],
            "obs_sumsq": stats[1][None],
        }
        return WorkResult(batch, l_pos + l_neg, [r_pos, r_neg], [l_pos, l_neg])


# --------------------------------------------------------------------------
# Learning


class ESLearner(LearnerCore):
    def __init__(self, algo: ES, seed: int):
        self.algo = algo
        self.m = algo.cfg.model
        setup_torch(self.m.torch_threads, seed, algo.cfg.run.deterministic)
        self.net = algo.network()
        self.theta = get_flat(self.net).astype(np.float64)
        self.noise = algo.noise_table()
        self.adam = Adam(len(self.theta), self.m.learning_rate, self.m.adam_eps)
        self.iterations = 0
        self.env_steps_trained = 0

    def __repr__(self) -> str:
        return f"<ESLearner iterations={self.iterations} dim={len(self.theta)}>"

    def step(self, batch):
        returns = np.asarray(batch["returns"], np.float64)
        g = es_gradient(self.noise, batch["noise_index"], returns, len(self.theta))
        old = self.theta
        self.theta = self.adam.step(self.theta, -g + self.m.weight_decay * self.theta)
        self.net.normalizer.update(
            float(np.sum(batch["obs_count"])), np.sum(batch["obs_sum"], axis=0), np.sum(batch["obs_sumsq"], axis=0)
        )
        self.iterations += 1
        self.env_steps_trained += int(np.sum(batch["lengths"]))
        return LearnerResult(
            {
                "es/return_mean": float(returns.mean()),
                "es/return_max": float(returns.max()),
                "es/return_min": float(returns.min()),
                "es/pairs": float(len(returns)),
                "es/grad_norm": float(np.linalg.norm(g)),
                "es/theta_norm": float(np.linalg.norm(self.theta)),
                "es/update_ratio": float(np.linalg.norm(self.theta - old) / (np.linalg.norm(old) + 1e-12)),
            }
        )

    def _synced_net(self) -> ActorCritic:
        set_flat(self.net, self.theta)
        return self.net

    def get_weights(self):
        norm = self.net.normalizer
        return {
            "theta": self.theta.astype(np.float32),
            "normalizer.shift": norm.shift.numpy().copy(),
            "normalizer.scale": norm.scale.numpy().copy(),
        }

    def state_dict(self):
        return {
            "algo": self.algo.name,
            "theta": torch.from_numpy(self.theta.copy()),
            "adam": self.adam.state_dict(),
            "normalizer": self.net.normalizer.state_dict(),
            "iterations": self.iterations,
            "env_steps_trained": self.env_steps_trained,
        }

    def load_state_dict(self, state):
        if state.get("algo") != self.algo.name:
            raise ValueError(f"a {state.get('algo')!r} checkpoint cannot restore a {self.algo.name!r} learner")
        self.theta = np.asarray(state["theta"], np.float64)
        self.adam.load_state_dict(state["adam"])
        self.net.normalizer.load_state_dict(state["normalizer"])
        self.iterations = int(state["iterations"])
        self.env_steps_trained = int(state["env_steps_trained"])

    def acting_policy(self):
        policy = DeterministicPolicy(copy.deepcopy(self._synced_net()))
        return policy, policy_meta(
            self.algo.name,
            self.algo.env_spec,
            self.iterations,
            env_steps_trained=self.env_steps_trained,
            rebuild=self.algo.policy_record(),
        )


# --------------------------------------------------------------------------
# Builder


class ES(ESSettings, Algorithm):
    @classmethod
    def prefork(cls, cfg) -> dict[str, np.ndarray]:
        m = cfg.model
        return {noise_key(m.noise_seed, m.noise_table_size): draw_noise(m.noise_seed, m.noise_table_size)}

    @classmethod
    def adopt_prefork(cls, arrays: dict[str, np.ndarray]) -> None:
        _PREFORKED.update((key, table) for key, table in arrays.items() if key.startswith("noise_table/"))

    def __init__(self, cfg, env_spec):
        super().__init__(cfg, env_spec)
        m = cfg.model
        obs_space = env_spec.observation_space
        check_observation_space(obs_space, "env.id")
        if not (isinstance(obs_space, gym.spaces.Discrete) or len(obs_space.shape) == 1):
            raise ConfigError(f"env.id: es supports vector (1-D Box) and Discrete observations, got {obs_space}")
        check_action_space(env_spec.action_space, self.name)
        self.obs_norm = obs_norm_size(obs_space, "model.obs_norm") if m.obs_norm else 0
        self.stats_dim = max(self.obs_norm, 1)
        self.layers = parse_network(layers_of(m), "model.network")
        self.dim = dim = sum(p.numel() for p in trainable(shapes_only(self.network)))
        if m.noise_table_size < dim:
            raise ConfigError(
                f"model.noise_table_size ({m.noise_table_size}) must be at least the policy's parameter count ({dim})"
            )

    def network(self) -> ActorCritic:
        return ActorCritic(
            self.env_spec.observation_space,
            self.env_spec.action_space,
            self.layers,
            critic=False,
            obs_norm=self.obs_norm,
            obs_norm_clip=self.cfg.model.obs_norm_clip,
            obs_norm_std_floor=self.cfg.model.obs_norm_std_floor,
            learn_std=False,
        )

    def acting_module(self) -> DeterministicPolicy:
        return DeterministicPolicy(self.network())

    def noise_table(self) -> NoiseTable:
        table = NoiseTable(self.cfg.model.noise_seed, self.cfg.model.noise_table_size)
        where = "shared with the warm spawner" if table.shared else "drawn in this process"
        log.info("noise table of %d entries: %s", table.size, where)
        return table

    def max_batch_rows(self):
        return 1  # one row per work item

    def weights_spec(self):
        dim = self.dim
        norm = max(self.obs_norm, 1)
        return {"theta": ((dim,), "<f4"), "normalizer.shift": ((norm,), "<f4"), "normalizer.scale": ((norm,), "<f4")}

    def transition_spec(self):
        d = self.stats_dim
        return {
            "noise_index": ((), "<i8"),
            "returns": ((2,), "<f8"),
            "lengths": ((2,), "<i8"),
            "obs_count": ((), "<f8"),
            "obs_sum": ((d,), "<f8"),
            "obs_sumsq": ((d,), "<f8"),
        }

    def value_bounds(self):
        # A perturbation is dim entries from its index: one nearer the end is a shorter slice,
        # which numpy broadcasts over every parameter without a word.
        return {**super().value_bounds(), "noise_index": (0, self.cfg.model.noise_table_size - self.dim)}

    def make_actor(self, actor_index, num_actors, seed):
        return ESActor(self, actor_index, seed)

    def make_learner(self, learner_index, num_learners, seed, rendezvous=None):
        return ESLearner(self, seed)


ALGORITHM = ES
