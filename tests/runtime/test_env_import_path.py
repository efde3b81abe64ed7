"""A `module:Env` env id imports its module from the working directory and leaves that directory off
sys.path afterwards (`aiorl.envs.gym`): left on it, any module the process imported later for the
first time (torch's triton, gmpy2, tabulate...) would be a file of that name planted there, run in
learner 0, the evaluation worker and `aiorl eval`."""

from __future__ import annotations

import importlib
import sys
import textwrap

import pytest

from aiorl.config import EnvConfig
from aiorl.envs.make import make_env

ENV_MODULE = """
import gymnasium as gym
import numpy as np


class Corridor(gym.Env):
    observation_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, length=3):
        import corridor_helpers  # a neighbour in the same directory, imported as the env is made

        self.length = corridor_helpers.LENGTH_OFFSET + length

    def reset(self, *, seed=None, options=None):
        return np.zeros(1, np.float32), {}

    def step(self, action):
        return np.zeros(1, np.float32), 0.0, True, False, {}
"""


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    (tmp_path / "corridor_envs_path.py").write_text(textwrap.dedent(ENV_MODULE))
    (tmp_path / "corridor_helpers.py").write_text("LENGTH_OFFSET = 1\n")
    marker = tmp_path / "planted-ran"
    (tmp_path / "planted_tabulate.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    monkeypatch.chdir(tmp_path)
    # As in a role process (python -P): neither the working directory nor "" on the path.
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    for name in ("corridor_envs_path", "corridor_helpers", "planted_tabulate"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    importlib.invalidate_caches()
    return tmp_path, marker


def test_making_a_module_env_leaves_sys_path_as_it_was(workdir):
    _, marker = workdir
    before = list(sys.path)
    env = make_env(EnvConfig(id="corridor_envs_path:Corridor", kwargs={"length": 5}))
    try:
        assert env.unwrapped.length == 6  # the module and its neighbour came from the working directory
    finally:
        env.close()
    assert sys.path == before
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("planted_tabulate")
    assert not marker.exists()


def test_a_module_that_fails_to_import_leaves_sys_path_as_it_was(workdir):
    tmp_path, _ = workdir
    (tmp_path / "broken_envs_path.py").write_text("raise RuntimeError('boom')\n")
    before = list(sys.path)
    with pytest.raises(Exception, match="boom"):
        make_env(EnvConfig(id="broken_envs_path:Corridor"))
    assert sys.path == before
