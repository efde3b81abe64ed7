"""A user's mistake is one line on stderr and exit 2, before anything starts (issue 15).

Each case runs the real `aiorl` command in a subprocess, in a scratch directory,
and checks: exit code 2, no traceback, the bad key or value named, and no run
directory left behind.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

LONG_TOKEN = "t" * 40
CFG = "algo: random_agent\nagent: {scheduled_timesteps: 100}\n"


def aiorl(cwd: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if k != "AIORL_TOKEN"}
    environ.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "aiorl", *args], cwd=cwd, env=environ, capture_output=True, text=True, timeout=120
    )


@pytest.fixture
def scratch(tmp_path):
    (tmp_path / "cfg.yaml").write_text(CFG)
    (tmp_path / "noalgo.yaml").write_text("env: {id: CartPole-v1}\n")
    (tmp_path / "somedir").mkdir()
    (tmp_path / "garbage.pt").write_text("not a policy\n")
    run = tmp_path / "trained"  # a run directory whose policy is not a policy / not for its env
    (run / "policy").mkdir(parents=True)
    (run / "config.yaml").write_text(CFG)
    (run / "policy" / "policy.pt").write_text("not a policy either\n")
    other = tmp_path / "other"
    (other / "policy").mkdir(parents=True)
    (other / "config.yaml").write_text(CFG)
    (other / "policy" / "policy.pt").write_text("x")
    (other / "policy" / "policy.json").write_text('{"observation_shape": [8], "env_id": "LunarLander-v3"}')
    return tmp_path


# (id, argv, environment, what the one line must name)
CASES = [
    ("max-episode-steps-0", ["run", "cfg.yaml", "--set", "env.max_episode_steps=0"], {}, "env.max_episode_steps"),
    ("unimportable-env-module", ["run", "cfg.yaml", "--set", "env.id=mymod:MyEnv-v0"], {}, "'mymod'"),
    (
        "cuda-without-cuda",
        ["run", "cfg.yaml", "--set", "algo=apex_dqn", "--set", "model.device=cuda"],
        {},
        "model.device",
    ),
    ("role-with-port-0", ["run", "cfg.yaml", "--role", "actor"], {"AIORL_TOKEN": LONG_TOKEN}, "cluster.port"),
    ("role-without-token", ["run", "cfg.yaml", "--role", "actor", "--set", "cluster.port=7000"], {}, "AIORL_TOKEN"),
    (
        "role-short-token",
        ["run", "cfg.yaml", "--role", "learner", "--set", "cluster.port=7000"],
        {"AIORL_TOKEN": "short"},
        "AIORL_TOKEN",
    ),
    (
        "role-index-out-of-range",
        ["run", "cfg.yaml", "--role", "actor", "--index", "3", "--set", "cluster.port=7000"],
        {"AIORL_TOKEN": LONG_TOKEN},
        "--index 3",
    ),
    ("config-is-a-directory", ["run", "somedir/"], {}, "is a directory"),
    ("missing-config", ["run", "nope.yaml"], {}, "does not exist"),
    ("no-algo", ["run", "noalgo.yaml"], {}, "algo: required"),
    ("unknown-key", ["run", "cfg.yaml", "--set", "agent.batch_sise=64"], {}, "agent.batch_size"),
    ("eval-garbage-policy", ["eval", "trained", "--policy", "garbage.pt"], {}, "garbage.pt"),
    ("eval-garbage-exported-policy", ["eval", "trained"], {}, "policy.pt"),
    ("eval-wrong-observation-shape", ["eval", "other"], {}, "shape [8]"),
    ("config-unknown-algo", ["config", "apex_dqm"], {}, "apex_dqn"),
    ("plot-negative-smooth", ["plot", "trained", "--smooth", "-1"], {}, "--smooth"),
    ("eval-best-and-final", ["eval", "trained", "--best", "--final"], {}, "--final"),
    ("eval-episodes-not-a-number", ["eval", "trained", "--episodes", "zz"], {}, "'zz'"),
    ("unknown-command", ["trian", "cfg.yaml"], {}, "'trian'"),
]


@pytest.mark.parametrize("argv, env, named", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_users_mistake_is_one_line_and_exit_2(scratch, argv, env, named):
    before = sorted(p.name for p in scratch.iterdir())
    result = aiorl(scratch, *argv, env=env)
    out = result.stdout + result.stderr
    assert result.returncode == 2, out
    assert "Traceback" not in out, out
    assert named in result.stderr, out
    assert len(result.stderr.strip().splitlines()) == 1, out
    assert sorted(p.name for p in scratch.iterdir()) == before, "a refused command left files behind"


def test_ctrl_c_during_start_up_prints_no_traceback(tmp_path, monkeypatch, capsys):
    """Ctrl-C before the launcher has taken SIGINT (the torch import takes seconds) is not a crash."""
    from aiorl.cli import main as cli

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "load_config", interrupted)
    (tmp_path / "cfg.yaml").write_text(CFG)
    try:
        code = cli.main(["run", str(tmp_path / "cfg.yaml")])
    except KeyboardInterrupt:
        pytest.fail("Ctrl-C during start-up escaped aiorl's main (a traceback)")
    assert code == 130
    assert capsys.readouterr().err.strip() == "aiorl: interrupted"
