# cython: language_level=3
from numpy.random cimport bitgen_t

from aiorl._ext._common cimport int64_t

cdef class SumTree:
    # A binary sum/min tree over `2**depth >= capacity` leaves of which only
    # every third level is stored: node p of stored level k has its 8
    # descendants three binary levels down at k+1, [8p, 8p+8), one 64-byte
    # line. The binary levels in between are recomputed from those 8 values
    # exactly as a binary tree would store them ((s0+s1)+(s2+s3))+(...), so
    # sums are bitwise those of a plain binary tree. Level 0 is one 8-slot
    # group holding the top 2**(depth % 3) nodes; the leaves are level
    # `_levels`. Unused slots hold 0 (sum) and +inf (min).
    cdef double *_sum
    cdef double *_min
    cdef void *_sum_block
    cdef void *_min_block
    cdef Py_ssize_t _off[17]    # start of each stored level (2**40 leaves need 14 levels); _off[_levels + 1] = size
    cdef int _levels
    cdef readonly Py_ssize_t capacity
    cdef double _total_value
    cdef double _min_value

    cdef void _write(self, int64_t *slots, const double *values, Py_ssize_t n) noexcept nogil
    cdef void _sample(self, bitgen_t *rng, double *scratch, Py_ssize_t n, int64_t *out) noexcept nogil
    cdef void _rebuild(self) noexcept nogil
    cdef void _reset(self) noexcept nogil
    cdef inline double _leaf(self, Py_ssize_t slot) noexcept nogil:
        return self._sum[self._off[self._levels] + slot]


# Boundary helpers shared by the buffer module (cimported there).
cdef bitgen_t *bitgen_of(object rng) except NULL
cdef object as_generator(object seed)
cdef object as_index_array(object x, str what)
cdef object as_float64_array(object x, str what, Py_ssize_t n)
