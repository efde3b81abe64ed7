"""Dataset formats (`aiorl.offline.formats`): each round trip (aiorl's own, EasyRL's lines, Minari,
Ape-X replay snapshots), EasyRL's demo data as EasyRL writes it, a dataset written by Minari's own
DataCollector, and `aiorl collect --format minari` output opened by `minari.load_dataset`."""

from __future__ import annotations

import json
import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest

from aiorl.offline.dataset import Dataset, DatasetError
from aiorl.offline.formats import detect_format, load_dataset, write_dataset
from aiorl.offline.formats.native import DATA_FILE, META_FILE

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning")

# The first and last lines of EasyRL's demo/train_catpole.offline_data (github.com/alibaba/EasyRL),
# byte for byte: its last line ends an episode and has no newline after it.
EASYRL_DEMO = (
    "-0.014016674582339475,0.045601178766084535,-0.049824084741792056,-0.022208854658584933\t1\t1.0\t0\t"
    "-0.013104651007017784,0.24140093832149168,-0.05026826183496375,-0.33018624470577423\n"
    "-0.013104651007017784,0.24140093832149168,-0.05026826183496375,-0.33018624470577423\t0\t1.0\t0\t"
    "-0.008276632240587951,0.04702925730574986,-0.05687198672907924,-0.053769659349925225\n"
    "-0.008276632240587951,0.04702925730574986,-0.05687198672907924,-0.053769659349925225\t1\t1.0\t0\t"
    "-0.007336047094472954,0.24291860791743947,-0.05794737991607775,-0.36383997368842236\n"
    "2.1738240122465173,0.9619767486167253,0.007626678571873458,-0.1428839643727708\t0\t1.0\t1\t"
    "2.193063547218852,0.7667464067096187,0.004768999284418042,0.15219525343307777"
)


def cartpole_steps(rows: int = 300, seed: int = 0, propensity: bool = True) -> Dataset:
    """CartPole steps of a pole-angle heuristic with 30% random actions (and its propensities)."""
    env = gym.make("CartPole-v1")
    rng = np.random.default_rng(seed)
    cols = {k: [] for k in ("obs", "action", "reward", "next_obs", "terminated", "truncated", "propensity")}
    obs, _ = env.reset(seed=seed)
    while len(cols["obs"]) < rows:
        greedy = int(obs[2] + 0.5 * obs[3] > 0)
        action = greedy if rng.random() >= 0.3 else int(rng.integers(2))
        nxt, reward, terminated, truncated, _ = env.step(action)
        for k, v in zip(cols, (obs, action, reward, nxt, terminated, truncated)):
            cols[k].append(v)
        cols["propensity"].append(0.85 if action == greedy else 0.15)
        obs = env.reset()[0] if terminated or truncated else nxt
    cols["truncated"][-1] = not cols["terminated"][-1]
    return Dataset(
        obs=np.array(cols["obs"], np.float32),
        action=np.array(cols["action"], np.int64),
        reward=np.array(cols["reward"], np.float32),
        next_obs=np.array(cols["next_obs"], np.float32),
        terminated=np.array(cols["terminated"], bool),
        truncated=np.array(cols["truncated"], bool),
        observation_space=env.observation_space,
        action_space=env.action_space,
        propensity=np.array(cols["propensity"]) if propensity else None,
        env_id="CartPole-v1",
    )


def pendulum_steps(rows: int = 250, seed: int = 0) -> Dataset:
    env = gym.make("Pendulum-v1")
    rng = np.random.default_rng(seed)
    obs = rng.uniform(-1, 1, (rows + 1, 3)).astype(np.float32)
    terminated = np.zeros(rows, bool)
    truncated = np.zeros(rows, bool)
    truncated[99::100] = True
    truncated[-1] = True
    return Dataset(
        obs=obs[:-1],
        action=rng.uniform(-2, 2, (rows, 1)).astype(np.float32),
        reward=rng.standard_normal(rows).astype(np.float32),
        next_obs=obs[1:],
        terminated=terminated,
        truncated=truncated,
        observation_space=env.observation_space,
        action_space=env.action_space,
        propensity=rng.uniform(0.1, 1.0, rows),
        env_id="Pendulum-v1",
    )


def assert_same_rows(got: Dataset, want: Dataset, propensity: bool = True) -> None:
    for name in ("obs", "action", "reward", "next_obs", "terminated", "truncated"):
        np.testing.assert_allclose(getattr(got, name), getattr(want, name), rtol=1e-6, err_msg=name)
    if propensity:
        np.testing.assert_allclose(got.propensity, want.propensity, err_msg="propensity")


@pytest.mark.parametrize("make", [cartpole_steps, pendulum_steps])
def test_aiorl_format_round_trips_every_field_and_the_spaces(tmp_path, make):
    data = make()
    write_dataset(data, tmp_path / "d", collected={"by": "a test"})
    meta = json.loads((tmp_path / "d" / META_FILE).read_text())
    assert meta["format"] == "aiorl.dataset" and meta["version"] == 1
    assert meta["rows"] == len(data) and meta["episodes"] == len(data.episode_ends)
    assert meta["fields"]["obs"] == {"shape": list(data.obs.shape), "dtype": "F32"}
    assert meta["collected"] == {"by": "a test"} and meta["env_id"] == data.env_id
    assert detect_format(str(tmp_path / "d")) == "aiorl"
    back = load_dataset(tmp_path / "d")
    assert back.format == "aiorl" and back.env_id == data.env_id and back.source == str(tmp_path / "d")
    assert back.observation_space == data.observation_space and back.action_space == data.action_space
    assert_same_rows(back, data)
    assert back.obs.dtype == np.float32 and back.propensity.dtype == np.float64


def test_aiorl_format_without_propensities_reads_none(tmp_path):
    write_dataset(cartpole_steps(propensity=False), tmp_path / "d")
    assert load_dataset(tmp_path / "d").propensity is None


def test_easyrl_demo_lines_read_as_easyrl_writes_them(tmp_path):
    path = tmp_path / "train_catpole.offline_data"
    path.write_text(EASYRL_DEMO)
    assert detect_format(str(path)) == "easyrl"
    data = load_dataset(path)
    assert data.format == "easyrl" and len(data) == 4
    assert data.action_space == gym.spaces.Discrete(2)
    assert data.observation_space.shape == (4,)
    assert data.action.tolist() == [1, 0, 1, 0] and data.action.dtype == np.int64
    assert data.reward.tolist() == [1.0] * 4
    assert data.terminated.tolist() == [False, False, False, True] and not data.truncated.any()
    assert data.obs[0, 1] == np.float32(0.045601178766084535)
    assert data.next_obs[3, 3] == np.float32(0.15219525343307777)
    np.testing.assert_array_equal(data.next_obs[0], data.obs[1])


def test_a_log_that_stops_mid_episode_ends_it_truncated(tmp_path):
    path = tmp_path / "log.txt"
    path.write_text("\n".join(EASYRL_DEMO.split("\n")[:3]))  # no line ends an episode
    data = load_dataset(path)
    assert not data.terminated.any() and data.truncated.tolist() == [False, False, True]


def test_easyrl_lines_take_the_env_spaces_when_given(tmp_path):
    path = tmp_path / "log.txt"
    path.write_text(EASYRL_DEMO)
    env = gym.make("CartPole-v1")
    data = load_dataset(path, "easyrl", observation_space=env.observation_space, action_space=env.action_space)
    assert data.observation_space == env.observation_space and data.action_space == env.action_space


def test_easyrl_round_trip_of_box_actions(tmp_path):
    data = pendulum_steps()
    write_dataset(data, tmp_path / "log.tsv", "easyrl")
    back = load_dataset(tmp_path / "log.tsv")
    assert back.action_space.shape == (1,) and not hasattr(back.action_space, "n")
    np.testing.assert_allclose(back.action, data.action)
    np.testing.assert_allclose(back.obs, data.obs)
    # EasyRL's done is one flag: every episode end reads as terminated
    np.testing.assert_array_equal(back.terminated, data.terminated | data.truncated)


def test_easyrl_round_trip_of_discrete_actions(tmp_path):
    data = cartpole_steps()
    write_dataset(data, tmp_path / "log.tsv", "easyrl")
    back = load_dataset(tmp_path / "log.tsv")
    assert back.action_space == gym.spaces.Discrete(2)
    np.testing.assert_array_equal(back.action, data.action)
    np.testing.assert_allclose(back.next_obs, data.next_obs)
    np.testing.assert_array_equal(back.reward, data.reward)


def test_minari_round_trip_by_path_and_by_id(tmp_path, monkeypatch):
    pytest.importorskip("minari")
    data = cartpole_steps()
    write_dataset(data, tmp_path / "cartpole-test-v0", "minari")
    assert detect_format(str(tmp_path / "cartpole-test-v0")) == "minari"
    back = load_dataset(tmp_path / "cartpole-test-v0")
    assert back.format == "minari" and back.env_id == "CartPole-v1"
    assert_same_rows(back, data)
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path))
    assert_same_rows(load_dataset("cartpole-test-v0"), data)
    assert_same_rows(load_dataset("cartpole-test-v0", "minari"), data)


def test_a_dataset_written_by_minaris_own_data_collector_reads(tmp_path, monkeypatch):
    minari = pytest.importorskip("minari")
    pytest.importorskip("jax", reason="minari's DataCollector needs minari[create] (jax)")
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path))
    env = minari.DataCollector(gym.make("CartPole-v1"))
    steps = []
    for episode in range(3):
        env.reset(seed=episode)
        done = False
        while not done:
            _, _, terminated, truncated, _ = env.step(env.action_space.sample())
            steps.append((terminated, truncated))
            done = terminated or truncated
    env.create_dataset(dataset_id="cartpole/random-v0", algorithm_name="random", code_permalink="x", author="t")
    data = load_dataset("cartpole/random-v0")
    md = minari.load_dataset("cartpole/random-v0")
    assert len(data) == md.total_steps == len(steps)
    assert data.terminated.sum() + data.truncated.sum() == 3 and data.propensity is None
    episodes = list(md.iterate_episodes())
    np.testing.assert_array_equal(data.obs[: len(episodes[0].rewards)], episodes[0].observations[:-1])
    np.testing.assert_array_equal(data.next_obs[len(episodes[0].rewards) - 1], episodes[0].observations[-1])
    np.testing.assert_array_equal(data.action, np.concatenate([e.actions for e in episodes]))
    assert data.action_space == gym.spaces.Discrete(2) and data.env_id == "CartPole-v1"


def test_aiorl_collect_format_minari_opens_with_minari_load_dataset(tmp_path, monkeypatch):
    minari = pytest.importorskip("minari")
    out = tmp_path / "cartpole-random-v0"
    cmd = [sys.executable, "-m", "aiorl", "collect", "random", "--env", "CartPole-v1", "-o", str(out)]
    result = subprocess.run([*cmd, "--episodes", "5", "--format", "minari"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path))
    md = minari.load_dataset("cartpole-random-v0")
    assert md.total_episodes == 5
    data = load_dataset(out)
    assert len(data) == md.total_steps and data.propensity is not None
    np.testing.assert_allclose(data.propensity, 0.5)


def snapshot_of(data: Dataset, path, capacity: int = 512) -> None:
    """An Ape-X DQN replay snapshot of `data`'s rows, written as a memory host writes it."""
    from aiorl.replay import ReplayBuffer

    spec = {
        "obs": ((4,), "<f4"),
        "action": ((), "<i8"),
        "reward": ((), "<f4"),
        "next_obs": ((4,), "<f4"),
        "done": ((), "|b1"),
        "discount": ((), "<f4"),
        "epsilon": ((), "<f4"),
    }
    replay = ReplayBuffer(capacity, spec, seed=0)
    replay.add(
        {
            "obs": data.obs,
            "action": data.action,
            "reward": data.reward,
            "next_obs": data.next_obs,
            "done": data.terminated,
            "discount": np.full(len(data), 0.99, np.float32),
            "epsilon": np.full(len(data), 0.1, np.float32),
        }
    )
    replay.save(path)


def test_replay_snapshots_read_as_rows_each_its_own_episode(tmp_path):
    data = cartpole_steps(rows=200)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    snapshot_of(data.slice(0, 120), run_dir / "replay-memory-0.npz")
    snapshot_of(data.slice(120, 200), run_dir / "replay-memory-1.npz")
    (run_dir / "config.yaml").write_text("algo: apex_dqn\nenv:\n  id: CartPole-v1\n")
    assert detect_format(str(run_dir)) == "snapshot"
    back = load_dataset(run_dir)
    assert back.format == "snapshot" and len(back) == 200 and back.env_id == "CartPole-v1"
    assert back.observation_space == data.observation_space and back.action_space == gym.spaces.Discrete(2)
    np.testing.assert_array_equal(back.obs, data.obs)
    np.testing.assert_array_equal(back.action, data.action)
    np.testing.assert_array_equal(back.terminated, data.terminated)
    np.testing.assert_array_equal(back.truncated, ~data.terminated)
    assert back.propensity is None
    one = load_dataset(run_dir / "replay-memory-1.npz")
    assert len(one) == 80 and one.action_space == gym.spaces.Discrete(2)
    np.testing.assert_array_equal(one.next_obs, data.next_obs[120:])


def test_a_snapshot_without_a_run_config_infers_the_spaces(tmp_path):
    data = cartpole_steps(rows=50)
    snapshot_of(data, tmp_path / "replay-memory-0.npz")
    back = load_dataset(tmp_path / "replay-memory-0.npz", "snapshot")
    assert back.action_space == gym.spaces.Discrete(int(data.action.max()) + 1)
    assert back.observation_space.shape == (4,)


def test_spaces_are_checked_against_the_envs(tmp_path):
    write_dataset(cartpole_steps(), tmp_path / "d")
    pendulum = gym.make("Pendulum-v1")
    with pytest.raises(DatasetError) as err:
        load_dataset(tmp_path / "d", observation_space=pendulum.observation_space)
    assert "field 'obs'" in str(err.value) and "Box(3,)" in str(err.value) and str(tmp_path / "d") in str(err.value)
    with pytest.raises(DatasetError, match="Discrete\\(3\\)"):
        load_dataset(tmp_path / "d", action_space=gym.spaces.Discrete(3))
    cartpole = gym.make("CartPole-v1")
    load_dataset(tmp_path / "d", observation_space=cartpole.observation_space, action_space=cartpole.action_space)


def test_a_named_format_that_does_not_fit_is_one_line(tmp_path):
    write_dataset(cartpole_steps(), tmp_path / "d")
    with pytest.raises(DatasetError, match="no dataset.json"):
        load_dataset(tmp_path / "d" / DATA_FILE, "aiorl")
    with pytest.raises(DatasetError, match="'parquet' is not one of"):
        load_dataset(tmp_path / "d", "parquet")


def test_without_minari_a_minari_dataset_names_the_extra(tmp_path, monkeypatch):
    pytest.importorskip("minari")
    write_dataset(cartpole_steps(rows=20), tmp_path / "c-v0", "minari")
    monkeypatch.setitem(sys.modules, "minari", None)  # import minari raises ImportError
    with pytest.raises(DatasetError) as err:
        load_dataset(tmp_path / "c-v0")
    assert "pip install 'aiorl[offline]'" in str(err.value) and "\n" not in str(err.value)
