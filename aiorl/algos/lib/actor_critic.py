"""Actor-critic networks and policy distributions for the on-policy algorithms
(DPPO, ES, and IMPALA to come), built from the same ``model.network`` layer
lists as Ape-X (see `aiorl/algos/lib/networks.py`).

- `ObsNormalizer`: running mean / variance of vector observations, merged
  from batch statistics (Chan et al.'s parallel update), applied as
  ``clip((obs - mean) / sqrt(var + eps), -c, c)``. Its statistics are
  buffers, so they travel with the weights and live inside the exported
  policy.
- `CategoricalHead` (Discrete actions: logits) and `GaussianHead` (Box
  actions: a diagonal Gaussian whose log-std is a state-independent
  parameter), or `SDEHead` (gSDE: noise that is a linear function of the
  policy's features, redrawn every few steps). A Gaussian sample is *not* clipped: the env gets
  ``clip(a, low, high)``, the log-probability is that of the unclipped sample.
- `ActorCritic`: observation normalizer, then a policy torso and a value
  torso (separate by default, one shared torso with ``shared=True``), the
  policy head and a scalar value head. ``critic=False`` drops the value side
  (ES).
- `RecurrentCore` (``model.recurrent``): an LSTM or GRU cell after a torso. With it the
  network is recurrent: `ActorCritic.step` takes and returns the recurrent state of each
  row (one flat float32 vector, see `RecurrentCore`), `ActorCritic.unroll` runs a batch of
  fragments ``[B, T]`` from their first step's state, zeroing the state before every step
  that starts an episode (truncated backpropagation through the fragment).
- `DeterministicPolicy`: the exported acting policy, greedy (argmax) for
  Categorical, the mean clipped to the bounds for Gaussian. Exported with
  `torch.export`, so it loads with plain `torch.export.load`. `RecurrentPolicy`: the
  same for a recurrent network, ``(obs, state) -> (action, next state)``.

Initialization follows the PPO implementations that work out of the box
(CleanRL, SB3): orthogonal weights, gain sqrt(2) in the torsos, 0.01 for the
policy output (a near-uniform / near-zero-mean first policy), 1 for the
value output, zero biases.
"""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from aiorl.algos.lib.networks import Layer, Torso
from aiorl.config import ConfigError

LOG_2PI = math.log(2.0 * math.pi)


def check_action_space(space: gym.Space, algo: str) -> None:
    """Discrete and bounded-or-not Box actions; anything else is a ConfigError naming the space."""
    if isinstance(space, gym.spaces.Discrete):
        return
    if isinstance(space, gym.spaces.Box) and np.issubdtype(space.dtype, np.floating):
        return
    raise ConfigError(f"env.id: {algo} supports Discrete and float Box action spaces, got {space}")


# --------------------------------------------------------------------------
# Observation normalization


class ObsNormalizer(nn.Module):
    """``clip((x - mean) / sqrt(var + eps), -clip, clip)`` with running statistics.

    ``count``, ``mean`` and ``var`` (float64) are the running statistics;
    ``shift`` and ``scale`` (float32) are what `forward` uses, refreshed by
    `update`; ``std_floor`` bounds the scale (the std used is at least it). Disabled
    (``size == 0``) it only converts to float32.
    """

    def __init__(self, size: int, clip: float = 10.0, eps: float = 1e-8, std_floor: float = 0.0):
        super().__init__()
        self.enabled = size > 0
        self.clip = float(clip)
        self.eps = float(eps)
        # A feature that barely varies is scaled by at most 1 / std_floor: else 1 / sqrt(eps)
        # multiplies its tiny wobbles into the clip (OpenAI's ES floors its std at 0.1).
        self.std_floor = float(std_floor)
        n = max(size, 1)
        # A tiny prior count: the first update is, in effect, the first batch's statistics.
        self.register_buffer("count", torch.full((1,), 1e-4, dtype=torch.float64))
        self.register_buffer("mean", torch.zeros(n, dtype=torch.float64))
        self.register_buffer("var", torch.ones(n, dtype=torch.float64))
        self.register_buffer("shift", torch.zeros(n))
        self.register_buffer("scale", torch.ones(n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.to(torch.float32)
        if not self.enabled:
            return x
        return ((x - self.shift) * self.scale).clamp(-self.clip, self.clip)

    @torch.no_grad()
    def update(self, count: float, total: np.ndarray, total_sq: np.ndarray) -> None:
        """Merge a batch given as (number of rows, sum of rows, sum of squared rows)."""
        if not self.enabled or count <= 0:
            return
        batch_mean = np.asarray(total, np.float64) / count
        batch_var = np.maximum(np.asarray(total_sq, np.float64) / count - batch_mean**2, 0.0)
        n0 = float(self.count[0])
        mean0, var0 = self.mean.numpy(), self.var.numpy()
        n = n0 + count
        delta = batch_mean - mean0
        mean = mean0 + delta * (count / n)
        m2 = var0 * n0 + batch_var * count + delta**2 * (n0 * count / n)
        self.count.fill_(n)
        self.mean.copy_(torch.from_numpy(mean))
        self.var.copy_(torch.from_numpy(m2 / n))
        self.shift.copy_(self.mean.to(torch.float32))
        std = torch.sqrt(self.var + self.eps).clamp(min=self.std_floor)
        self.scale.copy_((1.0 / std).to(torch.float32))


def obs_norm_size(space: gym.Space, key: str) -> int:
    """Features an ObsNormalizer covers: vector Box observations only."""
    if not (isinstance(space, gym.spaces.Box) and len(space.shape) == 1):
        raise ConfigError(f"{key}: observation normalization needs vector (1-D Box) observations, the env has {space}")
    return int(space.shape[0])


def batch_moments(obs: np.ndarray) -> tuple[float, np.ndarray, np.ndarray]:
    """(rows, sum, sum of squares) of a batch of vector observations, in float64."""
    x = np.asarray(obs, np.float64).reshape(len(obs), -1)
    return float(len(x)), x.sum(axis=0), np.square(x).sum(axis=0)


# --------------------------------------------------------------------------
# Policy heads


def orthogonal_init(module: nn.Module, gain: float) -> None:
    for m in module.modules():
        if isinstance(m, (nn.Linear, nn.Conv2d)):
            nn.init.orthogonal_(m.weight, gain)
            nn.init.zeros_(m.bias)


class CategoricalHead(nn.Module):
    """Logits over Discrete(n) actions."""

    def __init__(self, features: int, num_actions: int):
        super().__init__()
        self.logits = nn.Linear(features, num_actions)
        orthogonal_init(self.logits, 0.01)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.logits(x)

    def mode(self, logits: torch.Tensor) -> torch.Tensor:
        return logits.argmax(dim=1)

    def log_prob(self, logits: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        logp = torch.log_softmax(logits, dim=1)
        return logp.gather(1, action.long().reshape(-1, 1)).squeeze(1)

    def entropy(self, logits: torch.Tensor) -> torch.Tensor:
        logp = torch.log_softmax(logits, dim=1)
        return -(logp.exp() * logp).sum(dim=1)

    def sample(
        self, logits: torch.Tensor, rng: np.random.Generator, features: torch.Tensor | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """(actions int64 [B], their log-probabilities [B]) by inverse CDF on the actor's own generator."""
        x = np.asarray(logits, np.float64)  # a tensor or, from a numpy forward, an array
        x = x - x.max(axis=1, keepdims=True)
        logp = x - np.log(np.exp(x).sum(axis=1, keepdims=True))
        cdf = np.cumsum(np.exp(logp), axis=1)
        u = rng.random((len(cdf), 1)) * cdf[:, -1:]
        action = np.minimum((cdf < u).sum(axis=1), cdf.shape[1] - 1)
        return action.astype(np.int64), logp[np.arange(len(action)), action].astype(np.float32)


def diag_normal_log_prob(mean: torch.Tensor, log_std: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
    """log N(action; mean, diag(exp(log_std)^2)) per row; `log_std` [dim] or, state-dependent, [B, dim]."""
    z = (action.reshape(mean.shape) - mean) * torch.exp(-log_std)
    return -0.5 * (z.pow(2) + 2.0 * log_std + LOG_2PI).sum(dim=1)


def diag_normal_log_prob_np(z: np.ndarray, log_std: np.ndarray) -> np.ndarray:
    """The actors' side of `diag_normal_log_prob` (float64 numpy): `z` is the standardized draw
    (action - mean) / std, which the sampler has at hand."""
    return -0.5 * (np.square(z) + 2.0 * log_std + LOG_2PI).sum(axis=1)


class GaussianHead(nn.Module):
    """Diagonal Gaussian over a flat Box action: mean from the features, a
    state-independent learned log-std; `mode` is the mean clipped to the bounds."""

    def __init__(self, features: int, space: gym.spaces.Box, log_std_init: float = 0.0, learn_std: bool = True):
        super().__init__()
        dim = int(np.prod(space.shape))
        self.mean = nn.Linear(features, dim)
        orthogonal_init(self.mean, 0.01)
        self.log_std = nn.Parameter(torch.full((dim,), float(log_std_init)), requires_grad=learn_std)
        low = np.nan_to_num(space.low.reshape(-1).astype(np.float32), neginf=-3.0e38)
        high = np.nan_to_num(space.high.reshape(-1).astype(np.float32), posinf=3.0e38)
        self.register_buffer("low", torch.as_tensor(low))
        self.register_buffer("high", torch.as_tensor(high))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mean(x)

    def mode(self, mean: torch.Tensor) -> torch.Tensor:
        return torch.max(torch.min(mean, self.high), self.low)

    def log_prob(self, mean: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        return diag_normal_log_prob(mean, self.log_std, action)

    def entropy(self, mean: torch.Tensor) -> torch.Tensor:
        return (0.5 + 0.5 * LOG_2PI + self.log_std).sum().expand(mean.shape[0])

    def sample(
        self, mean: torch.Tensor, rng: np.random.Generator, features: torch.Tensor | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """(unclipped actions float32 [B, dim], their log-probabilities [B]); `features`: unused here."""
        log_std = self.log_std.detach().numpy().astype(np.float64)
        noise = rng.standard_normal(mean.shape)
        action = np.asarray(mean, np.float64) + np.exp(log_std) * noise
        return action.astype(np.float32), diag_normal_log_prob_np(noise, log_std).astype(np.float32)

    def clip_to_bounds(self, action: np.ndarray) -> np.ndarray:
        return np.clip(action, self.low.numpy(), self.high.numpy())


class SDEHead(GaussianHead):
    """Generalized state-dependent exploration (gSDE; Raffin et al., 2021, "Smooth exploration for
    robotic reinforcement learning"): the noise added to the mean is ``features @ W``, a linear
    function of the policy's last features, with ``W ~ N(0, exp(log_std)^2)`` [features, dim] drawn
    per env and kept for ``sample_freq`` steps. The same state then gets the same push for a while,
    a swing rather than jitter, which is what lets PPO find Pendulum's swing-up in 100k steps.

    Given the state, the action is ``N(mean, sigma(s)^2)`` with ``sigma(s)^2 = (x^2) @ exp(2 log_std)``
    (x the features, detached: the noise does not train the torso), so `log_prob` and `entropy` are
    those of a diagonal Gaussian whose std depends on the state. The distribution parameters are
    ``[mean | log sigma(s)]`` (2 x dim columns).
    """

    EPS = 1e-6  # added to the variance: features all near 0 must not give a zero std

    def __init__(
        self,
        features: int,
        space: gym.spaces.Box,
        log_std_init: float = 0.0,
        learn_std: bool = True,
        sample_freq: int = 4,
    ):
        super().__init__(features, space, log_std_init, learn_std)
        self.dim = self.mean.out_features
        self.log_std = nn.Parameter(torch.full((features, self.dim), float(log_std_init)), requires_grad=learn_std)
        self.sample_freq = sample_freq
        self.reset_noise()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        variance = x.detach().pow(2) @ torch.exp(2.0 * self.log_std)
        return torch.cat([self.mean(x), 0.5 * torch.log(variance + self.EPS)], dim=1)

    def mode(self, params: torch.Tensor) -> torch.Tensor:
        return super().mode(params[:, : self.dim])

    def log_prob(self, params: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        return diag_normal_log_prob(params[:, : self.dim], params[:, self.dim :], action)

    def entropy(self, params: torch.Tensor) -> torch.Tensor:
        return (0.5 + 0.5 * LOG_2PI + params[:, self.dim :]).sum(dim=1)

    def reset_noise(self) -> None:
        """Draw new exploration matrices at the next sample (new weights: a new rollout)."""
        self._noise: np.ndarray | None = None
        self._age = 0

    def sample(
        self, params: torch.Tensor, rng: np.random.Generator, features: torch.Tensor | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        mean = np.asarray(params[:, : self.dim], np.float64)
        log_sigma = np.asarray(params[:, self.dim :], np.float64)
        x = np.asarray(features, np.float64)
        if self._noise is None or self._age >= self.sample_freq or len(self._noise) != len(x):
            std = np.exp(self.log_std.detach().numpy().astype(np.float64))
            self._noise = rng.standard_normal((len(x),) + std.shape) * std  # [envs, features, dim]
            self._age = 0
        self._age += 1
        noise = np.einsum("bf,bfd->bd", x, self._noise)
        logp = diag_normal_log_prob_np(noise * np.exp(-log_sigma), log_sigma)
        return (mean + noise).astype(np.float32), logp.astype(np.float32)


def make_head(
    features: int,
    space: gym.Space,
    log_std_init: float = 0.0,
    learn_std: bool = True,
    sde_sample_freq: int | None = None,
) -> nn.Module:
    """`sde_sample_freq`: gSDE (`SDEHead`) with new exploration matrices every that many steps."""
    if isinstance(space, gym.spaces.Discrete):
        if sde_sample_freq is not None:
            raise ConfigError(f"model.sde: state-dependent exploration needs a Box action space, got {space}")
        return CategoricalHead(features, int(space.n))
    if sde_sample_freq is not None:
        return SDEHead(features, space, log_std_init, learn_std, sde_sample_freq)
    return GaussianHead(features, space, log_std_init, learn_std)


# --------------------------------------------------------------------------
# Recurrent core


class RecurrentCore(nn.Module):
    """An LSTM or GRU cell over a torso's features. Its state travels as one flat float32 vector
    per row, ``state_size`` wide: ``[h | c]`` for an LSTM (2 x hidden), ``h`` for a GRU."""

    def __init__(self, kind: str, features: int, hidden: int):
        super().__init__()
        self.kind, self.hidden = kind, hidden
        self.cell = nn.LSTMCell(features, hidden) if kind == "lstm" else nn.GRUCell(features, hidden)
        self.state_size = 2 * hidden if kind == "lstm" else hidden
        self.features = hidden

    def forward(self, x: torch.Tensor, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(output [B, hidden], next state [B, state_size]) of one step."""
        if self.kind == "lstm":
            h, c = self.cell(x, (state[:, : self.hidden], state[:, self.hidden :]))
            return h, torch.cat([h, c], dim=1)
        h = self.cell(x, state)
        return h, h

    def sequence(self, x: torch.Tensor, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(outputs [B, T, hidden], the state after the last step [B, state_size]) of the steps
        ``x [B, T, features]`` from `state`, with no reset between them: `forward` step by step,
        to float rounding.

        On the CPU one fused call (torch.lstm / torch.gru over the cell's own weights, which
        nn.LSTM / nn.GRU lay out alike) replaces T calls of the cell and their T autograd nodes:
        an R2D2 learner's unroll of 23 steps (batch 32, hidden 64) took 4.6 ms forward and
        backward step by step, 1.9 ms fused. Elsewhere the cell steps, as the fused call would
        want its weights in one block (cuDNN) and warn at every call."""
        if x.device.type != "cpu":
            out = []
            for t in range(x.shape[1]):
                y, state = self(x[:, t], state)
                out.append(y)
            return torch.stack(out, dim=1), state
        cell = self.cell
        weights = [cell.weight_ih, cell.weight_hh, cell.bias_ih, cell.bias_hh]
        if self.kind == "lstm":
            h0 = state[:, : self.hidden].unsqueeze(0).contiguous()
            c0 = state[:, self.hidden :].unsqueeze(0).contiguous()
            out, h, c = torch.lstm(x, (h0, c0), weights, True, 1, 0.0, self.training, False, True)
            return out, torch.cat([h[0], c[0]], dim=1)
        out, h = torch.gru(x, state.unsqueeze(0).contiguous(), weights, True, 1, 0.0, self.training, False, True)
        return out, h[0]


# --------------------------------------------------------------------------
# Actor-critic


class ActorCritic(nn.Module):
    """normalizer -> policy torso -> head, and normalizer -> value torso -> V(s).

    ``shared=True`` uses one torso for both; ``critic=False`` has no value side.
    ``recurrent=(type, hidden)`` puts a `RecurrentCore` after each torso (the value side has
    its own unless shared); the row's state is the policy core's then the value core's.
    """

    def __init__(
        self,
        obs_space: gym.Space,
        action_space: gym.Space,
        layers: list[Layer],
        shared: bool = False,
        critic: bool = True,
        obs_norm: int = 0,
        obs_norm_clip: float = 10.0,
        obs_norm_std_floor: float = 0.0,
        log_std_init: float = 0.0,
        learn_std: bool = True,
        sde_sample_freq: int | None = None,
        recurrent: tuple[str, int] | None = None,
    ):
        super().__init__()
        self.normalizer = ObsNormalizer(obs_norm, obs_norm_clip, std_floor=obs_norm_std_floor)
        self.pi_torso = Torso(obs_space, layers)
        self.v_torso = Torso(obs_space, layers) if critic and not shared else None
        self.recurrent = recurrent
        self.pi_core = self.v_core = None
        pi_features = self.pi_torso.features
        v_features = pi_features if self.v_torso is None else self.v_torso.features
        if recurrent is not None:
            kind, hidden = recurrent
            self.pi_core = RecurrentCore(kind, pi_features, hidden)
            pi_features = hidden
            if self.v_torso is not None:
                self.v_core = RecurrentCore(kind, v_features, hidden)
            v_features = hidden
        self.state_size = sum(c.state_size for c in (self.pi_core, self.v_core) if c is not None)
        self.head = make_head(pi_features, action_space, log_std_init, learn_std, sde_sample_freq)
        self.value_head = None
        if critic:
            self.value_head = nn.Linear(v_features, 1)
            orthogonal_init(self.value_head, 1.0)
        orthogonal_init(self.pi_torso, math.sqrt(2))
        if self.v_torso is not None:
            orthogonal_init(self.v_torso, math.sqrt(2))

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(distribution parameters: logits or mean, V(s) [B])."""
        params, value, _ = self.act(obs)
        return params, value

    def act(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(distribution parameters, V(s), the policy's features: what gSDE's noise is a function of)."""
        x = self.normalizer(obs)
        pi_features = self.pi_torso(x)
        v_features = pi_features if self.v_torso is None else self.v_torso(x)
        return self.head(pi_features), self.value_head(v_features).squeeze(1), pi_features

    def policy_params(self, obs: torch.Tensor) -> torch.Tensor:
        return self.head(self.pi_torso(self.normalizer(obs)))

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        x = self.normalizer(obs)
        features = self.pi_torso(x) if self.v_torso is None else self.v_torso(x)
        return self.value_head(features).squeeze(1)

    # Recurrent networks: the same, with a state per row.

    def initial_state(self, rows: int) -> np.ndarray:
        """The state at an episode's start: zeros, float32 [rows, state_size]."""
        return np.zeros((rows, self.state_size), np.float32)

    def step(self, obs: torch.Tensor, state: torch.Tensor):
        """(distribution parameters, V(s) or None, the policy's features, next state) of one step."""
        x = self.normalizer(obs)
        split = self.pi_core.state_size
        pi_features, pi_state = self.pi_core(self.pi_torso(x), state[:, :split])
        params = self.head(pi_features)
        if self.value_head is None:
            return params, None, pi_features, pi_state
        if self.v_core is None:
            return params, self.value_head(pi_features).squeeze(1), pi_features, pi_state
        v_features, v_state = self.v_core(self.v_torso(x), state[:, split:])
        value = self.value_head(v_features).squeeze(1)
        return params, value, pi_features, torch.cat([pi_state, v_state], dim=1)

    def unroll(self, obs: torch.Tensor, state: torch.Tensor, first: torch.Tensor, stored: torch.Tensor | None = None):
        """Fragments ``obs [B, T, ...]`` from their first step's state ``[B, state_size]``;
        ``first [B, T]`` (bool) marks the steps that start an episode, before which the state
        is zeroed (step 0's state is the actor's, already reset if its episode starts there).
        With ``stored [B, T, state_size]`` (the states the actor acted from), a marked step takes
        its stored state instead: zeros at an episode start, the actor's at a sequence's start.

        Returns (parameters [B*T, ...], V [B*T], the state after each step [B, T, state_size]):
        the last is what a bootstrap value of the observation after step t needs.
        """
        B, T = obs.shape[:2]
        mark = first.unsqueeze(2)  # [B, T, 1]
        # The torsos and heads see every step at once; only the cells step through time.
        x = self.normalizer(obs.reshape((B * T,) + obs.shape[2:]))
        pi_in = self.pi_torso(x).reshape(B, T, -1)
        v_in = self.v_torso(x).reshape(B, T, -1) if self.v_core is not None else None
        split = self.pi_core.state_size
        pi_out, v_out, after = [], [], []
        for t in range(T):
            if t > 0:
                state = torch.where(mark[:, t], torch.zeros_like(state) if stored is None else stored[:, t], state)
            h, pi_state = self.pi_core(pi_in[:, t], state[:, :split])
            pi_out.append(h)
            if v_in is not None:
                hv, v_state = self.v_core(v_in[:, t], state[:, split:])
                v_out.append(hv)
                state = torch.cat([pi_state, v_state], dim=1)
            else:
                state = pi_state
            after.append(state)
        pi_features = torch.stack(pi_out, dim=1).reshape(B * T, -1)
        params = self.head(pi_features)
        values = None
        if self.value_head is not None:
            v_features = pi_features if v_in is None else torch.stack(v_out, dim=1).reshape(B * T, -1)
            values = self.value_head(v_features).squeeze(1)
        return params, values, torch.stack(after, dim=1)

    def value_step(self, obs: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        """V of `obs` seen with `state` (the state after the step before it)."""
        return self.step(obs, state)[1]


class DeterministicPolicy(nn.Module):
    """Exported policy: observations -> argmax action (int64 [B]) or clipped mean (float32 [B, dim])."""

    def __init__(self, net: ActorCritic):
        super().__init__()
        self.normalizer = net.normalizer
        self.torso = net.pi_torso
        self.head = net.head

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.head.mode(self.head(self.torso(self.normalizer(obs))))


class RecurrentPolicy(nn.Module):
    """Exported recurrent policy: ``(obs [B, ...], state float32 [B, state_size]) -> (action,
    next state)``, the action as `DeterministicPolicy`'s; the state is zeros at an episode's start."""

    def __init__(self, net: ActorCritic):
        super().__init__()
        self.normalizer = net.normalizer
        self.torso = net.pi_torso
        self.core = net.pi_core
        self.head = net.head
        self.state_size = net.pi_core.state_size

    def forward(self, obs: torch.Tensor, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        features, state = self.core(self.torso(self.normalizer(obs)), state)
        return self.head.mode(self.head(features)), state


class EnvStates:
    """An actor's recurrent state per env (IMPALA's and PPO's actors): zeros at the first step and
    at every episode start (`reset`, through `ActorPolicy.begin_episodes`), stepped by `step`."""

    def __init__(self, net: ActorCritic):
        self.net = net
        self.state: np.ndarray | None = None  # float32 [num_envs, state_size] once stepped

    def reset(self, started: np.ndarray) -> None:
        if self.state is not None:
            self.state[started] = 0.0

    def step(self, obs: np.ndarray):
        """(parameters, V or None, the policy's features, the state this step was acted from)."""
        if self.state is None:
            self.state = self.net.initial_state(len(obs))
        before = self.state
        with torch.inference_mode():
            params, value, features, state = self.net.step(torch.as_tensor(obs), torch.as_tensor(before))
        self.state = state.numpy().copy()
        return params.numpy(), None if value is None else value.numpy(), features.numpy(), before


def acting_module(net: ActorCritic) -> nn.Module:
    """The exported policy of `net`: `RecurrentPolicy` or `DeterministicPolicy`."""
    return RecurrentPolicy(net) if net.recurrent is not None else DeterministicPolicy(net)


def policy_meta(algo_name: str, env_spec, learner_steps: int, recurrent: dict | None = None, **extra) -> dict:
    """The JSON description exported beside ``policy.pt2``; `recurrent`: ``{"type", "hidden",
    "state_size"}`` of a recurrent policy (its signature takes and returns the state)."""
    obs_space, action_space = env_spec.observation_space, env_spec.action_space
    if isinstance(action_space, gym.spaces.Discrete):
        action = {"kind": "discrete", "n": int(action_space.n)}
        signature = "obs[B, *observation_shape] -> int64 actions[B] (greedy)"
    else:
        action = {
            "kind": "box",
            "shape": list(action_space.shape),
            "low": action_space.low.reshape(-1).tolist(),
            "high": action_space.high.reshape(-1).tolist(),
        }
        signature = "obs[B, *observation_shape] -> float32 actions[B, prod(action_shape)] (mean, clipped)"
    if recurrent is not None:
        extra["recurrent"] = recurrent
        inputs, outputs = signature.split(" -> ")
        signature = (
            f"({inputs}, float32 state[B, {recurrent['state_size']}]) -> ({outputs}, float32 state[B, "
            f"{recurrent['state_size']}]); state zeros at each episode start"
        )
    return {
        "algo": algo_name,
        "env_id": env_spec.id,
        "learner_steps": learner_steps,
        "observation_shape": list(obs_space.shape),
        "observation_dtype": np.dtype(obs_space.dtype).str,
        "action": action,
        "signature": signature,
        **extra,
    }
