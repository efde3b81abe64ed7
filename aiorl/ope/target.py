"""The target policy's action probabilities pi_e(a|s) on a dataset's observations.

A policy aiorl exports is greedy (obs batch -> one action each): pi_e gives its action
probability 1. ``epsilon`` evaluates it epsilon-greedy instead, as it would act with
exploration: 1 - epsilon + epsilon / n for its action, epsilon / n for each other one. A greedy
target (epsilon 0) gives weight 0 to every episode that leaves its action once, so the
whole-episode estimators (IPS, WIPS) see few episodes; the per-decision ones fare better.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np


class OpeError(ValueError):
    """A user's mistake (a dataset or policy off-policy evaluation cannot use): one line."""


_BATCH = 4096


def greedy_actions(policy: Callable, obs: np.ndarray) -> np.ndarray:
    """The policy's action for each observation ([N] int64), in batches, without gradients."""
    import torch

    out = []
    with torch.no_grad():
        for lo in range(0, len(obs), _BATCH):
            actions = policy(torch.as_tensor(np.asarray(obs[lo : lo + _BATCH])))
            out.append(np.asarray(actions.cpu() if hasattr(actions, "cpu") else actions).reshape(-1))
    return np.concatenate(out).astype(np.int64) if out else np.zeros(0, np.int64)


def epsilon_greedy(actions: np.ndarray, n_actions: int, epsilon: float) -> np.ndarray:
    """[N, n_actions]: the epsilon-greedy probabilities around `actions`."""
    if not 0.0 <= epsilon <= 1.0:
        raise OpeError(f"--target-epsilon: expected 0..1, got {epsilon}")
    if len(actions) and (actions.min() < 0 or actions.max() >= n_actions):
        raise OpeError(f"the policy chose an action outside 0..{n_actions - 1}: is it made for this dataset's env?")
    probs = np.full((len(actions), n_actions), epsilon / n_actions)
    probs[np.arange(len(actions)), actions] += 1.0 - epsilon
    return probs


def target_probabilities(policy: Callable, obs: np.ndarray, n_actions: int, epsilon: float) -> np.ndarray:
    """[N, n_actions]: pi_e(.|obs) of `policy` (greedy) made `epsilon`-greedy."""
    return epsilon_greedy(greedy_actions(policy, obs), n_actions, epsilon)
