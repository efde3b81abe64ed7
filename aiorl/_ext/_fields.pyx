# cython: language_level=3
"""A replay buffer's fields (`_Fields`: names, row shapes and dtypes, checked once, with the C
view the copy loops use) and the snapshot format every buffer writes: dicts of plain
arrays with a JSON meta entry, saved as .npz without pickle."""

import json
import os
from collections.abc import Mapping

import numpy as np

cimport numpy as cnp
from libc.stdlib cimport free, malloc

cnp.import_array()

# Keys that `sample` adds to a batch; a field may not use them.
RESERVED_NAMES = ("indices", "weights", "generations")
SNAPSHOT_FORMAT = "aiorl.replay"
SNAPSHOT_VERSION = 1


cdef class _Fields:
    """A validated spec: field names, row shapes and dtypes, and the C view of them
    (declared in _fields.pxd).

    spec: {name: (row_shape, dtype)}; dtypes must be bool or numeric (the wire
    carries only those) and are kept in native byte order.
    """

    def __cinit__(self, spec, str owner):
        if not isinstance(spec, Mapping) or len(spec) == 0:
            raise ValueError(f"{owner}: spec must be a non-empty dict name -> (shape, dtype), got {spec!r}")
        names, shapes, dtypes = [], [], []
        for name, entry in spec.items():
            if not isinstance(name, str) or not name:
                raise ValueError(f"{owner}: spec field names must be non-empty strings, got {name!r}")
            if name in RESERVED_NAMES:
                raise ValueError(f"{owner}: spec field {name!r} clashes with a key sample() adds "
                                 f"({', '.join(RESERVED_NAMES)})")
            try:
                shape, dtype = entry
                shape = tuple(shape)
                if not all(isinstance(d, (int, np.integer)) and d >= 1 for d in shape):
                    raise TypeError
                shape = tuple(int(d) for d in shape)
                dtype = np.dtype(dtype)
            except (TypeError, ValueError):
                raise ValueError(f"{owner}: spec[{name!r}] must be (shape tuple of positive ints, dtype), "
                                 f"got {entry!r}") from None
            if dtype.kind not in "biufc":
                raise ValueError(f"{owner}: spec[{name!r}] dtype must be bool or numeric, got {dtype}")
            if len(shape) > _MAX_ROW_NDIM:
                raise ValueError(f"{owner}: spec[{name!r}] shape {shape} has more than {_MAX_ROW_NDIM} dimensions")
            names.append(name)
            shapes.append(shape)
            dtypes.append(dtype.newbyteorder("="))
        self.names, self.shapes, self.dtypes = tuple(names), tuple(shapes), tuple(dtypes)
        self.count = len(names)
        self.rowbytes = <Py_ssize_t *> malloc(self.count * sizeof(Py_ssize_t))
        self.typenum = <int *> malloc(self.count * sizeof(int))
        self.ndim = <int *> malloc(self.count * sizeof(int))
        self.dims = <cnp.npy_intp *> malloc(self.count * (_MAX_ROW_NDIM + 1) * sizeof(cnp.npy_intp))
        self.src = <char **> malloc(self.count * sizeof(char *))
        if not (self.rowbytes and self.typenum and self.ndim and self.dims and self.src):
            raise MemoryError(owner)
        cdef int f, k
        for f in range(self.count):
            self.rowbytes[f] = dtypes[f].itemsize * int(np.prod(shapes[f], dtype=np.int64))
            self.typenum[f] = dtypes[f].num
            self.ndim[f] = len(shapes[f])
            for k in range(self.ndim[f]):
                self.dims[f * (_MAX_ROW_NDIM + 1) + 1 + k] = shapes[f][k]

    def __dealloc__(self):
        free(self.rowbytes)
        free(self.typenum)
        free(self.ndim)
        free(self.dims)
        free(self.src)

    def as_spec(self):
        return {name: (shape, dtype) for name, shape, dtype in zip(self.names, self.shapes, self.dtypes)}

    def describe(self, int f):
        """'(n, 4) float32' for error messages."""
        return f"{('n',) + self.shapes[f]} {self.dtypes[f]}".replace("'", "")

    cdef object empty(self, int f, Py_ssize_t n):
        """A new uninitialised (n, *shape) array of field f."""
        cdef cnp.npy_intp *dims = self.dims + f * (_MAX_ROW_NDIM + 1)
        dims[0] = n
        return cnp.PyArray_EMPTY(self.ndim[f] + 1, dims, self.typenum[f], 0)

    cdef list coerce(self, object batch, str what, Py_ssize_t *rows):
        """The batch's arrays in field order, each C-contiguous in the field's dtype.

        Copies only when needed; a dtype that casts 'same_kind' (float64 ->
        float32, int64 -> int32) is converted, anything else is an error that
        names the field, the expected shape/dtype and what came. Sets rows[0]
        and self.src.
        """
        if not isinstance(batch, Mapping):
            raise ValueError(f"{what}: expected a dict of arrays, got {type(batch).__name__}")
        missing = [name for name in self.names if name not in batch]
        if missing or len(batch) != self.count:
            extra = [name for name in batch if name not in self.names]
            raise ValueError(f"{what}: missing fields {missing}, unexpected fields {extra} "
                             f"(expected {list(self.names)})")
        cdef list arrays = []
        cdef cnp.ndarray arr
        cdef cnp.npy_intp *dims
        cdef Py_ssize_t n = -1
        cdef int f, k
        cdef bint ok
        for f in range(self.count):
            name = self.names[f]
            x = batch[name]
            arr = x if cnp.PyArray_Check(x) else np.asarray(x)
            dims = cnp.PyArray_DIMS(arr)
            ok = cnp.PyArray_NDIM(arr) == self.ndim[f] + 1
            k = 0
            while ok and k < self.ndim[f]:
                ok = dims[k + 1] == self.dims[f * (_MAX_ROW_NDIM + 1) + 1 + k]
                k += 1
            if not ok:
                raise ValueError(f"{what}: field {name!r}: expected shape {self.describe(f)}, "
                                 f"got shape {(<object> arr).shape} {arr.dtype}")
            if n < 0:
                n = dims[0]
            elif dims[0] != n:
                raise ValueError(f"{what}: field {name!r} has {dims[0]} rows but field "
                                 f"{self.names[0]!r} has {n}")
            if cnp.PyArray_TYPE(arr) != self.typenum[f] or not cnp.PyArray_ISNOTSWAPPED(arr):
                if arr.dtype != self.dtypes[f] and not np.can_cast(arr.dtype, self.dtypes[f], "same_kind"):
                    raise ValueError(f"{what}: field {name!r}: expected {self.describe(f)} (or a dtype "
                                     f"that casts to it same_kind), got {(<object> arr).shape} {arr.dtype}")
                arr = np.ascontiguousarray(arr, dtype=self.dtypes[f])
            elif not cnp.PyArray_IS_C_CONTIGUOUS(arr):
                arr = np.ascontiguousarray(arr)
            arrays.append(arr)
            self.src[f] = <char *> cnp.PyArray_DATA(arr)
        rows[0] = n
        return arrays


def _meta_array(meta):
    return np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8).copy()


def _read_meta(state, str what):
    if not isinstance(state, Mapping) or "meta" not in state:
        raise ValueError(f"{what}: expected a state dict with a 'meta' entry")
    meta = json.loads(np.asarray(state["meta"], dtype=np.uint8).tobytes().decode())
    if meta.get("format") != SNAPSHOT_FORMAT or meta.get("version") != SNAPSHOT_VERSION:
        raise ValueError(f"{what}: not an {SNAPSHOT_FORMAT} v{SNAPSHOT_VERSION} snapshot "
                         f"(format={meta.get('format')!r}, version={meta.get('version')!r})")
    return meta


def _spec_json(_Fields fields):
    return [[name, list(shape), dtype.str] for name, shape, dtype in
            zip(fields.names, fields.shapes, fields.dtypes)]


def _check_same(str what, str key, expected, got):
    if expected != got:
        raise ValueError(f"{what}: snapshot {key} is {got!r}, this buffer has {expected!r}")


def _state_array(state, str key, shape, dtype, str what):
    if key not in state:
        raise ValueError(f"{what}: snapshot has no {key!r} array")
    arr = np.asarray(state[key])
    if arr.shape != tuple(shape) or arr.dtype != dtype:
        raise ValueError(f"{what}: snapshot {key!r}: expected {tuple(shape)} {np.dtype(dtype)}, "
                         f"got {arr.shape} {arr.dtype}")
    return arr


def _save_npz(state, path):
    """Write the state's arrays to `path` (npz, no pickled objects), atomically."""
    path = os.fspath(path)
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            np.savez(f, **state)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _load_npz(path):
    with np.load(os.fspath(path), allow_pickle=False) as npz:
        return {key: npz[key] for key in npz.files}
