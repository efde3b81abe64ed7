"""The "did you mean" of error messages (aiorl/core/suggest.py) and the places that had it wrong."""

from __future__ import annotations

import textwrap

import pytest

from aiorl.config import ConfigError
from aiorl.core.suggest import closest, did_you_mean
from aiorl.envs.gym import custom_env

METRICS = ["eval/return_max", "eval/return_mean", "eval/return_min", "eval/return_std", "return_mean_100"]


def test_a_name_made_of_words_gets_the_candidate_holding_them_the_preferred_one_first():
    assert closest("eval_return", METRICS, prefer=["return_mean_100", "eval/return_mean"]) == "eval/return_mean"
    assert closest("EVAL-RETURN-STD", METRICS) == "eval/return_std"
    assert closest("return", METRICS, prefer=["return_mean_100"]) == "return_mean_100"


def test_a_misspelling_gets_the_closest_spelling_or_nothing():
    assert closest("Coridor", ["CorridorReg", "Corridor", "CartPole-v1"]) == "Corridor"
    assert closest("retrun_mean_100", METRICS) == "return_mean_100"
    assert closest("zzz", METRICS) is None
    assert closest("anything", []) is None
    assert did_you_mean("batch_sise", ["batch_size", "buffer_size"], prefix="agent.") == (
        "; did you mean 'agent.batch_size'?"
    )
    assert did_you_mean("zzz", ["batch_size"]) == ""


def test_a_misspelt_class_of_a_users_module_is_suggested_before_a_registered_id(tmp_path, monkeypatch):
    (tmp_path / "corridor_envs.py").write_text(
        textwrap.dedent(
            """
            import gymnasium as gym

            class Corridor(gym.Env):
                pass

            if "CorridorReg" not in gym.registry:
                gym.register("CorridorReg", entry_point=Corridor)
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError) as caught:
        custom_env("corridor_envs:Coridor")
    message = str(caught.value)
    assert message.startswith("env.id: module 'corridor_envs' has no env class or function 'Coridor'")
    assert message.endswith("did you mean 'corridor_envs:Corridor'?")
    assert custom_env("corridor_envs:CorridorReg") == "corridor_envs:CorridorReg"  # a registered id still works
    assert custom_env("corridor_envs:Corridor").id == "Corridor"  # and so does the class
