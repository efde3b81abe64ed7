# cython: language_level=3
cimport cython
from numpy.random cimport bitgen_t

from aiorl._ext._common cimport int64_t

@cython.final
cdef class SumTree:
    # An 8-ary tree stored level by level: node p of level k-1 is the sum
    # (and min) of its children [8p, 8p+8) at level k, one 64-byte line.
    # Level 0 is a single 8-slot group (total = its sum), the leaves are
    # level `_levels` of `_sum`; `_min` has the internal levels only (the
    # leaves are read from `_sum`). Levels are padded to multiples of 8 with
    # 0 (sum) and +inf (min).
    cdef double *_sum
    cdef double *_min
    cdef Py_ssize_t _off[16]    # start of each level (2**40 leaves need 14); _off[_levels + 1] = size
    cdef int _levels
    cdef readonly Py_ssize_t capacity
    cdef double _total_value
    # The min tree is brought up to date lazily (see SumTree._write): the
    # exact minimum and the leaf holding it are tracked on every write, and
    # the leaf groups written since the last refresh wait in _dirty.
    cdef double _min_value      # exact unless _min_stale
    cdef int64_t _min_slot      # a leaf holding _min_value (-1: none positive)
    cdef bint _min_stale        # the minimum leaf was raised: refresh before reading
    cdef int64_t *_dirty        # leaf groups written since the min tree was refreshed
    cdef Py_ssize_t _ndirty
    cdef Py_ssize_t _dirty_cap
    cdef bint _dirty_all        # _dirty overflowed: the refresh goes over every leaf

    cdef void _write(self, int64_t *slots, const double *values, Py_ssize_t n) noexcept nogil
    cdef void _sample(self, bitgen_t *rng, double *scratch, Py_ssize_t n, int64_t *out,
                      char **rows=*, const Py_ssize_t *rowbytes=*, int nrows=*) noexcept nogil
    cdef void _refresh_mins(self) noexcept nogil
    cdef double _current_min(self) noexcept nogil
    cdef void _reset(self) noexcept nogil
    cdef double _group_min(self, int k, Py_ssize_t p) noexcept nogil
    cdef inline double _leaf(self, Py_ssize_t slot) noexcept nogil:
        return self._sum[self._off[self._levels] + slot]

