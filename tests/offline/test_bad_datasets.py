"""Bad datasets, each through `aiorl run CONFIG` with ``offline.dataset`` pointing at it: one line
on stderr naming the file, the field and (where there is one) the row, exit 2, before any process
starts and with nothing written (no run directory). The same datasets through `load_dataset`
raise `DatasetError` with that line.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

from aiorl.offline.dataset import Dataset, DatasetError
from aiorl.offline.formats import load_dataset, write_dataset
from aiorl.offline.formats.native import DATA_FILE

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

ROWS = 200
EASYRL_LINE = "0.1,0.2,0.3,0.4\t1\t1.0\t0\t0.2,0.3,0.4,0.5\n"


def cartpole_like(rows: int = ROWS) -> Dataset:
    rng = np.random.default_rng(0)
    obs = rng.uniform(-0.1, 0.1, (rows + 1, 4)).astype(np.float32)
    terminated = np.zeros(rows, bool)
    terminated[49::50] = True
    env = gym.make("CartPole-v1")
    return Dataset(
        obs=obs[:-1],
        action=rng.integers(0, 2, rows).astype(np.int64),
        reward=np.ones(rows, np.float32),
        next_obs=obs[1:],
        terminated=terminated,
        truncated=np.zeros(rows, bool),
        observation_space=env.observation_space,
        action_space=env.action_space,
        propensity=np.full(rows, 0.5),
        env_id="CartPole-v1",
    )


def native(tmp_path: Path, change=None) -> Path:
    data = cartpole_like()
    if change is not None:
        change(data)
    return write_dataset(data, tmp_path / "dataset")


def drop_reward(tmp_path: Path) -> Path:
    path = native(tmp_path)
    from aiorl.io.tensor_file import read_tensors, write_tensors

    arrays = read_tensors(path / DATA_FILE, 1 << 30)
    del arrays["reward"]
    with open(path / DATA_FILE, "wb") as f:
        write_tensors(f, arrays)
    return path


def truncate(tmp_path: Path) -> Path:
    path = native(tmp_path)
    blob = (path / DATA_FILE).read_bytes()
    (path / DATA_FILE).write_bytes(blob[: len(blob) * 2 // 3])
    return path


def easyrl(tmp_path: Path, bad_line: str, at: int = 6) -> Path:
    lines = [EASYRL_LINE] * 10
    lines[at] = bad_line
    path = tmp_path / "log.offline_data"
    path.write_text("".join(lines))
    return path


def set_entry(field: str, row: int, value):
    def change(data: Dataset) -> None:
        getattr(data, field)[row] = value

    return change


def pendulum_dataset(tmp_path: Path) -> Path:
    data = cartpole_like()
    data.obs, data.next_obs = data.obs[:, :3], data.next_obs[:, :3]
    data.observation_space = gym.make("Pendulum-v1").observation_space
    return write_dataset(data, tmp_path / "dataset")


def not_a_dataset(tmp_path: Path) -> Path:
    path = tmp_path / "notes.csv"
    path.write_text("time,price\n1,2\n")
    return path


def empty(tmp_path: Path) -> Path:
    data = cartpole_like().slice(0, 0)
    return write_dataset(data, tmp_path / "dataset")


# (name, how to make it, what the one line must say)
BAD = [
    ("not a dataset", not_a_dataset, ["notes.csv", "field 'format'", "not a dataset"]),
    ("missing field", drop_reward, ["field 'reward' is missing"]),
    (
        "ragged fields",
        lambda p: native(p, lambda d: setattr(d, "next_obs", d.next_obs[:-1])),
        ["field 'next_obs' has 199 rows", "ragged"],
    ),
    ("NaN", lambda p: native(p, set_entry("obs", 17, np.nan)), ["field 'obs' row 17", "NaN"]),
    ("inf", lambda p: easyrl(p, "0.1,0.2,0.3,0.4\t1\tinf\t0\t0.2,0.3,0.4,0.5\n", at=4), ["field 'reward' row 4"]),
    ("action outside", lambda p: native(p, set_entry("action", 9, 2)), ["field 'action' row 9", "outside Discrete(2)"]),
    (
        "shape mismatch",
        lambda p: easyrl(p, "0.1,0.2,0.3\t1\t1.0\t0\t0.2,0.3,0.4\n", at=6),
        ["row 6 (line 7)", "field 'obs'", "ragged"],
    ),
    ("spaces not the env's", pendulum_dataset, ["field 'obs'", "Box(3,)", "Box(4,)"]),
    ("truncated file", truncate, [DATA_FILE, "field 'next_obs' row", "truncated"]),
    ("empty", empty, ["field 'reward'", "no rows"]),
    ("easyrl columns", lambda p: easyrl(p, "0.1,0.2\t1\t1.0\n", at=3), ["row 3 (line 4)", "field 'done'", "columns"]),
    ("propensity zero", lambda p: native(p, set_entry("propensity", 5, 0.0)), ["field 'propensity' row 5"]),
]


def run_config(dataset: Path, run_dir: Path) -> dict:
    return {
        "algo": "apex_dqn",
        "env": {"id": "CartPole-v1"},
        "offline": {"dataset": str(dataset)},
        "cluster": {"memories": 1, "learners": 1},
        "agent": {"batch_size": 32, "scheduled_global_steps": 10},
        "model": {"network": ["linear:32", "relu"]},
        "run": {"tensorboard": False, "dir": str(run_dir)},
    }


@pytest.mark.parametrize("name, make, words", BAD, ids=[b[0] for b in BAD])
def test_a_bad_dataset_is_one_line_from_load_dataset(tmp_path, name, make, words):
    path = make(tmp_path)
    env = gym.make("CartPole-v1")
    with pytest.raises(DatasetError) as err:
        load_dataset(path, observation_space=env.observation_space, action_space=env.action_space)
    line = str(err.value)
    assert "\n" not in line and str(path.name) in line, line
    for word in words:
        assert word in line, line


@pytest.mark.parametrize("name, make, words", BAD, ids=[b[0] for b in BAD])
def test_a_bad_dataset_stops_aiorl_run_before_anything_starts(tmp_path, name, make, words):
    work = tmp_path / "work"
    work.mkdir()
    path = make(work)
    config = tmp_path / "config.json"
    config.write_text(json.dumps(run_config(path, work / "run")))
    before = sorted(p.relative_to(work) for p in work.rglob("*"))
    result = subprocess.run(
        [sys.executable, "-m", "aiorl", "run", str(config), "--quiet"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=work,
    )
    assert result.returncode == 2, result
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("aiorl: config error: offline.dataset: "), result.stderr
    assert str(path) in lines[0], lines[0]
    for word in words:
        assert word in lines[0], lines[0]
    assert sorted(p.relative_to(work) for p in work.rglob("*")) == before  # no run directory, nothing written
