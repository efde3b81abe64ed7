"""An env's non-finite values: a reward or an observation that is NaN or infinite.

That is the env's fault, not a peer's: the actor counts each env step that holds one
(``env_steps_nonfinite``), drops the rows it would send that hold one (``rows_dropped_nonfinite``:
on the replay path; a rollout or a fragment, whose rows belong together, goes whole and the
memory host drops those rows, `aiorl.runtime.memory.tally`), and keeps an episode whose return
is not finite out of the returns it reports (``episodes_nonfinite``). A heartbeat therefore never
carries a non-finite return (the coordinator would close the connection of a peer that sends
one). Training goes on with the rest.

An env that gives nothing else fails the run, once: no finite step in an actor's first
`FAIL_AFTER_STEPS` env steps (of all its envs; counted by steps, so a slow env fails as surely
as a quick one) is `EnvNotFinite`, a failure a restart would repeat, one line naming the env
and the fields.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from aiorl.runtime.role import FatalToRun

FAIL_AFTER_STEPS = 1000
# The fields of `aiorl.envs.vector.EnvRunner.rollout` the env makes (actions are the policy's).
ENV_FIELDS = ("reward", "obs", "next_obs")


class EnvNotFinite(FatalToRun):
    """Every step the env gave was non-finite: a restarted actor would get the same env."""


def nonfinite_rows(arrays: Mapping[str, np.ndarray], n: int, fields=None) -> tuple[np.ndarray, list[str]] | None:
    """The mask of the `n` rows (first axis) holding a non-finite float in one of `fields` (every
    field when None), and the fields that hold them; None when no row does."""
    bad = None
    found = []
    for field, value in arrays.items():
        if (fields is not None and field not in fields) or value.dtype.kind != "f" or len(value) != n:
            continue
        if value.size == 0 or np.isfinite(value.min()) and np.isfinite(value.max()):  # NaN propagates
            continue
        rows = ~np.isfinite(value.reshape(n, -1)).all(axis=1)
        bad = rows if bad is None else bad | rows
        found.append(field)
    return None if bad is None else (bad, found)


class EnvFaults:
    """One actor's account of its env's non-finite values (`env_id` names the env in the error)."""

    def __init__(self, env_id: str, actor: str, fail_after_steps: int = FAIL_AFTER_STEPS):
        self.env_id = env_id
        self.actor = actor
        self.fail_after_steps = fail_after_steps
        self.steps = 0
        self.steps_nonfinite = 0
        self.rows_dropped = 0
        self.episodes_nonfinite = 0
        self.fields: set[str] = set()
        self.finite_seen = False

    def check_rollout(self, rollout: Mapping[str, np.ndarray]) -> None:
        """Count the env steps of a ``[T, num_envs]`` rollout that hold a non-finite reward or
        observation; EnvNotFinite once `fail_after_steps` steps have gone by without a finite one."""
        reward = rollout["reward"]
        steps = reward.size
        flat = {f: v.reshape((steps,) + v.shape[reward.ndim :]) for f, v in rollout.items() if f in ENV_FIELDS}
        found = nonfinite_rows(flat, steps)
        bad = 0 if found is None else int(np.count_nonzero(found[0]))
        if found is not None:
            self.fields.update(found[1])
        self.steps += steps
        self.steps_nonfinite += bad
        self.finite_seen = self.finite_seen or bad < steps
        if not self.finite_seen and self.steps >= self.fail_after_steps:
            raise EnvNotFinite(
                f"env {self.env_id} gave no finite {' or '.join(sorted(self.fields))} in the first "
                f"{self.steps} env steps of {self.actor} (every one NaN or infinite): the env is broken, "
                "there is nothing to learn from"
            )

    def drop_rows(self, batch: dict, priorities):
        """(batch, priorities) without the rows holding a non-finite float; ({}, None) if none is left."""
        if not batch:
            return batch, priorities
        n = len(next(iter(batch.values())))
        found = nonfinite_rows(batch, n)
        if found is None:
            return batch, priorities
        good = ~found[0]
        self.rows_dropped += n - int(np.count_nonzero(good))
        if not good.any():
            return {}, None
        batch = {k: v[good] if len(v) == n else v for k, v in batch.items()}
        return batch, None if priorities is None else np.asarray(priorities)[good]

    def finite_episodes(self, returns: list[float], lengths: list[int]) -> tuple[list[float], list[int]]:
        """The episodes whose return is finite (an episode with a non-finite reward has none)."""
        keep = [i for i, r in enumerate(returns) if np.isfinite(r)]
        if len(keep) == len(returns):
            return returns, lengths
        self.episodes_nonfinite += len(returns) - len(keep)
        return [returns[i] for i in keep], [lengths[i] for i in keep if i < len(lengths)]

    def stats(self) -> dict:
        return {
            "env_steps_nonfinite": self.steps_nonfinite,
            "rows_dropped_nonfinite": self.rows_dropped,
            "episodes_nonfinite": self.episodes_nonfinite,
        }
