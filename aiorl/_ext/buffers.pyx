# cython: language_level=3
"""Replay buffers over preallocated per-field storage: uniform and prioritized (the aggregate
buffer of synchronous agents is `aiorl._ext.aggregate`).

Storage is one C-contiguous array per field, `(capacity, *shape)` in the
field's own dtype (uint8 frames stay uint8). Rows move with memcpy loops in
nogil sections: `add` is one validation pass plus one C call, `sample` one C
call that draws, weighs and gathers every field, `update_priorities` one C
call. Snapshots are dicts of plain arrays (see `state_dict`), never pickle.
"""
import json
import os
from collections.abc import Mapping

import numpy as np

from aiorl._ext._fields import (SNAPSHOT_FORMAT, SNAPSHOT_VERSION, _check_same, _load_npz, _meta_array, _read_meta,
                                _save_npz, _spec_json, _state_array)
from aiorl.core.buffer_pool import BufferPool

cimport cython
cimport numpy as cnp
from libc.math cimport isfinite, pow
from libc.stdlib cimport free, malloc
from libc.string cimport memcpy
from numpy.random cimport bitgen_t

from aiorl._ext._common cimport copy_row, int64_t, prefetch, uint64_t
from aiorl._ext._checks cimport (as_float64_array, as_generator, as_index_array, as_uint64_array,
                                 bitgen_of, empty_1d)
from aiorl._ext.sumtree cimport SumTree
from aiorl._ext._fields cimport _Fields

cnp.import_array()

# Sampled fields this large are written into recycled memory (see _Ring._new_rows);
# smaller ones come from malloc's heap, which reuses its pages anyway.
POOLED_BYTES = 1 << 20
_power = np.power
# Priorities above this are stored as this (a |TD| of 1e8 already says "sample me first"):
# one absurd value (1e300) would otherwise pin the running max, which new rows get,
# far above every real priority, and a few of them overflow the tree's total.
MAX_PRIORITY = 1e8
cdef double _MAX_PRIORITY = MAX_PRIORITY


cdef inline int _raise_index(str what, Py_ssize_t j, int64_t value, Py_ssize_t size) except -1:
    raise ValueError(f"{what}: indices[{j}] = {value} is out of range [0, {size}) (the rows stored)")


cdef inline int _raise_priority(str what, Py_ssize_t j, double value) except -1:
    raise ValueError(f"{what}: priorities[{j}] = {value!r}; priorities must be finite and >= 0")


cdef class _Ring:
    """Ring storage shared by the uniform and prioritized buffers (not public)."""
    cdef readonly Py_ssize_t capacity
    cdef Py_ssize_t _size
    cdef Py_ssize_t _next
    cdef uint64_t _added            # rows ever added; the generation of the next row
    cdef _Fields _fields
    cdef list _storage
    cdef char **_data               # each field's storage
    cdef char **_dst                # per-call scratch: output pointers of the batch being sampled
    cdef object _rng
    cdef object _rng_lock
    cdef bitgen_t *_bitgen
    cdef object _pool               # recycled memory for large sampled fields

    def __cinit__(self, Py_ssize_t capacity, spec, *args, **kwargs):
        owner = type(self).__name__
        if capacity < 1:
            raise ValueError(f"{owner}: capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self._fields = _Fields(spec, owner)
        self._pool = BufferPool()
        self._storage = [np.zeros((capacity,) + shape, dtype=dtype)
                         for shape, dtype in zip(self._fields.shapes, self._fields.dtypes)]
        self._data = <char **> malloc(self._fields.count * sizeof(char *))
        self._dst = <char **> malloc(self._fields.count * sizeof(char *))
        if self._data == NULL or self._dst == NULL:
            raise MemoryError(owner)
        cdef int f
        for f in range(self._fields.count):
            self._data[f] = <char *> cnp.PyArray_DATA(<cnp.ndarray> self._storage[f])

    def __dealloc__(self):
        free(self._data)
        free(self._dst)

    cdef _set_rng(self, seed):
        self._rng = as_generator(seed)
        self._rng_lock = self._rng.bit_generator.lock
        self._bitgen = bitgen_of(self._rng)

    def __len__(self):
        return self._size

    @property
    def spec(self):
        """{name: (row_shape, dtype)} as normalised at construction."""
        return self._fields.as_spec()

    @property
    def added(self):
        """Rows ever added (the generation the next row will get)."""
        return self._added

    cdef inline uint64_t _generation(self, int64_t slot) noexcept nogil:
        """Generation (rows added before it) of the row in a stored slot.

        Rows are written strictly in ring order, so the row in `slot` is the
        newest one that landed there: no per-slot table (and no cache miss) needed.
        """
        # Slots back from the newest row, (next - 1 - slot) mod capacity, without a division.
        cdef Py_ssize_t back = self._next - 1 - slot
        if back < 0:
            back += self.capacity
        return self._added - 1 - <uint64_t> back

    cdef list _prepare(self, batch, str what, Py_ssize_t *rows):
        """Validate a batch (nothing written yet); `_commit` then copies it in."""
        arrays = self._fields.coerce(batch, what, rows)
        if rows[0] > self.capacity:
            raise ValueError(f"{what}: batch of {rows[0]} rows is larger than the capacity {self.capacity}")
        return arrays

    cdef object _commit(self, Py_ssize_t n):
        """Copy the batch `_prepare` validated (its arrays still alive) into the ring; returns its slots."""
        indices = empty_1d(n, cnp.NPY_INT64)
        cdef int64_t *idx = <int64_t *> cnp.PyArray_DATA(indices)
        cdef Py_ssize_t first = min(n, self.capacity - self._next)
        cdef Py_ssize_t j, rb
        cdef int f
        with nogil:
            # Rows [0, first) go to the end of the ring, the rest wrap to its start.
            for f in range(self._fields.count):
                rb = self._fields.rowbytes[f]
                memcpy(self._data[f] + self._next * rb, self._fields.src[f], first * rb)
                memcpy(self._data[f], self._fields.src[f] + first * rb, (n - first) * rb)
            for j in range(n):
                idx[j] = self._next + j if j < first else j - first
        self._next = (self._next + n) % self.capacity
        self._size = min(self._size + n, self.capacity)
        self._added += n
        return indices

    cdef dict _new_rows(self, Py_ssize_t n, char **dst):
        """{field: new uninitialised (n, *shape) array}; dst[f] receives each one's data pointer.

        Fields of POOLED_BYTES or more come from `_pool`: recycled once the
        caller drops every view of an earlier batch, instead of fresh pages the
        kernel must fault in and zero on every sample (7% more learner steps
        with 84x84 frames).
        """
        cdef dict out = {}
        cdef int f
        cdef Py_ssize_t nbytes
        for f in range(self._fields.count):
            nbytes = n * self._fields.rowbytes[f]
            if nbytes >= POOLED_BYTES:
                arr = self._pool.take(nbytes).view(self._fields.dtypes[f]).reshape((n,) + self._fields.shapes[f])
            else:
                arr = self._fields.empty(f, n)
            out[self._fields.names[f]] = arr
            dst[f] = <char *> cnp.PyArray_DATA(<cnp.ndarray> arr)
        return out

    cdef void _gather(self, char **dst, const int64_t *idx, Py_ssize_t n) noexcept nogil:
        """dst[f][j] = field f's row idx[j], all fields per row, source rows prefetched ahead.

        One pass over the rows (rather than one per field) keeps the misses of
        every field in flight together: with small rows, memory latency is
        the whole cost.
        """
        cdef const Py_ssize_t *rowbytes = self._fields.rowbytes
        cdef int f, count = self._fields.count
        cdef Py_ssize_t j
        cdef Py_ssize_t ahead = 8
        for j in range(n):
            if j + ahead < n:
                for f in range(count):
                    prefetch(self._data[f] + idx[j + ahead] * rowbytes[f])
            for f in range(count):
                copy_row(dst[f] + j * rowbytes[f], self._data[f] + idx[j] * rowbytes[f], rowbytes[f])

    cdef _check_sample(self, Py_ssize_t batch_size, str what):
        if self._size == 0:
            raise ValueError(f"{what}: the buffer is empty")
        if batch_size < 1:
            raise ValueError(f"{what}: batch_size must be >= 1, got {batch_size}")

    # -- snapshots ---------------------------------------------------------------

    cdef dict _ring_meta(self):
        return {"format": SNAPSHOT_FORMAT, "version": SNAPSHOT_VERSION, "kind": type(self).__name__,
                "capacity": self.capacity, "spec": _spec_json(self._fields), "size": self._size,
                "next": self._next, "added": self._added, "rng": self._rng.bit_generator.state}

    cdef dict _ring_state(self, dict meta):
        state = {"meta": _meta_array(meta)}
        for name, arr in zip(self._fields.names, self._storage):
            view = arr[:self._size]
            view.flags.writeable = False
            state[f"field.{name}"] = view
        return state

    cdef tuple _ring_check(self, state, str what):
        """Validate a snapshot against this buffer without touching it: (meta, field arrays)."""
        meta = _read_meta(state, what)
        _check_same(what, "kind", type(self).__name__, meta.get("kind"))
        _check_same(what, "capacity", self.capacity, meta.get("capacity"))
        _check_same(what, "spec", _spec_json(self._fields), meta.get("spec"))
        size, next_slot, added = meta.get("size"), meta.get("next"), meta.get("added")
        if not (all(isinstance(v, int) for v in (size, next_slot, added))
                and added >= 0 and size == min(added, self.capacity) and next_slot == added % self.capacity):
            raise ValueError(f"{what}: inconsistent snapshot counters size={size!r} next={next_slot!r} "
                             f"added={added!r} for capacity {self.capacity}")
        rng_kind = type(self._rng.bit_generator).__name__
        if not isinstance(meta.get("rng"), dict) or meta["rng"].get("bit_generator") != rng_kind:
            raise ValueError(f"{what}: snapshot rng state is not a {rng_kind} state")
        arrays = [_state_array(state, f"field.{name}", (size,) + shape, dtype, what)
                  for name, shape, dtype in zip(self._fields.names, self._fields.shapes, self._fields.dtypes)]
        return meta, arrays

    cdef _ring_apply(self, tuple checked):
        meta, arrays = checked
        size = meta["size"]
        for dst, src in zip(self._storage, arrays):
            dst[:size] = src
        self._size, self._next, self._added = size, meta["next"], meta["added"]
        self._rng.bit_generator.state = meta["rng"]

    def save(self, path):
        """Write `state_dict()` to `path` as an .npz archive (no pickle; replaced atomically)."""
        _save_npz(self.state_dict(), path)

    def load(self, path):
        """Restore from a file written by `save` (read with allow_pickle=False)."""
        self.load_state_dict(_load_npz(path))


@cython.final
cdef class ReplayBuffer(_Ring):
    """Uniform ring buffer: `ReplayBuffer(capacity, spec, seed=None)`.

    spec: {name: (row_shape, dtype)}, e.g. {"obs": ((4,), "float32"), "action": ((), "int64")}.
    `add(batch)` takes {name: array with a leading batch dimension} for every
    field and returns the slot indices written (oldest rows are overwritten
    once full). `sample(batch_size)` draws slots uniformly with replacement
    from every stored row and returns new arrays plus "indices".
    """

    def __init__(self, Py_ssize_t capacity, spec, seed=None):
        self._set_rng(seed)

    def __repr__(self):
        return (f"ReplayBuffer(size={self._size}, capacity={self.capacity}, "
                f"fields={list(self._fields.names)}, added={self._added})")

    def add(self, batch):
        """Append a batch {name: (n, *shape) array}; returns the n slot indices (int64)."""
        cdef Py_ssize_t n
        arrays = self._prepare(batch, "ReplayBuffer.add", &n)
        return self._commit(n)

    def sample(self, Py_ssize_t batch_size):
        """{field: (batch_size, *shape) copy, "indices": int64 slots}, drawn uniformly with replacement."""
        self._check_sample(batch_size, "ReplayBuffer.sample")
        indices = empty_1d(batch_size, cnp.NPY_INT64)
        cdef int64_t *idx = <int64_t *> cnp.PyArray_DATA(indices)
        cdef bitgen_t *rng = self._bitgen
        cdef Py_ssize_t j, size = self._size
        out = self._new_rows(batch_size, self._dst)
        out["indices"] = indices
        with self._rng_lock, nogil:
            for j in range(batch_size):
                # floor(U * size): the bias is below 2**-53 * size, and U < 1 keeps it < size.
                idx[j] = <int64_t> (rng.next_double(rng.state) * size)
                if idx[j] >= size:
                    idx[j] = size - 1
            self._gather(self._dst, idx, batch_size)
        return out

    def state_dict(self):
        """Snapshot as {name: ndarray}; see `PrioritizedReplayBuffer.state_dict` for the format."""
        return self._ring_state(self._ring_meta())

    def load_state_dict(self, state):
        """Restore a `state_dict()` of a buffer with the same capacity and spec."""
        self._ring_apply(self._ring_check(state, "ReplayBuffer.load_state_dict"))


@cython.final
cdef class PrioritizedReplayBuffer(_Ring):
    """Proportional prioritized replay: `PrioritizedReplayBuffer(capacity, spec, alpha, eps=1e-6, seed=None)`.

    Slot i is sampled with probability P(i) = q_i / sum_j q_j where
    q_i = (min(p_i, MAX_PRIORITY) + eps) ** alpha for the priority p_i >= 0
    last given for it (MAX_PRIORITY = 1e8); rows added without priorities get
    the largest q ever stored (1.0 before any). `sample` is stratified (one draw per equal slice of the total mass)
    and returns importance weights w_i = (N P(i)) ** -beta / max_j w_j, the
    max taken over the stored rows through the min-tree: w_i = (q_i / q_min) ** -beta.

    Each stored row has a generation (how many rows were added before it);
    `sample` returns them and `update_priorities(..., generations)` skips
    entries whose slot has been overwritten since.
    """
    cdef SumTree _tree
    cdef readonly double alpha
    cdef readonly double eps
    cdef double _max_q

    def __init__(self, Py_ssize_t capacity, spec, double alpha, double eps=1e-6, seed=None):
        if not (isfinite(alpha) and alpha >= 0.0):
            raise ValueError(f"PrioritizedReplayBuffer: alpha must be finite and >= 0, got {alpha!r}")
        if not (isfinite(eps) and eps > 0.0):
            raise ValueError(f"PrioritizedReplayBuffer: eps must be finite and > 0, got {eps!r}")
        if not isfinite(capacity * pow(_MAX_PRIORITY + eps, alpha)):
            # Then no sequence of valid priorities can make the tree's total overflow.
            raise ValueError(f"PrioritizedReplayBuffer: alpha {alpha!r} is too large: {capacity} priorities of "
                             f"{MAX_PRIORITY:g} would sum past the largest float64")
        self.alpha = alpha
        self.eps = eps
        self._max_q = 1.0
        self._tree = SumTree(capacity)
        self._set_rng(seed)

    def __repr__(self):
        return (f"PrioritizedReplayBuffer(size={self._size}, capacity={self.capacity}, "
                f"fields={list(self._fields.names)}, alpha={self.alpha}, total={self._tree.total!r}, "
                f"added={self._added})")

    @property
    def max_priority(self):
        """Largest (p + eps) ** alpha stored so far: what rows added without priorities get."""
        return self._max_q

    @property
    def tree(self):
        """The SumTree over slot values (p + eps) ** alpha (read it; writing bypasses the buffer)."""
        return self._tree

    def add(self, batch, priorities=None):
        """Append a batch; rows get (priorities + eps) ** alpha, or the running max when None.

        Returns the n slot indices (int64). Nothing is written if any field or
        priority is invalid.
        """
        what = "PrioritizedReplayBuffer.add"
        cdef Py_ssize_t n, j
        arrays = self._prepare(batch, what, &n)
        cdef const double *q = NULL
        if priorities is not None:
            prio = as_float64_array(priorities, f"{what} priorities", n)
            q_arr = self._values(what, prio)
            q = <const double *> cnp.PyArray_DATA(q_arr)
        indices = self._commit(n)
        if n == 0:
            return indices
        slots = indices.copy()
        cdef int64_t *s = <int64_t *> cnp.PyArray_DATA(slots)
        if q == NULL:
            fill_arr = np.full(n, self._max_q)
            q = <const double *> cnp.PyArray_DATA(fill_arr)
        with nogil:
            for j in range(n):
                if q[j] > self._max_q:
                    self._max_q = q[j]
            self._tree._write(s, q, n)
        return indices

    cdef object _values(self, str what, prio):
        """Tree values (p + eps) ** alpha of float64 priorities, in a new array.

        Raises ValueError naming the first priority that is negative or not
        finite; finite ones above MAX_PRIORITY count as MAX_PRIORITY. The
        power is numpy's vectorised one: several times faster than a libm pow
        per element, which would otherwise be the largest cost of an update.
        """
        cdef const double *p = <const double *> cnp.PyArray_DATA(prio)
        cdef Py_ssize_t j, n = prio.shape[0]
        q = empty_1d(n, cnp.NPY_FLOAT64)
        cdef double *v = <double *> cnp.PyArray_DATA(q)
        for j in range(n):
            if not (p[j] >= 0.0 and isfinite(p[j])):
                _raise_priority(what, j, p[j])
            v[j] = (p[j] if p[j] < _MAX_PRIORITY else _MAX_PRIORITY) + self.eps
        if self.alpha != 1.0:
            _power(q, self.alpha, q)  # finite: __init__ refused an alpha that could overflow
        return q

    def sample(self, Py_ssize_t batch_size, double beta):
        """{field: copy, "indices": int64, "weights": float32, "generations": uint64}.

        Stratified: draw j lies in the j-th of batch_size equal slices of the
        total mass, so indices come out sorted. beta >= 0 (0: all weights 1).
        """
        what = "PrioritizedReplayBuffer.sample"
        self._check_sample(batch_size, what)
        if not (isfinite(beta) and beta >= 0.0):
            raise ValueError(f"{what}: beta must be finite and >= 0, got {beta!r}")
        if not self._tree._total_value > 0.0:
            # Only if every (p + eps) ** alpha underflowed to 0.
            raise ValueError(f"{what}: every stored priority value is 0; nothing can be drawn")
        indices = empty_1d(batch_size, cnp.NPY_INT64)
        weights = empty_1d(batch_size, cnp.NPY_FLOAT32)
        generations = empty_1d(batch_size, cnp.NPY_UINT64)
        cdef int64_t *idx = <int64_t *> cnp.PyArray_DATA(indices)
        cdef uint64_t *g = <uint64_t *> cnp.PyArray_DATA(generations)
        ratio = empty_1d(batch_size, cnp.NPY_FLOAT64)
        cdef double *r = <double *> cnp.PyArray_DATA(ratio)
        cdef double q_min = self._tree._current_min()
        cdef Py_ssize_t j
        out = self._new_rows(batch_size, self._dst)
        with self._rng_lock, nogil:
            # The tree prefetches each drawn slot's rows as it finds it (see SumTree._sample).
            self._tree._sample(self._bitgen, r, batch_size, idx, self._data, self._fields.rowbytes,
                               self._fields.count)
            for j in range(batch_size):
                r[j] = self._tree._leaf(idx[j]) / q_min
                g[j] = self._generation(idx[j])
            self._gather(self._dst, idx, batch_size)
        # w = (q / q_min) ** -beta in float64 (vectorised, see _values), then rounded to
        # float32 here: the same values as a float32 `out=`, whose buffered cast costs more
        # than the power itself.
        _power(ratio, -beta, ratio)
        cdef float *w = <float *> cnp.PyArray_DATA(weights)
        for j in range(batch_size):
            w[j] = <float> r[j]
        out["indices"] = indices
        out["weights"] = weights
        out["generations"] = generations
        return out

    def update_priorities(self, indices, priorities, generations=None):
        """Set the priorities of sampled slots; returns how many entries were skipped as stale.

        An entry is stale when `generations` is given and its slot now holds a
        different row than the one sampled (it was overwritten since).
        Duplicates: the last entry wins. Nothing is written if any index is
        out of range or any priority is negative or not finite.
        """
        what = "PrioritizedReplayBuffer.update_priorities"
        idx_arr = as_index_array(indices, f"{what} indices")
        cdef Py_ssize_t n = idx_arr.shape[0]
        prio = as_float64_array(priorities, f"{what} priorities", n)
        cdef const int64_t *idx = <const int64_t *> cnp.PyArray_DATA(idx_arr)
        cdef const uint64_t *gen = NULL
        if generations is not None:
            gen_arr = as_uint64_array(generations, f"{what} generations", n)
            gen = <const uint64_t *> cnp.PyArray_DATA(gen_arr)
        if n == 0:
            return 0
        q_arr = self._values(what, prio)
        cdef const double *q = <const double *> cnp.PyArray_DATA(q_arr)
        slots_arr = empty_1d(n, cnp.NPY_INT64)
        kept_arr = empty_1d(n, cnp.NPY_FLOAT64)
        cdef int64_t *slots = <int64_t *> cnp.PyArray_DATA(slots_arr)
        cdef double *kept_q = <double *> cnp.PyArray_DATA(kept_arr)
        cdef Py_ssize_t j, kept = 0, bad = -1
        cdef double q_max = self._max_q
        with nogil:
            for j in range(n):
                if idx[j] < 0 or idx[j] >= self._size:
                    bad = j
                    break
                if gen != NULL and gen[j] != self._generation(idx[j]):
                    continue
                slots[kept] = idx[j]
                kept_q[kept] = q[j]
                if q[j] > q_max:
                    q_max = q[j]
                kept += 1
            if bad < 0:
                self._tree._write(slots, kept_q, kept)
                self._max_q = q_max
        if bad >= 0:
            _raise_index(what, bad, idx[bad], self._size)
        return n - kept

    def state_dict(self):
        """Snapshot as a flat {name: ndarray} dict (documented format, no pickle).

        - "meta": uint8 array, UTF-8 JSON: {"format": "aiorl.replay", "version": 1,
          "kind", "capacity", "spec": [[name, shape, dtype.str], ...], "size",
          "next" (slot the next row goes to), "added" (rows ever added), "rng"
          (numpy bit generator state), and for this class "alpha", "eps",
          "max_priority"}.
        - "field.<name>": rows [0, size) of each field, slot order.
        - "priorities": float64 [size], the tree values (p + eps) ** alpha.

        Arrays are read-only views of the live storage (no copy of a large
        buffer): use them before the next add, or copy them. `save` writes
        this dict with numpy.savez; `load` reads it with allow_pickle=False.
        """
        meta = self._ring_meta()
        meta.update(alpha=self.alpha, eps=self.eps, max_priority=self._max_q)
        state = self._ring_state(meta)
        state["priorities"] = self._tree.get(np.arange(self._size))
        return state

    def load_state_dict(self, state):
        """Restore a `state_dict()` of a buffer with the same capacity, spec, alpha and eps."""
        what = "PrioritizedReplayBuffer.load_state_dict"
        checked = self._ring_check(state, what)
        meta = checked[0]
        _check_same(what, "alpha", self.alpha, meta.get("alpha"))
        _check_same(what, "eps", self.eps, meta.get("eps"))
        size = meta["size"]
        q = _state_array(state, "priorities", (size,), np.float64, what)
        if size and not (np.isfinite(q).all() and (q >= 0).all()):
            raise ValueError(f"{what}: snapshot priorities must be finite and >= 0")
        max_q = meta.get("max_priority")
        if not (isinstance(max_q, float) and isfinite(max_q) and max_q > 0 and (size == 0 or max_q >= q.max())):
            raise ValueError(f"{what}: snapshot max_priority {max_q!r} is not a finite float >= every priority")
        self._ring_apply(checked)
        tree = SumTree(self.capacity)
        tree.update(np.arange(size), q)
        self._tree = tree
        self._max_q = max_q
