"""The target policy `aiorl ope` evaluates: a run directory's (its best policy when it has one,
else its final one, as `aiorl eval` chooses: `aiorl.evaluation.policies`) or a policy file or
directory named outright; checked against the dataset's observation shape before it acts."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from aiorl.evaluation.policies import EvalError, choose_policy, load_checked, read_meta
from aiorl.io.export import policy_file
from aiorl.offline.dataset import Dataset
from aiorl.ope.target import OpeError


def policy_path_of(target: str | Path, which: str | None = None) -> tuple[Path, str]:
    """(the policy file, which one: "best", "final" or "file") that `target` names."""
    target = Path(target)
    if (target / "config.yaml").is_file():
        path, chosen, _ = choose_policy(target, which)
        return path, chosen
    if which is not None:
        raise EvalError(f"--{which}: {target} is not a run directory (no config.yaml)")
    if target.is_dir():
        target = policy_file(target)
    if not target.exists():
        raise EvalError(f"{target} does not exist (a run directory or a policy file was expected)")
    return target, "file"


def check_against_dataset(path: Path, dataset: Dataset) -> None:
    """Refuse a policy whose recorded observation shape is not the dataset's."""
    meta = read_meta(path) or {}
    have = meta.get("observation_shape")
    want = list(np.asarray(dataset.obs).shape[1:])
    if isinstance(have, list) and have != want:
        raise OpeError(
            f"{path} takes observations of shape {have} (made for {meta.get('env_id', 'another env')}), but the "
            f"dataset's are {want}"
        )


def load_target(path: Path, dataset: Dataset, trust_program: bool = False):
    """The policy at `path` (obs batch -> actions), checked against `dataset`."""
    check_against_dataset(path, dataset)
    return load_checked(path, None, trust_program)
