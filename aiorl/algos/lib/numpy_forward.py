"""Small MLPs evaluated in numpy, for acting on CPU without a torch call per step.

An actor calls its network once per step of its vector of envs, on a handful of rows. For the
MLPs of the classic-control examples torch's per-call overhead (dispatch, autograd bookkeeping,
tensor wrapping) is most of the cost: a dueling 128x128 Q-network on 8 CartPole rows takes
about 150 us through torch and about 15 us as three numpy matmuls. `compile_numpy` turns a
module built from the layers aiorl's networks use (`aiorl.algos.lib.networks`) into a numpy
function, or says it cannot (convolutions, GELU, anything unknown), and the caller keeps torch.

The numpy function reads float32 copies of the weights: call `NumpyForward.refresh` after the
module's weights change. `NumpyForward.check` compares it with the module on given inputs; each
actor does so once when it builds the path, and tests hold it to float tolerance.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import numpy as np
import torch
from torch import nn

from aiorl.algos.lib.actor_critic import ActorCritic, CategoricalHead, GaussianHead, ObsNormalizer
from aiorl.algos.lib.layers import ACTIVATIONS as LAYER_ACTIVATIONS
from aiorl.algos.lib.layers import NUMPY_ACTIVATIONS
from aiorl.algos.lib.networks import DuelingHead, OneHot, QNetwork, ToFloat, Torso

# Inputs a numpy result may differ from torch's by (float32 matmuls summed in another order).
RTOL, ATOL = 1e-4, 1e-5


# torch.nn activation class -> the numpy function of the same name.
ACTIVATIONS: dict[type, Callable[[np.ndarray], np.ndarray]] = {
    getattr(nn, LAYER_ACTIVATIONS[name]): fn for name, fn in NUMPY_ACTIVATIONS.items()
}


class NotCompilable(Exception):
    """The module holds a layer numpy does not run here."""


def _linear(module: nn.Linear) -> Callable:
    def forward(x):
        return x @ forward.w + forward.b

    forward.source = module
    return forward


def _layernorm(module: nn.LayerNorm) -> Callable:
    eps = module.eps

    def forward(x):
        mean = x.mean(axis=-1, keepdims=True)
        var = x.var(axis=-1, keepdims=True)
        y = (x - mean) / np.sqrt(var + eps)
        return y * forward.w + forward.b if forward.w is not None else y

    forward.source = module
    return forward


def _dueling(module: DuelingHead) -> Callable:
    """V and A in one matmul: their weights side by side, column 0 is V."""

    def forward(x):
        out = x @ forward.w + forward.b
        advantage = out[:, 1:]
        return out[:, :1] + advantage - advantage.mean(axis=1, keepdims=True)

    forward.source = module
    return forward


def _normalizer(module: ObsNormalizer) -> Callable:
    if not module.enabled:
        return lambda x: x.astype(np.float32)
    low, high = -module.clip, module.clip

    def forward(x):
        return np.clip((x.astype(np.float32) - forward.shift) * forward.scale, low, high)

    forward.source = module
    return forward


def _steps(module: nn.Module) -> list[Callable]:
    """The numpy steps of `module`, in order (raises NotCompilable)."""
    if isinstance(module, ObsNormalizer):
        return [_normalizer(module)]
    if type(module) is CategoricalHead:
        return [_linear(module.logits)]
    if type(module) is GaussianHead:  # the mean; the log-std is read where actions are drawn
        return [_linear(module.mean)]
    if isinstance(module, (nn.Sequential, Torso)):
        children = module if isinstance(module, nn.Sequential) else [module.net]
        return [step for child in children for step in _steps(child)]
    if isinstance(module, QNetwork):
        return _steps(module.torso) + _steps(module.head)
    if isinstance(module, nn.Linear):
        return [_linear(module)]
    if isinstance(module, nn.LayerNorm):
        return [_layernorm(module)]
    if isinstance(module, DuelingHead):
        return [_dueling(module)]
    if isinstance(module, ToFloat):
        scale = np.float32(module.scale)
        return [lambda x: x.astype(np.float32) * scale if scale != 1 else x.astype(np.float32)]
    if isinstance(module, OneHot):
        eye = np.eye(module.n, dtype=np.float32)
        return [lambda x: eye[np.asarray(x, np.int64).reshape(-1)]]
    if isinstance(module, nn.Flatten):
        return [lambda x: x.reshape(len(x), -1)]
    if isinstance(module, nn.Unflatten) and module.dim == 0 and tuple(module.unflattened_size) == (-1, 1):
        return [lambda x: x.reshape(-1, 1)]
    for kind, fn in ACTIVATIONS.items():
        if type(module) is kind:
            return [fn]
    raise NotCompilable(type(module).__name__)


class NumpyForward:
    """`module`'s forward in float32 numpy: ``[B, *obs] -> [B, out]``."""

    def __init__(self, module: nn.Module):
        self.module = module
        self.steps = _steps(module)
        self.refresh()

    def __repr__(self) -> str:
        return f"<NumpyForward of {type(self.module).__name__}: {len(self.steps)} steps>"

    def refresh(self) -> None:
        """Copy the module's current weights (after it loaded new ones)."""
        for step in self.steps:
            source = getattr(step, "source", None)
            if source is None:
                continue
            if isinstance(source, ObsNormalizer):
                step.shift, step.scale = source.shift.numpy().copy(), source.scale.numpy().copy()
                continue
            if isinstance(source, DuelingHead):
                value, advantage = source.value, source.advantage
                weight = torch.cat([value.weight, advantage.weight]).detach()
                step.w = np.ascontiguousarray(weight.numpy().T, np.float32)
                step.b = torch.cat([value.bias, advantage.bias]).detach().numpy().astype(np.float32)
                continue
            weight, bias = source.weight, source.bias
            if weight is None:  # a LayerNorm without its affine part
                step.w = None
            elif isinstance(source, nn.Linear):  # x @ W.T, with W.T laid out for the matmul
                step.w = np.ascontiguousarray(weight.detach().numpy().T, np.float32)
            else:
                step.w = weight.detach().numpy().astype(np.float32)
            step.b = np.float32(0) if bias is None else bias.detach().numpy().astype(np.float32)

    def __call__(self, obs: np.ndarray) -> np.ndarray:
        x = obs
        for step in self.steps:
            x = step(x)
        return x

    def check(self, obs: np.ndarray) -> None:
        """Raise if the numpy forward differs from the module's on `obs` beyond float tolerance."""
        with torch.inference_mode():
            expected = self.module(torch.as_tensor(np.asarray(obs))).numpy()
        _compare("output", type(self.module).__name__, self(np.asarray(obs)), expected)


class NumpyActorCritic:
    """`ActorCritic.act` in numpy: (distribution parameters, V(s), the policy's features)."""

    def __init__(self, net: ActorCritic):
        self.net = net
        self.normalize = NumpyForward(net.normalizer)  # once per call, for both torsos
        self.features = NumpyForward(net.pi_torso)
        self.head = NumpyForward(net.head)
        self.value = None
        if net.value_head is not None:
            # A shared torso: V(s) comes from the policy's features.
            value = net.value_head if net.v_torso is None else nn.Sequential(net.v_torso, net.value_head)
            self.value = NumpyForward(value)

    def __repr__(self) -> str:
        return f"<NumpyActorCritic head={type(self.net.head).__name__} critic={self.value is not None}>"

    def refresh(self) -> None:
        for part in (self.normalize, self.features, self.head, self.value):
            if part is not None:
                part.refresh()

    def act(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray | None, np.ndarray]:
        x = self.normalize(obs)
        features = self.features(x)
        value = None
        if self.value is not None:
            value = self.value(features if self.net.v_torso is None else x)[:, 0]
        return self.head(features), value, features

    def policy_params(self, obs: np.ndarray) -> np.ndarray:
        return self.head(self.features(self.normalize(obs)))

    def check(self, obs: np.ndarray) -> None:
        with torch.inference_mode():
            expected = self.net.act(torch.as_tensor(np.asarray(obs)))
        got = self.act(np.asarray(obs))
        for name, want, have in zip(("parameters", "value", "features"), expected, got):
            if have is None:
                continue
            _compare(name, type(self.net).__name__, have, want.numpy())


def _compare(what: str, module: str, got: np.ndarray, expected: np.ndarray) -> None:
    if got.shape != expected.shape or not np.allclose(got, expected, rtol=RTOL, atol=ATOL):
        worst = float(np.max(np.abs(got - expected))) if got.shape == expected.shape else None
        raise RuntimeError(
            f"numpy forward of {module} ({what}) differs from torch: shapes {got.shape} / {expected.shape}, "
            f"largest difference {worst}"
        )


def probe_observations(space, rows: int = 8, seed: int = 0) -> np.ndarray:
    """`rows` observations drawn from `space`, to check a numpy forward on."""
    space = copy.deepcopy(space)
    space.seed(seed)
    return np.stack([space.sample() for _ in range(rows)])


def compile_numpy(module: nn.Module, probe: np.ndarray | None = None) -> NumpyForward | NumpyActorCritic | None:
    """A numpy forward of `module` (an `ActorCritic`: of its `act`), checked on `probe`
    observations; None where a layer has no numpy step (the caller acts through torch), and
    for a recurrent network (its LSTM or GRU cell runs through torch)."""
    if getattr(module, "recurrent", None) is not None:
        return None
    try:
        forward = NumpyActorCritic(module) if isinstance(module, ActorCritic) else NumpyForward(module)
    except NotCompilable:
        return None
    if probe is not None:
        forward.check(probe)
    return forward
