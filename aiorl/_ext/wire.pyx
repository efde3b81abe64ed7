# cython: language_level=3
"""Ordered stores and loads on a shared-memory ring's control words (`aiorl.wire.ring`).

A side that is about to wait for its peer raises a flag, then looks at the peer's counter
once more; the peer moves its counter, then looks at the flag. Each needs its store seen
before its load, or both may miss the other and wait for ever (Dekker's problem). x86-64
keeps stores in order and loads in order but may take a load before an earlier store is
visible: plain Python stores and loads cannot order this pair, so `store_then_load` stores
with a sequentially consistent atomic (a locked instruction, a full fence) and then loads.
"""

cdef extern from *:
    """
    static inline unsigned long long aiorl_store_then_load(
        unsigned long long *words, Py_ssize_t store_at, unsigned long long value, Py_ssize_t load_at) {
        __atomic_store_n(words + store_at, value, __ATOMIC_SEQ_CST);
        return __atomic_load_n(words + load_at, __ATOMIC_SEQ_CST);
    }
    """
    unsigned long long aiorl_store_then_load(
        unsigned long long *words, Py_ssize_t store_at, unsigned long long value, Py_ssize_t load_at
    ) nogil


cdef class Control:
    """The control page's 8-byte words, held from a native ``Q`` memoryview until `release`."""

    cdef unsigned long long[::1] words
    cdef Py_ssize_t n

    def __init__(self, words) -> None:
        self.words = words
        self.n = self.words.shape[0]

    def store_then_load(self, Py_ssize_t store_at, unsigned long long value, Py_ssize_t load_at) -> int:
        """Store `value` at word `store_at`, fence, then return word `load_at`."""
        if self.n == 0:
            raise ValueError("the control page was released")
        if not (0 <= store_at < self.n and 0 <= load_at < self.n):
            raise IndexError(f"control words {store_at}, {load_at} outside 0..{self.n - 1}")
        return aiorl_store_then_load(&self.words[0], store_at, value, load_at)

    def release(self) -> None:
        """Drop the view (the mapping can be closed after this)."""
        self.words = None
        self.n = 0


# ---------------------------------------------------------------------- received arrays

cimport numpy as cnp
from cpython.buffer cimport PyBUF_WRITABLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.object cimport PyObject, PyTypeObject
from cpython.ref cimport Py_INCREF

cnp.import_array()

cdef extern from "numpy/arrayobject.h":
    object PyArray_NewFromDescr(
        PyTypeObject *subtype, cnp.PyArray_Descr *descr, int nd, cnp.npy_intp *dims, cnp.npy_intp *strides,
        void *data, int flags, PyObject *obj
    )


def array_views(tuple fields, object payload):
    """``{name: array}`` over `payload`, a writable buffer, for a layout the decoder checked.

    `fields` is a layout's ``((name, dtype, shape, offset), ...)``; each array is a view of
    `payload` (its ``base``, as ``np.ndarray(shape, dtype, payload, offset)`` makes it),
    without copying. What ``np.ndarray`` would refuse is refused here too: an array that does
    not fit in `payload` raises ValueError (the decoder's checks make that unreachable).
    """
    cdef Py_buffer view
    cdef char *data
    cdef Py_ssize_t size, offset, nbytes
    cdef cnp.npy_intp dims[32]
    cdef int nd, i
    cdef bint empty
    cdef cnp.dtype dtype
    cdef tuple shape
    cdef object array
    cdef dict out = {}
    PyObject_GetBuffer(payload, &view, PyBUF_WRITABLE)
    data = <char *> view.buf
    size = view.len
    PyBuffer_Release(&view)  # (as np.ndarray: the payload object itself is the base)
    for name, dtype, shape, offset in fields:
        nd = len(shape)
        if nd > 32:
            raise ValueError(f"array {name!r}: {nd} dimensions")
        empty = False
        for i in range(nd):
            dims[i] = shape[i]
            if dims[i] < 0:
                raise ValueError(f"array {name!r}: shape {shape}")
            empty = empty or dims[i] == 0
        nbytes = 0 if empty else dtype.itemsize
        for i in range(nd if not empty else 0):
            if nbytes > size // dims[i]:
                raise ValueError(f"array {name!r} does not fit in a payload of {size} bytes")
            nbytes *= dims[i]
        if offset < 0 or offset > size - nbytes:
            raise ValueError(f"array {name!r} does not fit in a payload of {size} bytes")
        Py_INCREF(dtype)  # (stolen by PyArray_NewFromDescr)
        array = PyArray_NewFromDescr(
            <PyTypeObject *> cnp.ndarray, <cnp.PyArray_Descr *> dtype, nd, dims, NULL, data + offset,
            cnp.NPY_ARRAY_WRITEABLE, NULL
        )
        Py_INCREF(payload)  # (stolen by PyArray_SetBaseObject)
        cnp.PyArray_SetBaseObject(<cnp.ndarray> array, payload)
        out[name] = array
    return out


# ---------------------------------------------------------------------- small frames out

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from libc.string cimport memcpy


def join_small_frame(dict arrays, tuple fields, bytes head, bytes schema, bytes meta, tuple pads):
    """One frame's bytes: `head`, `schema`, `meta`, then each array after its pad; or None.

    For the encoder's repeated layout whose arrays are all copied into the frame: None unless
    `arrays` matches `fields` (``((name, dtype, shape), ...)``, the kind's last layout) name
    by name, by dtype identity and shape, and every array is a C-contiguous numpy array; the
    caller then takes its general path, which checks, coerces or refuses.
    """
    cdef Py_ssize_t n = len(fields), total, i = 0, d
    cdef cnp.ndarray a
    cdef tuple field, shape
    cdef char *out
    cdef list held = []  # the arrays measured are the arrays copied, whatever runs meanwhile
    if len(arrays) != n or len(pads) != n:
        return None
    total = len(head) + len(schema) + len(meta)
    for name, value in arrays.items():
        field = <tuple> fields[i]
        if not cnp.PyArray_Check(value) or name != field[0]:
            return None
        a = <cnp.ndarray> value
        shape = <tuple> field[2]
        if <object> cnp.PyArray_DESCR(a) is not field[1] or cnp.PyArray_NDIM(a) != len(shape):
            return None
        for d in range(len(shape)):
            if cnp.PyArray_DIMS(a)[d] != <cnp.npy_intp> shape[d]:
                return None
        if not cnp.PyArray_IS_C_CONTIGUOUS(a):
            return None
        total += len(<bytes> pads[i]) + cnp.PyArray_NBYTES(a)
        held.append(a)
        i += 1
    frame = PyBytes_FromStringAndSize(NULL, total)
    out = PyBytes_AS_STRING(frame)
    for part in (head, schema, meta):
        memcpy(out, PyBytes_AS_STRING(part), len(<bytes> part))
        out += len(<bytes> part)
    i = 0
    for a in held:
        memcpy(out, PyBytes_AS_STRING(pads[i]), len(<bytes> pads[i]))
        out += len(<bytes> pads[i])
        memcpy(out, cnp.PyArray_DATA(a), cnp.PyArray_NBYTES(a))
        out += cnp.PyArray_NBYTES(a)
        i += 1
    return frame
