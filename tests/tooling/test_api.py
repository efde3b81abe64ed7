"""The Python API (aiorl.run, load_config, load_policy) and custom environments (issue 15)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from cluster_helpers import FAST_CLUSTER
from configs import RANDOM_CARTPOLE, configured

import aiorl

pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.load` is deprecated:DeprecationWarning")

SMALL = configured(
    RANDOM_CARTPOLE, cluster=FAST_CLUSTER, agent={"scheduled_timesteps": 3000}, run={"metrics_interval_s": 0.2}
)


def test_import_is_cheap_and_dir_shows_the_api():
    code = (
        "import sys, aiorl; names = dir(aiorl); "
        "assert {'run', 'RunResult', 'load_config', 'load_policy'} <= set(names), names; "
        "assert 'torch' not in sys.modules and 'aiorl.api' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_run_from_a_thread_blocks_and_returns_the_summary(tmp_path):
    """No signal handler can be set outside the main thread: a notebook's worker thread must still run."""
    out: dict = {}
    rows: list[dict] = []

    def target():
        try:
            out["result"] = aiorl.run(
                SMALL, overrides={"run.seed": 3}, run_dir=tmp_path / "run", on_metrics=rows.append
            )
        except BaseException as exc:  # surfaces in the assertion below
            out["error"] = exc

    thread = threading.Thread(target=target)
    thread.start()
    thread.join(180)
    assert not thread.is_alive() and "error" not in out, out
    result = out["result"]
    assert result.ok and result.exit_code == 0 and result.outcome == "finished"
    assert result.run_dir == tmp_path / "run"
    assert result.summary["env_steps"] >= 3000
    assert aiorl.load_config(result.run_dir / "config.yaml").run.seed == 3
    # on_metrics saw every row of metrics.jsonl, in order, the last (EXITED) one included.
    written = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert rows == written and rows[-1]["phase"] == "EXITED"
    # A short repr: how it ended, not the kilobytes of summary.json.
    text = repr(result)
    assert text.startswith("<RunResult finished exit_code=0 ") and f"env_steps={result.summary['env_steps']}" in text
    assert len(text) < 300, text


def test_an_on_metrics_callback_that_raises_stops_the_run_cleanly_and_its_error_surfaces(tmp_path):
    seen: list[dict] = []

    def watch(row):
        seen.append(row)
        if row["env_steps"] > 0:
            raise ValueError("enough for me")

    # Long, but bounded: a launcher that ignored the error would end by run.max_seconds, "finished".
    long = {
        **SMALL,
        "agent": {**SMALL["agent"], "scheduled_timesteps": 10**9},
        "run": {**SMALL["run"], "max_seconds": 60},
    }
    with pytest.raises(ValueError, match="enough for me"):
        aiorl.run(long, run_dir=tmp_path / "run", on_metrics=watch)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["outcome"] == "interrupted" and summary["env_steps"] < 10**9
    assert seen[-1]["env_steps"] > 0  # not called again after it raised
    pids = json.loads((tmp_path / "run" / "pids.json").read_text())
    assert not [pid for pid in pids.values() if _alive(pid)]


def _alive(pid) -> bool:
    try:
        os.kill(int(pid), 0)
    except (ProcessLookupError, ValueError, TypeError):
        return False
    return True


def test_run_refuses_a_bad_config_before_anything_starts(tmp_path):
    with pytest.raises(aiorl.ConfigError, match="agent.batch_sise"):
        aiorl.run(SMALL, overrides=["agent.batch_sise=3"], run_dir=tmp_path / "run")
    assert not (tmp_path / "run").exists()
    assert "batch_sise" not in SMALL["agent"]  # the caller's mapping is left as it was


def test_load_policy_is_a_callable_on_one_observation_or_a_batch(tmp_path):
    from apex_helpers import make_algo

    algo = make_algo("apex_dqn", "CartPole-v1")
    algo.cfg.dump(tmp_path / "config.yaml")
    algo.make_learner(0, 1, seed=0).export_policy(str(tmp_path / "policy"))
    policy = aiorl.load_policy(tmp_path)
    obs = np.zeros(4, np.float32)
    action = policy(obs)
    assert isinstance(action, int) and 0 <= action < 2
    assert policy(np.zeros((5, 4), np.float32)).shape == (5,)
    assert policy.meta["observation_shape"] == [4]


def test_load_policy_names_a_missing_or_bad_file(tmp_path):
    from aiorl.evaluation.policies import EvalError

    with pytest.raises(EvalError, match="no exported policy"):
        aiorl.load_policy(tmp_path)
    (tmp_path / "bad.pt").write_text("nope")
    with pytest.raises(EvalError, match="bad.pt"):
        aiorl.load_policy(tmp_path / "bad.pt")


CUSTOM_ENVS = '''
import os
import gymnasium as gym
import numpy as np


class Corridor(gym.Env):
    """Walk right `length` cells; constructed with env.kwargs, which it records."""

    observation_space = gym.spaces.Box(-1.0, 1e6, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, length=5, marker=None):
        self.length = length
        self.pos = 0
        if marker:
            with open(f"{marker}.{os.getpid()}", "w") as f:
                f.write(str(length))

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.pos = 0
        return np.array([self.pos], np.float32), {}

    def step(self, action):
        self.pos += 1 if action == 1 else 0
        done = self.pos >= self.length
        return np.array([self.pos], np.float32), float(done), done, False, {}


gym.register(id="Hall-v0", entry_point=Corridor, max_episode_steps=50)  # another name: Corridor is the class
'''


@pytest.mark.parametrize("env_id", ["my_envs:Corridor", "my_envs:Hall-v0"])
def test_custom_env_from_the_current_directory_gets_its_kwargs(tmp_path, env_id):
    """`module:Class` and a registered `module:EnvId`, found in the cwd without PYTHONPATH, by the
    `aiorl` script (which does not put the cwd on sys.path) and by every role process."""
    (tmp_path / "my_envs.py").write_text(CUSTOM_ENVS)
    marker = tmp_path / "made"
    config = json.loads(json.dumps(SMALL))
    config["env"].update(id=env_id, kwargs={"length": 7, "marker": str(marker)})
    config["agent"]["scheduled_timesteps"] = 1000
    config["run"]["dir"] = str(tmp_path / "run")
    (tmp_path / "cfg.json").write_text(json.dumps(config))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    script = Path(sys.executable).with_name("aiorl")
    result = subprocess.run(
        [str(script), "run", "cfg.json", "--quiet"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180
    )
    assert result.returncode == 0, result.stdout + result.stderr
    made = list(tmp_path.glob("made.*"))
    assert len(made) >= 2  # the launcher's check and the actor at least
    assert {p.read_text() for p in made} == {"7"}
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["ok"] and summary["episodes"] > 0


def test_run_takes_a_file_a_mapping_or_a_config(tmp_path):
    from aiorl.api import _load, _override_list

    (tmp_path / "cfg.yaml").write_text("algo: random_agent\n")
    from_file = _load(tmp_path / "cfg.yaml", _override_list({"run.seed": 5, "env.kwargs": {"a": 1}}))
    assert from_file.run.seed == 5 and from_file.env.kwargs == {"a": 1}
    from_config = _load(from_file, ["agent.batch_size=16"])
    assert from_config.run.seed == 5 and from_config.agent.batch_size == 16
    assert _load({"algo": "random_agent"}, []).to_dict() == aiorl.load_config(tmp_path / "cfg.yaml").to_dict()
    with pytest.raises(TypeError, match="mapping or a list"):
        _override_list("run.seed=1")
