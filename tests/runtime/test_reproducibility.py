"""`run.deterministic`: a synchronous run (dppo, es) repeats exactly for its seed on one machine,
checked as two real runs with equal weights digests after every iteration; the asynchronous
algorithms are refused, and so is a stop by the clock."""

from __future__ import annotations

import json

import pytest
from cluster_helpers import run
from configs import configured, dppo_cartpole, es_tiny

from aiorl.config import ConfigError
from aiorl.experiment.loading import load_config

SEEDED = {"seed": 5, "deterministic": True}
# Two memory hosts: their shares of a round reach the learner in either order.
DPPO = configured(dppo_cartpole(2, 2, 1, epochs=2, scheduled_global_steps=6), run=SEEDED)
ES = configured(es_tiny(2, 1, 1, population=6, scheduled_global_steps=4), run=SEEDED)


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
