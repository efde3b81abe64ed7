"""Integrity: no code from the working directory, each counter and value only from the role
that owns it. Real role processes and real sockets on loopback."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from cluster_helpers import finish, last_metrics, live_status, pids, read_json, wait_for, write_config
from hostile_helpers import Memory0

from aiorl.cli.main import main
from aiorl.config import ConfigError
from aiorl.evaluation.options import cpu_learner
from aiorl.experiment.loading import load_config
from aiorl.runtime.algorithm import build_algorithm
from aiorl.runtime.coordinator import Coordinator
from aiorl.runtime.eval_worker import EvalWorker
from aiorl.runtime.warm_fork import ENV_SPAWNER_FD, ForkedProcess
from aiorl.wire import RemoteError, connect, generate_token

AIORL = Path(sys.executable).with_name("aiorl")  # the script: it puts no directory of its own on sys.path
HANG_S = 60.0  # only bounds a hang

APEX = {
    "algo": "apex_dqn",
    "env": {"id": "CartPole-v1"},
    "agent": {
        "sample_batch_size": 16,
        "batch_size": 32,
        "buffer_size": 20_000,
        "learning_starts": 300,
        "publish_interval": 10,
        "scheduled_global_steps": 400,
    },
    "model": {"network": ["linear:32", "relu"], "n_step": 3},
    "cluster": {"max_restarts": 2, "restart_backoff_s": 0.2, "restart_backoff_max_s": 0.5},
    "run": {"eval_every": 100, "eval_episodes": 2, "tensorboard": False},
}


def plant_code(tmp_path: Path) -> tuple[Path, Path]:
    """A directory holding an aiorl/ package and a numpy.py (one another user could write), and the
    file they write their names to if anything imports them."""
    shared = tmp_path / "shared"
    (shared / "aiorl").mkdir(parents=True)
    ran = tmp_path / "planted-code-ran"
    plant = f"open({str(ran)!r}, 'a').write(__name__ + '\\n')\n"
    (shared / "aiorl" / "__init__.py").write_text(plant)
    (shared / "numpy.py").write_text(plant + "raise ImportError('the planted numpy')\n")
    return shared, ran


@pytest.mark.cluster
def test_a_run_started_beside_planted_code_never_runs_it(tmp_path, launch):
    """An aiorl/ package and a numpy.py in the directory `aiorl run` starts in (one another user
    could write): the roles, the evaluation worker and a restarted actor import none of them."""
    shared, ran = plant_code(tmp_path)
    # It ends when the test says so (SIGINT, through the same phases as a stop criterion), once the
    # restarted actor steps and the evaluation worker has evaluated: both started while it ran.
    config = {**APEX, "agent": {**APEX["agent"], "scheduled_global_steps": 10**9}}
    path, run_dir = write_config(tmp_path, config)
    proc = launch.track(
        subprocess.Popen(
            [str(AIORL), "run", str(path), "--quiet"],
            cwd=shared,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        ),
        run_dir,
    )
    wait_for(lambda: (last_metrics(run_dir) or {}).get("env_steps", 0) > 200, HANG_S, "env steps")
    actor = pids(run_dir)["actor-0"]
    subprocess.run(["kill", "-KILL", str(actor)], check=True)
    wait_for(lambda: (live_status(run_dir) or {}).get("restarts", 0) == 1, HANG_S, "the actor's restart")
    wait_for(lambda: restarted_actor_steps(run_dir, actor), HANG_S, "the restarted actor stepping")
    wait_for(lambda: evaluated(run_dir), HANG_S, "an evaluation")
    proc.send_signal(signal.SIGINT)
    code, out = finish(proc, timeout_s=180)
    assert code == 130, out  # interrupted, after a clean shutdown
    assert not ran.exists(), f"planted code ran in: {ran.read_text()}"
    summary = read_json(run_dir / "summary.json")
    assert summary["ok"] and summary["outcome"] == "interrupted" and not summary["failures"], summary
    assert summary["restarts"] == 1 and summary["evaluation"]["count"] >= 1


def test_an_evaluation_worker_started_without_a_spawner_never_runs_planted_code(tmp_path, monkeypatch):
    """Where learner 0 has no warm spawner to fork its evaluation worker from (Ray, ``--role``,
    ``cluster.warm_spawner: false``), it starts the worker as a process of its own: one that must
    not import from the directory it was started in either."""
    shared, ran = plant_code(tmp_path)
    monkeypatch.chdir(shared)
    monkeypatch.delenv(ENV_SPAWNER_FD, raising=False)
    cfg = load_config(data={**APEX, "run": {**APEX["run"], "dir": str(tmp_path / "run")}})
    policy, meta = cpu_learner(cfg).acting_policy()
    (tmp_path / "run").mkdir(mode=0o700)  # the run directory, which a run always has
    worker = EvalWorker(cfg, tmp_path / "run" / "policy")
    try:
        assert not isinstance(worker.proc, ForkedProcess)
        state = {k: v.detach().numpy() for k, v in policy.state_dict().items()}
        request = {"n": 1, "learner_steps": 0, "env_steps": 0, "copy_s": 0.0, "meta": meta, "best": None}
        reply = worker.evaluate(state, request)
    finally:
        worker.close()
    assert not ran.exists(), f"planted code ran in: {ran.read_text()}"
    assert reply["evaluation"]["episodes"] == APEX["run"]["eval_episodes"], reply


def restarted_actor_steps(run_dir: Path, old_pid: int) -> bool:
    role = ((live_status(run_dir) or {}).get("roles") or {}).get("actor-0") or {}
    return role.get("pid") not in (None, old_pid) and (role.get("counters") or {}).get("env_steps", 0) > 0


def evaluated(run_dir: Path) -> bool:
    path = run_dir / "metrics.jsonl"
    return path.exists() and '"eval/return_mean"' in path.read_text()


TOKEN = generate_token()


async def register(port: int, cfg, role: str, name: str | None = None):
    conn = await connect("127.0.0.1", port, token=TOKEN, name=name or role)
    meta = {"role": role, "pid": 1, "host": "test", "config_hash": cfg.config_hash(), "address": None}
    reply = await conn.request("register", meta, timeout_s=HANG_S)
    assert reply.meta.get("admitted") is not False, reply.meta
    return conn


@pytest.fixture
async def coordinator(tmp_path):
    cfg = load_config(
        data={
            "algo": "random_agent",
            "cluster": {"start_timeout_s": 30.0, "heartbeat_interval_s": 0.1, "heartbeat_timeout_s": 30.0},
        }
    )
    coordinator = Coordinator(cfg, tmp_path, TOKEN)
    port = await coordinator.start("127.0.0.1", 0)
    run = asyncio.create_task(coordinator.run())
    try:
        yield cfg, coordinator, port
    finally:
        run.cancel()
        await asyncio.gather(run, return_exceptions=True)
        await coordinator.close(timeout_s=1.0)


async def test_a_role_registers_only_under_the_name_it_authenticated_with(coordinator):
    cfg, coord, port = coordinator
    with pytest.raises(RemoteError, match="actor-0 cannot register as learner-0"):
        await register(port, cfg, "learner-0", name="actor-0")
    assert coord.roles["learner-0"].status == "expected"
    conn = await register(port, cfg, "learner-0")
    assert coord.roles["learner-0"].status == "running"
    conn.abort()


async def test_each_counter_only_from_its_owner_only_growing_by_a_plausible_amount(coordinator):
    cfg, coord, port = coordinator
    conns = {role: await register(port, cfg, role) for role in ("memory-0", "learner-0", "actor-0")}
    try:

        async def heartbeat(role, **fields):
            await conns[role].request("heartbeat", fields, timeout_s=HANG_S)

        await heartbeat("actor-0", counters={"env_steps": 500})
        await heartbeat("learner-0", counters={"learner_steps": 20})
        assert (coord.env_steps, coord.learner_steps) == (500, 20)
        # An actor that counts learner steps, a memory host that counts env steps: refused.
        await heartbeat("actor-0", counters={"env_steps": 600, "learner_steps": 5})
        await heartbeat("memory-0", counters={"env_steps": 100})
        assert (coord.env_steps, coord.learner_steps) == (600, 20)
        # Counters never go down, and never jump by more than a role can do.
        await heartbeat("actor-0", counters={"env_steps": 100})
        await heartbeat("learner-0", counters={"learner_steps": 10**12})
        assert (coord.env_steps, coord.learner_steps) == (600, 20)
        await heartbeat("learner-0", counters={"learner_steps": 25})
        assert coord.learner_steps == 25
        # Episodes only from actors, the run's state only for learner 0.
        await heartbeat("learner-0", episode_returns=[1e9], episode_lengths=[1])
        await heartbeat("actor-0", episode_returns=[10.0], episode_lengths=[10])
        assert list(coord.counters.returns) == [10.0]
        with pytest.raises(RemoteError, match="only learner-0 checkpoints the run, not actor-0"):
            await conns["actor-0"].request("run_state", {"counters": {"env_steps": 700}}, timeout_s=HANG_S)
        state = (await conns["learner-0"].request("run_state", {}, timeout_s=HANG_S)).meta
        assert (state["env_steps"], state["learner_steps"]) == (600, 25)
        assert coord.counters_refused == 4
        assert not coord.stop_event.is_set()
    finally:
        for conn in conns.values():
            conn.abort()


def test_the_planted_code_test_would_see_it_run(tmp_path):
    # What the test above relies on: started with `python -m` (the path roles took before -P),
    # the planted aiorl/ in the working directory is the one imported.
    (tmp_path / "aiorl").mkdir()
    (tmp_path / "aiorl" / "__init__.py").write_text("print('PLANTED')\n")
    proc = subprocess.run([sys.executable, "-c", "import aiorl"], cwd=tmp_path, capture_output=True, text=True)
    assert "PLANTED" in proc.stdout
    proc = subprocess.run([sys.executable, "-P", "-c", "import aiorl"], cwd=tmp_path, capture_output=True, text=True)
    assert "PLANTED" not in proc.stdout and proc.returncode == 0, proc.stderr


# ---------------------------------------------------------------------------- shared policies

FIXTURE_RUN = Path(__file__).parents[1] / "fixtures" / "run_before_layout"


class RunsCode:
    """Unpickled, it runs its code: what a doctored policy file hides."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return exec, (f"open({self.marker!r}, 'w').write('ran')",)


def doctored(tmp_path: Path, change) -> Path:
    """The fixture run's policy.pt2 with `change(entries)` applied to its {name: bytes} entries."""
    with zipfile.ZipFile(FIXTURE_RUN / "policy" / "policy.pt2") as archive:
        entries = {name: archive.read(name) for name in archive.namelist()}
    change(entries)
    path = tmp_path / f"doctored-{len(list(tmp_path.glob('doctored-*')))}.pt2"
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in entries.items():
            archive.writestr(name, data)
    return path


def entry(entries: dict, suffix: str) -> str:
    return next(name for name in entries if name.endswith(suffix))


def edit_json(entries: dict, suffix: str, edit) -> None:
    name = entry(entries, suffix)
    data = json.loads(entries[name])
    edit(data)
    entries[name] = json.dumps(data).encode()


def pickled_sample_inputs(marker):
    def change(entries):
        buffer = io.BytesIO()
        torch.save({"inputs": RunsCode(marker)}, buffer)
        entries[entry(entries, "data/sample_inputs/model.pt")] = buffer.getvalue()

    return change


def pickled_weight(entries):
    edit_json(entries, "model_weights_config.json", lambda d: next(iter(d["config"].values())).update(use_pickle=True))


def node_calls(target):
    def change(entries):
        name = entry(entries, "models/model.json")
        text = entries[name].decode().replace('"torch.ops.aten.relu.default"', json.dumps(target))
        entries[name] = text.encode()

    return change


def shape_expression(expr):
    def change(entries):
        name = entry(entries, "models/model.json")
        old = "\"Symbol('s79', positive=True, integer=True)\""
        assert old.encode() in entries[name]
        entries[name] = entries[name].replace(old.encode(), json.dumps(expr).encode())

    return change


def compiled_library(entries):
    root = entry(entries, "archive_format").split("/")[0]
    entries[f"{root}/data/aotinductor/model/model.so"] = b"\x7fELF"


def test_a_doctored_policy_runs_nothing_and_is_refused_in_one_line(tmp_path, capsys):
    run_dir = tmp_path / "run"
    shutil.copytree(FIXTURE_RUN, run_dir)
    marker = tmp_path / "code-ran"
    cases = {
        pickled_sample_inputs(marker): "data/sample_inputs/model.pt is not plain tensors",
        pickled_weight: "is pickled; an aiorl policy stores tensors as raw bytes",
        node_calls("torch.hub.load"): "a node calls 'torch.hub.load', not an ATen op",
        shape_expression(f"__import__('os').system('touch {marker}')"): "names '__import__'",
        shape_expression("Integer(1).__class__"): "is not plain arithmetic",
        shape_expression("exec(chr(112) + chr(114))"): "names 'exec'",
        compiled_library: "which an aiorl policy never does",
    }
    for change, reason in cases.items():
        path = doctored(tmp_path, change)
        assert main(["eval", str(run_dir), "--policy", str(path), "--episodes", "1", "--trust-program"]) == 2
        err = capsys.readouterr().err
        assert reason in err and "refused, nothing of it was run" in err, err
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
        assert not marker.exists(), f"{reason}: the doctored policy ran its code"
    # The same archive undoctored loads and plays.
    undoctored = str(doctored(tmp_path, lambda e: None))
    assert main(["eval", str(run_dir), "--policy", undoctored, "--episodes", "1", "--trust-program"]) == 0


def test_torch_alone_would_have_run_the_doctored_sample_inputs(tmp_path):
    # Why the check is there: torch's loader retries sample inputs with weights_only=False.
    marker = tmp_path / "code-ran"
    path = doctored(tmp_path, pickled_sample_inputs(marker))
    try:
        torch.export.load(str(path))
    except Exception:
        pass  # what it loads is no program; the code has run by then
    assert marker.exists()


def test_a_role_naming_a_launch_that_does_not_own_the_run_directory_is_refused(tmp_path):
    """The launcher's identity in the environment is anybody's to set: a role that names a launch
    writes into a run directory only if the directory's own record (run.json) names that launch."""
    run_dir = tmp_path / "theirs"
    shutil.copytree(FIXTURE_RUN, run_dir)
    env = {**os.environ, "AIORL_LAUNCH_ID": "0123456789abcdef", "AIORL_RUN_ID": "0123456789abcdef"}
    env["AIORL_TOKEN"] = "ab" * 32
    before = sorted(p.name for p in run_dir.rglob("*"))
    proc = subprocess.run(
        [str(AIORL), "run", str(run_dir / "config.yaml"), "--role", "actor", "--index", "0"]
        + ["--set", f"run.dir={run_dir}", "--set", "cluster.port=9"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=HANG_S,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "belongs to launch" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert sorted(p.name for p in run_dir.rglob("*")) == before  # nothing written into it


# ---------------------------------------------------------------------------- smaller ones


def test_a_negative_or_huge_seed_is_a_config_error():
    for seed in (-1, 2**32):
        with pytest.raises(ConfigError, match=r"run.seed: expected 0 to 2\*\*32 - 1 .* got " + str(seed)):
            load_config(data={"algo": "es", "run": {"seed": seed}})
    assert load_config(data={"algo": "es", "run": {"seed": 2**32 - 1}}).run.seed == 2**32 - 1


ENDLESS = '''
import gymnasium as gym
import numpy as np


class Endless(gym.Env):
    """Never terminates, has no time limit; raises where a work item would have hung."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.steps = 0
        return np.zeros(3, np.float32), {}

    def step(self, action):
        self.steps += 1
        if self.steps > 100_000:
            raise RuntimeError("this episode would never have ended")
        return np.full(3, 0.5, np.float32), 1.0, False, False, {}
'''


def test_an_es_episode_ends_at_its_step_cap_where_the_env_has_no_time_limit(tmp_path, monkeypatch):
    (tmp_path / "endless_env.py").write_text(ENDLESS)
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = load_config(data={"algo": "es", "env": {"id": "endless_env:Endless"}, "model": {"episode_step_cap": 50}})
    algo = build_algorithm(cfg)
    actor = algo.make_actor(0, 1, seed=0)
    learner = algo.make_learner(0, 1, seed=0)
    actor.set_weights(learner.get_weights(), 0)
    result = actor.run_work(0, 0)
    assert result.batch["lengths"].tolist() == [[50, 50]] and result.env_steps == 100


def test_es_observation_normalization_floors_the_std():
    cfg = load_config(data={"algo": "es", "model": {"obs_norm": True}})
    normalizer = build_algorithm(cfg).network().normalizer
    assert normalizer.std_floor == 0.1
    obs = np.tile(np.array([1.0, 2.0, 3.0, 1e-6], np.float64), (100, 1))  # every feature constant
    normalizer.update(100, obs.sum(0), (obs * obs).sum(0))
    assert np.allclose(normalizer.scale.numpy(), 10.0)  # 1 / 0.1, not 1 / sqrt(eps) = 1e4


async def test_bad_input_from_an_authenticated_peer_is_counted_every_time_and_logged_at_a_bounded_rate(
    tmp_path, caplog
):
    caplog.set_level(logging.INFO)
    async with Memory0(tmp_path) as m:
        await m.register("actor-0")
        _, session = await m.register("learner-0")
        await m.running()
        for _ in range(30):
            async with asyncio.timeout(HANG_S):
                while True:  # until the memory host has seen the last one's connection close
                    try:
                        learner = await m.attach("learner-0", session)
                        break
                    except RemoteError:
                        await asyncio.sleep(0.01)
                await learner.send("credit", {"n": 1, "beta": -1.0})
                await learner.wait_closed()
    lines = [r for r in caplog.records if "bad message" in r.getMessage()]
    assert m.memory.bad_messages == 30
    assert 1 <= len(lines) <= 11, len(lines)  # a burst of 10, then at most one line a second or two
