# cython: language_level=3
"""The aggregate buffer of synchronous agents: one part per producer per round."""

import numpy as np

from aiorl._ext._fields import (SNAPSHOT_FORMAT, SNAPSHOT_VERSION, _check_same, _load_npz, _meta_array, _read_meta,
                                _save_npz, _spec_json)

cimport numpy as cnp

from aiorl._ext._fields cimport _Fields

cnp.import_array()


cdef class AggregateBuffer:
    """One part per producer per round, for synchronous agents: `AggregateBuffer(num_parts, spec)`.

    `add(producer_id, batch)` keeps a copy of the producer's part (any number
    of rows); a second part from the same producer in one round is an error.
    `complete` is true once every live producer has delivered; `take()` then
    returns the parts concatenated in producer-id order (new arrays) and
    starts the next round. `drop(producer_id)` stops waiting for a producer
    (its actor died); a part it already delivered this round is kept.
    """
    cdef readonly int num_parts
    cdef _Fields _fields
    cdef list _parts
    cdef set _dropped

    def __cinit__(self, int num_parts, spec):
        if num_parts < 1:
            raise ValueError(f"AggregateBuffer: num_parts must be >= 1, got {num_parts}")
        self.num_parts = num_parts
        self._fields = _Fields(spec, "AggregateBuffer")
        self._parts = [None] * num_parts
        self._dropped = set()

    def __repr__(self):
        return (f"AggregateBuffer(num_parts={self.num_parts}, received={self.received}, "
                f"missing={self.missing}, dropped={sorted(self._dropped)})")

    def __len__(self):
        """Rows received this round."""
        return sum(len(part[0]) for part in self._parts if part is not None)

    @property
    def spec(self):
        return self._fields.as_spec()

    @property
    def received(self):
        """Producer ids whose part arrived this round."""
        return [i for i, part in enumerate(self._parts) if part is not None]

    @property
    def missing(self):
        """Live producer ids still owing a part this round."""
        return [i for i, part in enumerate(self._parts) if part is None and i not in self._dropped]

    @property
    def live(self):
        """Producer ids not dropped."""
        return [i for i in range(self.num_parts) if i not in self._dropped]

    @property
    def complete(self):
        """Every live producer delivered, and at least one part is here."""
        return not self.missing and bool(self.received)

    cdef int _check_id(self, producer_id, str what) except -1:
        if not isinstance(producer_id, (int, np.integer)) or not 0 <= producer_id < self.num_parts:
            raise ValueError(f"{what}: producer id {producer_id!r} is out of range [0, {self.num_parts})")
        return 0

    def add(self, producer_id, batch):
        """Store producer `producer_id`'s part for this round (copied)."""
        what = "AggregateBuffer.add"
        self._check_id(producer_id, what)
        if producer_id in self._dropped:
            raise ValueError(f"{what}: producer {producer_id} was dropped; revive() it first")
        if self._parts[producer_id] is not None:
            raise ValueError(f"{what}: producer {producer_id} already delivered its part this round "
                             f"(received {self.received}, missing {self.missing})")
        cdef Py_ssize_t n
        arrays = self._fields.coerce(batch, f"{what} (producer {producer_id})", &n)
        self._parts[producer_id] = [np.array(arr, copy=True) for arr in arrays]

    def drop(self, producer_id):
        """Stop waiting for `producer_id` in this and later rounds."""
        self._check_id(producer_id, "AggregateBuffer.drop")
        self._dropped.add(int(producer_id))

    def revive(self, producer_id):
        """Expect `producer_id` again (from this round on)."""
        self._check_id(producer_id, "AggregateBuffer.revive")
        self._dropped.discard(int(producer_id))

    def take(self):
        """The round's parts concatenated in producer-id order (new arrays); starts the next round."""
        if not self.complete:
            raise ValueError(f"AggregateBuffer.take: round incomplete: missing producers {self.missing} "
                             f"(received {self.received})")
        parts = [part for part in self._parts if part is not None]
        out = {}
        for f, name in enumerate(self._fields.names):
            out[name] = parts[0][f] if len(parts) == 1 else np.concatenate([part[f] for part in parts])
        self._parts = [None] * self.num_parts
        return out

    def state_dict(self):
        """{"meta": uint8 JSON (format, version, kind, num_parts, spec, received, dropped),
        "part.<id>.<field>": array} (no pickle)."""
        meta = {"format": SNAPSHOT_FORMAT, "version": SNAPSHOT_VERSION, "kind": "AggregateBuffer",
                "num_parts": self.num_parts, "spec": _spec_json(self._fields),
                "received": self.received, "dropped": sorted(self._dropped)}
        state = {"meta": _meta_array(meta)}
        for i in self.received:
            for name, arr in zip(self._fields.names, self._parts[i]):
                state[f"part.{i}.{name}"] = arr
        return state

    def load_state_dict(self, state):
        what = "AggregateBuffer.load_state_dict"
        cdef Py_ssize_t n
        meta = _read_meta(state, what)
        _check_same(what, "kind", "AggregateBuffer", meta.get("kind"))
        _check_same(what, "num_parts", self.num_parts, meta.get("num_parts"))
        _check_same(what, "spec", _spec_json(self._fields), meta.get("spec"))
        parts = [None] * self.num_parts
        for i in meta["received"]:
            self._check_id(i, what)
            batch = {name: state.get(f"part.{i}.{name}") for name in self._fields.names}
            if any(v is None for v in batch.values()):
                raise ValueError(f"{what}: snapshot lacks arrays of producer {i}")
            parts[i] = [np.array(arr, copy=True) for arr in self._fields.coerce(batch, what, &n)]
        for i in meta["dropped"]:
            self._check_id(i, what)
        self._parts = parts
        self._dropped = set(meta["dropped"])

    def save(self, path):
        """Write `state_dict()` to `path` as an .npz archive (no pickle; replaced atomically)."""
        _save_npz(self.state_dict(), path)

    def load(self, path):
        """Restore from a file written by `save` (read with allow_pickle=False)."""
        self.load_state_dict(_load_npz(path))
