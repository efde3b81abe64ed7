"""The dataset of an offline run (``offline.dataset``), as every process of the run reads it:
the preflight (before any process starts), each memory host (its shard), the coordinator
(its row count, for ``offline.epochs``) and every role that builds the algorithm (the spaces).

Read once per process (the memory host 0 holds the coordinator and a store, both of which
ask). With ``env.id`` the dataset is read against the env's spaces, which it must match (the
reader says where it does not, `aiorl.offline.dataset.DatasetError`: one line); without one the
run's spaces are the dataset's.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from aiorl.config import Config
from aiorl.offline.dataset import Dataset, DatasetError
from aiorl.offline.formats import load_dataset

if TYPE_CHECKING:
    from aiorl.envs import EnvSpec

_loaded: dict[tuple, tuple[Dataset, EnvSpec]] = {}


def _read(cfg: Config) -> tuple[Dataset, EnvSpec]:
    o = cfg.offline
    key = (o.dataset, o.format, repr(cfg.env))
    if key not in _loaded:
        from aiorl.envs import EnvSpec, env_spec  # gymnasium

        if cfg.env.id is None:
            dataset = load_dataset(o.dataset, o.format)
            spec = EnvSpec(
                id=dataset.env_id or f"dataset {o.dataset}",
                observation_space=dataset.observation_space,
                action_space=dataset.action_space,
                max_episode_steps=None,
            )
        else:
            spec = env_spec(cfg.env)
            dataset = load_dataset(  # checked against the env's spaces
                o.dataset, o.format, observation_space=spec.observation_space, action_space=spec.action_space
            )
        if len(dataset) < cfg.cluster.memories:
            raise DatasetError(
                f"{o.dataset}: {len(dataset)} rows cannot make {cfg.cluster.memories} shards (cluster.memories): "
                "each memory host serves at least one row"
            )
        _loaded.clear()  # one dataset per process: a test or a resumed launch may read another
        _loaded[key] = dataset, spec
    return _loaded[key]


def run_dataset(cfg: Config) -> Dataset:
    """The whole dataset of `cfg`'s offline run (DatasetError: one line naming what is wrong)."""
    return _read(cfg)[0]


def dataset_env_spec(cfg: Config) -> EnvSpec:
    """The env spec of `cfg`'s offline run: the env's (the dataset checked against it), or the
    dataset's spaces where ``env.id`` is null."""
    return _read(cfg)[1]


def epoch_steps(cfg: Config) -> int | None:
    """Learner steps of all learners (one batch each) that make ``offline.epochs`` passes over the
    dataset; None: no such stop."""
    if cfg.offline.dataset is None or cfg.offline.epochs is None:
        return None
    return math.ceil(cfg.offline.epochs * len(run_dataset(cfg)) / cfg.agent.batch_size)
