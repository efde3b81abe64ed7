"""Doctored ``.pt2`` policies (issue 44): each refused by `check_policy_archive` in one line, before
torch's loader is reached, nothing run, nothing written, in little memory."""

import io
import json
import os
import struct
import tracemalloc
import warnings
import zipfile
from pathlib import Path

import pytest
import torch

from aiorl.io import export
from aiorl.io.export import PolicyFileError, load_policy_file, save_policy
from aiorl.io.policy_archive import check_policy_archive


class RunsCode:
    """Unpickled, it runs its code: what a doctored policy file hides."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return exec, (f"open({self.marker!r}, 'w').write('ran')",)


@pytest.fixture(scope="module")
def policy(tmp_path_factory) -> list[tuple[str, bytes]]:
    """A real tiny exported policy's entries, (name, bytes) in archive order."""
    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    directory = tmp_path_factory.mktemp("policy")
    path = save_policy(net, directory, {"observation_shape": [4], "observation_dtype": "float32"})
    with zipfile.ZipFile(path) as archive:
        return [(info.filename, archive.read(info)) for info in archive.infolist()]


def write(path: Path, entries: list[tuple[str, bytes]]) -> Path:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # zipfile warns of a duplicate name, and writes it
        with zipfile.ZipFile(path, "w") as archive:
            for name, data in entries:
                archive.writestr(name, data)
    return path


def named(entries, suffix: str) -> int:
    return next(i for i, (name, _) in enumerate(entries) if name.endswith(suffix))


def pickled_bytes(marker: Path) -> bytes:
    buffer = io.BytesIO()
    torch.save({"inputs": RunsCode(marker)}, buffer)
    return buffer.getvalue()


def duplicated(suffix: str, bad: bytes, bad_first: bool):
    def change(entries):
        i = named(entries, suffix)
        name, good = entries[i]
        entries[i : i + 1] = [(name, bad), (name, good)] if bad_first else [(name, good), (name, bad)]

    return change


def json_edit(suffix: str, edit):
    def change(entries):
        i = named(entries, suffix)
        name, data = entries[i]
        entries[i] = (name, edit(data.decode()).encode())

    return change


def pickled_config(data: str) -> str:
    config = json.loads(data)
    next(iter(config["config"].values()))["use_pickle"] = True
    return json.dumps(config)


def node_calls(target: str):
    return json_edit(
        "models/model.json", lambda text: text.replace('"torch.ops.aten.relu.default"', json.dumps(target))
    )


def shape_expression(expr: str):
    def edit(text):
        old = next(part for part in text.split('"expr_str": ')[1:]).split('"', 2)[1]
        assert old.startswith("Symbol(")
        return text.replace(json.dumps(old), json.dumps(expr))

    return json_edit("models/model.json", edit)


def weight_claims(sizes: list[int], record: bytes | None = None):
    """The first weight's sizes (and record) changed: an empty record makes torch allocate its sizes."""

    def change(entries):
        i = named(entries, "model_weights_config.json")
        config = json.loads(entries[i][1])
        first = next(iter(config["config"].values()))
        first["tensor_meta"]["sizes"] = [{"as_int": n} for n in sizes]
        first["tensor_meta"]["strides"] = [{"as_int": 1} for _ in sizes]
        entries[i] = (entries[i][0], json.dumps(config).encode())
        if record is not None:
            j = named(entries, "/" + first["path_name"])
            entries[j] = (entries[j][0], record)

    return change


def pickled_config_first(entries):
    bad = pickled_config(entries[named(entries, "model_weights_config.json")][1].decode()).encode()
    duplicated("model_weights_config.json", bad, True)(entries)


def pickled_sample_inputs(marker: Path):
    def change(entries):
        i = named(entries, "data/sample_inputs/model.pt")
        entries[i] = (entries[i][0], pickled_bytes(marker))

    return change


def compiled_library(entries):
    root = entries[0][0].split("/", 1)[0]
    entries.append((f"{root}/data/aotinductor/model/model.so", b"\x7fELF"))


def case_duplicate(entries):
    i = named(entries, "data/sample_inputs/model.pt")
    name, data = entries[i]
    entries.insert(i, (name.replace("model.pt", "MODEL.pt"), data))


CASES = {
    "sample inputs twice, the pickle first": (
        lambda marker: duplicated("data/sample_inputs/model.pt", pickled_bytes(marker), True),
        "twice",
    ),
    "sample inputs twice, the pickle last": (
        lambda marker: duplicated("data/sample_inputs/model.pt", pickled_bytes(marker), False),
        "twice",
    ),
    "sample inputs twice, in another case": (lambda marker: case_duplicate, "twice"),
    "weights config twice, the pickled first": (lambda marker: pickled_config_first, "twice"),
    "a pickled weight": (lambda marker: json_edit("model_weights_config.json", pickled_config), "is pickled"),
    "a key twice in the weights config": (
        lambda marker: json_edit(
            "model_weights_config.json",
            lambda text: text.replace('"use_pickle": false', '"use_pickle": true, "use_pickle": false', 1),
        ),
        "names the key 'use_pickle' twice",
    ),
    "the pickled sample inputs": (pickled_sample_inputs, "is not plain tensors"),
    "aten.from_file": (
        lambda marker: node_calls("torch.ops.aten.from_file.default"),
        "an ATen op no aiorl network uses",
    ),
    "aten.copy_": (lambda marker: node_calls("torch.ops.aten.copy_.default"), "an ATen op no aiorl network uses"),
    "an op off the list": (lambda marker: node_calls("torch.ops.aten.sin.default"), "an ATen op no aiorl network uses"),
    "a torch function": (lambda marker: node_calls("torch.hub.load"), "not an ATen op"),
    "a call in an expression": (
        lambda marker: shape_expression(f"__import__('os').system('touch {marker}')"),
        "names '__import__'",
    ),
    "a compiled library": (lambda marker: compiled_library, "which an aiorl policy never does"),
    "a power tower": (lambda marker: shape_expression("2**2**2**2**2**2"), "raises to a power"),
    "a huge integer": (lambda marker: shape_expression("9" * 40), "holds an integer of 40 digits"),
    "a long expression": (lambda marker: shape_expression("+".join(["s0"] * 200)), "characters long"),
    "a deep expression": (lambda marker: shape_expression("(" * 20 + "s0" + ")" * 20), "longer or deeper"),
    "an empty weight of huge sizes": (
        lambda marker: weight_claims([1 << 20, 1 << 20], b""),
        "its record weight_0 holds 0",
    ),
    "a weight larger than its record": (lambda marker: weight_claims([1 << 16]), "claims 262144 bytes"),
}


def refused_in_one_line(path: Path, expected: str, monkeypatch) -> str:
    """check_policy_archive and the trusted-program loader both refuse `path`, in one line naming
    `expected`, torch's loader never reached; the check's own peak allocation stays small."""

    def never(*args, **kwargs):
        raise AssertionError("torch.export.load reached for a doctored policy")

    monkeypatch.setattr(torch.export, "load", never)
    tracemalloc.start()
    try:
        with pytest.raises(ValueError) as info:
            check_policy_archive(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    message = str(info.value)
    assert expected in message and "\n" not in message and "\x1b" not in message, message
    assert peak < 16 << 20, f"the check took {peak} bytes for {path.name}"
    with pytest.raises(PolicyFileError) as loaded:
        load_policy_file(path, trust_program=True)
    assert "\n" not in str(loaded.value) and expected in str(loaded.value)
    return message


@pytest.mark.parametrize("name", CASES, ids=list(CASES))
def test_a_doctored_policy_is_refused_in_one_line_and_runs_nothing(policy, tmp_path, monkeypatch, name):
    make, expected = CASES[name]
    marker = tmp_path / "code-ran"
    entries = list(policy)
    make(marker)(entries)
    path = write(tmp_path / "doctored.pt2", entries)
    before = sorted(os.listdir(tmp_path))
    refused_in_one_line(path, expected, monkeypatch)
    assert not marker.exists()
    assert sorted(os.listdir(tmp_path)) == before, "the check wrote a file"


def test_the_undoctored_policy_passes_and_loads(policy, tmp_path):
    path = write(tmp_path / "policy.pt2", list(policy))
    check_policy_archive(path)
    check_policy_archive(path.read_bytes())
    program = load_policy_file(path, trust_program=True)
    assert program(torch.zeros(3, 4)).shape == (3, 2)


def test_torch_and_zipfile_can_take_different_copies_of_a_name(policy, tmp_path):
    # Why names are checked in the central directory and not through zipfile: of a name stored
    # twice, zipfile takes the last copy, torch's reader whichever its sorted lookup finds.
    differ = []
    for suffix in ("model_weights_config.json", "data/sample_inputs/model.pt", "models/model.json"):
        for bad_first in (True, False):
            entries = list(policy)
            duplicated(suffix, b"BAD", bad_first)(entries)
            path = write(tmp_path / "doctored.pt2", entries)
            name = entries[named(entries, suffix)][0]
            torch_copy = torch._C.PyTorchFileReader(str(path)).get_record(name.split("/", 1)[1])
            differ.append(torch_copy != zipfile.ZipFile(path).read(name))
    assert any(differ)


# ---------------------------------------------------------------------------- the zip itself


def local_header_renamed(entries, tmp_path) -> Path:
    """The sample inputs' local header names another entry (the central directory is unchanged)."""
    path = write(tmp_path / "renamed.pt2", entries)
    data = bytearray(path.read_bytes())
    name = entries[named(entries, "data/sample_inputs/model.pt")][0].encode()
    at = data.index(name)  # the first occurrence: the local header, before the central directory
    data[at : at + len(name)] = name.replace(b"model.pt", b"modem.pt")
    path.write_bytes(bytes(data))
    return path


def central_size_lies(entries, tmp_path) -> Path:
    """A stored weight whose central entry says it holds 3 GiB (its compressed size unchanged)."""
    path = write(tmp_path / "lies.pt2", entries)
    data = bytearray(path.read_bytes())
    archive = zipfile.ZipFile(io.BytesIO(bytes(data)))
    directory = data.index(b"PK\x01\x02")
    struct.pack_into("<I", data, directory + 24, 3 << 30)  # the first entry's uncompressed size
    assert archive.infolist()[0].filename.endswith("weight_0")
    path.write_bytes(bytes(data))
    return path


def zip_bomb(entries, tmp_path) -> Path:
    """1 GiB of zeros deflated to a few MB, as the first weight (written in chunks: little memory)."""
    path = tmp_path / "bomb.pt2"
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in entries:
            if name.endswith("data/weights/weight_0"):
                info = zipfile.ZipInfo(name)
                info.compress_type = zipfile.ZIP_DEFLATED
                with archive.open(info, "w", force_zip64=True) as f:
                    chunk = bytes(1 << 20)
                    for _ in range(1024):
                        f.write(chunk)
            else:
                archive.writestr(name, data)
    assert path.stat().st_size < 16 << 20
    return path


def truncated(keep):
    def make(entries, tmp_path) -> Path:
        path = write(tmp_path / "whole.pt2", entries)
        data = path.read_bytes()
        out = tmp_path / "truncated.pt2"
        out.write_bytes(data[: keep(len(data))])
        path.unlink()
        return out

    return make


ZIP_CASES = {
    "a local header naming another entry": (local_header_renamed, "the local header at offset"),
    "a stored entry claiming 3 GiB": (central_size_lies, "says it holds 3221225472 bytes"),
    "a zip bomb": (zip_bomb, "is compressed or encrypted (method 8)"),
    "cut in half": (truncated(lambda n: n // 2), "truncated"),
    "one byte short": (truncated(lambda n: n - 1), "truncated"),
    "empty": (truncated(lambda n: 0), "truncated"),
}


@pytest.mark.parametrize("name", ZIP_CASES, ids=list(ZIP_CASES))
def test_an_archive_two_readers_could_see_differently_is_refused(policy, tmp_path, monkeypatch, name):
    make, expected = ZIP_CASES[name]
    path = make(list(policy), tmp_path)
    refused_in_one_line(path, expected, monkeypatch)


def test_a_sparse_archive_past_the_cap_is_refused_unread(tmp_path, monkeypatch):
    path = tmp_path / "huge.pt2"
    with open(path, "wb") as f:
        f.truncate(5 << 30)  # a hole: no disk
    read = []
    pread = os.pread
    monkeypatch.setattr(os, "pread", lambda fd, n, offset: read.append(n) or pread(fd, n, offset))
    with pytest.raises(ValueError, match="more than 4294967296 for a policy"):
        check_policy_archive(path)
    assert sum(read) == 0


def test_export_still_checks_the_archive_before_torch():
    # The loader of a trusted program is where this check stands guard (helper of load_policy_file).
    assert export.check_policy_archive is check_policy_archive
