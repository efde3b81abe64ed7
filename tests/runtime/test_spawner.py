"""The warm spawner: roles forked from one warm process behave like processes started on their own.

Real `aiorl run` launches (real role processes over real sockets) check the process model a
user gets: who is whose parent, sessions, what dies with what, the off switch; the spawner's
own channel is tested against a real spawner process too (no mock of the transport).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml
from cluster_helpers import NO_RESTARTS, alive, cluster, finish, pids, wait_for
from cluster_helpers import run as run_config

from aiorl.launch.spawner import WarmSpawner, _env_diff, enabled, map_arrays, prefork_memfd, write_arrays
from aiorl.runtime.warm_fork import ENV_FORKSERVER, SpawnerChannel, seqpacket_pair

pytestmark = pytest.mark.cluster
ROOT = Path(__file__).resolve().parents[2]


def _spawner_pid(role_pid: int) -> int:
    return psutil.Process(role_pid).ppid()


def _endless(actors: int = 2, **cluster_keys) -> dict:
    config = cluster(actors, 1, 1, scheduled_timesteps=10**9)
    config["cluster"].update(cluster_keys)
    return config


def _stop(proc) -> tuple[int, str]:
    proc.send_signal(signal.SIGINT)
    return finish(proc, 60)


@pytest.fixture(autouse=True)
def no_forkserver(monkeypatch):
    # These tests are about the spawner's own start: each launch starts one (tests/conftest.py).
    monkeypatch.delenv(ENV_FORKSERVER, raising=False)


def test_every_role_is_a_child_of_one_spawner_in_a_session_of_its_own(launch):
    proc, run_dir = launch(_endless())
    roles = pids(run_dir)
    spawners = {_spawner_pid(pid) for pid in roles.values()}
    assert len(spawners) == 1, f"roles have several parents: {spawners}"
    spawner = psutil.Process(spawners.pop())
    assert spawner.ppid() == proc.pid  # the spawner is the launcher's child
    assert "aiorl.cli.spawner" in " ".join(spawner.cmdline())
    for name, pid in roles.items():
        assert os.getsid(pid) == pid, f"{name} shares a session (terminal signals would reach it)"
    code, out = _stop(proc)
    assert code == 130, out


def test_the_spawner_forks_with_no_thread_beyond_numpys_own(tmp_path):
    # numpy's import starts OpenBLAS's worker pool, which OpenBLAS stops and restarts around a
    # fork; anything more (a torch op's thread pool, an executor) would be copied half-alive.
    baseline = int(
        subprocess.check_output(
            [sys.executable, "-c", "import os, numpy; print(len(os.listdir('/proc/self/task')))"], text=True
        )
    )
    spawner = WarmSpawner.start()
    try:
        reply = spawner.ready("dppo")
        assert reply["threads"] == baseline
        assert reply["pid"] == spawner.proc.pid
    finally:
        spawner.end()
    assert spawner.proc.returncode is not None


@pytest.mark.parametrize("algo", ["apex_dqn", "dppo", "impala", "es"])
def test_the_spawner_forks_the_roles_without_importing_torch_dynamo(algo, tmp_path):
    # torch._dynamo costs most of a second of CPU, and the learners optimize without torch.optim,
    # which imported it (tests/runtime/test_learner_imports.py): a spawner importing it would hold every
    # run's first fork back for it. The evaluation worker's first export imports it, in that worker.
    spawner = WarmSpawner.start()
    try:
        spawner.ready(algo)
        child = spawner.spawn_role(["--help"], dict(os.environ), tmp_path / "role.log", None)
        assert child.wait(60) == 0
        assert spawner.ready(modules=("torch", "torch._dynamo", "torch._inductor.config"))["imported"] == ["torch"]
    finally:
        spawner.end()


def test_a_deterministic_run_finds_what_torchs_deterministic_mode_imports_in_its_spawner(tmp_path, monkeypatch):
    # torch.use_deterministic_algorithms imports torch._inductor.config (and torch._dynamo with it,
    # a second of CPU): the spawner of a run.deterministic run imports it once, before its forks,
    # rather than every actor and learner after RUNNING. The launcher's preflight asks for it.
    from aiorl.experiment.loading import load_config
    from aiorl.experiment.preflight import check_in_spawner

    monkeypatch.delenv("AIORL_TOKEN", raising=False)
    spawner = WarmSpawner.start()
    try:
        check_in_spawner(load_config(data={"algo": "dppo", "run": {"deterministic": True}}), spawner)
        child = spawner.spawn_role(["--help"], dict(os.environ), tmp_path / "role.log", None)
        assert child.wait(60) == 0
        assert spawner.ready(modules=("torch._inductor.config",))["imported"] == ["torch._inductor.config"]
    finally:
        spawner.end()


GC_CHILD = """
import gc, socket, sys
from aiorl.launch.spawner import Spawner

def run_child(kind, argv):  # what a forked child finds of the collector
    print(gc.isenabled(), gc.get_freeze_count() > 0, flush=True)
    return 0

gc.disable()
Spawner(socket.socket(fileno=int(sys.argv[1])), run_child, None, None).serve()
"""


def test_a_forked_child_collects_over_the_frozen_heap_the_spawner_shares(tmp_path):
    # The spawner imports with the collector off; a child that kept it off would never free a
    # cycle. The spawner's heap is frozen at the fork, so the child's collections skip it.
    ours, theirs = seqpacket_pair()
    proc = subprocess.Popen([sys.executable, "-c", GC_CHILD, str(theirs.fileno())], pass_fds=[theirs.fileno()])
    theirs.close()
    channel = SpawnerChannel(ours)
    try:
        child = channel.spawn("role", [], log=str(tmp_path / "child.log"))
        assert child.wait(60) == 0
    finally:
        channel.close()
        proc.wait(30)
    assert (tmp_path / "child.log").read_text().split() == ["True", "True"]


def test_killing_the_launcher_outright_leaves_no_process(launch):
    proc, run_dir = launch(_endless())
    roles = pids(run_dir)
    spawner = _spawner_pid(roles["memory-0"])
    proc.kill()  # no chance to clean up: the parent-death signals must do it
    proc.wait()
    for pid in [spawner, *roles.values()]:
        wait_for(lambda: not alive(pid), 30, f"pid {pid} to end after the launcher was killed")


def test_a_spawner_killed_outright_takes_every_role_with_it(launch):
    # No chance for the spawner to end its children: their own parent-death signal must, or
    # they would run on with nobody to reap them or report their exits.
    proc, run_dir = launch(_endless())
    # (Orphans, if the behaviour under test is broken, are killed at the launch fixture's teardown.)
    roles = pids(run_dir)
    os.kill(_spawner_pid(roles["memory-0"]), signal.SIGKILL)
    for name, pid in roles.items():
        wait_for(lambda pid=pid: not alive(pid), 30, f"{name} (pid {pid}) to end with its spawner")
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
    finish(proc, 60)


def test_the_evaluation_worker_is_forked_and_dies_with_its_learner(launch):
    config = yaml.safe_load((ROOT / "examples" / "dppo_cartpole.yaml").read_text())
    config["agent"]["scheduled_timesteps"] = 10**9
    config["run"] = {"eval_every": 10**6, "eval_episodes": 1}
    config["cluster"].update(NO_RESTARTS)  # the run would start again without its learner
    proc, run_dir = launch(config)
    roles = pids(run_dir)
    learner = roles["learner-0"]
    spawner = _spawner_pid(learner)
    log = run_dir / "logs" / "learner-0.log"
    wait_for(lambda: log.exists() and "evaluation worker ready" in log.read_text(), 60, "the worker ready")
    assert "evaluation worker started" in log.read_text() and "forked" in log.read_text()
    workers = [p for p in psutil.Process(spawner).children() if p.pid not in roles.values()]
    assert len(workers) == 1, workers
    worker = workers[0].pid
    os.kill(learner, signal.SIGKILL)
    wait_for(lambda: not alive(worker), 30, "the evaluation worker to end with its learner")
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
    finish(proc, 90)


@pytest.mark.parametrize("how", ["config", "environment"])
def test_the_off_switch_starts_each_role_on_its_own(launch, how, monkeypatch):
    config = _endless()
    if how == "config":
        config["cluster"]["warm_spawner"] = False
    else:
        monkeypatch.setenv("AIORL_WARM_SPAWNER", "0")
    proc, run_dir = launch(config)
    roles = pids(run_dir)
    assert {_spawner_pid(pid) for pid in roles.values()} == {proc.pid}
    assert all("aiorl.cli.spawner" not in " ".join(c.cmdline()) for c in psutil.Process(proc.pid).children())
    _stop(proc)


def test_a_killed_actor_is_forked_again_and_the_run_finishes(launch):
    config = cluster(2, 1, 1, scheduled_timesteps=20_000)
    config["cluster"] = {**config["cluster"], "max_restarts": 2, "restart_backoff_s": 0.1}
    proc, run_dir = launch(config)
    roles = pids(run_dir)
    spawner = _spawner_pid(roles["actor-0"])
    log = run_dir / "logs" / "memory-0.log"
    wait_for(lambda: "phase RUNNING" in log.read_text(), 60, "RUNNING")
    os.kill(roles["actor-0"], signal.SIGKILL)
    wait_for(lambda: "actor-0 restarted" in log.read_text(), 60, "actor-0's restart")
    restarted = wait_for(
        lambda: (p := pids(run_dir)["actor-0"]) != roles["actor-0"] and p, 30, "pids.json with the new actor-0"
    )
    assert _spawner_pid(restarted) == spawner  # forked from the same warm process
    code, out = finish(proc)
    assert code == 0, out


def test_a_client_other_than_the_launcher_may_fork_only_an_evaluation_worker(tmp_path):
    # A role's channel (learner 0's) asks for a role: refused by the spawner, which goes on serving.
    spawner = WarmSpawner.start()
    try:
        spawner.ready()
        # The launcher's channel may not ask for an evaluation worker either: one kind per client.
        with pytest.raises(RuntimeError, match="not for this client"):
            spawner.channel.spawn("eval_worker", ["--help"])
        assert spawner.ready()["pid"] == spawner.proc.pid
    finally:
        spawner.end()


def test_a_signal_for_a_pid_that_is_not_the_clients_child_is_ignored():
    spawner = WarmSpawner.start()
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        spawner.ready()
        spawner.channel.signal(bystander.pid, signal.SIGKILL)
        spawner.ready()  # the signal request was handled before this reply
        time.sleep(0.2)
        assert bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait()
        spawner.end()


def test_the_environment_diff_sets_and_unsets(monkeypatch):
    monkeypatch.setenv("AIORL_TEST_KEEP", "1")
    monkeypatch.setenv("AIORL_TEST_DROP", "1")
    env = {k: v for k, v in os.environ.items() if k != "AIORL_TEST_DROP"}
    env["AIORL_TEST_NEW"] = "2"
    diff = _env_diff(env)
    assert diff["set"] == {"AIORL_TEST_NEW": "2"}
    assert diff["unset"] == ["AIORL_TEST_DROP"]


def test_the_switch_reads_the_config_and_the_environment_wins():
    class Cfg:
        class cluster:
            warm_spawner = True

    assert enabled(Cfg, {}) is True
    assert enabled(Cfg, {"AIORL_WARM_SPAWNER": "0"}) is False
    Cfg.cluster.warm_spawner = False
    assert enabled(Cfg, {}) is False
    assert enabled(Cfg, {"AIORL_WARM_SPAWNER": "1"}) is True


@pytest.mark.parametrize(
    ("words", "env", "wanted"),
    [
        (["run", "examples/dppo_cartpole.yaml", "--set", "run.seed=1"], "", True),
        (["run", "c.yaml", "--role", "actor", "--index", "0"], "", False),
        (["run", "c.yaml", "--launcher", "ray"], "", False),
        (["run", "c.yaml", "--launcher=ray"], "", False),
        (["run", "--help"], "", False),
        (["eval", "runs/x"], "", False),
        ([], "", False),
        (["run", "c.yaml"], "0", False),
        (["run", "c.yaml"], "off", False),
        (["run", "c.yaml"], "1", True),
    ],
)
def test_the_command_starts_a_spawner_first_only_for_a_local_run(words, env, wanted, monkeypatch):
    from aiorl.cli.entry import wants_spawner

    monkeypatch.setenv("AIORL_WARM_SPAWNER", env)
    assert wants_spawner(words) is wanted


def test_a_channel_whose_spawner_is_gone_says_so():
    ours, theirs = seqpacket_pair()
    theirs.close()
    channel = SpawnerChannel(ours)
    channel.pump(0.01)
    assert channel.gone


def test_a_role_started_without_the_unix_sockets_has_none_though_the_launcher_had_the_variable(launch, monkeypatch):
    # The spawner was started with the launcher's environment; the role's is the launcher's
    # choice for it, removals included (a role with the variable would serve a Unix socket).
    monkeypatch.setenv("AIORL_UNIX_SOCKETS", "1")
    proc, run_dir = launch(_endless(unix_sockets=False))
    log = run_dir / "logs" / "actor-0.log"
    wait_for(lambda: log.exists() and "registered with the coordinator" in log.read_text(), 60, "actor-0")
    _stop(proc)
    logs = "".join(p.read_text() for p in (run_dir / "logs").glob("*.log"))
    assert "over unix" not in logs
    assert not (run_dir / "sock").exists()


def test_a_forked_role_takes_only_this_launchs_coordinator_address(tmp_path, monkeypatch):
    from aiorl.io.rundir import Identity, write_json_atomic
    from aiorl.launch.spawner import wait_for_coordinator

    ours = Identity(run_id="r1", launch_id="l-ours")
    for key, value in ours.env().items():
        monkeypatch.setenv(key, value)
    write_json_atomic(tmp_path / "coordinator.json", Identity(run_id="r1", launch_id="l-earlier").stamp({"port": 1}))
    assert wait_for_coordinator(str(tmp_path), 0.2) is None
    write_json_atomic(tmp_path / "coordinator.json", ours.stamp({"port": 2}))
    assert wait_for_coordinator(str(tmp_path), 5)["port"] == 2


@pytest.mark.parametrize("warm", [True, False])
def test_es_roles_share_the_noise_table_the_spawner_drew_before_forking(tmp_path, warm):
    """`Algorithm.prefork`: ES's noise table (32 MB, 80 ms to draw) is drawn once, in a child of
    the warm spawner while the preflight runs; every role forked after finds it in the spawner's
    shared mapping. Without the spawner, each role draws its own."""
    config = yaml.safe_load((ROOT / "examples" / "es_cartpole.yaml").read_text())
    config["agent"]["scheduled_global_steps"] = 2
    config["run"] = {"eval_every": None}
    config["cluster"]["warm_spawner"] = warm
    code, out, run_dir = run_config(tmp_path, config)
    assert code == 0, out
    where = "shared with the warm spawner" if warm else "drawn in this process"
    for role in ("actor-0", "actor-1", "learner-0"):
        log = (run_dir / "logs" / f"{role}.log").read_text()
        assert f"noise table of {1 << 23} entries: {where}" in log, log[-2000:]


def test_prefork_arrays_come_back_from_a_memfd_equal_read_only_and_shared():
    """`write_arrays` (the prefork child) and `map_arrays` (the spawner): equal values, dtypes and
    shapes; read-only views of one shared mapping that outlives the descriptor; a layout reaching
    past the file is refused."""
    import numpy as np

    arrays = {
        "noise": np.random.default_rng(0).standard_normal(1000, dtype=np.float32),
        "ids": np.arange(12, dtype=np.int64).reshape(3, 4),
        "odd": np.ones(3, np.uint8),
    }
    fd = prefork_memfd()
    layout = write_arrays(fd, arrays)
    assert all(entry["offset"] % 64 == 0 for entry in layout)
    got = map_arrays(fd, layout)
    os.close(fd)
    assert list(got) == list(arrays)
    for name, array in arrays.items():
        assert got[name].dtype == array.dtype and got[name].shape == array.shape
        assert np.array_equal(got[name], array) and not got[name].flags.writeable
    pid = os.fork()  # a child sees the same pages
    if pid == 0:
        os._exit(0 if np.array_equal(got["noise"], arrays["noise"]) else 1)
    assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0
    fd = prefork_memfd()
    layout = write_arrays(fd, {"a": np.zeros(16, np.float32)})
    layout[0]["shape"] = [17]
    with pytest.raises(ValueError, match="reaches past"):
        map_arrays(fd, layout)
    os.close(fd)
    fd = prefork_memfd()  # only empty arrays: no mapping, read-only all the same
    empty = map_arrays(fd, write_arrays(fd, {"none": np.zeros((0, 3), np.float32)}))
    os.close(fd)
    assert empty["none"].shape == (0, 3) and not empty["none"].flags.writeable
