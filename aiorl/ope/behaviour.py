"""The behaviour policy's probability of each logged action, pi_b(a_t|s_t).

From the dataset's ``propensity`` when it records one (``aiorl collect`` does): exact, and the
estimators that assume it (IPS, DR) are unbiased. Else from a behaviour-cloning model fitted to
the dataset's (obs, action) pairs, as EasyRL's BCQ demo estimates it (its generative head): a
softmax MLP trained by cross-entropy. An estimated pi_b biases every estimator by how far it
is from the true one; its probabilities are floored at `MIN_PROBABILITY` so that one action the
model finds unlikely cannot take an episode's whole weight.
"""

from __future__ import annotations

import numpy as np

from aiorl.offline.dataset import Dataset
from aiorl.ope.networks import batches, flat, mlp

MIN_PROBABILITY = 1e-3
RECORDED = "recorded"  # the dataset's propensity column
CLONED = "behaviour cloning"  # a model fitted to the dataset


def behaviour_probabilities(
    dataset: Dataset, n_actions: int, *, seed: int = 0, steps: int = 2000, batch_size: int = 1024
) -> tuple[np.ndarray, str]:
    """([N] pi_b(a_t|s_t), where they came from: RECORDED or CLONED)."""
    if dataset.propensity is not None:
        return np.asarray(dataset.propensity, np.float64), RECORDED
    probs = cloned_probabilities(dataset, n_actions, seed=seed, steps=steps, batch_size=batch_size)
    return probs[np.arange(len(dataset)), dataset.action], CLONED


def cloned_probabilities(
    dataset: Dataset, n_actions: int, *, seed: int = 0, steps: int = 2000, batch_size: int = 1024
) -> np.ndarray:
    """[N, n_actions]: a behaviour-cloning model's probabilities at every row's observation."""
    import torch

    obs = flat(dataset.obs)
    actions = torch.as_tensor(np.asarray(dataset.action, np.int64))
    model = mlp(obs.shape[1], n_actions, seed=seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    for idx in batches(np.random.default_rng(seed), len(obs), batch_size, steps):
        loss = torch.nn.functional.cross_entropy(model(obs[idx]), actions[idx])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        probs = torch.softmax(model(obs), dim=1).numpy().astype(np.float64)
    probs = np.maximum(probs, MIN_PROBABILITY)
    return probs / probs.sum(axis=1, keepdims=True)
