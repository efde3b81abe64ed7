"""Policies to evaluate: which file of a run (best or final), loaded by the one loader
(`load_policy`: the network rebuilt by aiorl from the policy's data, a program only when the
user trusts it), and checked before it is run: it loads, and it was made for this env. A bad
file is one `EvalError` line; the observation shape recorded in ``policy.json`` (beside the
policy file) is compared with the env's before any episode starts.
"""

from __future__ import annotations

from pathlib import Path

from aiorl.config import EnvConfig
from aiorl.evaluation.rebuild import load_policy_data
from aiorl.io.export import WEIGHTS_SUFFIX, PolicyFileError, load_policy_file, policy_file
from aiorl.io.policy_data import WEIGHTS_FILE, PolicyDataError, read_policy_meta
from aiorl.runtime.evaluator import BEST_DIR, read_best

META_FILE = "policy.json"

POLICY_DIR = Path("policy")


class EvalError(RuntimeError):
    """The run directory has no usable policy or config."""


def load_policy(path: str | Path, trust_program: bool = False):
    """The one policy loader: a callable obs batch -> actions, rebuilt from the policy's data
    (policy.safetensors and policy.json, `aiorl.evaluation.rebuild`). A program (policy.pt2, an
    older run's policy.pt) runs code from the file: named with `trust_program`, it is loaded
    (`aiorl.io.export.load_policy_file`); named without it, the data beside it is opened instead,
    and a program alone is refused."""
    path = Path(path)
    try:
        if path.suffix == WEIGHTS_SUFFIX:
            return load_policy_data(path)
        if not trust_program and path.with_name(WEIGHTS_FILE).is_file():
            return load_policy_data(path.with_name(WEIGHTS_FILE))  # the same policy, as data
        return load_policy_file(path, trust_program)
    except PolicyFileError as exc:
        raise EvalError(str(exc)) from None


def read_meta(policy_path: str | Path) -> dict | None:
    """The ``policy.json`` beside `policy_path`, or None if there is none (a policy from elsewhere)."""
    path = Path(policy_path).with_name(META_FILE)
    if not path.is_file():
        return None
    try:
        return read_policy_meta(path)  # size-capped, a duplicated key refused
    except PolicyDataError as exc:
        raise EvalError(str(exc)) from None


def check_matches_env(meta: dict | None, env_cfg: EnvConfig, policy_path: str | Path) -> None:
    """Refuse a policy whose recorded observation shape is not the env's."""
    from aiorl.envs import env_spec

    if meta is None or "observation_shape" not in meta:
        return
    have = meta["observation_shape"]
    if not (isinstance(have, list) and all(type(d) is int for d in have)):
        raise EvalError(f"{policy_path}: policy.json's observation_shape must be a list of integers, got {have!r}")
    have = tuple(have)
    want = tuple(env_spec(env_cfg).observation_space.shape)
    if have != want:
        raise EvalError(
            f"{policy_path} takes observations of shape {list(have)} (made for "
            f"{meta.get('env_id', 'another env')}), but {env_cfg.id} gives {list(want)}; "
            "evaluate it on the env it was trained on"
        )


def load_checked(policy_path: str | Path, env_cfg: EnvConfig | None = None, trust_program: bool = False):
    """`load_policy(policy_path, trust_program)`, checked against `env_cfg` when given; EvalError if
    it cannot be loaded."""
    if env_cfg is not None:
        check_matches_env(read_meta(policy_path), env_cfg, policy_path)
    try:
        return load_policy(policy_path, trust_program)
    except EvalError:
        raise
    except Exception as exc:  # torch says why in its own words; the user needs which file and that it is bad
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise EvalError(f"{policy_path} is not a policy aiorl exported ({type(exc).__name__}: {first})") from None


def choose_policy(run_dir: Path, which: str | None) -> tuple[Path, str, dict | None]:
    """The policy file `which` ("best", "final"; None: best when there is one) names, which it is,
    and the evaluation during training that chose it (best only)."""
    best = read_best(run_dir / POLICY_DIR)
    best_path = policy_file(run_dir / POLICY_DIR / BEST_DIR)
    if which == "best" and (best is None or not best_path.is_file()):
        raise EvalError(
            f"--best: {run_dir} has no best policy ({run_dir / POLICY_DIR / BEST_DIR} is kept by "
            "evaluations during training: set run.eval_every); --final evaluates the final one"
        )
    if which == "best" or (which is None and best is not None and best_path.is_file()):
        return best_path, "best", best
    return policy_file(run_dir / POLICY_DIR), "final", None
