# cython: language_level=3
cimport numpy as cnp

cdef enum:
    # Highest row rank a field may have (a batch adds one leading dimension).
    _MAX_ROW_NDIM = 8


cdef class _Fields:
    cdef readonly tuple names
    cdef readonly tuple shapes
    cdef readonly tuple dtypes
    cdef int count
    cdef Py_ssize_t *rowbytes
    cdef int *typenum
    cdef int *ndim
    cdef cnp.npy_intp *dims          # per field: [batch, *row_shape], stride _MAX_ROW_NDIM + 1
    cdef char **src                  # per-call scratch: source pointers of the batch being added

    cdef object empty(self, int f, Py_ssize_t n)
    cdef list coerce(self, object batch, str what, Py_ssize_t *rows)
