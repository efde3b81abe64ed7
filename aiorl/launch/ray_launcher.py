"""Ray launcher: the local launcher's run, with each role process placed on a Ray cluster.

`RayLauncher` is `aiorl.launch.local.LocalLauncher` with one thing changed: where
a role process starts. Each role gets a Ray actor, `RoleHost`, placed by Ray
(`aiorl.launch.placement`), which starts the very role process the local
launcher starts (``python -m aiorl run CONFIG --role KIND --index N``) on its
node and reports its exit; the driver sees each one through `RayProcess`, an
object with the Popen calls the local launcher makes. aiorl's wire still
carries every batch; Ray only places, starts and watches.

What it guarantees (docs/concepts/ray-launcher.md says why, with the start-up
measurements that keep a role exec'ed rather than forked from a warm spawner):

- every role binds and advertises its node's IP (``cluster.advertise_host``);
- ``run.dir`` is seen by every node, checked by each `RoleHost` before any role
  process starts (else one line, exit 2);
- the token only in the run directory's 0600 ``token``: never through Ray, a
  role's argv or its environment;
- a lost node's roles are lost roles, restarted by aiorl's policy
  (``cluster.max_restarts``), never Ray's;
- nothing outlives the run: the driver kills every RoleHost and its placement
  groups, and a role process is SIGKILLed when its RoleHost dies.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import ray
from ray.exceptions import GetTimeoutError, RayError
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from aiorl.io.rundir import OWNER_FILE, RunDirError, read_json, write_json_atomic
from aiorl.launch.child_env import inherited
from aiorl.launch.local import LaunchError, LocalLauncher
from aiorl.launch.placement import GROUP_STRATEGY, actor_options, role_resources
from aiorl.runtime.phase import role_name
from aiorl.wire.auth import TOKEN_ENV, write_token_file

log = logging.getLogger("aiorl.ray")
EXIT_USAGE = 2
NODE_LOST = -signal.SIGKILL  # how a role on a vanished node reads to the launcher


@ray.remote(max_restarts=0)
class RoleHost:
    """On one Ray node: starts one role process, waits for it, forwards signals to it.

    An async actor: every method runs on its one event-loop thread, so the
    role process is forked from a thread that lives as long as the actor
    (PR_SET_PDEATHSIG fires when the forking thread exits).
    """

    def __init__(self):
        self.proc: subprocess.Popen | None = None

    async def where(self, run_dir: str, run_id: str, launch_id: str) -> dict:
        """This node's IP and id, and whether it sees the driver's run directory (shared storage)."""
        owner = read_json(Path(run_dir) / OWNER_FILE) or {}
        launches = [a.get("launch_id") for a in owner.get("attempts") or []]
        return {
            "ip": ray.util.get_node_ip_address(),
            "node_id": ray.get_runtime_context().get_node_id(),
            "shared": owner.get("run_id") == run_id and launch_id in launches,
        }

    async def start(self, args: list[str], identity_env: dict, log_path: str) -> int:
        env = {key: value for key, value in os.environ.items() if key != TOKEN_ENV}
        env = {**inherited(env), **identity_env}  # a stale internal variable of the node's never reaches a role
        with open(log_path, "ab") as log_file:
            self.proc = subprocess.Popen(
                [sys.executable, *args],
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=log_file,
                start_new_session=True,
                preexec_fn=_die_with_host,
                env=env,
            )
        return self.proc.pid

    async def wait(self) -> int:
        while self.proc.poll() is None:
            await asyncio.sleep(0.05)
        return self.proc.returncode

    async def signal(self, signum: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signum)


def _kill_actor(host) -> None:
    try:
        ray.kill(host, no_restart=True)
    except (RayError, ValueError):
        pass  # already gone


def _die_with_host() -> None:  # runs in the role process between fork and exec
    import ctypes

    # Ray's threads block SIGINT, and a blocked mask survives exec: the role would never see Ctrl-C.
    signal.pthread_sigmask(signal.SIG_SETMASK, set())
    if sys.platform.startswith("linux"):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class RayProcess:
    """A role process on a Ray node, with the Popen calls the local launcher makes."""

    def __init__(self, host, pid: int, node_ip: str):
        self.host = host
        self.pid = pid
        self.node_ip = node_ip
        self.returncode: int | None = None
        self.node_lost = False
        self._exit = host.wait.remote()

    def poll(self) -> int | None:
        if self.returncode is None:
            ready, _ = ray.wait([self._exit], timeout=0)
            if ready:
                self._take(ready[0])
        return self.returncode

    def _take(self, ref) -> None:
        try:
            self.returncode = ray.get(ref)
        except RayError:  # its RoleHost died: the node went away (or someone killed the actor)
            self.node_lost = True
            self.returncode = NODE_LOST

    def wait(self, timeout: float | None = None) -> int:
        if self.poll() is None:
            ready, _ = ray.wait([self._exit], timeout=timeout)
            if not ready:
                raise subprocess.TimeoutExpired(f"role pid {self.pid} on {self.node_ip}", timeout)
            self._take(ready[0])
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if self.returncode is None:
            self.host.signal.remote(int(signum))

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def _unreachable(address: str, timeout_s: float = 5.0) -> str | None:
    """Why HOST:PORT takes no connection, if it does not (ray.init would retry it for minutes)."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or "://" in address:
        return None  # 'auto', ray://...: ray.init resolves and reports those itself
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as exc:
        return exc.strerror or str(exc)
    return None


class RayLauncher(LocalLauncher):
    """Run every role of a config on a Ray cluster (`cluster.ray_address`); see the module doc."""

    def __init__(self, cfg, run_dir, quiet: bool = False, spawner=None, on_metrics=None):
        # Roles start on their nodes: no local spawner.
        super().__init__(cfg, run_dir, quiet=quiet, on_metrics=on_metrics)
        self.groups: dict[str, object] = {}  # role kind -> placement group
        self.hosts: dict[str, object] = {}  # role name -> its current RoleHost
        self.placed: dict[str, dict] = {}  # role name -> where its current RoleHost is
        self.all_hosts: list = []
        self.announced: list[RayProcess] = []  # processes whose lost node was already said
        self.node_resources: dict[str, list[str]] = {}  # node id -> its custom resource names

    def run(self) -> int:
        address = self.cfg.cluster.ray_address
        try:
            unreachable = _unreachable(address)
            if unreachable:
                print(
                    f"aiorl: cannot reach the Ray cluster at cluster.ray_address={address!r}: {unreachable}",
                    file=sys.stderr,
                )
                return EXIT_USAGE
            try:
                ray.init(address=address, logging_level=logging.WARNING, log_to_driver=False, configure_logging=False)
            except (ConnectionError, RuntimeError, ValueError) as exc:
                print(
                    f"aiorl: cannot reach the Ray cluster at cluster.ray_address={address!r}: "
                    f"{str(exc).splitlines()[0]}",
                    file=sys.stderr,
                )
                return EXIT_USAGE
            try:
                self._place()
            except RunDirError as exc:
                print(f"aiorl: {exc}", file=sys.stderr)
                return EXIT_USAGE
            return super().run()
        finally:
            self._release()

    # ------------------------------------------------------------------ placement

    def _place(self) -> None:
        """Reserve every role's resources and check every node sees the run directory, before any role starts."""
        c = self.cfg.cluster
        token = os.environ.get(TOKEN_ENV)
        if self.cfg.run.token_file is None and token and token.strip():
            write_token_file(self.run_dir / "token", token.strip().encode())  # roles never see the env
        self.node_resources = {
            node["NodeID"]: sorted(
                k
                for k in node.get("Resources", {})
                if k not in ("CPU", "GPU", "memory", "object_store_memory") and not k.startswith("node:")
            )
            for node in ray.nodes()
            if node.get("Alive")
        }
        counts = {"memory": c.memories, "learner": c.learners}
        for kind, strategy in GROUP_STRATEGY.items():
            bundles = [role_resources(c, kind)] * counts[kind]
            group = placement_group(bundles, strategy=strategy)
            self.groups[kind] = group
            try:
                ray.get(group.ready(), timeout=c.start_timeout_s)
            except GetTimeoutError:
                raise RunDirError(
                    f"the Ray cluster at {c.ray_address} cannot place {counts[kind]} {kind}(s) of {bundles[0]} "
                    f"within cluster.start_timeout_s ({c.start_timeout_s:g} s); it has "
                    f"{ray.cluster_resources()}: change cluster.resources.{kind} or add nodes"
                ) from None
        for kind, count in (("memory", c.memories), ("learner", c.learners), ("actor", c.actors)):
            for index in range(count):
                self._new_host(kind, index)
        wheres = ray.get(
            [
                self.hosts[name].where.remote(
                    str(self.run_dir.resolve()), self.rundir.identity.run_id, self.rundir.identity.launch_id
                )
                for name in self.hosts
            ],
            timeout=c.start_timeout_s,
        )
        for name, where in zip(list(self.hosts), wheres):
            self.placed[name] = {**where, "node_resources": self.node_resources.get(where["node_id"], [])}
        unshared = sorted({w["ip"] for w in self.placed.values() if not w["shared"]})
        if unshared:
            raise RunDirError(
                f"run.dir {self.run_dir.resolve()} is not on storage shared with the Ray node(s) at "
                f"{', '.join(unshared)}: the Ray launcher needs a run.dir every node sees "
                "(NFS or another shared filesystem)"
            )

    def _new_host(self, kind: str, index: int):
        c = self.cfg.cluster
        options = actor_options(c, kind)
        group = self.groups.get(kind)
        if group is not None:
            options["scheduling_strategy"] = PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=index)
        else:
            options["scheduling_strategy"] = "SPREAD"
        host = RoleHost.options(**options).remote()
        self.hosts[role_name(kind, index)] = host
        self.all_hosts.append(host)
        return host

    # ------------------------------------------------------------------ role processes

    def _role_args(self, kind: str, index: int) -> list[str]:
        ip = self.placed[role_name(kind, index)]["ip"]
        coordinator_ip = self.placed["memory-0"]["ip"]
        return [
            *super()._role_args(kind, index),
            "--set",
            f"cluster.host={coordinator_ip}",
            "--set",
            f"cluster.advertise_host={ip}",
        ]

    def _start(self, kind: str, index: int, log_path: Path, restart: bool = False) -> RayProcess:
        name = role_name(kind, index)
        if name in self.children:  # a restart: a new RoleHost, placed anew (the old one's node may be going)
            _kill_actor(self.hosts[name])
            self._new_host(kind, index)
            where = ray.get(
                self.hosts[name].where.remote(
                    str(self.run_dir.resolve()), self.rundir.identity.run_id, self.rundir.identity.launch_id
                ),
                timeout=self.cfg.cluster.start_timeout_s,
            )
            if not where["shared"]:
                raise LaunchError(
                    f"{name} was placed on the Ray node at {where['ip']}, which does not see "
                    f"run.dir {self.run_dir.resolve()}"
                )
            self.placed[name] = {**where, "node_resources": self.node_resources.get(where["node_id"], [])}
        host = self.hosts[name]
        try:
            pid = ray.get(
                host.start.remote(self._role_args(kind, index), self.rundir.identity.env(), str(log_path.resolve())),
                timeout=self.cfg.cluster.start_timeout_s,
            )
        except RayError as exc:
            raise LaunchError(
                f"{name}: its Ray actor on {self.placed[name]['ip']} could not start it: {str(exc).splitlines()[0]}"
            ) from None
        log.debug("started %s on %s (pid %d)", name, self.placed[name]["ip"], pid)
        return RayProcess(host, pid, self.placed[name]["ip"])

    def _write_pids(self) -> None:
        super()._write_pids()
        write_json_atomic(
            self.run_dir / "placement.json",
            {
                name: {
                    "pid": child.pid,
                    "ip": self.placed[name]["ip"],
                    "node_id": self.placed[name]["node_id"],
                    "node_resources": self.placed[name]["node_resources"],
                }
                for name, child in self.children.items()
            },
        )

    def _restart_due(self, now: float) -> None:
        for child in self.children.values():
            if child.proc.poll() is not None and child.proc.node_lost and child.proc not in self.announced:
                self.announced.append(child.proc)
                print(
                    f"aiorl: {child.name} was lost with its Ray node ({child.proc.node_ip})",
                    file=sys.stderr,
                    flush=True,
                )
        super()._restart_due(now)

    def _release(self) -> None:
        """Kill every RoleHost (its role process, if any is left, gets SIGTERM) and free the groups."""
        if not ray.is_initialized():
            return
        for host in self.all_hosts:
            _kill_actor(host)
        for group in self.groups.values():
            try:
                remove_placement_group(group)
            except (RayError, ValueError):
                pass
        deadline = time.monotonic() + 10.0
        while self.all_hosts and time.monotonic() < deadline and self._hosts_alive():
            time.sleep(0.1)
        ray.shutdown()

    def _hosts_alive(self) -> bool:
        from ray.util.state import list_actors

        ids = {host._actor_id.hex() for host in self.all_hosts}
        try:
            alive = list_actors(filters=[("state", "=", "ALIVE")], raise_on_missing_output=False)
        except Exception:  # the state API needs the dashboard; without it, ray.kill is all we can do
            return False
        return any(actor.actor_id in ids for actor in alive)
