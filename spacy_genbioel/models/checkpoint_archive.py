"""The zip archive of a ``torch.save`` checkpoint, checked member by member before
anything in it is unpickled.

``torch.load`` reads the archive with PyTorch's own zip reader (miniz through
``torch._C.PyTorchFileReader``), which finds records by their names
case-insensitively, under the first member's folder, through the central
directory the end record points to; Python's :mod:`zipfile` reads the same bytes
differently (it shifts offsets over data prepended to the archive, and keeps the
last of two equal names). So that the pickle scanned is the pickle PyTorch
unpickles, :func:`check_archive` parses the archive strictly and refuses any
layout on which two readers could disagree: bytes before the first member or
between members, a second central directory or end record, a comment, names
equal but for case, members outside ``torch.save``'s layout, compressed members
(a deflated storage would be memory-mapped as its compressed bytes) and a
pickle over :data:`PICKLE_CAP` bytes; :func:`read_record` then reads a member
through PyTorch's own reader, checked against the same offsets and sizes.
"""

from __future__ import annotations

import logging
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Dict, List, Tuple

from spacy_genbioel.models.hf import ModelFormatError

logger = logging.getLogger(__name__)

__all__ = ["PICKLE_CAP", "ArchiveLayout", "CheckpointError", "Member", "check_archive", "read_record"]

#: the largest pickle member read (bart-large's data.pkl is about 60 KB: tensors are in their own members)
PICKLE_CAP = 64 << 20
#: the members ``torch.save`` writes, under the archive's folder (``<prefix>/``)
LAYOUT = re.compile(
    r"(data\.pkl|version|\.data/version|byteorder|\.data/serialization_id|\.format_version|\.storage_alignment"
    r"|data/[0-9]{1,12})"
)
_LOCAL = struct.Struct("<IHHHHHIIIHH")
_CENTRAL = struct.Struct("<IHHHHHHIIIHHHHHII")
_END = struct.Struct("<IHHHHIIH")
_END64 = struct.Struct("<IQHHIIQQQQ")
_LOCATOR = struct.Struct("<IIQI")
_SIG_LOCAL, _SIG_CENTRAL, _SIG_END, _SIG_END64, _SIG_LOCATOR, _SIG_DESCRIPTOR = (
    0x04034B50,
    0x02014B50,
    0x06054B50,
    0x06064B50,
    0x07064B50,
    0x08074B50,
)
_MAX32 = 0xFFFFFFFF
_MAX_MEMBERS = 1 << 20
_HINT = "not an archive torch.save writes; re-save the state dict with torch.save, from a source you trust"


class CheckpointError(ModelFormatError):
    """A checkpoint that is refused or cannot be imported; the message names the file."""


@dataclass(frozen=True)
class Member:
    """One member of the archive: where its bytes start and how many there are."""

    name: str
    data_offset: int
    size: int


@dataclass
class ArchiveLayout:
    """A ``torch.save`` archive whose layout :func:`check_archive` accepted."""

    path: Path
    #: the folder every member is under (``archive``, ``pytorch_model``)
    prefix: str
    #: members by their name under the prefix (``data.pkl``, ``data/0``)
    members: Dict[str, Member] = field(default_factory=dict)


def _refuse(path: Path, what: str) -> CheckpointError:
    return CheckpointError(f"{path}: refused: {what}: {_HINT}")


def _read_at(handle: IO[bytes], offset: int, size: int) -> bytes:
    handle.seek(offset)
    return handle.read(size)


def _zip64_values(extra: bytes, wanted: List[str]) -> Dict[str, int]:
    """The 64-bit values of a zip64 extra field (id 1) for the header fields that were 0xFFFFFFFF."""
    pos = 0
    while pos + 4 <= len(extra):
        kind, size = struct.unpack_from("<HH", extra, pos)
        body = extra[pos + 4 : pos + 4 + size]
        if kind == 1:
            if len(body) < 8 * len(wanted):
                return {}
            return {name: struct.unpack_from("<Q", body, 8 * i)[0] for i, name in enumerate(wanted)}
        pos += 4 + size
    return {}


def _end_record(path: Path, handle: IO[bytes], total: int) -> Tuple[int, int, int, int]:
    """``(members, central directory offset, its size, where it must end)`` from the end record
    at the very end of the file (and its zip64 record right before it, when there is one)."""
    if total < _END.size:
        raise _refuse(path, f"{total} bytes, too short for a zip archive")
    end_at = total - _END.size
    sig, disk, cd_disk, on_disk, count, cd_size, cd_offset, comment = _END.unpack(_read_at(handle, end_at, _END.size))
    if sig != _SIG_END or comment:
        raise _refuse(path, "the zip end record is not the last 22 bytes (a comment, or bytes after the archive)")
    if disk or cd_disk or on_disk != count:
        raise _refuse(path, "a zip archive split over several disks")
    cd_end = end_at
    if end_at >= _LOCATOR.size + _END64.size:
        loc_sig, _, end64_at, disks = _LOCATOR.unpack(_read_at(handle, end_at - _LOCATOR.size, _LOCATOR.size))
        if loc_sig == _SIG_LOCATOR:
            cd_end = end_at - _LOCATOR.size - _END64.size
            fields = _END64.unpack(_read_at(handle, cd_end, _END64.size))
            if fields[0] != _SIG_END64 or end64_at != cd_end or fields[1] != _END64.size - 12 or disks > 1:
                raise _refuse(
                    path,
                    "the zip64 end record is not where its locator says, right before the end record "
                    "(data prepended to the archive, or a second end record)",
                )
            if fields[6] != fields[7]:
                raise _refuse(path, "a zip archive split over several disks")
            count, cd_size, cd_offset = fields[7], fields[8], fields[9]
    if cd_offset + cd_size != cd_end:
        raise _refuse(
            path,
            f"the central directory is recorded at bytes {cd_offset}-{cd_offset + cd_size}, not where it ends "
            f"({cd_end}): data prepended to the archive, or a second central directory or end record",
        )
    if count > _MAX_MEMBERS:
        raise _refuse(path, f"{count} members")
    return count, cd_offset, cd_size, cd_end


def _central_entries(path: Path, handle: IO[bytes], count: int, cd_offset: int, cd_end: int) -> List[Tuple]:
    """``(name, local header offset, size, flags)`` of every central directory entry, in order."""
    entries = []
    pos = cd_offset
    for _ in range(count):
        head = _read_at(handle, pos, _CENTRAL.size)
        if len(head) < _CENTRAL.size or pos + _CENTRAL.size > cd_end:
            raise _refuse(path, "the central directory ends before its last member")
        (sig, _, _, flags, method, _, _, _, csize, usize, name_len, extra_len, comment_len, disk, _, _, offset) = (
            _CENTRAL.unpack(head)
        )
        raw = _read_at(handle, pos + _CENTRAL.size, name_len + extra_len)
        if sig != _SIG_CENTRAL or len(raw) < name_len + extra_len:
            raise _refuse(path, f"the central directory entry at byte {pos} is damaged")
        name = raw[:name_len].decode("ascii", "replace")
        wanted = [key for key, value in (("usize", usize), ("csize", csize), ("offset", offset)) if value == _MAX32]
        if wanted:
            wide = _zip64_values(raw[name_len:], wanted)
            if len(wide) != len(wanted):
                raise _refuse(path, f"member {name!r}: a zip64 size without its zip64 field")
            usize, csize, offset = wide.get("usize", usize), wide.get("csize", csize), wide.get("offset", offset)
        if method != 0 or csize != usize:
            raise _refuse(
                path,
                f"member {name!r} is compressed (method {method}, {csize} bytes for {usize}); torch.save stores "
                "every member uncompressed (a compressed storage would be read as its compressed bytes)",
            )
        if flags & 0x41:
            raise _refuse(path, f"member {name!r} is encrypted")
        if comment_len or disk:
            raise _refuse(path, f"member {name!r} has a comment or lies on another disk")
        entries.append((name, raw[:name_len], offset, usize, flags))
        pos += _CENTRAL.size + name_len + extra_len + comment_len
    if pos != cd_end:
        raise _refuse(path, f"{cd_end - pos} bytes in the central directory after its {count} members")
    return entries


def _member_names(path: Path, entries: List[Tuple]) -> str:
    """The archive's folder, having refused names outside torch.save's layout or equal but for case."""
    if not entries:
        raise _refuse(path, "an empty zip archive")
    seen: Dict[str, str] = {}
    prefix = entries[0][0].split("/", 1)[0]
    for name, raw, *_ in entries:
        if not raw.isascii() or not name.isprintable():
            raise _refuse(path, f"member name {name!r} is not printable ASCII")
        if name.lower() in seen:
            raise _refuse(
                path,
                f"members {seen[name.lower()]!r} and {name!r} have the same name but for case "
                "(PyTorch's reader could take either)",
            )
        seen[name.lower()] = name
        head, _, rest = name.partition("/")
        if head != prefix or not LAYOUT.fullmatch(rest):
            raise _refuse(
                path,
                f"member {name!r} is not one torch.save writes (under {prefix}/: data.pkl, data/<n>, version, "
                "byteorder, .format_version, .storage_alignment, .data/version, .data/serialization_id)",
            )
    if f"{prefix}/data.pkl".lower() not in seen:
        raise _refuse(path, f"no {prefix}/data.pkl in the zip archive")
    return prefix


def _walk_members(path: Path, handle: IO[bytes], entries: List[Tuple], cd_offset: int) -> List[Member]:
    """Each member's local header right after the previous member's data, from byte 0 to the central
    directory (no gap for a second archive or anything else), agreeing with the central directory."""
    members = []
    pos = 0
    for name, raw, offset, size, flags in entries:
        if offset != pos:
            where = "at the start of the file" if pos == 0 else f"between members (byte {pos})"
            raise _refuse(path, f"member {name!r} starts at byte {offset}: {offset - pos} other bytes {where}")
        head = _read_at(handle, pos, _LOCAL.size)
        if len(head) < _LOCAL.size:
            raise _refuse(path, f"member {name!r}: the file ends inside its header")
        sig, _, local_flags, method, _, _, _, csize, usize, name_len, extra_len = _LOCAL.unpack(head)
        local_name = _read_at(handle, pos + _LOCAL.size, name_len)
        if sig != _SIG_LOCAL or local_name != raw or method != 0 or (local_flags & 8) != (flags & 8):
            raise _refuse(path, f"member {name!r}: its local header does not match the central directory")
        data = pos + _LOCAL.size + name_len + extra_len
        pos = data + size
        if flags & 8:  # sizes in a data descriptor after the data, as torch.save writes them
            tail = _read_at(handle, pos, 24)
            start = 4 if tail[:4] == struct.pack("<I", _SIG_DESCRIPTOR) else 0
            widths = ((8, "<QQ"), (4, "<II")) if max(offset, size) >= _MAX32 else ((4, "<II"), (8, "<QQ"))
            for width, fmt in widths:
                end = start + 4 + 2 * width
                if len(tail) >= end and struct.unpack_from(fmt, tail, start + 4) == (size, size):
                    pos += end
                    break
            else:
                raise _refuse(path, f"member {name!r}: its data descriptor does not give its size")
        elif (csize, usize) != (size, size) and _MAX32 not in (csize, usize):
            raise _refuse(path, f"member {name!r}: its local header gives another size than the central directory")
        members.append(Member(name, data, size))
    if pos != cd_offset:
        raise _refuse(path, f"{cd_offset - pos} bytes between the last member and the central directory")
    return members


def check_archive(path: Path) -> ArchiveLayout:
    """The layout of the ``torch.save`` zip archive at ``path``, refused (naming the member, the
    byte or the size) unless it is one that PyTorch's reader and this parser read alike."""
    try:
        with path.open("rb") as handle:
            total = handle.seek(0, 2)
            count, cd_offset, _, cd_end = _end_record(path, handle, total)
            entries = _central_entries(path, handle, count, cd_offset, cd_end)
            prefix = _member_names(path, entries)
            members = _walk_members(path, handle, entries, cd_offset)
    except OSError as err:
        raise CheckpointError(f"{path}: cannot read the checkpoint ({err})") from err
    layout = ArchiveLayout(path, prefix, {m.name.split("/", 1)[1]: m for m in members})
    for name, member in layout.members.items():
        if name.endswith(".pkl") and member.size > PICKLE_CAP:
            raise CheckpointError(
                f"{path}: refused: member {member.name} holds a {member.size}-byte pickle, over the "
                f"{PICKLE_CAP >> 20} MiB a state dict's pickle needs (its tensors are in members of their own)"
            )
    return layout


def read_record(layout: ArchiveLayout, name: str) -> bytes:
    """Member ``name`` (``data.pkl``) read as ``torch.load`` reads it, through PyTorch's own zip
    reader, having checked that reader sees the members of ``layout`` at the same bytes."""
    import torch

    path = layout.path
    try:
        reader = torch._C.PyTorchFileReader(str(path))
        records = sorted(reader.get_all_records())
        if records != sorted(layout.members):
            raise _refuse(path, f"PyTorch's zip reader lists other members ({', '.join(records[:8])})")
        for record, member in layout.members.items():
            if reader.get_record_offset(record) != member.data_offset or reader.get_record_size(record) != member.size:
                raise _refuse(path, f"PyTorch's zip reader finds member {member.name} at other bytes")
        data = reader.get_record(name)
    except CheckpointError:
        raise
    except Exception as err:  # RuntimeError mostly; a damaged version record gives UnicodeDecodeError
        detail = f"{type(err).__name__}: {str(err).splitlines()[0]}" if str(err) else type(err).__name__
        raise CheckpointError(f"{path}: PyTorch's zip reader cannot read it ({detail})") from None
    if len(data) != layout.members[name].size:
        raise _refuse(path, f"PyTorch's zip reader reads {len(data)} bytes of {layout.members[name].name}")
    return bytes(data)
