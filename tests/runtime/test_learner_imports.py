"""A learner trains without importing torch._dynamo (most of a second of CPU, which torch.optim's
optimizers import): no learner, spawner or restart waits for it on the way to its first step.
Only the export of the final policy (torch.export) imports it, after training has ended. (That the
spawner does not import it before it forks: tests/runtime/test_spawner.py.)"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from cluster_helpers import finish

pytestmark = pytest.mark.cluster

ROOT = Path(__file__).resolve().parents[2]
DYNAMO_IMPORTED = re.compile(r"^import time: .*\|\s+torch\._dynamo$")


# DPPO trains with aiorl's Adam, IMPALA here with its RMSprop (the paper's optimizer).
@pytest.mark.parametrize(
    ("example", "env_steps", "model"),
    [("dppo_cartpole", 4096, {}), ("impala_cartpole", 8000, {"optimizer": "rmsprop"})],
)
def test_a_learner_trains_before_anything_imports_torch_dynamo(example, env_steps, model, launch):
    config = yaml.safe_load((ROOT / "examples" / f"{example}.yaml").read_text())
    config["agent"]["scheduled_timesteps"] = env_steps
    config["model"].update(model)
    # Without the evaluation worker (its exports import torch._dynamo), and with every import a
    # process makes written to its stderr: the import-time environment keeps the suite's fork
    # server (which has torch._dynamo) from serving this launch, so its roles are forked from a
    # spawner of its own, and a learner's log shows what the learner imported after the fork.
    config["run"] = {"eval_every": None, "eval_interval_s": None}
    proc, run_dir = launch(config, env={"PYTHONPROFILEIMPORTTIME": "1"})
    code, out = finish(proc)
    assert code == 0, out
    lines = (run_dir / "logs" / "learner-0.log").read_text().splitlines()
    trained = [i for i, line in enumerate(lines) if "(final)" in line and "checkpoint" in line]
    imported = [i for i, line in enumerate(lines) if DYNAMO_IMPORTED.match(line)]
    assert trained, "no final checkpoint in learner-0.log"
    # The export of the final policy imports it, after the final checkpoint: which also shows that
    # the learner's imports reach its log.
    assert imported, "torch._dynamo's import is not in learner-0.log"
    assert imported[0] > trained[0], lines[imported[0] - 5 : imported[0] + 1]
