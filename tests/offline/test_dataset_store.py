"""The dataset store (`aiorl.runtime.memory.dataset_store`): an offline run's memory hosts each
serve one shard of the dataset's rows (every row in exactly one shard, n-step windows as the
whole dataset's), with the fields the algorithm's transition spec names, reloaded whole by a
restarted host; and a memory host with it serves learners on credits, as replay does."""

from __future__ import annotations

import asyncio
import sys

import gymnasium as gym
import numpy as np
import pytest
from hostile_helpers import HANG_S, Memory0

from aiorl.config import ConfigError, check_offline, check_offline_episodes, check_stops
from aiorl.experiment.loading import load_config
from aiorl.launch.panel import Progress, summary_line
from aiorl.offline.dataset import Dataset, DatasetError
from aiorl.offline.formats import load_dataset, write_dataset
from aiorl.offline.rows import offline_rows
from aiorl.runtime import dataset_source
from aiorl.runtime.coordinator.counters import RunCounters, stop_criterion
from aiorl.runtime.memory import MemoryRole, build
from aiorl.runtime.memory.dataset_store import DatasetStore, ShardRows, dataset_fields
from aiorl.runtime.memory.replay_store import ReplayStore
from aiorl.runtime.phase import Phase

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

SOURCE = "/data/cartpole-test"  # a config's; the `dataset` fixture writes one and points it there


def cartpole_like(rows: int = 203, seed: int = 0, propensity: bool = False) -> Dataset:
    """Episodes of 5 to 40 steps in CartPole's spaces (the last one cut short: truncated)."""
    rng = np.random.default_rng(seed)
    obs = rng.standard_normal((rows + 1, 4)).astype(np.float32)
    terminated = np.zeros(rows, bool)
    t = 0
    while True:
        t += int(rng.integers(5, 41))
        if t >= rows:
            break
        terminated[t - 1] = True
    truncated = np.zeros(rows, bool)
    truncated[-1] = not terminated[-1]
    return Dataset(
        obs=obs[:-1],
        action=rng.integers(0, 2, rows).astype(np.int64),
        reward=np.ones(rows, np.float32),
        next_obs=obs[1:],
        terminated=terminated,
        truncated=truncated,
        observation_space=gym.spaces.Box(-np.inf, np.inf, (4,), np.float32),
        action_space=gym.spaces.Discrete(2),
        propensity=rng.uniform(0.1, 1.0, rows) if propensity else None,
        env_id="CartPole-v1",
        source=SOURCE,
        format="aiorl",
    )


@pytest.fixture
def dataset(tmp_path, monkeypatch):
    """`cartpole_like()` written in aiorl's format at `SOURCE` (a path of this test's own), as
    every process reads it: how many times here, `.reads`."""
    data = cartpole_like()
    path = tmp_path / "cartpole-test"
    write_dataset(data, path)
    monkeypatch.setattr(sys.modules[__name__], "SOURCE", str(path))
    reads = []

    def counted(source, *args, **kwargs):
        reads.append(source)
        return load_dataset(source, *args, **kwargs)

    monkeypatch.setattr(dataset_source, "load_dataset", counted)
    monkeypatch.setattr(dataset_source, "_loaded", {})
    data.reads = reads
    return data


def offline_config(tmp_path, *overrides: str):
    data = {
        "algo": "apex_dqn",
        "offline": {"dataset": SOURCE},
        "agent": {"batch_size": 16, "prioritized_replay": False, "scheduled_global_steps": 100},
        "model": {"n_step": 3, "gamma": 0.9},
        "run": {"dir": str(tmp_path / "run"), "tensorboard": False},
    }
    return load_config(data=data, overrides=list(overrides))


def built(tmp_path, cfg, index: int) -> DatasetStore:
    memory = MemoryRole(cfg, index, tmp_path, b"t" * 32)
    return build.build_store(cfg, memory.algorithm(), memory.store_parts())


def stored(store: DatasetStore) -> dict[str, np.ndarray]:
    state = store.shard_rows.buffer.state_dict()
    return {k.removeprefix("field."): v for k, v in state.items() if k.startswith("field.")}


@pytest.mark.parametrize("memories", [1, 2, 3, 7])
def test_shards_hold_every_row_exactly_once_as_the_whole_datasets_rows(tmp_path, dataset, memories):
    cfg = offline_config(tmp_path, f"cluster.memories={memories}")
    assert build.store_class(cfg) is DatasetStore
    whole = offline_rows(dataset, 0, len(dataset), n_step=3, gamma=0.9)
    seen = []
    for index in range(memories):
        store = built(tmp_path, cfg, index)
        rows = stored(store)
        lo, hi = store.shard.lo, store.shard.hi
        np.testing.assert_array_equal(rows["row"], np.arange(lo, hi))
        for name in ("obs", "action", "reward", "next_obs", "done", "discount"):
            # n-step windows read past the shard's end, as the whole dataset's do
            np.testing.assert_allclose(rows[name], whole[name][lo:hi], err_msg=name)
        assert store.size() == store.capacity() == hi - lo and store.summary()["replay_size"] == hi - lo
        assert store.summary()["dataset"]["shard"] == [lo, hi]
        assert store.summary()["dataset"]["rows"] == len(dataset)
        seen.extend(rows["row"].tolist())
    assert sorted(seen) == list(range(len(dataset)))  # every row, once


def test_learners_get_the_fields_the_spec_names_and_the_dataset_gives(tmp_path, dataset):
    store = built(tmp_path, offline_config(tmp_path, "cluster.memories=2"), 1)
    spec = store.shard_rows.buffer.spec
    # apex_dqn's spec without its actors' epsilon, which a dataset cannot give; each row's index kept
    assert set(spec) == {"obs", "action", "reward", "next_obs", "done", "discount", "row"}
    batch = store.replay.sample(64)
    assert set(batch) == {"obs", "action", "reward", "next_obs", "done", "discount", "indices"}
    assert store.shard_rows.rows_served == 64 and store.shard_rows.rows_outside == 0
    assert store.summary()["dataset"]["fields"] == ["obs", "action", "reward", "next_obs", "done", "discount"]


class _Algo:
    name = "needy"
    dataset_optional_fields = frozenset({"epsilon"})


def test_a_field_the_dataset_cannot_give_is_one_line_naming_it():
    rows = offline_rows(cartpole_like(), 0, 10, n_step=1, gamma=0.99)
    spec = {"obs": ((4,), "<f4"), "propensity": ((), "<f8"), "epsilon": ((), "<f4"), "logp": ((), "<f4")}
    with pytest.raises(DatasetError) as err:
        dataset_fields(spec, rows, _Algo(), SOURCE)
    assert "propensity, logp" in str(err.value) and "epsilon" not in str(err.value).split("(")[0]
    assert "\n" not in str(err.value)
    with_propensity = offline_rows(cartpole_like(propensity=True), 0, 10, n_step=1, gamma=0.99)
    assert dataset_fields({"obs": ((4,), "<f4"), "propensity": ((), "<f8")}, with_propensity, _Algo(), SOURCE) == [
        "obs",
        "propensity",
    ]
    with pytest.raises(DatasetError, match=r"field obs has rows of shape \[4\], needy expects \[8\]"):
        dataset_fields({"obs": ((8,), "<f4")}, rows, _Algo(), SOURCE)


def test_a_row_outside_the_shard_is_counted_and_the_row_field_served_only_when_named():
    from aiorl.replay import ReplayBuffer

    buffer = ReplayBuffer(4, {"x": ((), "<f4"), "row": ((), "<i8")}, seed=0)
    buffer.add({"x": np.zeros(4, np.float32), "row": np.array([10, 11, 12, 14])})
    shard = ShardRows(buffer, 10, 13, serve_row=False)
    batch = shard.sample(400)
    assert "row" not in batch and shard.rows_served == 400
    assert 40 < shard.rows_outside < 200  # row 14 is not in [10, 13)
    served = ShardRows(buffer, 10, 15, serve_row=True)
    assert "row" in served.sample(8) and served.rows_outside == 0


def test_a_restarted_memory_host_reloads_its_shard_and_keeps_no_snapshot(tmp_path, dataset):
    cfg = offline_config(tmp_path, "cluster.memories=2", "run.snapshot_replay=true")
    first = built(tmp_path, cfg, 1)
    dataset_source._loaded.clear()  # a new process: nothing read yet
    again = built(tmp_path, cfg, 1)
    assert len(dataset.reads) == 2
    for name, values in stored(first).items():
        np.testing.assert_array_equal(values, stored(again)[name])
    assert again.snapshots_every(None, 1.0) is None
    again.restore(None)  # nothing to restore from: the dataset is the data
    assert again.size() == first.size()


def test_prioritized_shards_start_at_priority_one_and_take_learners_priorities(tmp_path, dataset):
    store = built(tmp_path, offline_config(tmp_path, "agent.prioritized_replay=true"), 0)
    assert isinstance(store, ReplayStore) and store.learner_kinds == {"credit", "priorities"}
    tree = store.shard_rows.buffer.state_dict()["priorities"]
    assert np.allclose(tree, tree[0])  # every row at the same (initial) priority
    batch = store.replay.sample(8, 0.4)
    assert set(batch) >= {"indices", "weights", "generations"} and "row" not in batch
    stale = store.shard_rows.update_priorities(batch["indices"], np.full(8, 5.0), batch["generations"])
    assert stale == 0  # a shard is never overwritten


def test_bad_dataset_or_actors_are_refused_before_any_row_is_served(tmp_path, dataset):
    cfg = offline_config(tmp_path)
    cfg.offline.dataset = "/data/missing"
    with pytest.raises(DatasetError, match="no such file or directory"):
        built(tmp_path, cfg, 0)
    small = offline_config(tmp_path, "cluster.memories=300")
    dataset_source._loaded.clear()
    with pytest.raises(DatasetError, match="203 rows cannot make 300 shards"):
        built(tmp_path, small, 0)


async def test_a_memory_host_serves_its_shard_to_a_learner_on_credits(tmp_path, dataset):
    overrides = [
        "algo=apex_dqn",
        f"offline.dataset={SOURCE}",
        "cluster.actors=0",
        "agent.scheduled_timesteps=null",
        "agent.scheduled_global_steps=100",
        "agent.prioritized_replay=false",
    ]
    async with Memory0(tmp_path, overrides) as m:
        _, session = await m.register("learner-0")
        await m.running()
        assert type(m.memory.store) is DatasetStore
        assert m.coordinator.metrics_row()["epochs"] == 0.0 and m.coordinator.status()["epochs"] == 0.0
        learner = await m.attach("learner-0", session)
        await learner.send("credit", {"n": 2})
        async with asyncio.timeout(HANG_S):
            batches = [await learner.recv(), await learner.recv()]
        assert [b.kind for b in batches] == ["samples", "samples"]
        assert set(batches[0].arrays) == {"obs", "action", "reward", "next_obs", "done", "discount", "indices"}
        assert len(batches[0].arrays["obs"]) == m.cfg.agent.batch_size
        m.memory._set_phase(Phase.DRAINING)
        async with asyncio.timeout(HANG_S):
            end = await learner.recv()
        assert end.kind == "end" and end.meta["batches_sent"] == 2
        summary = m.memory._summary()
        served = 2 * m.cfg.agent.batch_size
        assert summary["dataset"]["rows_outside_shard"] == 0 and summary["dataset"]["rows_served"] == served
        assert summary["sampled"] == served and summary["inserted"] == 0
        assert m.memory.metrics()["dataset/shard_rows"] == len(dataset)


def test_a_dataset_whose_spaces_are_not_the_envs_is_one_line(tmp_path, dataset):
    with pytest.raises(DatasetError) as err:
        built(tmp_path, offline_config(tmp_path, "env.id=Acrobot-v1"), 0)
    assert "observation space is Box(4,), the env's is Box(6,)" in str(err.value) and "\n" not in str(err.value)
    dataset_source._loaded.clear()
    assert built(tmp_path, offline_config(tmp_path, "env.id=CartPole-v1"), 0).shard.hi == len(dataset)


def test_offline_epochs_stop_the_run_at_that_many_passes_over_the_dataset(tmp_path, dataset):
    cfg = offline_config(tmp_path, "offline.epochs=2", "agent.scheduled_global_steps=null")
    counters = RunCounters()
    steps = -(-2 * len(dataset) // cfg.agent.batch_size)  # 203 rows, batches of 16: 26 steps make 2 passes
    counters.base["learner_steps"] = steps - 1
    assert counters.epochs(cfg) == pytest.approx((steps - 1) * 16 / 203) and stop_criterion(cfg, counters) is None
    counters.base["learner_steps"] = steps
    reason, counter = stop_criterion(cfg, counters)
    assert (
        reason.startswith("reached offline.epochs (2.05 passes over the dataset's 203 rows")
        and counter == "learner_steps"
    )
    online = load_config(data={"algo": "apex_dqn", "agent": {"scheduled_global_steps": 5}})
    assert RunCounters().epochs(online) is None


@pytest.mark.parametrize(
    "data, message",
    [
        ({"cluster": {"actors": 2}}, "cluster.actors: an offline run (offline.dataset) takes no actors"),
        ({"agent": {"scheduled_timesteps": 100}}, "agent.scheduled_timesteps: an offline run takes no env steps"),
        ({"agent": {"samples_per_insert": 2.0}}, "agent.samples_per_insert: an offline run inserts nothing"),
        ({"algo": "dppo", "model": {}}, "offline.dataset: dppo learns from rollouts its actors make"),
        ({"offline": {"dataset": SOURCE, "format": "csv"}}, "offline.format: expected one of 'aiorl', 'easyrl'"),
        ({"offline": {"dataset": SOURCE, "epochs": 0}}, "offline.epochs: must be > 0, got 0"),
        ({"offline": {"dataset": None, "epochs": 2}}, "offline.epochs: set for an online run"),
        ({"env": {"id": None, "wrappers": ["FlattenObservation"]}}, "env.wrappers: set, but env.id is null"),
    ],
)
def test_offline_configs_that_cannot_work_are_one_line_naming_the_key(tmp_path, data, message):
    base = {
        "algo": "apex_dqn",
        "offline": {"dataset": SOURCE},
        "agent": {"scheduled_global_steps": 10},
        "model": {"n_step": 3},
    }
    for key, value in data.items():
        base[key] = {**base.get(key, {}), **value} if isinstance(value, dict) and key != "model" else value
    with pytest.raises(ConfigError) as err:
        load_config(data=base)
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


def test_an_offline_run_defaults_to_no_actors_and_no_env_and_stops_by_epochs(tmp_path):
    cfg = load_config(data={"algo": "apex_dqn", "offline": {"dataset": SOURCE, "epochs": 1}})
    assert cfg.cluster.actors == 0 and cfg.env.id is None and cfg.subject == "dataset-cartpole-test"
    check_stops(cfg)  # offline.epochs is a stop
    with pytest.raises(ConfigError, match="the offline run has no stop criterion"):
        check_stops(load_config(data={"algo": "apex_dqn", "offline": {"dataset": SOURCE}}))
    with_env = load_config(data={"algo": "apex_dqn", "offline": {"dataset": SOURCE}, "env": {"id": "CartPole-v1"}})
    assert with_env.env.id == "CartPole-v1" and with_env.subject == "CartPole-v1"
    with pytest.raises(ConfigError, match="agent.target_return: an offline run's return comes from evaluation"):
        check_offline_episodes(load_config(data={**with_env.to_dict(), "model": None, "agent": {"target_return": 1}}))
    with pytest.raises(ConfigError, match="with env.id null an evaluation has no episodes"):
        check_offline_episodes(
            load_config(data={"algo": "apex_dqn", "offline": {"dataset": SOURCE}, "run": {"eval_every": 5}})
        )


def test_an_algorithm_that_learns_from_logged_data_only_needs_a_dataset():
    online = load_config(data={"algo": "apex_dqn", "agent": {"scheduled_global_steps": 5}})
    with pytest.raises(
        ConfigError, match="offline.dataset: apex_dqn learns from logged data only: set offline.dataset"
    ):
        check_offline(online, offline_only=True, keeps_replay=True)
    check_offline(online, offline_only=False, keeps_replay=True)


def test_the_panel_shows_epochs_where_an_offline_run_has_no_env_steps(tmp_path):
    row = {"env_steps": 0, "learner_steps": 640, "epochs": 3.5, "return_mean_100": None, "replay_size": 2000}
    assert summary_line(row).startswith("epochs 3.50  learner 640")
    assert summary_line({**row, "epochs": None}).startswith("epochs -  learner")  # an offline row, always
    online = {k: v for k, v in row.items() if k != "epochs"}
    assert summary_line(online).startswith("env 0 (-/s)")
    cfg = load_config(data={"algo": "apex_dqn", "offline": {"dataset": SOURCE, "epochs": 10}})
    progress = Progress(cfg, tmp_path, quiet=True)
    state = progress.state
    assert (state.goal_key, state.goal, state.store) == ("epochs", 10, "dataset")
    assert state.title == "aiorl apex_dqn on dataset-cartpole-test"
    state.row = row
    assert state.store_text() == "2,000 rows" and state.counters()["epochs"] == 3.5


def test_the_preflight_refuses_a_dataset_the_algorithm_cannot_learn_from(tmp_path, dataset, monkeypatch):
    from aiorl.algos.apex_dqn import ApexDQN
    from aiorl.experiment.preflight import check_algorithm

    check_algorithm(offline_config(tmp_path))
    monkeypatch.setattr(ApexDQN, "dataset_optional_fields", frozenset())  # as if it needed its epsilon
    with pytest.raises(ConfigError) as err:
        check_algorithm(offline_config(tmp_path))
    assert str(err.value).startswith(f"offline.dataset: {SOURCE}: apex_dqn learns from epsilon, which this dataset")
