"""The knowledge base: concepts, their names, and the name -> concepts map.

A concept has an ID, raw names (synonyms, the first is its preferred name), an
optional definition and types. The KB normalizes every name with a swappable
normalizer (GenBioEL's by default, see :mod:`~spacy_genbioel.kb.normalizers`)
and keeps a many-to-one map from normalized name to concept IDs. With
``dedup=True`` it applies GenBioEL's rule: a name shared by several concepts
stays only on the concept with the fewest names.

Two plain file formats travel: JSONL (one concept per line, ``{"id", "names",
"definition", "types"}``) and GenBioEL's ``target_kb.json`` (``{id: [names]}``).
Both are read here, once, for :meth:`KnowledgeBase.load` and for ``build-kb``
(``-f jsonl``, ``-f genbioel``): ``.gz``, a BOM and any line ends are fine, and
every failure is a :class:`KBFormatError` naming the file and line. Binary
formats register a reader and a writer by suffix in :data:`KB_FILE_FORMATS`:
:mod:`~spacy_genbioel.kb.compact` adds ``.safetensors`` (a compact KB read
memory-mapped, for KBs of UMLS's size).

Unusable names are dropped and counted (:class:`KBDrops`, logged): a name that
normalizes to nothing, and a concept all of whose names do. A concept listed
without names stays as an ID (that is how a de-duplicated KB file records a
concept whose names went to other concepts) and is counted too (a warning:
nothing can be linked to it). A KB left with no name at all is refused
(:class:`EmptyKBError`).

Concept IDs are checked where every reader's concepts pass (:func:`clean_concept`,
for this class and the compact build alike; the JSON readers check first, to
name the line): an ID may not hold whitespace, control characters or the
characters that join several IDs in one corpus field (``|`` and ``+`` in
PubTator, also ``,`` and ``;`` in BioC). The writers do not escape them:
PubTator and BioC have no escape, and an ID holding one would be written as a
broken line or read back as several IDs. Names are stripped; a name left empty
normalizes to nothing and is dropped and counted as above.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

from spacy_genbioel.kb.normalizers import Normalizer, get_normalizer, strip_controls
from spacy_genbioel.util import LINE_PROBE, PathLike, iter_json_lines, iter_lines, line_separator, parse_json, read_text

logger = logging.getLogger(__name__)

#: suffix -> (reader(path, **load_kwargs), writer(kb, path)) of binary KB files, registered by the
#: modules that define them (``kb.compact``: ``.safetensors``); ``load`` and ``save`` use them
KB_FILE_FORMATS: Dict[str, Tuple[Callable[..., "KnowledgeBase"], Callable[["KnowledgeBase", Path], None]]] = {}


class KBFormatError(ValueError):
    """A KB file could not be read; the message names the file and line."""

    @classmethod
    def at(cls, path: PathLike, lineno: Union[int, str], reason: str) -> "KBFormatError":
        """The error for ``path`` at ``lineno``, as ``"file:line: reason"``."""
        return cls(f"{path}:{lineno}: {reason}")


class ControlCharacters:
    """What :func:`~spacy_genbioel.kb.normalizers.strip_controls` took out of one file's names and lines
    (NUL, terminal escape sequences, DEL, C1 controls: kept, they reached the index, the trie and
    printed output), counted for one warning that names the file and the first lines."""

    def __init__(self, path: PathLike) -> None:
        self.path = path
        self.count = 0
        #: where the first few were (line numbers, or record names)
        self.where: List[Union[int, str]] = []

    def clean(self, text: str, lineno: Union[int, str], keep_tabs: bool = False) -> str:
        """``text`` (of line ``lineno``) without control characters, counted when it had some."""
        cleaned = strip_controls(text, keep_tabs)
        if cleaned != text:
            self.count += 1
            if len(self.where) < 5:
                self.where.append(lineno)
        return cleaned

    def concept(self, concept: "Concept", lineno: Union[int, str]) -> "Concept":
        """``concept`` with control characters taken out of its names and definition."""
        names = [self.clean(name, lineno) for name in concept.names]
        definition = self.clean(concept.definition, lineno) if concept.definition else concept.definition
        if names == concept.names and definition == concept.definition:
            return concept
        return Concept(concept.id, names, definition, concept.types, concept.prior)

    def report(self) -> None:
        """One warning when anything was taken out."""
        if self.count:
            logger.warning(
                "%s: control characters (NUL, terminal escapes, DEL...) dropped from %d lines or names "
                "(%s%s): check how the file was made",
                self.path,
                self.count,
                ", ".join(f"line {at}" if isinstance(at, int) else str(at) for at in self.where),
                ", ..." if self.count > len(self.where) else "",
            )

    def iter_lines(self) -> Iterator[Tuple[int, str]]:
        """The file's lines (:func:`~spacy_genbioel.util.iter_lines`, errors as :class:`KBFormatError`),
        control characters but tabs dropped and counted; the warning once the last line is read."""
        for lineno, line in iter_lines(self.path, KBFormatError):
            yield lineno, self.clean(line, lineno, keep_tabs=True)
        self.report()


def kb_lines(path: PathLike) -> Iterator[Tuple[int, str]]:
    """The lines of a KB file, control characters but tabs dropped and counted (:class:`ControlCharacters`)."""
    return ControlCharacters(path).iter_lines()


class EmptyKBError(KBFormatError):
    """A KB without a single usable name: nothing could ever be linked to it."""


@dataclass
class KBDrops:
    """What building a KB left out or could not use (see the module docstring)."""

    names: int = 0  # names that normalize to nothing, dropped
    concepts: int = 0  # concepts all of whose names normalize to nothing, dropped
    nameless: int = 0  # concepts listed without names, kept as IDs
    examples: List[str] = field(default_factory=list)

    def summary(self) -> str:
        """``"dropped 3 name(s) that normalize to nothing; ..."``; empty when nothing was dropped or kept nameless."""
        parts = []
        if self.names:
            parts.append(f"dropped {self.names} name(s) that normalize to nothing")
        if self.concepts:
            parts.append(f"dropped {self.concepts} concept(s) with no other name")
        if self.nameless:
            parts.append(f"{self.nameless} concept(s) without names kept as IDs only")
        return "; ".join(parts)


@dataclass
class Concept:
    id: str
    names: List[str]
    definition: Optional[str] = None
    types: List[str] = field(default_factory=list)
    # how often the concept is the gold answer in a training corpus: orders the
    # concepts of a shared name (MEDIC lists "breast cancer" under OMIM 114480
    # and MeSH D001943; a linker writes the first)
    prior: float = 0.0

    def to_dict(self) -> dict:
        data: dict = {"id": self.id, "names": list(self.names)}
        if self.definition:
            data["definition"] = self.definition
        if self.types:
            data["types"] = list(self.types)
        if self.prior:
            data["prior"] = self.prior
        return data


class KnowledgeBase:
    """Concepts and the normalized-name index the linker decodes into.

    Names are kept per concept in their raw form; ``names`` (the decoding
    vocabulary) are the unique normalized forms. Concepts with the same ID are
    merged (names unioned, first definition kept).
    """

    def __init__(
        self,
        concepts: Iterable[Concept] = (),
        *,
        normalizer: Union[str, Normalizer] = "genbioel",
        dedup: bool = False,
        name: str = "kb",
    ) -> None:
        self.normalizer_name = normalizer if isinstance(normalizer, str) else getattr(normalizer, "__name__", "custom")
        self.normalize: Normalizer = get_normalizer(normalizer)
        self.dedup = dedup
        self.name = name
        self._concepts: Dict[str, Concept] = {}
        self.drops = KBDrops()
        for index, concept in enumerate(concepts, start=1):
            self._add(concept, index)
        self._build_index()
        if self.drops.names or self.drops.concepts:
            logger.warning("KB %r: %s (e.g. %s)", name, self.drops.summary(), ", ".join(self.drops.examples))
        elif self.drops.nameless:
            logger.warning("KB %r: %s (nothing can be linked to them)", name, self.drops.summary())
        if not self._names:
            n_read = len(self._concepts) + self.drops.concepts
            raise EmptyKBError(
                f"KB {name!r} has no usable name ({n_read} concept(s) read"
                + (f"; {self.drops.summary()})" if self.drops.summary() else ")")
            )

    # -- construction -------------------------------------------------------
    def _add(self, concept: Concept, index: int) -> None:
        cid, names = clean_concept(concept, f"KB {self.name!r}: concept #{index}")
        existing = self._concepts.get(cid)
        if existing is None:
            self._concepts[cid] = Concept(cid, names, concept.definition, list(concept.types), concept.prior)
            return
        existing.prior = max(existing.prior, concept.prior)
        existing.names = list(dict.fromkeys([*existing.names, *names]))
        if not existing.definition and concept.definition:
            existing.definition = concept.definition
        existing.types.extend(t for t in concept.types if t not in existing.types)

    def _build_index(self) -> None:
        # normalized names per concept, order kept; unusable names and concepts dropped and counted
        per_concept: Dict[str, List[str]] = {}
        for cid, concept in list(self._concepts.items()):
            normed: Dict[str, None] = {}
            usable: List[str] = []
            for raw in concept.names:
                norm = self.normalize(raw)
                if norm:
                    normed.setdefault(norm, None)
                    usable.append(raw)
                else:
                    self.drops.names += 1
                    if len(self.drops.examples) < 5:
                        self.drops.examples.append(f"{cid}: {raw!r}")
            if not usable:
                if concept.names:
                    self.drops.concepts += 1
                    del self._concepts[cid]
                    continue
                self.drops.nameless += 1
            elif len(usable) < len(concept.names):
                concept.names = usable
            per_concept[cid] = list(normed)
        name_to_ids: Dict[str, List[str]] = {}
        for cid, names in per_concept.items():
            for name in names:
                name_to_ids.setdefault(name, []).append(cid)
        if self.dedup:
            # GenBioEL: a shared name stays on the concept with the fewest names
            # (ties: the concept seen first).
            for name, ids in name_to_ids.items():
                if len(ids) > 1:
                    keep = min(ids, key=lambda c: len(per_concept[c]))
                    name_to_ids[name] = [keep]
        # concepts of a shared name: highest prior first (stable: KB order on ties)
        for ids in name_to_ids.values():
            if len(ids) > 1:
                ids.sort(key=lambda c: -self._concepts[c].prior)
        # canonical order: first kept occurrence, so a saved de-duplicated KB
        # reloads with the same name indices (the trie depends on them)
        order: Dict[str, None] = {}
        for cid, names in per_concept.items():
            for name in names:
                if cid in name_to_ids[name]:
                    order.setdefault(name, None)
        self._names: List[str] = list(order)
        self._name_index: Dict[str, int] = {n: i for i, n in enumerate(self._names)}
        self._name_ids: List[Tuple[str, ...]] = [tuple(name_to_ids[n]) for n in self._names]
        self._concept_names: Dict[str, List[str]] = {cid: [] for cid in self._concepts}
        for name, ids in zip(self._names, self._name_ids):
            for cid in ids:
                self._concept_names[cid].append(name)

    # -- queries ------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._concepts)

    def __contains__(self, concept_id: object) -> bool:
        return concept_id in self._concepts

    def __iter__(self) -> Iterator[Concept]:
        return iter(self._concepts.values())

    def __getitem__(self, concept_id: str) -> Concept:
        return self._concepts[concept_id]

    def __repr__(self) -> str:
        return f"KnowledgeBase({self.name!r}, {len(self)} concepts, {self.n_names} names, dedup={self.dedup})"

    @property
    def names(self) -> List[str]:
        """Unique normalized names, the vocabulary the linker generates from."""
        return self._names

    @property
    def concept_ids(self) -> List[str]:
        return list(self._concepts)

    def name_index(self, name: str) -> Optional[int]:
        return self._name_index.get(name)

    def ids_for_name_index(self, index: int) -> Tuple[str, ...]:
        return self._name_ids[index]

    def ids_for_name(self, name: str, normalize: bool = True) -> Tuple[str, ...]:
        """Concept IDs of a name (normalized first unless told otherwise); empty if unknown."""
        key = self.normalize(name) if normalize else name
        idx = self.name_index(key)
        return self.ids_for_name_index(idx) if idx is not None else ()

    def names_of(self, concept_id: str) -> List[str]:
        """Normalized names that map to a concept (after de-duplication)."""
        return self._concept_names.get(concept_id, [])

    def preferred_name(self, concept_id: str) -> str:
        concept = self[concept_id]
        return concept.names[0] if concept.names else concept_id

    @property
    def n_names(self) -> int:
        return len(self._names)

    def checksum(self) -> str:
        """SHA-256 over the concept and name index, stable across runs."""
        digest = hashlib.sha256()
        for name, ids in zip(self._names, self._name_ids):
            digest.update(name.encode("utf8"))
            digest.update(b"\t")
            digest.update("|".join(ids).encode("utf8"))
            digest.update(b"\n")
        return digest.hexdigest()

    def with_extra_names(self, pairs: Iterable[Tuple[str, str]]) -> "KnowledgeBase":
        """A new KB with (concept_id, name) pairs added, e.g. training mentions
        (the BioSyn/GenBioEL dictionary augmentation). Unknown IDs are ignored."""
        extra: Dict[str, List[str]] = {}
        for cid, name in pairs:
            if cid in self:
                extra.setdefault(cid, []).append(name)
        return self._rebuild(Concept(c.id, c.names + extra.get(c.id, []), c.definition, c.types, c.prior) for c in self)

    def with_first_names_only(self) -> "KnowledgeBase":
        """A new KB in which every concept keeps one name: its first normalized
        name after de-duplication (the preferred name unless a shared name
        moved it). GenBioEL's ablation of the N-to-1 trie: one name per
        concept, so training can only target that name."""
        return self._rebuild(Concept(c.id, self.names_of(c.id)[:1], c.definition, c.types, c.prior) for c in self)

    def with_priors(self, counts: Mapping[str, float]) -> "KnowledgeBase":
        """A new KB whose concepts carry ``counts`` (e.g. gold IDs of a training
        split) as priors, so a name shared by several concepts lists the most
        frequent answer first. Unknown IDs are ignored; names are unchanged, so
        a trie built for this KB stays valid."""
        return self._rebuild(Concept(c.id, c.names, c.definition, c.types, float(counts.get(c.id, 0.0))) for c in self)

    def _rebuild(self, concepts: Iterable[Concept]) -> "KnowledgeBase":
        """A KB of the same kind and settings over ``concepts`` (what the ``with_*`` methods return)."""
        return KnowledgeBase(concepts, normalizer=self.normalize, dedup=self.dedup, name=self.name)

    # -- persistence --------------------------------------------------------
    def to_jsonl(self, path: PathLike) -> None:
        """One concept per line, with the raw names whose normalized form this
        KB keeps for it (so a de-duplicated KB reloads as the same index)."""
        with Path(path).open("w", encoding="utf8") as out:
            for concept in self:
                kept = set(self.names_of(concept.id))
                names = [raw for raw in concept.names if self.normalize(raw) in kept]
                record = Concept(concept.id, names, concept.definition, concept.types, concept.prior).to_dict()
                out.write(json.dumps(record, ensure_ascii=False) + "\n")

    @classmethod
    def from_jsonl(cls, path: PathLike, **kwargs) -> "KnowledgeBase":
        kwargs.setdefault("name", Path(path).stem)
        return cls(read_concepts_jsonl(path), **kwargs)

    def to_target_kb_json(self, path: PathLike) -> None:
        """GenBioEL's ``target_kb.json``: ``{concept_id: [normalized names]}``."""
        data = {cid: self.names_of(cid) for cid in self.concept_ids}
        Path(path).write_text(json.dumps(data, ensure_ascii=False), encoding="utf8")

    @classmethod
    def from_target_kb_json(cls, path: PathLike, **kwargs) -> "KnowledgeBase":
        kwargs.setdefault("name", Path(path).stem)
        return cls(read_target_kb_json(path), **kwargs)

    def save(self, path: PathLike) -> None:
        """Write GenBioEL ``target_kb.json`` (``.json``), a registered binary format
        (``.safetensors``: :data:`KB_FILE_FORMATS`) or JSONL (any other suffix), as :meth:`load` reads."""
        if Path(path).suffix in KB_FILE_FORMATS:
            KB_FILE_FORMATS[Path(path).suffix][1](self, Path(path))
        elif Path(path).suffix == ".json":
            self.to_target_kb_json(path)
        else:
            self.to_jsonl(path)

    @classmethod
    def load(cls, path: PathLike, **kwargs) -> "KnowledgeBase":
        """Load JSONL (``.jsonl``, ``.jsonl.gz``), GenBioEL ``target_kb.json``
        (``.json``, ``.json.gz``), with the readers ``build-kb`` uses, or a
        registered binary format (``.safetensors``: a compact KB, memory-mapped);
        a KB without a usable name raises :class:`EmptyKBError` naming the file."""
        path = Path(path)
        if not path.exists():
            raise FileNotFoundError(f"KB file not found: {path}")
        if path.suffix in KB_FILE_FORMATS:
            return KB_FILE_FORMATS[path.suffix][0](path, **kwargs)
        target_kb = path.name.endswith((".json", ".json.gz"))
        try:
            return cls.from_target_kb_json(path, **kwargs) if target_kb else cls.from_jsonl(path, **kwargs)
        except EmptyKBError as err:
            raise EmptyKBError(f"{path}: {err}") from None


#: what a concept ID may not hold (see the module docstring)
_NOT_IN_IDS = re.compile(r"[\s\x00-\x1f\x7f-\x9f|+,;]")


def id_problem(cid: str) -> Optional[str]:
    """Why ``cid`` cannot be a concept ID (None: it can): a character no output format can write back."""
    bad = _NOT_IN_IDS.search(cid)
    if bad is None:
        return None
    return (
        f"concept ID {cid[:60]!r} holds {bad.group()!r}: IDs may not hold whitespace, control characters "
        f"or the ID separators | + , ; (PubTator and BioC output could not write the ID back)"
    )


def clean_concept(concept: Concept, where: str) -> Tuple[str, List[str]]:
    """The concept's ID (stripped, checked by :func:`id_problem`) and its names (stripped, each
    once); a bad ID raises :class:`KBFormatError` at ``where``."""
    cid = concept.id.strip()
    if not cid:
        raise KBFormatError(f"{where}: concept with an empty ID (names {concept.names[:3]})")
    problem = id_problem(cid)
    if problem:
        raise KBFormatError(f"{where}: {problem}")
    return cid, list(dict.fromkeys(name.strip() for name in concept.names))


def read_concepts_jsonl(path: PathLike) -> Iterator[Concept]:
    """Stream concepts from a JSONL KB file (``.gz`` too), with errors that name file and line;
    control characters in names and definitions are dropped and counted (:class:`ControlCharacters`)."""
    controls = ControlCharacters(path)
    for lineno, record in iter_json_lines(path, KBFormatError):
        yield controls.concept(concept_from_record(record, f"{path}:{lineno}"), lineno)
    controls.report()


def _strings(value: Any) -> bool:
    return isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value)


def concept_from_record(record: object, where: str) -> Concept:
    """A concept from a JSON record (the project's keys, or scispacy's
    ``concept_id``/``canonical_name``/``aliases``); a missing ID or a field of
    the wrong type raises :class:`KBFormatError` at ``where``."""
    if not isinstance(record, dict):
        raise KBFormatError(f"{where}: expected a JSON object, got {type(record).__name__}")
    cid = record.get("id", record.get("concept_id"))
    if cid is None or (isinstance(cid, str) and not cid.strip()):
        raise KBFormatError(f"{where}: record has no 'id'")
    if isinstance(cid, bool) or not isinstance(cid, (str, int)):
        raise KBFormatError(f"{where}: 'id' must be a string, got {type(cid).__name__} {cid!r}")
    if id_problem(str(cid).strip()):
        raise KBFormatError(f"{where}: {id_problem(str(cid).strip())}")
    names: Sequence = record.get("names", record.get("aliases", []))
    if isinstance(names, str):
        names = [names]
    canonical = record.get("canonical_name")
    if canonical:
        names = [canonical, *names] if isinstance(names, (list, tuple)) else names
    if not _strings(names):
        raise KBFormatError(f"{where}: 'names' must be a list of strings")
    types = record.get("types", [])
    types = [types] if isinstance(types, str) else types
    if types is None:
        types = []
    if not _strings(types):
        raise KBFormatError(f"{where}: 'types' must be a list of strings, got {json.dumps(types)[:60]}")
    definition = record.get("definition")
    if definition is not None and not isinstance(definition, str):
        raise KBFormatError(f"{where}: 'definition' must be a string, got {type(definition).__name__}")
    prior = record.get("prior", 0.0)
    if not isinstance(prior, (int, float)) or isinstance(prior, bool) or not math.isfinite(prior):
        raise KBFormatError(f"{where}: 'prior' must be a number")
    return Concept(str(cid).strip(), list(names), definition or None, list(types), float(prior))


# -- GenBioEL's target_kb.json --------------------------------------------------------------------------------
def _read_json_file(path: PathLike) -> Tuple[str, Any]:
    text = read_text(path, KBFormatError)
    return text, parse_json(text, path, KBFormatError)


def load_target_kb_json(path: PathLike) -> Any:
    """The parsed JSON of a GenBioEL ``target_kb.json`` (``.gz`` too); bad JSON names the line."""
    return _read_json_file(path)[1]


def _key_line(text: str, key: str, nth: int = 1) -> int:
    """The line of the ``nth`` ``"key":`` in a JSON text (1 when it cannot be found)."""
    found = re.finditer(re.escape(json.dumps(key, ensure_ascii=False)) + r"\s*:", text)
    match = next((m for i, m in enumerate(found, start=1) if i == nth), None)
    if match is None:
        return 1
    sep = line_separator(text[:LINE_PROBE].encode("utf8", "surrogatepass")).decode()
    return text.count(sep, 0, match.start()) + 1


def read_target_kb_json(path: PathLike, clean_id: Callable[[str], str] = str) -> Iterator[Concept]:
    """Concepts of a GenBioEL ``target_kb.json`` (``{id: [names]}``), IDs passed
    through ``clean_id``; blank names are left out. A concept listed with no names
    stays (as :meth:`KnowledgeBase.to_target_kb_json` writes a de-duplicated KB). An ID
    listed twice is refused (JSON would keep the second list of names only)."""
    text, data = _read_json_file(path)
    _no_duplicate_ids(text, path)
    if not isinstance(data, dict):
        raise KBFormatError.at(path, 1, f"expected a JSON object {{id: [names]}}, got {type(data).__name__}")
    controls = ControlCharacters(path)
    for raw_id, names in data.items():
        if isinstance(names, str):
            names = [names]
        if not _strings(names):
            raise KBFormatError.at(
                path, _key_line(text, raw_id), f"concept {raw_id!r}: names must be a list of strings"
            )
        cid = clean_id(raw_id)
        if not cid.strip():
            raise KBFormatError.at(path, _key_line(text, raw_id), f"empty concept ID {raw_id!r}")
        if id_problem(cid.strip()):
            raise KBFormatError.at(path, _key_line(text, raw_id), str(id_problem(cid.strip())))
        names = [controls.clean(n, f"concept {raw_id!r}") for n in names]
        kept = [n for n in names if n.strip()]
        yield Concept(cid, kept or list(names))
    controls.report()


class _RepeatedKey(Exception):
    pass


def _unique_keys(pairs: List[Tuple[str, Any]]) -> Dict[str, Any]:
    result: Dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise _RepeatedKey(key)
        result[key] = value
    return result


def _no_duplicate_ids(text: str, path: PathLike) -> None:
    """Raise :class:`KBFormatError` at the second ``"id":`` of an ID the (already parsed) JSON object lists twice."""
    try:
        json.loads(text, object_pairs_hook=_unique_keys)
    except _RepeatedKey as repeated:
        key = repeated.args[0]
        raise KBFormatError.at(
            path,
            _key_line(text, key, nth=2),
            f"concept {key!r} is listed twice (JSON keeps the second list of names only: merge them)",
        ) from None
