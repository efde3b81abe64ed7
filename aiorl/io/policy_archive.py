"""A ``.pt2`` policy checked before torch loads it: nothing in it can run code.

Policies are meant to be shared, and torch's export loader trusts its archive: it
unpickles (falling back to ``weights_only=False``) the sample inputs and any weight or
constant marked ``use_pickle``, unpickles custom and opaque objects, loads compiled
AOTInductor libraries, resolves every ``torch.*`` name the graph gives as a node's target
(``torch.hub.load`` as well as ``torch.ops.aten.add``) and parses shape expressions with
sympy, whose parser evaluates Python. aiorl's exports hold none of that but aten ops,
raw tensor bytes, JSON and plain-tensor sample inputs, so an archive is refused unless:

- every entry is one of those aiorl writes (a whitelist of paths);
- no weight or constant is pickled, and every constant is a tensor;
- the sample inputs load with ``torch.load(weights_only=True)`` (so torch never falls back);
- every node target is an ATen or Python ``operator`` op;
- every shape expression is names, integers and arithmetic (``Symbol('s1', positive=True,
  integer=True)``), nothing that could reach an attribute or a call of its own.

`check_policy_archive` reads the archive (with bounded sizes) and raises ValueError naming
the first thing refused; it loads nothing.
"""

from __future__ import annotations

import io
import json
import re
import zipfile
from pathlib import Path

MAX_ENTRIES = 4096
MAX_JSON_BYTES = 64 << 20  # a graph's JSON; aiorl's policies are a few hundred KB
# Paths under the archive's root directory that aiorl's exports contain.
ALLOWED_PATHS = re.compile(
    r"(archive_format|archive_version|byteorder|\.data/version|\.data/serialization_id"
    r"|models/\w+\.json|data/weights/\w+_weights_config\.json|data/weights/weight_\d+"
    r"|data/constants/\w+_constants_config\.json|data/constants/tensor_\d+"
    r"|data/sample_inputs/\w+\.pt|extra/[\w.\-]+)"
)
SAFE_TARGET = re.compile(r"(torch\.ops\.(aten|prims)\.\w+\.\w+|_operator\.\w+)")
# A shape expression: these names, symbols (s0, u3, ...), integers, arithmetic and the keyword
# arguments of Symbol; no attribute access, no double underscores, no string but a symbol name.
EXPR_NAMES = {"Symbol", "Integer", "positive", "integer", "True", "False", "Mod", "FloorDiv", "Max", "Min"}
EXPR_NAMES |= {"CeilToInt", "FloorToInt", "PythonMod", "IntTrueDiv", "TruncToInt", "Abs", "Ne", "Eq", "Gt", "Lt"}
EXPR_TOKEN = re.compile(r"\s*(?:([A-Za-z_]\w*)|(\d+)|('[a-z]+\d+')|([-+*/%(),=<>!]))")
SYMBOL_NAME = re.compile(r"[a-z]+\d+")


def check_policy_archive(path: str | Path) -> None:
    """Raise ValueError naming what `path` holds that could run code when torch loads it."""
    try:
        archive = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as exc:
        raise ValueError(f"not a policy archive ({exc})") from None
    with archive:
        infos = archive.infolist()
        if not infos or len(infos) > MAX_ENTRIES:
            raise ValueError(f"{len(infos)} entries, expected 1 to {MAX_ENTRIES}")
        root = infos[0].filename.split("/", 1)[0]
        entries = {}
        for info in infos:
            top, _, rest = info.filename.partition("/")
            if top != root or not ALLOWED_PATHS.fullmatch(rest):
                raise ValueError(f"it holds {info.filename!r}, which an aiorl policy never does")
            entries[rest] = info
        for rest, info in entries.items():
            if rest.endswith("_config.json"):
                _check_payload_config(rest, _json(archive, info))
            elif rest.startswith("models/"):
                _check_graph(rest, _json(archive, info))
            elif rest.startswith("data/sample_inputs/"):
                _check_sample_inputs(rest, archive.read(info))


def _json(archive: zipfile.ZipFile, info: zipfile.ZipInfo):
    if info.file_size > MAX_JSON_BYTES:
        raise ValueError(f"{info.filename} is {info.file_size} bytes, more than a policy's graph")
    try:
        return json.loads(archive.read(info))
    except ValueError as exc:
        raise ValueError(f"{info.filename} is not JSON ({exc})") from None


def _check_payload_config(name: str, config) -> None:
    entries = config.get("config") if isinstance(config, dict) else None
    if not isinstance(entries, dict):
        raise ValueError(f"{name} is not a payload config")
    for fqn, payload in entries.items():
        if not isinstance(payload, dict) or payload.get("use_pickle") is not False:
            raise ValueError(f"{name}: {fqn!r} is pickled; an aiorl policy stores tensors as raw bytes")
        path_name = str(payload.get("path_name", ""))
        if not re.fullmatch(r"(weight|tensor)_\d+", path_name):
            raise ValueError(f"{name}: {fqn!r} is stored as {path_name!r}, not as a tensor")


def _check_graph(name: str, graph) -> None:
    for key, value in _items(graph):
        if key == "target" and isinstance(value, str) and not SAFE_TARGET.fullmatch(value):
            raise ValueError(f"{name}: a node calls {value[:80]!r}, not an ATen op")
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
    pos = 0
    while pos < len(expr):
        match = EXPR_TOKEN.match(expr, pos)
        if match is None or match.end() == pos:
            if expr[pos:].strip() == "":
                return
            raise ValueError(f"{name}: shape expression {expr[:80]!r} is not plain arithmetic")
        ident = match.group(1)
        if ident is not None and ident not in EXPR_NAMES and not SYMBOL_NAME.fullmatch(ident):
            raise ValueError(f"{name}: shape expression {expr[:80]!r} names {ident!r}")
        pos = match.end()


def _check_sample_inputs(name: str, data: bytes) -> None:
    import torch

    try:
        torch.load(io.BytesIO(data), weights_only=True)
    except Exception as exc:  # weights_only refuses anything but tensors and plain containers
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ValueError(f"{name} is not plain tensors ({first[:200]})") from None
