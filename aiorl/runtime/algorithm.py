"""The algorithm plug-in interface the runtime drives.

An algorithm is two modules in `aiorl.algos`: ``<name>_config`` exposing
``SETTINGS``, a subclass of `AlgorithmSettings` (what its config alone says:
the model section, agent defaults, checks, synchronous or not; no torch, so
loading a config and `aiorl config` stay fast), and ``<name>`` exposing
``ALGORITHM``, the subclass of `Algorithm` built on those settings. The
runtime never touches tensors or losses; it moves
``dict[str, np.ndarray]`` batches and weight dicts between three small
objects the algorithm builds:

- `ActorPolicy` (in every actor): ``act(obs) -> actions`` for a vector of
  envs, ``postprocess(rollout) -> (batch, priorities)`` turning raw
  ``[T, num_envs, ...]`` env output into replay rows (n-step, GAE, ...),
  ``flush()`` at shutdown for rows still held back, ``set_weights``.
- `LearnerCore` (in every learner): ``step(batch) -> LearnerResult`` with
  metrics and new priorities, ``get_weights()``, checkpoint and export.
- the replay ``transition_spec()`` memories preallocate (for whole fragments, also the
  ``per_fragment_spec()`` each fragment holds once).

Asynchronous algorithms (Ape-X) stream batches through prioritized or
uniform replay, or, when `Algorithm.fragment_queue` says so (IMPALA), whole
trajectory fragments through the memories' bounded queues; synchronous ones
(``synchronous = True``: PPO, ES) send one rollout per actor per iteration
(or, when `Algorithm.work_items` says so, one result per work item the
coordinator hands out: ES), aggregated by the memories, and actors wait for
the weights of the next iteration.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from aiorl.config import Config, ConfigError
from aiorl.io import checkpoint
from aiorl.io.export import save_policy
from aiorl.io.policy_data import rebuild_record
from aiorl.runtime.dataset_source import dataset_env_spec

if TYPE_CHECKING:
    from aiorl.envs import EnvSpec
    from aiorl.replay.trajectory_queue import QueueSpec

Batch = dict[str, np.ndarray]
Spec = dict[str, tuple[tuple[int, ...], str]]


class PeerNotFinite(FloatingPointError):
    """A data-parallel peer's loss was not finite at this step, this learner's was: no learner
    applied the step. The peer knows whether its batch or its model was at fault; this learner
    drops its batch and stays in step with it (a diverged peer fails the run on its own)."""


@dataclass
class LearnerResult:
    """What one learner step gives back to the runtime."""

    metrics: dict[str, float] = field(default_factory=dict)
    priorities: np.ndarray | None = None  # one per batch row, for prioritized replay
    # Data-parallel learners: a peer ran out of data, so this step was not applied
    # and the runtime stops training (it still drains what memories send).
    stop: bool = False


@dataclass
class WorkResult:
    """What evaluating one work item gives back: its row(s) and what the actor reports."""

    batch: Batch
    env_steps: int = 0
    episode_returns: list[float] = field(default_factory=list)
    episode_lengths: list[int] = field(default_factory=list)


class ActorPolicy:
    """Acting side of an algorithm, one per actor process."""

    weights_version: int = -1

    @staticmethod
    def decode_observations(batch: Batch) -> Batch:
        """`batch` with its observation fields as stacked observations.

        In the frame layout (`aiorl.replay.frames`) the runtime hands
        `postprocess` rollouts whose observation fields are frame ids, and
        replaces this with the decoder of its actor's frames: a policy that
        needs the observations of the rows it emits (initial priorities)
        decodes them here. Identity otherwise.
        """
        return batch

    def act(self, obs: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def begin_episodes(self, started: np.ndarray) -> None:
        """Envs ``started`` (bool [num_envs]) were just reset: their next `act` is an episode's
        first step (a recurrent policy zeroes their state). Called after a step where any env ended."""

    def postprocess(self, rollout: Batch) -> tuple[Batch, np.ndarray | None]:
        """Turn a ``[T, num_envs, ...]`` rollout into replay rows and optional priorities."""
        raise NotImplementedError

    def flush(self) -> tuple[Batch, np.ndarray | None]:
        """Rows still held back (e.g. open n-step windows) when the actor stops."""
        return {}, None

    def set_weights(self, weights: dict[str, np.ndarray], version: int) -> None:
        raise NotImplementedError

    def run_work(self, iteration: int, item: int) -> WorkResult:
        """Evaluate work item `item` of `iteration` with the current weights (work-item algorithms).

        Runs in a worker thread; the policy owns whatever environments it steps.
        """
        raise NotImplementedError


class LearnerCore:
    """Learning side of an algorithm, one per learner process."""

    def step(self, batch: Batch) -> LearnerResult:
        raise NotImplementedError

    def get_weights(self) -> dict[str, np.ndarray]:
        raise NotImplementedError

    def state_dict(self) -> dict | None:
        """Everything a resumed learner needs: models, target nets, optimizers, step counts, RNG
        states. Tensors, numbers, strings, lists and dicts only (aiorl/io/checkpoint.py reads files
        back in torch's weights-only mode). None: this core keeps nothing worth a checkpoint."""
        return None

    def load_state_dict(self, state: dict) -> None:
        """Restore what `state_dict` returned."""
        raise NotImplementedError(f"{type(self).__name__} cannot restore a checkpoint")

    def save_checkpoint(self, directory: str, counters: dict, keep: int = 3) -> str | None:
        """Write `state_dict` as an aiorl checkpoint under `directory` (see `aiorl.io.checkpoint`);
        ``counters["learner_steps"]`` names the file. Returns its path (None: nothing to save)."""
        state = self.state_dict()
        if state is None:
            return None
        steps = int(counters.get("learner_steps", 0))
        return str(checkpoint.save(directory, steps, state, {"counters": dict(counters)}, keep))

    def load_checkpoint(self, path: str) -> dict:
        """Restore a checkpoint file (checked whole first); return its meta (``learner_steps``, ...)."""
        meta, state = checkpoint.load(path)
        self.load_state_dict(state)
        return meta

    def acting_policy(self) -> tuple[object, dict] | None:
        """A frozen copy of the acting policy (a module: obs batch -> action batch, on the CPU) and
        its policy.json meta; None for an algorithm with nothing to export. Cheap (a copy of the
        network): evaluation during training takes it between two steps and exports off the lock."""
        return None

    def export_policy(self, directory: str) -> str | None:
        """Write the acting policy for `aiorl eval`; return its path."""
        policy = self.acting_policy()
        return None if policy is None else save_policy(policy[0], directory, policy[1])

    def finish(self) -> None:
        """Called once when this learner's data has ended (after its last `step`).

        Data-parallel cores use it to tell their peers to stop, so that no
        learner waits forever in a collective; it must be idempotent with a
        `step` that already returned ``stop=True``.
        """

    def close(self) -> None:
        """Release what the core holds (process groups, devices)."""


class AlgorithmSettings:
    """What an algorithm's config alone says, before any env exists: its model section, its
    `agent` defaults, its checks and the shape of its run. Each algorithm's lives in a module
    that imports no torch (``aiorl/algos/<name>_config.py``): `aiorl.experiment.load_config`
    and `aiorl config` import only that side."""

    name: ClassVar[str] = ""
    model_config: ClassVar[type] = dict
    #: Defaults of `agent` keys this algorithm needs different from the shared ones (a user's
    #: value wins); `aiorl config ALGO` prints them.
    agent_defaults: ClassVar[dict] = {}
    #: What `aiorl config ALGO` sets beyond the defaults, as dotted keys, so that the config it
    #: prints runs and stops: its example's budget and evaluation (and an env it can act in).
    starter: ClassVar[dict] = {}
    synchronous: ClassVar[bool] = False
    #: It learns from logged data only (bc, bcq, cql, marwil, iql): a run without
    #: offline.dataset is refused in one line naming the key.
    offline_only: ClassVar[bool] = False
    #: Transition-spec fields its learner does without when a dataset cannot give them (an
    #: actor's diagnostics: the epsilon a row was acted with, which apex_dqn and r2d2 only average
    #: into a metric). Any other field of the spec a dataset lacks refuses the offline run.
    dataset_optional_fields: ClassVar[frozenset[str]] = frozenset({"epsilon"})
    # What the live panel shows beside the counters, as (label, metrics.jsonl key): the
    # learner's loss, the exploration as this algorithm defines it (epsilon, entropy) and
    # policy lag where it applies. Keys absent from a row show as "-".
    panel_metrics: ClassVar[tuple[tuple[str, str], ...]] = ()

    @classmethod
    def is_synchronous(cls, cfg: Config) -> bool:
        return cls.synchronous

    @classmethod
    def work_items(cls, cfg: Config) -> int | None:
        """Work items per iteration, handed out by the coordinator, for a synchronous
        algorithm whose iteration is a set of independent items (ES); None: one
        rollout per live actor per iteration (DPPO)."""
        return None

    @classmethod
    def fragment_queue(cls, cfg: Config) -> QueueSpec | None:
        """For an asynchronous on-policy algorithm (IMPALA): the trajectory queue its memories
        keep, and actors send whole fragments (`aiorl.runtime.fragments`); None: replay."""
        return None

    @classmethod
    def keeps_replay(cls, cfg: Config) -> bool:
        """Whether the memory hosts keep a replay buffer: not for a synchronous algorithm (its
        rounds) nor for one with a fragment queue (IMPALA)."""
        return not cls.is_synchronous(cfg) and cls.fragment_queue(cfg) is None

    @classmethod
    def validate(cls, cfg: Config) -> None:
        """Refuse algorithm-specific values that cannot work (raise ConfigError)."""


class Algorithm(AlgorithmSettings):
    """Builder: one per algorithm, on its settings, makes policies, learner cores and the replay spec."""

    # Transition-spec fields that hold observations (the frame layout stores them as frames).
    observation_fields: ClassVar[tuple[str, ...]] = ("obs", "next_obs")

    def __init__(self, cfg: Config, env_spec: EnvSpec):
        self.cfg = cfg
        self.env_spec = env_spec

    @classmethod
    def prefork(cls, cfg: Config) -> dict[str, np.ndarray]:
        """Arrays every role of this config would otherwise compute for itself (ES: its noise
        table), by name. The warm spawner computes them once, in a child of its own while the
        preflight runs, into shared memory, and hands them to `adopt_prefork` before it forks the
        roles, which then share their pages. numpy only: no torch op, no thread. Default: none."""
        return {}

    @classmethod
    def adopt_prefork(cls, arrays: dict[str, np.ndarray]) -> None:
        """Keep what `prefork` computed (read-only views of shared memory) for the roles forked
        after. Default: nothing."""

    @classmethod
    def check_learner_host(cls, cfg: Config) -> None:
        """Refuse, before any process starts, a learner device this host does not have.

        Called where learners run (a local run, ``--role learner``), not on actor hosts.
        """
        device = getattr(cfg.model, "device", None)
        if not isinstance(device, str) or not device.startswith("cuda"):
            return
        import torch

        if not torch.cuda.is_available():
            raise ConfigError(
                f"model.device: {device!r} asked for, but torch sees no CUDA device on this host "
                f"(torch {torch.__version__}, CUDA build: {torch.version.cuda or 'none'})"
            )
        index = int(device.split(":")[1]) if ":" in device else 0
        if index >= torch.cuda.device_count():
            raise ConfigError(
                f"model.device: {device!r} asked for, but this host has {torch.cuda.device_count()} CUDA device(s)"
            )

    def lookback_steps(self) -> int:
        """Env steps before the current one at which an actor's future rows may still start
        (its n-step windows held open): n_step - 1 for the n-step algorithms."""
        return max(0, int(getattr(self.cfg.model, "n_step", 1)) - 1)

    def transition_spec(self) -> Spec:
        raise NotImplementedError

    def per_fragment_spec(self) -> Spec:
        """With a `fragment_queue`: the fields each fragment holds once rather than at every step
        (``[n, *shape]`` in a fragment message, ``[B, *shape]`` in a learner's batch; a recurrent
        policy's state at the fragment's first step). Their names are not the transition spec's."""
        return {}

    def value_bounds(self) -> dict[str, tuple[int, int]]:
        """Inclusive bounds of the transition spec's integer fields that index something, which a
        memory host holds every row to (`aiorl.runtime.messages.RowSpec.bad_rows`; float fields
        must be finite, with no entry here). By default a Discrete action space's actions and a
        Discrete observation space's observations; an algorithm adds its own indices (ES)."""
        spec = self.transition_spec()
        bounds = {}
        for fields, space in (
            (("action",), self.env_spec.action_space),
            (self.observation_fields, self.env_spec.observation_space),
        ):
            if not hasattr(space, "n"):  # not Discrete
                continue
            start = int(getattr(space, "start", 0))
            for name in fields:
                if name in spec and np.dtype(spec[name][1]).kind in "iu":
                    bounds[name] = (start, start + int(space.n) - 1)
        return bounds

    def max_batch_rows(self) -> int:
        """Most rows one actor batch (or synchronous rollout) can hold; bounds an actor's frames.

        The default is one rollout, ``sample_batch_size x num_envs`` rows. A
        postprocess that holds rows back across rollouts (open n-step windows)
        must add what it may release at once.
        """
        return self.cfg.agent.sample_batch_size * self.cfg.env.num_envs

    def weights_spec(self) -> Spec | None:
        """The arrays learner 0 publishes (``{name: (shape, dtype)}``); bounds weights frames.

        None when the algorithm cannot say: weights frames then get the wire's default cap.
        """
        return None

    def acting_module(self):
        """A fresh module of the acting policy `LearnerCore.acting_policy` exports (the same class
        and state dict names, freshly initialised), built on torch's current default device; None
        for an algorithm that exports none. `aiorl.io.policy_data` rebuilds a policy with it."""
        return None

    def policy_record(self) -> dict:
        """What policy.json records for `acting_module` to be rebuilt (``rebuild``: the config the
        checks read, the spaces), as plain data (`aiorl.io.policy_data.rebuild_record`)."""
        return rebuild_record(self.cfg, self.env_spec)

    def make_actor(self, actor_index: int, num_actors: int, seed: int) -> ActorPolicy:
        raise NotImplementedError

    def make_learner(
        self, learner_index: int, num_learners: int, seed: int, rendezvous: str | None = None
    ) -> LearnerCore:
        """Build the learning side; called in a worker thread (it may block joining peers).

        ``rendezvous`` is a ``tcp://host:port`` address for ``torch.distributed``
        when ``num_learners > 1``, handed out by the coordinator.
        """
        raise NotImplementedError


def build_algorithm(cfg: Config) -> Algorithm:
    """The configured algorithm (`Config.algorithm`), built for the configured environment's spaces
    (an offline run's: the dataset's, checked against the env's where it names one)."""
    if cfg.offline.dataset is not None:
        return cfg.algorithm(cfg, dataset_env_spec(cfg))
    from aiorl.envs import env_spec

    return cfg.algorithm(cfg, env_spec(cfg.env))
