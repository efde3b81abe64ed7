"""Frame codec: round trips, the dtype whitelist, and every check a receiver makes."""

from __future__ import annotations

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from aiorl.wire import ALLOWED_DTYPES, Limits, ProtocolError
from aiorl.wire.codec import FIXED, FIXED_SIZE, MAGIC, PROTOCOL_VERSION, Decoder, Encoder, FrameType


def decode_frame(frame: bytes, limits: Limits | None = None):
    """Split and check one encoded frame the way a receiver does (without a socket)."""
    decoder = Decoder(limits or Limits())
    magic, version, ftype, flags, schema_len, meta_len, payload_len, request_id = FIXED.unpack_from(frame)
    assert (magic, version, flags) == (MAGIC, PROTOCOL_VERSION, 0)
    header_end = FIXED_SIZE + schema_len + meta_len
    assert len(frame) == header_end + payload_len
    kind, layout = decoder.schema(frame[FIXED_SIZE : FIXED_SIZE + schema_len])
    assert layout[1] == payload_len
    meta = decoder.meta(frame[FIXED_SIZE + schema_len : header_end])
    arrays = decoder.arrays(layout, bytearray(frame[header_end:]))
    return ftype, request_id, kind, meta, arrays


def encode_frame(kind="batch", meta=None, arrays=None, ftype=FrameType.DATA, request_id=0, limits=None) -> bytes:
    buffers, nbytes = Encoder(limits or Limits()).encode(ftype, kind, meta, arrays, request_id)
    frame = b"".join(bytes(b) for b in buffers)
    assert len(frame) == nbytes
    return frame


def schema_bytes(kind, descs) -> bytes:
    return msgpack.packb([kind, descs])


ALLOWED = sorted({dt.name for dt in ALLOWED_DTYPES.values()})


def test_whitelist_is_exactly_the_numeric_types():
    assert ALLOWED == sorted(
        [
            "bool",
            "int8",
            "int16",
            "int32",
            "int64",
            "uint8",
            "uint16",
            "uint32",
            "uint64",
            "float16",
            "float32",
            "float64",
        ]
    )


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    arrays=st.dictionaries(
        st.text(min_size=1, max_size=12),
        hnp.arrays(
            dtype=st.sampled_from(ALLOWED),
            shape=hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=6),
        ),
        max_size=5,
    ),
    meta=st.dictionaries(
        st.text(max_size=8),
        st.recursive(
            st.none()
            | st.booleans()
            | st.integers(-(2**63), 2**64 - 1)
            | st.floats(allow_nan=False)
            | st.text(max_size=20)
            | st.binary(max_size=20),
            lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
            max_leaves=8,
        ),
        max_size=4,
    ),
    request_id=st.integers(0, 2**64 - 1),
)
def test_round_trip_any_allowed_arrays(arrays, meta, request_id):
    frame = encode_frame("batch", meta, arrays, FrameType.REQUEST, request_id)
    ftype, rid, kind, got_meta, got = decode_frame(frame)
    assert (ftype, rid, kind) == (FrameType.REQUEST, request_id, "batch")
    assert got_meta == meta
    assert list(got) == list(arrays)
    for name, array in arrays.items():
        assert got[name].dtype == array.dtype
        assert got[name].shape == array.shape
        np.testing.assert_array_equal(got[name], array)
        assert got[name].flags.writeable
        assert got[name].flags.aligned
        if array.size:  # an empty view's address is never read (see the test below)
            assert got[name].ctypes.data % min(8, array.dtype.itemsize) == 0, "views are aligned"


@pytest.mark.parametrize("dtype", ["float16", "float64", "int32"])
def test_empty_arrays_in_an_empty_payload_at_any_address(dtype):
    """A frame of empty arrays has a 0-byte payload; the buffer it lands in can sit at any
    address (CPython's shared empty bytearray is 1-byte aligned: odd on some builds, e.g. 3.13).
    No element is ever read there, and numpy counts such views as aligned."""
    frame = encode_frame(arrays={"a": np.zeros((0, 3), dtype), "b": np.zeros(0, dtype)})
    kind, layout = Decoder(Limits()).schema(frame[FIXED_SIZE : FIXED_SIZE + FIXED.unpack_from(frame)[4]])
    assert layout[1] == 0
    odd = memoryview(bytearray(9))[1:1]  # an empty buffer at an odd address
    for payload in (odd, bytearray()):
        got = Decoder.arrays(layout, payload)
        assert got["a"].shape == (0, 3) and got["b"].shape == (0,) and got["a"].dtype == np.dtype(dtype)
        assert got["a"].flags.aligned and got["b"].flags.aligned
        np.testing.assert_array_equal(np.concatenate([got["b"], np.ones(2, dtype)]), np.ones(2, dtype))


@pytest.mark.parametrize(
    "make",
    [
        lambda: np.arange(24, dtype=np.float32).reshape(4, 6).T,  # non-contiguous
        lambda: np.arange(10, dtype=">i4"),  # big-endian
        lambda: np.arange(12, dtype=np.int16)[::2],  # strided
        lambda: np.float64(2.5),  # numpy scalar
        lambda: np.zeros((0, 3), np.uint8),  # empty
    ],
)
def test_arrays_are_coerced_to_contiguous_little_endian(make):
    array = make()
    (_, _, _, _, got) = decode_frame(encode_frame(arrays={"a": array}))
    np.testing.assert_array_equal(got["a"], array)
    assert got["a"].dtype.byteorder in "=|<"


def test_layout_cache_follows_shape_dtype_and_contiguity_changes():
    encoder = Encoder(Limits())
    decoder = Decoder(Limits())
    base = np.arange(12, dtype=np.float32)
    # (A repeated layout of small arrays is checked and joined in C: each change below, the
    # same shape in another dtype of the same size, and another name, must be seen there.)
    cases = [base, base.reshape(3, 4), base.reshape(4, 3).T, base.astype(np.float64), base[:5], base]
    cases += [base.view(np.int32), base.view(np.int32)[::-1], base]
    for name, array in [("a", array) for array in cases] + [("b", base)]:
        buffers, _ = encoder.encode(FrameType.DATA, "x", None, {name: array})
        frame = b"".join(bytes(b) for b in buffers)
        schema_len, meta_len = FIXED.unpack_from(frame)[4:6]
        kind, layout = decoder.schema(frame[FIXED_SIZE : FIXED_SIZE + schema_len])
        got = decoder.arrays(layout, bytearray(frame[FIXED_SIZE + schema_len + meta_len :]))
        assert list(got) == [name]
        np.testing.assert_array_equal(got[name], array)
        assert got[name].shape == array.shape and got[name].dtype == array.dtype


def test_received_arrays_are_views_of_the_payload_and_never_reach_past_it():
    frame = encode_frame(arrays={"a": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.arange(3)})
    kind, layout = Decoder(Limits()).schema(frame[FIXED_SIZE : FIXED_SIZE + FIXED.unpack_from(frame)[4]])
    payload = bytearray(layout[1])
    got = Decoder.arrays(layout, payload)
    assert got["a"].base is payload and got["b"].base is payload and got["a"].flags.writeable
    got["b"][:] = 7
    assert np.frombuffer(payload, np.int64, 3, layout[0][1][3]).tolist() == [7, 7, 7]
    for short in (bytearray(layout[1] - 1), bytearray()):
        with pytest.raises(ValueError, match="does not fit in a payload"):
            Decoder.arrays(layout, short)


def test_large_arrays_are_not_copied_small_ones_are():
    big = np.zeros(1 << 16, np.float64)
    small = np.zeros(16, np.float64)
    buffers, _ = Encoder(Limits()).encode(FrameType.DATA, "w", None, {"small": small, "big": big})
    views = [b for b in buffers if isinstance(b, memoryview)]
    assert len(views) == 1 and np.shares_memory(np.asarray(views[0]), big)
    assert not any(isinstance(b, memoryview) and np.shares_memory(np.asarray(b), small) for b in buffers)


@pytest.mark.parametrize(
    "array, match",
    [
        (np.array([object()], dtype=object), "dtype object"),
        (np.array(["a"]), "dtype <U1"),
        (np.zeros(2, np.complex64), "dtype complex64"),
        (np.zeros(2, "datetime64[s]"), "dtype datetime64"),
        ([1, 2, 3], "must be a numpy array"),
    ],
)
def test_sender_refuses_what_the_wire_does_not_carry(array, match):
    with pytest.raises(TypeError, match=match):
        Encoder(Limits()).encode(FrameType.DATA, "x", None, {"a": array})


def test_sender_checks_its_own_limits():
    limits = Limits(max_header_bytes=512, max_payload_bytes=1024, max_arrays=2, max_ndim=2)
    encoder = Encoder(limits)
    with pytest.raises(ValueError, match="max_payload_bytes"):
        encoder.encode(FrameType.DATA, "x", None, {"a": np.zeros(2048, np.uint8)})
    with pytest.raises(ValueError, match="max_arrays"):
        encoder.encode(FrameType.DATA, "x", None, {k: np.zeros(1) for k in "abc"})
    with pytest.raises(ValueError, match="max_ndim"):
        encoder.encode(FrameType.DATA, "x", None, {"a": np.zeros((1, 1, 1))})
    with pytest.raises(ValueError, match="max_header_bytes"):
        encoder.encode(FrameType.DATA, "x", {"blob": b"x" * 600}, None)
    with pytest.raises(TypeError, match="meta values"):
        encoder.encode(FrameType.DATA, "x", {"when": object()}, None)
    with pytest.raises(TypeError, match="arrays="):
        encoder.encode(FrameType.DATA, "x", {"a": np.zeros(3)}, None)
    with pytest.raises(TypeError, match="message kind"):
        encoder.encode(FrameType.DATA, "", None, None)


def test_numpy_scalars_in_meta_become_python_numbers():
    frame = encode_frame(meta={"beta": np.float32(0.5), "n": np.int64(3), "ok": np.bool_(True)})
    assert decode_frame(frame)[3] == {"beta": 0.5, "n": 3, "ok": True}


GOOD = ["x", "<f4", [2, 3], 0, 24]


@pytest.mark.parametrize(
    "descs, match",
    [
        ([["x", "|O", [1], 0, 8]], "dtype '|O' is not allowed"),
        ([["x", "<c8", [1], 0, 8]], "is not allowed"),
        ([["x", 7, [1], 0, 8]], "is not allowed"),
        ([["x", "<f4", [2, 3], 0, 25]], "header declares 25"),
        ([["x", "<f4", [2, -3], 0, 24]], "bad dimension"),
        ([["x", "<f4", [2, 3.0], 0, 24]], "bad dimension"),
        ([["x", "<f4", [True], 0, 4]], "bad dimension"),
        ([["x", "<f4", [1] * 17, 0, 4]], "at most 16 dims"),
        ([["x", "<f4", [2, 3], 8, 24]], "offset 8, expected 0"),
        ([GOOD, ["y", "|u1", [3], 24, 3], ["z", "<f8", [1], 27, 8]], "offset 27, expected 32"),
        ([GOOD, ["x", "|u1", [1], 24, 1]], "appears twice"),
        ([["", "<f4", [1], 0, 4]], "bad array name"),
        ([["x" * 300, "<f4", [1], 0, 4]], "bad array name"),
        ([["x", "<f8", [2**30, 2**30], 0, 2**63]], "more than max_payload_bytes"),
        ([["x", "<f4", [0, 2**63], 0, 0]], "even if empty"),  # numpy cannot even make it
        ([["x", "|u1", [0, 2**31, 2**31], 0, 0]], "even if empty"),
        ([["x", "<f4", [2, 3], 0]], "not \\[name, dtype, shape, offset, nbytes\\]"),
        ([["x"] * 1000], "not \\[name"),
        ([GOOD] * 300, "more than max_arrays"),
    ],
)
def test_receiver_rejects_bad_array_descriptors(descs, match):
    with pytest.raises(ProtocolError, match=match):
        Decoder(Limits()).schema(schema_bytes("batch", descs))


@pytest.mark.parametrize(
    "raw, match",
    [
        (b"", "undecodable schema"),
        (b"\xc1", "undecodable schema"),  # never-used byte
        (msgpack.packb(["batch"]), "not \\[kind"),
        (msgpack.packb({"kind": "batch"}), "not \\[kind"),
        (msgpack.packb([1, []]), "bad message kind"),
        (msgpack.packb(["", []]), "bad message kind"),
        (msgpack.packb(["batch", []]) + b"\x00", "ExtraData"),
        (b"\xdd\xff\xff\xff\xff", "undecodable schema"),  # array32 of 4 billion items in 5 bytes
        (b"\x91" * 5000 + b"\xc0", "undecodable schema"),  # nested 5000 deep
        (msgpack.packb(["batch", [msgpack.ExtType(1, b"\x80\x04N.")]]), "undecodable schema"),
    ],
)
def test_receiver_rejects_undecodable_schemas(raw, match):
    with pytest.raises(ProtocolError, match=match):
        Decoder(Limits()).schema(raw)


@pytest.mark.parametrize(
    "raw",
    [
        msgpack.packb([1, 2]),
        msgpack.packb({1: "int key"}),
        msgpack.packb({"t": msgpack.Timestamp(1)}),
        msgpack.packb({"p": msgpack.ExtType(5, b"cos\nsystem\n")}),
        b"\xa3\xff\xfe\xfd",  # invalid UTF-8
        b"\xdf\xff\xff\xff\xff",  # map32 claiming 4 billion pairs
    ],
)
def test_receiver_rejects_bad_meta(raw):
    with pytest.raises(ProtocolError):
        Decoder(Limits()).meta(raw)


@settings(max_examples=2000, deadline=None)
@given(st.binary(max_size=200))
def test_decoder_raises_only_protocol_errors_on_random_bytes(data):
    decoder = Decoder(Limits())
    for method in (decoder.schema, decoder.meta):
        try:
            method(data)
        except ProtocolError:
            pass


def test_decoder_cache_is_bounded():
    decoder = Decoder(Limits())
    for n in range(2000):
        decoder.schema(schema_bytes(f"k{n}", []))
    assert len(decoder._layouts) <= 512


def test_limits_validate():
    with pytest.raises(ValueError, match="max_payload_bytes"):
        Limits(max_payload_bytes=0)
    with pytest.raises(ValueError, match="write_buffer_low_bytes"):
        Limits(write_buffer_high_bytes=10, write_buffer_low_bytes=20)
