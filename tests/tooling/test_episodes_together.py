"""Evaluation during training and bench/learning.py's grid step their episodes side by side
(`run_episodes_together`): they must score exactly the episodes `aiorl eval` plays one at a
time (episode k from seed + k)."""

import pytest
import torch

from aiorl.config import EnvConfig
from aiorl.evaluation.episodes import run_episodes, run_episodes_together


class Linear(torch.nn.Module):
    """A fixed greedy policy whose episodes end at different lengths."""

    def __init__(self, obs_dim: int, out: int, discrete: bool):
        super().__init__()
        self.layer = torch.nn.Linear(obs_dim, out)
        torch.nn.init.normal_(self.layer.weight, generator=torch.Generator().manual_seed(3))
        self.discrete = discrete

    def forward(self, obs):
        x = self.layer(obs.to(torch.float32))
        return x.argmax(dim=1) if self.discrete else x.clamp(-2.0, 2.0)


@pytest.mark.parametrize("env_id, obs_dim, out, discrete", [("CartPole-v1", 4, 2, True), ("Pendulum-v1", 3, 1, False)])
def test_lockstep_episodes_equal_the_one_at_a_time_episodes(env_id, obs_dim, out, discrete):
    policy = Linear(obs_dim, out, discrete)
    env = EnvConfig(id=env_id)
    one_at_a_time = run_episodes(policy, env, 6, seed=11)
    lockstep = run_episodes_together(policy, env, 6, seed=11)
    assert lockstep["lengths"] == one_at_a_time["lengths"]
    assert lockstep["returns"] == pytest.approx(one_at_a_time["returns"], rel=1e-6)
    if discrete:
        assert len(set(lockstep["lengths"])) > 1  # episodes of several lengths: some end while others go on
