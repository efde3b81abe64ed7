"""Frame format: a fixed struct, a msgpack header, raw array payloads.

A frame on the wire is::

    fixed header  32 bytes, little-endian  (see ``FIXED`` below)
    schema        ``schema_len`` bytes: msgpack ``[kind, [[name, dtype, shape, offset, nbytes], ...]]``
    meta          ``meta_len`` bytes: msgpack map of small metadata
    payload       ``payload_len`` bytes: the arrays, each at its ``offset``

Offsets are canonical: the first array starts at 0 and each next one at the
end of the previous rounded up to 8 bytes, so every ``np.frombuffer`` view of a
received frame is aligned and arrays can never overlap. The payload ends with
the last array (no trailing padding). A receiver checks every length in the
fixed header against its :class:`Limits` before it allocates anything, and
checks the schema (dtype whitelist, ``prod(shape) * itemsize == nbytes``,
canonical offsets, total == ``payload_len``) before it allocates the payload.

The schema depends only on the message kind and the arrays' names, dtypes and
shapes, which repeat from message to message in a stream (every batch of an
actor has the same layout). Both ends therefore cache it: the sender keeps the
packed bytes per layout, the receiver the validated layout per schema bytes,
so the steady-state per-message cost is one struct pack/unpack, one small
msgpack map, and the array views.

Nothing here unpickles, evals or imports anything named by the peer: dtypes are
looked up in a fixed table, metadata is plain msgpack without extension types.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import msgpack
import numpy as np

from aiorl._ext.wire import array_views, join_small_frame

from .errors import ProtocolError

__all__ = [
    "PROTOCOL_VERSION",
    "MAGIC",
    "FIXED",
    "FIXED_SIZE",
    "FrameType",
    "Limits",
    "Encoder",
    "Decoder",
    "Layout",
    "ALLOWED_DTYPES",
]

#: Bumped on any incompatible change of the frame format or the handshake
#: (2: the connecting side proves first, see aiorl.wire.auth).
PROTOCOL_VERSION = 2

MAGIC = b"aiRL"

#: magic, version, frame type, flags, schema_len, meta_len, payload_len, request_id
FIXED = struct.Struct("<4sBBHIIQQ")
FIXED_SIZE = FIXED.size  # 32

#: Handshake frames are meta-only and tiny; an unauthenticated peer gets no more.
HANDSHAKE_MAX_HEADER_BYTES = 4096

#: Frames whose meta is this single byte (an empty msgpack map) skip msgpack.
_EMPTY_MAP = b"\x80"

_ALIGN = 8
_PADS = tuple(bytes(n) for n in range(_ALIGN))

#: Above this many bytes an array goes to the transport as its own memoryview
#: (zero-copy); smaller arrays are joined with the header into one buffer, which
#: is cheaper than handing many tiny buffers to writev.
ZERO_COPY_MIN_BYTES = 32 * 1024

# Caches are bounded so a peer that sends ever-new layouts cannot grow memory.
_CACHE_MAX = 512


class FrameType:
    """Values of the fixed header's frame type byte."""

    HELLO = 1  # handshake: the client's name and nonce
    AUTH = 2  # handshake: the client's MAC
    WELCOME = 3  # handshake: the server accepted the client, with the server's MAC
    REJECT = 4  # handshake: refused, with a reason
    CHALLENGE = 5  # handshake: the server's name and nonce
    DATA = 16  # a streamed data message
    REQUEST = 17  # a message that expects a reply (request_id != 0)
    RESPONSE = 18  # the reply to request_id
    ERROR = 19  # an error reply to request_id (meta: reason)

    HANDSHAKE = frozenset({HELLO, AUTH, WELCOME, REJECT, CHALLENGE})
    MESSAGES = frozenset({DATA, REQUEST, RESPONSE, ERROR})


# The whitelist: wire name -> dtype. Wire names are numpy's ``dtype.str``
# (explicit little-endian), so an array's dtype needs no translation on
# little-endian hosts. Never object, str, void or datetime.
ALLOWED_DTYPES: dict[str, np.dtype] = {
    np.dtype(t).newbyteorder("<").str: np.dtype(t).newbyteorder("<")
    for t in (
        np.bool_,
        np.int8,
        np.int16,
        np.int32,
        np.int64,
        np.uint8,
        np.uint16,
        np.uint32,
        np.uint64,
        np.float16,
        np.float32,
        np.float64,
    )
}
_WIRE_NAME: dict[np.dtype, str] = {dt: name for name, dt in ALLOWED_DTYPES.items()}


@dataclass(frozen=True, slots=True)
class Limits:
    """Caps a receiver enforces before it allocates, and the sender's write buffer.

    A connection's limits are what that side accepts (``Connection.set_limits``
    can change them once the peer is known); a frame over them closes the
    connection with a logged reason. Senders are held only to the defaults
    and to the shared ``max_header_bytes``.
    """

    max_header_bytes: int = 64 * 1024
    """Largest schema + meta (the msgpack part of a frame)."""
    max_payload_bytes: int = 1 << 30
    """Largest array payload of one frame (1 GiB)."""
    max_arrays: int = 256
    """Most arrays in one message."""
    max_ndim: int = 16
    """Most dimensions of one array."""
    max_name_bytes: int = 256
    """Longest message kind or array name (UTF-8 bytes)."""
    write_buffer_high_bytes: int = 4 << 20
    """send() waits (drain) while the transport holds more than this (uvloop and TLS
    transports; the stock loop's plain socket transport is fed in 256 KiB pieces)."""
    write_buffer_low_bytes: int = 1 << 20
    """...until it is back under this."""

    def __post_init__(self) -> None:
        for name in (
            "max_header_bytes",
            "max_payload_bytes",
            "max_arrays",
            "max_ndim",
            "max_name_bytes",
            "write_buffer_high_bytes",
        ):
            value = getattr(self, name)
            if type(value) is not int or value < 1:
                raise ValueError(f"Limits.{name} must be a positive int, got {value!r}")
        if self.max_header_bytes > 0xFFFFFFFF:
            raise ValueError(f"Limits.max_header_bytes must fit in 32 bits, got {self.max_header_bytes}")
        if not 0 <= self.write_buffer_low_bytes <= self.write_buffer_high_bytes:
            raise ValueError(
                "Limits.write_buffer_low_bytes must be in [0, write_buffer_high_bytes], "
                f"got low={self.write_buffer_low_bytes} high={self.write_buffer_high_bytes}"
            )


def _align(n: int) -> int:
    return (n + _ALIGN - 1) & ~(_ALIGN - 1)


def _meta_default(obj: Any) -> Any:
    # numpy scalars (np.float32(0.5), np.int64(3)) are common in metadata.
    if isinstance(obj, np.generic) and not isinstance(obj, (np.void, np.object_)):
        return obj.item()
    if isinstance(obj, np.ndarray):
        raise TypeError("numpy arrays belong in arrays=, not in meta")
    raise TypeError(f"meta values must be None/bool/int/float/str/bytes/list/dict, got {type(obj).__name__}")


# One frame's array layout: (name, dtype, shape, offset) per array, + payload size.
Layout = tuple[tuple[tuple[str, np.dtype, tuple[int, ...], int], ...], int]


class _Plan:
    """How to write one layout: cached per (kind, names, dtypes, shapes, strides)."""

    __slots__ = ("schema", "payload_len", "pads", "zero_copy")

    def __init__(self, schema: bytes, payload_len: int, pads: tuple[bytes, ...], zero_copy: tuple[bool, ...]):
        self.schema = schema
        self.payload_len = payload_len
        self.pads = pads  # zero bytes to write before each array (alignment)
        self.zero_copy = zero_copy if any(zero_copy) else None  # None: the whole frame is one buffer


class Encoder:
    """Turns (kind, meta, arrays) into a list of buffers for ``transport.writelines``."""

    __slots__ = ("_limits", "_version", "_packer", "_plans", "_last")

    def __init__(self, limits: Limits, version: int = PROTOCOL_VERSION) -> None:
        self._limits = limits
        self._version = version
        self._packer = msgpack.Packer(default=_meta_default, use_bin_type=True)
        self._plans: dict[Any, _Plan] = {}
        # kind -> (((name, dtype, shape), ...), plan) of its last message
        self._last: dict[str, tuple] = {}

    def handshake(self, ftype: int, meta: Mapping[str, Any]) -> bytes:
        """A meta-only handshake frame."""
        meta_bytes = self._packer.pack(meta)
        return FIXED.pack(MAGIC, self._version, ftype, 0, 0, len(meta_bytes), 0, 0) + meta_bytes

    def encode(
        self,
        ftype: int,
        kind: str,
        meta: Mapping[str, Any] | None,
        arrays: Mapping[str, np.ndarray] | None,
        request_id: int = 0,
    ) -> tuple[list, int]:
        """Return ``(buffers, total_bytes)`` of one frame.

        Small arrays are copied into the first buffer; arrays of at least
        ``ZERO_COPY_MIN_BYTES`` are returned as memoryviews of the caller's
        memory (zero-copy), so they must not change until written.
        """
        if arrays and type(arrays) is dict and (not meta or type(meta) is dict):
            # The common small message: the kind's last layout again, every array copied into
            # the frame: checked and joined in one C call (None: any difference, general path).
            last = self._last.get(kind)
            if last is not None and last[1].zero_copy is None:
                plan = last[1]
                meta_bytes = self._packer.pack(meta) if meta else _EMPTY_MAP
                if len(plan.schema) + len(meta_bytes) <= self._limits.max_header_bytes:
                    head = FIXED.pack(
                        MAGIC, self._version, ftype, 0, len(plan.schema), len(meta_bytes), plan.payload_len, request_id
                    )
                    frame = join_small_frame(arrays, last[0], head, plan.schema, meta_bytes, plan.pads)
                    if frame is not None:
                        return [frame], len(frame)
        if arrays:
            # Most messages of a kind repeat the previous layout: compare against
            # it field by field, cheaper than building and hashing a key. Names,
            # dtypes (by identity: numpy's == is slow; an equal copy just misses)
            # and shapes decide the schema; contiguity is left to the buffer
            # protocol, which refuses non-C-contiguous arrays below.
            plan = None
            last = self._last.get(kind)
            if last is not None and len(arrays) == len(last[0]):
                try:
                    for (name, a), (last_name, dtype, shape) in zip(arrays.items(), last[0]):
                        if a.dtype is not dtype or a.shape != shape or name != last_name:
                            break
                    else:
                        plan = last[1]
                except AttributeError:  # not numpy: the slow path names the culprit
                    pass
            if plan is None:
                arrays, plan = self._lookup(kind, arrays)
        else:
            plan = self._plans.get(kind)
            if plan is None:
                plan = self._plan(kind, {})[1]
        if meta and type(meta) is not dict and not isinstance(meta, Mapping):
            raise TypeError(f"meta must be a dict, got {type(meta).__name__}")
        meta_bytes = self._packer.pack(meta) if meta else _EMPTY_MAP
        header_len = len(plan.schema) + len(meta_bytes)
        if header_len > self._limits.max_header_bytes:
            raise ValueError(
                f"message {kind!r}: header of {header_len} bytes exceeds "
                f"max_header_bytes={self._limits.max_header_bytes}; move bulk data from meta into arrays"
            )
        head = FIXED.pack(
            MAGIC, self._version, ftype, 0, len(plan.schema), len(meta_bytes), plan.payload_len, request_id
        )
        try:
            buffers = self._buffers(head, meta_bytes, plan, arrays.values() if arrays else ())
        except (BufferError, TypeError):
            # A non-contiguous array with a known layout: copy it, then go on.
            arrays, plan = self._plan(kind, arrays)[:2]
            buffers = self._buffers(head, meta_bytes, plan, arrays.values())
        return buffers, FIXED_SIZE + header_len + plan.payload_len

    @staticmethod
    def _buffers(head: bytes, meta_bytes: bytes, plan: _Plan, values) -> list:
        parts = [head, plan.schema, meta_bytes]
        if plan.zero_copy is None:
            for array, pad in zip(values, plan.pads):
                if pad:
                    parts.append(pad)
                parts.append(array)
            return [b"".join(parts)]  # (the buffer protocol refuses non-C-contiguous arrays)
        buffers = []
        for array, pad, zero_copy in zip(values, plan.pads, plan.zero_copy):
            if pad:
                parts.append(pad)
            if zero_copy:
                buffers.append(b"".join(parts))
                buffers.append(memoryview(array).cast("B"))  # (TypeError unless C-contiguous)
                parts = []
            else:
                parts.append(array)
        if parts:
            buffers.append(b"".join(parts))
        return buffers

    def _lookup(self, kind: str, arrays: Mapping[str, Any]) -> tuple[Mapping[str, np.ndarray], _Plan]:
        """The plan for a layout that is not the kind's last one (validating and coercing if new)."""
        try:
            # dtype, shape and strides decide validity and contiguity.
            key = (kind, *[(name, a.dtype, a.shape, a.strides) for name, a in arrays.items()])
        except AttributeError:
            key = None
        plan = self._plans.get(key)
        if plan is None:
            arrays, plan, key = self._plan(kind, arrays)
        if len(self._last) >= _CACHE_MAX:
            self._last.clear()
        self._last[kind] = (tuple(entry[:3] for entry in key[1:]), plan)
        return arrays, plan

    def _plan(self, kind: str, arrays: Mapping[str, Any]) -> tuple[dict[str, np.ndarray], _Plan, Any]:
        """Validate and coerce ``arrays``, and cache how to write their layout (returns its key)."""
        limits = self._limits
        _check_name("message kind", kind, limits)
        if len(arrays) > limits.max_arrays:
            raise ValueError(f"message {kind!r} has {len(arrays)} arrays, more than max_arrays={limits.max_arrays}")
        coerced = {}
        descs = []
        pads = []
        end = 0
        for name, array in arrays.items():
            _check_name("array name", name, limits)
            array = coerced[name] = _coerce(name, array)
            if array.ndim > limits.max_ndim:
                raise ValueError(f"array {name!r} has {array.ndim} dimensions, more than max_ndim={limits.max_ndim}")
            offset = _align(end) if end else 0
            pads.append(_PADS[offset - end])
            descs.append([name, _WIRE_NAME[array.dtype], list(array.shape), offset, array.nbytes])
            end = offset + array.nbytes
        if end > limits.max_payload_bytes:
            raise ValueError(
                f"message {kind!r}: payload of {end} bytes exceeds max_payload_bytes={limits.max_payload_bytes}"
            )
        zero_copy = tuple(a.nbytes >= ZERO_COPY_MIN_BYTES for a in coerced.values())
        plan = _Plan(msgpack.packb([kind, descs]), end, tuple(pads), zero_copy)
        if len(self._plans) >= _CACHE_MAX:
            self._plans.clear()
        # Cache under the key of what is actually written. If coercion changed
        # an array (a copy), the caller's key differs and stays a miss, so such
        # arrays always come through here.
        key = (kind, *[(n, a.dtype, a.shape, a.strides) for n, a in coerced.items()]) if coerced else kind
        self._plans[key] = plan
        return coerced, plan, key


def _check_name(what: str, name: Any, limits: Limits) -> None:
    if type(name) is not str or not name:
        raise TypeError(f"{what} must be a non-empty str, got {name!r}")
    if len(name.encode()) > limits.max_name_bytes:
        raise ValueError(f"{what} {name[:40]!r}... is longer than max_name_bytes={limits.max_name_bytes}")


def _coerce(name: str, array: Any) -> np.ndarray:
    """Make ``array`` a C-contiguous little-endian ndarray of an allowed dtype (copying if needed)."""
    if not isinstance(array, (np.ndarray, np.generic)):
        raise TypeError(f"array {name!r} must be a numpy array, got {type(array).__name__}")
    array = np.asarray(array)
    dtype = array.dtype
    if dtype not in _WIRE_NAME:
        little = dtype.newbyteorder("<") if dtype.byteorder not in ("|", "=") else dtype
        if little not in _WIRE_NAME:
            allowed = ", ".join(sorted({dt.name for dt in ALLOWED_DTYPES.values()}))
            raise TypeError(f"array {name!r} has dtype {dtype}, which the wire does not carry (allowed: {allowed})")
        array = array.astype(little, order="C")
    if not array.flags.c_contiguous:
        array = array.copy(order="C")  # (np.ascontiguousarray would turn 0-d into 1-d)
    return array


class Decoder:
    """Validates what a peer sent. Every method raises :class:`ProtocolError` on bad input."""

    __slots__ = ("_limits", "_layouts")

    def __init__(self, limits: Limits) -> None:
        self._limits = limits
        # schema bytes -> (kind, layout)
        self._layouts: dict[bytes, tuple[str, Layout]] = {}

    def schema(self, schema: bytes) -> tuple[str, Layout]:
        """Decode and validate a schema; cached, so a repeated layout costs one dict lookup."""
        entry = self._layouts.get(schema)
        if entry is None:
            entry = self._decode_schema(schema)
            if len(self._layouts) >= _CACHE_MAX:
                self._layouts.clear()
            self._layouts[schema] = entry
        return entry

    def _decode_schema(self, schema: bytes) -> tuple[str, Layout]:
        limits = self._limits
        obj = _unpack(schema, "schema")
        if type(obj) is not list or len(obj) != 2 or type(obj[1]) is not list:
            raise ProtocolError("schema is not [kind, [array, ...]]")
        kind, descs = obj
        _check_wire_name("message kind", kind, limits)
        if len(descs) > limits.max_arrays:
            raise ProtocolError(f"{len(descs)} arrays in one message, more than max_arrays={limits.max_arrays}")
        layout = []
        names = set()
        end = 0
        for desc in descs:
            if type(desc) is not list or len(desc) != 5:
                raise ProtocolError("array descriptor is not [name, dtype, shape, offset, nbytes]")
            name, dtype_name, shape, offset, nbytes = desc
            _check_wire_name("array name", name, limits)
            if name in names:
                raise ProtocolError(f"array name {name!r} appears twice")
            names.add(name)
            dtype = ALLOWED_DTYPES.get(dtype_name) if type(dtype_name) is str else None
            if dtype is None:
                raise ProtocolError(f"array {name!r}: dtype {dtype_name!r} is not allowed")
            if type(shape) is not list or len(shape) > limits.max_ndim:
                raise ProtocolError(f"array {name!r}: shape must be a list of at most {limits.max_ndim} dims")
            count = 1
            extent = 1  # product of the non-zero dims: numpy refuses shapes whose extent overflows
            for dim in shape:
                if type(dim) is not int or dim < 0:
                    raise ProtocolError(f"array {name!r}: bad dimension {dim!r} in shape {shape!r}")
                count *= dim  # Python ints: no overflow
                extent *= dim or 1
            if extent * dtype.itemsize > limits.max_payload_bytes:
                raise ProtocolError(
                    f"array {name!r}: shape {shape!r:.80} of {dtype.name} spans more than "
                    f"max_payload_bytes={limits.max_payload_bytes}, even if empty"
                )
            if type(nbytes) is not int or nbytes != count * dtype.itemsize:
                raise ProtocolError(
                    f"array {name!r}: shape {shape} of {dtype.name} is {count * dtype.itemsize} bytes, "
                    f"header declares {nbytes!r}"
                )
            expected = _align(end) if end else 0
            if type(offset) is not int or offset != expected:
                raise ProtocolError(f"array {name!r}: offset {offset!r}, expected {expected}")
            end = expected + nbytes
            if end > limits.max_payload_bytes:
                raise ProtocolError(f"arrays need {end} bytes, more than max_payload_bytes={limits.max_payload_bytes}")
            layout.append((name, dtype, tuple(shape), offset))
        return kind, (tuple(layout), end)

    def meta(self, data: bytes) -> dict[str, Any]:
        if data == _EMPTY_MAP:
            return {}
        obj = _unpack(data, "meta")
        if type(obj) is not dict:
            raise ProtocolError(f"meta must be a map, got {type(obj).__name__}")
        return obj

    @staticmethod
    def arrays(layout: Layout, payload) -> dict[str, np.ndarray]:
        """Views over ``payload`` (a writable buffer of exactly the layout's size); no copies.

        Made in C (`aiorl._ext.wire.array_views`): ``np.ndarray(shape, dtype, payload, offset)``
        per array cost more than the rest of a small frame's parsing."""
        return array_views(layout[0], payload)


def _unpack(data: bytes, what: str) -> Any:
    try:
        # Limits default to len(data), which the frame header already capped;
        # max_ext_len=0 refuses every extension type (timestamps included).
        return msgpack.unpackb(data, raw=False, strict_map_key=True, max_ext_len=0, use_list=True)
    except Exception as exc:  # msgpack raises ValueError, FormatError, StackError, UnicodeDecodeError, ...
        raise ProtocolError(f"undecodable {what}: {type(exc).__name__}: {exc}") from None


def _check_wire_name(what: str, name: Any, limits: Limits) -> None:
    if type(name) is not str or not name or len(name.encode()) > limits.max_name_bytes:
        raise ProtocolError(f"bad {what} {name!r:.80}")
