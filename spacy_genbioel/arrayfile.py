"""Flat numpy arrays in safetensors files: written without copies, read memory-mapped.

``safetensors.numpy.load_file`` and ``safe_open(..., framework="np")`` read
every array into memory (a copy per array), and ``save_file`` first turns every
array into a ``bytes`` object (another copy). For the KB and the name trie of
a UMLS-sized KB (hundreds of MB each) both double the memory and the load
time, so:

* :func:`write_arrays` streams the arrays to a temporary file in the
  safetensors layout (8-byte header length, JSON header with ``__metadata__``,
  tensors sorted by alignment then name, the header padded to 8 bytes, as
  ``safetensors`` writes them) and renames it into place;
* :func:`read_arrays` checks the header (dtypes, shapes, offsets within the
  file, the file's exact length) and returns arrays that are views of one
  copy-on-write ``mmap`` of the file: nothing is read until a page is
  touched, the OS shares the pages between processes, and the arrays are
  writable (a write stays private), so ``torch.from_numpy`` takes them as
  they are;
* :func:`check_arrays` checks arrays against what their reader expects
  (:class:`ArraySpec`: dtype, shape, finite and positive values), a chunk at a
  time, so a damaged file is refused naming it and the array, rather than
  giving other results or an ``IndexError`` later;
* :func:`release_pages` hands the pages under an array back to the OS once
  a full pass (a check) has read them: they stay in the page cache and come
  back on the next read, but no longer count in the process's memory.

Files written here are ordinary safetensors files (``safetensors`` reads
them), and :func:`read_arrays` reads those written by ``safetensors``. Any
problem raises the caller's error type with the file's name.
"""

from __future__ import annotations

import json
import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Dict, Iterator, Mapping, Optional, Tuple

from spacy_genbioel.util import PathLike, atomic_write

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np

__all__ = [
    "read_arrays",
    "write_arrays",
    "check_arrays",
    "ArraySpec",
    "backing_map",
    "release_pages",
    "DTYPES",
    "MAX_HEADER",
    "MAX_HEADER_DEPTH",
]

#: safetensors dtype name -> numpy dtype string (little-endian)
DTYPES = {
    "BOOL": "|b1",
    "U8": "|u1",
    "I8": "|i1",
    "I16": "<i2",
    "U16": "<u2",
    "I32": "<i4",
    "U32": "<u4",
    "I64": "<i8",
    "U64": "<u8",
    "F16": "<f2",
    "F32": "<f4",
    "F64": "<f8",
}
#: the longest header read (safetensors' own limit)
MAX_HEADER = 100_000_000
#: containers nested in a safetensors header: the header, an entry, its shape or offsets
MAX_HEADER_DEPTH = 3
#: rows of an array checked at a time (bounded memory for the finiteness check)
_CHECK_ELEMENTS = 1 << 22


def write_arrays(path: PathLike, arrays: Mapping[str, "np.ndarray"], metadata: Mapping[str, str]) -> None:
    """Write ``arrays`` (any shape, C order; copied only if not contiguous) and string ``metadata``."""
    import numpy as np

    names = {np.dtype(v).str: k for k, v in DTYPES.items()}
    prepared = {}
    for key, value in arrays.items():
        array = np.ascontiguousarray(value)
        code = array.dtype.newbyteorder("<").str if array.dtype.byteorder == ">" else array.dtype.str
        if code not in names:
            raise ValueError(f"{path}: array {key!r} has a dtype safetensors cannot store ({array.dtype})")
        prepared[key] = (array.astype(code, copy=False), names[code])
    order = sorted(prepared, key=lambda k: (-prepared[k][0].dtype.itemsize, k))
    header: Dict[str, object] = {"__metadata__": {str(k): str(v) for k, v in metadata.items()}}
    offset = 0
    for key in order:
        array, dtype = prepared[key]
        header[key] = {"dtype": dtype, "shape": list(array.shape), "data_offsets": [offset, offset + array.nbytes]}
        offset += array.nbytes
    text = json.dumps(header, separators=(",", ":")).encode("utf8")
    text += b" " * (-len(text) % 8)

    def write(tmp: Path) -> None:
        with tmp.open("wb") as out:
            out.write(struct.pack("<Q", len(text)))
            out.write(text)
            for key in order:
                array = prepared[key][0]
                if array.nbytes:
                    out.write(memoryview(array.reshape(-1)).cast("B"))

    atomic_write(Path(path), write)


def read_arrays(
    path: PathLike, error: Callable[[str], Exception] = ValueError
) -> Tuple[Dict[str, "np.ndarray"], Dict[str, str]]:
    """The arrays and metadata of a safetensors file, the arrays memory-mapped (see the module docstring).

    A file that is missing, truncated, longer than its header says, or whose
    header is not a valid safetensors header raises ``error`` naming it."""
    import numpy as np

    path = Path(path)
    if not path.is_file():
        raise error(f"{path}: file not found")
    size = path.stat().st_size
    with path.open("rb") as handle:
        head = handle.read(8)
        if len(head) < 8:
            raise error(f"{path}: not a safetensors file ({size} bytes)")
        (n,) = struct.unpack("<Q", head)
        if n > MAX_HEADER:
            raise error(f"{path}: not a safetensors file (a header of {n} bytes; at most {MAX_HEADER} are read)")
        if n > size - 8:
            raise error(f"{path}: not a complete safetensors file (header of {n} bytes in a file of {size})")
        try:
            header = json.loads(handle.read(n).decode("utf8"))
        except (UnicodeDecodeError, ValueError) as err:
            raise error(f"{path}: not a safetensors file (unreadable header: {err})") from None
        except RecursionError:
            raise error(f"{path}: not a safetensors file (its header is nested too deeply to read)") from None
        if not isinstance(header, dict):
            raise error(f"{path}: not a safetensors file (the header is not a JSON object)")
        depth = _depth(header)
        if depth > MAX_HEADER_DEPTH:
            raise error(
                f"{path}: not a safetensors file (its header nests {depth} levels of lists or objects; "
                f"a safetensors header has at most {MAX_HEADER_DEPTH})"
            )
        metadata = header.pop("__metadata__", None) or {}
        if not isinstance(metadata, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()
        ):
            raise error(f"{path}: safetensors metadata must map strings to strings")
        layout = {key: _entry(path, key, value, error) for key, value in header.items()}
        end = _contiguous(path, layout, error)
        if size != 8 + n + end:
            raise error(f"{path}: not a complete safetensors file ({size} bytes, the header describes {8 + n + end})")
        if not layout:
            return {}, metadata
        buffer = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_COPY)
    arrays = {}
    for key, (dtype, shape, start, stop) in layout.items():
        count = (stop - start) // np.dtype(dtype).itemsize
        flat = np.frombuffer(buffer, dtype=dtype, count=count, offset=8 + n + start)
        arrays[key] = flat if len(shape) == 1 else flat.reshape(shape)
    return arrays, metadata


def _entry(
    path: Path, key: str, value: object, error: Callable[[str], Exception]
) -> Tuple[str, Tuple[int, ...], int, int]:
    """(numpy dtype, shape, start, stop) of one header entry, checked."""
    import numpy as np

    if not isinstance(value, dict) or value.get("dtype") not in DTYPES:
        raise error(f"{path}: tensor {key!r} has no dtype safetensors knows")
    shape, offsets = value.get("shape"), value.get("data_offsets")
    if not _counts(shape) or not _counts(offsets) or len(offsets) != 2 or offsets[0] > offsets[1]:
        raise error(f"{path}: tensor {key!r} has a malformed shape or offsets")
    dtype = DTYPES[value["dtype"]]
    if int(np.prod(shape, dtype=np.float64)) * np.dtype(dtype).itemsize != offsets[1] - offsets[0]:
        raise error(f"{path}: tensor {key!r} of shape {shape} does not fill its {offsets[1] - offsets[0]} bytes")
    return dtype, tuple(shape), offsets[0], offsets[1]


def _counts(value: object) -> bool:
    """Whether ``value`` is a JSON list of integers >= 0."""
    return isinstance(value, list) and all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in value)


def _depth(header: object) -> int:
    """How deeply lists and objects nest in a parsed header (without recursion)."""
    deepest, stack = 0, [(header, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, (dict, list)):
            deepest = max(deepest, depth)
            if depth <= MAX_HEADER_DEPTH:  # one level past the limit is enough to refuse it
                stack.extend((item, depth + 1) for item in (value.values() if isinstance(value, dict) else value))
    return deepest


def _contiguous(
    path: Path, layout: Mapping[str, Tuple[str, Tuple[int, ...], int, int]], error: Callable[[str], Exception]
) -> int:
    """The end of the data: the tensors must tile it from 0 without holes or overlaps (as safetensors demands)."""
    end = 0
    for key, (_, _, start, stop) in sorted(layout.items(), key=lambda item: (item[1][2], item[1][3])):
        if start != end:
            what = "overlaps another tensor" if start < end else f"leaves bytes {end}..{start} unused"
            raise error(f"{path}: tensor {key!r} at bytes {start}..{stop} {what}: the header is damaged")
        end = stop
    return end


@dataclass(frozen=True)
class ArraySpec:
    """What a reader expects of one array: its numpy dtype (one of ``dtypes``, e.g. ``"<f4"``), its
    ``shape`` (None: any length in that dimension), whether it must be there (``required``), and
    whether every value must be finite (``finite``) and greater than 0 (``positive``)."""

    dtypes: Tuple[str, ...]
    shape: Tuple[Optional[int], ...]
    required: bool = True
    finite: bool = False
    positive: bool = False


def check_arrays(
    path: PathLike,
    arrays: Mapping[str, "np.ndarray"],
    specs: Mapping[str, ArraySpec],
    error: Callable[[str], Exception] = ValueError,
    remedy: str = "",
) -> None:
    """Raise ``error`` naming ``path`` and the array when ``arrays`` are not as ``specs`` say: an array
    missing or not in ``specs``, another dtype or shape, a value that is not finite or not > 0 (read a
    chunk at a time, the pages handed back after). ``remedy`` ends the message (what to do)."""
    problem = next(_problems(arrays, specs), None)
    if problem is not None:
        raise error(f"{path}: {problem}{'; ' + remedy if remedy else ''}")


def _problems(arrays: Mapping[str, "np.ndarray"], specs: Mapping[str, ArraySpec]) -> Iterator[str]:
    """What is wrong with ``arrays`` against ``specs``, in words, the cheap checks first."""
    import numpy as np

    for key in sorted(set(arrays) - set(specs)):
        yield f"array {key!r} is not one this file holds ({', '.join(sorted(specs))})"
    for key, spec in specs.items():
        array = arrays.get(key)
        if array is None:
            if spec.required:
                yield f"array {key!r} is missing"
        elif np.dtype(array.dtype).str not in spec.dtypes:
            yield f"array {key!r} holds {array.dtype}, not {' or '.join(spec.dtypes)}"
        elif len(array.shape) != len(spec.shape) or any(
            want is not None and have != want for have, want in zip(array.shape, spec.shape)
        ):
            wanted = "x".join("?" if d is None else str(d) for d in spec.shape)
            yield f"array {key!r} has shape {'x'.join(map(str, array.shape))}, not {wanted}"
    for key, spec in specs.items():
        if key in arrays and (spec.finite or spec.positive):
            problem = _bad_value(key, arrays[key], spec)
            if problem:
                yield problem


def _bad_value(key: str, array: "np.ndarray", spec: ArraySpec) -> Optional[str]:
    """The first value of ``array`` that is not finite (or not > 0) as ``spec`` asks, described."""
    import numpy as np

    flat = array.reshape(-1)
    for start in range(0, len(flat), _CHECK_ELEMENTS):
        part = flat[start : start + _CHECK_ELEMENTS]
        bad = ~np.isfinite(part) if spec.finite else np.zeros(len(part), dtype=bool)
        if spec.positive:
            bad |= ~(part > 0)
        release_pages(part)
        if bad.any():
            at = start + int(np.flatnonzero(bad)[0])
            row = np.unravel_index(at, array.shape) if array.ndim > 1 else (at,)
            need = "finite and > 0" if spec.finite and spec.positive else ("finite" if spec.finite else "> 0")
            where = ", ".join(str(int(i)) for i in row)
            return f"array {key!r} holds {float(flat[at])} at [{where}]; every value must be {need}"
    return None


def backing_map(array: "np.ndarray") -> Optional[mmap.mmap]:
    """The ``mmap`` an array is a view of (None: it owns or borrows ordinary memory)."""
    base: object = array
    while True:
        if isinstance(base, mmap.mmap):
            return base
        if isinstance(base, memoryview):
            base = base.obj
        elif getattr(base, "base", None) is not None:
            base = base.base  # type: ignore[attr-defined]
        else:
            return None


def release_pages(array: "np.ndarray") -> None:
    """Drop the pages of a memory-mapped array (from :func:`read_arrays`) from this process
    (``MADV_DONTNEED`` on its whole pages; a later read maps them again from the page cache).
    Arrays that are not views of such a map, and systems without ``madvise``, are left alone."""
    import numpy as np

    base = backing_map(array)
    if base is None or not hasattr(base, "madvise") or not array.nbytes:
        return
    start = (
        array.__array_interface__["data"][0]
        - np.frombuffer(base, dtype=np.uint8, count=1).__array_interface__["data"][0]
    )
    first = -(-start // mmap.PAGESIZE) * mmap.PAGESIZE  # whole pages only: neighbours may be in use
    last = (start + array.nbytes) // mmap.PAGESIZE * mmap.PAGESIZE
    if last > first:
        base.madvise(mmap.MADV_DONTNEED, first, last - first)
