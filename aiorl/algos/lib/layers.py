"""The layer list of a network spec (``model.network`` and the like): parsed and checked when
a config loads, built into torch modules by `aiorl.algos.lib.networks`. No torch here: the
config side of an algorithm checks its layer lists with it.

A network spec is a list of layer strings, applied in order after the
observation encoder:

- ``linear:N`` (alias ``dense:N``): fully connected, N units;
- ``conv:C:K:S``: 2-D convolution, C channels, kernel K, stride S (image
  observations only, before any ``flatten``/``linear``);
- ``relu``, ``tanh``, ``elu``, ``gelu``, ``silu``: activations;
- ``layernorm``: LayerNorm over a flat feature vector;
- ``flatten``: flatten (inserted before the first ``linear`` if missing);
- ``nature_cnn``: the DQN Nature torso (three convolutions, ``linear:512``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from aiorl.config import ConfigError
from aiorl.core.suggest import did_you_mean

# Activation layer name -> its class in torch.nn.
ACTIVATIONS = {"relu": "ReLU", "tanh": "Tanh", "elu": "ELU", "gelu": "GELU", "silu": "SiLU"}
# The activations aiorl also runs in numpy (ES actors, and acting through a numpy forward,
# `aiorl.algos.lib.numpy_forward`): GELU's exact form needs erf, which numpy lacks.
NUMPY_ACTIVATIONS = {
    "relu": lambda x: np.maximum(x, 0.0),
    "tanh": np.tanh,
    "elu": lambda x: np.where(x > 0, x, np.expm1(np.minimum(x, 0.0))),
    "silu": lambda x: x / (1.0 + np.exp(-x)),
}
LAYER_KINDS = ("linear", "dense", "conv", "layernorm", "flatten", "nature_cnn", *ACTIVATIONS)
PRESETS = {
    "nature_cnn": [
        "conv:32:8:4",
        "relu",
        "conv:64:4:2",
        "relu",
        "conv:64:3:1",
        "relu",
        "flatten",
        "linear:512",
        "relu",
    ],
}


@dataclass(frozen=True)
class Layer:
    kind: str  # linear, conv, layernorm, flatten or an activation name
    args: tuple[int, ...] = ()
    path: str = ""  # config key path, for errors

    def __str__(self) -> str:
        return ":".join([self.kind, *map(str, self.args)])


def parse_network(spec, path: str) -> list[Layer]:
    """Parse a layer list (see module docstring); raise ConfigError naming ``path[i]``."""
    if not isinstance(spec, list):
        raise ConfigError(f"{path}: expected a list of layers such as ['linear:64', 'relu'], got {spec!r}")
    layers: list[Layer] = []
    for i, item in enumerate(spec):
        where = f"{path}[{i}]"
        if not isinstance(item, str) or not item.strip():
            raise ConfigError(f"{where}: expected a layer string such as 'linear:64', got {item!r}")
        kind, *raw = item.strip().lower().split(":")
        if kind not in LAYER_KINDS:
            hint = did_you_mean(kind, LAYER_KINDS)
            raise ConfigError(f"{where}: unknown layer {item!r}{hint} (known: {', '.join(LAYER_KINDS)})")
        try:
            args = tuple(int(a) for a in raw)
        except ValueError:
            raise ConfigError(f"{where}: layer arguments must be integers, got {item!r}") from None
        expected = {"linear": 1, "dense": 1, "conv": 3}.get(kind, 0)
        if len(args) != expected:
            form = {"linear": "linear:UNITS", "dense": "dense:UNITS", "conv": "conv:CHANNELS:KERNEL:STRIDE"}
            raise ConfigError(
                f"{where}: {item!r} takes {expected} argument(s)" + (f", as in {form[kind]!r}" if kind in form else "")
            )
        if any(a < 1 for a in args):
            raise ConfigError(f"{where}: layer sizes must be at least 1, got {item!r}")
        if kind in PRESETS:
            layers.extend(parse_network(PRESETS[kind], f"{where}({kind})"))
            continue
        layers.append(Layer("linear" if kind == "dense" else kind, args, where))
    return layers
