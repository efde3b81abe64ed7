"""`env.wrappers`, `env.preset` and `env.backend`: what is built around `gymnasium.make`.

``env.wrappers`` is a list applied in order on top of the env (and of the
preset's wrappers, if any). Each item is a wrapper name, or a one-key mapping
from a name to its keyword arguments::

    wrappers:
      - {AtariPreprocessing: {frame_skip: 1}}
      - {FrameStackObservation: {stack_size: 4}}
      - ClipReward: {min_reward: -1, max_reward: 1}
      - RecordEpisodeStatistics

Names are the Gymnasium wrappers (`gymnasium.wrappers`) plus aiorl's own
(`EpisodicLife`; `mask_velocity`, which removes the velocity entries of CartPole, Pendulum,
MountainCar and LunarLander observations: `aiorl.envs.mask_velocity`). Everything is checked when the config
loads: an unknown name or a keyword the wrapper does not take is one error naming the item
(``env.wrappers[1].FrameStackObservation``). The wrappers apply in training
and in `aiorl eval` alike; the preset's training-only parts (reward
clipping, life loss) are the preset's business.
"""

from __future__ import annotations

import inspect

import gymnasium as gym

from aiorl.config import ConfigError
from aiorl.core.suggest import did_you_mean
from aiorl.envs import atari
from aiorl.envs.mask_velocity import NAME as MASK_VELOCITY
from aiorl.envs.mask_velocity import MaskVelocity


def _aiorl_wrappers() -> dict[str, type]:
    return {"EpisodicLife": atari.EpisodicLife, MASK_VELOCITY: MaskVelocity}


def wrapper_class(name: str, where: str) -> type:
    """The wrapper class called `name`: aiorl's own, or one of `gymnasium.wrappers`."""
    own = _aiorl_wrappers()
    if name in own:
        return own[name]
    names = [n for n in getattr(gym.wrappers, "__all__", []) if n[:1].isupper()]
    if name in names:
        try:
            # Gymnasium imports some wrappers lazily, with optional dependencies of their own.
            cls = getattr(gym.wrappers, name)
        except (ImportError, gym.error.DependencyNotInstalled) as exc:
            raise ConfigError(f"{where}: Gymnasium's {name} cannot be imported here: {exc}") from None
        if isinstance(cls, type) and issubclass(cls, gym.Wrapper):
            return cls
    hint = did_you_mean(name, names + list(own))
    raise ConfigError(
        f"{where}: unknown wrapper {name!r}{hint} (the names in gymnasium.wrappers, EpisodicLife and mask_velocity)"
    )


def _split(item, where: str) -> tuple[str, dict]:
    if isinstance(item, str):
        return item, {}
    if isinstance(item, dict) and len(item) == 1:
        ((name, kwargs),) = item.items()
        if kwargs is None:
            kwargs = {}
        if isinstance(name, str) and isinstance(kwargs, dict):
            return name, dict(kwargs)
    raise ConfigError(f"{where}: expected a wrapper name or {{Name: {{keyword: value}}}}, got {item!r}")


def wrapper_names(items) -> list[str]:
    """The names in an `env.wrappers` list (items that are not wrappers are skipped)."""
    names = []
    for item in items or []:
        try:
            names.append(_split(item, "")[0])
        except ConfigError:
            pass
    return names


def parse_wrappers(items, key: str = "env.wrappers") -> list[tuple[type, dict]]:
    """(wrapper class, kwargs) per item, every name and keyword checked; ConfigError names the item."""
    if not isinstance(items, list):
        raise ConfigError(f"{key}: expected a list of wrappers, got {items!r}")
    parsed = []
    for i, item in enumerate(items):
        name, kwargs = _split(item, f"{key}[{i}]")
        where = f"{key}[{i}].{name}"
        cls = wrapper_class(name, f"{key}[{i}]")
        params = [
            p
            for p in inspect.signature(cls.__init__).parameters.values()
            if p.name not in ("self", "env") and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
        ]
        accepted = {p.name for p in params}
        for kw in kwargs:
            if kw not in accepted:
                hint = did_you_mean(str(kw), sorted(accepted))
                raise ConfigError(f"{where}: unknown keyword {kw!r}{hint} (accepted: {', '.join(sorted(accepted))})")
        missing = [p.name for p in params if p.default is p.empty and p.name not in kwargs]
        if missing:
            raise ConfigError(f"{where}: missing keyword(s) {', '.join(missing)}")
        parsed.append((cls, kwargs))
    return parsed


def apply_wrappers(env: gym.Env, items, key: str = "env.wrappers") -> gym.Env:
    for i, (cls, kwargs) in enumerate(parse_wrappers(items, key)):
        try:
            env = cls(env, **kwargs)
        except (gym.error.Error, TypeError, ValueError, AssertionError) as exc:
            env.close()
            raise ConfigError(f"{key}[{i}].{cls.__name__}: cannot wrap the env: {exc}") from None
    return env
