# cython: language_level=3
"""Frames stored once: a reference-counted frame pool and per-producer frame-id maps.

A frame-stacked observation (k frames of shape F) is kept as k references
into a `FramePool`, so a frame shared by consecutive stacks, and by a
transition's obs and next_obs, is stored once.

FramePool: slots of one frame each, in blocks allocated as the pool grows
(``block_frames`` slots per block, a power of two: slot s lives in block
s >> shift at row s & mask). Every slot has a reference count; `add` hands
out slots with count 1 (the caller's reference), `incref` / `decref` move
counts, and a slot whose count reaches 0 goes onto a LIFO free list, which
`add` takes from before opening fresh slots (fresh slots in increasing
order). So the pool touches only as many pages as frames were ever live at
once. The numpy oracle `aiorl.replay.reference.FramePool` follows the same
discipline, slot for slot.

FrameStream: which frames of one producer (an actor connection) a memory
host holds, by the producer's frame id (a per-producer counter). Ids live
in a ring of ``window`` entries keyed by id mod window; each held id pins its
slot (one reference). A message declares ``keep_from``: it and every later
message reference no id below it, so held ids below it are released first.
`check` validates a message without changing anything; `admit` then applies
it and returns the pool slots of the message's references.
"""
import numpy as np

cimport numpy as cnp
from libc.stdint cimport int32_t
from libc.stdlib cimport free, malloc, realloc
from libc.string cimport memcpy

from aiorl._ext._common cimport int64_t, prefetch
from aiorl._ext._checks cimport as_contiguous

cnp.import_array()

# Bytes a pool block aims at: large enough that blocks are few, small enough
# that a small buffer does not reserve much address space.
cdef Py_ssize_t _BLOCK_BYTES = 32 << 20


cdef object _int64_array(object x, str what):
    """A C-contiguous int64 array of any shape (any integer dtype)."""
    arr = np.asarray(x)
    if arr.dtype.kind not in "iu" and not (arr.size == 0 and arr.dtype.kind == "f"):
        raise ValueError(f"{what}: expected integers, got {arr.dtype}")
    return np.ascontiguousarray(arr, dtype=np.int64)


cdef class FramePool:
    """Reference-counted frame slots: `FramePool(frame_shape, dtype, max_frames, block_frames=0)`.

    block_frames 0 picks a power of two near 32 MiB of frames (at most the
    next power of two of max_frames). `len(pool)` is the number of live slots.
    """
    cdef readonly tuple frame_shape
    cdef readonly object dtype
    cdef readonly Py_ssize_t frame_bytes
    cdef readonly Py_ssize_t max_frames
    cdef readonly Py_ssize_t block_frames
    cdef int _shift
    cdef Py_ssize_t _mask
    cdef list _blocks               # uint8 arrays, block_frames * frame_bytes each (kept alive)
    cdef list _counts               # int32 arrays, block_frames each
    cdef char **_data
    cdef int32_t **_refs
    cdef Py_ssize_t _nblocks
    cdef Py_ssize_t _max_blocks
    cdef int64_t *_free
    cdef Py_ssize_t _nfree
    cdef Py_ssize_t _free_cap
    cdef Py_ssize_t _high           # fresh slots handed out so far: slots [0, _high) exist
    cdef Py_ssize_t _live

    def __cinit__(self, frame_shape, dtype, Py_ssize_t max_frames, Py_ssize_t block_frames=0):
        try:
            shape = tuple(int(d) for d in frame_shape)
            dt = np.dtype(dtype)
        except (TypeError, ValueError):
            raise ValueError(f"FramePool: frame_shape must be a tuple of ints and dtype a numpy dtype, "
                             f"got {frame_shape!r}, {dtype!r}") from None
        if not all(d >= 1 for d in shape) or dt.kind not in "biufc":
            raise ValueError(f"FramePool: frame_shape {shape} must have positive dims and dtype {dt} "
                             "must be bool or numeric")
        if max_frames < 1:
            raise ValueError(f"FramePool: max_frames must be >= 1, got {max_frames}")
        self.frame_shape = shape
        self.dtype = dt.newbyteorder("=")
        self.frame_bytes = dt.itemsize * int(np.prod(shape, dtype=np.int64))
        self.max_frames = max_frames
        cdef Py_ssize_t want = block_frames if block_frames > 0 else max(1, _BLOCK_BYTES // self.frame_bytes)
        cdef Py_ssize_t bf = 1
        cdef int shift = 0
        while bf < want and bf < max_frames:
            bf <<= 1
            shift += 1
        self.block_frames = bf
        self._shift = shift
        self._mask = bf - 1
        self._max_blocks = (max_frames + bf - 1) // bf
        self._blocks = []
        self._counts = []
        self._data = <char **> malloc(self._max_blocks * sizeof(char *))
        self._refs = <int32_t **> malloc(self._max_blocks * sizeof(int32_t *))
        self._free_cap = 1024
        self._free = <int64_t *> malloc(self._free_cap * sizeof(int64_t))
        if self._data == NULL or self._refs == NULL or self._free == NULL:
            raise MemoryError("FramePool")

    def __dealloc__(self):
        free(self._data)
        free(self._refs)
        free(self._free)

    def __len__(self):
        return self._live

    def __repr__(self):
        return (f"FramePool(frame_shape={self.frame_shape}, dtype={self.dtype}, live={self._live}, "
                f"slots={self._high}, free={self._nfree}, max_frames={self.max_frames})")

    @property
    def slots(self):
        """Slots ever opened (live or free): what the pool's memory holds."""
        return self._high

    @property
    def free_slots(self):
        return self._nfree

    @property
    def allocated_bytes(self):
        """Bytes of frame storage reserved (touched only as slots are opened)."""
        return self._nblocks * self.block_frames * self.frame_bytes

    cdef inline char *_frame(self, int64_t slot) noexcept nogil:
        return self._data[slot >> self._shift] + (slot & self._mask) * self.frame_bytes

    cdef inline int32_t *_count(self, int64_t slot) noexcept nogil:
        return self._refs[slot >> self._shift] + (slot & self._mask)

    cdef inline bint _is_live(self, int64_t slot) noexcept nogil:
        return 0 <= slot < self._high and self._count(slot)[0] > 0

    cdef int _open_block(self) except -1:
        if self._nblocks >= self._max_blocks:
            raise MemoryError(f"FramePool: all {self.max_frames} frames are in use")
        block = np.empty(self.block_frames * self.frame_bytes, np.uint8)
        counts = np.zeros(self.block_frames, np.int32)
        self._blocks.append(block)
        self._counts.append(counts)
        self._data[self._nblocks] = <char *> cnp.PyArray_DATA(block)
        self._refs[self._nblocks] = <int32_t *> cnp.PyArray_DATA(counts)
        self._nblocks += 1
        return 0

    cdef int _reserve(self, Py_ssize_t n) except -1:
        """Make sure `n` more slots can be handed out (blocks opened as needed)."""
        cdef Py_ssize_t fresh = n - self._nfree
        if fresh <= 0:
            return 0
        if self._high + fresh > self.max_frames:
            raise MemoryError(f"FramePool: {n} new frames would exceed max_frames={self.max_frames} "
                              f"({self._live} live)")
        while self._nblocks * self.block_frames < self._high + fresh:
            self._open_block()
        return 0

    def can_add(self, Py_ssize_t n):
        """Whether `n` more frames fit under max_frames (counting free slots)."""
        return n <= self._nfree or self._high + n - self._nfree <= self.max_frames

    def add(self, frames):
        """Store frames [n, *frame_shape]; returns their n new slots (int64), each with count 1."""
        arr = as_contiguous(frames)
        if arr.shape[1:] != self.frame_shape or arr.dtype != self.dtype:
            raise ValueError(f"FramePool.add: expected frames (n, {', '.join(map(str, self.frame_shape))}) "
                             f"{self.dtype}, got {arr.shape} {arr.dtype}")
        cdef Py_ssize_t n = arr.shape[0]
        self._reserve(n)
        slots = np.empty(n, np.int64)
        cdef int64_t[::1] out = slots
        cdef const char *src = <const char *> cnp.PyArray_DATA(arr)
        cdef Py_ssize_t j
        cdef int64_t slot
        with nogil:
            for j in range(n):
                if self._nfree > 0:
                    self._nfree -= 1
                    slot = self._free[self._nfree]
                else:
                    slot = self._high
                    self._high += 1
                memcpy(self._frame(slot), src + j * self.frame_bytes, self.frame_bytes)
                self._count(slot)[0] = 1
                out[j] = slot
            self._live += n
        return slots

    def incref(self, slots):
        """One more reference to each slot (any shape; every slot must be live)."""
        arr = _int64_array(slots, "FramePool.incref slots")
        cdef const int64_t *s = <const int64_t *> cnp.PyArray_DATA(arr)
        cdef Py_ssize_t j, n = arr.size, bad = -1
        with nogil:
            for j in range(n):
                if not self._is_live(s[j]):
                    bad = j
                    break
            if bad < 0:
                for j in range(n):
                    self._count(s[j])[0] += 1
        if bad >= 0:
            raise ValueError(f"FramePool.incref: slot {s[bad]} is not live")

    def decref(self, slots):
        """One reference fewer to each slot (any shape); slots reaching 0 are freed."""
        arr = _int64_array(slots, "FramePool.decref slots")
        cdef const int64_t *s = <const int64_t *> cnp.PyArray_DATA(arr)
        cdef Py_ssize_t n = arr.size
        if self._decref(s, n) < 0:
            raise ValueError("FramePool.decref: a slot would drop below zero references (or is not live)")

    cdef Py_ssize_t _decref(self, const int64_t *s, Py_ssize_t n) except -2:
        """Returns 0, or -1 when a slot was not live (the ones before it were applied)."""
        cdef Py_ssize_t j, freed = 0
        cdef int64_t *grown
        if self._nfree + n > self._free_cap:
            cap = max(2 * self._free_cap, self._nfree + n)
            grown = <int64_t *> realloc(self._free, cap * sizeof(int64_t))
            if grown == NULL:
                raise MemoryError("FramePool free list")
            self._free = grown
            self._free_cap = cap
        with nogil:
            for j in range(n):
                if not self._is_live(s[j]):
                    self._live -= freed
                    return -1
                self._count(s[j])[0] -= 1
                if self._count(s[j])[0] == 0:
                    self._free[self._nfree] = s[j]
                    self._nfree += 1
                    freed += 1
            self._live -= freed
        return 0

    def refcount(self, slots):
        """Reference counts of `slots` (int32, same shape; 0 for a free slot)."""
        arr = _int64_array(slots, "FramePool.refcount slots")
        out = np.zeros(arr.shape, np.int32)
        flat_in, flat_out = arr.reshape(-1), out.reshape(-1)
        for j in range(arr.size):
            slot = int(flat_in[j])
            if not 0 <= slot < self._high:
                raise ValueError(f"FramePool.refcount: slot {slot} was never opened")
            flat_out[j] = self._count(slot)[0]
        return out

    def take(self, slots):
        """Copies of the frames in `slots` (any shape S): an array (*S, *frame_shape)."""
        arr = _int64_array(slots, "FramePool.take slots")
        out = np.empty(arr.shape + self.frame_shape, self.dtype)
        self._copy_out(arr, out, "FramePool.take")
        return out

    def gather(self, table, rows, out=None):
        """Stacks of sampled rows: out[j] = frames of table[rows[j]], shape (len(rows), k, *frame_shape).

        table: int64 [capacity, k] of live slots; rows: indices into it;
        out: None, or a C-contiguous array of that shape and the pool's dtype
        to write into (returned).
        """
        tab = as_contiguous(table)
        idx = _int64_array(rows, "FramePool.gather rows")
        if tab.ndim != 2 or tab.dtype != np.int64 or idx.ndim != 1:
            raise ValueError(f"FramePool.gather: expected an int64 table [capacity, k] and rows [n], "
                             f"got {tab.shape} {tab.dtype} and {idx.shape}")
        cdef Py_ssize_t n = idx.shape[0], k = tab.shape[1], cap = tab.shape[0]
        shape = (n, k) + self.frame_shape
        if out is None:
            out = np.empty(shape, self.dtype)
        elif not (isinstance(out, np.ndarray) and out.shape == shape and out.dtype == self.dtype
                  and out.flags.c_contiguous and out.flags.writeable):
            raise ValueError(f"FramePool.gather: out must be a writable C-contiguous {shape} {self.dtype} array")
        cdef const int64_t *r = <const int64_t *> cnp.PyArray_DATA(idx)
        cdef const int64_t *t = <const int64_t *> cnp.PyArray_DATA(tab)
        cdef char *dst = <char *> cnp.PyArray_DATA(out)
        cdef Py_ssize_t j, i, bad = -1, ahead = 4
        cdef Py_ssize_t fb = self.frame_bytes
        cdef int64_t slot
        with nogil:
            for j in range(n):
                if r[j] < 0 or r[j] >= cap:
                    bad = j
                    break
            if bad < 0:
                for j in range(n):
                    if j + ahead < n:
                        # The next rows' slots, then (one row later) their frames: two
                        # dependent misses in flight per row instead of in series.
                        prefetch(t + r[j + ahead] * k)
                        for i in range(k):
                            slot = t[r[j + ahead // 2] * k + i]
                            if 0 <= slot < self._high:
                                prefetch(self._frame(slot))
                    for i in range(k):
                        # Bounds only: tables hold live slots by construction, and a
                        # liveness test here would cost a cache miss per frame.
                        slot = t[r[j] * k + i]
                        if slot < 0 or slot >= self._high:
                            bad = j
                            break
                        memcpy(dst + (j * k + i) * fb, self._frame(slot), fb)
                    if bad >= 0:
                        break
        if bad >= 0:
            raise ValueError(f"FramePool.gather: row {r[bad]} (rows[{bad}]) is out of range [0, {cap}) "
                             "or references a slot the pool never opened")
        return out

    cdef _copy_out(self, cnp.ndarray slots, cnp.ndarray out, str what):
        cdef const int64_t *s = <const int64_t *> cnp.PyArray_DATA(slots)
        cdef char *dst = <char *> cnp.PyArray_DATA(out)
        cdef Py_ssize_t j, n = slots.size, bad = -1
        with nogil:
            for j in range(n):
                if not self._is_live(s[j]):
                    bad = j
                    break
                memcpy(dst + j * self.frame_bytes, self._frame(s[j]), self.frame_bytes)
        if bad >= 0:
            raise ValueError(f"{what}: slot {s[bad]} is not live")


cdef Py_ssize_t _find(const int64_t *sorted_ids, Py_ssize_t n, int64_t x) noexcept nogil:
    """Position of x in a strictly increasing array, or -1."""
    cdef Py_ssize_t lo = 0, hi = n, mid
    while lo < hi:
        mid = (lo + hi) >> 1
        if sorted_ids[mid] < x:
            lo = mid + 1
        else:
            hi = mid
    return lo if lo < n and sorted_ids[lo] == x else -1


cdef class FrameStream:
    """One producer's frames held by a memory host: `FrameStream(pool, window)`.

    window: a power of two, larger than the span of ids (newest - keep_from)
    the producer keeps referencing. See the module docstring for the protocol.
    """
    cdef FramePool _pool
    cdef readonly Py_ssize_t window
    cdef Py_ssize_t _mask
    cdef int64_t *_ids              # id held at each ring position, -1: none
    cdef int64_t *_slots            # its pool slot
    cdef readonly int64_t keep_from
    cdef readonly Py_ssize_t held

    def __cinit__(self, FramePool pool, Py_ssize_t window):
        if window < 1 or window & (window - 1):
            raise ValueError(f"FrameStream: window must be a power of two, got {window}")
        self._pool = pool
        self.window = window
        self._mask = window - 1
        self._ids = <int64_t *> malloc(window * sizeof(int64_t))
        self._slots = <int64_t *> malloc(window * sizeof(int64_t))
        if self._ids == NULL or self._slots == NULL:
            raise MemoryError("FrameStream")
        cdef Py_ssize_t i
        for i in range(window):
            self._ids[i] = -1

    def __dealloc__(self):
        free(self._ids)
        free(self._slots)

    def __repr__(self):
        return f"FrameStream(window={self.window}, held={self.held}, keep_from={self.keep_from})"

    def holds(self, int64_t frame_id):
        """Whether `frame_id` is held (and at or above keep_from)."""
        return frame_id >= self.keep_from and frame_id >= 0 and self._ids[frame_id & self._mask] == frame_id

    def check(self, frames, frame_ids, refs, int64_t keep_from):
        """Raise ValueError if the message (new frames with their ids, the rows'
        references, keep_from) cannot be applied; change nothing."""
        ids = _int64_array(frame_ids, "frame_ids")
        ref = _int64_array(refs, "frame references")
        fr = np.asarray(frames)
        if ids.ndim != 1 or fr.shape != (ids.shape[0],) + self._pool.frame_shape or fr.dtype != self._pool.dtype:
            raise ValueError(f"frames: expected ({ids.shape[0] if ids.ndim == 1 else 'n'}, "
                             f"{', '.join(map(str, self._pool.frame_shape))}) {self._pool.dtype} for "
                             f"frame_ids {ids.shape}, got {fr.shape} {fr.dtype}")
        if keep_from < self.keep_from:
            raise ValueError(f"keep_from {keep_from} is below this stream's {self.keep_from} (it never decreases)")
        cdef const int64_t *f = <const int64_t *> cnp.PyArray_DATA(ids)
        cdef const int64_t *r = <const int64_t *> cnp.PyArray_DATA(ref)
        cdef Py_ssize_t j, nf = ids.shape[0], nr = ref.size, bad = -1
        cdef int what = 0
        cdef int64_t holder
        with nogil:
            for j in range(nf):
                if f[j] < keep_from or (j > 0 and f[j] <= f[j - 1]):
                    what, bad = 1, j
                    break
                holder = self._ids[f[j] & self._mask]
                if holder == f[j]:
                    what, bad = 2, j
                    break
                if holder >= keep_from:
                    what, bad = 3, j
                    break
            if bad < 0 and nf > 0 and f[nf - 1] - f[0] >= self.window:
                what, bad = 4, nf - 1
            if bad < 0:
                for j in range(nr):
                    if r[j] < keep_from:
                        what, bad = 5, j
                        break
                    if self._ids[r[j] & self._mask] != r[j] and _find(f, nf, r[j]) < 0:
                        what, bad = 6, j
                        break
        if what == 1:
            raise ValueError(f"frame_ids must be strictly increasing and >= keep_from {keep_from}; "
                             f"frame_ids[{bad}] = {f[bad]}")
        if what == 2:
            raise ValueError(f"frame id {f[bad]} is already held by this memory")
        if what == 3:
            raise ValueError(f"frame id {f[bad]} would displace held id {self._ids[f[bad] & self._mask]} "
                             f"(window {self.window} too small for keep_from {keep_from})")
        if what == 4:
            raise ValueError(f"frame ids {f[0]}..{f[nf - 1]} span more than the window {self.window}")
        if what == 5:
            raise ValueError(f"frame reference {r[bad]} is below keep_from {keep_from}")
        if what == 6:
            raise ValueError(f"frame reference {r[bad]} is neither held nor sent in this message")
        if not self._pool.can_add(nf):
            raise ValueError(f"{nf} new frames do not fit the frame pool ({len(self._pool)} of "
                             f"{self._pool.max_frames} in use)")

    def admit(self, frames, frame_ids, refs, int64_t keep_from):
        """Apply a message that `check` accepted: release ids below keep_from, store and
        hold the new frames; return the pool slots of `refs` (same shape)."""
        ids = _int64_array(frame_ids, "frame_ids")
        ref = _int64_array(refs, "frame references")
        self._release_below(keep_from)
        slots = self._pool.add(frames) if ids.shape[0] else np.empty(0, np.int64)
        cdef const int64_t *f = <const int64_t *> cnp.PyArray_DATA(ids)
        cdef const int64_t *s = <const int64_t *> cnp.PyArray_DATA(slots)
        cdef Py_ssize_t j, pos, nf = ids.shape[0]
        for j in range(nf):
            pos = f[j] & self._mask
            self._ids[pos] = f[j]
            self._slots[pos] = s[j]
        self.held += nf
        out = np.empty(ref.shape, np.int64)
        cdef int64_t *o = <int64_t *> cnp.PyArray_DATA(out)
        cdef const int64_t *r = <const int64_t *> cnp.PyArray_DATA(ref)
        for j in range(ref.size):
            o[j] = self._slots[r[j] & self._mask]
        return out

    cdef _release_below(self, int64_t keep_from):
        cdef Py_ssize_t pos, n = 0
        cdef int64_t frame_id
        cdef int64_t *drop = <int64_t *> malloc(self.window * sizeof(int64_t))
        if drop == NULL:
            raise MemoryError("FrameStream")
        try:
            if keep_from - self.keep_from >= self.window:
                for pos in range(self.window):
                    if 0 <= self._ids[pos] < keep_from:
                        drop[n] = self._slots[pos]
                        self._ids[pos] = -1
                        n += 1
            else:
                for frame_id in range(self.keep_from, keep_from):
                    pos = frame_id & self._mask
                    if self._ids[pos] == frame_id:
                        drop[n] = self._slots[pos]
                        self._ids[pos] = -1
                        n += 1
            self.keep_from = keep_from
            self.held -= n
            if self._pool._decref(drop, n) < 0:
                raise RuntimeError("FrameStream: a held frame was not live in the pool")
        finally:
            free(drop)

    def release(self):
        """Drop every held frame (the producer is gone); frames rows still reference stay."""
        cdef Py_ssize_t pos, n = 0
        cdef int64_t *drop = <int64_t *> malloc(self.window * sizeof(int64_t))
        if drop == NULL:
            raise MemoryError("FrameStream")
        try:
            for pos in range(self.window):
                if self._ids[pos] >= 0:
                    drop[n] = self._slots[pos]
                    self._ids[pos] = -1
                    n += 1
            self.held = 0
            if self._pool._decref(drop, n) < 0:
                raise RuntimeError("FrameStream: a held frame was not live in the pool")
        finally:
            free(drop)
