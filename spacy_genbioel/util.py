"""Plumbing every part of the package shares, so that each exists once.

* paths: :data:`PathLike`;
* reading: :func:`open_text` / :func:`open_binary` (gzip detected by magic
  bytes), :func:`read_bytes` / :func:`read_text` (whole files),
  :func:`iter_raw_lines` / :func:`iter_lines` (``\\n``, ``\\r\\n`` or old Mac
  ``\\r`` line ends, exact line numbers), :func:`iter_json_lines` and
  :func:`parse_json`; these (not the two openers) turn a truncated ``.gz``,
  bad UTF-8, bad JSON or JSON nested too deeply into the caller's error type,
  naming file and line;
* durable writes: :func:`atomic_write` / :func:`atomic_json` (temporary file,
  fsync, rename, fsync the folder); :func:`share_files` gives files the mode
  ``open()`` would (0644 under the usual umask 022) where a writer made them
  private (safetensors and ``mkstemp`` write 0600, so another user could not
  load a shared pipeline);
* identity: :func:`fingerprint` (SHA-256 over model weights and data files);
* compute: :func:`resolve_device`, :func:`resolve_dtype` and
  :func:`autocast_dtype` (the one precision rule of inference and training).

Nothing here imports torch at module level: the command line and the readers
stay light.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import zlib
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Callable, Iterable, Iterator, List, Optional, Sequence, Tuple, Union

from spacy_genbioel.progress import watch_file

if TYPE_CHECKING:  # pragma: no cover
    import torch

PathLike = Union[str, Path]

__all__ = [
    "PathLike",
    "GZIP_ERRORS",
    "open_text",
    "open_binary",
    "read_bytes",
    "read_text",
    "line_separator",
    "text_lines",
    "iter_raw_lines",
    "iter_lines",
    "parse_json",
    "iter_json_lines",
    "atomic_write",
    "atomic_json",
    "fsync_path",
    "share_files",
    "fingerprint",
    "resolve_device",
    "resolve_dtype",
    "autocast_dtype",
]


# -- reading ------------------------------------------------------------------------------------------------------
#: What a truncated or corrupt ``.gz`` raises while it is read (BadGzipFile is an OSError).
GZIP_ERRORS = (EOFError, zlib.error, gzip.BadGzipFile)
#: How much of a file :func:`line_separator` looks at to decide its line ends.
LINE_PROBE = 1 << 20


def _is_gzip(path: Path) -> bool:
    if not path.exists():
        raise FileNotFoundError(f"File not found: {path}")
    with path.open("rb") as probe:
        return probe.read(2) == b"\x1f\x8b"


def open_text(path: PathLike) -> IO[str]:
    """Open a UTF-8 text file, gunzipping ``*.gz`` (checked by magic bytes, not name).

    Errors of a corrupt ``.gz`` or bad UTF-8 surface while reading; :func:`read_text`
    and :func:`iter_lines` turn them into an error naming the file."""
    path = Path(path)
    if _is_gzip(path):
        return io.TextIOWrapper(open_binary(path), encoding="utf-8-sig", newline="")
    # utf-8-sig: a BOM would otherwise glue itself to the first ID
    handle = path.open(encoding="utf-8-sig", newline="")
    watch_file(path, handle.buffer)
    return handle


def open_binary(path: PathLike) -> IO[bytes]:
    """Open a file as bytes, gunzipping it when it is gzip. The file on disk is shown to
    :func:`~spacy_genbioel.progress.watch_file` (a progress bar over input bytes)."""
    path = Path(path)
    handle = gzip.open(path, "rb") if _is_gzip(path) else path.open("rb")
    watch_file(path, getattr(handle, "fileobj", None) or handle)  # GzipFile.fileobj: the compressed file
    return handle  # type: ignore[return-value]


def _unreadable(path: PathLike, where: Union[int, str], err: BaseException) -> str:
    return f"{path}:{where}: truncated or corrupt gzip data ({err})"


def read_bytes(path: PathLike, error: Callable[[str], Exception] = ValueError) -> bytes:
    """The whole (gunzipped) file; a truncated or corrupt ``.gz`` raises ``error("file:line: ...")``."""
    chunks: List[bytes] = []
    try:
        with open_binary(path) as handle:
            for block in iter(lambda: handle.read(1 << 16), b""):
                chunks.append(block)
    except GZIP_ERRORS as err:
        # the line where the readable data ends
        sep = line_separator(chunks[0]) if chunks else b"\n"
        raise error(_unreadable(path, sum(c.count(sep) for c in chunks) + 1, err)) from err
    return b"".join(chunks)


def read_text(path: PathLike, error: Callable[[str], Exception] = ValueError) -> str:
    """The whole file as UTF-8 text (``.gz`` too, a BOM dropped); bad UTF-8 or a
    corrupt ``.gz`` raises ``error("file:line: ...")``."""
    data = read_bytes(path, error)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        sep = line_separator(data[:LINE_PROBE])
        lineno = data.count(sep, 0, err.start) + 1
        column = err.start - (data.rfind(sep, 0, err.start) + 1) + 1
        raise error(f"{path}:{lineno}: not UTF-8 text ({err.reason} at column {column})") from err
    return text[1:] if text.startswith("\ufeff") else text


def line_separator(head: bytes) -> bytes:
    """The line end of a file that starts with ``head``: ``\\r`` for an old Mac file
    (a ``\\r`` and no ``\\n`` at all in its first :data:`LINE_PROBE` bytes), else
    ``\\n`` (``\\r\\n`` ends are ``\\n`` ends whose ``\\r`` is stripped; a stray
    ``\\r`` inside a ``\\n``-ended line stays)."""
    return b"\r" if b"\n" not in head and b"\r" in head else b"\n"


def text_lines(text: str) -> List[str]:
    """The lines of a decoded text without their ends, split as :func:`iter_lines` splits."""
    if line_separator(text[:LINE_PROBE].encode("utf-8", "surrogatepass")) == b"\r":
        return text.split("\r")
    return [line.rstrip("\r") for line in text.split("\n")]


def _probe(path: PathLike) -> bytes:
    """The first :data:`LINE_PROBE` bytes that can be read (less if the ``.gz`` breaks before)."""
    head = bytearray()
    try:
        with open_binary(path) as handle:
            while len(head) < LINE_PROBE:
                block = handle.read(1 << 14)
                if not block:
                    break
                head += block
    except GZIP_ERRORS:
        pass  # the reading proper reports it, at its line
    return bytes(head)


def _split_on(handle: IO[bytes], sep: bytes) -> Iterator[bytes]:
    """Lines of a binary stream ending in ``sep`` (each with its ``sep``, but the last)."""
    pending: List[bytes] = []
    for block in iter(lambda: handle.read(1 << 16), b""):
        parts = block.split(sep)
        if len(parts) == 1:
            pending.append(block)
            continue
        yield b"".join([*pending, parts[0], sep])
        for part in parts[1:-1]:
            yield part + sep
        pending = [parts[-1]] if parts[-1] else []
    if pending:
        yield b"".join(pending)


def iter_raw_lines(path: PathLike, error: Callable[[str], Exception] = ValueError) -> Iterator[Tuple[int, bytes]]:
    """(line number, raw bytes with the line end) of a file (``.gz`` too), split on
    ``\\n``, or on ``\\r`` in an old Mac file (see :func:`line_separator`); a truncated
    or corrupt ``.gz`` raises ``error("file:line: ...")`` at the line it breaks in."""
    sep = line_separator(_probe(path))
    lineno = 0
    try:
        with open_binary(path) as handle:
            lines: Iterable[bytes] = handle if sep == b"\n" else _split_on(handle, sep)
            for lineno, raw in enumerate(lines, start=1):
                yield lineno, raw
    except GZIP_ERRORS as err:
        raise error(_unreadable(path, lineno + 1, err)) from err


def iter_lines(path: PathLike, error: Callable[[str], Exception] = ValueError) -> Iterator[Tuple[int, str]]:
    """(line number, line without its end-of-line) pairs; bad UTF-8 or a corrupt
    ``.gz`` raises ``error("file:line: ...")``.

    Lines end in ``\\n`` or ``\\r\\n``, or in ``\\r`` in an old Mac file (see
    :func:`line_separator`; a stray ``\\r`` inside a ``\\n``-ended line stays), and are
    decoded one by one, so the line number of a decoding error is exact.
    """
    for lineno, raw in iter_raw_lines(path, error):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as err:
            raise error(f"{path}:{lineno}: not UTF-8 text ({err.reason} at column {err.start + 1})") from err
        if lineno == 1 and line.startswith("\ufeff"):
            line = line[1:]  # a BOM would otherwise glue itself to the first ID
        yield lineno, line.rstrip("\r\n")


def parse_json(
    text: str, path: PathLike, error: Callable[[str], Exception] = ValueError, line: Optional[int] = None
) -> Any:
    """``json.loads`` whose failures (bad JSON, nesting too deep for the parser)
    raise ``error("file:line: ...")``: ``line`` is where ``text`` starts in the
    file (a JSON line), else the line of the failure in a whole-file ``text``."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        where = line if line is not None else err.lineno
        raise error(f"{path}:{where}: not valid JSON ({err.msg})") from err
    except RecursionError:
        raise error(f"{path}:{line or 1}: JSON nested too deeply to read") from None


def iter_json_lines(path: PathLike, error: Callable[[str], Exception] = ValueError) -> Iterator[Tuple[int, Any]]:
    """(line number, parsed JSON) for every non-blank line of a JSON-lines file;
    bad JSON or UTF-8 raises ``error("file:line: ...")``."""
    for lineno, line in iter_lines(path, error):
        if line.strip():
            yield lineno, parse_json(line, path, error, lineno)


# -- durable writes -----------------------------------------------------------------------------------------------
def fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, write: Callable[[Path], None]) -> None:
    """Write through a temporary file in the same folder, fsync, rename, fsync the folder."""
    tmp = path.with_name(f".{path.name}.tmp")
    write(tmp)
    share_files([tmp])
    fsync_path(tmp)
    os.replace(tmp, path)
    fsync_path(path.parent)


def share_files(paths: Iterable[PathLike]) -> None:
    """Give each file (a folder: the files under it) the mode a plain ``open()`` would,
    ``0o666`` less the process umask, where the writer made it more private: safetensors
    writes ``0600``. Files made more open than that, and links, are left alone."""
    mask = os.umask(0o022)  # reading the umask means setting it: put it back at once
    os.umask(mask)
    mode = 0o666 & ~mask
    for path in paths:
        path = Path(path)
        for file in sorted(path.rglob("*")) if path.is_dir() else [path]:
            if file.is_file() and not file.is_symlink():
                current = file.stat().st_mode & 0o777
                if current | mode != current:  # a permission open() would give is missing
                    os.chmod(file, current | mode)


def atomic_json(path: Path, data: Any) -> None:
    atomic_write(
        path,
        lambda p: p.write_text(json.dumps(data, indent=2, ensure_ascii=False, default=str) + "\n", encoding="utf8"),
    )


# -- identity -----------------------------------------------------------------------------------------------------
def fingerprint(paths: Sequence[PathLike]) -> str:
    """SHA-256 over the bytes of files (a directory: its *.safetensors and config.json)."""
    digest = hashlib.sha256()
    for path in paths:
        path = Path(path)
        files = sorted([*path.glob("*.safetensors"), *path.glob("config.json")]) if path.is_dir() else [path]
        for file in files:
            digest.update(file.name.encode("utf8"))
            with file.open("rb") as handle:
                for block in iter(lambda: handle.read(1 << 20), b""):
                    digest.update(block)
    return digest.hexdigest()


# -- compute ------------------------------------------------------------------------------------------------------
def cache_root() -> "Path":
    """Where the package caches what it computes from a KB (name vectors, TF-IDF indexes):
    ``$SPACY_GENBIOEL_CACHE``, else ``$XDG_CACHE_HOME`` (or ``~/.cache``) ``/spacy_genbioel``."""
    from pathlib import Path

    base = os.environ.get("SPACY_GENBIOEL_CACHE")
    if base:
        return Path(base)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "spacy_genbioel"


def resolve_device(device: str = "auto") -> "torch.device":
    """``auto`` picks CUDA when present; ``cpu``, ``cuda`` and ``cuda:N`` pass through."""
    import torch

    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device={device!r} but no CUDA device is available")
    return dev


def resolve_dtype(dtype: str, device: "torch.device") -> "torch.dtype":
    """``auto`` is bf16 on a GPU that supports it and fp32 on CPU."""
    import torch

    if dtype == "auto":
        if device.type == "cuda" and torch.cuda.is_bf16_supported():
            return torch.bfloat16
        return torch.float32
    table = {
        "fp32": torch.float32,
        "float32": torch.float32,
        "bf16": torch.bfloat16,
        "bfloat16": torch.bfloat16,
        "fp16": torch.float16,
        "float16": torch.float16,
    }
    if dtype not in table:
        hint = " ('int8' is a model dtype: load_model quantizes on CPU)" if dtype == "int8" else ""
        raise ValueError(f"Unknown dtype {dtype!r}; use auto, fp32, bf16 or fp16{hint}")
    return table[dtype]


def fast_cpu_bf16() -> bool:
    """Whether this CPU multiplies bfloat16 natively (AVX512-BF16 or AMX)."""
    import torch

    try:
        return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())
    except AttributeError:  # older torch
        return False


def autocast_dtype(precision: str, device: "torch.device", *, cpu_bf16: bool = True) -> Optional["torch.dtype"]:
    """The autocast dtype of a ``precision`` setting (``None``: plain fp32).

    As :func:`resolve_dtype`, except that with ``cpu_bf16`` ``auto`` also picks
    bf16 on a CPU with AVX512-BF16 or AMX, where it pays for encoding (on this
    project's Xeon: encoding 2.2x, training 2.4x faster than fp32). The seq2seq
    trainer passes ``cpu_bf16=False``: its CPU runs stay fp32."""
    import torch

    dtype = resolve_dtype(precision, device)
    if precision == "auto" and device.type == "cpu" and cpu_bf16:
        dtype = torch.bfloat16 if fast_cpu_bf16() else dtype
    return None if dtype == torch.float32 else dtype
