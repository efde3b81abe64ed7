"""The dataset store (`DatasetStore`): an offline run's memory host serves one shard of a
dataset of logged transitions (``offline.dataset``) to its learners, on their credits, exactly
as a replay memory host does; no actor ever sends it anything (an offline run has none).

Memory host i of M loads the dataset (`aiorl.runtime.dataset_source`), takes rows
``shard_range(rows, M, i)`` (contiguous, every row in exactly one shard) and makes them n-step
rows (`aiorl.offline.rows.offline_rows`, with the model's ``n_step`` and ``gamma``), of which it
keeps the fields the algorithm's transition spec names. A spec field a dataset cannot give
refuses the run in one line, unless the algorithm does without it
(`AlgorithmSettings.dataset_optional_fields`: an actor's diagnostics, as apex_dqn's
``epsilon``): batches then come without it.

It is a `ReplayStore` filled once: sampling is uniform, or prioritized with
``agent.prioritized_replay`` (every row at priority 1 to start, learners' priorities coming
back as online). Each row keeps its dataset index (``row``) beside the spec's fields; every
batch drawn is checked against the shard's range (``rows_outside_shard`` in the summary: 0 unless
a shard was built wrong) and sent without it unless the spec names it. No snapshots: a memory
host restarted in place, or a resumed run's, reloads its shard from the dataset.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from aiorl.offline.dataset import DatasetError, shard_range
from aiorl.offline.rows import offline_rows
from aiorl.replay import PrioritizedReplayBuffer, ReplayBuffer
from aiorl.runtime.dataset_source import run_dataset
from aiorl.runtime.memory.links import ActorLink
from aiorl.runtime.memory.replay_store import ReplayStore
from aiorl.runtime.memory.store import StoreParts
from aiorl.runtime.messages import BadMessage, RowSpec
from aiorl.runtime.snapshot import ReplaySnapshots

ROW = "row"  # each row's index in the dataset (`offline_rows`)


def model_n_step(cfg) -> int:
    return int(getattr(cfg.model, "n_step", 1) or 1)


def model_gamma(cfg) -> float:
    gamma = getattr(cfg.model, "gamma", None)
    return 0.99 if gamma is None else float(gamma)


def dataset_fields(spec: dict, rows: dict, algo, source: str) -> list[str]:
    """The fields of `spec` the dataset's `rows` give, in the spec's order, each of the spec's
    row shape; DatasetError (one line) for a field the learner needs and the dataset lacks, or a
    shape that differs."""
    optional = algo.dataset_optional_fields
    missing = [name for name in spec if name not in rows and name not in optional]
    if missing:
        raise DatasetError(
            f"{source}: {algo.name} learns from {', '.join(missing)}, which this dataset cannot give "
            f"(it gives {', '.join(rows)})"
        )
    fields = [name for name in spec if name in rows]
    for name in fields:
        shape, got = tuple(spec[name][0]), tuple(rows[name].shape[1:])
        if shape != got:
            raise DatasetError(
                f"{source}: field {name} has rows of shape {list(got)}, {algo.name} expects {list(shape)}"
            )
    return fields


def check_dataset(cfg, algo) -> None:
    """What a memory host would refuse in the dataset of `cfg`, found before any process starts
    (DatasetError): the fields of `algo`'s spec, on the dataset's first row."""
    dataset = run_dataset(cfg)
    rows = offline_rows(dataset, 0, 1, n_step=model_n_step(cfg), gamma=model_gamma(cfg))
    dataset_fields(algo.transition_spec(), rows, algo, dataset.source or cfg.offline.dataset)


@dataclass
class Shard:
    """Which rows of which dataset a memory host serves."""

    source: str
    format: str
    dataset_rows: int  # the whole dataset's
    lo: int
    hi: int  # rows [lo, hi)
    fields: list[str]  # served to learners
    load_s: float

    def summary(self) -> dict:
        return {
            "source": self.source,
            "format": self.format,
            "rows": self.dataset_rows,
            "shard": [self.lo, self.hi],
            "shard_rows": self.hi - self.lo,
            "fields": self.fields,
            "load_s": round(self.load_s, 3),
        }


class ShardRows:
    """A shard's buffer, as the replay store samples it: every batch's ``row`` indices held to
    the shard's range (those outside counted), and taken out unless learners are to get them."""

    def __init__(self, buffer, lo: int, hi: int, serve_row: bool):
        self.buffer = buffer
        self.lo, self.hi = lo, hi
        self.serve_row = serve_row
        self.rows_served = 0
        self.rows_outside = 0  # a bug if ever > 0: this host's rows are [lo, hi)

    def __len__(self) -> int:
        return len(self.buffer)

    @property
    def added(self) -> int:
        return self.buffer.added

    def sample(self, *args):
        batch = self.buffer.sample(*args)
        rows = batch[ROW] if self.serve_row else batch.pop(ROW)
        self.rows_served += len(rows)
        self.rows_outside += int(np.count_nonzero((rows < self.lo) | (rows >= self.hi)))
        return batch

    def update_priorities(self, *args):
        return self.buffer.update_priorities(*args)


class DatasetStore(ReplayStore):
    """One memory host's shard of an offline run's dataset, served as a replay that never grows."""

    actor_kind = "batch"  # never sent: an offline run starts no actors, and the role refuses any

    def __init__(
        self,
        parts: StoreParts,
        shard_rows: ShardRows,
        rows: RowSpec,
        *,
        shard: Shard,
        batch_size: int,
        prioritized: bool,
    ):
        super().__init__(
            parts,
            shard_rows,
            rows,
            capacity=shard.hi - shard.lo,
            threshold=1,  # filled before the server starts
            batch_size=batch_size,
            prioritized=prioritized,
        )
        self.shard = shard
        self.shard_rows = shard_rows

    @classmethod
    def wanted(cls, cfg) -> bool:
        return cfg.offline.dataset is not None

    @classmethod
    def limiter(cls, cfg):
        return None  # nothing is inserted: learners are served as fast as they ask

    @classmethod
    def bytes_per_row(cls, cfg, algo, layout) -> int:
        return 0  # the shard is the dataset's rows, whatever agent.buffer_size says

    @classmethod
    def build(cls, cfg, algo, parts: StoreParts, rows: RowSpec, layout) -> DatasetStore:
        """Load this host's shard (the frame layout does not apply: rows keep their observations)."""
        t0 = time.perf_counter()
        a, c = cfg.agent, cfg.cluster
        dataset = run_dataset(cfg)
        lo, hi = shard_range(len(dataset), c.memories, parts.index)
        data = offline_rows(dataset, lo, hi, n_step=model_n_step(cfg), gamma=model_gamma(cfg))
        spec = algo.transition_spec()
        source = dataset.source or cfg.offline.dataset
        fields = dataset_fields(spec, data, algo, source)
        stored = {name: spec[name] for name in fields}
        stored.setdefault(ROW, ((), "<i8"))
        seed = cfg.run.seed + 1000 + parts.index
        if a.prioritized_replay:
            buffer = PrioritizedReplayBuffer(
                hi - lo, stored, alpha=a.prioritized_replay_alpha, eps=a.prioritized_replay_eps, seed=seed
            )
        else:
            buffer = ReplayBuffer(hi - lo, stored, seed=seed)
        arrays = {name: np.ascontiguousarray(data[name], dtype=dtype) for name, (_, dtype) in stored.items()}
        if a.prioritized_replay:
            buffer.add(arrays, np.ones(hi - lo))
        else:
            buffer.add(arrays)
        shard = Shard(source, dataset.format, len(dataset), lo, hi, fields, time.perf_counter() - t0)
        skipped = [name for name in spec if name not in stored]
        if skipped:
            parts.log.info("the dataset has no %s: learners get batches without it", ", ".join(skipped))
        return cls(
            parts,
            ShardRows(buffer, lo, hi, serve_row=ROW in spec),
            rows,
            shard=shard,
            batch_size=a.batch_size,
            prioritized=a.prioritized_replay,
        )

    # ------------------------------------------------------------------ no actors

    def accept(self, link: ActorLink, msg, fields: dict) -> None:
        raise BadMessage(f"{link.name} sent a batch, but this memory host serves a dataset")

    # ------------------------------------------------------------------ the role's life

    def announce(self, bind: str, port: int) -> None:
        s = self.shard
        self.log.info(
            "serving rows [%d, %d) of dataset %s (%d rows, %s) on %s:%s, loaded in %.2f s",
            s.lo,
            s.hi,
            s.source,
            s.dataset_rows,
            s.format or "?",
            bind,
            port,
            s.load_s,
        )

    def metrics(self) -> dict:
        return {
            "dataset/shard_rows": self.shard.hi - self.shard.lo,
            "dataset/rows_outside_shard": self.shard_rows.rows_outside,
        }

    def summary(self) -> dict:
        dataset = {
            **self.shard.summary(),
            "rows_served": self.shard_rows.rows_served,
            "rows_outside_shard": self.shard_rows.rows_outside,
        }
        return {**super().summary(), "dataset": dataset}

    def restore(self, snapshots: ReplaySnapshots) -> None:
        """Nothing to restore: the shard was loaded from the dataset."""

    def snapshots_every(self, snapshots: ReplaySnapshots, interval_s: float):
        return None

    async def save(self, snapshots: ReplaySnapshots) -> None:
        """No snapshot: the dataset is on disk already."""
