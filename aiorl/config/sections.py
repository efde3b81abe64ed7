"""Typed, validated run configuration.

A run config is YAML (or JSON) with the sections ``algo``, ``env``,
``cluster``, ``agent``, ``model``, ``run`` and ``offline``. Every section is a dataclass
whose fields carry their documentation; loading checks every key and type
and the values that could never work, so a bad config fails before any
process starts, naming the key path (``agent.batch_size``) and, for an
unknown key, the nearest valid name.

The ``model`` section belongs to the algorithm: each algorithm declares its
own dataclass (``Algorithm.model_config``), validated the same way.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from aiorl.config.schema import doc


@dataclass
class EnvConfig:
    id: str | None = doc(
        "Gymnasium environment id, e.g. CartPole-v1. An offline run (offline.dataset) may leave it out "
        "(null): its spaces come from the dataset and no evaluation episodes run.",
        default="CartPole-v1",
    )
    num_envs: int = doc("Environments stepped together by each actor.", default=1)
    kwargs: dict = doc("Keyword arguments passed to gymnasium.make.", default_factory=dict)
    max_episode_steps: int | None = doc(
        "Override of the env's time limit (None keeps the registered one).", default=None
    )
    wrappers: list = doc(
        "Gymnasium wrappers applied in order on top of the env: 'Name' or {Name: {keyword: value}} "
        "(see aiorl/envs/wrappers.py).",
        default_factory=list,
    )
    preset: str | None = doc(
        "'atari': DeepMind preprocessing of an ALE/ env (training: life loss ends episodes, rewards "
        "clipped; aiorl eval: full games, raw rewards). See aiorl/envs/atari.py.",
        default=None,
    )
    preset_options: dict = doc(
        "Options of the preset, e.g. {noop_max: 0} (aiorl/envs/atari.py AtariOptions).", default_factory=dict
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
        "Times each actor (and memory host other than 0) is restarted in place after exiting "
        "abnormally, in any phase before STOPPING, every algorithm; 0: never. See aiorl/runtime/restart.py.",
        default=10,
    )
    max_run_restarts: int = doc(
        "Times the whole run is started again from its newest good checkpoint, in the same run "
        "directory, when a role that cannot restart in place is lost (a learner, memory host 0 "
        "with the coordinator); 0: never. See aiorl/launch/attempts.py.",
        default=2,
    )
    restart_backoff_s: float = doc("Wait before a restart, doubled after each quick failure.", default=1.0)
    restart_backoff_max_s: float = doc("Longest wait before a restart.", default=30.0)
    learner_credits: int = doc("Batches a learner may have requested and not yet consumed, per memory.", default=2)
    actor_credits: int = doc(
        "Batches an actor may send ahead of the memory host's replies, per memory (agent.samples_per_insert "
        "and IMPALA's queue): deep enough to hide a credit's round trip (see aiorl/runtime/ratelimit.py).",
        default=16,
    )
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
    first_bytes_timeout_s: float = doc(
        "Seconds a coordinator or memory host waits for a new connection's first byte before closing it "
        "(a role's handshake starts at once; the whole handshake has longer). Also how long a handshake may "
        "take before a newcomer may take its slot when the caps above are full.",
        default=1.5,
    )
    unix_sockets: bool = doc(
        "In a local run, the coordinator and memory hosts also listen on Unix sockets in the run "
        "directory (0700) and the roles connect through them; a peer there of another uid is refused "
        "before the handshake. Roles placed by Ray or started by hand, and `aiorl status HOST:PORT`, "
        "use TCP. A run directory too deep for a socket's path (107 bytes) falls back to TCP.",
        default=True,
    )
    transport: str = doc(
        "How roles on one host move data: 'auto' (shared memory when they are on one host, i.e. a "
        "local run with unix_sockets; TCP between hosts), 'shm' (the same, and an error where no "
        "shared memory is possible: unix_sockets off), 'tcp' (sockets only: Unix sockets in a local run, "
        "as before shared memory). Over shared memory each connection to a memory host or the coordinator "
        "gets a ring per direction in a sealed memfd handed over on a Unix socket in the run directory; "
        "the handshake, frames and checks are those of TCP. See aiorl/wire/shm.py.",
        default="auto",
    )
    shm_ring_bytes: int = doc(
        "Bytes of each direction's shared-memory ring, per connection (both directions are mapped "
        "by both roles; a ring's pages are touched as it cycles, so budget about 2x this per "
        "connection). A frame larger than the ring passes in pieces.",
        default=4 << 20,
    )
    warm_spawner: bool = doc(
        "In a local run, fork every role, the evaluation worker and each restart from one process "
        "that imported numpy, torch, gymnasium and the runtime once (a run starts in little more "
        "than one import of torch). false: each role is a `python -m aiorl` process of its own "
        "(for comparison and debugging; the environment variable AIORL_WARM_SPAWNER=0 does the same).",
        default=True,
    )
    tls_cert: str | None = doc("PEM certificate of this host (enables TLS).", default=None)
    tls_key: str | None = doc("PEM private key for tls_cert.", default=None)
    tls_ca: str | None = doc("CA bundle used to verify peers when TLS is on.", default=None)
    launcher: str = doc(
        "'local': every role a child process of `aiorl run`; 'ray': each role placed on a Ray cluster "
        "(`pip install 'aiorl[ray]'`; see aiorl/launch/ray_launcher.py).",
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
        "samples_per_insert_tolerance_rate); never narrower than the learners' and actors' credits together.",
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
    deterministic: bool = doc(
        "Repeat a synchronous run (dppo, es) exactly for its seed on one machine: the same weights after "
        "every iteration (torch's deterministic algorithms). Refused for the asynchronous algorithms, "
        "whose data order depends on timing, and with run.max_seconds, whose stop depends on the clock. "
        "A restart in place changes the data of the iterations it touches.",
        default=False,
    )
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
        "hyper-parameters: tensorboard, wandb, mlflow (aiorl/io/loggers.py; each an extra).",
        default_factory=lambda: ["tensorboard"],
    )
    checkpoint_interval_s: float | None = doc(
        "Learner 0 checkpoints as soon as learning has started (at its first weights publication after "
        "learning_starts: learner step agent.publish_interval of each launch; for dppo/es after the first "
        "iteration), then every this many seconds (and at shutdown, and when the run ends abnormally while "
        "it still can); None: only by checkpoint_every (the first one early all the same).",
        default=60.0,
    )
    checkpoint_every: int | None = doc(
        "Learner 0 also checkpoints every this many of its learner steps. With neither this nor "
        "checkpoint_interval_s, only at shutdown and at an abnormal end.",
        default=None,
    )
    keep_checkpoints: int = doc(
        "Checkpoint files kept: the one just written and the newest others that pass their checks "
        "(a damaged file is never counted, nor deleted; --resume sets it aside as .bad).",
        default=3,
    )
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
        "Niceness the evaluation process adds to its own (0-19), once warm (its policy built, an export "
        "traced): where training keeps every core busy, the evaluations take the CPU it leaves, and cost "
        "it little; 0: the same share as training.",
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
class OfflineConfig:
    dataset: str | None = doc(
        "Learn from this dataset of logged transitions instead of actors: a path (aiorl's own format, "
        "EasyRL's line format, a Minari dataset's directory, an Ape-X replay snapshot) or a Minari dataset "
        "id in the local Minari root (nothing is downloaded). Memory hosts each serve a shard of its rows "
        "(row ranges: every row in exactly one; agent.buffer_size and learning_starts do not apply), no "
        "actors start, env.id is optional (evaluation episodes only). null: an online run.",
        default=None,
    )
    format: str | None = doc(
        "The dataset's format: 'aiorl', 'easyrl', 'minari' or 'snapshot'; null: detected from the files.",
        default=None,
    )
    epochs: float | None = doc(
        "Stop after this many passes over the dataset: rows the learners sampled (the run's learner steps, "
        "all learners together, x agent.batch_size) over the dataset's rows. null: no such stop.",
        default=None,
    )
    eval_dataset: str | None = doc(
        "Held-out logged data (same forms as dataset) that off-policy evaluation scores the current policy "
        "on at each evaluation during training (run.eval_every, run.eval_interval_s). null: none.",
        default=None,
    )


#: offline.format's values (aiorl.offline.formats reads each).
OFFLINE_FORMATS = ("aiorl", "easyrl", "minari", "snapshot")


@dataclass
class Config:
    algo: str | None = doc("Algorithm name (a module in aiorl.algos); required.", default=None)
    env: EnvConfig = doc("Environment.", default_factory=EnvConfig)
    cluster: ClusterConfig = doc("Processes and addresses.", default_factory=ClusterConfig)
    agent: AgentConfig = doc("Data flow, replay and stop criteria.", default_factory=AgentConfig)
    model: Any = doc("Algorithm hyper-parameters (the algorithm's own dataclass).", default=None)
    run: RunSection = doc("Run directory, seed, logging.", default_factory=RunSection)
    offline: OfflineConfig = doc(
        "Learning from logged data: the dataset an offline run learns from instead of actors.",
        default_factory=OfflineConfig,
    )

    @property
    def algorithm(self) -> type:
        """The `aiorl.runtime.algorithm.Algorithm` class of ``algo``, bound by the loader that
        resolved the model section with it (`aiorl.experiment.load_config`) and imported here,
        at the first use: its module brings torch, which loading a config does not. The runtime
        takes the algorithm from here: it never looks one up by name. Not a key: never serialized."""
        load = self.__dict__.get("_algorithm")
        if load is None:
            raise RuntimeError(
                f"this Config (algo {self.algo!r}) has no algorithm bound: load it with aiorl.experiment.load_config"
            )
        return load()

    def bind_algorithm(self, load: Callable[[], type]) -> None:
        """Bind ``algo``'s algorithm: `load()` returns its class, whenever the runtime asks."""
        self.__dict__["_algorithm"] = load

    @property
    def subject(self) -> str:
        """What the run learns on, for names and titles: the env's id, or for an offline run
        without an env, ``dataset-<the dataset's name>``."""
        if self.env.id is not None or self.offline.dataset is None:
            return str(self.env.id)
        return f"dataset-{Path(self.offline.dataset.rstrip('/')).name or self.offline.dataset}"

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
