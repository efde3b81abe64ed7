# cython: language_level=3
"""Frames stored once: a reference-counted frame pool and per-producer frame-id maps.

A frame-stacked observation (k frames of shape F) is kept as k references
into a `FramePool`, so a frame shared by consecutive stacks, and by a
transition's obs and next_obs, is stored once.

FramePool: slots of one frame each, in blocks allocated as the pool grows
(``block_frames`` slots per block, a power of two: slot s lives in block
s >> shift at row s & mask), handed out in runs of ``run_frames``
consecutive slots. Every slot has a reference count; `add` hands out slots
with count 1 (the caller's reference), `incref` / `decref` move counts. A
frame added after its stream's previous frame takes the next slot of that
run when it can, so stacks read contiguous memory (see `FramePool`); a run
whose frames all reached count 0 goes onto a LIFO free list, which is used
before fresh runs (fresh runs in increasing order). So the pool touches
about as many pages as frames were ever live at once. The numpy oracle
`aiorl.replay.reference.FramePool` follows the same discipline, slot for slot.

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
from libc.stdlib cimport free, malloc
from libc.string cimport memcpy

from aiorl._ext._common cimport int64_t, prefetch
from aiorl._ext._checks cimport as_contiguous

cnp.import_array()

# Bytes a pool block aims at: large enough that blocks are few, small enough
# that a small buffer does not reserve much address space.
cdef Py_ssize_t _BLOCK_BYTES = 32 << 20
cdef enum:
    _MAX_ROW_FRAMES = 64
# Rows ahead whose frames a gather prefetches (their table rows: twice as far ahead).
cdef Py_ssize_t _AHEAD = 2


cdef object _int64_array(object x, str what):
    """A C-contiguous int64 array of any shape (any integer dtype)."""
    arr = np.asarray(x)
    if arr.dtype.kind not in "iu" and not (arr.size == 0 and arr.dtype.kind == "f"):
        raise ValueError(f"{what}: expected integers, got {arr.dtype}")
    return np.ascontiguousarray(arr, dtype=np.int64)


cdef class FramePool:
    """Reference-counted frame slots: `FramePool(frame_shape, dtype, max_frames, block_frames=0, run_frames=16)`.

    At most max_frames frames are live at once. Slots come in runs of
    ``run_frames`` consecutive slots (a power of two, at most block_frames),
    and a frame added `after` a live slot takes the next slot of that run when
    it is still unused: a stream's consecutive frames end up side by side, so a
    stacked observation (and the next one, which shares all but one frame) is
    one contiguous read, as in a row that stores its stack. A frame with no
    predecessor, or whose predecessor's run cannot take it, goes to the pool's
    open "tail" run, or to a run of its own while runs are plentiful. A run
    is freed (LIFO) when its last live frame is; a reused run fills from its
    start again. block_frames 0 picks a power of two near 32 MiB of frames.
    `len(pool)` is the number of live frames.
    """
    cdef readonly tuple frame_shape
    cdef readonly object dtype
    cdef readonly Py_ssize_t frame_bytes
    cdef readonly Py_ssize_t max_frames
    cdef readonly Py_ssize_t block_frames
    cdef readonly Py_ssize_t run_frames
    cdef int _shift
    cdef Py_ssize_t _mask
    cdef int _run_shift
    cdef list _blocks               # uint8 arrays, block_frames * frame_bytes each (kept alive)
    cdef list _counts               # int32 arrays, block_frames each
    cdef char **_data
    cdef int32_t **_refs
    cdef Py_ssize_t _nblocks
    cdef Py_ssize_t _max_blocks
    cdef Py_ssize_t _max_runs
    cdef int32_t *_fill             # per run: slots used from its start
    cdef int32_t *_run_live         # per run: live frames in it
    cdef int64_t *_free_runs
    cdef Py_ssize_t _nfree_runs
    cdef Py_ssize_t _high_runs      # runs ever opened: slots [0, _high_runs * run_frames) exist
    cdef int64_t _tail
    cdef Py_ssize_t _live

    def __cinit__(self, frame_shape, dtype, Py_ssize_t max_frames, Py_ssize_t block_frames=0,
                  Py_ssize_t run_frames=16):
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
        if run_frames < 1 or run_frames & (run_frames - 1):
            raise ValueError(f"FramePool: run_frames must be a power of two, got {run_frames}")
        self.frame_shape = shape
        self.dtype = dt.newbyteorder("=")
        self.frame_bytes = dt.itemsize * int(np.prod(shape, dtype=np.int64))
        self.max_frames = max_frames
        # Slots: twice the live frames (runs left part-used) and a run of slack.
        cdef Py_ssize_t slot_limit = 2 * max_frames + 2 * run_frames
        cdef Py_ssize_t want = block_frames if block_frames > 0 else max(1, _BLOCK_BYTES // self.frame_bytes)
        want = max(want, run_frames)
        cdef Py_ssize_t bf = 1
        cdef int shift = 0
        while bf < want and (bf < slot_limit or bf < run_frames):
            bf <<= 1
            shift += 1
        self.block_frames = bf
        self.run_frames = run_frames
        self._shift = shift
        self._mask = bf - 1
        self._run_shift = 0
        while (1 << self._run_shift) < run_frames:
            self._run_shift += 1
        self._max_blocks = (slot_limit + bf - 1) // bf
        self._max_runs = self._max_blocks * (bf // run_frames)
        self._blocks = []
        self._counts = []
        self._data = <char **> malloc(self._max_blocks * sizeof(char *))
        self._refs = <int32_t **> malloc(self._max_blocks * sizeof(int32_t *))
        self._fill = <int32_t *> malloc(self._max_runs * sizeof(int32_t))
        self._run_live = <int32_t *> malloc(self._max_runs * sizeof(int32_t))
        self._free_runs = <int64_t *> malloc(self._max_runs * sizeof(int64_t))
        if not (self._data and self._refs and self._fill and self._run_live and self._free_runs):
            raise MemoryError("FramePool")
        self._tail = -1

    def __dealloc__(self):
        free(self._data)
        free(self._refs)
        free(self._fill)
        free(self._run_live)
        free(self._free_runs)

    def __len__(self):
        return self._live

    def __repr__(self):
        return (f"FramePool(frame_shape={self.frame_shape}, dtype={self.dtype}, live={self._live}, "
                f"slots={self.slots}, free_runs={self._nfree_runs}, max_frames={self.max_frames})")

    @property
    def slots(self):
        """Slots ever opened (live, free or not yet used): what the pool's memory spans."""
        return self._high_runs * self.run_frames

    @property
    def free_runs(self):
        return self._nfree_runs

    @property
    def allocated_bytes(self):
        """Bytes of frame storage reserved (touched only as slots are used)."""
        return self._nblocks * self.block_frames * self.frame_bytes

    cdef inline char *_frame(self, int64_t slot) noexcept nogil:
        return self._data[slot >> self._shift] + (slot & self._mask) * self.frame_bytes

    cdef inline int32_t *_count(self, int64_t slot) noexcept nogil:
        return self._refs[slot >> self._shift] + (slot & self._mask)

    cdef inline bint _is_live(self, int64_t slot) noexcept nogil:
        return 0 <= slot < self._high_runs * self.run_frames and self._count(slot)[0] > 0

    cdef inline Py_ssize_t _runs_available(self) noexcept nogil:
        return self._nfree_runs + self._max_runs - self._high_runs

    cdef int _open_block(self) except -1:
        block = np.empty(self.block_frames * self.frame_bytes, np.uint8)
        counts = np.zeros(self.block_frames, np.int32)
        self._blocks.append(block)
        self._counts.append(counts)
        self._data[self._nblocks] = <char *> cnp.PyArray_DATA(block)
        self._refs[self._nblocks] = <int32_t *> cnp.PyArray_DATA(counts)
        self._nblocks += 1
        return 0

    cdef int64_t _open_run(self) noexcept nogil:
        """A free run (the last freed first) or a fresh one; -1 if none is left."""
        cdef int64_t run
        if self._nfree_runs > 0:
            self._nfree_runs -= 1
            run = self._free_runs[self._nfree_runs]
        elif self._high_runs < self._max_runs:
            run = self._high_runs
            self._high_runs += 1
        else:
            return -1
        self._fill[run] = 0
        self._run_live[run] = 0
        return run

    cdef inline int64_t _place(self, int64_t run) noexcept nogil:
        cdef int64_t slot = (run << self._run_shift) + self._fill[run]
        self._fill[run] += 1
        self._run_live[run] += 1
        return slot

    cdef int64_t _take_slot(self, int64_t after, Py_ssize_t remaining) noexcept nogil:
        """The slot for a new frame following slot `after` (-1: none); -1 if the pool is full.

        `remaining`: frames still to place in this call, whose packed placement
        must stay possible: a run of its own is opened only while that holds."""
        cdef int64_t run, pos
        if after >= 0 and self._is_live(after):
            run = after >> self._run_shift
            pos = after & (self.run_frames - 1)
            if pos + 1 < self.run_frames and self._fill[run] == pos + 1:
                return self._place(run)
            if self._runs_available() > remaining // self.run_frames + 2:
                return self._place(self._open_run())
        if self._tail < 0 or self._fill[self._tail] == self.run_frames:
            self._tail = self._open_run()
            if self._tail < 0:
                return -1
        return self._place(self._tail)

    cdef int _release(self, int64_t slot) noexcept nogil:
        """The slot's count reached 0: its run is freed once all its frames are."""
        cdef int64_t run = slot >> self._run_shift
        self._run_live[run] -= 1
        if self._run_live[run] == 0:
            self._free_runs[self._nfree_runs] = run
            self._nfree_runs += 1
            if self._tail == run:
                self._tail = -1
        return 0

    def can_add(self, Py_ssize_t n):
        """Whether `n` more frames fit: under max_frames, and packed into the runs left."""
        return self._live + n <= self.max_frames and (n + self.run_frames - 1) // self.run_frames + 1 <= \
            self._runs_available()

    def add(self, frames, after=None):
        """Store frames [n, *frame_shape]; returns their n new slots (int64), each with count 1.

        after: None, or for each frame the slot of the frame it follows in its
        stream (-1: none; -2 - i: the i-th frame of this call), which decides
        where it goes (see the class docstring).
        """
        arr = as_contiguous(frames)
        if arr.shape[1:] != self.frame_shape or arr.dtype != self.dtype:
            raise ValueError(f"FramePool.add: expected frames (n, {', '.join(map(str, self.frame_shape))}) "
                             f"{self.dtype}, got {arr.shape} {arr.dtype}")
        cdef Py_ssize_t n = arr.shape[0]
        prev = np.full(n, -1, np.int64) if after is None else _int64_array(after, "FramePool.add after")
        if prev.shape != (n,) or (n and (prev < -1 - np.arange(n)).any()):
            raise ValueError(f"FramePool.add: after must have one entry per frame ({n}): a slot, -1, or "
                             f"-2 - i for the i-th frame of this call (i before it), got {prev}")
        if not self.can_add(n):
            raise MemoryError(f"FramePool: {n} new frames do not fit ({self._live} of {self.max_frames} live, "
                              f"{self._runs_available()} runs of {self.run_frames} left)")
        # Blocks for every run this call could open (opened ahead; untouched memory until used).
        while self._nblocks * self.block_frames < min(self._high_runs + n + 1, self._max_runs) * self.run_frames:
            self._open_block()
        slots = np.empty(n, np.int64)
        cdef int64_t *out = <int64_t *> cnp.PyArray_DATA(slots)
        cdef const int64_t *a = <const int64_t *> cnp.PyArray_DATA(prev)
        cdef const char *src = <const char *> cnp.PyArray_DATA(arr)
        cdef Py_ssize_t j
        cdef int64_t slot
        with nogil:
            for j in range(n):
                slot = self._take_slot(a[j] if a[j] >= -1 else out[-2 - a[j]], n - j)
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

    cdef Py_ssize_t _decref(self, const int64_t *s, Py_ssize_t n) noexcept nogil:
        """Returns 0, or -1 when a slot was not live (the ones before it were applied)."""
        cdef Py_ssize_t j
        for j in range(n):
            if not self._is_live(s[j]):
                return -1
            self._count(s[j])[0] -= 1
            if self._count(s[j])[0] == 0:
                self._live -= 1
                self._release(s[j])
        return 0

    def refcount(self, slots):
        """Reference counts of `slots` (int32, same shape; 0 for a free slot)."""
        arr = _int64_array(slots, "FramePool.refcount slots")
        out = np.zeros(arr.shape, np.int32)
        flat_in, flat_out = arr.reshape(-1), out.reshape(-1)
        for j in range(arr.size):
            slot = int(flat_in[j])
            if not 0 <= slot < self._high_runs * self.run_frames:
                raise ValueError(f"FramePool.refcount: slot {slot} was never opened")
            flat_out[j] = self._count(slot)[0]
        return out

    def take(self, slots):
        """Copies of the frames in `slots` (any shape S): an array (*S, *frame_shape)."""
        arr = _int64_array(slots, "FramePool.take slots")
        out = np.empty(arr.shape + self.frame_shape, self.dtype)
        self._copy_out(arr, out, "FramePool.take")
        return out

    def gather(self, tables, rows, outs=None):
        """Stacks of sampled rows from one or more tables: outs[f][j] = the frames of
        tables[f][rows[j]], each of shape (len(rows), k, *frame_shape).

        tables: a sequence of int64 [capacity, k] tables of live slots (all the same
        shape); rows: indices into them; outs: None, or one C-contiguous array of
        that shape and the pool's dtype per table to write into. Returns the list
        of outs.
        """
        tabs = [as_contiguous(a) for a in tables]
        idx = _int64_array(rows, "FramePool.gather rows")
        if (not tabs or idx.ndim != 1
                or any(a.ndim != 2 or a.dtype != np.int64 or a.shape != tabs[0].shape for a in tabs)):
            raise ValueError(f"FramePool.gather: expected int64 tables [capacity, k] of one shape and rows [n], "
                             f"got {[(a.shape, a.dtype) for a in tabs]} and {idx.shape}")
        cdef Py_ssize_t n = idx.shape[0], k = tabs[0].shape[1], cap = tabs[0].shape[0]
        cdef int f, ntab = len(tabs)
        if ntab * k > _MAX_ROW_FRAMES:
            raise ValueError(f"FramePool.gather: {ntab} tables of {k} frames: more than {_MAX_ROW_FRAMES} per row")
        shape = (n, k) + self.frame_shape
        if outs is None:
            outs = [np.empty(shape, self.dtype) for _ in tabs]
        outs = list(outs)
        if len(outs) != ntab or not all(isinstance(o, np.ndarray) and o.shape == shape and o.dtype == self.dtype
                                        and o.flags.c_contiguous and o.flags.writeable for o in outs):
            raise ValueError(f"FramePool.gather: outs must be {ntab} writable C-contiguous {shape} {self.dtype} arrays")
        cdef const int64_t *tab_ptr[_MAX_ROW_FRAMES]
        cdef char *dst[_MAX_ROW_FRAMES]
        for f in range(ntab):
            tab_ptr[f] = <const int64_t *> cnp.PyArray_DATA(tabs[f])
            dst[f] = <char *> cnp.PyArray_DATA(outs[f])
        cdef const int64_t *r = <const int64_t *> cnp.PyArray_DATA(idx)
        cdef Py_ssize_t bad = -1
        with nogil:
            bad = self._gather(tab_ptr, dst, ntab, k, cap, r, n)
        if bad >= 0:
            raise ValueError(f"FramePool.gather: row {r[bad]} (rows[{bad}]) is out of range [0, {cap}) "
                             "or references a slot the pool never opened")
        return outs

    cdef Py_ssize_t _gather(self, const int64_t **t, char **dst, int ntab, Py_ssize_t k, Py_ssize_t cap,
                            const int64_t *r, Py_ssize_t n) noexcept nogil:
        """The gather loop; returns -1, or the first bad row's position.

        One pass over the rows for every table: a row's frames (obs and next_obs
        share all but a few, side by side in the pool) are read together, while
        the frames of a row `_AHEAD` further and the table rows twice as far are
        being prefetched: dependent misses in flight instead of in series.
        """
        cdef Py_ssize_t j, i
        cdef Py_ssize_t fb = self.frame_bytes, slots = self._high_runs * self.run_frames
        cdef int f
        cdef int64_t slot
        for j in range(n):
            if r[j] < 0 or r[j] >= cap:
                return j
        for j in range(n):
            if j + 2 * _AHEAD < n:
                for f in range(ntab):
                    prefetch(t[f] + r[j + 2 * _AHEAD] * k)
            if j + _AHEAD < n:
                for f in range(ntab):
                    for i in range(k):
                        slot = t[f][r[j + _AHEAD] * k + i]
                        if 0 <= slot < slots:
                            prefetch(self._frame(slot))
            for f in range(ntab):
                for i in range(k):
                    # Bounds only: tables hold live slots by construction, and a
                    # liveness test here would cost a cache miss per frame.
                    slot = t[f][r[j] * k + i]
                    if slot < 0 or slot >= slots:
                        return j
                    memcpy(dst[f] + (j * k + i) * fb, self._frame(slot), fb)
        return -1

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
    """One producer's frames held by a memory host: `FrameStream(pool, window, stack=1)`.

    window: a power of two, larger than the span of ids (newest - keep_from)
    the producer keeps referencing. References come in stacks of `stack` ids,
    oldest first: a new frame is stored after the one before it in a stack.
    See the module docstring for the protocol.
    """
    cdef FramePool _pool
    cdef readonly Py_ssize_t window
    cdef readonly Py_ssize_t stack
    cdef Py_ssize_t _mask
    cdef int64_t *_ids              # id held at each ring position, -1: none
    cdef int64_t *_slots            # its pool slot
    cdef readonly int64_t keep_from
    cdef readonly Py_ssize_t held

    def __cinit__(self, FramePool pool, Py_ssize_t window, Py_ssize_t stack=1):
        if window < 1 or window & (window - 1):
            raise ValueError(f"FrameStream: window must be a power of two, got {window}")
        if stack < 1:
            raise ValueError(f"FrameStream: stack must be >= 1, got {stack}")
        self.stack = stack
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
        after = self._predecessors(ids, ref)
        self._release_below(keep_from)
        slots = self._pool.add(frames, after) if ids.shape[0] else np.empty(0, np.int64)
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

    cdef object _predecessors(self, cnp.ndarray ids, cnp.ndarray refs):
        """For each new frame, what `FramePool.add` takes as `after`: the frame before it
        in one of the message's stacks (new in this message, or held), or -1."""
        cdef Py_ssize_t nf = ids.shape[0], k = self.stack, nstacks = refs.size // self.stack
        out = np.full(nf, -1, np.int64)
        cdef int64_t *a = <int64_t *> cnp.PyArray_DATA(out)
        cdef const int64_t *f = <const int64_t *> cnp.PyArray_DATA(ids)
        cdef const int64_t *r = <const int64_t *> cnp.PyArray_DATA(refs)
        cdef Py_ssize_t st, i, p, q
        cdef int64_t x, y
        with nogil:
            for st in range(nstacks):
                for i in range(1, k):
                    x, y = r[st * k + i], r[st * k + i - 1]
                    if x == y:
                        continue
                    p = _find(f, nf, x)
                    if p < 0:
                        continue
                    q = _find(f, nf, y)
                    if 0 <= q < p:
                        a[p] = -2 - q
                    elif q < 0 and y >= 0 and self._ids[y & self._mask] == y:
                        a[p] = self._slots[y & self._mask]
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
