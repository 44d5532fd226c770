"""Bytes to lines for the annotation readers, one line at a time, so that a bad
line costs that line and a damaged file costs what follows the damage.

* :func:`decoded_lines` -- (line number, text or None, problem) per line. Lines
  end at ``\\n`` (a ``\\r`` before it is dropped); a file whose first 64 KB hold
  ``\\r`` but no ``\\n`` (old Mac line ends) is split at ``\\r``. Each line is
  decoded alone; a truncated or corrupt ``.gz`` ends the stream with one problem
  entry for the rest of the file.
* :func:`json_lines` -- parsed JSON per non-blank line, or the
  :class:`~spacy_genbioel.annotate.records.RecordError` of a line that is not
  JSON (including JSON nested too deeply for the parser).
* :func:`read_head` -- the start of a file as text for format detection, as much
  of it as a truncated or corrupt ``.gz`` gives, and what went wrong.
* :func:`read_blocks` -- the bytes under all of them: a ``.gz`` is inflated here
  in small pieces (not by :mod:`gzip`, which loses up to 128 KB of good data
  before the damage), so everything before a cut or corrupt spot is read.

:func:`spacy_genbioel.util.iter_lines` reads corpus files, where a bad line stops
the read; these keep going.
"""
from __future__ import annotations

import contextlib
import gzip
import json
import zlib
from pathlib import Path
from typing import Any, Iterator, List, Optional, Tuple, Union

from spacy_genbioel.annotate.records import RecordError
from spacy_genbioel.progress import watch_file

__all__ = ["BLOCK", "READ_ERRORS", "decoded_lines", "first_json_value", "json_lines", "read_blocks", "read_head"]

BLOCK = 1 << 16
# what reading a damaged file raises: a cut .gz (EOFError), a bad gzip header or CRC (OSError), bad deflate data (zlib.error)
READ_ERRORS = (OSError, EOFError, zlib.error)


def read_blocks(path: Path, size: int = BLOCK, piece: int = 256) -> Iterator[bytes]:
    """The bytes of a file in blocks of at most ``size``, a ``.gz`` (told by its magic bytes)
    inflated. A cut ``.gz`` raises EOFError, corrupt deflate data ``zlib.error``, a bad header
    or check ``OSError`` -- after the blocks before the damage: the compressed data is inflated
    ``piece`` bytes at a time, so damage costs what follows it, not the block it is in."""
    with path.open("rb") as handle:
        watch_file(path, handle)  # a progress bar over input bytes reads its position
        if handle.read(2) != b"\x1f\x8b":
            handle.seek(0)
            while data := handle.read(size):
                yield data
            return
        handle.seek(0)
        inflate = zlib.decompressobj(wbits=31)
        packed = b""
        while True:
            if not packed:
                packed = handle.read(piece)
                if not packed:
                    tail = inflate.flush()  # output held back by the size limit
                    if tail:
                        yield tail
                    if inflate.eof:
                        return
                    raise EOFError("the gzip data ends early (a cut file)")
            data = inflate.decompress(packed, size)
            packed = inflate.unconsumed_tail
            if data:
                yield data
            if inflate.eof:  # the end of a gzip member: another one may follow (zero padding allowed)
                rest = inflate.unused_data.lstrip(b"\0")
                while not rest and (more := handle.read(piece)):
                    rest = more.lstrip(b"\0")
                if not rest:
                    return
                if not rest.startswith(b"\x1f"):
                    raise gzip.BadGzipFile("bytes that are not gzip data after the end of the gzip data")
                inflate, packed = zlib.decompressobj(wbits=31), rest


def _raw_lines(blocks: Iterator[bytes]) -> Iterator[bytes]:
    """Lines as bytes without their ends. A read error is raised after the complete lines
    before it (the line it cuts is not yielded)."""
    head: List[bytes] = []
    size, error = 0, None
    while size < BLOCK:
        try:
            data = next(blocks, b"")
        except READ_ERRORS as err:
            error = err
            break
        if not data:
            break
        head.append(data)
        size += len(data)
    first = b"".join(head)
    sep = b"\r" if b"\r" in first and b"\n" not in first else b"\n"
    partial: List[bytes] = []

    def split(data: bytes) -> Iterator[bytes]:
        start = 0
        while (end := data.find(sep, start)) != -1:
            partial.append(data[start:end])
            line = b"".join(partial)
            partial.clear()
            yield line.rstrip(b"\r") if sep == b"\n" else line
            start = end + 1
        if start < len(data):
            partial.append(data[start:])

    yield from split(first)
    if error is not None:
        raise error
    for data in blocks:
        yield from split(data)
    if partial:
        last = b"".join(partial)
        yield last.rstrip(b"\r") if sep == b"\n" else last


def decoded_lines(path: Path) -> Iterator[Tuple[int, Optional[str], Optional[str]]]:
    """(line number, text or None, problem) per line, decoded one by one."""
    lineno = 0
    try:
        with contextlib.closing(read_blocks(path)) as blocks:
            for lineno, raw in enumerate(_raw_lines(blocks), start=1):
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError as err:
                    yield lineno, None, f"not UTF-8 text ({err.reason} at column {err.start + 1})"
                    continue
                if lineno == 1 and line.startswith("\ufeff"):
                    line = line[1:]
                yield lineno, line, None
    except READ_ERRORS as err:
        yield lineno + 1, None, f"file cannot be read further ({err}); the rest of it is skipped"


def json_lines(path: Path) -> Iterator[Union[RecordError, Tuple[int, Any]]]:
    """``(line number, parsed value)`` per non-blank line of a JSON-lines file, or a
    :class:`RecordError` for a line that cannot be decoded or parsed."""
    file = str(path)
    for lineno, line, problem in decoded_lines(path):
        if line is None:
            yield RecordError(file, problem or "unreadable line", lineno)
            continue
        if not line.strip():
            continue
        try:
            yield lineno, json.loads(line)
        except json.JSONDecodeError as err:
            yield RecordError(file, f"not valid JSON ({err.msg} at column {err.colno})", lineno)
        except RecursionError:
            yield RecordError(file, "not readable JSON (nested too deeply)", lineno)
        except ValueError as err:  # e.g. an integer with more digits than Python converts
            yield RecordError(file, f"not readable JSON ({err})", lineno)


def first_json_value(path: Path) -> Any:
    """The parsed first non-blank line of a file (None when it is not JSON)."""
    for item in json_lines(path):
        return None if isinstance(item, RecordError) else item[1]
    return None


def read_head(path: Path, n_bytes: int = BLOCK) -> Tuple[str, Optional[str]]:
    """(the first ``n_bytes`` of the file as text, the problem that cut it short or None).

    A ``.gz`` is inflated in small pieces, so a cut or corrupt one still gives
    what comes before the damage."""
    parts: List[bytes] = []
    size, problem = 0, None
    try:
        with contextlib.closing(read_blocks(path, n_bytes)) as blocks:
            for data in blocks:
                parts.append(data)
                size += len(data)
                if size >= n_bytes:
                    break
    except EOFError as err:
        problem = str(err)
    except zlib.error as err:
        problem = f"corrupt gzip data ({err})"
    except OSError as err:
        problem = str(err)
    return b"".join(parts)[:n_bytes].decode("utf-8", errors="replace").lstrip("\ufeff"), problem
