"""One row per KB name, cached on disk, and reused by KBs that share names.

Both neural retrievers keep a row per KB name: MiniLM's float16 vectors
(:class:`~spacy_genbioel.retrieval.dense.DenseLinker`) and ResCNN's float16 or
int8 ones (:class:`~spacy_genbioel.retrieval.rescnn.ResCNNLinker`). Encoding
the names is their costly step: MiniLM takes 2,812 s on one CPU thread for
BC5CDR's 788,119 names. Yet the KBs a user links against share most of their
names: the KB and the KB + training mentions, each cross-fitting fold's
KB + its training mentions, a KB rebuilt with a few more synonyms.

So a :class:`NameCache` entry is content-addressed (the file name carries the
SHA-256 of the encoder settings and of every name, so the same names under
another KB name read the same file), and holds, besides its arrays, a 64-bit
hash of each name (``name_hashes``) and a digest of the encoder settings
(``spec``). A KB that misses the cache takes the rows of its names from the
compatible entry that holds the most of them, and encodes only the rest:
BC5CDR's KB + a fold's training mentions encodes its few hundred new names,
not 788k. Rows taken over are the bytes a fresh encoding stored; rows encoded
afresh may differ from a whole-KB encoding in the last bits, as any two
batchings of the same encoder do.

Entries written before the hashes existed are given them the first time they
are read (the file is rewritten in place, atomically); a cache folder that
cannot be written is read all the same.
"""

from __future__ import annotations

import hashlib
import logging
import os
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from spacy_genbioel.arrayfile import ArraySpec, check_arrays, read_arrays, write_arrays

logger = logging.getLogger(__name__)

__all__ = ["NameCache", "name_hashes", "HASHES", "safe_stem", "write_entry"]

#: the array of an entry that holds each name's 64-bit hash
HASHES = "name_hashes"

Arrays = Dict[str, np.ndarray]
#: the arrays an entry of ``n`` rows holds (besides the hashes): checked on every read, and on every donor
Layout = Callable[[int], Mapping[str, ArraySpec]]
#: what the warning about a damaged entry tells the user
REMEDY = "delete the file: the names are encoded again"


def name_hashes(names: Sequence[str]) -> np.ndarray:
    """A 64-bit BLAKE2b hash of each name (uint64; 788k names collide with odds of about 1e-8)."""
    out = np.empty(len(names), dtype=np.uint64)
    for i, name in enumerate(names):
        out[i] = int.from_bytes(hashlib.blake2b(name.encode("utf8"), digest_size=8).digest(), "little")
    return out


def write_entry(path: Path, arrays: Arrays, meta: Dict[str, str]) -> None:
    """``write_arrays`` through a name of this process's own, then one rename: processes that build the
    same entry at once (cross-fitting folds whose KBs share every name) never write into one file."""
    private = path.with_name(f".{path.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}.partial")
    try:
        write_arrays(private, arrays, meta)
        os.replace(private, path)
    finally:
        private.unlink(missing_ok=True)


def safe_stem(kb_name: str) -> str:
    """A file-name-safe prefix from a KB's name (``kb`` when nothing is left)."""
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in kb_name)[:40] or "kb"


@dataclass
class NameCache:
    """The cache entry of ``names`` encoded under ``spec`` in ``folder``.

    ``spec`` is the settings part of the key, as bytes (each retriever keeps the
    bytes it always hashed, so existing entries stay valid); ``infix`` tells
    retrievers sharing a folder apart (``.rescnn``); ``layout`` gives the arrays
    (dtype, shape, finite values) of an entry of ``n`` rows: an entry, or a donor,
    that differs is ignored with a warning naming the file and the array. After
    :meth:`build`, ``reused`` counts the rows taken from another entry and ``donor`` names it.
    """

    folder: Path
    spec: bytes
    names: Sequence[str]
    kb_name: str = "kb"
    infix: str = ""
    layout: Optional[Layout] = None
    reused: int = 0
    donor: Optional[Path] = None
    _hashes: Optional[np.ndarray] = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.folder = Path(self.folder)
        digest = hashlib.sha256(self.spec)
        for name in self.names:
            digest.update(b"\n")
            digest.update(name.encode("utf8"))
        #: SHA-256 of the settings and every name: the entry's identity
        self.key = digest.hexdigest()
        #: SHA-256 of the settings alone: entries with the same one can lend rows
        self.spec_digest = hashlib.sha256(self.spec).hexdigest()
        self.path = self.folder / f"{safe_stem(self.kb_name)}{self.infix}-{self.key[:24]}.safetensors"

    @property
    def hashes(self) -> np.ndarray:
        if self._hashes is None:
            self._hashes = name_hashes(self.names)
        return self._hashes

    # -- reading -----------------------------------------------------------------------------------
    def _entries(self, pattern: str) -> List[Path]:
        return sorted(p for p in self.folder.glob(pattern) if p.is_file()) if self.folder.is_dir() else []

    def checked(self, path: Path, arrays: Arrays, rows: Optional[int] = None) -> None:
        """Raise ValueError naming ``path`` and the array when ``arrays`` (an entry, with or without its
        hashes) are not ``rows`` rows (default: as many as it has hashes) as :attr:`layout` says."""
        hashes = arrays.get(HASHES)
        if hashes is not None:
            check_arrays(path, {HASHES: hashes}, {HASHES: ArraySpec(("<u8",), (rows,))}, remedy=REMEDY)
            rows = len(hashes) if rows is None else rows
        if self.layout is not None:
            if rows is None:  # no hashes: the rows of the first array
                rows = len(next(iter(arrays.values()))) if arrays else 0
            rest = {k: v for k, v in arrays.items() if k != HASHES}
            check_arrays(path, rest, self.layout(rows), remedy=REMEDY)

    def read(self, valid: Optional[Callable[[Arrays], bool]] = None) -> Optional[Arrays]:
        """This entry's arrays (memory-mapped, without the hashes) if a file holds them as :attr:`layout` says
        and ``valid`` accepts them; else None. A damaged file is skipped with a warning, never fatal."""
        found = self._entries(f"*{self.infix}-{self.key[:24]}.safetensors")
        for path in sorted(found, key=lambda p: p != self.path):
            try:
                arrays, meta = read_arrays(path)
                if meta.get("key") != self.key:
                    continue
                self.checked(path, arrays, len(self.names))
                if valid is not None and not valid(arrays):
                    continue
            except (ValueError, KeyError) as err:
                logger.warning("Ignoring unreadable name cache %s (%s)", path, err)
                continue
            if HASHES not in arrays or meta.get("spec") != self.spec_digest:
                arrays = self._upgrade(path, arrays, meta)
            logger.info("Rows of %d names read from %s", len(self.names), path)
            return {k: v for k, v in arrays.items() if k != HASHES}
        return None

    def _upgrade(self, path: Path, arrays: Arrays, meta: Dict[str, str]) -> Arrays:
        """Give an entry written before the hashes its ``name_hashes`` and ``spec``, so it can lend rows."""
        rows = {k: v for k, v in arrays.items() if k != HASHES}
        try:
            write_entry(path, {**rows, HASHES: self.hashes}, {**meta, "spec": self.spec_digest})
            logger.info("Name cache %s: name hashes added, so KBs sharing its names can reuse its rows", path)
            return read_arrays(path)[0]
        except OSError as err:
            logger.warning("Could not add name hashes to %s (%s); it is read as it is", path, err)
            return arrays

    # -- building ----------------------------------------------------------------------------------
    def _donor(self) -> Optional[Tuple[Path, Arrays, np.ndarray]]:
        """The compatible entry holding most of these names: (path, arrays, row of each name there; -1: absent)."""
        best: Optional[Tuple[Path, Arrays, np.ndarray]] = None
        best_count = 0
        for path in self._entries(f"*{self.infix}-*.safetensors"):
            try:
                arrays, meta = read_arrays(path)
                theirs = arrays.get(HASHES)
                if meta.get("spec") != self.spec_digest or theirs is None or meta.get("key") == self.key:
                    continue
                self.checked(path, arrays)
            except ValueError as err:
                logger.warning("Name cache %s cannot lend rows (%s)", path, err)
                continue
            order = np.argsort(theirs, kind="stable")
            at = np.searchsorted(theirs, self.hashes, sorter=order)
            at = np.minimum(at, len(theirs) - 1)
            rows = order[at] if len(theirs) else np.zeros(len(self.names), dtype=np.int64)
            hit = (theirs[rows] == self.hashes) if len(theirs) else np.zeros(len(self.names), dtype=bool)
            count = int(hit.sum())
            if count > best_count:
                best, best_count = (path, arrays, np.where(hit, rows, -1).astype(np.int64)), count
        return best

    def build(self, encode: Callable[[np.ndarray], Arrays]) -> Arrays:
        """The arrays of every name: rows of a compatible entry where one holds the name,
        ``encode(indices)`` (arrays of ``len(indices)`` rows, for those names) for the rest."""
        donor = self._donor() if self.names else None
        if donor is None:
            return encode(np.arange(len(self.names), dtype=np.int64))
        path, theirs, rows = donor
        have = np.flatnonzero(rows >= 0)
        todo = np.flatnonzero(rows < 0)
        fresh = encode(todo)
        lent = {k: v for k, v in theirs.items() if k != HASHES}
        if sorted(fresh) != sorted(lent) or any(
            fresh[k].dtype != lent[k].dtype or fresh[k].shape[1:] != lent[k].shape[1:] for k in fresh
        ):
            logger.warning("Name cache %s holds other arrays than this encoder makes; encoding every name", path)
            return encode(np.arange(len(self.names), dtype=np.int64))
        out = {k: np.empty((len(self.names),) + v.shape[1:], dtype=v.dtype) for k, v in lent.items()}
        for k, v in lent.items():
            out[k][have] = v[rows[have]]
            out[k][todo] = fresh[k]
        self.reused, self.donor = len(have), path
        logger.info("Rows of %d of %d names taken from %s; %d encoded", len(have), len(self.names), path, len(todo))
        return out

    def write(self, arrays: Arrays, meta: Dict[str, str]) -> Arrays:
        """Store ``arrays`` (with the names' hashes) as this entry; the memory-mapped copy."""
        self.folder.mkdir(parents=True, exist_ok=True)
        entry = {"key": self.key, "spec": self.spec_digest, "kb": self.kb_name, "n_names": str(len(self.names)), **meta}
        write_entry(self.path, {**arrays, HASHES: self.hashes}, entry)
        return {k: v for k, v in read_arrays(self.path)[0].items() if k != HASHES}
