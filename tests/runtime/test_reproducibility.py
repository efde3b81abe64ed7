"""`run.deterministic`: a synchronous run (dppo, es) repeats exactly for its seed on one machine,
checked as two real runs with equal weights digests after every iteration; the asynchronous
algorithms are refused, and so is a stop by the clock."""

from __future__ import annotations

import json

import pytest
from cluster_helpers import run

from aiorl.config import ConfigError
from aiorl.experiment.loading import load_config

DPPO = {
    "algo": "dppo",
    "env": {"id": "CartPole-v1", "num_envs": 2},
    # Two memory hosts: their shares of a round reach the learner in either order.
    "cluster": {"actors": 2, "memories": 2, "learners": 1},
    "agent": {"sample_batch_size": 16, "batch_size": 32, "scheduled_global_steps": 6},
    "model": {"network": ["linear:16", "tanh"], "epochs": 2},
    "run": {"seed": 5, "deterministic": True},
}
ES = {
    "algo": "es",
    "env": {"id": "CartPole-v1"},
    "cluster": {"actors": 2, "memories": 1, "learners": 1},
    "agent": {"scheduled_global_steps": 4},
    "model": {"network": ["linear:8", "tanh"], "population": 6, "noise_table_size": 100_000},
    "run": {"seed": 5, "deterministic": True},
}


def digests(tmp_path, config) -> tuple[str, list[str]]:
    tmp_path.mkdir()
    code, out, run_dir = run(tmp_path, config)
    assert code == 0, out
    stats = json.loads((run_dir / "summary.json").read_text())["roles"]["learner-0"]["stats"]
    return stats["weights_digest"], [it["weights_digest"] for it in stats["iterations"]]


@pytest.mark.parametrize("config", [DPPO, ES], ids=["dppo", "es"])
def test_a_synchronous_run_repeats_exactly_for_its_seed(tmp_path, config):
    first = digests(tmp_path / "a", config)
    second = digests(tmp_path / "b", config)
    assert len(first[1]) == config["agent"]["scheduled_global_steps"]
    assert first == second
    other_seed = digests(tmp_path / "c", {**config, "run": {**config["run"], "seed": 6}})
    assert other_seed[0] != first[0]  # the digests say something: another seed, other weights


@pytest.mark.parametrize(
    "data, message",
    [
        ({"algo": "apex_dqn"}, "run.deterministic: apex_dqn is asynchronous"),
        ({"algo": "impala"}, "run.deterministic: impala is asynchronous"),
        ({"algo": "dppo", "run": {"max_seconds": 30}}, "run.deterministic: run.max_seconds stops at a time"),
    ],
)
def test_deterministic_is_refused_where_it_cannot_hold(data, message):
    data = {**data, "run": {**data.get("run", {}), "deterministic": True}}
    with pytest.raises(ConfigError, match=message):
        load_config(data=data)
