"""A knowledge base as flat arrays, saved as ``kb.safetensors`` and read memory-mapped.

:class:`CompactKB` answers every question :class:`~spacy_genbioel.kb.base.KnowledgeBase`
answers (the decoder, the retrievers and the component use it unchanged) from
numpy arrays instead of a Python object per name: a UMLS-sized KB (10M names)
opens in milliseconds, takes no memory until its pages are read, and shares
those pages between processes. :meth:`CompactKB.build` makes one from a
stream of concepts with KnowledgeBase's rules (:mod:`.compact_build`), and it
holds the KB as its JSONL file holds it: a concept's raw names are those
whose normalized form stayed with it (``KnowledgeBase.to_jsonl``), so reading
``kb.safetensors`` and reading ``kb.jsonl`` give the same KB.

The arrays (one-dimensional; ``*_ptr`` and ``*_offsets`` have one entry more
than the things they delimit):

==========================================  ================================================================
``name_bytes``, ``name_offsets``            unique normalized names, UTF-8, in name-index order
``name_hashes``, ``name_order``             their 64-bit hashes sorted, and the name index of each (lookups)
``name_concepts_ptr``, ``name_concepts``    concepts of each name (concept numbers, highest prior first)
``concept_bytes``, ``concept_offsets``      concept IDs in KB order; ``concept_hashes``, ``concept_order`` as for names
``concept_names_ptr``, ``concept_names``    names of each concept (name indices, ascending)
``raw_bytes``, ``raw_offsets``, ``concept_raw_ptr``  raw names of each concept (the first is the preferred name)
``definition_bytes``, ``definition_offsets``  one per concept, empty for none (both empty: no definitions)
``type_bytes``, ``type_offsets``, ``concept_types_ptr``, ``concept_types``  type names and each concept's
``priors``                                  one per concept (empty: all 0)
==========================================  ================================================================

Metadata: ``format`` (``genbioel.kb``), ``format_version``, ``normalizer``,
``dedup``, ``name``, ``checksum`` (:meth:`KnowledgeBase.checksum`, computed
once when built), ``content_sha256`` (:func:`~.compact_build.content_digest`: SHA-256 over
every array's bytes, computed when saved), counts and drops, and optionally
``jsonl_size`` / ``jsonl_digest``: the ``kb.jsonl`` it was written beside
(:func:`jsonl_fingerprint`). Opening checks the header and every array's
length and end points, and the arrays against ``content_sha256`` (one
sequential read of the file, about 1.5 GB/s here, in chunks whose pages are
handed back to the OS: the file does not stay resident), so a changed byte
(a concept ID, a name, an index) is refused rather than linked to a wrong
ID; files written before the digest existed open unchecked. Every read
checks the offsets it uses, so a damaged file raises
:class:`~spacy_genbioel.kb.base.KBFormatError` naming it rather than an
IndexError; :meth:`CompactKB.validate` checks every array's structure.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np

from spacy_genbioel.arrayfile import read_arrays, write_arrays
from spacy_genbioel.kb.base import KB_FILE_FORMATS, Concept, EmptyKBError, KBDrops, KBFormatError, KnowledgeBase
from spacy_genbioel.kb.compact_build import build_arrays, checksum_of, content_digest, string_hash
from spacy_genbioel.kb.normalizers import NORMALIZER_ALIASES, Normalizer, get_normalizer
from spacy_genbioel.util import PathLike

logger = logging.getLogger(__name__)

__all__ = ["CompactKB", "jsonl_fingerprint"]

FORMAT = "genbioel.kb"
FORMAT_VERSION = "1"
# the string tables: <prefix>_bytes and <prefix>_offsets each
_STRINGS = ("name", "concept", "raw", "type", "definition")
_MEMO = 1 << 16  # answers CompactKB remembers (name lookups, a name's concepts, a concept's names)
#: the metadata key of :func:`content_digest`
CONTENT_KEY = "content_sha256"


class _Strings(Sequence[str]):
    """A read-only sequence over one of the KB's string tables (names, concept IDs)."""

    def __init__(self, kb: "CompactKB", prefix: str) -> None:
        self._kb, self._prefix = kb, prefix
        self._len = len(kb.arrays[f"{prefix}_offsets"]) - 1

    def __len__(self) -> int:
        return self._len

    def __getitem__(self, index):  # type: ignore[override]
        if isinstance(index, slice):
            return list(self._kb.strings(self._prefix, *index.indices(self._len)))
        i = int(index)
        if i < 0:
            i += self._len
        if not 0 <= i < self._len:
            raise IndexError(f"{self._prefix} index {index} out of range ({self._len})")
        return self._kb.string(self._prefix, i)

    def __iter__(self) -> Iterator[str]:
        return self._kb.strings(self._prefix, 0, self._len, 1)

    def __contains__(self, value: object) -> bool:
        return self._kb.lookup(self._prefix, value) is not None

    def index(self, value: Any, start: int = 0, stop: Optional[int] = None) -> int:
        found = self._kb.lookup(self._prefix, value)
        if found is None or found < start or (stop is not None and found >= stop):
            raise ValueError(f"{value!r} is not in the KB's {self._prefix}s")
        return found

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, (list, tuple, _Strings))
            and len(self) == len(other)
            and all(a == b for a, b in zip(self, other))
        )

    def __repr__(self) -> str:
        return f"<{self._len} {self._prefix} strings of {self._kb.name!r}>"


class CompactKB(KnowledgeBase):
    """A read-only KB over flat arrays (see the module docstring); build one with
    :meth:`build` or :meth:`from_kb`, save it with :meth:`save` and open it with
    :meth:`open` (or ``KnowledgeBase.load("kb.safetensors")``)."""

    def __init__(
        self,
        arrays: Dict[str, np.ndarray],
        metadata: Dict[str, str],
        *,
        normalizer: Union[str, Normalizer, None] = None,
        name: Optional[str] = None,
        source: Optional[str] = None,
    ) -> None:
        # KnowledgeBase.__init__ builds a dict index: not called on purpose
        self.source = source
        self.arrays = arrays
        self.metadata = dict(metadata)
        self.normalizer_name = self.metadata.get("normalizer", "genbioel")
        try:
            self.normalize: Normalizer = get_normalizer(normalizer if normalizer is not None else self.normalizer_name)
        except ValueError as err:
            raise KBFormatError(f"{self._where()}: {err}") from None
        if isinstance(normalizer, str):
            self.normalizer_name = normalizer
        self.dedup = self.metadata.get("dedup") == "true"
        self.name = name or self.metadata.get("name", "kb")
        drops = json.loads(self.metadata.get("drops", "{}"))
        self.drops = KBDrops(**{k: drops[k] for k in ("names", "concepts", "nameless", "examples") if k in drops})
        self._memo: Dict[
            Tuple[str, object], Any
        ] = {}  # recent lookups: linking asks about the same names again and again
        self._check()

    # -- construction --------------------------------------------------------------------------------------------
    @classmethod
    def build(
        cls,
        concepts: Iterable[Concept],
        *,
        normalizer: Union[str, Normalizer] = "genbioel",
        dedup: bool = False,
        name: str = "kb",
        normalizer_name: Optional[str] = None,
    ) -> "CompactKB":
        """The KB ``KnowledgeBase(concepts, normalizer=..., dedup=..., name=...)`` would be, as
        arrays (as saved: see the module docstring); the same drops are logged and the same
        :class:`EmptyKBError` raised."""
        label = _registered_name(normalizer, normalizer_name)
        arrays, drops = build_arrays(concepts, get_normalizer(normalizer), dedup)
        if drops.names or drops.concepts:
            logger.warning("KB %r: %s (e.g. %s)", name, drops.summary(), ", ".join(drops.examples))
        elif drops.nameless:
            logger.warning("KB %r: %s (nothing can be linked to them)", name, drops.summary())
        n_names = len(arrays["name_offsets"]) - 1
        if not n_names:
            n_read = len(arrays["concept_offsets"]) - 1 + drops.concepts
            raise EmptyKBError(
                f"KB {name!r} has no usable name ({n_read} concept(s) read"
                + (f"; {drops.summary()})" if drops.summary() else ")")
            )
        meta = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "normalizer": label,
            "dedup": "true" if dedup else "false",
            "name": name,
            "drops": json.dumps(drops.__dict__),
        }
        kb = cls(arrays, meta, normalizer=normalizer)
        kb.normalizer_name = label
        kb.metadata["normalizer"] = label
        kb.metadata["checksum"] = checksum_of((n, kb.ids_for_name_index(i)) for i, n in enumerate(kb.names))
        return kb

    @classmethod
    def from_kb(cls, kb: KnowledgeBase) -> "CompactKB":
        """``kb`` as a compact KB (as it would be read back from its JSONL file)."""
        if isinstance(kb, CompactKB):
            return kb
        return cls.build(
            iter(kb), normalizer=kb.normalize, dedup=kb.dedup, name=kb.name, normalizer_name=kb.normalizer_name
        )

    def _rebuild(self, concepts: Iterable[Concept]) -> "CompactKB":
        return CompactKB.build(
            concepts, normalizer=self.normalize, dedup=self.dedup, name=self.name, normalizer_name=self.normalizer_name
        )

    # -- files ---------------------------------------------------------------------------------------------------
    def save(self, path: PathLike, jsonl: Optional[PathLike] = None) -> None:  # type: ignore[override]
        """Write ``kb.safetensors`` (other suffixes: :meth:`KnowledgeBase.save`'s formats).
        ``jsonl``: the ``kb.jsonl`` written beside it, recorded so that :meth:`open` can
        tell when that file was edited afterwards."""
        if Path(path).suffix != ".safetensors":
            return super().save(path)
        meta = {k: v for k, v in self.metadata.items() if not k.startswith("jsonl_")}
        meta.update(
            normalizer=self.normalizer_name, name=self.name, n_names=str(self.n_names), n_concepts=str(len(self))
        )
        meta[CONTENT_KEY] = content_digest(self.arrays)
        if jsonl is not None:
            size, digest = jsonl_fingerprint(jsonl)
            meta.update(jsonl_size=str(size), jsonl_digest=digest)
        write_arrays(path, self.arrays, meta)

    @classmethod
    def open(
        cls,
        path: PathLike,
        *,
        normalizer: Union[str, Normalizer, None] = None,
        dedup: Optional[bool] = None,
        name: Optional[str] = None,
        verify: bool = True,
    ) -> "CompactKB":
        """Open ``kb.safetensors`` memory-mapped. ``normalizer`` / ``dedup`` other than
        those it was built with give the KB its JSONL file would give with them
        (rebuilt in memory); a damaged file raises :class:`KBFormatError` naming it,
        and so does one whose arrays differ from the ``content_sha256`` recorded when it
        was written (``verify=False`` skips that read of the whole file, for tools)."""
        path = Path(path)
        if not path.exists():
            raise FileNotFoundError(f"KB file not found: {path}")
        arrays, meta = read_arrays(path, KBFormatError)
        if meta.get("format") != FORMAT:
            raise KBFormatError(f"{path}: not a compact KB file (format {meta.get('format')!r})")
        if meta.get("format_version") != FORMAT_VERSION:
            raise KBFormatError(
                f"{path}: compact KB format_version {meta.get('format_version')!r}, this version reads {FORMAT_VERSION}"
            )
        if "checksum" not in meta:
            raise KBFormatError(f"{path}: the compact KB's metadata lacks its checksum")
        kb = cls(arrays, meta, name=name or path.stem, source=str(path))
        if verify:
            kb.verify_content()
        changed = normalizer is not None and get_normalizer(normalizer) is not kb.normalize
        if dedup and not kb.dedup and len(kb.names) and int(np.diff(kb.arrays["name_concepts_ptr"]).max()) > 1:
            changed = True
        if changed:
            logger.info(
                "%s was built with normalizer %r, dedup %s: rebuilding it in memory with %r, dedup %s",
                path,
                kb.normalizer_name,
                kb.dedup,
                normalizer,
                dedup,
            )
            return CompactKB.build(
                iter(kb),
                normalizer=normalizer if normalizer is not None else kb.normalize,
                dedup=bool(dedup) if dedup is not None else kb.dedup,
                name=kb.name,
            )
        if isinstance(normalizer, str):
            kb.normalizer_name = normalizer
        return kb

    def verify_content(self) -> None:
        """Check the arrays against the ``content_sha256`` recorded when the file was written
        (:class:`KBFormatError` naming the file when they differ); a file without one (written
        before it existed) is left unchecked."""
        recorded = self.metadata.get(CONTENT_KEY)
        if recorded is None:
            logger.info("%s has no content checksum (written by an older version): not verified", self._where())
        elif content_digest(self.arrays) != recorded:
            raise self._damaged("its arrays differ from the checksum recorded when it was written: a byte was changed")

    def matches_jsonl(self, jsonl: PathLike) -> bool:
        """Whether ``jsonl`` is the file this KB was saved beside, unchanged (size and sampled digest)."""
        if "jsonl_size" not in self.metadata or not Path(jsonl).exists():
            return False
        size, digest = jsonl_fingerprint(jsonl)
        return self.metadata.get("jsonl_size") == str(size) and self.metadata.get("jsonl_digest") == digest

    def to_jsonl(self, path: PathLike) -> None:
        # the raw names are already those KnowledgeBase.to_jsonl keeps
        with Path(path).open("w", encoding="utf8") as out:
            for concept in self:
                out.write(json.dumps(concept.to_dict(), ensure_ascii=False) + "\n")

    # -- queries -------------------------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.arrays["concept_offsets"]) - 1

    def __contains__(self, concept_id: object) -> bool:
        return self.lookup("concept", concept_id) is not None

    def __iter__(self) -> Iterator[Concept]:
        return (self._concept(i) for i in range(len(self)))

    def __getitem__(self, concept_id: str) -> Concept:
        index = self.lookup("concept", concept_id)
        if index is None:
            raise KeyError(concept_id)
        return self._concept(index)

    def __repr__(self) -> str:
        return f"CompactKB({self.name!r}, {len(self)} concepts, {self.n_names} names, dedup={self.dedup})"

    @property
    def names(self) -> Sequence[str]:  # type: ignore[override]
        return _Strings(self, "name")

    @property
    def concept_ids(self) -> Sequence[str]:  # type: ignore[override]
        return _Strings(self, "concept")

    @property
    def n_names(self) -> int:
        return len(self.arrays["name_offsets"]) - 1

    def name_index(self, name: str) -> Optional[int]:
        return self._memoized("name", name, lambda: self.lookup("name", name))

    def ids_for_name_index(self, index: int) -> Tuple[str, ...]:
        return self._memoized(
            "ids",
            index,
            lambda: tuple(self.string("concept", c) for c in self._slice("name_concepts", index, len(self))),
        )

    def names_of(self, concept_id: str) -> List[str]:
        def read() -> Tuple[str, ...]:
            index = self.lookup("concept", concept_id)
            return (
                ()
                if index is None
                else tuple(self.string("name", n) for n in self._slice("concept_names", index, self.n_names))
            )

        return list(self._memoized("names_of", concept_id, read))

    def _memoized(self, kind: str, key: object, read: Callable[[], Any]) -> Any:
        """``read()``, remembered for the next ``(kind, key)``
        (at most :data:`_MEMO` answers, then forgotten at once)."""
        try:
            return self._memo[kind, key]
        except KeyError:
            pass
        if len(self._memo) >= _MEMO:
            self._memo.clear()
        value = self._memo[kind, key] = read()
        return value

    def preferred_name(self, concept_id: str) -> str:
        index = self.lookup("concept", concept_id)
        if index is None:
            raise KeyError(concept_id)
        raws = self._span("concept_raw_ptr", index, len(self.arrays["raw_offsets"]) - 1)
        return self.string("raw", raws[0]) if raws[1] > raws[0] else concept_id

    def checksum(self) -> str:
        return self.metadata["checksum"]

    # -- reading the arrays --------------------------------------------------------------------------------------
    def string(self, prefix: str, i: int) -> str:
        """String ``i`` of a table (``name``, ``concept``, ``raw``, ``type``, ``definition``)."""
        blob, offsets = self.arrays[f"{prefix}_bytes"], self.arrays[f"{prefix}_offsets"]
        start, stop = int(offsets[i]), int(offsets[i + 1])
        if not 0 <= start <= stop <= len(blob):
            raise self._damaged(f"{prefix} {i} has offsets {start}..{stop} outside its {len(blob)} bytes")
        try:
            return blob[start:stop].tobytes().decode("utf8")
        except UnicodeDecodeError:
            raise self._damaged(f"{prefix} {i} is not UTF-8") from None

    def strings(self, prefix: str, start: int, stop: int, step: int = 1, chunk: int = 1 << 16) -> Iterator[str]:
        """Strings ``start:stop:step`` of a table, decoded a chunk at a time."""
        if step != 1:
            yield from (self.string(prefix, i) for i in range(start, stop, step))
            return
        blob, offsets = self.arrays[f"{prefix}_bytes"], self.arrays[f"{prefix}_offsets"]
        for begin in range(start, stop, chunk):
            ends = offsets[begin : min(stop, begin + chunk) + 1].tolist()
            if ends and (ends[0] < 0 or ends[-1] > len(blob) or any(b < a for a, b in zip(ends, ends[1:]))):
                raise self._damaged(f"{prefix} offsets out of order near {begin}")
            data = blob[ends[0] : ends[-1]].tobytes() if ends else b""
            base = ends[0] if ends else 0
            try:
                yield from (data[a - base : b - base].decode("utf8") for a, b in zip(ends, ends[1:]))
            except UnicodeDecodeError:
                raise self._damaged(f"{prefix} near {begin} is not UTF-8") from None

    def lookup(self, prefix: str, value: object) -> Optional[int]:
        """Index of a string in the ``name`` or ``concept`` table (None: absent)."""
        if not isinstance(value, str):
            return None
        data = value.encode("utf8", "surrogatepass")
        hashes, order = self.arrays[f"{prefix}_hashes"], self.arrays[f"{prefix}_order"]
        key = string_hash(data)
        lo = int(np.searchsorted(hashes, key, side="left"))
        hi = int(np.searchsorted(hashes, key, side="right"))
        blob, offsets = self.arrays[f"{prefix}_bytes"], self.arrays[f"{prefix}_offsets"]
        for pos in range(lo, hi):
            i = int(order[pos])
            if not 0 <= i < len(offsets) - 1:
                raise self._damaged(f"{prefix}_order holds {i}, beyond {len(offsets) - 1} strings")
            start, stop = int(offsets[i]), int(offsets[i + 1])
            if stop - start == len(data) and blob[start:stop].tobytes() == data:
                return i
        return None

    def _span(self, ptr: str, i: int, limit: int) -> Tuple[int, int]:
        pointers = self.arrays[ptr]
        start, stop = int(pointers[i]), int(pointers[i + 1])
        if not 0 <= start <= stop <= limit:
            raise self._damaged(f"{ptr}[{i}] = {start}..{stop} outside 0..{limit}")
        return start, stop

    def _slice(self, table: str, i: int, bound: int) -> List[int]:
        """Entries of CSR ``table`` for row ``i``, each checked to be below ``bound``."""
        start, stop = self._span(f"{table}_ptr", i, len(self.arrays[table]))
        values = self.arrays[table][start:stop].tolist()
        if values and (min(values) < 0 or max(values) >= bound):
            raise self._damaged(f"{table} of row {i} point outside 0..{bound - 1}")
        return values

    def _concept(self, i: int) -> Concept:
        arrays = self.arrays
        start, stop = self._span("concept_raw_ptr", i, len(arrays["raw_offsets"]) - 1)
        names = list(self.strings("raw", start, stop))
        definition = None
        if len(arrays["definition_offsets"]):
            definition = self.string("definition", i) or None
        types: List[str] = []
        if len(arrays["concept_types_ptr"]):
            types = [self.string("type", t) for t in self._slice("concept_types", i, len(arrays["type_offsets"]) - 1)]
        prior = float(arrays["priors"][i]) if len(arrays["priors"]) else 0.0
        return Concept(self.string("concept", i), names, definition, types, prior)

    # -- checks --------------------------------------------------------------------------------------------------
    def _where(self) -> str:
        return self.source or f"compact KB {getattr(self, 'name', '')!r}"

    def _damaged(self, reason: str) -> KBFormatError:
        return KBFormatError(f"{self._where()}: damaged compact KB ({reason})")

    def _shapes(self) -> Dict[str, Tuple[int, str]]:
        """Expected length and dtype kind of every array, from the counts the arrays give."""
        a = self.arrays
        n_names, n_concepts = len(a["name_offsets"]) - 1, len(a["concept_offsets"]) - 1
        n_raw, n_types = len(a["raw_offsets"]) - 1, len(a["type_offsets"]) - 1
        optional = lambda key, n: 0 if not len(a[key]) else n  # noqa: E731 (empty: absent)
        return {
            "name_hashes": (n_names, "i"),
            "name_order": (n_names, "i"),
            "name_concepts_ptr": (n_names + 1, "i"),
            "concept_hashes": (n_concepts, "i"),
            "concept_order": (n_concepts, "i"),
            "concept_names_ptr": (n_concepts + 1, "i"),
            "concept_raw_ptr": (n_concepts + 1, "i"),
            "definition_offsets": (optional("definition_offsets", n_concepts + 1), "i"),
            "concept_types_ptr": (optional("concept_types_ptr", n_concepts + 1), "i"),
            "priors": (optional("priors", n_concepts), "f"),
            "raw_offsets": (n_raw + 1, "i"),
            "type_offsets": (n_types + 1, "i"),
        }

    def _check(self) -> None:
        """Cheap checks on opening: every array there, one-dimensional, of the right kind,
        length and end points (what each read then relies on is checked as it is read)."""
        a = self.arrays
        needed = [f"{p}_{s}" for p in _STRINGS for s in ("bytes", "offsets")] + [
            "name_hashes",
            "name_order",
            "name_concepts_ptr",
            "name_concepts",
            "concept_hashes",
            "concept_order",
            "concept_names_ptr",
            "concept_names",
            "concept_raw_ptr",
            "concept_types_ptr",
            "concept_types",
            "priors",
        ]
        missing = [k for k in needed if k not in a]
        if missing:
            raise self._damaged(f"missing arrays {', '.join(missing)}")
        if any(v.ndim != 1 for v in a.values()):
            raise self._damaged("arrays must be one-dimensional")
        floats = [k for k, v in a.items() if v.dtype.kind not in "iu" and k != "priors"]
        if floats:
            raise self._damaged(f"{', '.join(sorted(floats))} must hold integers")
        for prefix in _STRINGS:
            offsets, blob = a[f"{prefix}_offsets"], a[f"{prefix}_bytes"]
            if offsets.dtype.kind not in "iu" or blob.dtype != np.uint8:
                raise self._damaged(f"{prefix} strings of the wrong type")
            if prefix != "definition" and not len(offsets):
                raise self._damaged(f"{prefix}_offsets is empty")
            if len(offsets) and (int(offsets[0]) != 0 or int(offsets[-1]) != len(blob)):
                raise self._damaged(f"{prefix}_offsets do not span the {len(blob)} bytes")
        for key, (length, kind) in self._shapes().items():
            if len(a[key]) != length or a[key].dtype.kind not in ("iu" if kind == "i" else "f"):
                raise self._damaged(f"{key} has {len(a[key])} {a[key].dtype} entries, expected {length}")
        for ptr, table in (
            ("name_concepts_ptr", "name_concepts"),
            ("concept_names_ptr", "concept_names"),
            ("concept_types_ptr", "concept_types"),
        ):
            if len(a[ptr]) and (int(a[ptr][0]) != 0 or int(a[ptr][-1]) != len(a[table])):
                raise self._damaged(f"{ptr} does not span {table}")
        if int(a["concept_raw_ptr"][0]) != 0 or int(a["concept_raw_ptr"][-1]) != len(a["raw_offsets"]) - 1:
            raise self._damaged("concept_raw_ptr does not span the raw names")
        if len(a["priors"]) and not bool(np.isfinite(a["priors"]).all()):  # a NaN prior reorders candidates
            at = int(np.flatnonzero(~np.isfinite(a["priors"]))[0])
            raise self._damaged(f"array 'priors' holds {float(a['priors'][at])} at [{at}]; every value must be finite")

    def validate(self) -> None:
        """Check every array fully (sorted hashes, monotone offsets and pointers,
        indices in range); O(size), for tests and tools rather than every load."""
        a = self.arrays
        n_names, n_concepts = self.n_names, len(self)
        monotone = [f"{p}_offsets" for p in _STRINGS] + [
            "name_concepts_ptr",
            "concept_names_ptr",
            "concept_raw_ptr",
            "concept_types_ptr",
            "name_hashes",
            "concept_hashes",
        ]
        for key in monotone:
            if len(a[key]) > 1 and bool((a[key][1:] < a[key][:-1]).any()):  # not np.diff: hashes span int64
                raise self._damaged(f"{key} is not in order")
        ranges = {
            "name_order": n_names,
            "concept_order": n_concepts,
            "name_concepts": n_concepts,
            "concept_names": n_names,
            "concept_types": len(a["type_offsets"]) - 1,
        }
        for key, bound in ranges.items():
            if len(a[key]) and (int(a[key].min()) < 0 or int(a[key].max()) >= bound):
                raise self._damaged(f"{key} points outside 0..{bound - 1}")


def _registered_name(normalizer: Union[str, Normalizer], given: Optional[str]) -> str:
    """A name :func:`get_normalizer` knows for ``normalizer``, to record in the file: the name
    given, if it is one, else the alias of the same function (a KB built with the function
    itself, as ``KnowledgeBase.with_*`` build them), so that the file opens without being told."""
    if isinstance(normalizer, str):
        return normalizer
    try:
        if given is not None and get_normalizer(given) is normalizer:
            return given
    except ValueError:
        pass
    for alias in NORMALIZER_ALIASES:
        if get_normalizer(alias) is normalizer:
            return alias
    return given or getattr(normalizer, "__name__", "custom")


def jsonl_fingerprint(path: PathLike, block: int = 1 << 16, samples: int = 16) -> Tuple[int, str]:
    """(size, SHA-256 of ``samples`` evenly spaced blocks): a constant-time check that a
    ``kb.jsonl`` (GBs for UMLS) is the one a ``kb.safetensors`` was written beside."""
    path = Path(path)
    size = path.stat().st_size
    digest = hashlib.sha256(str(size).encode())
    with path.open("rb") as handle:
        for k in range(samples):
            handle.seek(max(0, (size - block) * k // max(1, samples - 1)))
            digest.update(handle.read(block))
    return size, digest.hexdigest()


def _open(path: PathLike, **kwargs: Any) -> CompactKB:
    try:
        return CompactKB.open(path, **kwargs)
    except EmptyKBError as err:
        raise EmptyKBError(f"{path}: {err}") from None


KB_FILE_FORMATS[".safetensors"] = (_open, lambda kb, path: CompactKB.from_kb(kb).save(path))
