"""An exported policy checked before it is run: it loads, and it was made for this env.

`aiorl eval` and `aiorl.load_policy` load policies through
`aiorl.evaluate.load_policy` (whatever format the export uses); this module
turns what a bad file raises into one `EvalError` line, and compares the
observation shape recorded in ``policy.json`` (beside the policy file) with
the env's before any episode starts.
"""

from __future__ import annotations

import json
from pathlib import Path

from aiorl.config import EnvConfig

META_FILE = "policy.json"


def read_meta(policy_path: str | Path) -> dict | None:
    """The ``policy.json`` beside `policy_path`, or None if there is none (a policy from elsewhere)."""
    from aiorl.evaluate import EvalError

    path = Path(policy_path).with_name(META_FILE)
    if not path.is_file():
        return None
    try:
        meta = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise EvalError(f"{path}: not a readable policy description ({exc})") from None
    return meta if isinstance(meta, dict) else None


def check_matches_env(meta: dict | None, env_cfg: EnvConfig, policy_path: str | Path) -> None:
    """Refuse a policy whose recorded observation shape is not the env's."""
    from aiorl.envs import env_spec
    from aiorl.evaluate import EvalError

    if meta is None or "observation_shape" not in meta:
        return
    want = tuple(env_spec(env_cfg).observation_space.shape)
    have = tuple(meta["observation_shape"])
    if have != want:
        raise EvalError(
            f"{policy_path} takes observations of shape {list(have)} (made for "
            f"{meta.get('env_id', 'another env')}), but {env_cfg.id} gives {list(want)}; "
            "evaluate it on the env it was trained on"
        )


def load_checked(policy_path: str | Path, env_cfg: EnvConfig | None = None):
    """`aiorl.evaluate.load_policy(policy_path)`, checked against `env_cfg` when given; EvalError if
    it cannot be loaded."""
    from aiorl.evaluate import EvalError, load_policy

    if env_cfg is not None:
        check_matches_env(read_meta(policy_path), env_cfg, policy_path)
    try:
        return load_policy(policy_path)
    except EvalError:
        raise
    except Exception as exc:  # torch says why in its own words; the user needs which file and that it is bad
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise EvalError(f"{policy_path} is not a policy aiorl exported ({type(exc).__name__}: {first})") from None
