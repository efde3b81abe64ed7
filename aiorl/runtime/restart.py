"""Restarting role processes: which roles, which exits, how often, after how long.

``cluster.max_restarts`` is a per-role budget for the whole run: a role that
exits abnormally is started again with the same kind and index, up to that
many times, each after a backoff (``cluster.restart_backoff_s``, doubled after
each quick failure up to ``cluster.restart_backoff_max_s``; a process that ran
for ``HEALTHY_AFTER_S`` resets it). The restarted process registers again; the
coordinator (`aiorl.runtime.coordinator`) accepts the new incarnation of a
lost role under the same budget and rule (`restartable`), so a launcher only
has to start processes: `RestartPolicy` is all the bookkeeping it needs (the
local launcher uses it; a Ray launcher reuses it unchanged).

What is restarted: actors, and memory hosts other than 0 (memory 0 runs the
coordinator) of asynchronous algorithms, in any phase before STOPPING (STARTING included) and for every
algorithm; on by default. A memory host rejoins empty, or from its last replay
snapshot when ``run.snapshot_replay`` is on. A restarted synchronous actor
joins the iteration after the newest weights (DPPO: the coordinator says which
at registration, `aiorl.runtime.rounds`) or takes work items again (ES).
Learners and memory host 0 are not restarted in place: data-parallel learners
cannot rejoin a ``torch.distributed`` group mid-run, and the coordinator holds
the run's state; losing one ends the attempt, and the launcher starts the whole
run again from its newest checkpoint (``cluster.max_run_restarts``,
`aiorl.launch.attempts`).
Exits that are never restarted: 0 (finished), 3 (lost the coordinator: the
run is ending) and 4 (refused by the coordinator). A role the coordinator
declares lost while its process still lives (hung past the heartbeat timeout)
is killed by the local launcher, and so restarted like any killed role.

The local launcher, as every role's parent, sees an exit at once and tells the
coordinator (``child_exit``, `aiorl.launch.notices`), which then declares that
incarnation lost without waiting for its heartbeats to stop
(`aiorl.runtime.coordinator.notices`).
"""

from __future__ import annotations

import signal
from dataclasses import dataclass, field

from aiorl.runtime.phase import EXIT_COORDINATOR_LOST, EXIT_OK, EXIT_REFUSED, parse_role_name

HEALTHY_AFTER_S = 60.0
NOT_RESTARTED = frozenset({EXIT_OK, EXIT_COORDINATOR_LOST, EXIT_REFUSED})
#: The handshake name of the local launcher's connection to the coordinator. No role has it
#: (a role connects under its role name); the coordinator takes exit notices from it alone.
LAUNCHER_PEER = "launcher"


def restartable(kind: str, index: int, synchronous: bool = False) -> bool:
    """Whether a role of this kind and index may be restarted in place at all (the budget aside).
    Not a memory host of a synchronous run: the rounds it gathered (which iteration, which parts)
    die with it, and a new one would start again at iteration 0; the whole run restarts instead."""
    return kind == "actor" or (kind == "memory" and index > 0 and not synchronous)


@dataclass
class RestartPolicy:
    max_restarts: int
    synchronous: bool = False
    backoff_s: float = 1.0
    backoff_max_s: float = 30.0
    healthy_after_s: float = HEALTHY_AFTER_S
    restarts: dict[str, int] = field(default_factory=dict)
    history: list[dict] = field(default_factory=list)
    _quick: dict[str, int] = field(default_factory=dict)

    @classmethod
    def from_config(cls, cfg, synchronous: bool) -> RestartPolicy:
        c = cfg.cluster
        return cls(c.max_restarts, synchronous, c.restart_backoff_s, c.restart_backoff_max_s)

    def __repr__(self) -> str:
        return f"<RestartPolicy max={self.max_restarts} restarts={self.restarts}>"

    def decide(self, name: str, exit_code: int, ran_s: float) -> float | None:
        """Seconds to wait before starting `name` again after it exited with `exit_code` having
        run `ran_s` seconds; None when it is not to be restarted. Counts the restart."""
        kind, index = parse_role_name(name)
        if exit_code in NOT_RESTARTED or not restartable(kind, index, self.synchronous):
            return None
        done = self.restarts.get(name, 0)
        if done >= self.max_restarts:
            return None
        quick = 0 if ran_s >= self.healthy_after_s else self._quick.get(name, 0) + 1
        self._quick[name] = quick
        delay = min(self.backoff_max_s, self.backoff_s * 2 ** max(0, quick - 1))
        self.restarts[name] = done + 1
        self.history.append(
            {"role": name, "exit": exit_code, "ran_s": round(ran_s, 3), "restart": done + 1, "delay_s": round(delay, 3)}
        )
        return delay

    def left(self, name: str) -> int:
        return self.max_restarts - self.restarts.get(name, 0)


def exit_notice(name: str, pid: int, returncode: int) -> dict:
    """A ``child_exit`` notice: `returncode` as ``Popen`` gives it (-N: killed by signal N)."""
    if returncode < 0:
        return {"role": name, "pid": pid, "signal": -returncode}
    return {"role": name, "pid": pid, "exit_code": returncode}


def describe_notice(fields: dict) -> str:
    """How a noticed process ended, in words ("killed by SIGKILL", "exit code 1")."""
    number = fields.get("signal")
    if number is not None:
        try:
            return f"killed by {signal.Signals(number).name}"
        except ValueError:
            return f"killed by signal {number}"
    return f"exit code {fields.get('exit_code')}"
