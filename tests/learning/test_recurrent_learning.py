"""Recurrent policies learn through the real runtime: the DPPO-LSTM example (and its GRU twin)
and the R2D2 example on CartPole-v1 without its velocities, with a CI-sized budget and a fixed seed, then `aiorl eval`
of the policy kept. Without memory this task tops out near 50 (the examples' feed-forward twins
end at 42-44 after 100k env steps); a return far above that needs the state carried from step to
step by the actors, stored with each rollout and unrolled by the learner."""

from pathlib import Path

import pytest
import yaml
from cluster_helpers import evaluated_mean, run

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.cluster, pytest.mark.slow]


# Each run stops once an evaluation during training reaches twice the bar (as a user's run stops on
# its target_return); `aiorl eval` then holds the policy kept to the bar. The budgets below bound a
# run that never gets there.
TARGET = 300


def example(name: str, model: dict, **agent) -> dict:
    config = yaml.safe_load((ROOT / "examples" / name).read_text())
    config["agent"].update(agent, target_return=TARGET)
    config["model"].update(model)
    config.setdefault("run", {})["seed"] = 1
    return config


# 20 iterations of 512 env steps, the step size annealed over them, an evaluation every 5.
# Measured (seed 1, 2 cores, load 5-7): the LSTM's `aiorl eval` 500.0 in 3 of 3 runs (27-49 s
# each), the GRU's 224.4 (its best evaluation 190.9, 34 s); without memory the task ends near 45.
BUDGET, THRESHOLD = 10240, 150


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_a_ci_sized_recurrent_run_learns_past_what_no_memory_can(tmp_path, kind):
    config = example(
        "dppo_lstm_cartpole_novel.yaml", {"recurrent": {"type": kind, "hidden": 64}}, scheduled_timesteps=BUDGET
    )
    config["run"]["eval_every"] = 5
    code, out, run_dir = run(tmp_path, config, timeout_s=300)
    assert code == 0, out
    assert evaluated_mean(run_dir) >= THRESHOLD


# R2D2 is asynchronous (the actor and the learner race), so the same seed does not repeat a run
# exactly: the bar leaves room. 3,000 learner steps of the example measured (2 cores, load 9-10):
# `aiorl eval` 462.5 (seed 1, 148 s) and 249.3 (seed 2, 76 s); without the LSTM the example ends
# at 44-45 after its full 20,000 steps. Seed 1 again, six runs on 2 cores beside others as in CI:
# 139.3 (a CI run that failed the bar of 150 it had then), 258, 313, 377, 397, 489. Its bar is
# twice what no memory reaches, below the worst of those.
R2D2_STEPS = 3000
R2D2_THRESHOLD = 100


def test_a_ci_sized_r2d2_run_learns_past_what_no_memory_can(tmp_path):
    config = example("r2d2_cartpole_novel.yaml", {}, scheduled_global_steps=R2D2_STEPS)
    config["run"]["eval_every"] = 500
    code, out, run_dir = run(tmp_path, config, timeout_s=400)
    assert code == 0, out
    assert evaluated_mean(run_dir) >= R2D2_THRESHOLD


# IMPALA-LSTM learns late and then fast: 120,000 env steps of the example measured (2 cores, load
# 7-9): `aiorl eval` 492.9 (seed 1, 93 s) and 381.3 (seed 2, 48 s); after 50,000 it was still at
# 21-26. Asynchronous as R2D2, so the bar leaves room.
IMPALA_ENV_STEPS = 120_000


def test_a_ci_sized_recurrent_impala_run_learns_past_what_no_memory_can(tmp_path):
    config = example("impala_lstm_cartpole_novel.yaml", {}, scheduled_timesteps=IMPALA_ENV_STEPS)
    code, out, run_dir = run(tmp_path, config, timeout_s=400)
    assert code == 0, out
    assert evaluated_mean(run_dir) >= THRESHOLD
