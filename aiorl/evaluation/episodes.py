"""Greedy episodes of a policy: one after another (video, progress) or side by side.

A recurrent policy (one with a ``state_size``: an exported program `aiorl.io.export` loaded,
or `aiorl.algos.lib.actor_critic.RecurrentPolicy`) is called ``(obs, state) -> (action, state)``;
each episode's state starts at zeros and is carried step to step.
"""

from __future__ import annotations

import numpy as np

from aiorl.config import EnvConfig
from aiorl.evaluation.options import record_episodes, render_env_config


def run_episodes(
    policy,
    env_cfg: EnvConfig,
    episodes: int,
    seed: int,
    progress=None,
    video_dir: str | None = None,
    render: bool = False,
) -> dict:
    """Run `episodes` greedy episodes of `policy` (obs batch -> action batch), one after another."""
    import torch

    from aiorl.envs import make_env  # looked up at the call (tests stand in a renderless make_env)

    # The preset's evaluation variant: full games, raw rewards.
    env = record_episodes(make_env(render_env_config(env_cfg, video_dir, render), evaluation=True), video_dir)
    returns, lengths = [], []
    try:
        discrete = hasattr(env.action_space, "n")
        state_size = getattr(policy, "state_size", 0)
        for k in range(episodes):
            obs, _ = env.reset(seed=seed + k)
            total, length, done = 0.0, 0, False
            state = torch.zeros(1, state_size)
            while not done:
                with torch.no_grad():
                    if state_size:
                        action, state = policy(torch.as_tensor(np.asarray(obs)[None]), state)
                    else:
                        action = policy(torch.as_tensor(np.asarray(obs)[None]))
                    action = action[0].numpy()
                action = int(action) if discrete else action.reshape(env.action_space.shape)
                obs, reward, terminated, truncated, _ = env.step(action)
                total += float(reward)
                length += 1
                done = terminated or truncated
            returns.append(total)
            lengths.append(length)
            if progress is not None:
                progress(k + 1, episodes, total)
    finally:
        env.close()
    return summarize(returns, lengths)


def run_episodes_together(policy, env_cfg: EnvConfig, episodes: int, seed: int, stop=None) -> dict | None:
    """`run_episodes` without video or progress, the episodes stepped side by side: one policy call per
    step for every episode still running (a call costs far more than an env step: an exported program
    checks its inputs in Python). Episode k is reset with seed `seed` + k, as in `run_episodes`.

    `stop` (a threading.Event): set, the episodes end at the next step and the result is None.
    """
    import torch

    from aiorl.envs import make_env

    envs = [make_env(env_cfg, evaluation=True) for _ in range(episodes)]
    try:
        discrete = hasattr(envs[0].action_space, "n")
        obs = [np.asarray(env.reset(seed=seed + k)[0]) for k, env in enumerate(envs)]
        returns, lengths = [0.0] * episodes, [0] * episodes
        running = list(range(episodes))
        state_size = getattr(policy, "state_size", 0)
        states = torch.zeros(episodes, state_size)  # a recurrent policy's, per episode
        while running:
            if stop is not None and stop.is_set():
                return None
            with torch.no_grad():
                batch = torch.as_tensor(np.stack([obs[k] for k in running]))
                if state_size:
                    actions, states[running] = policy(batch, states[running])
                else:
                    actions = policy(batch)
                actions = actions.numpy()
            still = []
            for k, action in zip(running, actions):
                action = int(action) if discrete else action.reshape(envs[k].action_space.shape)
                o, reward, terminated, truncated, _ = envs[k].step(action)
                obs[k] = np.asarray(o)
                returns[k] += float(reward)
                lengths[k] += 1
                if not (terminated or truncated):
                    still.append(k)
            running = still
    finally:
        for env in envs:
            env.close()
    return summarize(returns, lengths)


def summarize(returns: list[float], lengths: list[int]) -> dict:
    r = np.asarray(returns, np.float64)
    return {
        "episodes": len(returns),
        "mean": float(r.mean()),
        "std": float(r.std()),
        "min": float(r.min()),
        "max": float(r.max()),
        "length_mean": float(np.mean(lengths)),
        "returns": returns,
        "lengths": lengths,
    }
