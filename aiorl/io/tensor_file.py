"""A file of tensors and nothing else, in the ``safetensors`` layout, read and written by aiorl.

The layout (https://huggingface.co/docs/safetensors): 8 bytes, the little-endian length N of a
JSON header; the header, ``{name: {"dtype", "shape", "data_offsets": [begin, end]}}`` and an
optional ``"__metadata__"`` of strings; then the tensors' raw bytes (little-endian, C order),
offsets counted from the end of the header. aiorl writes its own reader rather than depend on
the ``safetensors`` package: the reader is the whole of what opening a policy trusts, so it is
kept small enough to read in full.

The reader checks the whole header before it allocates any tensor: its length capped and within
the file; JSON of exactly that shape (a duplicate key refused, not silently the last); dtypes from
`DTYPES`; shapes of non-negative integers with at most `MAX_RANK` dimensions; each span exactly
``prod(shape) * itemsize`` bytes; the spans, in offset order, contiguous from the start and ending at the file's end;
their total under the caller's cap. Tensors are then read with `numpy.fromfile` on those spans:
no unpickler, no code, nothing but numbers.
"""

from __future__ import annotations

import json
import math
import os
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from aiorl.core import unique_json
from aiorl.core.unique_json import DuplicateKey

#: safetensors dtype name -> numpy dtype (BF16, which numpy lacks, is read as its 16-bit pattern).
DTYPES = {
    "F64": "<f8",
    "F32": "<f4",
    "F16": "<f2",
    "BF16": "<u2",
    "I64": "<i8",
    "I32": "<i4",
    "I16": "<i2",
    "I8": "|i1",
    "U8": "|u1",
    "BOOL": "|b1",
}
NUMPY_NAMES = {np.dtype(v).str: k for k, v in DTYPES.items() if k != "BF16"}
MAX_HEADER_BYTES = 1 << 24  # a policy's header is a few kilobytes; safetensors caps at 100 MB
MAX_RANK = 8
METADATA_KEY = "__metadata__"
ENTRY_KEYS = {"dtype", "shape", "data_offsets"}


class TensorFileError(ValueError):
    """A tensor file that is not of the layout, or larger than the caller allows."""


@dataclass(frozen=True)
class Entry:
    """One tensor of a checked header: its dtype name, shape and byte span (from the data start)."""

    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int

    @property
    def numpy_dtype(self) -> np.dtype:
        return np.dtype(DTYPES[self.dtype])


@dataclass(frozen=True)
class TensorFile:
    """A checked tensor file: its entries in file order, metadata, and where the data starts."""

    path: Path
    entries: dict[str, Entry]
    metadata: dict[str, str]
    data_start: int

    @property
    def data_bytes(self) -> int:
        return sum(e.end - e.begin for e in self.entries.values())

    def array(self, name: str) -> np.ndarray:
        """The tensor `name` as a numpy array (its span only; BF16 as uint16 bit patterns)."""
        e = self.entries[name]
        count = math.prod(e.shape)
        with open(self.path, "rb") as f:
            f.seek(self.data_start + e.begin)
            data = np.fromfile(f, dtype=e.numpy_dtype, count=count)
        if data.size != count:  # the file shrank since its header was checked
            raise TensorFileError(f"{self.path}: tensor {name!r} is cut short")
        return data.reshape(e.shape)


def _shape(name: str, shape: object) -> tuple[int, ...]:
    if not isinstance(shape, list) or len(shape) > MAX_RANK:
        raise TensorFileError(f"tensor {name!r}: shape must be a list of at most {MAX_RANK} sizes, got {shape!r}")
    if not all(type(d) is int and d >= 0 for d in shape):
        raise TensorFileError(f"tensor {name!r}: shape must hold non-negative integers, got {shape!r}")
    return tuple(shape)


def _entry(name: str, raw: object) -> Entry:
    """`raw` checked as the header entry of `name`: its span exactly its shape's bytes."""
    if not isinstance(raw, dict) or set(raw) != ENTRY_KEYS:
        raise TensorFileError(f"tensor {name!r}: expected exactly the keys dtype, shape, data_offsets")
    dtype = raw["dtype"]
    if dtype not in DTYPES:
        raise TensorFileError(f"tensor {name!r}: dtype {dtype!r} is not one of {', '.join(DTYPES)}")
    shape = _shape(name, raw["shape"])
    span = raw["data_offsets"]
    if not (isinstance(span, list) and len(span) == 2 and all(type(v) is int and v >= 0 for v in span)):
        raise TensorFileError(f"tensor {name!r}: data_offsets must be two non-negative integers, got {span!r}")
    size = math.prod(shape) * np.dtype(DTYPES[dtype]).itemsize
    if span[1] - span[0] != size:
        raise TensorFileError(
            f"tensor {name!r}: data_offsets {span} span {span[1] - span[0]} bytes, its shape "
            f"{list(shape)} of {dtype} is {size}"
        )
    return Entry(dtype, shape, span[0], span[1])


def _entries(header: dict, max_bytes: int) -> dict[str, Entry]:
    """The header's entries, checked each and together: in offset order they must follow one
    another from 0 (no gap, no overlap) and hold at most `max_bytes`."""
    entries = {name: _entry(name, raw) for name, raw in header.items()}
    offset = 0
    for name, entry in sorted(entries.items(), key=lambda item: (item[1].begin, item[1].end)):
        if entry.begin != offset:
            raise TensorFileError(
                f"tensor {name!r} starts at byte {entry.begin}, where {offset} was expected "
                "(the spans must follow one another: no gap, no overlap)"
            )
        offset = entry.end
        if offset > max_bytes:
            raise TensorFileError(f"the tensors hold over {max_bytes} bytes, the most allowed here")
    return entries


def _metadata(raw: object) -> dict[str, str]:
    if not isinstance(raw, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in raw.items()):
        raise TensorFileError(f"{METADATA_KEY} must map strings to strings")
    return raw


def _read_header(f, path: Path, file_size: int) -> tuple[dict, int]:
    head = f.read(8)
    if len(head) < 8:
        raise TensorFileError(f"{path}: {file_size} bytes, shorter than the 8-byte header length")
    (length,) = struct.unpack("<Q", head)
    if length > MAX_HEADER_BYTES or 8 + length > file_size:
        raise TensorFileError(
            f"{path}: header length {length} is over the {MAX_HEADER_BYTES}-byte cap or beyond "
            f"the file's {file_size} bytes"
        )
    try:
        header = unique_json.loads(f.read(length).decode("utf-8"))
    except DuplicateKey as exc:
        raise TensorFileError(f"{path}: the header names {exc.key!r} twice") from None
    except (UnicodeDecodeError, ValueError) as exc:
        raise TensorFileError(f"{path}: the header is not JSON ({exc})") from None
    if not isinstance(header, dict):
        raise TensorFileError(f"{path}: the header must be a JSON object")
    return header, 8 + length


def open_tensor_file(path: str | Path, max_bytes: int) -> TensorFile:
    """The checked header of the tensor file at `path`, whose tensors may hold at most `max_bytes`.

    Raises TensorFileError (a ValueError) naming the file and what is wrong, OSError when it cannot
    be read. Nothing but the header is read."""
    path = Path(path)
    with open(path, "rb") as f:
        file_size = os.fstat(f.fileno()).st_size
        header, data_start = _read_header(f, path, file_size)
    try:
        metadata = _metadata(header.pop(METADATA_KEY, {}))
        entries = _entries(header, max_bytes)
    except TensorFileError as exc:
        raise TensorFileError(f"{path}: {exc}") from None
    end = data_start + max((e.end for e in entries.values()), default=0)
    if end != file_size:
        raise TensorFileError(
            f"{path}: the header accounts for {end} bytes, the file has {file_size} "
            "(cut short, or bytes after the last tensor)"
        )
    return TensorFile(path, entries, metadata, data_start)


def read_tensors(path: str | Path, max_bytes: int) -> dict[str, np.ndarray]:
    """Every tensor of the file at `path`, checked first (`open_tensor_file`)."""
    checked = open_tensor_file(path, max_bytes)
    return {name: checked.array(name) for name in checked.entries}


def dtype_name(array: np.ndarray) -> str:
    """The layout's name of a numpy array's dtype; TypeError for one it has none for."""
    try:
        return NUMPY_NAMES[array.dtype.newbyteorder("<").str if array.dtype.byteorder == ">" else array.dtype.str]
    except KeyError:
        raise TypeError(f"no tensor-file dtype for numpy {array.dtype}") from None


def write_tensors(
    f,
    tensors: Mapping[str, np.ndarray],
    metadata: Mapping[str, str] | None = None,
    dtypes: Mapping[str, str] | None = None,
) -> None:
    """Write `tensors` to the binary file object `f` in the layout, in the mapping's order.

    `dtypes` names a tensor's dtype where numpy cannot (BF16, given as uint16 bit patterns)."""
    header: dict[str, object] = {METADATA_KEY: dict(metadata)} if metadata else {}
    arrays, offset = [], 0
    for name, array in tensors.items():
        array = np.asarray(array)
        if not array.flags.c_contiguous:  # (np.ascontiguousarray would make a 0-d array 1-d)
            array = array.copy(order="C")
        if array.dtype.byteorder == ">":
            array = array.astype(array.dtype.newbyteorder("<"))
        header[name] = {
            "dtype": (dtypes or {}).get(name) or dtype_name(array),
            "shape": list(array.shape),
            "data_offsets": [offset, offset + array.nbytes],
        }
        offset += array.nbytes
        arrays.append(array)
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)  # the data 8-byte aligned, as the safetensors writer does
    f.write(struct.pack("<Q", len(blob)))
    f.write(blob)
    for array in arrays:
        f.write(array.tobytes())
