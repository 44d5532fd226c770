"""Reading a pickled PyTorch checkpoint without running anything in it.

Released GenBioEL/ANGEL checkpoints are ``torch.save`` pickles of a state dict
(``collections.OrderedDict``, ``torch.FloatStorage``,
``torch._utils._rebuild_tensor_v2``). A pickle can name any importable
callable, so before PyTorch sees the file :func:`scan_pickle_globals` walks its
opcode stream with :mod:`pickletools` (which only parses) and refuses every
global outside :data:`ALLOWED_GLOBALS`, naming the one the pickle asked for.
Only then does :func:`load_checkpoint_file` call ``torch.load(...,
weights_only=True)`` (PyTorch's restricted unpickler, a second gate; memory
mapped for the zip format) and check that what came back is tensors in plain
containers. Both ``torch.save`` formats are read: the zip archive (its
``<prefix>/data.pkl`` member, scanned as PyTorch's own zip reader returns it, once
:mod:`.checkpoint_archive` has accepted the archive's layout) and the legacy
``_use_new_zipfile_serialization=False`` sequence of pickles followed by raw storage
bytes. A storage the pickle asks for must fit in the bytes the file holds for it
(PyTorch allocates it before reading them).
"""

from __future__ import annotations

import _compat_pickle
import io
import logging
import pickletools
from pathlib import Path
from typing import IO, Any, Dict, Iterator, List, Optional, Tuple, Union

from spacy_genbioel.models.checkpoint_archive import (
    PICKLE_CAP,
    ArchiveLayout,
    CheckpointError,
    check_archive,
    read_record,
)
from spacy_genbioel.util import PathLike

logger = logging.getLogger(__name__)

__all__ = ["ALLOWED_GLOBALS", "CheckpointError", "UnsafePickleError", "load_checkpoint_file", "scan_pickle_globals"]

_STORAGES = (
    "Float",
    "Double",
    "Half",
    "BFloat16",
    "Long",
    "Int",
    "Short",
    "Char",
    "Byte",
    "Bool",
    "ComplexFloat",
    "ComplexDouble",
)
_DTYPES = (
    "float32",
    "float64",
    "float16",
    "bfloat16",
    "int64",
    "int32",
    "int16",
    "int8",
    "uint8",
    "bool",
    "complex64",
    "complex128",
    "float",
    "double",
    "half",
    "long",
    "int",
    "short",
)
#: what a checkpoint of tensors in plain containers may name: a subset of the
#: globals ``torch.load(weights_only=True)`` accepts (``builtins.set`` and
#: ``_codecs.encode``, how protocol 2 writes bytes, appear in DeepSpeed files)
ALLOWED_GLOBALS = frozenset(
    {
        "collections.OrderedDict",
        "torch._utils._rebuild_tensor",
        "torch._utils._rebuild_tensor_v2",
        "torch._utils._rebuild_parameter",
        "torch.Size",
        "torch.device",
        "builtins.set",
        "_codecs.encode",
        *(f"torch.{kind}Storage" for kind in _STORAGES),
        *(f"torch.cuda.{kind}Storage" for kind in _STORAGES),
        *(f"torch.{dtype}" for dtype in _DTYPES),
    }
)
_STRING_OPS = {"STRING", "BINSTRING", "SHORT_BINSTRING", "UNICODE", "BINUNICODE", "SHORT_BINUNICODE", "BINUNICODE8"}
_PUT_OPS = {"PUT", "BINPUT", "LONG_BINPUT"}
_GET_OPS = {"GET", "BINGET", "LONG_BINGET"}
_VALUE_OPS = {"INT", "BININT", "BININT1", "BININT2", "LONG", "LONG1", "LONG4", "NONE", "NEWTRUE", "NEWFALSE"}
_NEUTRAL_OPS = {"FRAME"}
_UNKNOWN = object()  # a stack value the scanner does not track
_ZIP_MAGIC = b"PK\x03\x04"
# the legacy format: magic number, protocol version, system info, the object, its storage keys
_LEGACY_PICKLES = 5


class UnsafePickleError(CheckpointError):
    """A pickle that names a global outside :data:`ALLOWED_GLOBALS` (named in the message)."""


def _global_name(module: str, name: str, protocol: int) -> str:
    """``module.name`` as Python 3 unpickling resolves it: protocols 0-2 are written
    with Python 2 names (``__builtin__.eval``, ``commands.Popen``), mapped back as
    ``pickle.Unpickler(fix_imports=True)`` does."""
    if protocol < 3:
        if (module, name) in _compat_pickle.NAME_MAPPING:
            module, name = _compat_pickle.NAME_MAPPING[(module, name)]
        elif module in _compat_pickle.IMPORT_MAPPING:
            module = _compat_pickle.IMPORT_MAPPING[module]
    return f"{module}.{name}"


def _storage_id(value: Any) -> Optional[Tuple[str, int]]:
    """``(key, elements)`` of a storage's persistent id, ``('storage', type, key, location, elements)``
    (and the legacy format's view metadata after it), or None for anything else."""
    if not isinstance(value, tuple) or len(value) not in (5, 6) or value[0] != "storage":
        return None
    key, elements = value[2], value[4]
    if not isinstance(key, str) or not isinstance(elements, int) or isinstance(elements, bool) or elements < 0:
        return None
    return key, elements


def _pickle_globals(stream: "Stream", where: str, storages: Dict[str, int]) -> Iterator[str]:
    """The globals one pickle (up to its STOP) names, in order; the storages its
    persistent ids ask for go into ``storages`` (key -> elements). A ``STACK_GLOBAL``
    whose module and name are not two strings pushed just before it cannot be
    resolved by parsing alone: it is reported as ``<unresolved STACK_GLOBAL>``, and so
    is a persistent id that is not a storage's tuple built right before it."""
    memo: Dict[int, Any] = {}
    protocol = 0
    recent: List[Any] = []  # the values the last stack-pushing opcodes left on top, when known
    since_mark = False  # whether ``recent`` is all the stack holds since the last MARK
    try:
        for op, arg, pos in pickletools.genops(stream):
            name = op.name
            if name in ("GLOBAL", "INST"):
                module, _, attr = str(arg).partition(" ")
                yield _global_name(module, attr, protocol)
                recent.append(_UNKNOWN)
                since_mark = since_mark and name == "GLOBAL"
            elif name == "STACK_GLOBAL":
                if len(recent) >= 2 and isinstance(recent[-2], str) and isinstance(recent[-1], str):
                    yield _global_name(recent[-2], recent[-1], protocol)
                    recent[-2:] = [_UNKNOWN]
                else:
                    yield f"<unresolved STACK_GLOBAL at byte {pos}>"
                    recent, since_mark = [_UNKNOWN], False
            elif name.startswith("EXT"):
                yield f"<extension registry code {arg}>"
                recent, since_mark = [_UNKNOWN], False
            elif name == "PROTO":
                protocol = int(arg)
            elif name == "MARK":
                recent, since_mark = [], True
            elif name == "TUPLE":
                recent, since_mark = [tuple(recent) if since_mark else _UNKNOWN], False
            elif name == "BINPERSID":
                storage = _storage_id(recent[-1] if recent else None)
                if storage is None:
                    yield f"<unresolved persistent id at byte {pos}>"
                else:
                    storages[storage[0]] = max(storage[1], storages.get(storage[0], 0))
                recent, since_mark = [_UNKNOWN], False
            elif name in _STRING_OPS:
                recent.append(arg if isinstance(arg, str) else _UNKNOWN)
            elif name in _VALUE_OPS:
                recent.append(arg)
            elif name in _GET_OPS:
                recent.append(memo.get(arg, _UNKNOWN))
            elif name in _PUT_OPS:
                memo[arg] = recent[-1] if recent else _UNKNOWN
            elif name == "MEMOIZE":
                memo[len(memo)] = recent[-1] if recent else _UNKNOWN
            elif name not in _NEUTRAL_OPS:
                recent, since_mark = [], False
    except CheckpointError:
        raise
    except ValueError as err:  # pickletools' own error for a damaged or foreign stream
        raise CheckpointError(f"{where}: not a pickle stream ({err})") from err


class _CappedReader:
    """A file read by :mod:`pickletools` without its length fields deciding what is allocated: a
    read of more than :data:`PICKLE_CAP` bytes (a string no state dict's pickle holds) is refused,
    and no read asks for more than the file has left (``BufferedReader.read(n)`` allocates ``n``)."""

    def __init__(self, handle: IO[bytes], size: int, where: str) -> None:
        self.handle, self.size, self.where = handle, size, where

    def read(self, n: int = -1) -> bytes:
        left = max(self.size - self.handle.tell(), 0)
        if n is not None and n > PICKLE_CAP:
            raise CheckpointError(
                f"{self.where}: refused: the pickle holds a {n}-byte value, over the {PICKLE_CAP >> 20} MiB "
                "a state dict's pickle needs: a damaged or altered checkpoint"
            )
        return self.handle.read(left if n is None or n < 0 else min(n, left))

    def readline(self, limit: int = -1) -> bytes:
        return self.handle.readline(PICKLE_CAP if limit is None or limit < 0 else limit)

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        return self.handle.seek(offset, whence)

    def tell(self) -> int:
        return self.handle.tell()


#: what the scanner reads a pickle from
Stream = Union[IO[bytes], _CappedReader]


def _scan_stream(stream: "Stream", where: str, count: int, storages: Dict[str, int]) -> List[str]:
    """Globals of up to ``count`` consecutive pickles (fewer where the stream ends)."""
    found: List[str] = []
    for _ in range(count):
        start = stream.read(1)
        if not start:
            break
        stream.seek(-1, io.SEEK_CUR)
        found.extend(_pickle_globals(stream, where, storages))
    return found


def _check_storages(path: Path, storages: Dict[str, int], layout: Optional[ArchiveLayout]) -> None:
    """Refuse a storage larger than the bytes the file holds for it (PyTorch would allocate it
    before finding out): its record's bytes in a zip archive, the whole file's in the legacy format."""
    if layout is not None:
        for key, elements in storages.items():
            member = layout.members.get(f"data/{key}")
            if member is None:
                raise CheckpointError(
                    f"{path}: refused: the pickle asks for storage {key!r}, but the archive has no member "
                    f"{layout.prefix}/data/{key}: a damaged or altered checkpoint"
                )
            if elements > member.size:
                raise CheckpointError(
                    f"{path}: refused: the pickle asks for {elements} elements of storage {key!r}, but "
                    f"{member.name} holds {member.size} bytes: a damaged or altered checkpoint"
                )
        return
    total, size = sum(storages.values()), path.stat().st_size
    if total > size:
        raise CheckpointError(
            f"{path}: refused: the pickle asks for storages of {total} elements in all, more than the file's "
            f"{size} bytes: a damaged or altered checkpoint"
        )


def _file_format(path: Path) -> str:
    try:
        with path.open("rb") as handle:
            head = handle.read(512)
    except OSError as err:
        raise CheckpointError(f"{path}: cannot read the checkpoint ({err})") from err
    if head.startswith(_ZIP_MAGIC):
        return "zip"
    if len(head) >= 262 and head[257:262] == b"ustar":
        raise CheckpointError(f"{path}: a tar archive (PyTorch before 0.4): not supported; re-save it as a state dict")
    if not head.startswith(b"\x80"):
        raise CheckpointError(f"{path}: neither a torch.save zip archive nor a pickle")
    return "legacy"


def scan_pickle_globals(path: PathLike) -> Tuple[str, List[str]]:
    """``(format, globals)`` of a ``torch.save`` file ("zip" or "legacy"), having
    checked every global against :data:`ALLOWED_GLOBALS` without unpickling.

    Raises :class:`UnsafePickleError` naming the first global not allowed (and
    the pickle member it is in), :class:`CheckpointError` for a file that is not
    a ``torch.save`` checkpoint."""
    path = Path(path)
    kind = _file_format(path)
    found: List[Tuple[str, str]] = []  # (global, where)
    storages: Dict[str, int] = {}
    layout = None
    if kind == "zip":  # the bytes torch.load unpickles, read through its own zip reader
        layout = check_archive(path)
        where = f"{path} (member {layout.members['data.pkl'].name})"
        data = read_record(layout, "data.pkl")
        found.extend((name, where) for name in _scan_stream(io.BytesIO(data), where, 1, storages))
    else:
        with path.open("rb") as handle:
            capped = _CappedReader(handle, path.stat().st_size, str(path))
            found.extend((name, str(path)) for name in _scan_stream(capped, str(path), _LEGACY_PICKLES, storages))
    for global_name, where in found:
        if global_name not in ALLOWED_GLOBALS:
            raise UnsafePickleError(
                f"{where}: refused: the pickle asks for {global_name}, which is not a tensor, a storage or a plain "
                "container. Nothing in the file was run. Import only checkpoints of tensors "
                "(a state dict saved with torch.save), from a source you trust"
            )
    _check_storages(path, storages, layout)
    return kind, sorted({global_name for global_name, _ in found})


_PLAIN = (str, int, float, bool, bytes, type(None))


def _check_contents(obj: Any, path: Path) -> None:
    """Refuse anything but tensors, numbers, strings and plain containers (the
    restricted unpickler allows a few more types than a checkpoint needs)."""
    import torch

    if not isinstance(obj, dict):  # a pickle stopped early (``N.``: None) or a foreign object: no weights
        raise CheckpointError(
            f"{path}: holds a {type(obj).__qualname__}, not a mapping of names to tensors (a state dict)"
        )
    pending = [obj]
    while pending:
        item = pending.pop()
        if isinstance(item, dict):
            pending.extend(item.keys())
            pending.extend(item.values())
        elif isinstance(item, (list, tuple, set)):
            pending.extend(item)
        elif not isinstance(item, (torch.Tensor, torch.dtype, torch.device, *_PLAIN)):
            raise CheckpointError(
                f"{path}: holds a {type(item).__module__}.{type(item).__qualname__}: "
                "only tensors in plain containers are imported"
            )


def load_checkpoint_file(path: PathLike) -> Tuple[Any, Dict[str, Any]]:
    """``(object, facts)``: the contents of a ``torch.save`` file read without running
    anything in it (scan, then ``torch.load(weights_only=True)``, memory mapped for
    the zip format, on CPU), and what was learned (format, globals)."""
    import torch

    path = Path(path)
    kind, names = scan_pickle_globals(path)
    try:
        obj = torch.load(str(path), map_location="cpu", weights_only=True, mmap=kind == "zip")
    except Exception as err:  # the restricted unpickler raises many kinds for a damaged or foreign stream
        text = " ".join(line.strip() for line in str(err).splitlines() if line.strip())
        marker = "WeightsUnpickler error:"
        detail = text.split(marker, 1)[1].split("Check the documentation")[0].strip() if marker in text else text
        raise CheckpointError(
            f"{path}: PyTorch's restricted unpickler cannot read it ({type(err).__name__}: {detail})"
            + ("; it reads pickle protocol 2, torch.save's default" if "operand" in detail else "")
        ) from None
    _check_contents(obj, path)
    facts: Dict[str, Any] = {"format": kind, "globals": names}
    logger.info("%s: %s format, globals %s", path, kind, ", ".join(names))
    return obj, facts


def _backed(tensors: Dict[str, Any], path: PathLike) -> Dict[str, Any]:
    """``tensors``, refused when their shapes claim more elements than their storages hold (a
    stride-0 view of a few bytes can claim any shape: a model built to fit it would be allocated
    whole). Views that are one tensor under several names (tied weights) count once."""
    claimed, held = 0, 0
    views, storages = set(), set()
    for name, tensor in tensors.items():
        storage = tensor.untyped_storage()
        size = tensor.numel() * tensor.element_size()
        if size > storage.nbytes():
            raise CheckpointError(
                f"{path}: refused: tensor {name} has shape {tuple(tensor.shape)} ({size} bytes) over a storage of "
                f"{storage.nbytes()} bytes: a damaged or altered checkpoint"
            )
        view = (storage.data_ptr(), tensor.storage_offset(), tuple(tensor.shape), tuple(tensor.stride()))
        if view not in views:
            views.add(view)
            claimed += size
        if storage.data_ptr() not in storages:
            storages.add(storage.data_ptr())
            held += storage.nbytes()
    if claimed > 2 * held + (1 << 20):
        raise CheckpointError(
            f"{path}: refused: its tensors claim {claimed} bytes in overlapping views of {held} bytes of storage: "
            "a damaged or altered checkpoint"
        )
    return tensors


def tensor_entries(obj: Any, path: PathLike) -> Tuple[Dict[str, Any], Optional[str]]:
    """``(state dict, container)``: the tensors of a checkpoint object, found at its
    top level (a state dict) or under one nested entry (Lightning's ``state_dict``,
    DeepSpeed's ``module``, ``model``, ``model_state_dict``), named in ``container``."""
    import torch

    def tensors_only(value: Any) -> bool:
        return (
            isinstance(value, dict)
            and bool(value)
            and all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in value.items())
        )

    if tensors_only(obj):
        return _backed(dict(obj), path), None
    if isinstance(obj, dict):
        for key in ("state_dict", "module", "model", "model_state_dict"):
            if tensors_only(obj.get(key)):
                return _backed(dict(obj[key]), path), key
        keys = ", ".join(sorted(map(str, obj))[:12])
        raise CheckpointError(
            f"{path}: no state dict (a mapping of names to tensors) at the top level or under "
            f"state_dict/module/model/model_state_dict; its entries: {keys}"
        )
    raise CheckpointError(f"{path}: holds a {type(obj).__name__}, not a state dict")
