"""`aiorl collect SOURCE -o DIR --episodes N`: log a behaviour policy's episodes as a dataset.

SOURCE is a run directory (its best policy, as `aiorl eval` picks it), a policy (a
``policy.safetensors`` file, or a directory holding one), or ``random`` with ``--env ID``. The
behaviour is the policy's greedy action, mixed with uniformly random actions with probability
``--epsilon``, and for Box actions perturbed by Gaussian noise of standard deviation ``--noise``
(then clipped to the space). Each step records the behaviour's probability of the action it took
(its density, for Box actions), so that off-policy evaluation needs no estimate of it:

    Discrete: (1 - eps) * [a == greedy] + eps / n
    Box:      (1 - eps) * N(a_raw; greedy, noise^2) + eps / volume(space)

where a_raw is the noisy action before it is clipped (a clipped action's density is its
unclipped draw's). A Box policy with neither noise nor epsilon is deterministic: no propensity.

Episodes run side by side on up to `LANES` envs, one policy call a step for all of them;
episode k is reset with seed ``SEED + k``.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from aiorl.config import EnvConfig
from aiorl.evaluation.policies import EvalError, choose_policy, load_checked, read_meta
from aiorl.experiment.loading import load_config
from aiorl.io.export import policy_file
from aiorl.io.policy_data import WEIGHTS_FILE
from aiorl.offline.dataset import Dataset
from aiorl.offline.formats import write_dataset
from aiorl.offline.formats.minari_data import ID_RE, require_minari

LANES = 64  # envs stepped together: a policy call costs far more than a CartPole step
PROGRESS_EVERY_S = 3.0


class CollectError(RuntimeError):
    """A collection that cannot start: one line for the user (exit 2)."""


@dataclass
class Behaviour:
    """Greedy actions from `greedy` (None: uniformly random), mixed and perturbed as the module
    says; `act` returns the actions taken and their propensities (None: deterministic)."""

    action_space: object
    greedy: object = None  # obs batch -> greedy actions, or None
    epsilon: float = 0.0
    noise: float = 0.0
    rng: np.random.Generator = field(default_factory=np.random.default_rng)

    def __post_init__(self):
        self.discrete = hasattr(self.action_space, "n")
        if self.greedy is None:
            self.epsilon = 1.0

    def _greedy(self, obs: np.ndarray) -> np.ndarray:
        import torch

        with torch.inference_mode():
            return np.asarray(self.greedy(torch.as_tensor(obs)))

    def act(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        rows = len(obs)
        explore = self.rng.random(rows) < self.epsilon
        if self.discrete:
            n = int(self.action_space.n)
            start = int(getattr(self.action_space, "start", 0))
            uniform = self.rng.integers(start, start + n, rows)
            if self.greedy is None:
                return uniform.astype(np.int64), np.full(rows, 1.0 / n)
            greedy = self._greedy(obs).reshape(rows).astype(np.int64)
            action = np.where(explore, uniform, greedy)
            return action, (1 - self.epsilon) * (action == greedy) + self.epsilon / n
        return self._act_box(obs, explore)

    def _act_box(self, obs: np.ndarray, explore: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        space = self.action_space
        rows, shape = len(obs), tuple(space.shape)
        low, high = space.low.astype(np.float64), space.high.astype(np.float64)
        uniform = self.rng.uniform(low, high, (rows, *shape))
        volume = float(np.prod(high - low))
        if self.greedy is None:
            return uniform.astype(np.float32), np.full(rows, 1.0 / volume)
        mean = self._greedy(obs).reshape(rows, *shape).astype(np.float64)
        raw = mean + self.noise * self.rng.standard_normal(mean.shape) if self.noise > 0 else mean
        drawn = np.where(explore.reshape(rows, *([1] * len(shape))), uniform, raw)
        action = np.clip(drawn, low, high)
        if self.noise <= 0 and self.epsilon <= 0:
            return action.astype(np.float32), None
        # the mixture's density at the draw (before clipping); without noise the greedy part is a
        # point mass, so only the uniform part has a density
        density = np.full(rows, self.epsilon / volume)
        if self.noise > 0:
            z = ((drawn - mean) / self.noise).reshape(rows, -1)
            density += (
                (1 - self.epsilon) * np.exp(-0.5 * (z**2).sum(1)) / (np.sqrt(2 * np.pi) * self.noise) ** z.shape[1]
            )
        return action.astype(np.float32), density


def _policy_path(source: Path) -> tuple[Path, str]:
    """The policy file SOURCE names, and which it is."""
    if source.is_dir() and (source / "config.yaml").is_file():
        path, which, _ = choose_policy(source, None)
        return path, which
    if source.is_dir():
        path = policy_file(source)
        if not path.is_file() and (source / WEIGHTS_FILE).is_file():
            path = source / WEIGHTS_FILE
        return path, "file"
    return source, "file"


def resolve_source(source: str, env_id: str | None) -> tuple[object, EnvConfig, str]:
    """(the greedy policy or None for random, the env to collect on, a description)."""
    if source == "random":
        if env_id is None:
            raise CollectError("SOURCE random needs --env ID (the env whose actions it draws)")
        return None, EnvConfig(id=env_id), f"uniformly random actions on {env_id}"
    path = Path(source)
    if not path.exists():
        raise CollectError(f"{source}: no such run directory or policy file (or 'random' with --env ID)")
    run_env = None
    if path.is_dir() and (path / "config.yaml").is_file():
        run_env = load_config(path / "config.yaml").env
    policy_path, which = _policy_path(path)
    if not policy_path.is_file():
        raise CollectError(f"{source}: no policy there ({policy_path} does not exist)")
    meta = read_meta(policy_path) or {}
    if env_id is not None:
        env_cfg = EnvConfig(id=env_id)
    elif run_env is not None:
        env_cfg = run_env
    elif isinstance(meta.get("env_id"), str):
        env_cfg = EnvConfig(id=meta["env_id"])
    else:
        raise CollectError(f"{policy_path}: its policy.json names no env: give --env ID")
    greedy = load_checked(policy_path, env_cfg)  # refuses a policy made for another env's observations
    if getattr(greedy, "state_size", 0):
        raise CollectError(f"{policy_path}: a recurrent policy; aiorl collect logs feed-forward policies only")
    return greedy, env_cfg, f"the {which} policy {policy_path}"


@dataclass
class Episodes:
    """Rows of finished episodes, each contiguous, in the order they finished."""

    rows: dict[str, list] = field(default_factory=lambda: {k: [] for k in FIELDS})
    returns: list[float] = field(default_factory=list)

    def add(self, lane: dict[str, list]) -> None:
        for k in FIELDS:
            self.rows[k].extend(lane[k])
        self.returns.append(float(np.sum(lane["reward"])))


FIELDS = ("obs", "action", "reward", "next_obs", "terminated", "truncated", "propensity")


def _empty_lane() -> dict[str, list]:
    return {k: [] for k in FIELDS}


def run_collection(behaviour: Behaviour, env_cfg: EnvConfig, episodes: int, seed: int, progress=None) -> Episodes:
    """`episodes` episodes of `behaviour` on `env_cfg`'s env, up to `LANES` at a time."""
    from aiorl.envs import make_env

    lanes = min(LANES, episodes)
    envs = [make_env(env_cfg, evaluation=True) for _ in range(lanes)]
    done = Episodes()
    started = 0
    obs, buf, live = [None] * lanes, [_empty_lane() for _ in range(lanes)], []
    for k in range(lanes):
        obs[k] = np.asarray(envs[k].reset(seed=seed + started)[0])
        started += 1
        live.append(k)
    try:
        while live:
            actions, probs = behaviour.act(np.stack([obs[k] for k in live]))
            still = []
            for j, k in enumerate(live):
                a = int(actions[j]) if behaviour.discrete else actions[j]
                nxt, reward, terminated, truncated, _ = envs[k].step(a)
                nxt = np.asarray(nxt)
                lane = buf[k]
                for name, value in zip(FIELDS, (obs[k], actions[j], reward, nxt, terminated, truncated)):
                    lane[name].append(value)
                lane["propensity"].append(np.nan if probs is None else probs[j])
                obs[k] = nxt
                if not (terminated or truncated):
                    still.append(k)
                    continue
                done.add(lane)
                buf[k] = _empty_lane()
                if progress is not None:
                    progress(len(done.returns), len(done.rows["reward"]))
                if started < episodes:
                    obs[k] = np.asarray(envs[k].reset(seed=seed + started)[0])
                    started += 1
                    still.append(k)
            live = still
    finally:
        for env in envs:
            env.close()
    return done


def as_dataset(done: Episodes, spaces, env_id: str, source: str, recorded: bool) -> Dataset:
    observation_space, action_space = spaces
    r = done.rows
    discrete = hasattr(action_space, "n")
    obs_dtype = np.dtype(getattr(observation_space, "dtype", None) or np.float32)
    return Dataset(
        obs=np.asarray(r["obs"], obs_dtype),
        action=np.asarray(r["action"], np.int64 if discrete else np.float32),
        reward=np.asarray(r["reward"], np.float32),
        next_obs=np.asarray(r["next_obs"], obs_dtype),
        terminated=np.asarray(r["terminated"], bool),
        truncated=np.asarray(r["truncated"], bool),
        observation_space=observation_space,
        action_space=action_space,
        propensity=np.asarray(r["propensity"], np.float64) if recorded else None,
        env_id=env_id,
        source=source,
        format="aiorl",
    )


def check_output(out: Path, fmt: str) -> None:
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise CollectError(f"-o {out}: exists and is not an empty directory; name a new one")
    if fmt == "minari":
        require_minari()
        if not ID_RE.match(out.name):
            raise CollectError(f"-o {out}: a Minari dataset's directory is named as its id, NAME-vN (e.g. cartpole-v0)")


def collect(
    source: str,
    out: str | Path,
    episodes: int,
    *,
    epsilon: float = 0.0,
    env_id: str | None = None,
    seed: int = 0,
    fmt: str = "aiorl",
    noise: float = 0.0,
    progress=None,
) -> dict:
    """Collect and write the dataset; a summary of what was written."""
    from aiorl.envs import env_spec

    out = Path(out)
    if episodes < 1:
        raise CollectError(f"--episodes must be at least 1, got {episodes}")
    if not 0.0 <= epsilon <= 1.0:
        raise CollectError(f"--epsilon must be in [0, 1], got {epsilon}")
    if noise < 0:
        raise CollectError(f"--noise must be >= 0, got {noise}")
    check_output(out, fmt)
    greedy, env_cfg, described = resolve_source(source, env_id)
    spec = env_spec(env_cfg)
    if noise > 0 and hasattr(spec.action_space, "n"):
        raise CollectError(
            f"--noise is for Box actions; {env_cfg.id} has Discrete({spec.action_space.n}): use --epsilon"
        )
    import torch

    torch.set_num_threads(1)
    behaviour = Behaviour(spec.action_space, greedy, epsilon, noise, np.random.default_rng(seed))
    t0 = time.perf_counter()
    done = run_collection(behaviour, env_cfg, episodes, seed, progress)
    recorded = not np.isnan(np.asarray(done.rows["propensity"], np.float64)).any()
    dataset = as_dataset(done, (spec.observation_space, spec.action_space), env_cfg.id, described, recorded)
    collected = {
        "by": "aiorl collect",
        "source": source,
        "behaviour": described,
        "epsilon": behaviour.epsilon,
        "noise": noise,
        "seed": seed,
        "episodes": episodes,
        "return_mean": float(np.mean(done.returns)),
        "propensity": "recorded" if recorded else "none (a deterministic Box policy)",
    }
    write_dataset(dataset, out, fmt, collected)
    returns = np.asarray(done.returns)
    return {
        "out": str(out),
        "format": fmt,
        "env": env_cfg.id,
        "behaviour": described,
        "episodes": len(returns),
        "rows": len(dataset),
        "return_mean": float(returns.mean()),
        "return_std": float(returns.std()),
        "propensity": recorded,
        "seconds": round(time.perf_counter() - t0, 3),
    }


def format_summary(s: dict) -> str:
    return (
        f"collected {s['episodes']} episodes, {s['rows']:,} rows on {s['env']} from {s['behaviour']} "
        f"in {s['seconds']:.1f} s\nbehaviour return mean {s['return_mean']:.2f}  std {s['return_std']:.2f}; "
        f"propensities {'recorded' if s['propensity'] else 'not recorded (deterministic)'}; "
        f"written to {s['out']} ({s['format']} format)"
    )


def progress_printer(total: int, every_s: float = PROGRESS_EVERY_S, stream=None):
    """A progress callback printing a line to stderr at most every `every_s` seconds."""
    stream = stream or sys.stderr
    last = [time.monotonic()]

    def progress(episodes: int, rows: int) -> None:
        now = time.monotonic()
        if now - last[0] >= every_s or episodes == total:
            last[0] = now
            print(f"collect: {episodes}/{total} episodes, {rows:,} rows", file=stream, flush=True)

    return progress


__all__ = ["Behaviour", "CollectError", "EvalError", "collect", "format_summary", "progress_printer"]
