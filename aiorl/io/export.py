"""The exported policy: its weights as data (``policy.safetensors``), the same policy as a
`torch.export` program (``policy.pt2``) and their JSON description (``policy.json``).

Learner 0 writes them to ``RUN_DIR/policy/`` at shutdown (every algorithm through
`save_policy`). What aiorl opens is the data: `load_policy_file` rebuilds the network with
aiorl's own code from ``policy.json``'s ``rebuild`` record and reads its weights as plain
tensors (`aiorl.io.policy_data`); nothing from the file is run. The program is for deployment
in the user's own trusted runtime (loading it runs code from the file; aiorl loads one only when
told, ``--trust-program``). It maps an observation batch ``obs[B, *shape]`` (in the env's own
dtype, e.g. uint8 frames) to an action batch, and loads with plain torch, without aiorl or the
network's Python classes::

    policy = torch.export.load("policy.pt2").module()
    actions = policy(torch.as_tensor(obs[None]))

``policy.json`` beside it records the algorithm, env, observation shape and
dtype, the action space and the batch signature.

A recurrent policy (``model.recurrent``; ``policy.json`` has ``recurrent: {type, hidden,
state_size}``) takes and returns its state, float32 ``[B, state_size]``, zeros at each
episode's start::

    state = torch.zeros(1, meta["recurrent"]["state_size"])
    action, state = policy(torch.as_tensor(obs[None]), state)

The rebuilt module has a ``state_size`` attribute, and `load_policy_file` gives a trusted
program one; `aiorl eval`, evaluation during training and ``--video`` carry the state per episode.

Runs written before aiorl moved to `torch.export` (TorchScript is deprecated in torch 2.13) hold
``policy.pt`` instead, and runs written before policies were data hold only ``policy.pt2``:
`load_policy_file` loads those programs only with ``trust_program``.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import logging
import os
import warnings
import zipfile
from pathlib import Path

import numpy as np

from aiorl.io.policy_archive import check_policy_archive
from aiorl.io.policy_data import WEIGHTS_FILE, weights_of
from aiorl.io.tensor_file import write_tensors

log = logging.getLogger("aiorl.export")

POLICY_FILE = "policy.pt2"
LEGACY_POLICY_FILE = "policy.pt"  # TorchScript, written by aiorl before torch.export
POLICY_META = "policy.json"
POLICY_FORMAT = "torch.export"
WEIGHTS_SUFFIX = ".safetensors"


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
    """Export `module` (obs batch -> action batch, on the CPU) to DIRECTORY: its weights as data
    (policy.safetensors, what aiorl opens), the torch.export program (policy.pt2, for deployment)
    and policy.json. Returns the program's path.

    `meta` must hold ``observation_shape`` and ``observation_dtype`` (the example input the
    export traces with) and, for aiorl to open the policy, the algorithm's ``rebuild`` record
    (`aiorl.io.policy_data`); it is written to policy.json as given.

    The one export every algorithm calls. The three files are written to temporary names first
    and then renamed into place, weights, program, record: a reader never sees half a file, and a
    failed write (a full disk) leaves no temporary file and raises `PolicyWriteError`, one line
    naming the file and what could not be written. A stale TorchScript ``policy.pt`` there is
    removed so that a directory never holds two different policies.
    """
    import torch

    root = Path(directory)
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise _write_error(root, "directory", exc) from None
    # A frozen copy: the loaded program's outputs need no .detach(), and the caller's module
    # (maybe the learner's live network) keeps its mode and gradients.
    module = copy.deepcopy(module).eval().requires_grad_(False)
    inputs, dynamic = example_inputs(meta)
    with torch.no_grad():
        program = torch.export.export(module, inputs, dynamic_shapes=dynamic)
    arrays, dtypes = weights_of(module)
    meta = {**meta, "format": POLICY_FORMAT, "file": POLICY_FILE, "weights": WEIGHTS_FILE}
    text = (json.dumps(meta, indent=1) + "\n").encode()
    pid = os.getpid()
    # torch.export.save wants the .pt2 suffix
    temps = {
        WEIGHTS_FILE: root / f".policy-{pid}.tmp.safetensors",
        POLICY_FILE: root / f".policy-{pid}.tmp.pt2",
        POLICY_META: root / f".{POLICY_META}.{pid}.tmp",
    }
    try:
        _write(temps[WEIGHTS_FILE], root / WEIGHTS_FILE, "weights", lambda f: write_tensors(f, arrays, dtypes=dtypes))
        _write(temps[POLICY_FILE], root / POLICY_FILE, "program", lambda f: f.write(_saved_program(program)))
        _write(temps[POLICY_META], root / POLICY_META, "description", lambda f: f.write(text))
        # The weights and program first, then the record describing them (evaluation during
        # training rewrites policy/best/ while `aiorl eval` may read it).
        for name, tmp in temps.items():
            try:
                os.replace(tmp, root / name)
            except OSError as exc:
                raise _write_error(root / name, "file", exc) from None
    finally:
        for tmp in temps.values():
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
    (root / LEGACY_POLICY_FILE).unlink(missing_ok=True)
    return str(root / POLICY_FILE)


class PolicyWriteError(OSError):
    """A policy file that could not be written (a full disk, a read-only directory): one line naming it."""


def _write_error(path: Path, what: str, exc: BaseException) -> PolicyWriteError:
    if isinstance(exc, OSError) and exc.strerror:
        reason = exc.strerror
    else:
        lines = str(exc).strip().splitlines()
        reason = lines[0] if lines else type(exc).__name__
    error = PolicyWriteError(f"could not write the policy's {what} to {path}: {reason}")
    error.errno = getattr(exc, "errno", None)
    return error


def _saved_program(program) -> memoryview:
    """The torch.export archive of `program`, made in memory: torch's writer on a full disk said
    "unexpected pos N vs M" where a plain write says "No space left on device", and the writer it
    left half-written aborted the process that collected it (a C++ exception in its destructor)."""
    import torch

    saved = io.BytesIO()
    torch.export.save(program, saved)
    return saved.getbuffer()


def _write(tmp: Path, final: Path, what: str, write) -> None:
    """`write(f)` into `tmp`, flushed to the disk; PolicyWriteError naming `final` if it fails (torch's
    writer reports a full disk as a RuntimeError)."""
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
    except (OSError, RuntimeError) as exc:
        raise _write_error(final, what, exc) from None


def policy_file(directory: str | Path) -> Path:
    """The policy in DIRECTORY: its weights (policy.safetensors), or, in a run written before
    policies were data, its program (policy.pt2, or an older run's policy.pt); policy.safetensors
    when there is none."""
    root = Path(directory)
    for name in (WEIGHTS_FILE, POLICY_FILE, LEGACY_POLICY_FILE):
        if (root / name).exists():
            return root / name
    return root / WEIGHTS_FILE


def read_meta(policy_path: str | Path) -> dict | None:
    """The policy.json beside a policy file, or None when there is none (or it is not JSON)."""
    path = Path(policy_path).with_name(POLICY_META)
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def load_policy_file(path: str | Path, trust_program: bool = False):
    """A callable obs batch -> action batch from a program: a ``.pt2`` (torch.export, checked by
    `check_policy_archive` first) or an older run's TorchScript ``.pt``.

    Loading a program runs code from the file: only with `trust_program` (``aiorl eval
    --trust-program``); without it the program is refused. aiorl opens a policy's data instead
    (`aiorl.evaluation.policies.load_policy`, which rebuilds the network from policy.safetensors
    and policy.json). Raises PolicyFileError naming the file when it is missing, refused or not a
    policy.
    """
    path = Path(path)
    if not path.is_file():
        raise PolicyFileError(f"no exported policy at {path}; learner 0 exports it when a run shuts down")
    if path.suffix == WEIGHTS_SUFFIX:
        raise PolicyFileError(f"{path} is a policy's data, not a program: aiorl.load_policy opens it")
    if not trust_program:
        kind = "a torch.export program" if path.suffix == ".pt2" else "a TorchScript program"
        raise PolicyFileError(
            f"{path} is {kind}, not data, and loading it would run code from the file: re-export "
            "the policy with this aiorl (`aiorl eval --checkpoint N` evaluates a checkpoint of the "
            "run), or pass --trust-program (trust_program=True) if you trust the file"
        )
    return _load_program(path)


def _load_program(path: Path):
    """A program the user trusts: a .pt2 (checked by `check_policy_archive` first) or a TorchScript .pt."""
    import torch

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
