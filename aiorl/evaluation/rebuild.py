"""A policy's network rebuilt by aiorl's own code from its data: ``policy.json``'s ``rebuild``
record and the weights in ``policy.safetensors`` (`aiorl.io.policy_data` writes both). Nothing
from the files is run:

1. the recorded config goes through aiorl's normal validation (`load_config`): a bad value is
   refused as the config error it is; the algorithm comes from aiorl's registry by name;
2. the spaces are rebuilt from their recorded shape, dtype and bounds (no env is made);
3. the acting module is built on torch's meta device (nothing allocated) and its state dict's
   names, shapes and dtypes are compared with the tensor file's checked header, its whole size
   with the cap: a record that names a layer of 10**12 units is refused here, before anything
   is allocated;
4. only then is it built on the CPU, the weights loaded (strict), set to eval, gradients off.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from aiorl.config import ConfigError
from aiorl.experiment.loading import load_config
from aiorl.io.export import POLICY_META, PolicyFileError
from aiorl.io.policy_data import (
    CONFIG_KEYS,
    MAX_POLICY_BYTES,
    PLACEHOLDER_ENV,
    REBUILD_KEY,
    PolicyDataError,
    check_against,
    read_policy_meta,
    space_from_data,
    tensor_of,
)
from aiorl.io.tensor_file import TensorFileError, open_tensor_file


def _config(record: dict):
    """The config the record holds, validated as any run config is (env.id a placeholder)."""
    config = record.get("config")
    if not isinstance(config, dict):
        raise PolicyDataError("rebuild.config: a mapping was expected")
    data = {key: config[key] for key in ("algo", "model", "agent") if key in config}
    for section, keys in CONFIG_KEYS.items():
        given = config.get(section) or {}
        if not isinstance(given, dict):
            raise PolicyDataError(f"rebuild.config.{section}: a mapping was expected")
        data[section] = {key: given[key] for key in keys if key in given}
    data["env"]["id"] = PLACEHOLDER_ENV
    try:
        cfg = load_config(data=data)
    except ConfigError as exc:
        raise PolicyDataError(f"its config is refused: {exc}") from None
    if hasattr(cfg.model, "device"):
        cfg.model.device = "cpu"
    return cfg


def _algorithm(meta: dict):
    """The algorithm the record names, built for the recorded spaces (no env made)."""
    from aiorl.envs import EnvSpec  # gymnasium

    record = meta.get(REBUILD_KEY)
    if not isinstance(record, dict):
        raise PolicyDataError(f"it has no {REBUILD_KEY!r} record (written by an aiorl before policies were data)")
    cfg = _config(record)
    env = EnvSpec(
        id=str(meta.get("env_id", PLACEHOLDER_ENV)),
        observation_space=space_from_data(record.get("observation_space"), "rebuild.observation_space"),
        action_space=space_from_data(record.get("action_space"), "rebuild.action_space"),
        max_episode_steps=None,
    )
    obs = env.observation_space
    if meta.get("observation_shape") != list(obs.shape) or meta.get("observation_dtype") != np.dtype(obs.dtype).str:
        raise PolicyDataError("observation_shape and observation_dtype disagree with rebuild.observation_space")
    try:
        return cfg.algorithm(cfg, env)
    except ConfigError as exc:
        raise PolicyDataError(f"its network is refused: {exc}") from None
    except (ValueError, TypeError, RuntimeError, OverflowError) as exc:
        raise PolicyDataError(f"its network cannot be built ({type(exc).__name__}: {exc})") from None


def rebuild_policy(meta: dict, weights: str | Path, max_bytes: int = MAX_POLICY_BYTES):
    """The acting module `meta` (a policy.json) describes, its weights read from `weights`, every
    size checked before anything is allocated; PolicyDataError says what is refused."""
    import torch

    algo = _algorithm(meta)
    try:
        checked = open_tensor_file(weights, max_bytes)
    except TensorFileError as exc:
        raise PolicyDataError(str(exc)) from None
    except OSError as exc:
        raise PolicyDataError(f"{weights}: cannot be read ({exc.strerror or exc})") from None
    with torch.device("meta"):
        shapes = algo.acting_module()
    if shapes is None:
        raise PolicyDataError(f"{algo.name} exports no acting policy")
    check_against(shapes, checked, max_bytes)
    recurrent = meta.get("recurrent")
    recorded = recurrent.get("state_size") if isinstance(recurrent, dict) else (0 if recurrent is None else None)
    size = getattr(shapes, "state_size", 0)
    if recorded != size:
        raise PolicyDataError(f"recurrent: state size {recorded!r} recorded, the network's is {size}")
    module = algo.acting_module()
    try:
        state = {name: tensor_of(checked, name) for name in checked.entries}
    except TensorFileError as exc:
        raise PolicyDataError(str(exc)) from None
    module.load_state_dict(state, strict=True)
    return module.eval().requires_grad_(False)


def load_policy_data(path: str | Path):
    """The module rebuilt from the weights at `path` and the policy.json beside it; PolicyFileError,
    one line naming the file, when it is missing or refused."""
    path = Path(path)
    if not path.is_file():
        raise PolicyFileError(f"no exported policy at {path}; learner 0 exports it when a run shuts down")
    try:
        return rebuild_policy(read_policy_meta(path.with_name(POLICY_META)), path)
    except PolicyDataError as exc:
        reason = str(exc).removeprefix(f"{path}: ")
        raise PolicyFileError(f"{path} is refused, nothing of it was loaded: {reason}") from None
