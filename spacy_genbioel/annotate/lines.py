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

:class:`ReadLimits` caps what one record may hold: a line longer than
``max_line_bytes`` is an error of its own (the error names the cap), and only
``max_line_bytes`` of it are ever held in memory, however long it is (a small
``.gz`` may inflate to one line of GBs).

:func:`spacy_genbioel.util.iter_lines` reads corpus files, where a bad line stops
the read; these keep going.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, List, Optional, Tuple, Union

from spacy_genbioel.annotate.records import RecordError
from spacy_genbioel.progress import watch_file

__all__ = [
    "BLOCK",
    "DEFAULT_LIMITS",
    "READ_ERRORS",
    "ReadLimits",
    "decoded_lines",
    "json_lines",
    "read_blocks",
    "read_head",
]

BLOCK = 1 << 16
# what reading a damaged file raises: a cut .gz (EOFError), a bad gzip header or CRC (OSError),
# bad deflate data (zlib.error)
READ_ERRORS = (OSError, EOFError, zlib.error)


@dataclass(frozen=True)
class ReadLimits:
    """The most one input record may hold, in bytes as stored (after ``.gz`` inflation). A record over
    a cap is an error entry that names the cap; the file goes on. The defaults leave room many times over
    for spaCy's ``nlp.max_length`` (1,000,000 characters, at most 4 MB of UTF-8) plus markup."""

    #: one line of a line-based input (text, JSONL, PubTator, BioC JSON lines)
    max_line_bytes: int = 16 << 20
    #: one XML record (``<PubmedArticle>``, BioC ``<document>``)
    max_record_bytes: int = 16 << 20
    #: a BioC JSON file that is one collection, which is parsed whole (JSON lines are read line by line)
    max_json_bytes: int = 64 << 20

    def __post_init__(self) -> None:
        for name in ("max_line_bytes", "max_record_bytes", "max_json_bytes"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"ReadLimits.{name} must be a whole number of bytes of at least 1, not {value!r}")

    def over(self, name: str, what: str) -> str:
        """The reason of an error entry for a ``what`` over the cap ``name``."""
        return f"{what} longer than {getattr(self, name):,} bytes (the read limit {name}); skipped"


DEFAULT_LIMITS = ReadLimits()


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


def _raw_lines(blocks: Iterator[bytes], max_bytes: int) -> Iterator[Optional[bytes]]:
    """Lines as bytes without their ends; None for a line longer than ``max_bytes`` (of which no more
    than ``max_bytes`` is held). A read error is raised after the complete lines before it (the line
    it cuts is not yielded)."""
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
    held = 0  # bytes in partial
    over = False  # the current line is past the cap: its bytes are dropped until its end

    def finish(line: bytes) -> Optional[bytes]:
        if over or len(line) > max_bytes + (sep == b"\n" and line.endswith(b"\r")):
            return None
        return line.rstrip(b"\r") if sep == b"\n" else line

    def split(data: bytes) -> Iterator[Optional[bytes]]:
        nonlocal held, over
        start = 0
        while (end := data.find(sep, start)) != -1:
            partial.append(data[start:end])
            line = b"".join(partial)
            partial.clear()
            yield finish(line)
            held, over = 0, False
            start = end + 1
        if start < len(data) and not over:
            partial.append(data[start:])
            held += len(data) - start
            if held > max_bytes + 1:  # (+1: a \r before the \n may still come)
                partial.clear()
                held, over = 0, True

    yield from split(first)
    if error is not None:
        raise error
    for data in blocks:
        yield from split(data)
    if partial or over:
        yield finish(b"".join(partial))


def decoded_lines(
    path: Path, limits: ReadLimits = DEFAULT_LIMITS
) -> Iterator[Tuple[int, Optional[str], Optional[str]]]:
    """(line number, text or None, problem) per line, decoded one by one; a line over
    ``limits.max_line_bytes`` is a problem naming the cap."""
    lineno = 0
    try:
        with contextlib.closing(read_blocks(path)) as blocks:
            for lineno, raw in enumerate(_raw_lines(blocks, limits.max_line_bytes), start=1):
                if raw is None:
                    yield lineno, None, limits.over("max_line_bytes", "line")
                    continue
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


def json_lines(path: Path, limits: ReadLimits = DEFAULT_LIMITS) -> Iterator[Union[RecordError, Tuple[int, Any]]]:
    """``(line number, parsed value)`` per non-blank line of a JSON-lines file, or a
    :class:`RecordError` for a line that cannot be decoded or parsed (or is over the cap)."""
    file = str(path)
    for lineno, line, problem in decoded_lines(path, limits):
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
