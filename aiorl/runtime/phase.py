"""Run phases, driven by the coordinator (see DESIGN.md, "Shutdown phases")."""

from __future__ import annotations

import enum


class Phase(enum.IntEnum):
    STARTING = 0  # roles register; nothing flows yet
    RUNNING = 1  # until a stop criterion holds or a signal arrives
    STOPPING = 2  # actors deliver their last batch and report done
    DRAINING = 3  # memories stop sampling; learners finish, checkpoint, report done
    CLOSING = 4  # memories apply the last updates, snapshot, report done
    EXITED = 5  # the coordinator told everyone to exit


# Which kind of role must report done before the phase can end.
PHASE_OWNER = {Phase.STOPPING: "actor", Phase.DRAINING: "learner", Phase.CLOSING: "memory"}

# Exit codes of a role process.
EXIT_OK = 0
EXIT_ERROR = 1
EXIT_FAILED = 2  # the role missed a deadline, the run failed, or its work raised
EXIT_COORDINATOR_LOST = 3
EXIT_REFUSED = 4  # the coordinator refused the registration (run past RUNNING, restart budget spent, ...)
EXIT_INTERRUPTED = 130

# How a run ended (summary.json "outcome"), and the exit code that tells a scheduler:
# finished 0; interrupted 128 + the signal (130 SIGINT, 143 SIGTERM) after a clean shutdown, so
# it can be requeued with --resume; failed 1 for `aiorl run` (2 for the coordinator's own process).
FINISHED, INTERRUPTED, FAILED = "finished", "interrupted", "failed"


def last_checkpoint_budget_s(cluster) -> float:
    """How long learner 0 may take for its checkpoint when it ends abnormally (and so how much
    longer than the coordinator timeout a launcher waits for roles once the coordinator is gone)."""
    return max(cluster.coordinator_timeout_s, 10.0)


def interrupted_exit_code(signal_name: str | None) -> int:
    import signal

    try:
        return 128 + int(signal.Signals[signal_name])
    except (KeyError, TypeError):
        return EXIT_INTERRUPTED


def role_name(kind: str, index: int) -> str:
    return f"{kind}-{index}"


def parse_role_name(name: str) -> tuple[str, int]:
    kind, _, index = name.rpartition("-")
    if kind not in ("actor", "memory", "learner") or not index.isdigit():
        raise ValueError(f"not a role name: {name!r} (expected actor-N, memory-N or learner-N)")
    return kind, int(index)
