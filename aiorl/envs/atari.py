"""Atari: the `env.preset: atari` wrapper stack and the native `env.backend: ale_vector`.

The preset is the DeepMind preprocessing (Mnih et al. 2015) on an ALE env
made with ``frameskip=1`` and, unless ``env.kwargs`` says otherwise, no
sticky actions:

- up to ``noop_max`` no-op actions after each reset (a random count),
- repeat each action ``frame_skip`` times, max-pool the last two frames,
- grayscale, resized to ``screen_size`` squared (`gymnasium.wrappers.AtariPreprocessing`),
- the full game's raw return and length recorded (`RecordEpisodeStatistics`:
  what aiorl reports as episode returns),
- training only: a lost life ends the episode (`EpisodicLife`: the game goes
  on, the next episode starts from the current screen) and rewards are
  clipped to [-1, 1],
- ``frame_stack`` frames stacked on a new first axis, a new episode's stack
  padded with its first frame (`FrameStackObservation`).

`aiorl eval` builds the evaluation variant: full games, raw rewards.

``env.backend: ale_vector`` steps the same preset in ale-py's C++
`AtariVectorEnv` (same-step autoreset), with life loss, clipping, stack
padding and episode statistics done here the way the wrappers do them, so
it gives the Gymnasium path's transitions: frame for frame with
``noop_max: 0`` (no-op starts come from each backend's own random numbers).

ale-py and OpenCV come with the ``atari`` extra; without them any of this is
a config error that says to ``pip install 'aiorl[atari]'``.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import gymnasium as gym
import numpy as np

from aiorl.config import ConfigError, build_dataclass, doc
from aiorl.envs.gym import gym_make

INSTALL = "pip install 'aiorl[atari]'"
# AtariVectorEnv arguments that set up threads rather than the game: not for gymnasium.make.
VECTOR_ONLY_KWARGS = ("num_threads", "thread_affinity_offset")
# Set by the preset itself (preset_options); env.kwargs may not override them.
PRESET_KWARGS = ("frameskip",)


@dataclass
class AtariOptions:
    noop_max: int = doc("Most no-op actions after a reset (a random number 1..noop_max; 0: none).", default=30)
    frame_skip: int = doc("Env frames per agent step (the action repeated; the last two max-pooled).", default=4)
    screen_size: int = doc("Frames are resized to screen_size x screen_size grayscale.", default=84)
    frame_stack: int = doc("Frames per observation (stacked on the first axis).", default=4)
    terminal_on_life_loss: bool = doc("Training only: a lost life ends the episode (the game goes on).", default=True)
    clip_rewards: bool = doc("Training only: rewards clipped to [-1, 1].", default=True)


def options(env_cfg) -> AtariOptions:
    return build_dataclass(AtariOptions, dict(env_cfg.preset_options or {}), "env.preset_options")


def require_ale(key: str = "env.id"):
    """ale_py, with the ALE/ ids registered; a ConfigError naming the extra if it is missing."""
    try:
        import ale_py
    except ImportError:
        raise ConfigError(f"{key}: Atari needs ale-py and OpenCV: {INSTALL}") from None
    # The emulator greets every new ALE instance on stderr; keep its errors only.
    ale_py.ALEInterface.setLoggerMode(ale_py.LoggerMode.Error)
    gym.register_envs(ale_py)
    return ale_py


def require_opencv(key: str = "env.preset") -> None:
    try:
        import cv2  # noqa: F401  (AtariPreprocessing resizes with it)
    except ImportError:
        raise ConfigError(f"{key}: the Atari preprocessing needs OpenCV: {INSTALL}") from None


def check_config(env_cfg) -> None:
    """Config-time checks of everything Atari in an env section."""
    require_ale()
    if env_cfg.id not in gym.registry:
        return  # make_env names the unknown id
    if env_cfg.preset == "atari":
        require_opencv()
        o = options(env_cfg)
        for name in ("frame_skip", "screen_size", "frame_stack"):
            if getattr(o, name) < 1:
                raise ConfigError(f"env.preset_options.{name}: must be at least 1, got {getattr(o, name)}")
        if o.noop_max < 0:
            raise ConfigError(f"env.preset_options.noop_max: must be >= 0, got {o.noop_max}")
        for key in PRESET_KWARGS:
            if key in env_cfg.kwargs:
                raise ConfigError(
                    f"env.kwargs.{key}: the atari preset skips frames itself; set env.preset_options.frame_skip instead"
                )
    if env_cfg.backend == "ale_vector":
        if env_cfg.preset != "atari":
            raise ConfigError("env.backend: 'ale_vector' steps the atari preset; set env.preset: atari")
        if gym.spec(env_cfg.id).entry_point != "ale_py.env:AtariEnv":
            raise ConfigError(f"env.backend: 'ale_vector' runs ALE games; {env_cfg.id!r} is not one")
        if env_cfg.wrappers:
            raise ConfigError(
                "env.wrappers: the 'ale_vector' backend cannot apply Gymnasium wrappers (use env.backend: gymnasium)"
            )
        if env_cfg.max_episode_steps is not None:
            raise ConfigError(
                "env.max_episode_steps: not with the 'ale_vector' backend (set env.kwargs.max_num_frames_per_episode)"
            )
        from ale_py.vector_env import AtariVectorEnv

        accepted = set(inspect.signature(AtariVectorEnv.__init__).parameters) & (
            set(VECTOR_ONLY_KWARGS) | {"repeat_action_probability", "full_action_space", "max_num_frames_per_episode"}
        )
        for key in env_cfg.kwargs:
            if key not in accepted:
                raise ConfigError(
                    f"env.kwargs.{key}: not an ale_vector option (accepted: {', '.join(sorted(accepted))})"
                )
    elif any(key in env_cfg.kwargs for key in VECTOR_ONLY_KWARGS):
        bad = next(key for key in VECTOR_ONLY_KWARGS if key in env_cfg.kwargs)
        raise ConfigError(f"env.kwargs.{bad}: an option of env.backend 'ale_vector' only")


class EpisodicLife(gym.Wrapper):
    """A lost life ends the episode (terminated); the game goes on.

    `reset` after a life loss returns the current screen without touching the
    game; after a game over (or with a seed) it resets the game. So training
    sees every life of a game, each as an episode that terminates.
    """

    def __init__(self, env: gym.Env):
        super().__init__(env)
        self.lives = 0
        self.game_over = True
        self._last = None

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.game_over = bool(terminated or truncated)
        lives = self.env.unwrapped.ale.lives()
        if 0 < lives < self.lives:
            terminated = True
        self.lives = lives
        self._last = (obs, info)
        return obs, reward, terminated, truncated, info

    def reset(self, *, seed=None, options=None):
        if self.game_over or seed is not None or self._last is None:
            obs, info = self.env.reset(seed=seed, options=options)
            self.lives = self.env.unwrapped.ale.lives()
            self.game_over = False
            return obs, info
        obs, info = self._last
        return obs, dict(info)


def make_env(env_cfg, evaluation: bool = False) -> gym.Env:
    """The preset's single env: training variant, or the evaluation one (full games, raw rewards)."""
    require_ale()
    require_opencv()
    o = options(env_cfg)
    kwargs = {
        "repeat_action_probability": 0.0,
        **{k: v for k, v in env_cfg.kwargs.items() if k not in VECTOR_ONLY_KWARGS},
        "frameskip": 1,
    }

    env = gym_make(env_cfg.id, kwargs)
    env = gym.wrappers.AtariPreprocessing(
        env,
        noop_max=o.noop_max,
        frame_skip=o.frame_skip,
        screen_size=o.screen_size,
        terminal_on_life_loss=False,
        grayscale_obs=True,
        scale_obs=False,
    )
    if env_cfg.max_episode_steps is not None:
        env = gym.wrappers.TimeLimit(env, env_cfg.max_episode_steps)  # agent steps, not frames
    env = gym.wrappers.RecordEpisodeStatistics(env)
    if not evaluation:
        if o.terminal_on_life_loss:
            env = EpisodicLife(env)
        if o.clip_rewards:
            env = gym.wrappers.ClipReward(env, -1.0, 1.0)
    return gym.wrappers.FrameStackObservation(env, o.frame_stack)


def _pad(stacks: np.ndarray, steps: np.ndarray, k: int) -> None:
    """Padding of FrameStackObservation: an observation `steps` steps into its episode
    (steps < k - 1) repeats the episode's first frame before it, in place."""
    for e in np.flatnonzero(steps < k - 1):
        first = k - 1 - int(steps[e])
        stacks[e, :first] = stacks[e, first]


class AleVectorEnvs:
    """The preset's training transitions from ale-py's native vector env, same-step autoreset.

    `step` returns (next_obs, reward, terminated, truncated, reset_obs, games):
    next_obs[e] is the observation the step led to (the final one where an
    episode ended), reset_obs {e: the next episode's first observation} for
    envs that ended, games [(return, length)] of full games that ended (raw rewards).
    """

    def __init__(self, env_cfg, num_envs: int, evaluation: bool = False):
        require_ale()
        from ale_py.vector_env import AtariVectorEnv

        self.options = o = options(env_cfg)
        self.training = not evaluation
        game = gym.spec(env_cfg.id).kwargs["game"]
        kwargs = {"repeat_action_probability": 0.0, **env_cfg.kwargs}
        self.env = AtariVectorEnv(
            game,
            num_envs,
            noop_max=o.noop_max,
            frameskip=o.frame_skip,
            img_height=o.screen_size,
            img_width=o.screen_size,
            grayscale=True,
            stack_num=o.frame_stack,
            maxpool=True,
            episodic_life=False,
            reward_clipping=False,
            use_fire_reset=False,
            autoreset_mode="SameStep",
            **kwargs,
        )
        self.num_envs = num_envs
        self.k = o.frame_stack
        self.single_observation_space = self.env.single_observation_space
        self.single_action_space = self.env.single_action_space
        self.steps = np.zeros(num_envs, np.int64)  # steps into the current (life-)episode
        self.lives = np.zeros(num_envs, np.int64)
        self.game_return = np.zeros(num_envs, np.float64)
        self.game_length = np.zeros(num_envs, np.int64)

    def reset(self, seed: int) -> np.ndarray:
        obs, info = self.env.reset(seed=np.arange(seed, seed + self.num_envs))
        obs = np.array(obs)
        self.steps[:] = 0
        self.lives[:] = info["lives"]
        self.game_return[:] = 0.0
        self.game_length[:] = 0
        _pad(obs, self.steps, self.k)
        return obs

    def step(self, actions: np.ndarray):
        obs, reward, terminated, truncated, info = self.env.step(np.asarray(actions, np.int64))
        obs = np.array(obs)  # the vector env may reuse its buffers
        reward = np.asarray(reward, np.float64)
        game_over = np.asarray(terminated, bool) | np.asarray(truncated, bool)
        lives = np.asarray(info["lives"], np.int64)
        terminated = np.asarray(terminated, bool).copy()
        truncated = np.asarray(truncated, bool).copy()
        if self.training and self.options.terminal_on_life_loss:
            life_lost = ~game_over & (lives > 0) & (lives < self.lives)
            terminated |= life_lost
        self.lives[:] = lives
        self.game_return += reward
        self.game_length += 1
        games = [(float(self.game_return[e]), int(self.game_length[e])) for e in np.flatnonzero(game_over)]
        self.game_return[game_over] = 0.0
        self.game_length[game_over] = 0
        self.steps += 1
        ended = terminated | truncated
        next_obs = obs.copy() if ended.any() else obs
        if game_over.any():
            next_obs[game_over] = info["final_obs"][game_over]
        _pad(next_obs, self.steps, self.k)
        reset_obs = {}
        for e in np.flatnonzero(ended):
            # A new game starts on its reset screen, a new life on the screen it was lost
            # on: either way a stack of that one frame.
            first = obs[e : e + 1].copy()
            self.steps[e] = 0
            _pad(first, self.steps[e : e + 1], self.k)
            reset_obs[int(e)] = first[0]
        if self.training and self.options.clip_rewards:
            reward = np.clip(reward, -1.0, 1.0)
        return next_obs, reward.astype(np.float32), terminated, truncated, reset_obs, games

    def close(self) -> None:
        self.env.close()
