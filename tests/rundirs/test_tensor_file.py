"""aiorl's reader of the safetensors layout (policy.safetensors): a file of tensors and nothing else, every
size checked against the file before anything is read or allocated; a doctored file is one line naming it."""

import json
import struct

import numpy as np
import pytest
import torch

from aiorl.io.tensor_file import (
    MAX_HEADER_BYTES,
    TensorFileError,
    open_tensor_file,
    read_tensors,
    write_tensors,
)

CAP = 1 << 20


def raw_file(path, header: dict, data: bytes = b"", length: int | None = None, text: bytes | None = None):
    """A file of the layout written by hand: `header` as JSON (or `text` as is), its length (or `length`)."""
    blob = text if text is not None else json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(blob) if length is None else length) + blob + data)
    return path


def two_tensors(path, **changes):
    """A file of two float32 tensors a [2] and b [3] (20 bytes), with `changes` to b's entry."""
    b = {"dtype": "F32", "shape": [3], "data_offsets": [8, 20], **changes}
    return raw_file(path, {"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}, "b": b}, bytes(20))


def test_round_trip_of_every_dtype_and_the_metadata(tmp_path):
    rng = np.random.default_rng(0)
    tensors = {
        "f64": rng.normal(size=(2, 3)),
        "f32": rng.normal(size=(4,)).astype(np.float32),
        "f16": rng.normal(size=(1, 2, 2)).astype(np.float16),
        "i64": np.arange(5, dtype=np.int64),
        "i32": np.arange(3, dtype=np.int32),
        "i16": np.arange(3, dtype=np.int16),
        "i8": np.arange(-2, 2, dtype=np.int8),
        "u8": np.arange(7, dtype=np.uint8),
        "bool": np.array([True, False, True]),
        "scalar": np.float32(2.5).reshape(()),
        "empty": np.zeros((0, 3), np.float32),
        "bf16": torch.tensor([1.5, -2.0]).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16),
    }
    path = tmp_path / "t.safetensors"
    with open(path, "wb") as f:
        write_tensors(f, tensors, {"format": "pt"}, dtypes={"bf16": "BF16"})
    checked = open_tensor_file(path, CAP)
    assert checked.metadata == {"format": "pt"} and checked.entries["bf16"].dtype == "BF16"
    assert checked.data_start % 8 == 0
    back = read_tensors(path, CAP)
    assert list(back) == list(tensors)
    for name, array in tensors.items():
        np.testing.assert_array_equal(back[name], array)
        assert back[name].shape == array.shape
    assert torch.from_numpy(back["bf16"].view(np.int16)).view(torch.bfloat16).tolist() == [1.5, -2.0]


def test_entries_listed_out_of_offset_order_read_as_safetensors_writes_them(tmp_path):
    """The safetensors writer sorts the header's names, not by offset: the spans are checked in offset order."""
    path = raw_file(
        tmp_path / "t",
        {
            "z": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]},
            "a": {"dtype": "U8", "shape": [1], "data_offsets": [2, 3]},
        },
        b"\x01\x02\x03",
    )
    back = read_tensors(path, CAP)
    assert back["z"].tolist() == [1, 2] and back["a"].tolist() == [3]


DOCTORED = [
    ("header length over the cap", lambda p: raw_file(p, {}, length=MAX_HEADER_BYTES + 1), "over the"),
    ("header beyond the file", lambda p: raw_file(p, {}, length=4096), "beyond the file"),
    ("shorter than the length field", lambda p: p.write_bytes(b"\x01\x02"), "shorter than the 8-byte"),
    ("not JSON", lambda p: raw_file(p, {}, text=b"{not json"), "not JSON"),
    ("not UTF-8", lambda p: raw_file(p, {}, text=b"\xff\xfe"), "not JSON"),
    ("a JSON list", lambda p: raw_file(p, {}, text=b"[1, 2]"), "must be a JSON object"),
    (
        "a duplicate key",
        lambda p: raw_file(
            p,
            {},
            bytes(4),
            text=b'{"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}, '
            b'"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}',
        ),
        "names 'a' twice",
    ),
    ("a bad dtype", lambda p: two_tensors(p, dtype="O"), "dtype 'O' is not one of"),
    ("a pickled dtype name", lambda p: two_tensors(p, dtype="PICKLE"), "is not one of"),
    ("an overlapping span", lambda p: two_tensors(p, data_offsets=[4, 16]), "starts at byte 4, where 8"),
    ("a gap between spans", lambda p: two_tensors(p, data_offsets=[12, 24]), "starts at byte 12, where 8"),
    ("a span not its shape's size", lambda p: two_tensors(p, data_offsets=[8, 24]), "span 16 bytes"),
    ("a huge shape", lambda p: two_tensors(p, shape=[2**40, 2**40], data_offsets=[8, 8 + 2**82]), "over 1048576 bytes"),
    ("a negative size", lambda p: two_tensors(p, shape=[-3]), "non-negative integers"),
    ("a size that is not an integer", lambda p: two_tensors(p, shape=[3.0]), "non-negative integers"),
    ("too many dimensions", lambda p: two_tensors(p, shape=[1] * 9), "at most 8"),
    ("a negative offset", lambda p: two_tensors(p, data_offsets=[-4, 8]), "non-negative integers"),
    ("an extra key", lambda p: two_tensors(p, code="import os"), "expected exactly the keys"),
    ("metadata not strings", lambda p: raw_file(p, {"__metadata__": {"a": 1}}), "__metadata__ must map"),
    ("a truncated file", lambda p: p.write_bytes(two_tensors(p).read_bytes()[:-5]), "the file has"),
    ("trailing bytes", lambda p: p.write_bytes(two_tensors(p).read_bytes() + b"PK\x03\x04"), "bytes after the last"),
]


@pytest.mark.parametrize(("case", "make", "says"), DOCTORED, ids=[c for c, _, _ in DOCTORED])
def test_a_doctored_file_is_refused_in_one_line_naming_it(tmp_path, case, make, says):
    path = tmp_path / "policy.safetensors"
    make(path)
    with pytest.raises(TensorFileError) as raised:
        read_tensors(path, CAP)
    message = str(raised.value)
    assert message.startswith(f"{path}: ") and says in message and "\n" not in message, message


def test_the_cap_on_the_tensors_bytes(tmp_path):
    path = tmp_path / "t"
    with open(path, "wb") as f:
        write_tensors(f, {"w": np.zeros(100, np.float32)})
    assert read_tensors(path, 400)["w"].shape == (100,)
    with pytest.raises(TensorFileError, match="over 399 bytes"):
        open_tensor_file(path, 399)


def test_nothing_is_read_past_the_header_until_a_tensor_is_asked_for(tmp_path, monkeypatch):
    path = two_tensors(tmp_path / "t")
    checked = open_tensor_file(path, CAP)
    reads = []
    real = np.fromfile
    monkeypatch.setattr(
        np, "fromfile", lambda f, dtype, count: reads.append(count) or real(f, dtype=dtype, count=count)
    )
    assert checked.array("b").shape == (3,) and reads == [3]


def test_a_file_that_shrank_after_its_check_is_refused_not_read_short(tmp_path):
    path = two_tensors(tmp_path / "t")
    checked = open_tensor_file(path, CAP)
    path.write_bytes(path.read_bytes()[:-8])
    with pytest.raises(TensorFileError, match="cut short"):
        checked.array("b")


def test_a_header_longer_than_the_cap_is_refused_though_the_file_holds_it(tmp_path, monkeypatch):
    from aiorl.io import tensor_file

    path = tmp_path / "t"
    with open(path, "wb") as f:
        write_tensors(f, {f"layer{i}.weight": np.zeros(1, np.float32) for i in range(8)})
    assert len(read_tensors(path, CAP)) == 8
    monkeypatch.setattr(tensor_file, "MAX_HEADER_BYTES", 64)
    with pytest.raises(TensorFileError, match="over the 64-byte cap"):
        open_tensor_file(path, CAP)
