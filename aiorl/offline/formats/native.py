"""aiorl's own dataset format: a directory holding ``dataset.json`` (what the arrays are) and
``data.safetensors`` (the arrays, `aiorl.io.tensor_file`: every size checked against the file
before anything is allocated). The format is documented in docs/guides/datasets.md.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np

from aiorl.io.policy_data import PolicyDataError, space_data, space_from_data
from aiorl.io.tensor_file import TensorFileError, dtype_name, open_tensor_file, write_tensors
from aiorl.offline.dataset import Dataset, DatasetError
from aiorl.offline.formats.checks import ROW_FIELDS, finish

FORMAT = "aiorl.dataset"
VERSION = 1
META_FILE = "dataset.json"
DATA_FILE = "data.safetensors"
MAX_META_BYTES = 1 << 20
MAX_DATA_BYTES = 1 << 40  # the tensor reader's cap; the file's own size is what bounds a read


def is_native(path: Path) -> bool:
    return path.is_dir() and (path / META_FILE).is_file()


def _meta(path: Path) -> dict:
    meta_path = path / META_FILE
    if meta_path.stat().st_size > MAX_META_BYTES:
        raise DatasetError(f"{meta_path}: over {MAX_META_BYTES} bytes, not a dataset description")
    try:
        meta = json.loads(meta_path.read_text())
    except (UnicodeDecodeError, ValueError) as exc:
        raise DatasetError(f"{meta_path}: not JSON ({exc})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise DatasetError(f"{meta_path}: field 'format': not an aiorl dataset (format {FORMAT!r} expected)")
    if meta.get("version") != VERSION:
        raise DatasetError(f"{meta_path}: field 'version': {meta.get('version')!r}, this aiorl reads {VERSION}")
    return meta


def _spaces(meta: dict, meta_path: Path):
    try:
        return (
            space_from_data(meta.get("observation_space"), "observation_space"),
            space_from_data(meta.get("action_space"), "action_space"),
        )
    except PolicyDataError as exc:
        raise DatasetError(f"{meta_path}: field {str(exc).split(':')[0]!r}: {exc}") from None


def _arrays(meta: dict, data_path: Path) -> dict[str, np.ndarray]:
    try:
        checked = open_tensor_file(data_path, MAX_DATA_BYTES)
    except FileNotFoundError:
        raise DatasetError(f"{data_path}: missing (the arrays of the dataset)") from None
    except TensorFileError as exc:
        raise DatasetError(cut_short(data_path) or f"{data_path}: not a tensor file ({exc})") from None
    fields = meta.get("fields") or {}
    for name in ROW_FIELDS:
        if name not in checked.entries:
            raise DatasetError(f"{data_path}: field {name!r} is missing")
    for name, entry in checked.entries.items():
        want = fields.get(name)
        if isinstance(want, dict) and list(entry.shape) != want.get("shape"):
            raise DatasetError(
                f"{data_path}: field {name!r}: shape {list(entry.shape)}, {META_FILE} says {want.get('shape')}"
            )
    try:
        return {name: checked.array(name) for name in checked.entries}
    except TensorFileError as exc:
        raise DatasetError(f"{data_path}: {exc}") from None


def cut_short(data_path: Path) -> str | None:
    """Where a tensor file whose header reads ends before its data does: the first field cut and
    the row it is cut at; None if the header does not read (`open_tensor_file` says why)."""
    try:
        size = data_path.stat().st_size
        with open(data_path, "rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            if length > MAX_META_BYTES or 8 + length > size:
                return None
            header = json.loads(f.read(length))
        spans = sorted(
            (v["data_offsets"][0], v["data_offsets"][1], k, v["shape"])
            for k, v in header.items()
            if k != "__metadata__"
        )
    except (OSError, ValueError, KeyError, TypeError, IndexError, struct.error):
        return None
    have = size - 8 - length
    for begin, end, name, shape in spans:
        if end > have and shape:
            row_bytes = (end - begin) // max(shape[0], 1)
            row = max(have - begin, 0) // max(row_bytes, 1)
            return f"{data_path}: field {name!r} row {row}: the file ends there ({size} bytes; cut short, truncated)"
    return None


def read_native(path: Path) -> Dataset:
    meta = _meta(path)
    observation_space, action_space = _spaces(meta, path / META_FILE)
    arrays = _arrays(meta, path / DATA_FILE)
    rows = meta.get("rows")
    if rows is not None and len(arrays["reward"]) != rows:
        raise DatasetError(
            f"{path / DATA_FILE}: field 'reward' has {len(arrays['reward'])} rows, {META_FILE} says {rows}"
        )
    return finish(
        Dataset(
            **{name: arrays[name] for name in ROW_FIELDS},
            observation_space=observation_space,
            action_space=action_space,
            propensity=arrays.get("propensity"),
            env_id=meta.get("env_id"),
            source=str(path),
            format="aiorl",
        )
    )


def write_native(dataset: Dataset, directory: Path, collected: dict | None = None) -> Path:
    """Write `dataset` as aiorl's format into `directory` (made if missing); its path."""
    directory.mkdir(parents=True, exist_ok=True)
    arrays = {name: np.ascontiguousarray(getattr(dataset, name)) for name in ROW_FIELDS}
    if dataset.propensity is not None:
        arrays["propensity"] = np.asarray(dataset.propensity, np.float64)
    meta = {
        "format": FORMAT,
        "version": VERSION,
        "env_id": dataset.env_id,
        "observation_space": space_data(dataset.observation_space),
        "action_space": space_data(dataset.action_space),
        "rows": len(dataset),
        "episodes": int(len(dataset.episode_ends)),
        "fields": {name: {"shape": list(a.shape), "dtype": dtype_name(a)} for name, a in arrays.items()},
        "collected": collected or {"from": dataset.source, "format": dataset.format},
    }
    tmp = directory / (DATA_FILE + ".tmp")
    with open(tmp, "wb") as f:
        write_tensors(f, arrays)
    tmp.replace(directory / DATA_FILE)
    (directory / META_FILE).write_text(json.dumps(meta, indent=1) + "\n")
    return directory
