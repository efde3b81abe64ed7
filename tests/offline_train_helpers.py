"""Offline learning in one process, for tests and tuning: a CartPole dataset logged by a behaviour
policy with epsilon-random actions (`behaviour_dataset`), an offline algorithm's learner fed
uniform batches of its rows (`train_offline`), and greedy evaluation episodes of its acting
module (`evaluate`). What the runtime does across processes, without them."""

from __future__ import annotations

import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
from apex_helpers import make_config

from aiorl.algos import get_algorithm
from aiorl.envs import env_spec
from aiorl.offline.dataset import Dataset
from aiorl.offline.rows import offline_rows

ROOT = Path(__file__).resolve().parents[1]
CARTPOLE_BEHAVIOUR = ROOT / "examples" / "policies" / "cartpole_dqn_200" / "policy.safetensors"


def behaviour_dataset(
    rows: int = 100_000, epsilon: float = 0.3, seed: int = 0, policy=CARTPOLE_BEHAVIOUR, env_id: str = "CartPole-v1"
) -> tuple[Dataset, float]:
    """`rows` transitions of `policy` (a policy file, or a callable obs batch -> actions) taking a
    uniform random action with probability `epsilon`, 16 envs at once, whole episodes in order
    (the last cut short, marked truncated); and the mean return of the episodes that ended."""
    from aiorl import load_policy

    act = load_policy(policy) if isinstance(policy, (str, Path)) else policy
    envs = [gym.make(env_id) for _ in range(16)]
    rng = np.random.default_rng(seed)
    obs = np.stack([env.reset(seed=seed * 1000 + i)[0] for i, env in enumerate(envs)])
    open_eps: list[list[tuple]] = [[] for _ in envs]
    done_eps: list[list[tuple]] = []
    returns: list[float] = []
    n_actions = envs[0].action_space.n
    while sum(len(e) for e in done_eps) < rows:
        greedy = np.asarray(act(obs.astype(np.float32)))
        explore = rng.random(len(envs)) < epsilon
        actions = np.where(explore, rng.integers(0, n_actions, len(envs)), greedy)
        for i, env in enumerate(envs):
            next_obs, reward, terminated, truncated, _ = env.step(int(actions[i]))
            open_eps[i].append((obs[i].copy(), int(actions[i]), reward, next_obs, terminated, truncated))
            if terminated or truncated:
                done_eps.append(open_eps[i])
                returns.append(sum(step[2] for step in open_eps[i]))
                open_eps[i] = []
                next_obs, _ = env.reset()
            obs[i] = next_obs
    steps = [step for episode in done_eps for step in episode][:rows]
    obs_a, action, reward, next_obs, terminated, truncated = (np.array(x) for x in zip(*steps))
    truncated[-1] = not terminated[-1]
    dataset = Dataset(
        obs=obs_a.astype(np.float32),
        action=action.astype(np.int64),
        reward=reward.astype(np.float32),
        next_obs=next_obs.astype(np.float32),
        terminated=terminated.astype(bool),
        truncated=truncated.astype(bool),
        observation_space=envs[0].observation_space,
        action_space=envs[0].action_space,
        env_id=env_id,
        source="in-process behaviour",
        format="aiorl",
    )
    return dataset, float(np.mean(returns))


def offline_algorithm(name: str, model: dict | None = None, env_id: str = "CartPole-v1", **sections):
    """Algorithm `name` built for `env_id`'s spaces, its config naming a dataset no test reads."""
    cfg = make_config(name, env_id, model, offline={"dataset": "unused-in-these-tests"}, **sections)
    return get_algorithm(name)(cfg, env_spec(cfg.env))


def train_offline(algo, dataset: Dataset, steps: int, batch_size: int = 256, seed: int = 0):
    """`algo`'s learner after `steps` steps on uniform batches of the dataset's rows (the fields of
    its transition spec, as a dataset store serves them); also the seconds it took."""
    m = algo.cfg.model
    rows = offline_rows(dataset, 0, len(dataset), n_step=getattr(m, "n_step", 1), gamma=getattr(m, "gamma", 0.99))
    spec = algo.transition_spec()
    learner = algo.make_learner(0, 1, seed)
    rng = np.random.default_rng(seed)
    t0 = time.perf_counter()
    for _ in range(steps):
        index = rng.integers(0, len(dataset), batch_size)
        learner.step({name: np.asarray(rows[name][index], dtype=spec[name][1]) for name in spec})
    return learner, time.perf_counter() - t0


def evaluate(module, env_id: str = "CartPole-v1", episodes: int = 20, seed: int = 10_000) -> list[float]:
    """Returns of `episodes` episodes of the acting module (obs batch -> actions), one env each."""
    env = gym.make(env_id)
    returns = []
    for episode in range(episodes):
        obs, _ = env.reset(seed=seed + episode)
        total, done = 0.0, False
        while not done:
            with torch.no_grad():
                action = module(torch.as_tensor(np.asarray(obs, np.float32)[None]))[0].numpy()
            obs, reward, terminated, truncated, _ = env.step(action.item() if action.ndim == 0 else action)
            total += float(reward)
            done = terminated or truncated
        returns.append(total)
    return returns
