"""Readers for the UMLS Metathesaurus (RRF files) and OBO ontologies, as
:class:`~spacy_genbioel.kb.base.Concept` streams.

Like the other readers (:mod:`~spacy_genbioel.kb.sources`) they are generators,
read ``.gz`` transparently and raise :class:`~spacy_genbioel.kb.base.KBFormatError`
as ``"file:line: reason"``. IDs are kept as written (CUIs, ``DOID:...``);
``types`` hold semantic type TUIs for UMLS and the namespace for OBO.
"""
from __future__ import annotations

import re
from typing import Any, Dict, Iterator, List, Optional, Sequence, Set, Tuple

from spacy_genbioel.kb.base import Concept, KBFormatError
from spacy_genbioel.util import PathLike, iter_lines

__all__ = ["read_obo", "read_umls"]


# -- UMLS --------------------------------------------------------------------------
_SUPPRESSED = {"O", "E", "Y"}


def read_umls(
    mrconso: PathLike,
    mrdef: Optional[PathLike] = None,
    mrsty: Optional[PathLike] = None,
    languages: Optional[Sequence[str]] = ("ENG",),
    sources: Optional[Sequence[str]] = None,
    semantic_types: Optional[Sequence[str]] = None,
    include_suppressed: bool = False,
) -> Iterator[Concept]:
    """UMLS RRF files: ``MRCONSO`` names, optional ``MRDEF`` definitions and ``MRSTY`` types.

    Filters: ``languages`` (LAT), ``sources`` (SAB), ``semantic_types`` (TUIs,
    needs ``mrsty``), and the SUPPRESS flag (``O``, ``E``, ``Y`` are dropped
    unless ``include_suppressed``). The UMLS preferred name (TS=P, STT=PF,
    ISPREF=Y) comes first. Types are the concept's TUIs. MRCONSO is streamed
    and grouped by consecutive CUI (the distribution is sorted by CUI; an
    unsorted file still works because the KB merges repeated IDs).
    """
    langs = set(languages) if languages else None
    sabs = set(sources) if sources else None
    wanted_tuis = set(semantic_types) if semantic_types else None
    if wanted_tuis and mrsty is None:
        raise ValueError("semantic_types needs mrsty (MRSTY.RRF)")
    tuis = _read_mrsty(mrsty) if mrsty is not None else {}
    defs = _read_mrdef(mrdef, sabs, include_suppressed) if mrdef is not None else {}

    current: Optional[str] = None
    atoms: List[Tuple[bool, str]] = []

    def flush() -> Optional[Concept]:
        if current is None or not atoms:
            return None
        if wanted_tuis is not None and not wanted_tuis.intersection(tuis.get(current, ())):
            return None
        # stable sort: preferred atom first, file order otherwise
        names = [name for _, name in sorted(atoms, key=lambda a: not a[0])]
        return Concept(current, list(dict.fromkeys(names)), defs.get(current), list(tuis.get(current, ())))

    for lineno, line in iter_lines(mrconso, KBFormatError):
        if not line:
            continue
        row = line.split("|")
        if len(row) < 18:
            raise KBFormatError.at(mrconso, lineno, f"MRCONSO row has {len(row)} fields, expected 18")
        cui = row[0].strip()
        if not cui:
            raise KBFormatError.at(mrconso, lineno, "MRCONSO row has no CUI")
        if cui != current:
            concept = flush()
            if concept is not None:
                yield concept
            current, atoms = cui, []
        lat, ts, stt, ispref, sab, name, suppress = row[1], row[2], row[4], row[6], row[11], row[14], row[16]
        if langs is not None and lat not in langs:
            continue
        if sabs is not None and sab not in sabs:
            continue
        if not include_suppressed and suppress in _SUPPRESSED:
            continue
        if name.strip():
            atoms.append((ts == "P" and stt == "PF" and ispref == "Y", name.strip()))
    concept = flush()
    if concept is not None:
        yield concept


def _read_mrsty(path: PathLike) -> Dict[str, List[str]]:
    tuis: Dict[str, List[str]] = {}
    for lineno, line in iter_lines(path, KBFormatError):
        if not line:
            continue
        row = line.split("|")
        if len(row) < 4 or not row[0] or not row[1]:
            raise KBFormatError.at(path, lineno, "MRSTY row needs CUI|TUI|STN|STY|...")
        entry = tuis.setdefault(row[0], [])
        if row[1] not in entry:
            entry.append(row[1])
    return tuis


def _read_mrdef(path: PathLike, sabs: Optional[Set[str]], include_suppressed: bool) -> Dict[str, str]:
    defs: Dict[str, str] = {}
    for lineno, line in iter_lines(path, KBFormatError):
        if not line:
            continue
        row = line.split("|")
        if len(row) < 7 or not row[0]:
            raise KBFormatError.at(path, lineno, "MRDEF row needs CUI|AUI|ATUI|SATUI|SAB|DEF|SUPPRESS|...")
        cui, sab, definition, suppress = row[0], row[4], row[5], row[6]
        if sabs is not None and sab not in sabs:
            continue
        if not include_suppressed and suppress in _SUPPRESSED:
            continue
        if definition.strip() and cui not in defs:
            defs[cui] = definition.strip()
    return defs


# -- OBO -----------------------------------------------------------------------------
_OBO_QUOTED = re.compile(r'^"((?:[^"\\]|\\.)*)"\s*(.*)$')


def _obo_unquote(value: str, path: PathLike, lineno: int) -> Tuple[str, str]:
    match = _OBO_QUOTED.match(value.strip())
    if not match:
        raise KBFormatError.at(path, lineno, f"expected a quoted string, got {value.strip()[:60]!r}")
    text = re.sub(r"\\(.)", r"\1", match.group(1))
    return text, match.group(2)


def read_obo(
    path: PathLike,
    prefix: Optional[str] = None,
    synonym_scopes: Sequence[str] = ("EXACT", "RELATED"),
) -> Iterator[Concept]:
    """OBO ``[Term]`` stanzas: ``id``, ``name``, ``synonym "..." SCOPE``, ``def "..."``.

    Obsolete terms are skipped, as are other stanzas (``[Typedef]``). With
    ``prefix`` (e.g. ``"DOID"``), only IDs with that prefix are kept (ontologies
    import terms from others). BROAD/NARROW synonyms are not synonyms for
    linking, so only EXACT and RELATED are kept by default. Types: the
    ``namespace``.
    """
    want = None if prefix is None else prefix.rstrip(":") + ":"
    scopes = {s.upper() for s in synonym_scopes}
    stanza: Optional[Dict[str, Any]] = None

    def finish(term: Optional[Dict[str, Any]]) -> Optional[Concept]:
        if term is None:
            return None
        if not term.get("id"):
            raise KBFormatError.at(path, term["line"], "[Term] without an id")
        cid = term["id"]
        if term.get("obsolete") or (want is not None and not cid.startswith(want)):
            return None
        names = ([term["name"]] if term.get("name") else []) + term["synonyms"]
        if not names:
            raise KBFormatError.at(path, term["line"], f"term {cid} has no name")
        return Concept(cid, list(dict.fromkeys(names)), term.get("def"), term["types"])

    for lineno, line in iter_lines(path, KBFormatError):
        stripped = line.strip()
        if not stripped or stripped.startswith("!"):
            continue
        if stripped.startswith("["):
            concept = finish(stanza)
            if concept is not None:
                yield concept
            stanza = (
                {"line": lineno, "synonyms": [], "types": []} if stripped == "[Term]" else None
            )
            continue
        if stanza is None:
            continue  # header or a non-Term stanza
        if ":" not in stripped:
            raise KBFormatError.at(path, lineno, f"expected 'tag: value', got {stripped[:60]!r}")
        tag, value = stripped.split(":", 1)
        value = value.strip()
        if tag == "id":
            stanza["id"] = value.split(" !", 1)[0].strip()
        elif tag == "name":
            stanza["name"] = value
        elif tag == "synonym":
            text, rest = _obo_unquote(value, path, lineno)
            scope = rest.split()[0].upper() if rest.split() else "RELATED"
            if scope in scopes and text.strip():
                stanza["synonyms"].append(text.strip())
        elif tag == "def":
            stanza["def"] = _obo_unquote(value, path, lineno)[0] or None
        elif tag == "is_obsolete":
            stanza["obsolete"] = value.lower() == "true"
        elif tag == "namespace":
            stanza["types"].append(value)
    concept = finish(stanza)
    if concept is not None:
        yield concept
