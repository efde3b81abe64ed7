"""`aiorl config`: the reference is generated from the dataclasses and loads back (issue 15)."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest
import yaml

from aiorl.algos import available_algorithms, get_settings
from aiorl.cli.main import main
from aiorl.config import check_stops
from aiorl.experiment import reference as config_reference
from aiorl.experiment.loading import load_config
from aiorl.offline.dataset import Dataset
from aiorl.offline.formats import write_dataset
from aiorl.runtime.algorithm import Algorithm
from aiorl.runtime.evaluator import evaluation_on


@pytest.mark.parametrize("algo", available_algorithms())
def test_config_algo_prints_every_key_with_its_doc_and_loads_back(algo, tmp_path, capsys):
    assert main(["config", algo]) == 0
    text = capsys.readouterr().out
    path = tmp_path / "cfg.yaml"
    path.write_text(text)
    cfg = load_config(path)  # what `aiorl run` loads
    assert cfg.algo == algo
    # The defaults, every one, but the starter's budget and evaluation: a config that stops.
    starter = get_settings(algo).starter
    expected = load_config(data={"algo": algo}, overrides=[f"{k}={v}" for k, v in starter.items()])
    assert cfg.to_dict() == expected.to_dict()
    check_stops(cfg)
    assert cfg.agent.scheduled_timesteps or cfg.agent.scheduled_global_steps
    if algo != "random_agent":  # it learns nothing worth evaluating
        assert evaluation_on(cfg)
    data = yaml.safe_load(text)
    for key in config_reference.keys(algo):
        section, name = key.path.split(".", 1)
        assert name in data[section], key.path
        if key.doc:
            assert f"# {key.doc}" in text, key.path
    for f in dataclasses.fields(get_settings(algo).model_config):
        assert f.name in data["model"]


@pytest.mark.parametrize("algo", available_algorithms())
def test_a_loaded_config_binds_the_whole_algorithm_on_its_settings(algo):
    # Loading reads the settings only (no torch); the runtime gets the algorithm built on them.
    data = {"algo": algo}
    if get_settings(algo).offline_only:  # it learns from a dataset: a config names one
        data["offline"] = {"dataset": "x"}
    algorithm = load_config(data=data).algorithm
    assert issubclass(algorithm, Algorithm) and issubclass(algorithm, get_settings(algo))
    assert algorithm.make_learner is not Algorithm.make_learner and algorithm.name == algo


@pytest.mark.parametrize("algo", available_algorithms())
def test_config_algo_output_passes_the_checks_aiorl_run_makes(algo, tmp_path, capsys, monkeypatch):
    from aiorl.experiment.preflight import check_local_run

    assert main(["config", algo]) == 0
    (tmp_path / "cfg.yaml").write_text(capsys.readouterr().out)
    monkeypatch.chdir(tmp_path)
    cfg = load_config(tmp_path / "cfg.yaml")
    if cfg.offline.dataset is not None:  # the starter names the dataset its example collects: make one there
        write_dataset(random_episodes(cfg.env.id, 3), tmp_path / cfg.offline.dataset)
    check_local_run(cfg)


def random_episodes(env_id: str, episodes: int) -> Dataset:
    """A few episodes of uniform random actions on `env_id`."""
    env = gym.make(env_id)
    rows = {k: [] for k in ("obs", "action", "reward", "next_obs", "terminated", "truncated")}
    for e in range(episodes):
        obs, _ = env.reset(seed=e)
        done = False
        while not done:
            action = env.action_space.sample()
            next_obs, reward, terminated, truncated, _ = env.step(action)
            for key, value in zip(
                rows, (obs, action, reward, next_obs, terminated, truncated or len(rows["obs"]) > 300)
            ):
                rows[key].append(value)
            done = rows["terminated"][-1] or rows["truncated"][-1]
            obs = next_obs
    arrays = {k: np.asarray(v) for k, v in rows.items()}
    return Dataset(
        obs=arrays["obs"].astype(np.float32),
        action=arrays["action"].astype(np.int64 if env.action_space.shape == () else np.float32),
        reward=arrays["reward"].astype(np.float32),
        next_obs=arrays["next_obs"].astype(np.float32),
        terminated=arrays["terminated"].astype(bool),
        truncated=arrays["truncated"].astype(bool),
        observation_space=env.observation_space,
        action_space=env.action_space,
        env_id=env_id,
    )


def test_a_generated_config_runs_and_stops_by_itself_and_one_without_a_budget_is_refused(tmp_path, capsys):
    assert main(["config", "random_agent"]) == 0
    (tmp_path / "my.yaml").write_text(capsys.readouterr().out)
    done = subprocess.run(
        [sys.executable, "-m", "aiorl", "run", "my.yaml", "--quiet"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "reached scheduled_timesteps" in done.stdout
    refused = subprocess.run(
        [sys.executable, "-m", "aiorl", "run", "my.yaml", "--set", "agent.scheduled_timesteps=null"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr
    assert "no stop criterion" in refused.stderr and "run.max_seconds" in refused.stderr
    assert (tmp_path / "runs").is_dir() and len(list((tmp_path / "runs").iterdir())) == 2  # one run and latest


def test_config_show_prints_the_resolved_config_of_a_file(tmp_path, capsys):
    (tmp_path / "cfg.yaml").write_text("algo: dppo\nagent: {batch_size: 64}\n")
    assert main(["config", "show", str(tmp_path / "cfg.yaml"), "--set", "model.gamma=0.9"]) == 0
    data = yaml.safe_load(capsys.readouterr().out)
    assert data["agent"]["batch_size"] == 64 and data["model"]["gamma"] == 0.9
    assert data["agent"]["buffer_size"] == 100_000  # defaults filled in


def test_config_keys_lists_every_dotted_key_once_and_model_keys_by_algorithm(capsys):
    assert main(["config", "keys"]) == 0
    lines = capsys.readouterr().out.splitlines()
    paths = [line.split()[0] for line in lines]
    assert len(paths) == len(set(paths))
    assert set(paths) == set(config_reference.all_keys())
    assert "agent.prioritized_replay_eps" in paths and "model.n_step" in paths and "algo" in paths
    assert main(["config", "keys", "es"]) == 0
    es = capsys.readouterr().out
    assert "model.population" in es and "model.n_step" not in es


def test_every_algorithm_in_the_registry_is_listed_by_run_help_and_config():
    out = subprocess.run(
        [sys.executable, "-m", "aiorl", "run", "--help"], capture_output=True, text=True, check=True
    ).stdout
    for name in available_algorithms():
        assert name in out
    assert "aiorl config ALGO" in out and "examples:" in out


@pytest.mark.parametrize("command", ["run", "eval", "plot", "status", "config"])
def test_each_help_shows_an_example_and_where_keys_are_documented(command, capsys):
    with pytest.raises(SystemExit):
        main([command, "--help"])
    out = capsys.readouterr().out
    assert "example" in out.lower() and "aiorl " in out, out


def test_version(capsys):
    import aiorl

    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.strip() == f"aiorl {aiorl.__version__}"
