"""The one evaluation `bench/offline.py` scores both sides with: greedy episodes of a plain
gymnasium env, episode k reset with seed ``seed + k`` (as `aiorl eval` seeds them), in whichever
venv imports it (aiorl's, or the d3rlpy venv's worker, `d3rlpy_worker.py`). It imports numpy and
gymnasium only, so that both venvs run the same code on the same seeds."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

EVAL_SEED = 1_000_000  # evaluation episodes are neither the collection's nor the training's seeds


def greedy_returns(env_id: str, act: Callable[[np.ndarray], np.ndarray], episodes: int, seed: int = EVAL_SEED) -> dict:
    """Mean and spread of `episodes` greedy returns; `act` maps an obs batch [1, ...] to actions [1, ...]."""
    import gymnasium as gym

    env = gym.make(env_id)
    discrete = hasattr(env.action_space, "n")
    returns = []
    try:
        for k in range(episodes):
            obs, _ = env.reset(seed=seed + k)
            total, done = 0.0, False
            while not done:
                action = np.asarray(act(np.asarray(obs, dtype=np.float32)[None]))[0]
                action = int(action) if discrete else action.reshape(env.action_space.shape)
                obs, reward, terminated, truncated, _ = env.step(action)
                total += float(reward)
                done = terminated or truncated
            returns.append(total)
    finally:
        env.close()
    return {"mean": float(np.mean(returns)), "std": float(np.std(returns)), "episodes": episodes}
