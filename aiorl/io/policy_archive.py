"""A ``.pt2`` policy checked before torch loads it: nothing in it can run code, write a file or
take more memory than the file's own size says.

Policies are meant to be shared, and torch's export loader trusts its archive: it
unpickles (falling back to ``weights_only=False``) the sample inputs and any weight or
constant marked ``use_pickle``, unpickles custom and opaque objects, loads compiled
AOTInductor libraries, resolves every ``torch.*`` name the graph gives as a node's target
(``torch.hub.load`` as well as ``torch.ops.aten.add``), runs any ATen op a node names
(``aten.from_file`` then ``aten.copy_`` write chosen bytes to any path), allocates what a
weight's sizes say when its record is empty, and parses shape expressions with sympy, whose
parser evaluates Python (``2**2**2**2**2**2`` never ends). aiorl's exports hold none of that
but a few ATen ops, raw tensor bytes, JSON and plain-tensor sample inputs, so an archive is
refused unless:

- it is a zip both torch's reader and Python's see alike (`aiorl.io.zip_members`: each name
  once whatever its case, central directory and local headers agreeing, every entry stored as
  is, so nothing expands past the file), and the file is at most `MAX_POLICY_BYTES`;
- every entry is one of those aiorl writes (a whitelist of paths);
- no weight or constant is pickled, every one is a tensor whose sizes and strides fit the bytes
  of its record, and no JSON object names a key twice;
- the sample inputs are a stored archive as above and load with ``torch.load(weights_only=True)``
  (so torch never falls back);
- every node target is one of `ALLOWED_TARGETS`, the ops aiorl's own networks export
  (tests/rundirs/test_policy_ops.py exports every algorithm's policy in every network shape
  and fails when one uses an op off the list);
- every shape expression is short names, small integers and arithmetic without powers
  (``Symbol('s1', positive=True, integer=True)``), nothing that could reach an attribute or a
  call of its own, or take long to evaluate.

`check_policy_archive` reads the archive with bounded reads, each size checked against the
file before it is read, and raises ValueError naming, in one line, the first thing refused;
it loads nothing.
"""

from __future__ import annotations

import io
import os
import re
import stat
from pathlib import Path

from aiorl.core import unique_json
from aiorl.core.unique_json import DuplicateKey
from aiorl.io.zip_members import Member, ZipRefused, members, read_member

MAX_POLICY_BYTES = 4 << 30
MAX_ENTRIES = 4096
MAX_DIRECTORY_BYTES = 4 << 20  # 4096 entries of short names
MAX_JSON_BYTES = 16 << 20  # a graph's JSON; aiorl's policies are a few hundred KB
MAX_SAMPLE_INPUTS_BYTES = 64 << 20  # two observations
# Paths under the archive's root directory that aiorl's exports contain.
ALLOWED_PATHS = re.compile(
    r"(archive_format|archive_version|byteorder|\.data/version|\.data/serialization_id"
    r"|models/\w+\.json|data/weights/\w+_weights_config\.json|data/weights/weight_\d+"
    r"|data/constants/\w+_constants_config\.json|data/constants/tensor_\d+"
    r"|data/sample_inputs/\w+\.pt|extra/[\w.\-]+)"
)
# The ops aiorl's networks export (every layer kind, head, wrapper and recurrent cell), as
# torch.export names them; _operator.getitem and sym_size for multi-output ops and dynamic batch
# sizes. Anything else, however harmless its name, is refused.
ALLOWED_TARGETS = frozenset(
    [
        f"torch.ops.aten.{op}"
        for op in """
    _assert_tensor_metadata.default add.Tensor argmax.default cat.default clamp.default conv2d.default
    detach.default elu.default exp.default flatten.using_ints gelu.default gru_cell.default
    layer_norm.default linear.default log.default lstm_cell.default matmul.default max.other mean.dim
    min.other mul.Tensor pow.Tensor_Scalar relu.default silu.default slice.Tensor sub.Tensor
    tanh.default to.dtype sym_size.int permute.default one_hot.default reshape.default
    masked_fill.Scalar le.Scalar amax.default""".split()
    ]
    + ["_operator.getitem"]
)
SAFE_TARGET = re.compile("|".join(re.escape(target) for target in sorted(ALLOWED_TARGETS)))
ATEN_TARGET = re.compile(r"torch\.ops\.aten\.\w+\.\w+")
# A shape expression: these names, symbols (s0, u3, ...), integers, arithmetic and the keyword
# arguments of Symbol; no attribute access, no double underscores, no string but a symbol name.
EXPR_NAMES = {"Symbol", "Integer", "positive", "integer", "True", "False", "Mod", "FloorDiv", "Max", "Min"}
EXPR_NAMES |= {"CeilToInt", "FloorToInt", "PythonMod", "IntTrueDiv", "TruncToInt", "Abs", "Ne", "Eq", "Gt", "Lt"}
EXPR_TOKEN = re.compile(r"\s*(?:([A-Za-z_]\w*)|(\d+)|('[a-z]+\d+')|([-+*/%(),=<>!]))")
SYMBOL_NAME = re.compile(r"[a-z]+\d+")
# aiorl's expressions are one Symbol(...) of about 40 characters: these bounds leave room and make
# sympy's work small (no powers, no integer past 2**63).
MAX_EXPR_CHARS, MAX_EXPR_TOKENS, MAX_EXPR_DEPTH, MAX_EXPR_DIGITS = 256, 64, 8, 18
# torch.export's ScalarType -> bytes per element (torch/_export/serde/schema.py).
ELEMENT_BYTES = {1: 1, 2: 1, 3: 2, 4: 4, 5: 8, 6: 2, 7: 4, 8: 8, 9: 4, 10: 8, 11: 16, 12: 1, 13: 2}
ELEMENT_BYTES |= {28: 2, 29: 1, 30: 1, 31: 1, 32: 1, 33: 1, 34: 4, 35: 8}
MAX_DIMS = 16


def check_policy_archive(path: str | Path | bytes) -> None:
    """Raise ValueError naming what `path` (a file, or an archive's bytes) holds that could run
    code, write a file or take memory when torch loads it."""
    if isinstance(path, bytes):
        _check_archive(lambda offset, n: path[offset : offset + n], len(path))
        return
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise ValueError(f"not a policy archive ({exc.strerror or exc})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError("not a policy archive (not a regular file)")
        _check_archive(lambda offset, n: os.pread(fd, n, offset), st.st_size)
    except OSError as exc:
        raise ValueError(f"not a policy archive ({exc.strerror or exc})") from None
    finally:
        os.close(fd)


def _check_archive(read_at, size: int) -> None:
    if size > MAX_POLICY_BYTES:
        raise ValueError(f"the archive is {size} bytes, more than {MAX_POLICY_BYTES} for a policy")
    try:
        infos = members(read_at, size, MAX_ENTRIES, MAX_DIRECTORY_BYTES)
        if not infos:
            raise ValueError("0 entries, expected 1 to 4096")
        root = infos[0].name.split("/", 1)[0]
        entries: dict[str, Member] = {}
        for info in infos:
            top, _, rest = info.name.partition("/")
            if top != root or not ALLOWED_PATHS.fullmatch(rest):
                raise ValueError(f"it holds {info.name!r}, which an aiorl policy never does")
            entries[rest] = info
        for rest, info in entries.items():
            if rest.endswith("_config.json"):
                _check_payload_config(rest, _json(read_at, info), entries)
            elif rest.startswith("models/"):
                _check_graph(rest, _json(read_at, info))
            elif rest.startswith("data/sample_inputs/"):
                data = read_member(read_at, info, MAX_SAMPLE_INPUTS_BYTES, "sample inputs")
                _check_sample_inputs(rest, data)
    except ZipRefused as exc:
        raise ValueError(f"the archive {exc}") from None


def _json(read_at, info: Member):
    data = read_member(read_at, info, MAX_JSON_BYTES, "a policy's JSON")
    try:
        return unique_json.loads(data)
    except DuplicateKey as exc:
        raise ValueError(f"{info.name} names the key {exc.key[:80]!r} twice") from None
    except (ValueError, RecursionError) as exc:
        reason = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        raise ValueError(f"{info.name} is not JSON an aiorl policy writes ({reason})") from None


def _check_payload_config(name: str, config, entries: dict[str, Member]) -> None:
    records = config.get("config") if isinstance(config, dict) else None
    if not isinstance(records, dict):
        raise ValueError(f"{name} is not a payload config")
    directory = name.rsplit("/", 1)[0]
    for fqn, payload in records.items():
        if not isinstance(payload, dict) or payload.get("use_pickle") is not False:
            raise ValueError(f"{name}: {fqn[:80]!r} is pickled; an aiorl policy stores tensors as raw bytes")
        path_name = str(payload.get("path_name", ""))
        if not re.fullmatch(r"(weight|tensor)_\d+", path_name):
            raise ValueError(f"{name}: {fqn[:80]!r} is stored as {path_name[:80]!r}, not as a tensor")
        record = entries.get(f"{directory}/{path_name}")
        if record is None:
            raise ValueError(f"{name}: {fqn[:80]!r} is stored in {path_name}, which the archive lacks")
        needed = _tensor_bytes(payload.get("tensor_meta"))
        if needed is None or needed > record.size:
            raise ValueError(
                f"{name}: {fqn[:80]!r} claims {'malformed sizes' if needed is None else f'{needed} bytes'}; "
                f"its record {path_name} holds {record.size}"
            )


def _int(value) -> int | None:
    """The integer of a serialized ``{"as_int": N}``, or None (a symbolic size: not a weight's)."""
    inner = value.get("as_int") if isinstance(value, dict) and len(value) == 1 else None
    return inner if type(inner) is int and inner >= 0 else None


def _tensor_bytes(meta) -> int | None:
    """The bytes a tensor of `meta` (torch.export's tensor_meta) reads from its record: its last
    element's offset, plus one, times its element size; None when `meta` is not a plain tensor's."""
    if not isinstance(meta, dict) or meta.get("dtype") not in ELEMENT_BYTES:
        return None
    sizes, strides = meta.get("sizes"), meta.get("strides")
    if not isinstance(sizes, list) or not isinstance(strides, list):
        return None
    if len(sizes) != len(strides) or len(sizes) > MAX_DIMS:
        return None
    sizes, strides = [_int(s) for s in sizes], [_int(s) for s in strides]
    offset = _int(meta.get("storage_offset", {"as_int": 0}))
    if None in sizes or None in strides or offset is None:
        return None
    if 0 in sizes:
        return 0
    last = offset + sum((size - 1) * stride for size, stride in zip(sizes, strides))
    return (last + 1) * ELEMENT_BYTES[meta["dtype"]]


def _check_graph(name: str, graph) -> None:
    for key, value in _items(graph):
        if key == "target" and isinstance(value, str) and not SAFE_TARGET.fullmatch(value):
            kind = "an ATen op no aiorl network uses" if ATEN_TARGET.fullmatch(value) else "not an ATen op"
            raise ValueError(f"{name}: a node calls {value[:80]!r}, {kind}")
        if key == "expr_str" and isinstance(value, str):
            _check_expression(name, value)


def _items(node):
    """Every (key, value) pair of a JSON tree, depth first."""
    stack = [node]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            for key, value in item.items():
                yield key, value
                stack.append(value)
        elif isinstance(item, list):
            stack.extend(item)


def _check_expression(name: str, expr: str) -> None:
    if len(expr) > MAX_EXPR_CHARS:
        raise ValueError(f"{name}: a shape expression is {len(expr)} characters long, more than {MAX_EXPR_CHARS}")
    pos, tokens, depth, previous = 0, 0, 0, None
    while pos < len(expr):
        match = EXPR_TOKEN.match(expr, pos)
        if match is None or match.end() == pos:
            if expr[pos:].strip() == "":
                return
            raise ValueError(f"{name}: shape expression {expr[:80]!r} is not plain arithmetic")
        ident, number, op = match.group(1), match.group(2), match.group(4)
        if ident is not None and ident not in EXPR_NAMES and not SYMBOL_NAME.fullmatch(ident):
            raise ValueError(f"{name}: shape expression {expr[:80]!r} names {ident!r}")
        depth += {"(": 1, ")": -1}.get(op, 0)
        tokens += 1
        if op == "*" and previous == "*":
            raise ValueError(f"{name}: shape expression {expr[:80]!r} raises to a power")
        if number is not None and len(number.lstrip("0")) > MAX_EXPR_DIGITS:
            raise ValueError(f"{name}: shape expression {expr[:80]!r} holds an integer of {len(number)} digits")
        if tokens > MAX_EXPR_TOKENS or depth > MAX_EXPR_DEPTH:
            raise ValueError(f"{name}: shape expression {expr[:80]!r} is longer or deeper than a shape's")
        previous = op
        pos = match.end()


def _check_sample_inputs(name: str, data: bytes) -> None:
    import torch

    try:  # torch.load reads the inner archive as its own reader sees it: the same rules
        members(lambda offset, n: data[offset : offset + n], len(data), MAX_ENTRIES, MAX_DIRECTORY_BYTES)
    except ZipRefused as exc:
        raise ValueError(f"{name}: its archive {exc}") from None
    try:
        torch.load(io.BytesIO(data), weights_only=True)
    except Exception as exc:  # weights_only refuses anything but tensors and plain containers
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        first = re.sub(r"\x1b\[[0-9;]*[A-Za-z]|[\x00-\x1f\x7f]", "", first)  # torch's message has bold on
        raise ValueError(f"{name} is not plain tensors ({first[:200]})") from None
