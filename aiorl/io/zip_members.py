"""The members of a zip archive, as its central directory and its local headers both say.

Two readers of one archive must see the same members: Python's `zipfile` keeps the last entry
of a name twice in the central directory, torch's reader (miniz) finds the first, and a name
matched without regard to case; `zipfile` cuts a name at a NUL byte, miniz does not. A policy
checked by one and loaded by the other was the gap (issue 44). `members` reads an archive the
way neither can be fooled, from bounded reads at offsets (`read_at`), before any member's bytes
are read, and refuses (`ZipRefused`, one line) unless:

- the archive ends with its end record, no comment, no bytes before its first member and none
  between its members, its central directory and its end record (every byte is a member's);
- each name is printable ASCII, once, whatever its case;
- each member is stored as is (never compressed, never encrypted: the bytes a member takes in the
  file are the bytes it holds, so no member expands past the file), its local header names it,
  by the same bytes, at the offset the central directory gives, with the same method and sizes
  (in the header, or in the data descriptor after its bytes);
- the members do not overlap, and their count and the directory's size are within the caps.

Nothing in here imports torch: the launcher checks checkpoints with it before a resume.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass

ReadAt = Callable[[int, int], bytes]  # (offset, n) -> at most n bytes at offset

END = struct.Struct("<4sHHHHIIH")  # end of central directory record
END_SIG = b"PK\x05\x06"
LOCATOR = struct.Struct("<4sIQI")  # zip64 end of central directory locator
LOCATOR_SIG = b"PK\x06\x07"
END64 = struct.Struct("<4sQHHIIQQQQ")  # zip64 end of central directory record
END64_SIG = b"PK\x06\x06"
CENTRAL = struct.Struct("<4sHHHHHHIIIHHHHHII")
CENTRAL_SIG = b"PK\x01\x02"
LOCAL = struct.Struct("<4sHHHHHIIIHH")
LOCAL_SIG = b"PK\x03\x04"
DESCRIPTOR_SIG = b"PK\x07\x08"
ZIP64_EXTRA = 0x0001
MAX_EXTRA = 256  # torch pads a header's extra field to align the data (under 64 bytes) + zip64's 28
ENCRYPTED, DESCRIPTOR = 0x1, 0x8
FULL32, FULL16 = 0xFFFFFFFF, 0xFFFF


class ZipRefused(ValueError):
    """An archive two zip readers could read differently, or that claims more than it holds."""


@dataclass(frozen=True)
class Member:
    name: str
    offset: int  # of its local header
    data_offset: int  # of its bytes
    size: int  # stored: what it takes in the file is what it holds
    crc: int
    end: int  # past its bytes and its data descriptor, if any


def members(read_at: ReadAt, size: int, max_entries: int, max_directory_bytes: int) -> list[Member]:
    """The archive's members in central directory order; ZipRefused naming the first thing wrong."""
    count, directory_offset, directory_size = _end_record(read_at, size, max_entries, max_directory_bytes)
    directory = _exact(read_at, directory_offset, directory_size, "central directory")
    found, seen, pos = [], set(), 0
    for _ in range(count):
        member, pos = _central_entry(read_at, directory, pos)
        folded = member.name.casefold()
        if folded in seen:
            raise ZipRefused(f"holds an entry named {member.name!r} twice (each reader takes another copy)")
        seen.add(folded)
        found.append(member)
    if pos != directory_size:
        raise ZipRefused(f"central directory holds {directory_size - pos} bytes past its {count} entries")
    _check_tiling(found, directory_offset)
    return found


def read_member(read_at: ReadAt, member: Member, cap: int, what: str) -> bytes:
    """A member's bytes, refused before reading when it holds more than `cap`."""
    if member.size > cap:
        raise ZipRefused(f"{member.name} is {member.size} bytes, more than {cap} for {what}")
    return _exact(read_at, member.data_offset, member.size, member.name)


def _exact(read_at: ReadAt, offset: int, n: int, what: str) -> bytes:
    data = read_at(offset, n)
    if len(data) != n:
        raise ZipRefused(f"is truncated ({what}: {len(data)} of {n} bytes at offset {offset})")
    return data


def _end_record(read_at: ReadAt, size: int, max_entries: int, max_directory_bytes: int) -> tuple[int, int, int]:
    """(entries, directory offset, directory size) from the end record, which must end the file."""
    if size < END.size:
        raise ZipRefused(f"is truncated ({size} bytes, no end record)")
    end_offset = size - END.size
    sig, disk, disk_cd, count, total, directory_size, directory_offset, comment = END.unpack(
        _exact(read_at, end_offset, END.size, "end record")
    )
    if sig != END_SIG or comment:
        raise ZipRefused("is truncated or has trailing bytes (it does not end with a zip end record)")
    if disk or disk_cd or count != total:
        raise ZipRefused("spans several disks")
    directory_end = end_offset
    # torch writes a zip64 end record whatever the sizes; zipfile and miniz read one when it is there.
    if end_offset >= LOCATOR.size and read_at(end_offset - LOCATOR.size, 4) == LOCATOR_SIG:
        wide = _zip64_end(read_at, end_offset)
        for narrow, value, full in zip((count, directory_offset, directory_size), wide, (FULL16, FULL32, FULL32)):
            if narrow not in (full, value):
                raise ZipRefused("its zip64 end record and its end record disagree")
        count, directory_offset, directory_size, directory_end = wide
    elif FULL16 in (count, total) or FULL32 in (directory_size, directory_offset):
        raise ZipRefused("is truncated (no zip64 locator)")
    if count > max_entries:
        raise ZipRefused(f"holds {count} entries, more than {max_entries}")
    if directory_size > max_directory_bytes:
        raise ZipRefused(f"central directory is {directory_size} bytes, more than {max_directory_bytes}")
    if directory_offset + directory_size != directory_end:
        raise ZipRefused(
            f"central directory ({directory_size} bytes at {directory_offset}) does not end where its end record starts"
        )
    return count, directory_offset, directory_size


def _zip64_end(read_at: ReadAt, end_offset: int) -> tuple[int, int, int, int]:
    sig, disk, end64_offset, disks = LOCATOR.unpack(
        _exact(read_at, end_offset - LOCATOR.size, LOCATOR.size, "zip64 locator")
    )
    if sig != LOCATOR_SIG or disk or disks != 1 or end64_offset + END64.size != end_offset - LOCATOR.size:
        raise ZipRefused("zip64 locator does not point at the record before it")
    fields = END64.unpack(_exact(read_at, end64_offset, END64.size, "zip64 end record"))
    sig, record_size, _, _, disk, disk_cd, count, total, directory_size, directory_offset = fields
    if sig != END64_SIG or record_size != END64.size - 12 or disk or disk_cd or count != total:
        raise ZipRefused("zip64 end record is malformed")
    return count, directory_offset, directory_size, end64_offset


def _name(raw: bytes) -> str:
    if not raw or not all(0x20 < b < 0x7F for b in raw):
        raise ZipRefused(f"holds an entry named {raw[:80]!r}: not printable ASCII")
    return raw.decode("ascii")


def _zip64_sizes(extra: bytes, wanted: list[int]) -> list[int]:
    """`wanted` with each 0xFFFFFFFF taken, in order, from the zip64 extra field."""
    pos = 0
    while pos + 4 <= len(extra):
        tag, length = struct.unpack_from("<HH", extra, pos)
        if tag == ZIP64_EXTRA:
            values, at = [], pos + 4
            for value in wanted:
                if value == FULL32:
                    if at + 8 > pos + 4 + length:
                        raise ZipRefused("zip64 extra field is too short")
                    value = struct.unpack_from("<Q", extra, at)[0]
                    at += 8
                values.append(value)
            return values
        pos += 4 + length
    if FULL32 in wanted:
        raise ZipRefused("an entry's sizes need a zip64 extra field it does not have")
    return wanted


def _central_entry(read_at: ReadAt, directory: bytes, pos: int) -> tuple[Member, int]:
    if pos + CENTRAL.size > len(directory):
        raise ZipRefused("central directory is truncated")
    fields = CENTRAL.unpack_from(directory, pos)
    sig, _, _, flags, method, _, _, crc, csize, usize, nlen, elen, clen, disk, _, _, offset = fields
    if sig != CENTRAL_SIG:
        raise ZipRefused(f"central directory entry at {pos} is malformed")
    start = pos + CENTRAL.size
    raw_name, extra = directory[start : start + nlen], directory[start + nlen : start + nlen + elen]
    name = _name(raw_name)
    if elen > MAX_EXTRA or clen:
        raise ZipRefused(f"{name} carries {elen} bytes of extra field and a {clen}-byte comment")
    if flags & ENCRYPTED or method != 0:
        raise ZipRefused(f"{name} is compressed or encrypted (method {method}); only stored entries are read")
    usize, csize, offset = _zip64_sizes(extra, [usize, csize, offset])
    if usize != csize or disk not in (0, FULL16):
        raise ZipRefused(f"{name} says it holds {usize} bytes but takes {csize}")
    member = _local_entry(read_at, name, raw_name, offset, flags, crc, csize)
    return member, start + nlen + elen + clen


def _local_entry(read_at: ReadAt, name: str, raw_name: bytes, offset: int, flags: int, crc: int, size: int) -> Member:
    fields = LOCAL.unpack(_exact(read_at, offset, LOCAL.size, f"{name}'s local header"))
    sig, _, local_flags, method, _, _, local_crc, csize, usize, nlen, elen = fields
    head = _exact(read_at, offset + LOCAL.size, nlen + elen, f"{name}'s local header") if sig == LOCAL_SIG else b""
    if sig != LOCAL_SIG or head[:nlen] != raw_name:
        raise ZipRefused(f"{name}: the local header at offset {offset} names another entry")
    if method != 0 or local_flags != flags or elen > MAX_EXTRA:
        raise ZipRefused(f"{name}: its local header disagrees with the central directory (method, flags)")
    data_offset = offset + LOCAL.size + nlen + elen
    end = data_offset + size
    if flags & DESCRIPTOR:  # the header's CRC and sizes are unknown (zero, or zip64's marks): read none
        end = _descriptor_end(read_at, name, end, crc, size)
    elif (local_crc, *_zip64_sizes(head[nlen:], [usize, csize])) != (crc, size, size):
        raise ZipRefused(f"{name}: its local header's sizes or CRC disagree with the central directory")
    return Member(name, offset, data_offset, size, crc, end)


def _descriptor_end(read_at: ReadAt, name: str, offset: int, crc: int, size: int) -> int:
    """Where the data descriptor after a member's bytes ends; it must repeat the CRC and sizes."""
    data = read_at(offset, 24)
    for skip in (4, 0) if data[:4] == DESCRIPTOR_SIG else (0,):
        for fmt in ("<III", "<IQQ"):
            width = struct.calcsize(fmt)
            if len(data) >= skip + width and struct.unpack_from(fmt, data, skip) == (crc, size, size):
                return offset + skip + width
    raise ZipRefused(f"{name}: its data descriptor disagrees with the central directory")


def _check_tiling(found: list[Member], directory_offset: int) -> None:
    """The members, in file order, take every byte before the central directory, each its own."""
    at = 0
    for member in sorted(found, key=lambda m: m.offset):
        if member.offset < at:
            raise ZipRefused(f"{member.name} overlaps the entry before it")
        if member.offset > at:
            raise ZipRefused(f"{member.offset - at} bytes before {member.name} belong to no entry")
        at = member.end
    if at != directory_offset:
        raise ZipRefused(f"{directory_offset - at} bytes before the central directory belong to no entry")
