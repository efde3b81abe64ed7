"""Roles started by hand (`aiorl run CFG --role KIND --index N`) write complete run directories
of their own kind, or share one `run.dir`, and say when they connect, change phase and exit."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from cluster_helpers import FAST_CLUSTER
from configs import DPPO_CARTPOLE_TINY, configured

from aiorl.cli.main import main

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.filterwarnings("ignore:`torch.jit.load` is deprecated:DeprecationWarning"),
]

ROLES = [("memory", 0), ("learner", 0), ("actor", 0)]
DPPO = configured(
    DPPO_CARTPOLE_TINY, cluster=FAST_CLUSTER, agent={"scheduled_timesteps": 640}, run={"metrics_interval_s": 0.2}
)


def start_cluster(launch, *extra: str) -> tuple[list[subprocess.Popen], list[str]]:
    """Memory 0 first; the others once its port is known (from its console line). Each role is ended
    at the test's teardown by the `launch` fixture."""
    tmp_path = launch.tmp_path
    (tmp_path / "cfg.json").write_text(json.dumps(DPPO))
    env = {**os.environ, "AIORL_TOKEN": "k" * 64}
    env.pop("AIORL_LAUNCH_ID", None)

    def role(kind, index, *more):
        argv = [sys.executable, "-m", "aiorl", "run", "cfg.json", "--role", kind, "--index", str(index), *extra, *more]
        return launch.track(
            subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, bufsize=0)
        )

    memory = role("memory", 0)
    # "aiorl memory-0: coordinator listening on 127.0.0.1:PORT", read a byte at a time from the
    # unbuffered pipe: a buffered readline may read the lines after it too, and `communicate`
    # (which reads the pipe itself) would never see those.
    line = bytearray()
    while not line.endswith(b"\n") and (byte := memory.stdout.read(1)):
        line += byte
    first = line.decode()
    assert "coordinator listening on" in first, first
    port = first.rsplit(":", 1)[1].strip()
    procs = [memory] + [role(kind, index, "--set", f"cluster.port={port}") for kind, index in ROLES[1:]]
    return procs, [first]


def finish_all(procs: list[subprocess.Popen], first: list[str]) -> list[str]:
    outs = [proc.communicate(timeout=180)[0].decode() for proc in procs]
    outs[0] = first[0] + outs[0]
    assert [p.returncode for p in procs] == [0, 0, 0], outs
    return outs


def test_each_role_by_hand_writes_a_complete_run_directory_of_its_kind(tmp_path, launch, capsys, monkeypatch):
    procs, first = start_cluster(launch)
    outs = finish_all(procs, first)
    dirs = {p.name.rsplit("-", 2)[-2] + "-" + p.name.rsplit("-", 1)[-1]: p for p in (tmp_path / "runs").iterdir()}
    assert sorted(dirs) == ["actor-0", "learner-0", "memory-0"]
    for name, path in dirs.items():
        assert (path / "config.yaml").is_file() and (path / "logs" / f"{name}.log").is_file(), name
    for out, (kind, index) in zip(outs, ROLES):
        name = f"{kind}-{index}"
        assert f"aiorl {name}: registered with the coordinator" in out, out
        assert f"aiorl {name}: phase RUNNING" in out and f"aiorl {name}: phase CLOSING" in out, out
        assert f"aiorl {name}: exit code 0; run directory {dirs[name].resolve()}" in out, out
        assert "Traceback" not in out, out
    learner, memory = dirs["learner-0"], dirs["memory-0"]
    assert (learner / "policy" / "policy.pt2").is_file() and list((learner / "checkpoints").iterdir())
    assert json.loads((memory / "summary.json").read_text())["ok"]
    assert (memory / "metrics.jsonl").stat().st_size > 0
    monkeypatch.setenv("AIORL_TOKEN", "k" * 64)
    capsys.readouterr()
    assert main(["eval", str(learner), "--episodes", "1"]) == 0
    assert main(["status", str(memory)]) == 0
    assert "run finished" in capsys.readouterr().out
    assert main(["plot", str(memory), "-o", str(tmp_path / "curve.png")]) == 0


def test_roles_by_hand_share_one_run_dir_without_clobbering_and_refuse_another_config(tmp_path, launch, capsys):
    shared = tmp_path / "shared"
    procs, first = start_cluster(launch, "--set", f"run.dir={shared}")
    finish_all(procs, first)
    assert sorted(p.name for p in (shared / "logs").iterdir()) == ["actor-0.log", "learner-0.log", "memory-0.log"]
    assert (shared / "policy" / "policy.pt2").is_file() and (shared / "summary.json").is_file()
    assert not list(shared.glob(".config.yaml.*"))
    capsys.readouterr()
    assert main(["eval", str(shared), "--episodes", "1"]) == 0
    # A role of another cluster (another config) is refused before it writes anything there.
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "aiorl",
            "run",
            "cfg.json",
            "--role",
            "actor",
            "--set",
            "cluster.port=1",
            "--set",
            f"run.dir={shared}",
            "--set",
            "agent.batch_size=64",
        ],
        cwd=tmp_path,
        env={**os.environ, "AIORL_TOKEN": "k" * 64},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2 and "config hash mismatch" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    # A second run of the same cluster there would write over the first one's results: refused.
    again = subprocess.run(
        [sys.executable, "-m", "aiorl", "run", "cfg.json", "--role", "memory", "--set", f"run.dir={shared}"],
        cwd=tmp_path,
        env={**os.environ, "AIORL_TOKEN": "k" * 64},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert again.returncode == 2 and "earlier run's memory-0 results" in again.stderr, again.stderr
