# cython: language_level=3
"""Sum-tree with a min-tree over float64 leaves: the index behind prioritized replay.

Layout: an 8-ary tree stored level by level, each node's 8 children in one
64-byte line (the min tree has no leaf level of its own: it reads the leaves
from the sum tree), so a descent touches ceil(log8(capacity)) lines (7 for 2**20
leaves, against 20 for a binary heap): that, not arithmetic, decides speed
once the tree outgrows the caches. Levels are padded to multiples of 8 with 0
in the sum and +inf in the min, so any capacity >= 1 works.

Arithmetic (the numpy oracle `aiorl.replay.reference.SumTree` does the same,
so results agree bitwise): a node is the pairwise sum
((s0+s1)+(s2+s3))+((s4+s5)+(s6+s7)) of its children; a descent with remaining
mass x picks the child c with P[c] <= x < P[c+1] over the group's running
sums P (a fixed parallel-prefix order, see the group kernels) and continues with
x - P[c]. Every write recomputes each touched parent from its children
(never `parent += delta`), so the tree is a pure function of its leaves: no
drift however many updates it has seen.
"""
from libc.math cimport INFINITY, isfinite
from libc.stdlib cimport free, malloc

import numpy as np

cimport numpy as cnp
from numpy.random cimport bitgen_t

from aiorl._ext._common cimport int64_t, prefetch
from aiorl._ext._checks cimport as_float64_array, as_generator, as_index_array, bitgen_of

cnp.import_array()

# Largest supported capacity: keeps 2 * leaves * sizeof(double) far from overflow.
cdef Py_ssize_t _MAX_CAPACITY = (<Py_ssize_t> 1) << 40


cdef extern from *:
    """
    /* Group kernels of the 8-ary tree (see the module docstring). Every sum
     * has one fixed order, which the numpy oracle repeats:
     *   group sum  ((g0+g1)+(g2+g3))+((g4+g5)+(g6+g7))
     *   running    P = [0, g0, g01, g01+g2, g0123, g0123+g4, g0123+g45, g0123+(g45+g6)]
     *              with g01 = g0+g1, g0123 = g01+(g2+g3), g45 = g4+g5
     * The SSE2 path (baseline on x86-64) and the portable one perform the
     * same IEEE additions, so their results are identical. AIORL_PREFETCH
     * comes from _common.pxd. */
    #include <math.h>

    static inline void aiorl_scalar_runs(const double *g, double *run) {
        double g01 = g[0] + g[1], g0123 = g01 + (g[2] + g[3]), g45 = g[4] + g[5];
        run[0] = 0.0; run[1] = g[0]; run[2] = g01; run[3] = g01 + g[2];
        run[4] = g0123; run[5] = g0123 + g[4]; run[6] = g0123 + g45; run[7] = g0123 + (g45 + g[6]);
    }

    /* A child with zero mass has an empty interval [P[k], P[k+1]), so it is
     * never picked, except the last child when the target reaches the
     * group's sum through rounding: then step back to the last child with mass. */
    static inline int aiorl_step_back(const double *g, int k) {
        if (k == 7) { while (k > 0 && g[k] == 0.0) k--; }
        return k;
    }

    #if defined(__SSE2__)
    #include <emmintrin.h>
    /* The running sums as vectors; the scalar copy p is filled only when a
     * descent needs it (see aiorl_descend_level). */
    typedef struct { __m128d r01, r23, r45, r67; double p[8]; } aiorl_runs_t;

    static inline void aiorl_runs(const double *g, aiorl_runs_t *r) {
        const __m128d zero = _mm_setzero_pd();
        __m128d a = _mm_load_pd(g), b = _mm_load_pd(g + 2), c = _mm_load_pd(g + 4), d = _mm_load_pd(g + 6);
        __m128d s01 = _mm_add_pd(a, _mm_shuffle_pd(a, a, 1));                      /* [g01, g01] */
        __m128d s0123 = _mm_add_pd(s01, _mm_add_pd(b, _mm_shuffle_pd(b, b, 1)));   /* [g0123, g0123] */
        __m128d s45 = _mm_add_pd(c, _mm_shuffle_pd(c, c, 1));                      /* [g45, g45] */
        r->r01 = _mm_unpacklo_pd(zero, a);                                         /* [0, g0] */
        r->r23 = _mm_add_pd(s01, _mm_unpacklo_pd(zero, b));                        /* [g01, g01+g2] */
        r->r45 = _mm_add_pd(s0123, _mm_unpacklo_pd(zero, c));                      /* [g0123, g0123+g4] */
        r->r67 = _mm_add_pd(s0123, _mm_add_pd(s45, _mm_unpacklo_pd(zero, d)));
    }

    /* Child c = #{1 <= k < 8 : P[k] <= *v} (P is non-decreasing); *v -= P[c]. */
    static inline int aiorl_pick(const aiorl_runs_t *r, const double *g, double *v) {
        __m128d x = _mm_set1_pd(*v);
        __m128d m01 = _mm_cmple_pd(r->r01, x), m23 = _mm_cmple_pd(r->r23, x);
        __m128d m45 = _mm_cmple_pd(r->r45, x), m67 = _mm_cmple_pd(r->r67, x);
        /* Lanes are all ones (-1 as an integer) where P[k] <= x; P[0] = 0 always is. */
        __m128i n = _mm_add_epi64(_mm_add_epi64(_mm_castpd_si128(m01), _mm_castpd_si128(m23)),
                                  _mm_add_epi64(_mm_castpd_si128(m45), _mm_castpd_si128(m67)));
        n = _mm_add_epi64(n, _mm_unpackhi_epi64(n, n));
        int k = -(int)_mm_cvtsi128_si64(n) - 1;
        if (k == 7 && g[7] == 0.0) {
            double run[8];
            aiorl_scalar_runs(g, run);
            k = aiorl_step_back(g, k);
            *v -= run[k];
            return k;
        }
        /* P[k] is the largest P <= x: a masked max, not a reload of a stored
         * vector (that stalls on store forwarding). */
        __m128d p = _mm_max_pd(_mm_max_pd(_mm_and_pd(m01, r->r01), _mm_and_pd(m23, r->r23)),
                               _mm_max_pd(_mm_and_pd(m45, r->r45), _mm_and_pd(m67, r->r67)));
        p = _mm_max_sd(p, _mm_unpackhi_pd(p, p));
        *v -= _mm_cvtsd_f64(p);
        return k;
    }

    static inline double aiorl_sum8(const double *g) {
        __m128d a = _mm_load_pd(g), b = _mm_load_pd(g + 2), c = _mm_load_pd(g + 4), d = _mm_load_pd(g + 6);
        __m128d p = _mm_add_pd(_mm_unpacklo_pd(a, b), _mm_unpackhi_pd(a, b));      /* [g01, g23] */
        __m128d q = _mm_add_pd(_mm_unpacklo_pd(c, d), _mm_unpackhi_pd(c, d));      /* [g45, g67] */
        __m128d s = _mm_add_pd(_mm_unpacklo_pd(p, q), _mm_unpackhi_pd(p, q));      /* [g0123, g4567] */
        return _mm_cvtsd_f64(_mm_add_sd(s, _mm_unpackhi_pd(s, s)));
    }

    static inline double aiorl_hmin(__m128d a, __m128d b, __m128d c, __m128d d) {
        __m128d m = _mm_min_pd(_mm_min_pd(a, b), _mm_min_pd(c, d));
        return _mm_cvtsd_f64(_mm_min_sd(m, _mm_unpackhi_pd(m, m)));
    }

    static inline double aiorl_min8(const double *g) {
        return aiorl_hmin(_mm_load_pd(g), _mm_load_pd(g + 2), _mm_load_pd(g + 4), _mm_load_pd(g + 6));
    }

    /* Smallest positive value (+inf if none): an empty leaf carries no mass. */
    static inline __m128d aiorl_pos(__m128d v) {
        const __m128d inf = _mm_set1_pd(INFINITY);
        __m128d keep = _mm_cmpgt_pd(v, _mm_setzero_pd());
        return _mm_or_pd(_mm_and_pd(keep, v), _mm_andnot_pd(keep, inf));
    }

    static inline double aiorl_minpos8(const double *g) {
        return aiorl_hmin(aiorl_pos(_mm_load_pd(g)), aiorl_pos(_mm_load_pd(g + 2)),
                          aiorl_pos(_mm_load_pd(g + 4)), aiorl_pos(_mm_load_pd(g + 6)));
    }
    #else
    typedef struct { double p[8]; } aiorl_runs_t;

    static inline void aiorl_runs(const double *g, aiorl_runs_t *r) {
        aiorl_scalar_runs(g, r->p);
    }

    static inline int aiorl_pick(const aiorl_runs_t *r, const double *g, double *v) {
        double x = *v;
        int k = 0;
        for (int i = 1; i < 8; i++) k += r->p[i] <= x;
        k = aiorl_step_back(g, k);
        *v = x - r->p[k];
        return k;
    }

    static inline double aiorl_sum8(const double *g) {
        return ((g[0] + g[1]) + (g[2] + g[3])) + ((g[4] + g[5]) + (g[6] + g[7]));
    }

    static inline double aiorl_min8(const double *g) {
        double m = g[0];
        for (int k = 1; k < 8; k++) m = g[k] < m ? g[k] : m;
        return m;
    }

    static inline double aiorl_minpos8(const double *g) {
        double m = INFINITY;
        for (int k = 0; k < 8; k++) m = (g[k] > 0.0 && g[k] < m) ? g[k] : m;
        return m;
    }
    #endif

    /* One level of n descents. node[j] is a group index into `level` and
     * becomes the chosen child's index one level down; u[j] is reduced by
     * the mass skipped. Stratified targets arrive sorted, and stay sorted
     * within a group (all of its targets took the same path), so a descent
     * in the same group as the one before (near the root: nearly all) reuses
     * its running sums and walks on from its child, giving the same child
     * as the compares would. Prefetches the next level's group of each
     * child while the other descents run, and at the leaf level row `child`
     * of each of the nrows arrays rows[f] (rowbytes[f] bytes a row): the
     * caller's records for the drawn leaves, which it reads next. */
    static void aiorl_descend_level(const double *level, int64_t *node, double *u, Py_ssize_t n,
                                    const double *next_level, char *const *rows, const Py_ssize_t *rowbytes,
                                    int nrows) {
        const double *prev = NULL;
        aiorl_runs_t r;
        int k = 0, have_p = 0;
        for (Py_ssize_t j = 0; j < n; j++) {
            const double *g = level + 8 * node[j];
            if (g != prev) {
                aiorl_runs(g, &r);
                prev = g;
                have_p = 0;
                k = aiorl_pick(&r, g, &u[j]);
            } else {
                double x = u[j];
                if (!have_p) {  /* deep levels rarely revisit a group: fill p only when one does */
                    aiorl_scalar_runs(g, r.p);
                    have_p = 1;
                }
                while (k < 7 && x >= r.p[k + 1]) k++;
                k = aiorl_step_back(g, k);
                u[j] = x - r.p[k];
            }
            int64_t child = 8 * node[j] + k;
            node[j] = child;
            if (next_level) AIORL_PREFETCH(next_level + 8 * child);
            for (int f = 0; f < nrows; f++) AIORL_PREFETCH(rows[f] + child * rowbytes[f]);
        }
    }
    """
    double _sum8 "aiorl_sum8"(const double *g) noexcept nogil
    double _min8 "aiorl_min8"(const double *g) noexcept nogil
    double _minpos8 "aiorl_minpos8"(const double *g) noexcept nogil
    void _descend_level "aiorl_descend_level"(const double *level, int64_t *node, double *u, Py_ssize_t n,
                                               const double *next_level, char *const *rows,
                                               const Py_ssize_t *rowbytes, int nrows) noexcept nogil


cdef extern from *:
    """
    #include <stdlib.h>
    #if defined(__linux__)
    #include <sys/mman.h>
    #endif
    /* n bytes on a 64-byte boundary; blocks of 2 MiB or more start on a
     * 2 MiB boundary and ask for transparent huge pages. A descent touches a
     * line in every level: with 4 KiB pages the lower levels of a large tree
     * also miss the TLB on nearly every line. NULL when out of memory. */
    static void *aiorl_tree_block(size_t n) {
        const size_t huge = (size_t)2 << 20;
        void *p = NULL;
        if (n >= huge) {
            if (posix_memalign(&p, huge, (n + huge - 1) / huge * huge) != 0) return NULL;
    #if defined(__linux__) && defined(MADV_HUGEPAGE)
            madvise(p, (n + huge - 1) / huge * huge, MADV_HUGEPAGE);  /* advice only: failure is harmless */
    #endif
            return p;
        }
        if (posix_memalign(&p, 64, n) != 0) return NULL;
        return p;
    }
    """
    void *_tree_block "aiorl_tree_block"(size_t n) noexcept nogil


cdef class SumTree:
    """Sums and minimum of `capacity` non-negative float64 leaves, with stratified sampling.

    Leaves start at 0. `min` is the smallest positive leaf (+inf when there
    is none): a zero leaf carries no mass, is never sampled, and so does not
    bound importance weights either. `update` is batched (duplicate indices:
    the last value wins); `sample(batch_size, rng)` draws one leaf from each
    of `batch_size` equal slices of the total mass, so leaf i is drawn with
    probability value_i / total and zero-valued leaves never are. Not
    thread-safe: one owner calls it (the GIL is released inside each call).
    """

    def __cinit__(self, Py_ssize_t capacity):
        if capacity < 1 or capacity > _MAX_CAPACITY:
            raise ValueError(f"SumTree: capacity must be in [1, 2**40], got {capacity}")
        self.capacity = capacity
        # Level sizes bottom-up: leaves rounded up to a multiple of 8, then
        # one parent per group, again rounded up, until one group remains.
        cdef Py_ssize_t sizes[16]
        cdef int k, levels = 0
        sizes[0] = (capacity + 7) // 8 * 8
        while sizes[levels] > 8:
            sizes[levels + 1] = (sizes[levels] // 8 + 7) // 8 * 8
            levels += 1
        self._levels = levels
        self._off[0] = 0
        for k in range(levels + 1):
            self._off[k + 1] = self._off[k] + sizes[levels - k]
        self._sum = <double *> _tree_block(self._off[self._levels + 1] * sizeof(double))
        self._min = <double *> _tree_block(self._off[self._levels] * sizeof(double))
        # Past this many queued groups a refresh goes over every leaf anyway.
        self._dirty_cap = max(1024, sizes[0] // 8 // 4)
        self._dirty = <int64_t *> malloc(self._dirty_cap * sizeof(int64_t))
        if self._sum == NULL or self._min == NULL or self._dirty == NULL:
            raise MemoryError(f"SumTree: cannot allocate a tree for capacity {capacity}")
        self._reset()

    def __dealloc__(self):
        free(self._sum)
        free(self._min)
        free(self._dirty)

    def __repr__(self):
        return f"SumTree(capacity={self.capacity}, total={self.total!r}, min={self.min!r})"

    @property
    def total(self):
        """Sum of all leaves (float64)."""
        return self._total_value

    @property
    def min(self):
        """Smallest positive leaf (float64); +inf when every leaf is 0."""
        return self._current_min()

    def update(self, indices, values):
        """Set leaf `indices[j]` to `values[j]` (finite, >= 0); duplicates: the last one wins.

        Refused (ValueError, the tree unchanged) if any index or value is bad,
        or if the values are finite but would make the total overflow to inf
        (after which every draw would land on the same leaf).
        """
        slots = np.array(as_index_array(indices, "SumTree.update indices"), copy=True)
        cdef Py_ssize_t n = slots.shape[0]
        vals = as_float64_array(values, "SumTree.update values", n)
        if n == 0:
            return
        # _write overwrites its slots (its cursor): keep a copy, and the old leaves, to undo it.
        undo_slots = slots.copy()
        undo_values = np.empty(n, dtype=np.float64)
        cdef int64_t[::1] s = slots
        cdef int64_t[::1] us = undo_slots
        cdef double[::1] uv = undo_values
        cdef const double[::1] v = vals
        cdef Py_ssize_t j, bad = -1
        cdef int what = 0
        cdef double total = 0.0
        with nogil:
            for j in range(n):
                if s[j] < 0 or s[j] >= self.capacity:
                    bad, what = j, 1
                    break
                if not (isfinite(v[j]) and v[j] >= 0.0):
                    bad, what = j, 2
                    break
            if bad < 0:
                for j in range(n):
                    uv[j] = self._leaf(s[j])  # read before any write: a duplicate's is its original too
                self._write(&s[0], &v[0], n)
                if not isfinite(self._total_value):
                    total = self._total_value
                    self._write(&us[0], &uv[0], n)
                    what = 3
        if what == 1:
            raise ValueError(
                f"SumTree.update: indices[{bad}] = {s[bad]} is out of range [0, {self.capacity})")
        if what == 2:
            raise ValueError(f"SumTree.update: values[{bad}] = {v[bad]!r}; values must be finite and >= 0")
        if what == 3:
            raise ValueError(f"SumTree.update: these values would make the total {total!r} "
                             f"(the largest value given is {float(vals.max())!r}); nothing was written")

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

        Draw j is leaf i with cumsum[i-1] <= (j + U_j) * (total / batch_size) < cumsum[i]
        (up to rounding in the tree's sums), U_j ~ U[0, 1) the j-th `random()` of `rng`
        (a numpy Generator, or a seed for one). Zero leaves are never drawn.
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
        """Test helper: largest |node - f(children)| over the stored nodes (0.0 when exact)."""
        cdef Py_ssize_t p
        cdef int k
        cdef double err = abs(self._total_value - _sum8(self._sum))
        self._refresh_mins()
        if self._min_value != self._group_min(0, 0):
            return INFINITY
        if self._min_slot >= 0 and self._leaf(self._min_slot) != self._min_value:
            return INFINITY
        for k in range(1, self._levels + 1):
            for p in range((self._off[k + 1] - self._off[k]) // 8):
                err = max(err, abs(self._sum[self._off[k - 1] + p] - _sum8(self._sum + self._off[k] + 8 * p)))
                if self._min[self._off[k - 1] + p] != self._group_min(k, p):
                    return INFINITY
        return err

    # -- kernels (nogil) ---------------------------------------------------------

    cdef double _group_min(self, int k, Py_ssize_t p) noexcept nogil:
        """Min over group p of level k: positive leaves at the leaf level, the min tree above."""
        if k == self._levels:
            return _minpos8(self._sum + self._off[k] + 8 * p)
        return _min8(self._min + self._off[k] + 8 * p)

    cdef void _reset(self) noexcept nogil:
        cdef Py_ssize_t i
        for i in range(self._off[self._levels + 1]):
            self._sum[i] = 0.0
        for i in range(self._off[self._levels]):
            self._min[i] = INFINITY
        self._total_value = 0.0
        self._min_value = INFINITY
        self._min_slot = -1
        self._min_stale = False
        self._ndirty = 0
        self._dirty_all = False

    cdef double _current_min(self) noexcept nogil:
        """The exact smallest positive leaf (+inf if none), refreshing the min tree if it must."""
        if self._min_stale:
            self._refresh_mins()
        return self._min_value

    cdef void _refresh_mins(self) noexcept nogil:
        """Bring the min tree up to date with the leaves; then find the minimum and its leaf.

        The groups written since the last refresh are recomputed level by
        level (consecutive equal parents merged, as in `_write`); once more
        were written than the queue holds (a quarter of the leaf groups), a
        full pass over the leaves is cheaper.
        """
        cdef double *m = self._min
        cdef int64_t *groups = self._dirty
        cdef Py_ssize_t j, p, node, prev, distinct, n = self._ndirty
        cdef int k, levels = self._levels
        cdef double target
        if self._dirty_all:
            for k in range(levels, 0, -1):
                for p in range((self._off[k + 1] - self._off[k]) // 8):
                    m[self._off[k - 1] + p] = self._group_min(k, p)
        else:
            for k in range(levels, 0, -1):
                prev = -1
                distinct = 0
                for j in range(n):
                    node = groups[j]
                    if node == prev:
                        continue
                    prev = node
                    m[self._off[k - 1] + node] = self._group_min(k, node)
                    groups[distinct] = node >> 3
                    distinct += 1
                n = distinct
        self._ndirty = 0
        self._dirty_all = False
        self._min_stale = False
        self._min_value = target = self._group_min(0, 0)
        self._min_slot = -1
        if target == INFINITY:
            return
        # Down the min tree to a leaf holding it: some child of each node has the node's min.
        p = 0
        for k in range(levels):
            j = 0
            while m[self._off[k] + 8 * p + j] != target:
                j += 1
            p = 8 * p + j
        j = 0
        while self._sum[self._off[levels] + 8 * p + j] != target:
            j += 1
        self._min_slot = 8 * p + j

    cdef void _write(self, int64_t *slots, const double *values, Py_ssize_t n) noexcept nogil:
        """Set leaves slots[j] = values[j] in order, then fix the ancestor sums level by level.

        `slots` must be valid and is overwritten (it becomes the node cursor).
        Leaves are written first, in order, so duplicates resolve to the last
        value; each level is then recomputed from the level below, which is
        already final, so recomputing a shared parent twice is harmless;
        consecutive equal parents (sorted input, the common case) are merged
        as the cursor moves up.

        The minimum is kept exact without touching the min tree: a value below
        it becomes it, and only raising (or zeroing) the leaf that holds it
        leaves it unknown (`_min_stale`) until `_refresh_mins`. The written
        leaf groups are queued for that refresh. Prioritized replay raises its
        minimum leaf rarely (it is the least likely to be sampled), so the
        min tree is mostly refreshed in bulk, off the learner's step.
        """
        cdef double *s = self._sum
        cdef Py_ssize_t leaf0 = self._off[self._levels]
        cdef const double *level
        cdef Py_ssize_t j, node, prev, parent0, distinct
        cdef Py_ssize_t ahead = 16
        cdef double v
        cdef int k
        prev = -1
        for j in range(n):
            if j + ahead < n:
                prefetch(s + leaf0 + slots[j + ahead])
            v = values[j]
            s[leaf0 + slots[j]] = v
            # Every positive leaf is >= _min_value, stale or not: one at or below it is the minimum.
            if v > 0.0 and v <= self._min_value:
                self._min_value = v
                self._min_slot = slots[j]
                self._min_stale = False
            elif slots[j] == self._min_slot:
                self._min_stale = True  # the minimum leaf went up (or to 0)
            node = slots[j] >> 3
            if node != prev and not self._dirty_all:
                if self._ndirty == self._dirty_cap:
                    self._dirty_all = True
                else:
                    self._dirty[self._ndirty] = node
                    self._ndirty += 1
                prev = node
        for k in range(self._levels, 0, -1):
            parent0 = self._off[k - 1]
            level = s + self._off[k]
            prev = -1
            distinct = 0
            for j in range(n):
                node = slots[j] >> 3
                if node == prev:
                    continue
                prev = node
                slots[distinct] = node
                distinct += 1
                if k > 1:
                    # The next level writes node's parent: start fetching its line now.
                    prefetch(s + self._off[k - 2] + (node >> 3))
                s[parent0 + node] = _sum8(level + 8 * node)
            n = distinct
        self._total_value = _sum8(s)

    cdef void _sample(self, bitgen_t *rng, double *scratch, Py_ssize_t n, int64_t *out,
                      char **rows=NULL, const Py_ssize_t *rowbytes=NULL, int nrows=0) noexcept nogil:
        """out[j] = leaf holding mass (j + U_j) * (total / n); the caller checked total > 0.

        All n descents advance one level at a time, so that each one's next
        line is prefetched while the others run. Given `rows`, each drawn
        leaf's row of those arrays is prefetched as soon as the leaf is known:
        a replay buffer's gather of the sampled records then overlaps with
        the rest of the last level instead of starting after it.
        """
        cdef double segment = self._total_value / n
        cdef Py_ssize_t j
        cdef int k, levels = self._levels
        for j in range(n):
            scratch[j] = (j + rng.next_double(rng.state)) * segment
            out[j] = 0
        for k in range(levels + 1):
            _descend_level(self._sum + self._off[k], out, scratch, n,
                           self._sum + self._off[k + 1] if k < levels else NULL,
                           rows, rowbytes, nrows if k == levels else 0)
