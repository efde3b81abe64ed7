"""The memory host's stores behind their one interface (`aiorl.runtime.memory.store.Store`):
each built from what the algorithm declares, a role that never asks which store it has, a
fourth store plugged in through the same builder served like the others, and the package's
classes reading only the `self` attributes they set, define or inherit."""

from __future__ import annotations

import ast
import asyncio
import importlib
import inspect
import pkgutil
import re
from pathlib import Path

import numpy as np
import pytest
from hostile_helpers import CONFIG, HANG_S, Memory0, batch

import aiorl.runtime.memory as memory_package
from aiorl.experiment.loading import load_config
from aiorl.replay import PrioritizedReplayBuffer, ReplayBuffer
from aiorl.runtime.memory import MemoryRole, build
from aiorl.runtime.memory.queue_store import QueueStore
from aiorl.runtime.memory.replay_store import ReplayStore
from aiorl.runtime.memory.rounds_store import RoundsStore
from aiorl.runtime.memory.store import Store, send_end

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

MEMORY_DIR = Path(memory_package.__file__).parent


def built(tmp_path, overrides: list[str]) -> tuple[MemoryRole, Store]:
    cfg = load_config(data=CONFIG, overrides=[f"run.dir={tmp_path}", *overrides])
    memory = MemoryRole(cfg, 0, tmp_path, b"t" * 32)
    return memory, build.build_store(cfg, memory.algorithm(), memory.store_parts())


@pytest.mark.parametrize(
    "overrides, kind, actor_kind, learner_kinds",
    [
        ([], ReplayStore, "batch", {"credit", "priorities"}),
        (["agent.prioritized_replay=false"], ReplayStore, "batch", {"credit"}),
        (["algo=impala", "model.network=[linear:8]"], QueueStore, "fragment", {"credit"}),
        (["algo=dppo"], RoundsStore, "rollout", {"credit"}),
        (["algo=es", "model.population=5", "model.noise_table_size=10000"], RoundsStore, "rollout", {"credit"}),
    ],
)
def test_each_store_is_built_from_what_the_algorithm_declares(tmp_path, overrides, kind, actor_kind, learner_kinds):
    memory, store = built(tmp_path, overrides)
    assert type(store) is kind and build.store_class(memory.cfg) is kind
    assert store.actor_kind == actor_kind and set(store.learner_kinds) == learner_kinds
    summary = store.summary()
    assert set(summary) == {"replay_size", "replay_added", "replay_frames", "queue", "rounds"}
    assert (summary["queue"] is not None) == (kind is QueueStore)
    assert (summary["rounds"] is not None) == (kind is RoundsStore)
    if kind is ReplayStore:
        prioritized = memory.cfg.agent.prioritized_replay
        assert type(store.replay) is (PrioritizedReplayBuffer if prioritized else ReplayBuffer)
        assert store.capacity() == memory.cfg.agent.buffer_size and memory.flow.limiter is None
    if kind is QueueStore:
        assert memory.flow.limiter is store.hub.room  # actors' credits as the queue has room
    else:
        assert store.capacity() == (memory.cfg.agent.buffer_size if kind is ReplayStore else 0)


def test_the_role_never_asks_which_store_it_has():
    asks = re.compile(
        r"self\.synchronous|self\.fragments is (not )?None|isinstance\(self\.replay|self\.rounds is"
        r"|self\.replay is (not )?None"
    )
    found = [
        f"{path.name}:{n}: {line.strip()}"
        for path in sorted(MEMORY_DIR.glob("*.py"))
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if asks.search(line)
    ]
    assert found == []


class Echo(Store):
    """A fourth kind of store: keeps the last batch and hands it to each credit."""

    actor_kind = "batch"
    learner_kinds = frozenset({"credit"})

    def __init__(self, parts, rows):
        super().__init__(parts)
        self.rows = rows
        self.kept: list[dict] = []
        self.closed: list[str] = []
        self.phases: list = []

    @classmethod
    def wanted(cls, cfg) -> bool:
        return True

    @classmethod
    def build(cls, cfg, algo, parts, rows, layout) -> Echo:
        return cls(parts, rows)

    def accept(self, link, msg, fields) -> None:
        n = self.rows.rows("batch", dict(msg.arrays))
        self.kept.append(dict(msg.arrays))
        self.tally.stored(link, n)
        self.changed.fire()

    def actor_closed(self, link) -> None:
        self.closed.append(link.name)

    def on_phase(self, phase) -> None:
        self.phases.append(phase)

    async def serve(self, conn, link, learner_index: int) -> None:
        await self.changed.wait_for(lambda: link.credits > 0 and self.kept)
        link.credits -= 1
        link.batches_sent += 1
        await conn.send("samples", {"memory": self.index}, self.kept[-1])
        await send_end(conn, link, self.index)

    def size(self) -> int:
        return len(self.kept)

    def metrics(self) -> dict:
        return {"echo/kept": len(self.kept)}

    def summary(self) -> dict:
        return {**super().summary(), "replay_size": len(self.kept), "echo": {"kept": len(self.kept)}}


async def test_a_fourth_store_plugged_in_through_the_builder_is_served(tmp_path, monkeypatch):
    monkeypatch.setattr(build, "STORES", [Echo, *build.STORES])
    async with Memory0(tmp_path) as m:
        _, actor_session = await m.register("actor-0")
        _, learner_session = await m.register("learner-0")
        await m.running()
        store = m.memory.store
        assert type(store) is Echo
        actor = await m.attach("actor-0", actor_session)
        learner = await m.attach("learner-0", learner_session)
        sent = batch(5)
        await actor.send("batch", {"actor": 0, "seq": 0}, sent)
        await learner.send("credit", {"n": 1})
        async with asyncio.timeout(HANG_S):
            samples = await learner.recv()
            end = await learner.recv()
        assert samples.kind == "samples" and end.kind == "end" and end.meta["batches_sent"] == 1
        np.testing.assert_array_equal(samples.arrays["obs"], sent["obs"])
        assert m.memory.inserted == 5 and m.memory.metrics()["echo/kept"] == 1
        assert m.memory.metrics()["replay_size"] == 1
        await m.until(lambda: store.phases, "the store told of the run's phase")
        await actor.send("actor_done", {})
        await m.until(lambda: store.closed == ["actor-0"], "the actor's end")
        summary = m.memory._summary()
        assert summary["echo"] == {"kept": 1} and summary["replay_size"] == 1 and summary["inserted"] == 5
        assert summary["actors"]["actor-0"]["finished"]


# ---------------------------------------------------------------- the package's classes own their state


def _self_reads_and_sets(cls_node: ast.ClassDef) -> tuple[dict[str, int], set[str]]:
    reads: dict[str, int] = {}
    sets: set[str] = set()
    for node in cls_node.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            sets.add(node.name)
        elif isinstance(node, ast.Assign):
            sets.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            sets.add(node.target.id)
    for node in ast.walk(cls_node):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
            if isinstance(node.ctx, ast.Store):
                sets.add(node.attr)
            else:
                reads.setdefault(node.attr, node.lineno)
    return reads, sets


def _provided(cls: type) -> set[str]:
    """What `cls` and its bases from aiorl set, define or declare (and what every object has)."""
    names = set(dir(object))
    for klass in cls.__mro__:
        if klass is object:
            continue
        if not klass.__module__.startswith("aiorl"):
            names.update(vars(klass))
            continue
        node = ast.parse(inspect.getsource(klass)).body[0]
        names.update(_self_reads_and_sets(node)[1])
    return names


def test_no_class_of_the_memory_host_reads_a_self_attribute_it_does_not_own():
    unowned = []
    for info in pkgutil.iter_modules([str(MEMORY_DIR)]):
        module = importlib.import_module(f"aiorl.runtime.memory.{info.name}")
        tree = ast.parse(Path(module.__file__).read_text())
        for node in tree.body:
            if not isinstance(node, ast.ClassDef):
                continue
            cls = getattr(module, node.name)
            reads, _ = _self_reads_and_sets(node)
            provided = _provided(cls)
            unowned += [f"{info.name}.{node.name}.{a} (line {line})" for a, line in reads.items() if a not in provided]
    assert unowned == []
