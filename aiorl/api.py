"""The Python API: run a config, load a config, load a trained policy.

    import aiorl
    result = aiorl.run("examples/apex_dqn_cartpole.yaml", overrides={"agent.scheduled_global_steps": 2000})
    policy = aiorl.load_policy(result.run_dir)
    action = policy(observation)

`run` is `aiorl run` without the shell: the same checks before anything
starts (a bad config raises `aiorl.config.ConfigError`, a taken run directory
`aiorl.io.rundir.RunDirError`), the same launcher, and it blocks until every role
has exited. It works from any thread: the launcher takes over SIGINT/SIGTERM
(Ctrl-C stops the run cleanly) only when called from the main thread.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiorl.config import Config
from aiorl.evaluation.policies import POLICY_DIR, load_checked, read_meta
from aiorl.experiment.loading import load_config
from aiorl.experiment.preflight import prepare_local_run
from aiorl.experiment.reference import _flow
from aiorl.io.export import policy_file
from aiorl.io.rundir import read_json
from aiorl.launch import spawner
from aiorl.launch.attempts import run_attempts


@dataclass
class RunResult:
    """How a run ended: its directory, `aiorl run`'s exit code and ``summary.json``."""

    run_dir: Path
    exit_code: int
    summary: dict = field(default_factory=dict)

    @property
    def outcome(self) -> str:
        """'finished', 'interrupted' or 'failed' (summary.json's ``outcome``)."""
        return str(self.summary.get("outcome", "failed"))

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    def __repr__(self) -> str:
        # The summary is kilobytes: the repr says how the run ended; `.summary` has the rest.
        s = self.summary
        evaluation = (s.get("evaluation") or {}).get("best")
        parts = [
            f"{self.outcome}",
            f"exit_code={self.exit_code}",
            f"env_steps={s.get('env_steps')}",
            f"learner_steps={s.get('learner_steps')}",
            f"return_mean_100={s.get('return_mean_100')}",
            *([f"best_eval={evaluation['return_mean']:g}"] if evaluation else []),
            f"run_dir='{self.run_dir}'",
        ]
        return f"<RunResult {' '.join(parts)}>"


def _override_list(overrides: Mapping[str, Any] | Sequence[str] | None) -> list[str]:
    """``{"agent.batch_size": 64}`` or ``["agent.batch_size=64"]`` as `--set` strings."""
    if overrides is None:
        return []
    if isinstance(overrides, Mapping):
        return [f"{key}={_flow(value)}" for key, value in overrides.items()]
    if isinstance(overrides, str):
        raise TypeError("overrides: give a mapping or a list of 'key.path=value' strings, not one string")
    return list(overrides)


class _Callback:
    """`on_metrics`, keeping the exception it raised for `run` to raise after the run."""

    def __init__(self, fn: Callable[[dict], object]):
        self.fn = fn
        self.error: Exception | None = None

    def __call__(self, row: dict) -> None:
        try:
            self.fn(row)
        except Exception as exc:
            self.error = exc
            raise


def _load(config: str | Path | Mapping | Config, overrides: list[str]) -> Config:
    if isinstance(config, Config):
        return load_config(data=config.to_dict(), overrides=overrides)
    if isinstance(config, Mapping):
        return load_config(data=dict(config), overrides=overrides)
    return load_config(config, overrides)


def run(
    config: str | Path | Mapping | Config,
    overrides: Mapping[str, Any] | Sequence[str] | None = None,
    run_dir: str | Path | None = None,
    quiet: bool = True,
    on_metrics: Callable[[dict], object] | None = None,
) -> RunResult:
    """Run `config` (a file, a mapping or a `Config`) with every role as a local process (on a Ray
    cluster with ``cluster.launcher: ray``); block until it ends. `overrides` are `--set` values;
    `run_dir` is ``run.dir``; `quiet=False` shows the panel.

    `on_metrics` is called, in this thread, with each row of the run's ``metrics.jsonl`` (a dict:
    ``time_s``, ``phase``, ``env_steps``, ``learner_steps``, ``return_mean_100``, ``eval/...``;
    see `aiorl.io.metrics`) within about a second of its writing, so that a notebook can show
    progress its own way. If it raises, the run stops cleanly (as on Ctrl-C) and `run` raises that
    exception once every role has exited."""

    sets = _override_list(overrides)
    cfg = _load(config, sets)
    if run_dir is not None:
        cfg.run.dir = str(run_dir)
    callback = None if on_metrics is None else _Callback(on_metrics)
    warm = spawner.for_run(cfg, None)
    try:
        claimed = prepare_local_run(cfg, None, sets, warm)
        code = run_attempts(cfg, claimed, quiet, warm, on_metrics=callback)
    finally:
        if warm is not None:
            warm.end()
    if callback is not None and callback.error is not None:
        raise callback.error
    return RunResult(claimed.path, code, read_json(claimed.path / "summary.json") or {})


class Policy:
    """A trained policy as a function: one observation -> one action, or a batch -> a batch.

    ``meta`` is the run's ``policy.json`` (observation shape, action space, learner steps).
    A recurrent policy (``model.recurrent``) is called ``policy(obs, state)`` and returns
    ``(action, state)``; ``state=None`` is an episode's start (zeros).
    """

    def __init__(self, module, meta: dict | None, path: Path):
        self.module = module
        self.meta = meta or {}
        self.path = path

    def __repr__(self) -> str:
        return f"<aiorl.Policy {self.meta.get('algo', '?')} on {self.meta.get('env_id', '?')} from {self.path}>"

    def __call__(self, obs, state=None):
        import numpy as np
        import torch

        obs = np.asarray(obs)
        shape = self.meta.get("observation_shape")
        single = shape is not None and tuple(obs.shape) == tuple(shape)
        batch = torch.as_tensor(obs[None] if single else obs)
        state_size = getattr(self.module, "state_size", 0)
        with torch.no_grad():
            if state_size:
                state = torch.zeros(len(batch), state_size) if state is None else torch.as_tensor(state)
                actions, state = self.module(batch, state.reshape(len(batch), state_size))
                state = state.numpy()
            else:
                actions = self.module(batch)
            actions = actions.numpy()
        if state_size:
            return (actions if not single else self._one(actions)), (state if not single else state[0])
        if not single:
            return actions
        return self._one(actions)

    def _one(self, actions):
        action = self.meta.get("action", {})
        if action.get("kind") == "discrete":
            return int(actions[0])
        return actions[0].reshape(action["shape"]) if "shape" in action else actions[0]


def load_policy(run_dir_or_file: str | Path, trust_program: bool = False) -> Policy:
    """The exported policy of a run directory (or a policy file), loaded by
    `aiorl.evaluation.policies.load_policy`; raises `aiorl.evaluation.policies.EvalError` when there
    is none or it is bad.

    What is loaded is data: the network rebuilt by aiorl's own code from ``policy.json`` and its
    weights read from ``policy.safetensors``. A program (``policy.pt2``, an older run's ``policy.pt``)
    runs code from the file when loaded: only with ``trust_program=True``, and only for files you
    trust."""
    path = Path(run_dir_or_file)
    if path.is_dir():
        path = policy_file(path / POLICY_DIR)
    return Policy(load_checked(path, trust_program=trust_program), read_meta(path), path)
