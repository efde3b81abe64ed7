"""What ``torch.load(weights_only=True)`` accepts, checked without torch.

The launcher that chooses the checkpoint a resume continues from
(`aiorl.io.rundir.RunDir.resume`) never imports torch, so that a run starts
fast; it still must not choose a file the learners then cannot load. A
checkpoint's payload is a ``torch.save`` archive, and `refusal` says why torch
would refuse one, or None:

- the archive: a zip whose members are stored uncompressed, named once, under
  one directory, with good CRCs (``ZipFile.testzip``), holding ``data.pkl``
  and the small records torch's reader reads first (``version``, and
  ``byteorder`` and ``.storage_alignment`` when there) in the forms it takes;
- ``data.pkl`` run through an abstract copy of torch's weights-only unpickler
  (torch/_weights_only_unpickler.py; `PickleCheck`): only its opcodes, only
  globals of its default allowlist (`ALLOWED_GLOBALS`, the part of it a
  learner's state can need; a test checks it against the installed torch), its
  stack, mark and memo rules and the targets it allows for BUILD, APPEND and
  SETITEM; each storage (persistent id) names a record of the archive holding
  the bytes its type and element count make; a dict at the top.

Nothing is built, imported or called. What this cannot see is what torch's
rebuild functions make of their arguments: only a file crafted to pass the
check gets that wrong (`aiorl.io.checkpoint` says what then happens).
"""

from __future__ import annotations

import pickletools
import struct
import zipfile
from collections.abc import Callable
from typing import BinaryIO

from aiorl.io.zip_members import ZipRefused, members, read_member

# A learner state's pickle is a few KB (the tensors are other members of the archive).
MAX_PICKLE_BYTES = 64 << 20
SMALL_RECORD_BYTES = 64  # version, byteorder, .storage_alignment
MAX_RECORDS = 1 << 16  # a learner state's tensors, each a record
# Any other record torch writes (.data/serialization_id, .format_version, ...) is a few bytes; a
# newer torch's may be larger, but never what makes a file far larger than its tensors.
OTHER_RECORD_BYTES = 1 << 20
MAX_DIRECTORY_BYTES = 16 << 20
_STORAGES = (
    "Double:8 Float:4 Half:2 BFloat16:2 Long:8 Int:4 Short:2 Char:1 Byte:1 Bool:1 ComplexDouble:16 ComplexFloat:8"
)
# Element sizes of the storage types ``torch.save`` names in a persistent id, by the global's name.
STORAGE_ELEMENT_BYTES = {
    **{f"torch.{kind}Storage": int(size) for kind, size in (entry.split(":") for entry in _STORAGES.split())},
    "torch.storage.UntypedStorage": 1,
}
_DTYPES = "float16 float32 float64 bfloat16 complex64 complex128 int8 int16 int32 int64 uint8 uint16 uint32 uint64 bool"
ALLOWED_GLOBALS = frozenset(
    {
        "collections.OrderedDict",
        "collections.Counter",
        "_codecs.encode",  # how protocol 2 pickles bytes
        "builtins.bytearray",
        "builtins.set",
        "builtins.complex",
        "torch.Size",
        "torch.Tensor",
        "torch.device",
        "torch.nn.parameter.Parameter",
        "torch._utils._rebuild_tensor",
        "torch._utils._rebuild_tensor_v2",
        "torch._utils._rebuild_tensor_v3",
        "torch._utils._rebuild_parameter",
        "torch._utils._rebuild_parameter_with_state",
        "torch._tensor._rebuild_from_type_v2",
        *(f"torch.{dtype}" for dtype in _DTYPES.split()),
        *STORAGE_ELEMENT_BYTES,
    }
)
# Python 2 module names torch's unpickler maps before looking a global up (protocol 2 writes them).
MODULE_ALIASES = {"__builtin__": "builtins"}
# The opcodes torch's weights-only unpickler runs (pickletools' names); any other is refused.
WEIGHTS_ONLY_OPCODES = frozenset(
    "PROTO STOP GLOBAL NEWOBJ REDUCE BUILD APPEND APPENDS SETITEM SETITEMS MARK TUPLE TUPLE1 TUPLE2 "
    "TUPLE3 NONE NEWFALSE NEWTRUE EMPTY_TUPLE EMPTY_LIST EMPTY_DICT EMPTY_SET BININT BININT1 BININT2 "
    "BINFLOAT BINUNICODE SHORT_BINSTRING LONG1 BINPERSID BINGET LONG_BINGET BINPUT LONG_BINPUT".split()
)
DICT_CLASSES = ("collections.OrderedDict", "collections.Counter")
# What zipfile raises on bytes that are no archive it can read. Not OSError: that is the file's,
# and passes through to the caller.
ZIP_ERRORS = (zipfile.BadZipFile, zipfile.LargeZipFile, ValueError, EOFError, RuntimeError, struct.error)


def refusal(file: BinaryIO) -> str | None:
    """None if ``torch.load(file, weights_only=True)`` would load `file` (a seekable binary file)
    into a dict; else why not, in a few words starting with "payload"."""

    def read_at(offset: int, n: int) -> bytes:
        file.seek(offset)
        return file.read(n)

    refused = size_refusal(read_at, file.seek(0, 2))
    if refused is not None:
        return refused
    try:
        with zipfile.ZipFile(file) as archive:
            records = archive_records(archive)
            if isinstance(records, str):
                return records
            bad = archive.testzip()
            if bad is not None:
                return f"payload archive member {bad} fails its CRC"
            prefix = archive.namelist()[0].split("/", 1)[0]
            return small_records_refusal(archive, prefix, records)
    except ZIP_ERRORS as exc:
        return f"payload is not a torch.save archive ({exc})"


def size_refusal(read_at: Callable[[int, int], bytes], size: int) -> str | None:
    """Why a payload of `size` bytes (read through `read_at(offset, n)`) is not what its own records
    say, or None; it reads the zip's directories and ``data.pkl`` only, so that a file far larger
    than what its pickle names is refused before it is hashed or read whole: the archive must be
    one `aiorl.io.zip_members` takes (stored members tiling the file, each name once), and its
    pickle must pass the weights-only check and name every tensor record the archive holds."""
    try:
        found = members(read_at, size, MAX_RECORDS, MAX_DIRECTORY_BYTES)
    except ZipRefused as exc:
        return f"payload is not a torch.save archive (it {exc})"
    if not found:
        return "payload is not a torch.save archive (it holds no entry)"
    prefix = found[0].name.split("/", 1)[0]
    by_record = {m.name.split("/", 1)[1]: m for m in found if "/" in m.name and m.name.split("/", 1)[0] == prefix}
    if len(by_record) != len(found):
        return "payload archive is not under one directory, as torch.save writes"
    records = {record: m.size for record, m in by_record.items()}
    if records.get("data.pkl", MAX_PICKLE_BYTES + 1) > MAX_PICKLE_BYTES:
        return f"payload archive has no data.pkl of at most {MAX_PICKLE_BYTES} bytes"
    try:
        pickle = read_member(read_at, by_record["data.pkl"], MAX_PICKLE_BYTES, "a pickle")
    except ZipRefused as exc:  # the file shrank since its directory was read
        return f"payload is not a torch.save archive (it {exc})"
    check = PickleCheck(records)
    refused = check.run(pickle)
    if refused is not None:
        return f"payload does not load with weights_only=True: {refused}"
    for record, nbytes in records.items():
        if record.startswith("data/") and record not in check.storages:
            return f"payload archive record {record} ({nbytes} bytes) holds no tensor of its pickle"
        if not record.startswith("data/") and record != "data.pkl" and nbytes > OTHER_RECORD_BYTES:
            return f"payload archive record {record} is {nbytes} bytes"
    return None


def archive_records(archive: zipfile.ZipFile) -> dict[str, int] | str:
    """Record name (under the archive's one directory) -> size, or why torch's reader would not
    take the archive as ``torch.save`` writes one (stored, each name once, one directory)."""
    members = archive.infolist()
    if len({m.filename.split("/", 1)[0] for m in members}) != 1 or any("/" not in m.filename for m in members):
        return "payload archive is not under one directory, as torch.save writes"
    records: dict[str, int] = {}
    for m in members:
        if m.compress_type != zipfile.ZIP_STORED:
            return f"payload archive member {m.filename} is compressed"
        record = m.filename.split("/", 1)[1]
        if record in records:
            return f"payload archive holds {m.filename} twice"
        records[record] = m.file_size
    return records


def small_records_refusal(archive: zipfile.ZipFile, prefix: str, records: dict[str, int]) -> str | None:
    """Why torch's reader would refuse the archive's small records, or None: ``version`` must be
    there and a whole number of at least 1 (no upper bound: a newer torch writes what it reads);
    ``byteorder`` and ``.storage_alignment``, when there, little or big and a whole number."""
    rules = {
        "version": lambda text: text.strip().isdigit() and int(text) >= 1,
        "byteorder": lambda text: text in ("little", "big"),  # compared as is
        ".storage_alignment": lambda text: text.strip().isdigit(),
    }
    if "version" not in records:
        return "payload archive has no version record"
    for record, good in rules.items():
        if record not in records:
            continue
        if records[record] > SMALL_RECORD_BYTES:
            return f"payload archive record {record} is {records[record]} bytes"
        text = archive.read(f"{prefix}/{record}").decode("ascii", "replace")
        if not good(text):
            return f"payload archive record {record} holds {text!r}"
    return None


class Global(str):
    """A global the pickle named (its allowed dotted name)."""


class Made(str):
    """What an allowed global built (REDUCE, NEWOBJ, a storage); the global's name."""


class List:
    pass


class Dict:
    pass


class Set:
    pass


class Refused(Exception):
    pass


def is_dict(value) -> bool:
    return isinstance(value, Dict) or (isinstance(value, Made) and value in DICT_CLASSES)


class PickleCheck:
    """Torch's weights-only unpickler with abstract values: the same opcodes and allowed globals, the
    same stack, mark and memo rules and targets of BUILD, APPEND and SETITEM, and storages checked
    against the archive's records."""

    def __init__(self, records: dict[str, int]):
        self.records = records
        self.stack: list = []
        self.metastack: list[list] = []
        self.memo: dict[int, object] = {}
        self.storages: set[str] = set()  # the records its persistent ids name

    def run(self, pickle: bytes) -> str | None:
        """None if torch would load `pickle` into a dict; else why not."""
        try:
            for op, arg, _ in pickletools.genops(pickle):
                if op.name not in WEIGHTS_ONLY_OPCODES:
                    raise Refused(f"opcode {op.name} is not one weights_only runs")
                if op.name == "STOP":
                    top = self.stack.pop()
                    return None if is_dict(top) else f"it holds a {type(top).__name__}, not a dict"
                self.step(op.name, arg)
        except Refused as exc:
            return str(exc)
        except (IndexError, KeyError, ValueError, TypeError) as exc:  # an empty stack, an unknown memo key, ...
            return f"malformed pickle ({type(exc).__name__}: {exc})"
        return "malformed pickle (no STOP)"

    def pop_mark(self) -> list:
        items, self.stack = self.stack, self.metastack.pop()
        return items

    def step(self, op: str, arg) -> None:
        stack = self.stack
        if op == "GLOBAL":
            module, name = arg.split(" ", 1)
            full = f"{MODULE_ALIASES.get(module, module)}.{name}"
            if full not in ALLOWED_GLOBALS:
                raise Refused(f"global {full} is not allowed")
            stack.append(Global(full))
        elif op in ("REDUCE", "NEWOBJ"):
            args, func = stack.pop(), stack.pop()
            if not isinstance(func, Global) or not isinstance(args, tuple):
                raise Refused(f"{op} of {func!r} with {type(args).__name__} arguments")
            stack.append(Made(func))
        elif op == "BUILD":
            stack.pop()
            if not isinstance(stack[-1], Made):
                raise Refused(f"BUILD of a {type(stack[-1]).__name__}")
        elif op in ("APPEND", "APPENDS"):
            if op == "APPEND":
                stack.pop()
            else:
                self.pop_mark()
            if not isinstance(self.stack[-1], List):
                raise Refused(f"{op} to a {type(self.stack[-1]).__name__}")
        elif op in ("SETITEM", "SETITEMS"):
            items = [stack.pop(), stack.pop()] if op == "SETITEM" else self.pop_mark()
            if len(items) % 2 or not is_dict(self.stack[-1]):
                raise Refused(f"{op} of {len(items)} items to a {type(self.stack[-1]).__name__}")
        elif op == "MARK":
            self.metastack.append(stack)
            self.stack = []
        elif op == "TUPLE":
            self.pop_mark()
            self.stack.append(tuple(stack))
        elif op in ("TUPLE1", "TUPLE2", "TUPLE3"):
            n = int(op[-1])
            if len(stack) < n:
                raise IndexError("the stack holds too few items")
            stack[-n:] = [tuple(stack[-n:])]
        elif op == "BINPERSID":
            stack.append(self.storage(stack.pop()))
        elif op in ("BINGET", "LONG_BINGET"):
            stack.append(self.memo[arg])
        elif op in ("BINPUT", "LONG_BINPUT"):
            self.memo[arg] = stack[-1]
        elif op in ("EMPTY_LIST", "EMPTY_DICT", "EMPTY_SET"):
            stack.append({"EMPTY_LIST": List, "EMPTY_DICT": Dict, "EMPTY_SET": Set}[op]())
        elif op != "PROTO":  # a plain value
            stack.append({"NONE": None, "NEWFALSE": False, "NEWTRUE": True, "EMPTY_TUPLE": ()}.get(op, arg))

    def storage(self, pid) -> Made:
        """A persistent id as torch's loader reads one: ('storage', storage type, key, location,
        numel), and the record ``data/<key>`` holding numel elements of that type."""
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] in ("storage", b"storage")):
            raise Refused(f"persistent id {pid!r} is not a storage")
        _, kind, key, location, numel = pid
        if not isinstance(kind, Global) or kind not in STORAGE_ELEMENT_BYTES:
            raise Refused(f"persistent id names {kind!r}, not a storage type")
        if not isinstance(key, str) or not isinstance(location, (str, bytes)) or type(numel) is not int or numel < 0:
            raise Refused(f"persistent id {pid!r} is malformed")
        record, nbytes = f"data/{key}", numel * STORAGE_ELEMENT_BYTES[kind]
        if self.records.get(record) != nbytes:
            raise Refused(
                f"storage {key} needs a record {record} of {nbytes} bytes; the archive has {self.records.get(record)}"
            )
        self.storages.add(record)
        return Made(kind)
