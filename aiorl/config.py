"""Typed, validated run configuration.

A run config is YAML (or JSON) with the sections ``algo``, ``env``,
``cluster``, ``agent``, ``model`` and ``run``. Every section is a dataclass
whose fields carry their documentation; loading checks every key and type
and the values that could never work, so a bad config fails before any
process starts, naming the key path (``agent.batch_size``) and, for an
unknown key, the nearest valid name.

The ``model`` section belongs to the algorithm: each algorithm declares its
own dataclass (``Algorithm.model_config``), validated the same way.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import hashlib
import json
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml


class ConfigError(ValueError):
    """A run config that cannot work; the message names the key path."""


def doc(text: str, **kwargs):
    """A dataclass field with its documentation attached (shown by `aiorl config ALGO` and
    `aiorl config keys`: aiorl/config_reference.py)."""
    return field(metadata={"doc": text}, **kwargs)


@dataclass
class EnvConfig:
    id: str = doc("Gymnasium environment id, e.g. CartPole-v1.", default="CartPole-v1")
    num_envs: int = doc("Environments stepped together by each actor.", default=1)
    kwargs: dict = doc("Keyword arguments passed to gymnasium.make.", default_factory=dict)
    max_episode_steps: int | None = doc(
        "Override of the env's time limit (None keeps the registered one).", default=None
    )
    wrappers: list = doc(
        "Gymnasium wrappers applied in order on top of the env: 'Name' or {Name: {keyword: value}} "
        "(see aiorl/env_wrappers.py).",
        default_factory=list,
    )
    preset: str | None = doc(
        "'atari': DeepMind preprocessing of an ALE/ env (training: life loss ends episodes, rewards "
        "clipped; aiorl eval: full games, raw rewards). See aiorl/atari.py.",
        default=None,
    )
    preset_options: dict = doc(
        "Options of the preset, e.g. {noop_max: 0} (aiorl/atari.py AtariOptions).", default_factory=dict
    )
    backend: str = doc(
        "'gymnasium' (each env stepped in Python) or 'ale_vector' (ale-py's native vector env, with env.preset atari).",
        default="gymnasium",
    )


@dataclass
class ClusterConfig:
    actors: int = doc("Number of actor processes.", default=1)
    memories: int = doc("Number of memory hosts; memory 0 also runs the coordinator.", default=1)
    learners: int = doc("Number of learner processes; learner 0 publishes weights.", default=1)
    host: str = doc("Address the coordinator and memory hosts bind to.", default="127.0.0.1")
    port: int = doc("Coordinator port; 0 picks a free one (local runs only).", default=0)
    advertise_host: str | None = doc(
        "Address other hosts use to reach this host's memory server (default: host).", default=None
    )
    heartbeat_interval_s: float = doc("Seconds between a role's heartbeats.", default=0.5)
    heartbeat_timeout_s: float = doc("A role silent this long is declared lost by the coordinator.", default=10.0)
    coordinator_timeout_s: float = doc(
        "A role that cannot reach the coordinator this long exits non-zero.", default=10.0
    )
    start_timeout_s: float = doc("Seconds for every role to register.", default=120.0)
    phase_timeout_s: float = doc("Deadline of each shutdown phase.", default=60.0)
    rendezvous_port: int = doc(
        "Port learner 0 listens on for torch.distributed among learners (0: a free one), on "
        "advertise_host (else host). Unauthenticated: see aiorl/runtime/rendezvous.py.",
        default=0,
    )
    max_restarts: int = doc(
        "Times each actor (and memory host other than 0) is restarted after exiting abnormally; see aiorl/restart.py.",
        default=0,
    )
    restart_backoff_s: float = doc("Wait before a restart, doubled after each quick failure.", default=1.0)
    restart_backoff_max_s: float = doc("Longest wait before a restart.", default=30.0)
    learner_credits: int = doc("Batches a learner may have requested and not yet consumed, per memory.", default=2)
    actor_flush_delay_s: float = doc(
        "Seconds an actor's batch may wait to share one write with its next batches "
        "(fewer syscalls and memory-host wake-ups with cheap envs; 0 sends each at once).",
        default=0.005,
    )
    frame_compression: str = doc(
        "'lz4': actors send their frames (the frame replay layout) as one lz4 block per batch; "
        "'none': raw. See bench/frame_compression.py.",
        default="none",
    )
    max_handshakes: int = doc(
        "Connections a coordinator or memory host lets handshake at once; more are refused (busy).",
        default=128,
    )
    max_handshakes_per_host: int = doc(
        "Of those, how many may come from one address (a flood from one host cannot take them all).",
        default=32,
    )
    tls_cert: str | None = doc("PEM certificate of this host (enables TLS).", default=None)
    tls_key: str | None = doc("PEM private key for tls_cert.", default=None)
    tls_ca: str | None = doc("CA bundle used to verify peers when TLS is on.", default=None)
    launcher: str = doc(
        "'local': every role a child process of `aiorl run`; 'ray': each role placed on a Ray cluster "
        "(`pip install 'aiorl[ray]'`; see aiorl/ray_launcher.py).",
        default="local",
    )
    ray_address: str = doc(
        "Ray cluster to launch on (launcher 'ray'): 'auto', or HOST:PORT of its head.", default="auto"
    )
    resources: dict = doc(
        "Ray resources of each role kind (launcher 'ray'), e.g. {learner: {num_gpus: 1}, actor: {num_cpus: 1}, "
        "memory: {num_cpus: 1, resources: {big_ram: 1}}}; keys num_cpus, num_gpus, memory, resources. "
        "A kind not given takes {num_cpus: 1}.",
        default_factory=dict,
    )


def connect_host(host: str) -> str:
    """Where to connect to reach a server bound to `host` (a wildcard bind means this host)."""
    return "127.0.0.1" if host in ("", "0.0.0.0", "::") else host


@dataclass
class AgentConfig:
    sample_batch_size: int = doc("Env steps per environment in one actor batch.", default=64)
    batch_size: int = doc("Transitions per learner batch.", default=32)
    buffer_size: int = doc("Replay capacity summed over all memory hosts.", default=100_000)
    learning_starts: int = doc("Transitions stored (over all memories) before learners get batches.", default=1000)
    prioritized_replay: bool = doc("Use prioritized replay.", default=True)
    prioritized_replay_alpha: float = doc("Priority exponent alpha.", default=0.6)
    prioritized_replay_beta: float = doc("Importance-sampling exponent beta.", default=0.4)
    prioritized_replay_beta_final: float | None = doc(
        "Anneal beta linearly to this value over the run's schedule: learner steps (all learners) over "
        "scheduled_global_steps or env steps over scheduled_timesteps, whichever ends the run first.",
        default=None,
    )
    prioritized_replay_eps: float = doc("Added to |priority| before the exponent.", default=1e-6)
    scheduled_timesteps: int | None = doc("Stop after this many env steps (all actors).", default=None)
    scheduled_global_steps: int | None = doc("Stop after this many learner steps.", default=None)
    target_return: float | None = doc(
        "Stop once the return reaches this: the mean return of an evaluation during training when "
        "run.eval_every or run.eval_interval_s is set, else the mean of the last 100 training episodes.",
        default=None,
    )
    samples_per_insert: float | None = doc(
        "Rate limit (Reverb's SampleToInsertRatio): each memory keeps sampled transitions near this "
        "x inserted ones, holding back learners when they run ahead and actors (by credits) when "
        "they do; learning_starts is the minimum size. None: no limit (see aiorl/runtime/ratelimit.py).",
        default=None,
    )
    samples_per_insert_tolerance: float = doc(
        "Width of the limiter's band, as a fraction of samples_per_insert x learning_starts (Acme's "
        "samples_per_insert_tolerance_rate); never narrower than one learner and one actor batch.",
        default=0.1,
    )
    max_samples_per_insert: float | None = doc(
        "Replaced by samples_per_insert (it holds back both sides); setting it is an error.", default=None
    )
    sync_interval: int = doc("Actors check for newer weights every this many batches.", default=1)
    replay_layout: str = doc(
        "'frames': stacked-frame observations are sent and stored one frame at a time (obs and next_obs "
        "rebuilt at sample time); 'transitions': every row keeps its own; 'auto': frames when the env "
        "stacks frames (aiorl/replay/frames.py).",
        default="auto",
    )
    publish_interval: int = doc("Learner 0 publishes weights every this many learner steps.", default=10)


@dataclass
class RunSection:
    dir: str | None = doc("Run directory (default runs/<algo>-<env>-<timestamp>).", default=None)
    seed: int = doc("Base seed; every role derives its own from it.", default=0)
    max_seconds: float | None = doc("Stop the run after this many seconds.", default=None)
    log_level: str = doc("Logging level of every role.", default="INFO")
    metrics_interval_s: float = doc("Seconds between metrics.jsonl rows.", default=1.0)
    metrics: bool = doc("Roles report gauges (rates, losses, lag, memory) with their heartbeats.", default=True)
    tensorboard: bool = doc(
        "Also write TensorBoard event files when TensorBoard is installed "
        "(false takes tensorboard out of run.loggers).",
        default=True,
    )
    loggers: list = doc(
        "Where metrics rows go besides metrics.jsonl, each with the resolved config as "
        "hyper-parameters: tensorboard, wandb, mlflow (aiorl/loggers.py; each an extra).",
        default_factory=lambda: ["tensorboard"],
    )
    checkpoint_interval_s: float | None = doc(
        "Learner 0 checkpoints every this many seconds (and at shutdown, and when the run ends "
        "abnormally while it still can); None: only by checkpoint_every.",
        default=60.0,
    )
    checkpoint_every: int | None = doc("Learner 0 also checkpoints every this many of its learner steps.", default=None)
    keep_checkpoints: int = doc("Checkpoint files kept (the newest).", default=3)
    eval_every: int | None = doc(
        "Learner 0 evaluates its current policy every this many of its learner steps (iterations for "
        "dppo/es): run.eval_episodes greedy episodes on envs of its own, off the training path; the "
        "best evaluation's policy is kept in policy/best/ (aiorl/runtime/evaluator.py). None: only by "
        "eval_interval_s.",
        default=None,
    )
    eval_interval_s: float | None = doc(
        "Learner 0 also evaluates every this many seconds. None (and eval_every None): no evaluation during training.",
        default=None,
    )
    eval_episodes: int = doc(
        "Episodes per evaluation during training (episode k reset with seed "
        "1_000_000_000 + run.seed + k, never a training env's seed).",
        default=10,
    )
    eval_nice: int = doc(
        "Niceness the evaluation process adds to its own (0-19): where training keeps every core busy, "
        "the evaluations take the CPU it leaves, and cost it little; 0: the same share as training.",
        default=10,
    )
    snapshot_replay: bool = doc(
        "Memories snapshot their replay into the run dir (every snapshot_interval_s and at shutdown); "
        "a resumed or restarted memory host starts from its snapshot.",
        default=False,
    )
    snapshot_interval_s: float = doc("Seconds between replay snapshots when snapshot_replay is on.", default=300.0)
    token_file: str | None = doc("Cluster token file (0600); AIORL_TOKEN wins; local runs generate one.", default=None)


@dataclass
class Config:
    algo: str | None = doc("Algorithm name (a module in aiorl.algos); required.", default=None)
    env: EnvConfig = doc("Environment.", default_factory=EnvConfig)
    cluster: ClusterConfig = doc("Processes and addresses.", default_factory=ClusterConfig)
    agent: AgentConfig = doc("Data flow, replay and stop criteria.", default_factory=AgentConfig)
    model: Any = doc("Algorithm hyper-parameters (the algorithm's own dataclass).", default=None)
    run: RunSection = doc("Run directory, seed, logging.", default_factory=RunSection)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def config_hash(self) -> str:
        """Hash of everything every role must agree on (not addresses, ports, paths or log levels)."""
        data = self.to_dict()
        for key in ("port", "host", "advertise_host"):  # a Ray launch gives each node its own
            data["cluster"].pop(key)
        for key in ("dir", "log_level", "token_file"):
            data["run"].pop(key)
        blob = json.dumps(data, sort_keys=True, default=str).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    def dump(self, path: str | Path) -> None:
        Path(path).write_text(yaml.safe_dump(self.to_dict(), sort_keys=False))


# --------------------------------------------------------------------------
# Generic dataclass loading with key paths


def _type_name(tp) -> str:
    if isinstance(tp, type):
        return tp.__name__
    return str(tp).replace("typing.", "")


def _coerce(value, tp, path: str):
    """Check `value` against annotation `tp`, converting only int -> float."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, path)
            except ConfigError as exc:
                errors.append(exc)
        raise errors[0]
    if tp is Any:
        return value
    if dataclasses.is_dataclass(tp):
        if value is None:
            value = {}
        return build_dataclass(tp, value, path)
    if tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
            return int(value)
    elif tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):
            # YAML 1.1 reads 5e-4 and 1e30 (no dot) as strings; take them as the numbers they are.
            try:
                return float(value)
            except ValueError:
                pass
    elif tp is str:
        if isinstance(value, str):
            return value
    elif tp is dict or origin is dict:
        if isinstance(value, dict):
            return dict(value)
    elif tp is list or origin is list:
        if isinstance(value, (list, tuple)):
            return list(value)
    else:
        raise TypeError(f"unsupported config annotation {tp!r} at {path}")
    raise ConfigError(f"{path}: expected {_type_name(tp)}, got {type(value).__name__} {value!r}")


def build_dataclass(cls, data, path: str):
    """Build dataclass `cls` from a mapping, naming the key path of any error."""
    if not isinstance(data, dict):
        raise ConfigError(f"{path or 'config'}: expected a mapping, got {type(data).__name__} {data!r}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs = {}
    for key, value in data.items():
        key_path = f"{path}.{key}" if path else str(key)
        if key not in names:
            close = difflib.get_close_matches(str(key), names, n=1, cutoff=0.5)
            hint = f"; did you mean '{path + '.' if path else ''}{close[0]}'?" if close else ""
            raise ConfigError(f"unknown key '{key_path}'{hint} (valid keys: {', '.join(names)})")
        kwargs[key] = _coerce(value, hints[key], key_path)
    return cls(**kwargs)


def field_docs(cls) -> dict[str, str]:
    return {f.name: f.metadata.get("doc", "") for f in dataclasses.fields(cls)}


# --------------------------------------------------------------------------
# Loading, overrides, validation


def read_config_file(path: str | Path) -> dict:
    path = Path(path)
    if path.is_dir():
        hint = f"; to continue the run in it: aiorl run --resume {path}" if (path / "config.yaml").is_file() else ""
        raise ConfigError(f"config file {str(path)!r} is a directory, not a YAML or JSON file{hint}")
    if not path.is_file():
        raise ConfigError(f"config file {str(path)!r} does not exist")
    text = path.read_text()
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (yaml.YAMLError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{path}: not valid {'JSON' if path.suffix == '.json' else 'YAML'}: {exc}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping, got {type(data).__name__}")
    return data


def apply_overrides(data: dict, overrides: list[str]) -> dict:
    """Apply `key.path=value` overrides; values are parsed as YAML scalars."""
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"--set {item!r}: expected key.path=value")
        key_path, raw = item.split("=", 1)
        keys = key_path.strip().split(".")
        if not all(keys):
            raise ConfigError(f"--set {item!r}: empty key in {key_path!r}")
        try:
            value = yaml.safe_load(raw) if raw.strip() else None
        except yaml.YAMLError as exc:
            raise ConfigError(f"--set {item!r}: cannot parse value: {exc}") from None
        node = data
        for i, key in enumerate(keys[:-1]):
            child = node.get(key)
            if child is None:
                child = node[key] = {}
            if not isinstance(child, dict):
                raise ConfigError(f"--set {item!r}: {'.'.join(keys[: i + 1])} is not a section")
            node = child
        node[keys[-1]] = value
    return data


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def validate(cfg: Config) -> None:
    """Refuse values that could never work, saying why."""
    c, a, r, e = cfg.cluster, cfg.agent, cfg.run, cfg.env
    for name in ("actors", "memories", "learners"):
        value = getattr(c, name)
        _check(value >= 1, f"cluster.{name}: must be at least 1, got {value}")
    _check(0 <= c.port <= 65535, f"cluster.port: expected 0..65535, got {c.port}")
    for name in (
        "heartbeat_interval_s",
        "heartbeat_timeout_s",
        "coordinator_timeout_s",
        "start_timeout_s",
        "phase_timeout_s",
    ):
        value = getattr(c, name)
        _check(value > 0, f"cluster.{name}: must be > 0, got {value}")
    _check(
        c.heartbeat_timeout_s > c.heartbeat_interval_s,
        f"cluster.heartbeat_timeout_s ({c.heartbeat_timeout_s}) must exceed "
        f"cluster.heartbeat_interval_s ({c.heartbeat_interval_s})",
    )
    _check(
        c.coordinator_timeout_s > c.heartbeat_interval_s,
        f"cluster.coordinator_timeout_s ({c.coordinator_timeout_s}) must exceed "
        f"cluster.heartbeat_interval_s ({c.heartbeat_interval_s})",
    )
    _check(c.learner_credits >= 1, f"cluster.learner_credits: must be at least 1, got {c.learner_credits}")
    for name in ("max_handshakes", "max_handshakes_per_host"):
        _check(getattr(c, name) >= 1, f"cluster.{name}: must be at least 1, got {getattr(c, name)}")
    _check(
        0 <= c.actor_flush_delay_s <= 1,
        f"cluster.actor_flush_delay_s: expected 0..1 seconds, got {c.actor_flush_delay_s}",
    )
    _check((c.tls_cert is None) == (c.tls_key is None), "cluster.tls_cert and cluster.tls_key must be given together")
    _check(e.num_envs >= 1, f"env.num_envs: must be at least 1, got {e.num_envs}")
    _check(bool(e.id), "env.id: must name a Gymnasium environment")
    _check(
        e.max_episode_steps is None or e.max_episode_steps >= 1,
        f"env.max_episode_steps: must be at least 1 (or null: the env's own limit), got {e.max_episode_steps}",
    )
    from aiorl.env_wrappers import check_env_config

    check_env_config(e)
    from aiorl.replay.frames import check_compression

    check_compression(c.frame_compression)
    from aiorl.ray_placement import check_launcher

    check_launcher(c)
    _check(
        a.replay_layout in ("auto", "frames", "transitions"),
        f"agent.replay_layout: expected 'auto', 'frames' or 'transitions', got {a.replay_layout!r}",
    )
    _check(a.sample_batch_size >= 1, f"agent.sample_batch_size: must be at least 1, got {a.sample_batch_size}")
    _check(a.batch_size >= 1, f"agent.batch_size: must be at least 1, got {a.batch_size}")
    _check(
        a.buffer_size >= c.memories,
        f"agent.buffer_size ({a.buffer_size}) must be at least cluster.memories ({c.memories})",
    )
    per_memory = a.buffer_size // c.memories
    _check(
        a.batch_size <= per_memory,
        f"agent.batch_size ({a.batch_size}) is larger than the replay of one memory host "
        f"(agent.buffer_size {a.buffer_size} / cluster.memories {c.memories} = {per_memory})",
    )
    _check(
        0 <= a.learning_starts <= a.buffer_size,
        f"agent.learning_starts ({a.learning_starts}) must be within 0..agent.buffer_size ({a.buffer_size}),"
        " or learners would wait forever",
    )
    _check(
        0 <= a.prioritized_replay_alpha <= 1,
        f"agent.prioritized_replay_alpha: expected 0..1, got {a.prioritized_replay_alpha}",
    )
    _check(
        0 <= a.prioritized_replay_beta <= 1,
        f"agent.prioritized_replay_beta: expected 0..1, got {a.prioritized_replay_beta}",
    )
    if a.prioritized_replay_beta_final is not None:
        _check(
            0 <= a.prioritized_replay_beta_final <= 1,
            f"agent.prioritized_replay_beta_final: expected 0..1, got {a.prioritized_replay_beta_final}",
        )
        _check(
            a.scheduled_global_steps is not None or a.scheduled_timesteps is not None,
            "agent.prioritized_replay_beta_final anneals beta over the run's schedule: set "
            "agent.scheduled_global_steps or agent.scheduled_timesteps (or drop it)",
        )
    _check(a.prioritized_replay_eps > 0, f"agent.prioritized_replay_eps: must be > 0, got {a.prioritized_replay_eps}")
    for name in ("scheduled_timesteps", "scheduled_global_steps"):
        value = getattr(a, name)
        _check(value is None or value >= 1, f"agent.{name}: must be at least 1, got {value}")
    _check(
        a.max_samples_per_insert is None,
        f"agent.max_samples_per_insert was replaced by agent.samples_per_insert, a limiter that holds "
        f"back learners and actors alike: set agent.samples_per_insert: {a.max_samples_per_insert} "
        "(and optionally agent.samples_per_insert_tolerance)",
    )
    _check(
        a.samples_per_insert is None or a.samples_per_insert > 0,
        f"agent.samples_per_insert: must be > 0, got {a.samples_per_insert}",
    )
    _check(
        a.samples_per_insert_tolerance >= 0,
        f"agent.samples_per_insert_tolerance: must be >= 0, got {a.samples_per_insert_tolerance}",
    )
    _check(c.max_restarts >= 0, f"cluster.max_restarts: must be >= 0, got {c.max_restarts}")
    _check(
        0 < c.restart_backoff_s <= c.restart_backoff_max_s,
        f"cluster.restart_backoff_s ({c.restart_backoff_s}) must be > 0 and at most "
        f"cluster.restart_backoff_max_s ({c.restart_backoff_max_s})",
    )
    _check(a.sync_interval >= 1, f"agent.sync_interval: must be at least 1, got {a.sync_interval}")
    _check(a.publish_interval >= 1, f"agent.publish_interval: must be at least 1, got {a.publish_interval}")
    _check(r.max_seconds is None or r.max_seconds > 0, f"run.max_seconds: must be > 0, got {r.max_seconds}")
    _check(r.metrics_interval_s > 0, f"run.metrics_interval_s: must be > 0, got {r.metrics_interval_s}")
    _check(
        r.checkpoint_every is None or r.checkpoint_every >= 1,
        f"run.checkpoint_every: must be at least 1, got {r.checkpoint_every}",
    )
    _check(
        r.checkpoint_interval_s is None or r.checkpoint_interval_s > 0,
        f"run.checkpoint_interval_s: must be > 0 (or null), got {r.checkpoint_interval_s}",
    )
    _check(r.eval_every is None or r.eval_every >= 1, f"run.eval_every: must be at least 1, got {r.eval_every}")
    _check(
        r.eval_interval_s is None or r.eval_interval_s > 0,
        f"run.eval_interval_s: must be > 0 (or null), got {r.eval_interval_s}",
    )
    _check(r.eval_episodes >= 1, f"run.eval_episodes: must be at least 1, got {r.eval_episodes}")
    _check(0 <= r.eval_nice <= 19, f"run.eval_nice: expected 0 to 19, got {r.eval_nice}")
    _check(r.keep_checkpoints >= 1, f"run.keep_checkpoints: must be at least 1, got {r.keep_checkpoints}")
    _check(r.snapshot_interval_s > 0, f"run.snapshot_interval_s: must be > 0, got {r.snapshot_interval_s}")
    _check(
        r.log_level.upper() in ("DEBUG", "INFO", "WARNING", "ERROR"),
        f"run.log_level: expected DEBUG, INFO, WARNING or ERROR, got {r.log_level!r}",
    )
    from aiorl.loggers import check_names

    bad_loggers = check_names(r.loggers)
    _check(bad_loggers is None, bad_loggers or "")


def load_config(path: str | Path | None = None, overrides: list[str] | None = None, data: dict | None = None) -> Config:
    """Read, override, type-check and validate a run config; raise ConfigError on any problem."""
    from aiorl.runtime.algorithm import get_algorithm  # the algorithm owns the model section

    # A deep copy: overrides must not change the caller's nested mappings (aiorl.run(dict) twice).
    raw = copy.deepcopy(dict(data)) if data is not None else read_config_file(path)
    raw = apply_overrides(raw, list(overrides or []))
    _agent_defaults(raw)
    model_raw = raw.pop("model", None)
    cfg = build_dataclass(Config, raw, "")
    if cfg.algo is None:
        from aiorl.runtime.algorithm import available_algorithms

        raise ConfigError(
            f"algo: required; set one of {', '.join(available_algorithms())} "
            "(e.g. `algo: apex_dqn`; `aiorl config ALGO` prints a full config)"
        )
    algo = get_algorithm(cfg.algo)
    cfg.model = _coerce(model_raw, algo.model_config, "model")
    validate(cfg)
    algo.validate(cfg)
    if algo.is_synchronous(cfg):
        check_synchronous(cfg)
    return cfg


def _agent_defaults(raw: dict) -> None:
    """Fill in the algorithm's own `agent` defaults (`Algorithm.agent_defaults`) the config leaves out."""
    from aiorl.runtime.algorithm import available_algorithms, get_algorithm

    name, agent = raw.get("algo"), raw.get("agent") or {}
    if not isinstance(name, str) or name not in available_algorithms() or not isinstance(agent, dict):
        return  # the checks that follow name what is wrong
    defaults = get_algorithm(name).agent_defaults
    if defaults:
        raw["agent"] = {**defaults, **agent}


def check_synchronous(cfg: Config) -> None:
    """Synchronous algorithms aggregate one rollout per actor per iteration: no replay to rate
    limit, and a barrier that counts every actor (so no restarts)."""
    _check(
        cfg.agent.samples_per_insert is None,
        f"agent.samples_per_insert: {cfg.algo} is synchronous (one rollout per actor per iteration, "
        "no replay), so there is nothing to rate limit; remove it",
    )
    _check(
        cfg.cluster.max_restarts == 0,
        f"cluster.max_restarts: {cfg.algo} is synchronous; its iteration barrier cannot take a "
        "restarted actor back, so restarts are for asynchronous algorithms only (set it to 0)",
    )
