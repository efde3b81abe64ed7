"""The per-actor vector of environments: stepped together, reset as each ends, with the
episodes' returns and lengths."""

from __future__ import annotations

from collections.abc import Callable

import gymnasium as gym
import numpy as np

from aiorl.config import EnvConfig
from aiorl.envs.atari import AleVectorEnvs
from aiorl.envs.make import make_env


def _records_statistics(env: gym.Env) -> bool:
    """Whether the env reports its episodes in ``info["episode"]`` (RecordEpisodeStatistics)."""
    while isinstance(env, gym.Wrapper):
        if isinstance(env, gym.wrappers.RecordEpisodeStatistics):
            return True
        env = env.env
    return False


class GymnasiumEnvs:
    """`num_envs` Gymnasium envs stepped one after another, each reset as soon as it ends.

    `step` has the contract of `aiorl.envs.atari.AleVectorEnvs.step`. An episode's
    return and length come from ``info["episode"]`` where the env records
    them (the Atari preset does, over full games), else from the rewards seen.
    """

    def __init__(self, env_cfg: EnvConfig, num_envs: int):
        self.envs = [make_env(env_cfg) for _ in range(num_envs)]
        self.from_info = [_records_statistics(env) for env in self.envs]
        self.single_observation_space = self.envs[0].observation_space
        self.episode_return = np.zeros(num_envs, np.float64)
        self.episode_length = np.zeros(num_envs, np.int64)

    def reset(self, seed: int) -> np.ndarray:
        first = [env.reset(seed=seed + i)[0] for i, env in enumerate(self.envs)]
        for i, env in enumerate(self.envs):
            env.action_space.seed(seed + 10_007 * (i + 1))
        return np.stack(first)

    def step(self, actions: np.ndarray):
        n = len(self.envs)
        next_obs = [None] * n
        rewards = np.empty(n, np.float32)
        terminated = np.empty(n, np.bool_)
        truncated = np.empty(n, np.bool_)
        reset_obs = {}
        games = []
        for i, env in enumerate(self.envs):
            obs, reward, term, trunc, info = env.step(actions[i])
            next_obs[i] = obs
            rewards[i] = reward
            terminated[i] = term
            truncated[i] = trunc
            self.episode_return[i] += reward
            self.episode_length[i] += 1
            if self.from_info[i]:
                if "episode" in info:
                    games.append((float(info["episode"]["r"]), int(info["episode"]["l"])))
            elif term or trunc:
                games.append((float(self.episode_return[i]), int(self.episode_length[i])))
            if term or trunc:
                self.episode_return[i] = 0.0
                self.episode_length[i] = 0
                reset_obs[i] = env.reset()[0]
        return next_obs, rewards, terminated, truncated, reset_obs, games

    def close(self) -> None:
        for env in self.envs:
            env.close()


def make_vector(env_cfg: EnvConfig, num_envs: int):
    if env_cfg.backend == "ale_vector":
        return AleVectorEnvs(env_cfg, num_envs)
    return GymnasiumEnvs(env_cfg, num_envs)


class EnvRunner:
    """Steps `num_envs` environments in lockstep and records ``[T, num_envs]`` rollouts.

    An env that ends (terminated or truncated) is reset at once; the
    transition keeps the *final* observation as ``next_obs`` so that a
    truncated step can still bootstrap from it, while ``obs`` of the next
    step is the reset observation.

    With a `frames` sender (`aiorl.replay.frame_sender.FrameSender`), the
    rollout's ``obs`` and ``next_obs`` are ``[T, num_envs, k]`` frame ids
    instead of stacked frames; the policy still acts on the stacks.
    """

    def __init__(self, env_cfg: EnvConfig, num_envs: int, seed: int, frames=None):
        self.envs = make_vector(env_cfg, num_envs)
        self.obs = self.envs.reset(seed)
        self.frames = frames
        if frames is not None:
            self.refs = np.stack([frames.fresh(stack) for stack in self.obs])
            frames.note_current(self.refs)
        self.finished_returns: list[float] = []
        self.finished_lengths: list[int] = []
        self.env_steps = 0

    def rollout(
        self,
        act: Callable[[np.ndarray], np.ndarray],
        steps: int,
        begin: Callable[[np.ndarray], None] | None = None,
    ) -> dict[str, np.ndarray]:
        """`steps` steps of every env; `begin` (optional) hears which envs were reset after a step
        (bool [num_envs]) before the next `act`: a recurrent policy resets their state."""
        n = len(self.obs)
        frames = self.frames
        if frames is None:
            obs_buf = np.empty((steps, n) + self.obs.shape[1:], self.obs.dtype)
        else:
            obs_buf = np.empty((steps,) + self.refs.shape, np.int64)
        next_buf = np.empty_like(obs_buf)
        rewards = np.empty((steps, n), np.float32)
        terminated = np.empty((steps, n), np.bool_)
        truncated = np.empty((steps, n), np.bool_)
        actions = None
        for t in range(steps):
            obs_buf[t] = self.obs if frames is None else self.refs
            action = np.asarray(act(self.obs))
            if actions is None:
                actions = np.empty((steps,) + action.shape, action.dtype)
            actions[t] = action
            next_obs, rewards[t], terminated[t], truncated[t], reset_obs, games = self.envs.step(action)
            for i in range(n):
                if frames is None:
                    next_buf[t, i] = next_obs[i]
                else:
                    next_buf[t, i] = frames.advance(self.refs[i], self.obs[i], next_obs[i])
                if i in reset_obs:
                    self.obs[i] = reset_obs[i]
                    if frames is not None:
                        self.refs[i] = frames.fresh(reset_obs[i])
                else:
                    self.obs[i] = next_obs[i]
                    if frames is not None:
                        self.refs[i] = next_buf[t, i]
            if frames is not None:
                frames.note_current(self.refs)
            if begin is not None and reset_obs:
                started = np.zeros(n, np.bool_)
                started[list(reset_obs)] = True
                begin(started)
            for ret, length in games:
                self.finished_returns.append(ret)
                self.finished_lengths.append(length)
        self.env_steps += steps * n
        return {
            "obs": obs_buf,
            "action": actions,
            "reward": rewards,
            "next_obs": next_buf,
            "terminated": terminated,
            "truncated": truncated,
        }

    def pop_episodes(self) -> tuple[list[float], list[int]]:
        returns, lengths = self.finished_returns, self.finished_lengths
        self.finished_returns, self.finished_lengths = [], []
        return returns, lengths

    def close(self) -> None:
        self.envs.close()
