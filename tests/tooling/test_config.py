"""Run config: typed loading, key paths in errors, overrides, impossible values."""

import json
import subprocess
import sys

import pytest
from configs import RANDOM_CARTPOLE_SMALL, configured, roles

from aiorl.config import ConfigError, apply_overrides
from aiorl.experiment.loading import load_config

BASE = configured(RANDOM_CARTPOLE_SMALL, cluster=roles(2, 2, 1), agent={"scheduled_timesteps": 500})


def with_(path: str, value):
    data = json.loads(json.dumps(BASE))
    return apply_overrides(data, [f"{path}={json.dumps(value)}"])


def test_valid_config_loads_typed_sections():
    cfg = load_config(data=BASE)
    assert cfg.cluster.actors == 2 and cfg.agent.batch_size == 16
    assert cfg.model.n_step == 1 and isinstance(cfg.agent.prioritized_replay_alpha, float)
    assert len(cfg.config_hash()) == 16


@pytest.mark.parametrize(
    "path, value, message",
    [
        ("agent.batch_sise", 8, "unknown key 'agent.batch_sise'; did you mean 'agent.batch_size'?"),
        ("clustr", {}, "unknown key 'clustr'; did you mean 'cluster'?"),
        ("model.n_stp", 3, "unknown key 'model.n_stp'; did you mean 'model.n_step'?"),
        ("cluster.actors", "two", "cluster.actors: expected int, got str 'two'"),
        ("agent.prioritized_replay", "yes", "agent.prioritized_replay: expected bool"),
        ("cluster.actors", 0, "cluster.actors: must be at least 1, got 0"),
        ("cluster.learners", -1, "cluster.learners: must be at least 1, got -1"),
        ("cluster.actor_flush_delay_s", -0.001, "cluster.actor_flush_delay_s: expected 0..1 seconds, got -0.001"),
        ("agent.batch_size", 5000, "agent.batch_size (5000) is larger than the replay of one memory host"),
        ("agent.learning_starts", 5000, "agent.learning_starts (5000) must be within 0..agent.buffer_size"),
        ("agent.prioritized_replay_alpha", 1.5, "agent.prioritized_replay_alpha: expected 0..1, got 1.5"),
        ("model.gamma", 1.5, "model.gamma: expected a value in (0, 1], got 1.5"),
        ("model.n_step", 0, "model.n_step: must be at least 1, got 0"),
        ("algo", "apex_dqm", "algo: unknown algorithm 'apex_dqm'"),
        ("run.log_level", "LOUD", "run.log_level: expected DEBUG, INFO, WARNING or ERROR"),
    ],
)
def test_bad_values_name_the_key(path, value, message):
    with pytest.raises(ConfigError) as info:
        load_config(data=with_(path, value))
    assert message in str(info.value)


def test_set_overrides_parse_yaml_scalars(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(json.dumps(BASE))
    cfg = load_config(
        path,
        ["cluster.actors=3", "agent.prioritized_replay=false", "run.max_seconds=2.5", "env.kwargs.render_mode=null"],
    )
    assert cfg.cluster.actors == 3 and cfg.agent.prioritized_replay is False
    assert cfg.run.max_seconds == 2.5 and cfg.env.kwargs == {"render_mode": None}
    with pytest.raises(ConfigError, match="expected key.path=value"):
        load_config(path, ["cluster.actors"])


def test_yaml_and_json_files(tmp_path):
    (tmp_path / "c.json").write_text(json.dumps(BASE))
    (tmp_path / "c.yaml").write_text("algo: random_agent\ncluster: {actors: 1}\n")
    assert load_config(tmp_path / "c.json").cluster.actors == 2
    assert load_config(tmp_path / "c.yaml").cluster.actors == 1
    (tmp_path / "bad.yaml").write_text("cluster: [1, 2\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(tmp_path / "bad.yaml")
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "missing.yaml")


def test_config_hash_ignores_ports_and_paths_only():
    a = load_config(data=BASE)
    b = load_config(data=with_("cluster.port", 4567))
    c = load_config(data=with_("agent.batch_size", 8))
    assert a.config_hash() == b.config_hash() != c.config_hash()


@pytest.mark.parametrize(
    "override, message",
    [
        ("cluster.actors=0", "cluster.actors: must be at least 1, got 0"),
        ("agent.batch_size=100000", "agent.batch_size (100000) is larger than the replay"),
        ("agent.bufer_size=10", "did you mean 'agent.buffer_size'?"),
        ("env.id=NoSuchEnv-v9", "env.id: Gymnasium cannot make 'NoSuchEnv-v9'"),
    ],
)
def test_cli_refuses_bad_config_before_starting_anything(tmp_path, override, message):
    path = tmp_path / "c.yaml"
    path.write_text(json.dumps(BASE))
    proc = subprocess.run(
        [sys.executable, "-m", "aiorl", "run", str(path), "--set", override],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr
    assert not (tmp_path / "runs").exists()  # no run directory, so no process was started


def test_yaml_exponent_floats_are_numbers(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("algo: random_agent\nagent: {prioritized_replay_eps: 1e-8}\nmodel: {learning_rate: 5e-4}\n")
    cfg = load_config(path)
    assert cfg.agent.prioritized_replay_eps == 1e-8 and cfg.model.learning_rate == 5e-4
    with pytest.raises(ConfigError, match="model.learning_rate: expected float, got str 'fast'"):
        load_config(data={"algo": "random_agent", "model": {"learning_rate": "fast"}})
