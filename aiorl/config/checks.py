"""Checks of the shared sections: values that could never work, refused with the reason."""

from __future__ import annotations

import platform

from aiorl.config.schema import ConfigError
from aiorl.config.sections import OFFLINE_FORMATS, Config

#: cluster.transport's values; the ring sizes aiorl.wire.shm accepts (config imports nothing above it).
TRANSPORTS = ("auto", "tcp", "shm")
MIN_RING_BYTES = 64 * 1024
MAX_RING_BYTES = 1 << 30
#: Machines whose store order the rings rely on (aiorl/wire/ring.py publishes a counter after the
#: bytes it covers with plain stores, and Python has no memory fence): x86-64 never lets another
#: core see the counter before the bytes; ARM and others may. Elsewhere 'auto' keeps to sockets.
RING_MACHINES = ("x86_64", "amd64")


def rings_supported(machine: str | None = None) -> bool:
    return (platform.machine() if machine is None else machine).lower() in RING_MACHINES


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def check_cluster_and_env(cfg: Config) -> None:
    """Refuse cluster and env values that could never work, saying why."""
    c, e = cfg.cluster, cfg.env
    offline = cfg.offline.dataset is not None
    _check(
        not offline or c.actors == 0,
        f"cluster.actors: an offline run (offline.dataset) takes no actors, its data is the dataset; "
        f"got {c.actors} (leave it out or set 0)",
    )
    for name in ("actors", "memories", "learners"):
        value = getattr(c, name)
        _check(value >= 1 or (offline and name == "actors"), f"cluster.{name}: must be at least 1, got {value}")
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
    _check(
        1 <= c.actor_credits <= 1024,
        f"cluster.actor_credits: expected 1..1024 batches, got {c.actor_credits}",
    )
    _check(
        c.transport in TRANSPORTS,
        f"cluster.transport: expected one of {', '.join(map(repr, TRANSPORTS))}, got {c.transport!r}",
    )
    _check(
        c.transport != "shm" or c.unix_sockets,
        "cluster.transport: 'shm' hands rings over on the run's Unix sockets, but cluster.unix_sockets is false "
        "(set transport to 'auto' or 'tcp', or turn unix_sockets on)",
    )
    _check(
        c.transport != "shm" or rings_supported(),
        f"cluster.transport: 'shm' needs an x86-64 machine (its rings rely on that store order), this one "
        f"is {platform.machine()!r} (set transport to 'auto' or 'tcp')",
    )
    _check(
        MIN_RING_BYTES <= c.shm_ring_bytes <= MAX_RING_BYTES,
        f"cluster.shm_ring_bytes: expected {MIN_RING_BYTES}..{MAX_RING_BYTES}, got {c.shm_ring_bytes}",
    )
    for name in ("max_handshakes", "max_handshakes_per_host"):
        _check(getattr(c, name) >= 1, f"cluster.{name}: must be at least 1, got {getattr(c, name)}")
    _check(
        0 < c.first_bytes_timeout_s <= 60,
        f"cluster.first_bytes_timeout_s: expected more than 0 and at most 60 seconds, got {c.first_bytes_timeout_s}",
    )
    _check(
        0 <= c.actor_flush_delay_s <= 1,
        f"cluster.actor_flush_delay_s: expected 0..1 seconds, got {c.actor_flush_delay_s}",
    )
    _check((c.tls_cert is None) == (c.tls_key is None), "cluster.tls_cert and cluster.tls_key must be given together")
    _check(e.num_envs >= 1, f"env.num_envs: must be at least 1, got {e.num_envs}")
    _check(
        bool(e.id) or (offline and e.id is None),
        "env.id: must name a Gymnasium environment"
        + (" (or be null in an offline run: no evaluation episodes)" if offline else ""),
    )
    _check(
        e.max_episode_steps is None or e.max_episode_steps >= 1,
        f"env.max_episode_steps: must be at least 1 (or null: the env's own limit), got {e.max_episode_steps}",
    )


def check_agent_and_run(cfg: Config) -> None:
    """The agent and run sections: after the env's and the cluster's subsystems had their say
    (`aiorl.experiment.loading.check_config`), so a config's first error reads in key order."""
    c, a, r = cfg.cluster, cfg.agent, cfg.run
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
    _check(c.max_run_restarts >= 0, f"cluster.max_run_restarts: must be >= 0, got {c.max_run_restarts}")
    _check(
        0 < c.restart_backoff_s <= c.restart_backoff_max_s,
        f"cluster.restart_backoff_s ({c.restart_backoff_s}) must be > 0 and at most "
        f"cluster.restart_backoff_max_s ({c.restart_backoff_max_s})",
    )
    _check(a.sync_interval >= 1, f"agent.sync_interval: must be at least 1, got {a.sync_interval}")
    _check(a.publish_interval >= 1, f"agent.publish_interval: must be at least 1, got {a.publish_interval}")
    _check(
        0 <= r.seed <= 2**32 - 1,
        f"run.seed: expected 0 to 2**32 - 1 (every role derives its seeds from it), got {r.seed}",
    )
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


def check_deterministic(cfg: Config, synchronous: bool) -> None:
    """`run.deterministic` holds only where the data of each step does not depend on timing."""
    if not cfg.run.deterministic:
        return
    _check(
        synchronous,
        f"run.deterministic: {cfg.algo} is asynchronous (which batches a learner samples, and the weights "
        "each actor acts with, depend on timing), so no seed can make two runs equal; it holds for dppo and es",
    )
    _check(
        cfg.run.max_seconds is None,
        "run.deterministic: run.max_seconds stops at a time, not at a step: give the budget as "
        "agent.scheduled_global_steps or agent.scheduled_timesteps",
    )


def check_synchronous(cfg: Config) -> None:
    """Synchronous algorithms aggregate one rollout per actor per iteration: no replay to rate limit."""
    _check(
        cfg.agent.samples_per_insert is None,
        f"agent.samples_per_insert: {cfg.algo} is synchronous (one rollout per actor per iteration, "
        "no replay), so there is nothing to rate limit; remove it",
    )


def check_offline(cfg: Config, *, offline_only: bool, keeps_replay: bool) -> None:
    """The offline section against the algorithm (`offline_only`: it learns from logged data only;
    `keeps_replay`: its memory hosts sample a replay, which a dataset store stands in for) and the
    keys an offline run has no use for."""
    o, a = cfg.offline, cfg.agent
    _check(
        o.dataset is not None or not offline_only,
        f"offline.dataset: {cfg.algo} learns from logged data only: set offline.dataset (a dataset path or Minari id)",
    )
    _check(
        o.format is None or o.format in OFFLINE_FORMATS,
        f"offline.format: expected one of {', '.join(map(repr, OFFLINE_FORMATS))} (or null: detected), "
        f"got {o.format!r}",
    )
    _check(o.epochs is None or o.epochs > 0, f"offline.epochs: must be > 0, got {o.epochs}")
    if o.dataset is None:
        for key in ("format", "epochs"):  # eval_dataset scores an online run's policy as well
            _check(
                getattr(o, key) is None,
                f"offline.{key}: set for an online run (offline.dataset is null); remove it or set offline.dataset",
            )
        return
    _check(bool(o.dataset), "offline.dataset: must name a dataset (a path or a Minari id), got ''")
    _check(
        keeps_replay,
        f"offline.dataset: {cfg.algo} learns from rollouts its actors make as it trains, not from a replay; "
        "an offline run needs an algorithm that samples one (bc, bcq, cql, marwil, iql, apex_dqn, apex_ddpg)",
    )
    _check(
        a.scheduled_timesteps is None,
        "agent.scheduled_timesteps: an offline run takes no env steps; stop it by agent.scheduled_global_steps "
        "or offline.epochs",
    )
    _check(
        a.samples_per_insert is None,
        "agent.samples_per_insert: an offline run inserts nothing (its dataset is loaded whole); remove it",
    )
    _check(
        a.replay_layout != "frames",
        "agent.replay_layout: 'frames' stores what actors send frame by frame; an offline run's memory hosts "
        "keep the dataset's rows whole (set 'auto' or 'transitions')",
    )


def check_offline_episodes(cfg: Config) -> None:
    """What an offline run needs episodes for has an env to run them in: checked where a run is
    launched (a policy's rebuild record holds no run section)."""
    o, r = cfg.offline, cfg.run
    if o.dataset is None:
        return
    evaluates = r.eval_every is not None or r.eval_interval_s is not None
    _check(
        cfg.agent.target_return is None or (cfg.env.id is not None and evaluates),
        "agent.target_return: an offline run's return comes from evaluation episodes only: set env.id and "
        "run.eval_every or run.eval_interval_s, or remove it",
    )
    _check(
        cfg.env.id is not None or not evaluates or o.eval_dataset is not None,
        "run.eval_every / run.eval_interval_s: with env.id null an evaluation has no episodes to run; set env.id "
        "(or offline.eval_dataset for off-policy evaluation), or remove them",
    )


def check_stops(cfg: Config) -> None:
    """Refuse a run that nothing would end but a signal: a budget of env steps, learner steps or
    seconds (a target return alone may never be reached). Checked where a run is launched, not
    where a config is read: a past run's config stays readable."""
    a, r = cfg.agent, cfg.run
    if cfg.offline.dataset is not None:
        _check(
            a.scheduled_global_steps is not None or cfg.offline.epochs is not None or r.max_seconds is not None,
            "the offline run has no stop criterion and would run until interrupted: set offline.epochs, "
            "agent.scheduled_global_steps or run.max_seconds",
        )
        return
    _check(
        a.scheduled_timesteps is not None or a.scheduled_global_steps is not None or r.max_seconds is not None,
        "the run has no stop criterion and would run until interrupted: set agent.scheduled_timesteps, "
        "agent.scheduled_global_steps or run.max_seconds (`aiorl config "
        f"{cfg.algo}` prints a config with the algorithm's usual budget)",
    )
