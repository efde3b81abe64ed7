"""The exported policy: a `torch.export` program (``policy.pt2``) and its JSON description.

Learner 0 writes ``RUN_DIR/policy/policy.pt2`` at shutdown (every algorithm
through `save_policy`). It maps an observation batch ``obs[B, *shape]`` (in
the env's own dtype, e.g. uint8 frames) to an action batch, and loads with
plain torch, without aiorl or the network's Python classes::

    policy = torch.export.load("policy.pt2").module()
    actions = policy(torch.as_tensor(obs[None]))

``policy.json`` beside it records the algorithm, env, observation shape and
dtype, the action space and the batch signature.

A recurrent policy (``model.recurrent``; ``policy.json`` has ``recurrent: {type, hidden,
state_size}``) takes and returns its state, float32 ``[B, state_size]``, zeros at each
episode's start::

    state = torch.zeros(1, meta["recurrent"]["state_size"])
    action, state = policy(torch.as_tensor(obs[None]), state)

`load_policy_file` gives such a program a ``state_size`` attribute; `aiorl eval`, evaluation
during training and ``--video`` carry the state per episode.

Runs written before aiorl moved to `torch.export` (TorchScript is deprecated
in torch 2.13) hold ``policy.pt`` instead; `aiorl eval` still loads those
(`load_policy_file`), with one line saying so.
"""

from __future__ import annotations

import copy
import json
import logging
import os
import warnings
import zipfile
from pathlib import Path

import numpy as np

from aiorl.io.policy_archive import check_policy_archive

log = logging.getLogger("aiorl.export")

POLICY_FILE = "policy.pt2"
LEGACY_POLICY_FILE = "policy.pt"  # TorchScript, written by aiorl before torch.export
POLICY_META = "policy.json"
POLICY_FORMAT = "torch.export"


class PolicyFileError(RuntimeError):
    """A policy file that is missing, unreadable or not a policy."""


def example_observations(meta: dict):
    """A batch of two zero observations of the shape and dtype `meta` records.

    Two, not one: torch.export specialises a dimension of size 1 to a constant,
    and the batch dimension must stay dynamic.
    """
    import torch

    dtype = np.dtype(meta["observation_dtype"])
    return torch.from_numpy(np.zeros((2, *meta["observation_shape"]), dtype))


def example_inputs(meta: dict) -> tuple[tuple, tuple]:
    """(example inputs, dynamic shapes) torch.export traces a policy of `meta` with: observations,
    and for a recurrent policy its state, every batch dimension dynamic."""
    import torch

    batch = torch.export.Dim("batch", min=1)
    obs = example_observations(meta)
    recurrent = meta.get("recurrent")
    if not recurrent:
        return (obs,), ({0: batch},)
    return (obs, torch.zeros(len(obs), int(recurrent["state_size"]))), ({0: batch}, {0: batch})


def save_policy(module, directory: str | Path, meta: dict) -> str:
    """Export `module` (obs batch -> action batch, on the CPU) to DIRECTORY/policy.pt2 with policy.json.

    `meta` must hold ``observation_shape`` and ``observation_dtype`` (the example
    input the export traces with); it is written to policy.json as given.

    The one export every algorithm calls; the write is atomic (a reader never
    sees half a file), and a stale TorchScript ``policy.pt`` there is removed so
    that a directory never holds two different policies.
    """
    import torch

    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    # A frozen copy: the loaded program's outputs need no .detach(), and the caller's module
    # (maybe the learner's live network) keeps its mode and gradients.
    module = copy.deepcopy(module).eval().requires_grad_(False)
    inputs, dynamic = example_inputs(meta)
    with torch.no_grad():
        program = torch.export.export(module, inputs, dynamic_shapes=dynamic)
    path = root / POLICY_FILE
    tmp = root / f".policy-{os.getpid()}.tmp.pt2"  # torch.export.save wants the .pt2 suffix
    torch.export.save(program, str(tmp))
    os.replace(tmp, path)
    (root / LEGACY_POLICY_FILE).unlink(missing_ok=True)
    meta = {**meta, "format": POLICY_FORMAT, "file": POLICY_FILE}
    # The program first, then the record describing it, each whole (evaluation during training
    # rewrites policy/best/ while `aiorl eval` may read it).
    tmp_meta = root / f".{POLICY_META}.{os.getpid()}.tmp"
    tmp_meta.write_text(json.dumps(meta, indent=1) + "\n")
    os.replace(tmp_meta, root / POLICY_META)
    return str(path)


def policy_file(directory: str | Path) -> Path:
    """The policy in DIRECTORY: policy.pt2, or an older run's policy.pt; policy.pt2 when neither exists."""
    root = Path(directory)
    if not (root / POLICY_FILE).exists() and (root / LEGACY_POLICY_FILE).exists():
        return root / LEGACY_POLICY_FILE
    return root / POLICY_FILE


def read_meta(policy_path: str | Path) -> dict | None:
    """The policy.json beside a policy file, or None when there is none (or it is not JSON)."""
    path = Path(policy_path).with_name(POLICY_META)
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def load_policy_file(path: str | Path):
    """A callable obs batch -> action batch from a ``.pt2`` (torch.export) or an older ``.pt`` (TorchScript).

    Raises PolicyFileError naming the file when it is missing or not a policy.
    Only local files written by learner 0 (or named by the user) come here,
    never bytes from a socket.
    """
    import torch

    path = Path(path)
    if not path.is_file():
        raise PolicyFileError(f"no exported policy at {path}; learner 0 exports it when a run shuts down")
    if path.suffix == ".pt2":
        try:
            check_policy_archive(path)
        except ValueError as exc:
            if not zipfile.is_zipfile(path):
                raise PolicyFileError(f"{path} is not a torch.export policy ({exc})") from None
            raise PolicyFileError(f"{path} is refused, nothing of it was run: {exc}") from None
        try:
            program = torch.export.load(str(path)).module()
        except Exception as exc:  # a torn, foreign or garbage file: torch raises many types
            raise PolicyFileError(
                f"{path} is not a torch.export policy ({type(exc).__name__}: "
                f"{str(exc).splitlines()[0] if str(exc) else 'unreadable'})"
            ) from None
        recurrent = (read_meta(path) or {}).get("recurrent")
        if isinstance(recurrent, dict) and isinstance(recurrent.get("state_size"), int):
            program.state_size = recurrent["state_size"]  # (obs, state) -> (action, state)
        return program
    log.info("%s is a TorchScript policy from an older aiorl run; loading it with torch.jit.load", path)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # TorchScript is deprecated in torch 2.13
            return torch.jit.load(str(path), map_location="cpu").eval()
    except Exception as exc:
        raise PolicyFileError(
            f"{path} is not a TorchScript policy ({type(exc).__name__}: "
            f"{str(exc).splitlines()[0] if str(exc) else 'unreadable'})"
        ) from None
