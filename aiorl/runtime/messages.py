"""The runtime's messages and what each field may hold, checked where they arrive.

Every control field a role acts on is checked here for type and range
before it is used: a credit with ``beta: -1`` or ``n: 2**62``, a heartbeat
whose counters are strings, a batch whose arrays do not match the replay
spec. A message that fails is the sender's protocol error: `BadMessage`,
which closes that one connection with a logged reason (the sender, if it is
a role of the run, then fails loudly on its side). Fields a receiver does
not use are ignored, so a newer sender may add some.

Schemas are plain dicts ``{field: (checker, required)}``; checkers return
the value to use (ints as int, numbers as float) or raise `BadMessage`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import msgpack
import numpy as np

from aiorl.wire.names import is_peer_name, safe_text

__all__ = ["BadMessage", "check", "RowSpec", "PRIORITY_UPDATE", "SCHEMAS", "MAX_COUNT", "pack_table", "unpack_table"]

#: Upper bound of counters, indices and sizes carried in metadata (msgpack ints reach 2**64).
MAX_COUNT = 2**53
MAX_LIST = 1 << 16  # items in a list field (episode returns of one heartbeat, ...)
MAX_TEXT = 1 << 16  # characters of a free-text field (reasons; a frame header holds 64 KiB anyway)


class BadMessage(ValueError):
    """A peer's message that breaks the runtime's protocol (closes that connection)."""


Checker = Callable[[Any, str], Any]


def integer(lo: int = 0, hi: int = MAX_COUNT) -> Checker:
    def check_int(value, path):
        if type(value) is not int or not lo <= value <= hi:
            raise BadMessage(f"{path} must be an integer in [{lo}, {hi}], got {_show(value)}")
        return value

    return check_int


def number(lo: float = -math.inf, hi: float = math.inf) -> Checker:
    def check_number(value, path):
        if type(value) not in (int, float) or not (math.isfinite(value) and lo <= value <= hi):
            raise BadMessage(f"{path} must be a finite number in [{lo:g}, {hi:g}], got {_show(value)}")
        return float(value)

    return check_number


def boolean(value, path):
    if type(value) is not bool:
        raise BadMessage(f"{path} must be true or false, got {_show(value)}")
    return value


def text(max_len: int = MAX_TEXT) -> Checker:
    def check_text(value, path):
        if type(value) is not str or len(value) > max_len:
            raise BadMessage(f"{path} must be a string of at most {max_len} characters, got {_show(value)}")
        return value

    return check_text


def name(value, path):
    if not is_peer_name(value):
        raise BadMessage(f"{path} must be a name of A-Z a-z 0-9 . _ - characters, got {_show(value)}")
    return value


def nullable(checker: Checker) -> Checker:
    def check_nullable(value, path):
        return None if value is None else checker(value, path)

    return check_nullable


def list_of(checker: Checker, max_len: int = MAX_LIST) -> Checker:
    def check_list(value, path):
        if type(value) is not list or len(value) > max_len:
            raise BadMessage(f"{path} must be a list of at most {max_len} items, got {_show(value)}")
        return [checker(item, f"{path}[{i}]") for i, item in enumerate(value)]

    return check_list


def mapping(key: Checker, value: Checker, max_len: int = 1024) -> Checker:
    def check_map(obj, path):
        if type(obj) is not dict or len(obj) > max_len:
            raise BadMessage(f"{path} must be a map of at most {max_len} entries, got {_show(obj)}")
        return {key(k, f"{path} key"): value(v, f"{path}[{safe_text(k, 40)}]") for k, v in obj.items()}

    return check_map


def address(value, path):
    """``[host, port]``, or ``[host, port, unix_path]`` from a server of a local run."""
    if type(value) is not list or len(value) not in (2, 3):
        raise BadMessage(f"{path} must be [host, port] or [host, port, unix_path], got {_show(value)}")
    checked = [text(255)(value[0], f"{path}[0]"), integer(1, 65535)(value[1], f"{path}[1]")]
    if len(value) == 3:
        checked.append(text(255)(value[2], f"{path}[2]"))
    return checked


def int_pair(value, path):
    """``[a, b]``, two counts (a work item: iteration, item)."""
    if type(value) is not list or len(value) != 2 or any(type(v) is not int or not 0 <= v <= MAX_COUNT for v in value):
        raise BadMessage(f"{path} must be [iteration, item], two counts, got {_show(value)}")
    return value


def gauge(value, path):
    """A metrics value: a number, a flag, None or a short string (never a nested structure)."""
    if value is None or type(value) in (bool, int, float) or (type(value) is str and len(value) <= 256):
        return value
    raise BadMessage(f"{path} must be a number, a flag or a short string, got {_show(value)}")


def any_map(value, path):
    """A free-form map of stats (a role's final account): only its shape is checked."""
    if type(value) is not dict:
        raise BadMessage(f"{path} must be a map, got {_show(value)}")
    return value


_count = integer()


def _evaluation_record(value, path):
    """One evaluation during training (aiorl.runtime.evaluator): gauges, with its return and step."""
    record = mapping(text(64), gauge, 64)(value, path)
    nullable(number())(record.get("return_mean"), f"{path}[return_mean]")
    _count(record.get("learner_steps"), f"{path}[learner_steps]")
    _count(record.get("n"), f"{path}[n]")
    return record


def evaluation(value, path):
    """Learner 0's evaluations: ``{count, skipped, last, best, new}`` (`Evaluator.summary`); ``new``, the
    evaluations not yet acknowledged, oldest first (a learner without it: none but ``last``)."""
    if type(value) is not dict:
        raise BadMessage(f"{path} must be a map, got {_show(value)}")
    return {
        "count": _count(value.get("count"), f"{path}[count]"),
        "skipped": _count(value.get("skipped", 0), f"{path}[skipped]"),
        "last": nullable(_evaluation_record)(value.get("last"), f"{path}[last]"),
        "best": nullable(_evaluation_record)(value.get("best"), f"{path}[best]"),
        "new": nullable(list_of(_evaluation_record, 1024))(value.get("new"), f"{path}[new]"),
    }


_HEARTBEAT = {
    "counters": (mapping(text(64), _count), False),
    "metrics": (mapping(text(64), gauge), False),
    "episode_returns": (list_of(number()), False),
    "episode_lengths": (list_of(_count), False),
    "evaluation": (evaluation, False),
}

#: Messages by kind, as the receiver checks them. Requests and data alike.
SCHEMAS: dict[str, dict[str, tuple[Checker, bool]]] = {
    # role -> coordinator
    "register": {
        "role": (name, True),
        "pid": (nullable(integer(0, 1 << 31)), False),
        "host": (nullable(text(255)), False),
        "config_hash": (text(64), True),
        "address": (nullable(address), False),
        "rendezvous": (nullable(text(300)), False),
        "incarnation": (text(64), False),
        "rejoin": (boolean, False),
    },
    "heartbeat": _HEARTBEAT,
    "done": {**_HEARTBEAT, "stats": (any_map, False)},
    "wait_start": {},
    "publish": {"learner_steps": (_count, False)},
    "get_weights": {"have": (integer(-1), False), "min_version": (nullable(integer(0)), False)},
    "barrier": {"name": (text(64), False), "generation": (_count, True)},
    "fail": {"reason": (text(), False), "fatal": (boolean, False)},
    "stop": {"reason": (text(), False)},
    "status": {},
    "run_state": {"counters": (mapping(text(64), _count), False)},
    "work": {"done": (nullable(int_pair), False)},
    "check_session": {"role": (name, True), "session": (text(64), True)},
    # local launcher -> coordinator (aiorl.runtime.restart.exit_notice): one of its children exited
    "child_exit": {
        "role": (name, True),
        "pid": (integer(1, 1 << 31), True),
        "exit_code": (nullable(integer(0, 255)), False),
        "signal": (nullable(integer(1, 255)), False),
    },
    # actor -> memory
    "attach": {"session": (text(64), True)},
    "batch": {"actor": (_count, False), "seq": (_count, True), "keep_from": (_count, False)},
    "rollout": {
        "actor": (_count, False),
        "iteration": (_count, True),
        "item": (_count, False),
        "weights_version": (integer(-1), False),
    },
    "fragment": {"seq": (_count, True), "weights_version": (_count, True), "keep_from": (_count, False)},
    "actor_done": {"actor": (_count, False), "batches": (_count, False), "transitions": (_count, False)},
    # learner -> memory
    "credit": {
        "n": (integer(1, 1 << 20), False),
        "beta": (number(0.0, 1.0), False),
        "iteration": (_count, False),
        "version": (integer(-1), False),
    },
    "priorities": {"credit": (integer(0, 1 << 20), False), "beta": (number(0.0, 1.0), False)},
    "learner_done": {
        "learner": (_count, False),
        "batches": (_count, False),
        "priority_messages": (_count, False),
        "priorities": (_count, False),
    },
    # coordinator -> role
    "phase": {"phase": (integer(0, 5), True), "reason": (nullable(text()), False)},
    "role_lost": {"role": (name, True), "returns": (boolean, False)},
    "role_back": {"role": (name, True), "iteration": (_count, True)},
    "memories": {"memories": (list_of(nullable(address), 1 << 12), True)},
    "exit": {
        "ok": (boolean, False),
        "role_ok": (boolean, False),
        "reason": (nullable(text()), False),
        "outcome": (nullable(text(32)), False),
        "signal": (nullable(text(32)), False),
    },
}


def check(kind: str, meta: Mapping[str, Any], allowed: frozenset[str] | set[str] | None = None) -> dict:
    """The checked fields of a `kind` message (missing optional fields left out).

    `allowed`: the kinds this receiver takes here; any other is a BadMessage.
    """
    if (allowed is not None and kind not in allowed) or kind not in SCHEMAS:
        expected = f" (expected {', '.join(sorted(allowed))})" if allowed else ""
        raise BadMessage(f"unexpected message {safe_text(kind, 40)!r}{expected}")
    out = {}
    for field, (checker, required) in SCHEMAS[kind].items():
        if field in meta:
            out[field] = checker(meta[field], f"{kind}.{field}")
        elif required:
            raise BadMessage(f"{kind} without its {field!r} field")
    return out


class RowSpec:
    """Checks that a batch holds exactly a spec's fields (plus optional 1-d `extra` ones),
    each ``[n, *row_shape]`` in the spec's dtype, with one n (`rows`), and which of its rows
    hold a value no learner may get, in which fields (`bad_rows`). Built once per spec: the
    checks run for every batch a memory host receives.

    `bounds`: inclusive ``(lo, hi)`` of integer fields that index something (a Discrete action,
    an ES noise index); a learner indexes out of range, or silently reads the wrong slice, with
    anything outside. Every float field must be finite: one NaN reward makes the whole loss NaN.
    """

    def __init__(
        self,
        spec: Mapping[str, tuple[tuple, str]],
        extra: Mapping[str, str] = {},
        bounds: Mapping[str, tuple[int, int]] = {},
    ):
        self.fields = {name: (np.dtype(dtype), tuple(shape)) for name, (shape, dtype) in spec.items()}
        self.fields.update({name: (np.dtype(dtype), ()) for name, dtype in extra.items()})
        self.required = len(spec)
        self.optional = frozenset(extra)
        self.values: dict[str, tuple[int, int] | None] = {  # None: finite
            name: None for name, (dtype, _) in self.fields.items() if dtype.kind == "f"
        }
        for name, (lo, hi) in bounds.items():
            if name in self.fields and self.fields[name][0].kind in "iu":
                self.values[name] = (int(lo), int(hi))

    def bad_rows(self, arrays: Mapping[str, np.ndarray]) -> tuple[np.ndarray, list[str]] | None:
        """A mask of the rows (first axis) holding a non-finite float or an integer out of its
        bounds, and the fields that hold them; None when no row does. Call it on arrays `rows`
        (or the trajectory queue) checked: fields it does not know are ignored."""
        bad = None
        fields = []
        for field, limits in self.values.items():
            array = arrays.get(field)
            if array is None or array.size == 0:
                continue
            # The common case, every row good, costs a min and a max (NaN propagates through both).
            low, high = array.min(), array.max()
            if limits is None:
                if math.isfinite(low) and math.isfinite(high):
                    continue
                rows = ~np.isfinite(array.reshape(len(array), -1)).all(axis=1)
            else:
                if limits[0] <= low and high <= limits[1]:
                    continue
                flat = array.reshape(len(array), -1)
                rows = ((flat < limits[0]) | (flat > limits[1])).any(axis=1)
            bad = rows if bad is None else bad | rows
            fields.append(field)
        return None if bad is None else (bad, fields)

    def rows(self, kind: str, arrays: Mapping[str, np.ndarray]) -> int:
        """The batch's row count n; BadMessage if it does not match."""
        fields = self.fields
        n = -1
        present = 0
        for field, array in arrays.items():
            expected = fields.get(field)
            if expected is None:
                self._mismatch(kind, arrays)
            dtype, tail = expected
            shape = array.shape
            if array.dtype != dtype or shape[1:] != tail or len(shape) != len(tail) + 1:
                raise BadMessage(
                    f"{kind}.{field} is {array.dtype}{list(shape)}, the spec says "
                    f"{dtype}[n, {', '.join(map(str, tail))}]"
                )
            if n < 0:
                n = shape[0]
            elif shape[0] != n:
                raise BadMessage(f"{kind}.{field} has {shape[0]} rows, other fields have {n}")
            if field not in self.optional:
                present += 1
        if present != self.required:
            self._mismatch(kind, arrays)
        return max(n, 0)

    def _mismatch(self, kind: str, arrays) -> None:
        names = set(arrays)
        required = set(self.fields) - self.optional
        raise BadMessage(
            f"{kind} fields do not match the replay spec: missing {sorted(required - names)}, "
            f"unexpected {sorted(safe_text(n, 40) for n in names - set(self.fields))}"
        )


#: A learner's priority update: int64 indices, float64 priorities, optional uint64 generations.
PRIORITY_UPDATE = RowSpec({"indices": ((), "<i8"), "priorities": ((), "<f8")}, extra={"generations": "<u8"})


def _show(value: Any) -> str:
    return safe_text(repr(value), 80)


def pack_table(obj: Any) -> np.ndarray:
    """`obj` as msgpack bytes in a uint8 array: metadata that grows with the cluster (the status
    reply's roles table) travels as a payload, since a frame header holds 64 KiB at most."""
    return np.frombuffer(msgpack.packb(obj, use_bin_type=True), np.uint8)


def unpack_table(array: np.ndarray) -> Any:
    """What `pack_table` packed; BadMessage for anything else (plain msgpack only, no extensions)."""
    if not isinstance(array, np.ndarray) or array.dtype != np.uint8 or array.ndim != 1:
        raise BadMessage(f"a packed table must be uint8[n], got {_show(getattr(array, 'dtype', array))}")
    try:
        return msgpack.unpackb(array.tobytes(), raw=False, strict_map_key=True, max_ext_len=0)
    except (ValueError, msgpack.UnpackException) as exc:
        raise BadMessage(f"a packed table is not msgpack: {_show(exc)}") from None
