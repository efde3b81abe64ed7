"""`aiorl run --launcher ray` on a real multi-node Ray cluster on loopback (`ray.cluster_utils.Cluster`:
a head and two worker nodes, each with a custom resource naming it), real role processes, real TCP.

One cluster serves the module; the test that removes a node runs last and adds it back.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
import yaml
from cluster_helpers import (
    NO_RESTARTS,
    alive,
    check_tls_only,
    cluster,
    finish,
    last_metrics,
    read_json,
    wait_for,
    write_config,
)

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [
    pytest.mark.cluster,
    pytest.mark.filterwarnings("ignore:`torch.jit.load` is deprecated:DeprecationWarning"),
]
# Ray on Linux would otherwise advertise the host's non-loopback address.
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
NODES = ("node_head", "node_w1", "node_w2")
TOKEN = "ray-test-token-" + "7" * 49
NODE_TOKEN = "node-env-token-" + "3" * 49
ACTOR_SLOT = "actor_slot"  # on both worker nodes: an actor can land on either


@pytest.fixture(scope="module")
def ray_cluster():
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    before = {p.pid for p in psutil.process_iter()}
    # The nodes' own environment holds another AIORL_TOKEN: a role must never take (or show) it.
    had = os.environ.get("AIORL_TOKEN")
    os.environ["AIORL_TOKEN"] = NODE_TOKEN
    try:
        # Logical CPUs: placement is what is tested, not the 2 physical cores.
        c = Cluster(
            initialize_head=True,
            head_node_args={
                "num_cpus": 3,
                "resources": {NODES[0]: 1},
                "include_dashboard": True,
                "node_ip_address": "127.0.0.1",
            },
        )
        workers = {
            name: c.add_node(num_cpus=3, resources={name: 1, ACTOR_SLOT: 4}, node_ip_address="127.0.0.1")
            for name in NODES[1:]
        }
    finally:
        if had is None:
            os.environ.pop("AIORL_TOKEN")
        else:
            os.environ["AIORL_TOKEN"] = had
    try:
        c.wait_for_nodes()
        c.workers = workers
        yield c
    finally:
        ray.shutdown()  # this process's own connection (the state API) first: else shutdown refuses
        c.shutdown()

        # Nothing Ray started for this module survives it (its processes exit within seconds).
        def left():
            return [
                p
                for p in psutil.process_iter(["pid", "cmdline"])
                if p.pid not in before and p.pid != os.getpid() and _is_ray_process(p)
            ]

        try:
            wait_for(lambda: not left(), 30, "Ray's processes to exit", 0.2)
        except AssertionError:
            survivors = left()
            for p in survivors:
                p.kill()
            cmdlines = [p.info["cmdline"] for p in survivors]
            raise AssertionError(f"Ray processes outlived the cluster: {cmdlines}") from None


def _is_ray_process(p) -> bool:
    try:
        cmd = " ".join(p.info["cmdline"] or [])
        return (
            "ray" in cmd and ("raylet" in cmd or "gcs_server" in cmd or "default_worker" in cmd or "dashboard" in cmd)
        ) and alive(p.pid)
    except (psutil.Error, TypeError):
        return False


def node_of(placed: dict) -> str:
    """Which test node a role ran on (the one NODES resource of its node)."""
    names = [r for r in placed["node_resources"] if r in NODES]
    assert len(names) == 1, placed
    return names[0]


def start_ray(launch, ray_cluster, config: dict, *extra: str, env: dict | None = None):
    """`aiorl run --launcher ray` of `config`, ended at the test's teardown by the `launch` fixture."""
    tmp_path = launch.tmp_path
    path, run_dir = write_config(tmp_path, config)
    env = {**os.environ, **(env or {})}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "aiorl",
            "run",
            str(path),
            "--quiet",
            "--launcher",
            "ray",
            "--address",
            ray_cluster.address,
            *extra,
        ],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    return launch.track(proc), run_dir


def role_processes(run_dir: Path) -> list[psutil.Process]:
    """Every role process of this run on any node (all nodes are this machine)."""
    config = str(run_dir / "config.yaml")
    found = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = p.info["cmdline"] or []
        if config in cmd and "--role" in cmd and alive(p.pid):
            found.append(p)
    return found


def alive_actors() -> list:
    from ray.util.state import list_actors

    return list_actors(
        filters=[("state", "=", "ALIVE"), ("class_name", "=", "RoleHost")], raise_on_missing_output=False
    )


def nothing_left(run_dir: Path) -> None:
    wait_for(lambda: not role_processes(run_dir), 30, "every role process to end")
    wait_for(lambda: not alive_actors(), 30, "every RoleHost actor to end")


def connect_state_api(ray_cluster):
    import ray

    if not ray.is_initialized():
        ray.init(address=ray_cluster.address, logging_level="WARNING", log_to_driver=False)


def test_missing_ray_is_one_line_and_exit_2(tmp_path):
    path, _ = write_config(tmp_path, cluster(1, 1, 1))
    code = (
        "import sys; sys.modules['ray'] = None\n"
        "from aiorl.cli.main import main\n"
        f"sys.exit(main(['run', {str(path)!r}, '--launcher', 'ray']))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert out.returncode == 2, out.stderr
    assert out.stderr.strip().splitlines() == [
        "aiorl: config error: cluster.launcher is 'ray' but Ray is not installed: pip install 'aiorl[ray]'"
    ]
    assert not (tmp_path / "run").exists()


def test_the_local_launcher_runs_without_ray(tmp_path):
    path, run_dir = write_config(tmp_path, cluster(1, 1, 1, scheduled_timesteps=400))
    code = (
        "import sys; sys.modules['ray'] = None\n"
        "from aiorl.cli.main import main\n"
        f"sys.exit(main(['run', {str(path)!r}, '--quiet']))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert read_json(run_dir / "summary.json")["outcome"] == "finished"


@pytest.mark.parametrize(
    "cluster_keys, message",
    [
        ({"launcher": "slurm"}, "cluster.launcher: expected 'local' or 'ray', got 'slurm'"),
        (
            {"resources": {"actors": {"num_cpus": 1}}},
            "cluster.resources.actors: unknown role kind 'actors'; expected memory, learner or actor",
        ),
        (
            {"resources": {"learner": {"gpus": 1}}},
            "cluster.resources.learner.gpus: unknown key; expected one of num_cpus, num_gpus, memory, resources",
        ),
        (
            {"resources": {"actor": {"num_cpus": -1}}},
            "cluster.resources.actor.num_cpus: expected a number >= 0, got -1",
        ),
        (
            {"resources": {"memory": {"resources": {"ssd": "lots"}}}},
            "cluster.resources.memory.resources.ssd: expected a number >= 0, got 'lots'",
        ),
        ({"resources": {"memory": {"num_cpus": 0}}}, "cluster.resources.memory: a memory needs some resource"),
    ],
)
def test_bad_launcher_keys_are_config_errors_naming_the_key(cluster_keys, message):
    from aiorl.config import ConfigError
    from aiorl.experiment.loading import load_config

    config = cluster(1, 1, 1)
    config["cluster"].update(cluster_keys)
    with pytest.raises(ConfigError) as info:
        load_config(data=config)
    assert str(info.value).startswith(message), str(info.value)


def test_role_resources_become_bundles_and_actor_options():
    from aiorl.experiment.loading import load_config
    from aiorl.launch.placement import actor_options, role_resources

    config = cluster(1, 1, 1)
    config["cluster"]["resources"] = {"learner": {"num_gpus": 1, "resources": {"big": 2}}}
    c = load_config(data=config).cluster
    assert role_resources(c, "learner") == {"GPU": 1.0, "big": 2.0}
    assert actor_options(c, "learner") == {"num_cpus": 0.0, "num_gpus": 1.0, "resources": {"big": 2.0}}
    assert role_resources(c, "actor") == {"CPU": 1.0}  # a kind not given
    assert actor_options(c, "memory") == {"num_cpus": 1.0, "num_gpus": 0.0}


def test_an_unreachable_ray_address_is_one_line_and_exit_2(tmp_path):
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    path, run_dir = write_config(tmp_path, cluster(1, 1, 1, scheduled_timesteps=1000))
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "aiorl",
            "run",
            str(path),
            "--quiet",
            "--launcher",
            "ray",
            "--address",
            f"127.0.0.1:{port}",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=180,
    )
    assert out.returncode == 2, out.stdout + out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        f"aiorl: cannot reach the Ray cluster at cluster.ray_address='127.0.0.1:{port}'"
    ), lines
    assert not list((run_dir / "logs").glob("*.log")) if (run_dir / "logs").exists() else True


def watch_running(run_dir: Path, seen: dict) -> bool:
    """Whether the run has learner steps; meanwhile, record every role process's argv, environ and sockets."""
    for p in role_processes(run_dir):
        try:
            seen.setdefault(p.pid, {"cmdline": p.cmdline(), "environ": p.environ(), "connections": set()})
            seen[p.pid]["connections"].update(
                (c.laddr.ip if c.laddr else None, c.raddr.ip if c.raddr else None)
                for c in p.net_connections(kind="inet")
            )
        except psutil.Error:
            pass
    return (last_metrics(run_dir) or {}).get("learner_steps", 0) > 5 and len(seen) >= 5


def check_secrets_and_addresses(run_dir: Path, seen: dict, token: str) -> None:
    assert len(seen) >= 5, seen.keys()
    for info in seen.values():
        assert not any(token in arg for arg in info["cmdline"]), info["cmdline"]
        assert not any(token in value for value in info["environ"].values())
        assert "AIORL_TOKEN" not in info["environ"]
        ips = {ip for pair in info["connections"] for ip in pair if ip}
        assert ips <= {"127.0.0.1"}, ips
    for log in (run_dir / "logs").glob("*.log"):
        assert token not in log.read_text(errors="replace"), log


@pytest.mark.slow
def test_apex_dqn_cartpole_on_three_nodes_reaches_the_threshold(tmp_path, launch, ray_cluster):
    """The example with 2 actors, 2 memories, 1 learner: memories on different nodes, the token
    nowhere but the run directory's token file, only loopback sockets, and a run directory that
    `aiorl eval`, `plot` and `status` take as they take a local one."""
    config = yaml.safe_load((ROOT / "examples" / "apex_dqn_cartpole.yaml").read_text())
    config["cluster"].update(actors=2, memories=2, learners=1)
    proc, run_dir = start_ray(launch, ray_cluster, config, env={"AIORL_TOKEN": TOKEN})
    seen: dict = {}
    wait_for(lambda: watch_running(run_dir, seen), 300, "the run to be RUNNING with every role", 0.5)
    status = subprocess.run(
        [sys.executable, "-m", "aiorl", "status", str(run_dir), "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "AIORL_TOKEN": TOKEN},
    )
    assert status.returncode == 0, status.stdout + status.stderr
    assert json.loads(status.stdout)["phase"] == "RUNNING"
    code, out = finish(proc, timeout_s=1500)
    assert code == 0, out
    placement = read_json(run_dir / "placement.json")
    assert set(placement) == {"memory-0", "memory-1", "learner-0", "actor-0", "actor-1"}
    assert node_of(placement["memory-0"]) != node_of(placement["memory-1"]), placement
    check_secrets_and_addresses(run_dir, seen, TOKEN)
    summary = read_json(run_dir / "summary.json")
    assert summary["outcome"] == "finished" and summary["ok"], summary
    for name in ("config.yaml", "metrics.jsonl", "summary.json", "policy"):
        assert (run_dir / name).exists(), name
    assert list((run_dir / "checkpoints").iterdir())
    assert {p.stem for p in (run_dir / "logs").glob("*.log")} == set(placement)
    result = subprocess.run(
        [sys.executable, "-m", "aiorl", "eval", str(run_dir), "--episodes", "20", "--json"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["mean"] >= 475, result.stdout
    plot = subprocess.run(
        [sys.executable, "-m", "aiorl", "plot", str(run_dir), "-o", str(tmp_path / "p.png")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert plot.returncode == 0 and (tmp_path / "p.png").stat().st_size > 0, plot.stderr
    connect_state_api(ray_cluster)
    nothing_left(run_dir)


def test_sigterm_to_the_driver_stops_the_run_cleanly_and_leaves_nothing(launch, ray_cluster):
    """Also: memories on different nodes, the learner where its custom resource is, the token only in the
    run directory's file (not the nodes' AIORL_TOKEN, not argv, not environ), only loopback sockets."""
    config = cluster(2, 2, 1, scheduled_timesteps=10**9)
    config["cluster"]["resources"] = {"learner": {"num_cpus": 1, "resources": {NODES[0]: 0.5}}}
    proc, run_dir = start_ray(launch, ray_cluster, config)
    seen: dict = {}
    wait_for(lambda: watch_running(run_dir, seen), 300, "the run to be RUNNING with every role", 0.5)
    proc.send_signal(signal.SIGTERM)
    code, out = finish(proc, timeout_s=180)
    assert code == 143, out
    summary = read_json(run_dir / "summary.json")
    assert summary["outcome"] == "interrupted" and summary["ok"], summary
    assert summary["signal"] == "SIGTERM"
    assert set(read_json(run_dir / "exits.json").values()) <= {0, 143}, read_json(run_dir / "exits.json")
    token = (run_dir / "token").read_text().strip()
    assert token != NODE_TOKEN
    check_secrets_and_addresses(run_dir, seen, token)
    check_secrets_and_addresses(run_dir, seen, NODE_TOKEN)
    placement = read_json(run_dir / "placement.json")
    assert node_of(placement["memory-0"]) != node_of(placement["memory-1"]), placement
    assert node_of(placement["learner-0"]) == NODES[0], placement
    assert f"--resume {run_dir}" in out
    connect_state_api(ray_cluster)
    nothing_left(run_dir)


def test_tls_settings_apply_under_ray_as_locally(tmp_path, launch, ray_cluster):
    """cluster.tls_* reach every placed role: the coordinator speaks only TLS, the run trains."""
    from aiorl.wire.tls import generate_self_signed

    cert, key = generate_self_signed(tmp_path / "tls", hosts=("127.0.0.1", "localhost"))
    config = cluster(1, 2, 1, scheduled_timesteps=10**9)
    config["cluster"].update(tls_cert=str(cert), tls_key=str(key), tls_ca=str(cert))
    proc, run_dir = start_ray(launch, ray_cluster, config)
    wait_for(lambda: (last_metrics(run_dir) or {}).get("learner_steps", 0) > 0, 300, "learner steps", 0.5)
    check_tls_only(run_dir, cert, key)
    proc.send_signal(signal.SIGTERM)
    code, out = finish(proc, timeout_s=180)
    assert code == 143, out
    summary = read_json(run_dir / "summary.json")
    assert summary["ok"] and summary["learner_steps"] > 0, summary
    connect_state_api(ray_cluster)
    nothing_left(run_dir)


def test_a_second_signal_kills_every_role_and_leaves_nothing(launch, ray_cluster):
    config = cluster(1, 1, 1, scheduled_timesteps=10**9)
    config["model"]["learner_step_sleep_s"] = 1.0  # DRAINING waits for a step in flight
    proc, run_dir = start_ray(launch, ray_cluster, config)
    wait_for(lambda: (last_metrics(run_dir) or {}).get("learner_steps", 0) > 0, 300, "the run to be RUNNING", 0.2)
    proc.send_signal(signal.SIGINT)
    wait_for(
        lambda: "stopping: interrupted by SIG" in (run_dir / "logs" / "memory-0.log").read_text(),
        60,
        "the clean stop to begin",
    )
    proc.send_signal(signal.SIGINT)
    code, out = finish(proc, timeout_s=120)
    assert code != 0 and "killing every role" in out, out
    assert -signal.SIGKILL in read_json(run_dir / "exits.json").values()
    connect_state_api(ray_cluster)
    nothing_left(run_dir)


def test_a_run_dir_that_nodes_do_not_share_is_refused_before_any_role_starts(tmp_path, ray_cluster, monkeypatch):
    """The check itself: a RoleHost that does not find this launch's run.json where the driver wrote it.
    (All test nodes share one filesystem, so the other node's view is made to differ: the driver is
    told a launch id that no run.json holds.)"""
    import ray

    from aiorl.launch.ray_launcher import RoleHost

    connect_state_api(ray_cluster)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "run.json").write_text(json.dumps({"run_id": "r1", "attempts": [{"launch_id": "l1"}]}))
    host = RoleHost.options(num_cpus=0, resources={NODES[1]: 0.01}).remote()
    try:
        same = ray.get(host.where.remote(str(run_dir), "r1", "l1"), timeout=60)
        other = ray.get(host.where.remote(str(run_dir), "r1", "l2"), timeout=60)
        missing = ray.get(host.where.remote(str(tmp_path / "elsewhere"), "r1", "l1"), timeout=60)
    finally:
        ray.kill(host)
    assert same["shared"] and not other["shared"] and not missing["shared"]
    assert same["ip"] == "127.0.0.1"


def add_back(ray_cluster, name: str) -> None:
    ray_cluster.workers[name] = ray_cluster.add_node(
        num_cpus=3, resources={name: 1, ACTOR_SLOT: 4}, node_ip_address="127.0.0.1"
    )
    ray_cluster.wait_for_nodes()


def test_actors_of_a_removed_node_restart_on_another_and_the_run_finishes(launch, ray_cluster):
    """With cluster.max_restarts, the actors of a node that goes are started again by aiorl's restart
    policy in new RoleHosts, which Ray places on the node left; they rejoin, and the run then stops
    cleanly (SIGTERM once they are back: a stop criterion could come before a slow restart rejoins)."""
    config = cluster(2, 1, 1, scheduled_timesteps=10**9)
    config["cluster"].update(
        max_restarts=2,
        restart_backoff_s=0.5,
        resources={
            "memory": {"num_cpus": 1, "resources": {NODES[0]: 0.1}},
            "learner": {"num_cpus": 1, "resources": {NODES[0]: 0.1}},
            "actor": {"num_cpus": 1, "resources": {ACTOR_SLOT: 1}},
        },
    )
    config["env"]["max_episode_steps"] = 50
    proc, run_dir = start_ray(launch, ray_cluster, config)
    removed = None
    try:
        wait_for(lambda: (last_metrics(run_dir) or {}).get("learner_steps", 0) > 5, 300, "the run to be RUNNING", 0.2)
        before = read_json(run_dir / "placement.json")
        removed = node_of(before["actor-0"])
        assert removed in NODES[1:], before
        gone = sorted(name for name, p in before.items() if node_of(p) == removed)
        ray_cluster.remove_node(ray_cluster.workers[removed])
        log = run_dir / "logs" / "memory-0.log"
        wait_for(
            lambda: all(f"{name} restarted (restart 1" in log.read_text() for name in gone),
            300,
            "the restarted actors to register again",
            0.2,
        )
        proc.send_signal(signal.SIGTERM)
        code, out = finish(proc, timeout_s=180)
    finally:
        proc.kill()
        if removed is not None:
            add_back(ray_cluster, removed)
    assert code == 143, out
    after = read_json(run_dir / "placement.json")
    for name in gone:
        assert node_of(after[name]) != removed, after
        assert after[name]["node_id"] != before[name]["node_id"]
    restarts = read_json(run_dir / "restarts.json")["restarts"]
    assert sorted(r["role"] for r in restarts) == gone, restarts
    summary = read_json(run_dir / "summary.json")
    assert summary["outcome"] == "interrupted" and summary["ok"], summary
    assert set(read_json(run_dir / "exits.json").values()) <= {0, 143}
    connect_state_api(ray_cluster)
    nothing_left(run_dir)


def test_a_lost_learner_restarts_the_whole_run_under_ray_as_locally(launch, ray_cluster):
    """Learner 0 SIGKILLed mid-run: the driver ends the attempt and starts the run again from the
    newest checkpoint, its roles placed anew (the same attempts code as the local launcher)."""
    config = cluster(2, 1, 1, scheduled_timesteps=60_000)
    config["run"] = {"checkpoint_interval_s": 1.0}
    proc, run_dir = start_ray(launch, ray_cluster, config)
    wait_for(lambda: list((run_dir / "checkpoints").glob("checkpoint-*.pt")), 300, "a checkpoint", 0.2)
    first = read_json(run_dir / "placement.json")
    os.kill(first["learner-0"]["pid"], signal.SIGKILL)
    code, out = finish(proc, timeout_s=400)
    assert code == 0, out
    assert "run finished after 1 run restart(s) (attempt 1: learner-0 lost" in out, out
    summary = read_json(run_dir / "summary.json")
    assert summary["outcome"] == "finished" and summary["run_restarts"] == 1, summary
    assert summary["resumed_from"]["checkpoint"] == summary["attempts"][1]["resume_from"]
    assert read_json(run_dir / "placement.json")["learner-0"]["pid"] != first["learner-0"]["pid"]
    connect_state_api(ray_cluster)
    nothing_left(run_dir)


def test_removing_a_worker_node_ends_the_run_naming_the_loss(launch, ray_cluster):
    """The node holding memory 1 goes (roles there with it): memory 1 is lost, named, and the run
    ends failed; afterwards nothing of the run is left on any node. Runs last: it adds the node back."""
    # Both memories on the worker nodes (spread: one each), so memory 1's node never holds the
    # coordinator: left to Ray, memory 1 may land on the head and memory 0 on a worker.
    config = cluster(2, 2, 1, scheduled_timesteps=10**9)
    config["cluster"]["resources"] = {"memory": {"num_cpus": 1, "resources": {ACTOR_SLOT: 1}}}
    config["cluster"].update(NO_RESTARTS)  # memory 1 would be restarted on the node left
    proc, run_dir = start_ray(launch, ray_cluster, config)
    seen: dict = {}
    removed = None
    try:
        wait_for(lambda: watch_running(run_dir, seen), 300, "the run to be RUNNING with every role", 0.5)
        placement = read_json(run_dir / "placement.json")
        victim, node = "memory-1", node_of(placement["memory-1"])
        assert node in NODES[1:] and node != node_of(placement["memory-0"]), placement
        removed = node
        ray_cluster.remove_node(ray_cluster.workers[node])
        code, out = finish(proc, timeout_s=240)
    finally:
        proc.kill()
        if removed is not None:
            add_back(ray_cluster, removed)
    assert code == 1, out
    lost = [name for name, p in placement.items() if node_of(p) == removed]
    assert victim in lost
    assert f"{victim} was lost with its Ray node" in out, out
    summary = read_json(run_dir / "summary.json")
    assert not summary["ok"] and summary["outcome"] == "failed", summary
    assert any(f.startswith(tuple(f"{name} lost" for name in lost)) for f in summary["failures"]), summary
    connect_state_api(ray_cluster)
    nothing_left(run_dir)
