"""An env that returns non-finite values (NaN rewards, NaN observations) is the env's fault: the
actor drops and counts those rows and never reports a non-finite return; an env that gives
nothing else fails the run in one line naming it (`aiorl.runtime.env_faults`)."""

from __future__ import annotations

import os

import pytest
from cluster_helpers import NO_RESTARTS, finish, read_json
from configs import APEX_CARTPOLE_TINY, RANDOM_CARTPOLE, configured

from aiorl.runtime.env_faults import FAIL_AFTER_STEPS

pytestmark = pytest.mark.cluster

# BAD_EVERY: every how many steps the env's reward (or observation, FIELD) is NaN; 1: every step.
NAN_ENV = """
import gymnasium as gym
import numpy as np

BAD_EVERY = {bad_every}
FIELD = {field!r}


class NanEnv(gym.Env):
    observation_space = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(4, np.float32), {{}}

    def step(self, action):
        self.t += 1
        bad = self.t % BAD_EVERY == 0
        obs = np.full(4, 0.1 * int(action), np.float32)
        reward = 1.0
        if bad and FIELD == "reward":
            reward = float("nan")
        if bad and FIELD == "obs":
            obs[2] = np.nan
        return obs, reward, False, self.t >= 20, {{}}
"""


def nan_env(tmp_path, monkeypatch, bad_every: int, field: str = "reward") -> str:
    (tmp_path / "nan_env.py").write_text(NAN_ENV.format(bad_every=bad_every, field=field))
    # The role processes import the env module by name (env.id module:Class).
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    return "nan_env:NanEnv"


def test_an_env_whose_every_reward_is_nan_fails_the_run_in_one_line(tmp_path, monkeypatch, launch):
    """The coordinator used to close the actor for its NaN return, the actor rejoined at once, for
    ever, and the run exited 0 having learned nothing. Now the actor fails once its first
    FAIL_AFTER_STEPS env steps hold no finite reward, and is not restarted."""
    env_id = nan_env(tmp_path, monkeypatch, bad_every=1)
    config = configured(
        RANDOM_CARTPOLE,
        env={"id": env_id},
        # A budget the run cannot reach by failing: it ends on the env, not on its steps.
        agent={"scheduled_timesteps": 100 * FAIL_AFTER_STEPS},
        cluster={"actors": 1, "memories": 1, "learners": 1, "max_restarts": 3},
    )
    proc, run_dir = launch(config)
    code, out = finish(proc, 180)
    assert code == 1, out
    line = f"env {env_id} gave no finite reward in the first"
    assert line in out, out
    named = [row for row in out.splitlines() if line in row]
    assert named and all("\n" not in row for row in named)
    summary = read_json(run_dir / "summary.json")
    assert any(f.startswith("actor-0") and "EnvNotFinite" in f and line in f for f in summary["failures"]), summary
    assert summary["restarts"] == 0, summary  # a restart would get the same env
    assert summary["bad_messages"] == 0, summary  # no NaN return was sent
    # By steps, not time: the actor stopped within a rollout of the limit.
    rollout = config["agent"]["sample_batch_size"] * config["env"]["num_envs"]
    assert summary["env_steps"] < FAIL_AFTER_STEPS + 2 * rollout, summary
    log = (run_dir / "logs" / "actor-0.log").read_text()
    assert "registered with the coordinator" in log and log.count("registered with the coordinator") == 1


@pytest.mark.parametrize("field", ["reward", "obs"])
def test_an_env_with_some_nan_rows_learns_with_them_counted(tmp_path, monkeypatch, launch, field):
    """Every 7th step NaN (a reward, or an observation): the run reaches its budget, the rows that
    hold a NaN are dropped by the actor and counted in summary.json, no return is non-finite."""
    env_id = nan_env(tmp_path, monkeypatch, bad_every=7, field=field)
    config = configured(
        APEX_CARTPOLE_TINY,
        env={"id": env_id},
        agent={"scheduled_global_steps": 60, "learning_starts": 200},
        cluster={"actors": 1, "memories": 1, "learners": 1, **NO_RESTARTS},
        run={"eval_every": None},
    )
    proc, run_dir = launch(config)
    code, out = finish(proc, 240)
    assert code == 0, out
    summary = read_json(run_dir / "summary.json")
    assert summary["ok"] and summary["learner_steps"] >= 60 and summary["bad_messages"] == 0, summary
    actor = summary["roles"]["actor-0"]["stats"]
    episodes = actor["env_steps"] // 20  # finished, one env
    # Steps 7 and 14 of each 20-step episode; a NaN observation is also the next step's.
    per_episode = 2 if field == "reward" else 4
    assert episodes * per_episode <= actor["env_steps_nonfinite"] <= (episodes + 1) * per_episode, actor
    assert actor["rows_dropped_nonfinite"] >= actor["env_steps_nonfinite"] - per_episode > 0, actor
    memory = summary["roles"]["memory-0"]["stats"]
    assert memory["actors"]["actor-0"]["rows_rejected"] == 0, memory  # none reached the memory host
    if field == "reward":  # every episode's return is NaN: none is reported
        assert actor["episodes_nonfinite"] == episodes > 0 and summary["episodes"] == 0, (actor, summary)
    else:
        assert actor["episodes_nonfinite"] == 0 and 0 < summary["episodes"] <= episodes, (actor, summary)
        assert summary["return_mean_100"] == 20.0
