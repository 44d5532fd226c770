"""Readers for the UMLS Metathesaurus and RxNorm (RRF files), as
:class:`~spacy_genbioel.kb.base.Concept` streams.

A source is ``MRCONSO.RRF`` (``RXNCONSO.RRF``), ``.gz`` too, or the folder that
holds it (a release's ``META/`` or RxNorm's ``rrf/``): from a folder, the
semantic types (``MRSTY.RRF``, ``RXNSTY.RRF``) and definitions (``MRDEF.RRF``)
beside it are read as well. Errors are
:class:`~spacy_genbioel.kb.base.KBFormatError` as ``"file:line: reason"``.

What a concept gets, as scispacy's UMLS KB has it:

* ``names``: the atoms that pass the filters, the preferred one first (UMLS:
  ``TS=P``, ``STT=PF``, ``ISPREF=Y``, scispacy's rule; RxNorm, whose RRF leaves
  those columns empty: an RXNORM atom of a normal-form term type, not a
  synonym ``SY``/``TMSY``/``PSN``/``ET``);
* ``types``: the semantic type IDs (TUIs, ``T047``) from MRSTY, as in
  scispacy's ``cui_to_entity[cui].types``;
* ``definition``: one MRDEF definition, from the sources scispacy prefers
  (NCI, MSH, GO...) when there is one, else the first.

Filters (:class:`RRFFilters`): language (LAT), source vocabulary (SAB: the
licence levels a user may redistribute), term type (TTY), semantic type (a TUI
or its name in MRSTY, ``Disease or Syndrome``) and the SUPPRESS flag (``O``,
``E``, ``Y`` are left out unless asked for). Definitions follow the SAB filter
too, so a KB limited to some sources holds nothing from the others.

Why not scispacy's ``umls_utils``: it reads column names from ``MRFILES.RRF``
(absent from RxNorm, and from extracts made for tests), asserts on a bad row
(an ``AssertionError`` without file or line), fills one dict of every concept
before anything can be written (UMLS: about 3 million concepts), reads no
``.gz``, and filters by one source and one language only; its preferred-name
rule and preferred definition sources are the ones used here.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Set, Tuple

from spacy_genbioel.kb.base import Concept, KBFormatError, kb_lines
from spacy_genbioel.util import PathLike

logger = logging.getLogger(__name__)

__all__ = ["DEF_SOURCES_PREFERRED", "TUI", "RRFFilters", "read_rxnorm", "read_umls", "resolve_rrf"]

_SUPPRESSED = {"O", "E", "Y"}
#: scispacy's ``umls_utils.DEF_SOURCES_PREFERRED``: a definition from these wins
DEF_SOURCES_PREFERRED = frozenset({"NCI_BRIDG", "NCI_NCI-GLOSS", "NCI", "GO", "MSH", "NCI_FDA"})
#: RxNorm term types that are synonyms or display forms, never a concept's preferred name
_RXNORM_SYNONYM_TTYS = frozenset({"SY", "TMSY", "PSN", "ET"})
#: a semantic type ID (``T047``)
TUI = re.compile(r"^T\d{3}$")


@dataclass(frozen=True)
class RRFFilters:
    """Which MRCONSO/RXNCONSO rows become names. ``None`` keeps every value of a column."""

    #: LAT values (``ENG``)
    languages: Optional[Tuple[str, ...]] = ("ENG",)
    #: SAB values (``MSH``, ``SNOMEDCT_US``, ``RXNORM``...)
    sabs: Optional[Tuple[str, ...]] = None
    #: TUIs (``T047``) or semantic type names from MRSTY; a concept needs one of them
    semantic_types: Optional[Tuple[str, ...]] = None
    #: TTY values (``PT``, ``SY``; RxNorm: ``IN``, ``SCD``, ``BN``...)
    term_types: Optional[Tuple[str, ...]] = None
    #: keep atoms flagged obsolete or suppressed (SUPPRESS ``O``, ``E``, ``Y``)
    include_suppressed: bool = False

    def keeps(self, lat: str, sab: str, tty: str, suppress: str) -> bool:
        """Whether a row with these columns passes."""
        return (
            (self.languages is None or lat in self.languages)
            and (self.sabs is None or sab in self.sabs)
            and (self.term_types is None or tty in self.term_types)
            and (self.include_suppressed or suppress not in _SUPPRESSED)
        )


def _tuple(values: Optional[Sequence[str]]) -> Optional[Tuple[str, ...]]:
    return tuple(values) if values else None


def resolve_rrf(source: PathLike, conso: str, extras: Sequence[str]) -> Tuple[Path, List[Optional[Path]]]:
    """``source`` as (the concept file, each of ``extras`` beside it or None): a file is itself
    (extras None); a folder gives its ``conso`` file (``MRCONSO.RRF`` or ``.gz``) and the extras
    found there."""
    path = Path(source)
    if not path.is_dir():
        return path, [None] * len(extras)

    def find(name: str) -> Optional[Path]:
        return next((path / n for n in (name, name + ".gz") if (path / n).is_file()), None)

    found = find(conso)
    if found is None:
        raise FileNotFoundError(f"{path}: no {conso} (or {conso}.gz) in this folder")
    return found, [find(name) for name in extras]


def read_umls(
    mrconso: PathLike,
    mrdef: Optional[PathLike] = None,
    mrsty: Optional[PathLike] = None,
    languages: Optional[Sequence[str]] = ("ENG",),
    sabs: Optional[Sequence[str]] = None,
    semantic_types: Optional[Sequence[str]] = None,
    include_suppressed: bool = False,
    term_types: Optional[Sequence[str]] = None,
) -> Iterator[Concept]:
    """UMLS: names from ``MRCONSO``, definitions from ``MRDEF``, semantic types from ``MRSTY``
    (``mrconso`` may be the ``META`` folder: its MRDEF and MRSTY are read unless given).

    Filters (see :class:`RRFFilters`): ``languages`` (LAT, ``None``: all),
    ``sabs`` (source vocabularies), ``term_types`` (TTY), ``semantic_types`` (TUIs or
    names, needs MRSTY), ``include_suppressed``. MRCONSO is streamed and grouped by
    consecutive CUI (a release is sorted by CUI; an unsorted file still works
    because the KB merges repeated IDs).
    """
    conso, (found_def, found_sty) = resolve_rrf(mrconso, "MRCONSO.RRF", ("MRDEF.RRF", "MRSTY.RRF"))
    filters = RRFFilters(
        _tuple(languages), _tuple(sabs), _tuple(semantic_types), _tuple(term_types), include_suppressed
    )
    yield from _read_rrf(conso, mrdef or found_def, mrsty or found_sty, filters, _umls_preferred)


def read_rxnorm(
    rxnconso: PathLike,
    rxnsty: Optional[PathLike] = None,
    sabs: Optional[Sequence[str]] = ("RXNORM",),
    term_types: Optional[Sequence[str]] = None,
    semantic_types: Optional[Sequence[str]] = None,
    include_suppressed: bool = False,
) -> Iterator[Concept]:
    """RxNorm: names from ``RXNCONSO.RRF`` (the layout of MRCONSO, keyed by RXCUI), semantic
    types from ``RXNSTY.RRF`` (``rxnconso`` may be RxNorm's ``rrf`` folder). By default only the
    ``RXNORM`` source's own atoms (the full release also carries licensed sources); every
    language, as RxNorm is English."""
    conso, (found_sty,) = resolve_rrf(rxnconso, "RXNCONSO.RRF", ("RXNSTY.RRF",))
    filters = RRFFilters(None, _tuple(sabs), _tuple(semantic_types), _tuple(term_types), include_suppressed)
    yield from _read_rrf(conso, None, rxnsty or found_sty, filters, _rxnorm_preferred)


def _umls_preferred(row: List[str]) -> bool:
    return row[2] == "P" and row[4] == "PF" and row[6] == "Y"


def _rxnorm_preferred(row: List[str]) -> bool:
    return row[11] == "RXNORM" and row[12] not in _RXNORM_SYNONYM_TTYS


def _read_rrf(
    conso: Path,
    defs_path: Optional[PathLike],
    sty_path: Optional[PathLike],
    filters: RRFFilters,
    preferred: Callable[[List[str]], bool],
) -> Iterator[Concept]:
    if filters.semantic_types and sty_path is None:
        raise ValueError(
            f"{conso}: semantic types {', '.join(filters.semantic_types)} need MRSTY.RRF "
            "(RXNSTY.RRF): give it, or the folder that holds both"
        )
    tuis, sty_names = _read_mrsty(sty_path) if sty_path is not None else ({}, {})
    wanted = _wanted_tuis(filters.semantic_types, sty_names, sty_path) if filters.semantic_types else None
    defs = _read_mrdef(defs_path, filters) if defs_path is not None else {}
    counts = {"rows": 0, "kept": 0, "concepts": 0, "by_type": 0}
    current: Optional[str] = None
    atoms: List[Tuple[bool, str]] = []

    def flush() -> Optional[Concept]:
        if current is None or not atoms:
            return None
        if wanted is not None and not wanted.intersection(tuis.get(current, ())):
            counts["by_type"] += 1
            return None
        counts["concepts"] += 1
        # stable sort: preferred atoms first, file order otherwise
        names = [name for _, name in sorted(atoms, key=lambda a: not a[0])]
        return Concept(current, list(dict.fromkeys(names)), defs.get(current), list(tuis.get(current, ())))

    for lineno, line in kb_lines(conso):
        if not line:
            continue
        row = line.split("|")
        if len(row) < 18:
            raise KBFormatError.at(
                conso, lineno, f"{conso.name} row has {len(row)} fields, expected 18 (CUI|LAT|TS|...|SUPPRESS|CVF)"
            )
        if len(row) > 19 or (len(row) == 19 and row[18].strip()):
            raise KBFormatError.at(
                conso,
                lineno,
                f"{conso.name} row has {len(row) - (row[-1] == '')} fields, expected 18: "
                "a '|' inside a field (the name?) shifts the columns",
            )
        cui = row[0].strip()
        if not cui:
            raise KBFormatError.at(conso, lineno, f"{conso.name} row has no concept ID")
        if not row[14].strip():
            raise KBFormatError.at(conso, lineno, f"{conso.name} row of {cui} has an empty name (STR)")
        if cui != current:
            concept = flush()
            if concept is not None:
                yield concept
            current, atoms = cui, []
        counts["rows"] += 1
        name = row[14].strip()
        if name and filters.keeps(row[1], row[11], row[12], row[16]):
            counts["kept"] += 1
            atoms.append((preferred(row), name))
    concept = flush()
    if concept is not None:
        yield concept
    logger.info(
        "%s: %d of %d rows kept by %s; %d concepts (%d left out by semantic type)",
        conso,
        counts["kept"],
        counts["rows"],
        filters,
        counts["concepts"],
        counts["by_type"],
    )


def _read_mrsty(path: PathLike) -> Tuple[Dict[str, List[str]], Dict[str, str]]:
    """(TUIs per concept ID, TUI per lower-cased semantic type name) from MRSTY/RXNSTY."""
    tuis: Dict[str, List[str]] = {}
    names: Dict[str, str] = {}
    for lineno, line in kb_lines(path):
        if not line:
            continue
        row = line.split("|")
        if len(row) < 4 or not row[0] or not row[1]:
            raise KBFormatError.at(path, lineno, "semantic type row needs CUI|TUI|STN|STY|...")
        entry = tuis.setdefault(row[0], [])
        if row[1] not in entry:
            entry.append(row[1])
        names.setdefault(row[3].strip().lower(), row[1])
    return tuis, names


def _wanted_tuis(wanted: Sequence[str], sty_names: Dict[str, str], path: PathLike) -> Set[str]:
    """TUIs for a filter of TUIs and semantic type names; an unknown name is an error naming it."""
    tuis: Set[str] = set()
    for value in wanted:
        if TUI.match(value.strip()):
            tuis.add(value.strip())
        elif value.strip().lower() in sty_names:
            tuis.add(sty_names[value.strip().lower()])
        else:
            raise ValueError(
                f"{path}: semantic type {value!r} is neither a TUI (T047) nor a semantic type name in this file"
            )
    return tuis


#: MRDEF's fields: CUI|AUI|ATUI|SATUI|SAB|DEF|SUPPRESS|CVF
_MRDEF_FIELDS = 8
#: MRDEF's SUPPRESS values (empty in some subsets)
_SUPPRESS_FLAGS = ("", "N", "O", "E", "Y")


def _read_mrdef(path: PathLike, filters: RRFFilters) -> Dict[str, str]:
    """One definition per concept: the first from a preferred source, else the first."""
    defs: Dict[str, str] = {}
    from_preferred: Set[str] = set()
    joined = 0
    for lineno, line in kb_lines(path):
        if not line:
            continue
        row = line.split("|")
        if len(row) < 7 or not row[0]:
            raise KBFormatError.at(path, lineno, "MRDEF row needs CUI|AUI|ATUI|SATUI|SAB|DEF|SUPPRESS|...")
        fields = row[:-1] if row[-1] == "" else row  # a row ends in '|'
        if len(fields) > _MRDEF_FIELDS:  # a '|' inside DEF: the middle fields are the definition
            cvf = fields[-1].strip()
            if fields[-2] not in _SUPPRESS_FLAGS or (cvf and not cvf.isdigit()):
                raise KBFormatError.at(
                    path,
                    lineno,
                    f"MRDEF row has {len(fields)} fields, expected {_MRDEF_FIELDS} (CUI|AUI|ATUI|SATUI|SAB|DEF|"
                    "SUPPRESS|CVF|), and its last two are not SUPPRESS and CVF: cannot tell where DEF ends",
                )
            row = [*fields[:5], "|".join(fields[5:-2]), *fields[-2:]]
            joined += 1
        cui, sab, definition, suppress = row[0], row[4], row[5].strip(), row[6]
        if not definition or cui in from_preferred:
            continue
        if (filters.sabs is not None and sab not in filters.sabs) or (
            not filters.include_suppressed and suppress in _SUPPRESSED
        ):
            continue
        if sab in DEF_SOURCES_PREFERRED:
            defs[cui] = definition
            from_preferred.add(cui)
        else:
            defs.setdefault(cui, definition)
    if joined:
        logger.info("%s: %d definitions hold a '|' (their middle fields were joined)", path, joined)
    return defs
