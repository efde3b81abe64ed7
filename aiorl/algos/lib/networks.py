"""Networks built from a declarative layer list, shared by the Ape-X algorithms.

A network spec is a list of layer strings (`aiorl.algos.lib.layers`: ``linear:N``,
``conv:C:K:S``, activations, ``layernorm``, ``flatten``, ``nature_cnn``), applied in
order after the observation encoder.

The observation encoder is fixed by the observation space, so that frames
travel as uint8 and are converted where the network runs (on the learner's
device, and inside the exported policy):

- Box uint8 -> float / 255; any other Box dtype -> float32;
- Box with 2 dims (H, W) -> one channel; 3 dims with a last dim <= 4 and a
  first dim > 4 -> HWC, permuted to CHW;
- Discrete(n) -> one-hot of size n.

Every module here traces with `torch.export` (no data-dependent Python control
flow), so exported policies load with plain `torch.export.load` (aiorl.io.export).
"""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from aiorl.algos.lib.layers import ACTIVATIONS, Layer
from aiorl.config import ConfigError

DEFAULT_MLP = ["linear:256", "relu", "linear:256", "relu"]


# --------------------------------------------------------------------------
# Observation encoding


def check_observation_space(space: gym.Space, key: str) -> None:
    """Box and Discrete observations are supported; anything else is a ConfigError naming the space."""
    if isinstance(space, gym.spaces.Discrete):
        return
    if isinstance(space, gym.spaces.Box):
        if len(space.shape) > 3:
            raise ConfigError(
                f"{key}: observation space {space} has {len(space.shape)} dimensions; "
                "supported are vectors (1-D) and images (2-D or 3-D)"
            )
        return
    raise ConfigError(
        f"{key}: unsupported observation space {space} ({type(space).__name__}); supported are Box and Discrete"
    )


def discrete_actions(env_spec, algo: str, instead: str = "") -> int:
    """The number of actions of a Discrete action space numbered from 0 (a Q-network's outputs are
    the actions); anything else is a ConfigError naming the space and `instead`, what to use."""
    space = env_spec.action_space
    if not isinstance(space, gym.spaces.Discrete):
        raise ConfigError(f"env.id: {algo} needs a Discrete action space; {env_spec.id} has {space}{instead}")
    if int(space.start) != 0:
        raise ConfigError(f"env.id: {algo} needs actions numbered from 0; {env_spec.id} has {space}")
    return int(space.n)


def is_image(space: gym.Space) -> bool:
    return isinstance(space, gym.spaces.Box) and len(space.shape) in (2, 3)


class ToFloat(nn.Module):
    def __init__(self, scale: float):
        super().__init__()
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.to(torch.float32)
        if self.scale != 1.0:
            x = x * self.scale
        return x


class OneHot(nn.Module):
    def __init__(self, n: int):
        super().__init__()
        self.n = n

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.one_hot(x.to(torch.int64).reshape(-1), self.n).to(torch.float32)


class ToImage(nn.Module):
    """[B, H, W] -> [B, 1, H, W]; [B, H, W, C] -> [B, C, H, W] when `hwc`."""

    def __init__(self, add_channel: bool, hwc: bool):
        super().__init__()
        self.add_channel = add_channel
        self.hwc = hwc

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.add_channel:
            return x.unsqueeze(1)
        if self.hwc:
            return x.permute(0, 3, 1, 2)
        return x


def observation_encoder(space: gym.Space) -> tuple[nn.Module, tuple[int, ...]]:
    """The fixed front of every network and the shape it produces (without batch)."""
    if isinstance(space, gym.spaces.Discrete):
        return OneHot(int(space.n)), (int(space.n),)
    shape = tuple(int(d) for d in space.shape)
    scale = 1.0 / 255.0 if np.dtype(space.dtype) == np.uint8 else 1.0
    modules: list[nn.Module] = [ToFloat(scale)]
    if len(shape) == 0:
        modules.append(nn.Unflatten(0, (-1, 1)))
        shape = (1,)
    elif len(shape) == 2:
        modules.append(ToImage(add_channel=True, hwc=False))
        shape = (1, *shape)
    elif len(shape) == 3 and shape[-1] <= 4 < shape[0]:
        modules.append(ToImage(add_channel=False, hwc=True))
        shape = (shape[2], shape[0], shape[1])
    return nn.Sequential(*modules), shape


# --------------------------------------------------------------------------
# Torso


def build_layers(layers: list[Layer], in_shape: tuple[int, ...]) -> tuple[list[nn.Module], tuple[int, ...]]:
    """Modules for `layers` on inputs of `in_shape`, ending flat; also the output shape."""
    modules: list[nn.Module] = []
    shape = tuple(in_shape)

    def flatten():
        nonlocal shape
        modules.append(nn.Flatten())
        shape = (math.prod(shape),)

    for layer in layers:
        if layer.kind == "conv":
            if len(shape) != 3:
                raise ConfigError(
                    f"{layer.path}: {layer} needs image observations before any flatten/linear "
                    f"layer, but its input has shape {shape}"
                )
            channels, kernel, stride = layer.args
            h, w = (shape[1] - kernel) // stride + 1, (shape[2] - kernel) // stride + 1
            if h < 1 or w < 1:
                raise ConfigError(f"{layer.path}: {layer} does not fit its input of shape {shape}")
            modules.append(nn.Conv2d(shape[0], channels, kernel, stride))
            shape = (channels, h, w)
        elif layer.kind == "flatten":
            if len(shape) != 1:
                flatten()
        elif layer.kind == "linear":
            if len(shape) != 1:
                flatten()
            modules.append(nn.Linear(shape[0], layer.args[0]))
            shape = (layer.args[0],)
        elif layer.kind == "layernorm":
            if len(shape) != 1:
                raise ConfigError(f"{layer.path}: layernorm needs flat features; add 'flatten' before it")
            modules.append(nn.LayerNorm(shape[0]))
        else:
            modules.append(getattr(nn, ACTIVATIONS[layer.kind])())
    if len(shape) != 1:
        flatten()
    return modules, shape


def split_at_flat(layers: list[Layer]) -> tuple[list[Layer], list[Layer]]:
    """(image part, flat part): the image part ends after the last conv/flatten and
    the activations that directly follow it."""
    split = 0
    for i, layer in enumerate(layers):
        if layer.kind in ("conv", "flatten"):
            split = i + 1
    while split < len(layers) and layers[split].kind in ACTIVATIONS:
        split += 1
    if split and not any(layer.kind in ("conv", "flatten") for layer in layers[:split]):
        split = 0
    return layers[:split], layers[split:]


class Torso(nn.Module):
    """Observation encoder + layers: ``[B, *obs_shape] -> [B, features]``."""

    def __init__(self, space: gym.Space, layers: list[Layer]):
        super().__init__()
        encoder, shape = observation_encoder(space)
        modules, out_shape = build_layers(layers, shape)
        self.net = nn.Sequential(encoder, *modules)
        self.features = out_shape[0]

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.net(obs)


# --------------------------------------------------------------------------
# Q-network (DQN)


class DuelingHead(nn.Module):
    """Q(s, a) = V(s) + A(s, a) - mean_a' A(s, a') (Wang et al. 2016)."""

    def __init__(self, features: int, num_actions: int):
        super().__init__()
        self.value = nn.Linear(features, 1)
        self.advantage = nn.Linear(features, num_actions)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        advantage = self.advantage(x)
        return self.value(x) + advantage - advantage.mean(dim=1, keepdim=True)


class QNetwork(nn.Module):
    def __init__(self, obs_space: gym.Space, num_actions: int, layers: list[Layer], dueling: bool):
        super().__init__()
        self.torso = Torso(obs_space, layers)
        self.head = (
            DuelingHead(self.torso.features, num_actions) if dueling else nn.Linear(self.torso.features, num_actions)
        )

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.head(self.torso(obs))


class GreedyPolicy(nn.Module):
    """Exported DQN policy: observations -> argmax_a Q(s, a) (int64)."""

    def __init__(self, q: QNetwork):
        super().__init__()
        self.q = q

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.q(obs).argmax(dim=1)


# --------------------------------------------------------------------------
# Deterministic actor and Q critic (DDPG)


class ActionScale(nn.Module):
    """Maps [-1, 1] to [low, high] and back, per action dimension."""

    def __init__(self, low: np.ndarray, high: np.ndarray):
        super().__init__()
        # In numpy (float32, as torch would): torch's arithmetic on a meta tensor (`shapes_only`)
        # goes through its decompositions, which import torch._dynamo.
        low, high = np.asarray(low, np.float32), np.asarray(high, np.float32)
        self.register_buffer("center", torch.as_tensor((high + low) / np.float32(2)))
        self.register_buffer("half_range", torch.as_tensor((high - low) / np.float32(2)))

    def to_env(self, unit: torch.Tensor) -> torch.Tensor:
        return self.center + self.half_range * unit

    def to_unit(self, action: torch.Tensor) -> torch.Tensor:
        return (action - self.center) / self.half_range


class DeterministicActor(nn.Module):
    """mu(s) = center + half_range * tanh(f(s)): always within the action bounds."""

    def __init__(self, obs_space: gym.Space, action_space: gym.spaces.Box, layers: list[Layer]):
        super().__init__()
        self.torso = Torso(obs_space, layers)
        self.out = nn.Linear(self.torso.features, int(np.prod(action_space.shape)))
        self.scale = ActionScale(action_space.low.reshape(-1), action_space.high.reshape(-1))

    def unit(self, obs: torch.Tensor) -> torch.Tensor:
        """The action in [-1, 1] (what the critic takes)."""
        return torch.tanh(self.out(self.torso(obs)))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.scale.to_env(self.unit(obs))


class Critic(nn.Module):
    """Q(s, a): the action (rescaled to [-1, 1]) joins the features where they
    become flat: at the input for vector observations, after the
    convolutions for images."""

    def __init__(self, obs_space: gym.Space, action_space: gym.spaces.Box, layers: list[Layer]):
        super().__init__()
        encoder, shape = observation_encoder(obs_space)
        action_dim = int(np.prod(action_space.shape))
        image_layers, flat_layers = split_at_flat(layers)
        pre, pre_shape = build_layers(image_layers, shape)
        self.pre = nn.Sequential(encoder, *pre)
        post, out_shape = build_layers(flat_layers, (pre_shape[0] + action_dim,))
        self.post = nn.Sequential(*post)
        self.out = nn.Linear(out_shape[0], 1)
        self.scale = ActionScale(action_space.low.reshape(-1), action_space.high.reshape(-1))

    def q_unit(self, obs: torch.Tensor, unit_action: torch.Tensor) -> torch.Tensor:
        x = torch.cat([self.pre(obs), unit_action], dim=1)
        return self.out(self.post(x)).squeeze(1)

    def forward(self, obs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        return self.q_unit(obs, self.scale.to_unit(action.reshape(action.shape[0], -1)))


def torch_dtype(space: gym.Space) -> torch.dtype:
    if isinstance(space, gym.spaces.Discrete):
        return torch.int64
    return torch.from_numpy(np.zeros((), space.dtype)).dtype
