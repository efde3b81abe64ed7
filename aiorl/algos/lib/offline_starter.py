"""The starter the discrete offline algorithms share (no torch: their config sides import it):
the CartPole-v1 dataset their examples' `aiorl collect` command writes, and a budget that stops."""

from __future__ import annotations

CARTPOLE_DATASET_STARTER = {
    "env.id": "CartPole-v1",
    "offline.dataset": "datasets/cartpole_dqn_200",
    "agent.scheduled_global_steps": 3000,
    "run.eval_every": 1000,
    "run.eval_episodes": 10,
}
