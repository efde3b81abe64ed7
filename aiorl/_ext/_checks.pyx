# cython: language_level=3
"""Coercion and checks at the Python boundary, shared by the kernels' wrappers.

Each helper returns a C-contiguous array in the dtype a kernel reads,
copying only when needed, or raises ValueError naming the argument, what
was expected and what came.
"""
from cpython.pycapsule cimport PyCapsule_GetPointer, PyCapsule_IsValid

import numpy as np

cimport numpy as cnp
from libc.math cimport isfinite
from numpy.random cimport bitgen_t

cnp.import_array()


cdef inline bint _ready(object x, int typenum, Py_ssize_t n):
    """x is already a 1-D contiguous native array of this type (and length n unless n < 0):
    the common case on the hot path, taken without any numpy call."""
    if not cnp.PyArray_Check(x):
        return False
    cdef cnp.ndarray arr = <cnp.ndarray> x
    return (cnp.PyArray_NDIM(arr) == 1 and cnp.PyArray_TYPE(arr) == typenum
            and cnp.PyArray_IS_C_CONTIGUOUS(arr) and cnp.PyArray_ISNOTSWAPPED(arr)
            and (n < 0 or cnp.PyArray_DIMS(arr)[0] == n))


cdef bitgen_t *bitgen_of(object rng) except NULL:
    """The C bit generator behind a numpy Generator (caller holds `rng` and its lock)."""
    capsule = rng.bit_generator.capsule
    if not PyCapsule_IsValid(capsule, "BitGenerator"):
        raise ValueError(f"{rng!r} does not expose a numpy BitGenerator capsule")
    return <bitgen_t *> PyCapsule_GetPointer(capsule, "BitGenerator")


cdef object empty_1d(Py_ssize_t n, int typenum):
    """A new 1-D array (the C call, without np.empty's argument parsing)."""
    cdef cnp.npy_intp dims[1]
    dims[0] = n
    return cnp.PyArray_EMPTY(1, dims, typenum, 0)


cdef int check_fraction(str what, double value) except -1:
    """value must be in [0, 1] (a discount or a GAE lambda)."""
    if not (isfinite(value) and 0.0 <= value <= 1.0):
        raise ValueError(f"{what} must be in [0, 1], got {value!r}")
    return 0


cdef object as_generator(object seed):
    if isinstance(seed, np.random.Generator):
        return seed
    return np.random.default_rng(seed)


cdef object _as_vector(object x, str what, Py_ssize_t n, int typenum, str kinds, str expected):
    """1-D contiguous array of `typenum` (length n unless n < 0; 0-d becomes length 1)."""
    if _ready(x, typenum, n):
        return x
    arr = np.asarray(x)
    if arr.ndim == 0:
        arr = arr.reshape(1)
    # An empty list arrives as float64: fine wherever integers are expected.
    kind_ok = arr.dtype.kind in kinds or (arr.size == 0 and arr.dtype.kind == "f")
    if arr.ndim != 1 or (n >= 0 and arr.shape[0] != n) or not kind_ok or (
            typenum == cnp.NPY_UINT64 and arr.dtype.kind == "i" and arr.size and arr.min() < 0):
        raise ValueError(f"{what}: expected shape ({'n' if n < 0 else n},) {expected}, "
                         f"got {arr.shape} {arr.dtype}")
    return np.ascontiguousarray(arr, dtype=cnp.PyArray_DescrFromType(typenum))


cdef object as_index_array(object x, str what):
    """1-D int64 array of indices (any integer dtype)."""
    return _as_vector(x, what, -1, cnp.NPY_INT64, "iu", "integers")


cdef object as_float64_array(object x, str what, Py_ssize_t n):
    """1-D float64 array of length n (any real dtype)."""
    return _as_vector(x, what, n, cnp.NPY_FLOAT64, "fiub", "real numbers")


cdef object as_uint64_array(object x, str what, Py_ssize_t n):
    """1-D uint64 array of length n (non-negative integers of any integer dtype)."""
    return _as_vector(x, what, n, cnp.NPY_UINT64, "iu", "non-negative integers")


cdef inline bint _ready_2d(object x, int typenum, Py_ssize_t rows, Py_ssize_t cols):
    if not cnp.PyArray_Check(x):
        return False
    cdef cnp.ndarray arr = <cnp.ndarray> x
    return (cnp.PyArray_NDIM(arr) == 2 and cnp.PyArray_TYPE(arr) == typenum
            and cnp.PyArray_IS_C_CONTIGUOUS(arr) and cnp.PyArray_ISNOTSWAPPED(arr)
            and cnp.PyArray_DIMS(arr)[0] == rows and cnp.PyArray_DIMS(arr)[1] == cols)


cdef object as_contiguous(object x):
    """x as a C-contiguous native-order ndarray (x itself when it already is one)."""
    if (cnp.PyArray_Check(x) and cnp.PyArray_IS_C_CONTIGUOUS(<cnp.ndarray> x)
            and cnp.PyArray_ISNOTSWAPPED(<cnp.ndarray> x)):
        return x
    arr = np.asarray(x)
    return np.ascontiguousarray(arr, dtype=arr.dtype.newbyteorder("="))


cdef object as_flags(object x, str what, tuple shape):
    """Contiguous bool array of a 2-D `shape` (bool, or integers meaning != 0); kernels read it as uint8."""
    if _ready_2d(x, cnp.NPY_BOOL, shape[0], shape[1]):
        return x
    arr = np.asarray(x)
    if arr.shape != shape or arr.dtype.kind not in "biu":
        raise ValueError(f"{what}: expected shape {shape} bool, got {arr.shape} {arr.dtype}")
    if arr.dtype != np.bool_:
        arr = arr != 0
    return np.ascontiguousarray(arr)


cdef object as_real_array(object x, str what, tuple shape, int typenum):
    """Real-valued array of `shape` converted to `typenum` (NPY_FLOAT32 or NPY_FLOAT64)."""
    if len(shape) == 2 and _ready_2d(x, typenum, shape[0], shape[1]):
        return x
    arr = np.asarray(x)
    if arr.shape != shape or arr.dtype.kind not in "fiub":
        raise ValueError(f"{what}: expected shape {shape} float, got {arr.shape} {arr.dtype}")
    return np.ascontiguousarray(arr, dtype=cnp.PyArray_DescrFromType(typenum))
