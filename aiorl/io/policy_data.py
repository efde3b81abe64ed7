"""A policy as data: its weights in a tensor file and the record aiorl rebuilds its network from.

`aiorl eval`, `aiorl.load_policy` and evaluation open a policy this way, never by running a
program from a file: ``policy.safetensors`` holds the acting module's ``state_dict`` and nothing
else (`aiorl.io.tensor_file`), and ``policy.json``'s ``rebuild`` record says what aiorl's own code
builds that module from: the algorithm's name, the config sections its checks read (the model
section above all) as plain data, and the observation and action spaces. This module writes and
checks those pieces; the rebuild, which needs the config loader and the algorithms, is
`aiorl.evaluation.rebuild`.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from aiorl.core import unique_json
from aiorl.core.unique_json import DuplicateKey

WEIGHTS_FILE = "policy.safetensors"
REBUILD_KEY = "rebuild"
MAX_POLICY_BYTES = 1 << 31  # the weights and buffers of one acting policy (an Atari CNN: ~7 MB)
MAX_META_BYTES = 1 << 24  # policy.json: a few kilobytes, tens of kilobytes with per-dimension bounds
MAX_SPACE_ELEMENTS = 1 << 22  # an observation's entries (an Atari frame stack: 28,224)
MAX_RANK = 3  # what the networks take (vectors, 2-D and 3-D images)
BOX_DTYPES = ("<f4", "<f8", "<f2", "|u1", "|i1", "<i2", "<i4", "<i8", "<u2", "<u4", "<u8")
#: The config sections the rebuild validates: what the algorithms' checks read beside the model.
CONFIG_KEYS = {"env": ("num_envs",), "cluster": ("actors", "memories", "learners"), "offline": ("dataset",)}
PLACEHOLDER_ENV = "aiorl-policy-file"  # the rebuild makes no env: the config's env.id is a name only


class PolicyDataError(ValueError):
    """A policy record or weights file that aiorl refuses to rebuild a network from."""


# --------------------------------------------------------------------------
# The record


def space_data(space) -> dict:
    """A Box or Discrete space as JSON data (bounds a scalar when uniform)."""
    import gymnasium as gym

    if isinstance(space, gym.spaces.Discrete):
        return {"type": "discrete", "n": int(space.n), "start": int(space.start)}
    if not isinstance(space, gym.spaces.Box):
        raise TypeError(f"no policy record for a {type(space).__name__} space")

    def bound(values: np.ndarray):
        flat = values.reshape(-1)
        uniform = flat.size > 0 and bool(np.all(flat == flat[0]))
        return flat[0].item() if uniform else flat.tolist()

    return {
        "type": "box",
        "shape": [int(d) for d in space.shape],
        "dtype": np.dtype(space.dtype).str,
        "low": bound(space.low),
        "high": bound(space.high),
    }


def rebuild_record(cfg, env_spec) -> dict:
    """What `rebuild_policy` needs to build the acting module of the algorithm of `cfg` for `env_spec`."""
    data = cfg.to_dict()
    config = {"algo": cfg.algo, "model": data["model"], "agent": data["agent"]}
    for section, keys in CONFIG_KEYS.items():
        config[section] = {key: data[section][key] for key in keys}
    return {
        "config": config,
        "observation_space": space_data(env_spec.observation_space),
        "action_space": space_data(env_spec.action_space),
    }


# --------------------------------------------------------------------------
# Reading it back


def read_policy_meta(path: str | Path) -> dict:
    """The policy.json at `path`, size-capped, duplicate keys refused; PolicyDataError naming it."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_META_BYTES + 1)
    except OSError as exc:
        raise PolicyDataError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    if len(raw) > MAX_META_BYTES:
        raise PolicyDataError(f"{path}: over {MAX_META_BYTES} bytes, not a policy description")
    try:
        meta = unique_json.loads(raw.decode("utf-8"))
    except DuplicateKey as exc:
        raise PolicyDataError(f"{path}: the key {exc.key!r} appears twice") from None
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise PolicyDataError(f"{path}: not a readable policy description ({exc})") from None
    if not isinstance(meta, dict):
        raise PolicyDataError(f"{path}: a JSON object was expected")
    return meta


def _box_bound(value, size: int, what: str) -> np.ndarray | float:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, list) and len(value) == size and all(isinstance(v, (int, float)) for v in value):
        return np.asarray(value, dtype=np.float64)
    raise PolicyDataError(f"{what}: a number or a list of {size} numbers was expected")


def space_from_data(data: object, what: str):
    """The Box or Discrete space `data` records (`space_data`), every size checked first."""
    import gymnasium as gym

    if not isinstance(data, dict) or data.get("type") not in ("box", "discrete"):
        raise PolicyDataError(f"{what}: a box or discrete space was expected, got {str(data)[:80]}")
    if data["type"] == "discrete":
        n, start = data.get("n"), data.get("start", 0)
        if not (type(n) is int and 1 <= n <= MAX_SPACE_ELEMENTS and type(start) is int):
            raise PolicyDataError(f"{what}: n must be an integer in 1..{MAX_SPACE_ELEMENTS}, got {n!r}")
        return gym.spaces.Discrete(n, start=start)
    shape, dtype = data.get("shape"), data.get("dtype")
    if not (isinstance(shape, list) and len(shape) <= MAX_RANK and all(type(d) is int and d >= 1 for d in shape)):
        raise PolicyDataError(f"{what}: shape must be at most {MAX_RANK} positive integers, got {shape!r}")
    size = math.prod(shape)
    if size > MAX_SPACE_ELEMENTS:
        raise PolicyDataError(f"{what}: shape {shape} has {size} entries, over the {MAX_SPACE_ELEMENTS} allowed")
    if dtype not in BOX_DTYPES:
        raise PolicyDataError(f"{what}: dtype {dtype!r} is not one of {', '.join(BOX_DTYPES)}")
    low = _box_bound(data.get("low"), size, f"{what}.low")
    high = _box_bound(data.get("high"), size, f"{what}.high")
    # Bounds in the space's own float dtype (gymnasium warns of a float64 array cast to float32).
    cast = np.dtype(dtype) if np.dtype(dtype).kind == "f" else np.float64
    low, high = (np.reshape(b, shape).astype(cast) if isinstance(b, np.ndarray) else b for b in (low, high))
    try:
        return gym.spaces.Box(low=low, high=high, shape=tuple(shape), dtype=np.dtype(dtype))
    except (ValueError, TypeError, OverflowError) as exc:
        raise PolicyDataError(f"{what}: not a valid Box ({exc})") from None


def _torch_dtype_name(tensor) -> str:
    import torch

    names = {
        torch.float64: "F64",
        torch.float32: "F32",
        torch.float16: "F16",
        torch.bfloat16: "BF16",
        torch.int64: "I64",
        torch.int32: "I32",
        torch.int16: "I16",
        torch.int8: "I8",
        torch.uint8: "U8",
        torch.bool: "BOOL",
    }
    if tensor.dtype not in names:
        raise PolicyDataError(f"a tensor of dtype {tensor.dtype} has no place in a tensor file")
    return names[tensor.dtype]


def check_against(shapes, checked, max_bytes: int) -> None:
    """The meta-device module `shapes` against the checked tensor file: same names, shapes, dtypes;
    everything it holds (state or not) under `max_bytes`."""
    held = sum(t.numel() * t.element_size() for t in (*shapes.parameters(), *shapes.buffers()))
    if held > max_bytes:
        raise PolicyDataError(f"its network holds {held} bytes of weights, over the {max_bytes} allowed")
    state = shapes.state_dict()
    missing = sorted(set(state) - set(checked.entries))
    extra = sorted(set(checked.entries) - set(state))
    if missing or extra:
        raise PolicyDataError(
            f"its weights do not fit the network: missing {missing[:3] or 'none'}, unexpected {extra[:3] or 'none'}"
        )
    for name, tensor in state.items():
        entry = checked.entries[name]
        want = (tuple(tensor.shape), _torch_dtype_name(tensor))
        if (entry.shape, entry.dtype) != want:
            raise PolicyDataError(
                f"its weights do not fit the network: {name} is {list(entry.shape)} {entry.dtype} in the file, "
                f"the network has {list(want[0])} {want[1]}"
            )


def tensor_of(checked, name: str):
    """The tensor `name` of the checked tensor file, as torch (BF16 included)."""
    import torch

    array = checked.array(name)
    if checked.entries[name].dtype == "BF16":
        return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(array)


# --------------------------------------------------------------------------
# Writing


def weights_of(module) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """`module`'s state dict as numpy arrays, and the dtype names numpy cannot say (BF16)."""
    import torch

    arrays, dtypes = {}, {}
    for name, tensor in module.state_dict().items():
        tensor = tensor.detach().cpu().contiguous()
        if tensor.dtype == torch.bfloat16:
            arrays[name], dtypes[name] = tensor.view(torch.int16).numpy().view(np.uint16), "BF16"
        else:
            arrays[name] = tensor.numpy()
    return arrays, dtypes
