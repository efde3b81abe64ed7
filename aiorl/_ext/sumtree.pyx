# cython: language_level=3
"""Sum-tree with a min-tree over float64 leaves: the index behind prioritized replay.

The tree is the binary sum-tree over 2**depth >= capacity leaves (padding
leaves hold 0 in the sum and +inf in the min, so any capacity >= 1 works,
powers of two and 1 included), but only every third binary level is stored:
each stored node's 8 descendants three levels down sit in one 64-byte line,
and the two binary levels between are recomputed from them on the fly. A
descent touches depth/3 lines instead of depth, which is what decides speed
once the tree outgrows the caches (2**20 leaves: 7 lines instead of 20).

Every sum is computed in binary-tree order, ((s0+s1)+(s2+s3))+((s4+s5)+(s6+s7)),
so totals and sampled indices are bitwise those of the plain binary tree in
`aiorl.replay.reference.SumTree`. Every write recomputes each touched parent
from its children (never `parent += delta`), so the tree is a pure function of
its leaves: no drift however many updates it has seen.
"""
from cpython.pycapsule cimport PyCapsule_GetPointer, PyCapsule_IsValid
from libc.math cimport INFINITY, fmin, isfinite
from libc.stdint cimport uintptr_t
from libc.stdlib cimport free, malloc

import numpy as np

cimport numpy as cnp
from numpy.random cimport bitgen_t

from aiorl._ext._common cimport int64_t, prefetch

cnp.import_array()

# Largest supported capacity: keeps 2 * leaves * sizeof(double) far from overflow.
cdef Py_ssize_t _MAX_CAPACITY = (<Py_ssize_t> 1) << 40


cdef bitgen_t *bitgen_of(object rng) except NULL:
    """The C bit generator behind a numpy Generator (caller holds `rng` and its lock)."""
    capsule = rng.bit_generator.capsule
    if not PyCapsule_IsValid(capsule, "BitGenerator"):
        raise ValueError(f"{rng!r} does not expose a numpy BitGenerator capsule")
    return <bitgen_t *> PyCapsule_GetPointer(capsule, "BitGenerator")


cdef object as_generator(object seed):
    if isinstance(seed, np.random.Generator):
        return seed
    return np.random.default_rng(seed)


cdef object as_index_array(object x, str what):
    """1-D contiguous int64 copy-if-needed of an integer array_like (0-d becomes length 1)."""
    arr = np.asarray(x)
    if arr.ndim == 0:
        arr = arr.reshape(1)
    if arr.ndim != 1:
        raise ValueError(f"{what}: expected a 1-D integer array, got shape {arr.shape}")
    if arr.dtype.kind not in "iu" and not (arr.size == 0 and arr.dtype.kind == "f"):
        raise ValueError(f"{what}: expected an integer dtype, got {arr.dtype}")
    return np.ascontiguousarray(arr, dtype=np.int64)


cdef object as_float64_array(object x, str what, Py_ssize_t n):
    """1-D contiguous float64 array of length n from a real array_like (0-d becomes length 1)."""
    arr = np.asarray(x)
    if arr.ndim == 0:
        arr = arr.reshape(1)
    if arr.dtype.kind not in "fiub":
        raise ValueError(f"{what}: expected real numbers, got dtype {arr.dtype}")
    if arr.shape != (n,):
        raise ValueError(f"{what}: expected shape ({n},), got {arr.shape}")
    return np.ascontiguousarray(arr, dtype=np.float64)


cdef inline double _pairwise8(const double *g) noexcept nogil:
    """Sum of 8 values in binary-tree order (the order the reference tree uses)."""
    return ((g[0] + g[1]) + (g[2] + g[3])) + ((g[4] + g[5]) + (g[6] + g[7]))


cdef inline double _min8(const double *g) noexcept nogil:
    return fmin(fmin(fmin(g[0], g[1]), fmin(g[2], g[3])), fmin(fmin(g[4], g[5]), fmin(g[6], g[7])))


cdef inline int _descend8(const double *g, double *v) noexcept nogil:
    """Three binary steps inside one 8-child group: index of the child holding mass v[0].

    Go right when v >= left and the right side has mass (a zero-mass side is
    never entered, so rounding at a boundary cannot land on an empty leaf);
    v is reduced by the mass skipped. Branch-free: each step is a coin flip.
    """
    cdef double pairs[4]
    pairs[0] = g[0] + g[1]
    pairs[1] = g[2] + g[3]
    pairs[2] = g[4] + g[5]
    pairs[3] = g[6] + g[7]
    cdef double left = pairs[0] + pairs[1]
    cdef double right = pairs[2] + pairs[3]
    cdef double x = v[0]
    cdef int b = (x >= left) & (right > 0.0)
    x -= left * b
    cdef int i = 2 * b
    left = pairs[i]
    right = pairs[i + 1]
    b = (x >= left) & (right > 0.0)
    x -= left * b
    i = 2 * (i + b)
    left = g[i]
    right = g[i + 1]
    b = (x >= left) & (right > 0.0)
    x -= left * b
    v[0] = x
    return i + b


cdef double *_aligned_block(Py_ssize_t n, void **block) noexcept nogil:
    """n doubles starting on a 64-byte boundary (so each 8-child group is one cache line)."""
    block[0] = malloc(n * sizeof(double) + 64)
    if block[0] == NULL:
        return NULL
    return <double *> ((<uintptr_t> block[0] + 63) & ~(<uintptr_t> 63))


cdef class SumTree:
    """Sums and minimum of `capacity` non-negative float64 leaves, with stratified sampling.

    Leaves start unset: 0 in the sum, ignored by `min` (which is +inf until a
    leaf is written). `update` is batched (duplicate indices: the last value
    wins); `sample(batch_size, rng)` draws one leaf from each of `batch_size`
    equal slices of the total mass, so leaf i is drawn with probability
    value_i / total and zero-valued leaves never are. Not thread-safe: one
    owner calls it (the GIL is released inside each call).
    """

    def __cinit__(self, Py_ssize_t capacity):
        if capacity < 1 or capacity > _MAX_CAPACITY:
            raise ValueError(f"SumTree: capacity must be in [1, 2**40], got {capacity}")
        self.capacity = capacity
        cdef int depth = 0
        while (<Py_ssize_t> 1 << depth) < capacity:
            depth += 1
        # Level 0 is one 8-slot group holding the top 2**(depth % 3) nodes;
        # each further level has 8x the nodes of the one above.
        self._levels = depth // 3
        cdef Py_ssize_t size = 1 << (depth % 3)
        cdef int k
        self._off[0] = 0
        self._off[1] = 8
        for k in range(1, self._levels + 1):
            size *= 8
            self._off[k + 1] = self._off[k] + size
        self._sum = _aligned_block(self._off[self._levels + 1], &self._sum_block)
        self._min = _aligned_block(self._off[self._levels + 1], &self._min_block)
        if self._sum == NULL or self._min == NULL:
            raise MemoryError(f"SumTree: cannot allocate a tree for capacity {capacity}")
        self._reset()

    def __dealloc__(self):
        free(self._sum_block)
        free(self._min_block)

    def __repr__(self):
        return f"SumTree(capacity={self.capacity}, total={self.total!r}, min={self.min!r})"

    @property
    def total(self):
        """Sum of all leaves (float64)."""
        return self._total_value

    @property
    def min(self):
        """Smallest leaf ever written and still present; +inf when none was written."""
        return self._min_value

    def update(self, indices, values):
        """Set leaf `indices[j]` to `values[j]` (finite, >= 0); duplicates: the last one wins."""
        slots = np.array(as_index_array(indices, "SumTree.update indices"), copy=True)
        cdef Py_ssize_t n = slots.shape[0]
        vals = as_float64_array(values, "SumTree.update values", n)
        if n == 0:
            return
        cdef int64_t[::1] s = slots
        cdef const double[::1] v = vals
        cdef Py_ssize_t j, bad = -1
        cdef int what = 0
        with nogil:
            for j in range(n):
                if s[j] < 0 or s[j] >= self.capacity:
                    bad, what = j, 1
                    break
                if not (isfinite(v[j]) and v[j] >= 0.0):
                    bad, what = j, 2
                    break
            if bad < 0:
                self._write(&s[0], &v[0], n)
        if what == 1:
            raise ValueError(
                f"SumTree.update: indices[{bad}] = {s[bad]} is out of range [0, {self.capacity})")
        if what == 2:
            raise ValueError(f"SumTree.update: values[{bad}] = {v[bad]!r}; values must be finite and >= 0")

    def get(self, indices):
        """Leaf values at `indices` (float64; unset leaves read 0)."""
        slots = as_index_array(indices, "SumTree.get indices")
        cdef const int64_t[::1] s = slots
        cdef Py_ssize_t j, n = slots.shape[0]
        out = np.empty(n, dtype=np.float64)
        cdef double[::1] o = out
        for j in range(n):
            if s[j] < 0 or s[j] >= self.capacity:
                raise ValueError(f"SumTree.get: indices[{j}] = {s[j]} is out of range [0, {self.capacity})")
            o[j] = self._leaf(s[j])
        return out

    def sample(self, Py_ssize_t batch_size, rng):
        """Stratified sample of `batch_size` leaf indices (int64, non-decreasing).

        Draw j is leaf i with cumsum[i-1] <= (j + U_j) * (total / batch_size) < cumsum[i],
        U_j ~ U[0, 1) the j-th `random()` of `rng` (a numpy Generator, or a seed for one).
        """
        if batch_size < 1:
            raise ValueError(f"SumTree.sample: batch_size must be >= 1, got {batch_size}")
        if not self._total_value > 0.0:
            raise ValueError(f"SumTree.sample: total is {self._total_value!r}; nothing to sample")
        gen = as_generator(rng)
        cdef bitgen_t *bitgen = bitgen_of(gen)
        out = np.empty(batch_size, dtype=np.int64)
        cdef int64_t[::1] o = out
        cdef double *scratch = <double *> malloc(batch_size * sizeof(double))
        if scratch == NULL:
            raise MemoryError(f"SumTree.sample: cannot allocate {batch_size} doubles")
        try:
            with gen.bit_generator.lock, nogil:
                self._sample(bitgen, scratch, batch_size, &o[0])
        finally:
            free(scratch)
        return out

    def _max_parent_error(self):
        """Test helper: largest |node - f(children)| over stored nodes of both trees (0.0 when exact)."""
        cdef Py_ssize_t k, p
        cdef double err = abs(self._total_value - _pairwise8(self._sum))
        if self._min_value != _min8(self._min):
            return INFINITY
        for k in range(1, self._levels + 1):
            for p in range((self._off[k + 1] - self._off[k]) // 8):
                err = max(err, abs(self._sum[self._off[k - 1] + p] - _pairwise8(self._sum + self._off[k] + 8 * p)))
                if self._min[self._off[k - 1] + p] != _min8(self._min + self._off[k] + 8 * p):
                    return INFINITY
        return err

    # -- kernels (nogil) ---------------------------------------------------------

    cdef void _reset(self) noexcept nogil:
        cdef Py_ssize_t i
        for i in range(self._off[self._levels + 1]):
            self._sum[i] = 0.0
            self._min[i] = INFINITY
        self._total_value = 0.0
        self._min_value = INFINITY

    cdef void _rebuild(self) noexcept nogil:
        """Recompute every stored node from the leaves."""
        cdef Py_ssize_t p
        cdef int k
        for k in range(self._levels, 0, -1):
            for p in range((self._off[k + 1] - self._off[k]) // 8):
                self._sum[self._off[k - 1] + p] = _pairwise8(self._sum + self._off[k] + 8 * p)
                self._min[self._off[k - 1] + p] = _min8(self._min + self._off[k] + 8 * p)
        self._total_value = _pairwise8(self._sum)
        self._min_value = _min8(self._min)

    cdef void _write(self, int64_t *slots, const double *values, Py_ssize_t n) noexcept nogil:
        """Set leaves slots[j] = values[j] in order, then fix the ancestors level by level.

        `slots` must be valid and is overwritten (it becomes the node cursor).
        Leaves are written first, in order, so duplicates resolve to the last
        value; each level is then recomputed from the level below, which is
        already final, so recomputing a shared parent twice is harmless and
        consecutive equal parents (sorted input, the common case) are skipped.
        """
        cdef double *s = self._sum
        cdef double *m = self._min
        cdef Py_ssize_t leaf0 = self._off[self._levels]
        cdef Py_ssize_t j, node, prev, parent0, child0
        cdef Py_ssize_t ahead = 8
        cdef int k
        for j in range(n):
            if j + ahead < n:
                prefetch(s + leaf0 + slots[j + ahead])
                prefetch(m + leaf0 + slots[j + ahead])
            s[leaf0 + slots[j]] = values[j]
            m[leaf0 + slots[j]] = values[j]
        for k in range(self._levels, 0, -1):
            parent0 = self._off[k - 1]
            child0 = self._off[k]
            prev = -1
            for j in range(n):
                node = slots[j] >> 3
                slots[j] = node
                if node == prev:
                    continue
                prev = node
                if k > 1:
                    # The next level writes node's parent: start fetching its line now.
                    prefetch(s + self._off[k - 2] + (node >> 3))
                    prefetch(m + self._off[k - 2] + (node >> 3))
                s[parent0 + node] = _pairwise8(s + child0 + 8 * node)
                m[parent0 + node] = _min8(m + child0 + 8 * node)
        self._total_value = _pairwise8(s)
        self._min_value = _min8(m)

    cdef void _sample(self, bitgen_t *rng, double *scratch, Py_ssize_t n, int64_t *out) noexcept nogil:
        """out[j] = leaf holding mass (j + U_j) * (total / n); the caller checked total > 0.

        All n descents advance one level at a time so that each one's next
        line is prefetched while the others run.
        """
        cdef const double *s = self._sum
        cdef double *u = scratch
        cdef double segment = self._total_value / n
        cdef Py_ssize_t j, node, group0
        cdef int k
        for j in range(n):
            u[j] = (j + rng.next_double(rng.state)) * segment
            out[j] = _descend8(s, &u[j])
            if self._levels > 0:
                prefetch(s + self._off[1] + 8 * out[j])
        for k in range(1, self._levels + 1):
            group0 = self._off[k]
            for j in range(n):
                node = 8 * out[j] + _descend8(s + group0 + 8 * out[j], &u[j])
                out[j] = node
                if k < self._levels:
                    prefetch(s + self._off[k + 1] + 8 * node)
