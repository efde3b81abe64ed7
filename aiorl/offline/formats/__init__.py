"""Datasets in and out: `load_dataset` reads aiorl's own format, EasyRL's line format, Minari
datasets and Ape-X replay snapshots (the format detected from the path, or named), checks what
it read (`checks.check_dataset`) and, given an env's spaces, that they are the dataset's;
`write_dataset` writes aiorl's format (or Minari's). A bad dataset is one `DatasetError` line
naming the file, the field and the row. The formats: docs/guides/datasets.md.
"""

from __future__ import annotations

from pathlib import Path

from aiorl.offline.dataset import Dataset, DatasetError
from aiorl.offline.formats.checks import check_dataset, check_spaces_match
from aiorl.offline.formats.easyrl import looks_like_easyrl, read_easyrl, write_easyrl
from aiorl.offline.formats.minari_data import data_dir_of, read_minari, write_minari
from aiorl.offline.formats.native import is_native, read_native, write_native
from aiorl.offline.formats.snapshot import is_snapshot, read_snapshot

FORMATS = ("aiorl", "easyrl", "minari", "snapshot")

__all__ = ["FORMATS", "Dataset", "DatasetError", "detect_format", "load_dataset", "write_dataset"]


def detect_format(source: str) -> str:
    """The format of the dataset at `source` (a path, or a Minari id); DatasetError if none fits."""
    path = Path(source)
    if is_native(path):
        return "aiorl"
    if data_dir_of(str(source)) is not None:
        return "minari"
    if not path.exists():
        raise DatasetError(f"{source}: no such file or directory, nor a Minari dataset id in the Minari root")
    if is_snapshot(path):
        return "snapshot"
    if path.is_file() and looks_like_easyrl(path):
        return "easyrl"
    what = "directory" if path.is_dir() else "file"
    raise DatasetError(
        f"{source}: field 'format': this {what} is not a dataset aiorl reads (aiorl's dataset.json, EasyRL's "
        "tab-separated lines, a Minari dataset, a replay-memory-*.npz snapshot)"
    )


def _read(source: str, fmt: str, observation_space, action_space) -> Dataset:
    path = Path(source)
    if fmt == "aiorl":
        if not is_native(path):
            raise DatasetError(f"{source}: field 'format': no dataset.json here (offline.format names 'aiorl')")
        return read_native(path)
    if fmt == "easyrl":
        if not path.is_file():
            raise DatasetError(f"{source}: field 'format': not a file of EasyRL lines (offline.format names 'easyrl')")
        return read_easyrl(path, observation_space, action_space)
    if fmt == "minari":
        return read_minari(str(source))
    if not path.exists():
        raise DatasetError(f"{source}: no such file or directory")
    return read_snapshot(path, observation_space, action_space)


def load_dataset(source, fmt: str | None = None, *, observation_space=None, action_space=None) -> Dataset:
    """The dataset at `source` (a path, or a Minari id), in format `fmt` (None: detected), checked
    (`checks.check_dataset`) and, where spaces are given, against them. DatasetError: one line."""
    source = str(source)
    if fmt is not None and fmt not in FORMATS:
        raise DatasetError(f"{source}: field 'format': {fmt!r} is not one of {', '.join(FORMATS)}")
    fmt = fmt or detect_format(source)
    try:
        dataset = _read(source, fmt, observation_space, action_space)
    except PermissionError as exc:
        raise DatasetError(f"{source}: cannot be read ({exc.strerror})") from None
    except IsADirectoryError as exc:
        raise DatasetError(f"{exc.filename}: a directory, a file was expected") from None
    check_spaces_match(dataset, observation_space, action_space)
    return check_dataset(dataset)


def write_dataset(dataset: Dataset, directory, fmt: str = "aiorl", collected: dict | None = None) -> Path:
    """Write `dataset` to `directory` in aiorl's format (or fmt 'minari'; 'easyrl': `directory` is
    the file to write). `collected`: how it was collected, kept in dataset.json."""
    directory = Path(directory)
    if fmt == "aiorl":
        return write_native(dataset, directory, collected)
    if fmt == "minari":
        return write_minari(dataset, directory)
    if fmt == "easyrl":
        return write_easyrl(dataset, directory)
    raise ValueError(f"write_dataset: format {fmt!r} is not one of aiorl, minari, easyrl")
