"""The small networks off-policy evaluation fits (behaviour cloning, fitted Q evaluation): an MLP
on flattened observations, trained on the CPU with a seeded generator."""

from __future__ import annotations

import numpy as np

HIDDEN = (64, 64)


def mlp(n_in: int, n_out: int, hidden: tuple[int, ...] = HIDDEN, seed: int = 0):
    import torch
    from torch import nn

    torch.manual_seed(seed)
    layers: list = []
    for width in hidden:
        layers += [nn.Linear(n_in, width), nn.ReLU()]
        n_in = width
    layers.append(nn.Linear(n_in, n_out))
    return nn.Sequential(*layers)


def flat(obs: np.ndarray):
    """Observations as a float32 [N, features] tensor."""
    import torch

    return torch.as_tensor(np.asarray(obs, np.float32).reshape(len(obs), -1))


def batches(rng: np.random.Generator, rows: int, batch_size: int, steps: int):
    """`steps` index batches drawn uniformly from `rows` rows."""
    for _ in range(steps):
        yield rng.integers(0, rows, size=min(batch_size, rows))
