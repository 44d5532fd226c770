"""PubTator: the document record every corpus reader yields, and the PubTator
format itself (read, write), plus gold mentions with context.

Documents are :class:`PubTatorDocument` (title, abstract, gold annotations);
:func:`mentions_from_pubtator` and :func:`document_mentions` flatten them into
:class:`~spacy_genbioel.ty.Mention` records with context. The other formats
(:mod:`~spacy_genbioel.corpus.bioc`, :mod:`~spacy_genbioel.corpus.jsonl`) read
into the same records.

Decisions:

* IDs are cleaned with :func:`~spacy_genbioel.kb.crosswalk.normalize_id`;
  composite fields (``D001|D002``, ``D014527+D012492``) give several IDs and
  ``composite=True``; ``-1`` parts are dropped, and a mention with no ID left
  is kept with ``ids=()`` and ``nil=True`` so that evaluation can skip it.
* Relation lines (``PMID<TAB>CID<TAB>chem<TAB>disease``: 4 or 5 columns, a
  word in the second) are kept apart; any other line is a mention line, whose
  offsets must be integers.
* Offsets are checked against ``title + " " + abstract``; differences in
  whitespace only are tolerated (NCBI train has a mention text with trailing
  spaces), anything else raises :class:`CorpusFormatError` naming file, line
  and PMID.
* A PMID seen twice (NCBI train has 8528200 twice, identical) is kept twice,
  with a warning: the published counts (593 docs, 5,145 mentions) include both.
  A second abstract line in one document is an error (it would replace the first).
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterable, Iterator, List, Mapping, Optional, Tuple

from spacy_genbioel.kb.crosswalk import apply_crosswalk, split_ids
from spacy_genbioel.ty import Mention
from spacy_genbioel.util import PathLike, iter_lines

logger = logging.getLogger(__name__)

__all__ = [
    "CorpusFormatError",
    "PubTatorAnnotation",
    "PubTatorDocument",
    "check_mention_offsets",
    "document_mentions",
    "mentions_from_pubtator",
    "pubtator_text_line",
    "read_pubtator",
    "write_pubtator",
]


class CorpusFormatError(ValueError):
    """A corpus file could not be read; the message names file, line and document."""


@dataclass
class PubTatorAnnotation:
    """One gold mention. ``ids`` are cleaned concept IDs (empty when ``nil``)."""

    start: int
    end: int
    text: str
    type: str
    ids: Tuple[str, ...] = ()
    composite: bool = False
    nil: bool = False
    # the 7th PubTator column: the text of each part of a composite mention
    parts: Tuple[str, ...] = ()
    # the ID column as written, so that a file round-trips byte for byte
    raw_ids: str = field(default="", compare=False, repr=False)


@dataclass
class PubTatorDocument:
    """A title + abstract document; annotation offsets index into :attr:`text`."""

    pmid: str
    title: str
    abstract: str = ""
    annotations: List[PubTatorAnnotation] = field(default_factory=list)
    # relation lines (``PMID<TAB>CID<TAB>chem<TAB>disease``) as their fields after the PMID
    relations: List[Tuple[str, ...]] = field(default_factory=list)
    # (title, abstract, text) of the last :attr:`text`: readers check every mention's offsets against it,
    # and joining a long document once per mention made reading quadratic
    _joined: Tuple[str, str, str] = field(default=("", "", ""), init=False, repr=False, compare=False)

    @property
    def text(self) -> str:
        title, abstract, text = self._joined
        if title is not self.title or abstract is not self.abstract:
            text = f"{self.title} {self.abstract}" if self.abstract else self.title
            self._joined = (self.title, self.abstract, text)
        return text


def _same_text(a: str, b: str) -> bool:
    return a == b or " ".join(a.split()) == " ".join(b.split())


def check_mention_offsets(doc: PubTatorDocument, ann: PubTatorAnnotation, where: str) -> None:
    """Raise :class:`CorpusFormatError` (naming ``where`` and the PMID) unless the
    annotation's offsets lie in the text and cover its mention text (up to whitespace)."""
    text = doc.text
    if not 0 <= ann.start < ann.end <= len(text):
        raise CorpusFormatError(
            f"{where}: PMID {doc.pmid}: offsets {ann.start}-{ann.end} outside the text (length {len(text)})"
        )
    span = text[ann.start : ann.end]
    if not _same_text(span, ann.text):
        raise CorpusFormatError(
            f"{where}: PMID {doc.pmid}: mention {ann.text!r} does not match the text at "
            f"{ann.start}-{ann.end} ({span!r})"
        )
    if span != ann.text:
        logger.debug(
            "%s: PMID %s: mention %r differs from the text %r in whitespace only", where, doc.pmid, ann.text, span
        )


_INT = re.compile(r"^\s*[-+]?[0-9]+\s*$")
# a relation type: CID (BC5CDR), Association, Positive_Correlation (BioRED)...
_RELATION_TYPE = re.compile(r"^[A-Za-z][A-Za-z_-]*$")


def _is_relation(fields: List[str]) -> bool:
    """A relation line is ``PMID<TAB>type<TAB>ID<TAB>ID[<TAB>extra]``: a word where a
    mention line has its start offset, and 4 or 5 columns. Anything else is read
    as a mention line, whose offsets must then be integers (``154.0`` or ``abc``
    in a 6-column line is an error, not a relation)."""
    return (
        len(fields) in (4, 5) and bool(_RELATION_TYPE.match(fields[1].strip())) and all(f.strip() for f in fields[2:4])
    )


# -- PubTator -------------------------------------------------------------------
_TEXT_LINE = re.compile(r"^([^|\t]+)\|([ta])\|(.*)$")


def pubtator_text_line(line: str) -> Optional[Tuple[str, str, str]]:
    """``(pmid, "t" or "a", text)`` of a title or abstract line (``PMID|t|text``), None for
    any other line: the one rule of the format, shared with the annotation input reader."""
    match = _TEXT_LINE.match(line)
    return (match.group(1).strip(), match.group(2), match.group(3)) if match else None


def read_pubtator(
    path: PathLike, crosswalk: Optional[Mapping[str, str]] = None, check_offsets: bool = True
) -> Iterator[PubTatorDocument]:
    """Stream documents from a PubTator file (``.gz`` too).

    ``crosswalk`` maps old IDs to new ones after clean-up (e.g. the BC5CDR
    legacy chemical IDs). Relation lines are kept in ``relations``, not as
    mentions. See the module docstring for IDs, offsets and duplicate PMIDs.
    """
    doc: Optional[PubTatorDocument] = None
    seen: Dict[str, int] = {}
    start_line = 0
    abstract_line = 0  # the line of the current document's abstract (0: none yet)

    def finish(current: Optional[PubTatorDocument]) -> Optional[PubTatorDocument]:
        if current is None:
            return None
        if current.pmid in seen:
            logger.warning(
                "%s:%d: PMID %s seen before (line %d); kept both", path, start_line, current.pmid, seen[current.pmid]
            )
        else:
            seen[current.pmid] = start_line
        return current

    for lineno, line in iter_lines(path, CorpusFormatError):
        where = f"{path}:{lineno}"
        if not line.strip():
            done = finish(doc)
            if done is not None:
                yield done
            doc = None
            continue
        text_line = pubtator_text_line(line)
        if text_line:
            pmid, kind, text = text_line
            if kind == "t":
                done = finish(doc)
                if done is not None:
                    yield done
                doc = PubTatorDocument(pmid, text)
                start_line, abstract_line = lineno, 0
            else:
                if doc is None or doc.pmid != pmid:
                    raise CorpusFormatError(f"{where}: PMID {pmid}: abstract line without its title line")
                if doc.annotations:
                    raise CorpusFormatError(f"{where}: PMID {pmid}: abstract line after mention lines")
                if abstract_line:
                    raise CorpusFormatError(
                        f"{where}: PMID {pmid}: a second abstract line (the first is line {abstract_line})"
                    )
                doc.abstract, abstract_line = text, lineno
            continue
        fields = line.split("\t")
        pmid = fields[0].strip()
        if doc is None:
            raise CorpusFormatError(f"{where}: PMID {pmid}: mention line before any title line")
        if pmid != doc.pmid:
            raise CorpusFormatError(f"{where}: PMID {pmid}: line inside document {doc.pmid}")
        if _is_relation(fields):
            doc.relations.append(tuple(fields[1:]))  # e.g. PMID CID chem disease
            continue
        if len(fields) < 5:
            raise CorpusFormatError(
                f"{where}: PMID {pmid}: expected PMID<TAB>start<TAB>end<TAB>text<TAB>type[<TAB>ids], "
                f"got {len(fields)} column(s)"
            )
        try:
            if not (_INT.match(fields[1]) and _INT.match(fields[2])):
                raise ValueError
            start, end = int(fields[1]), int(fields[2])
        except ValueError:
            raise CorpusFormatError(
                f"{where}: PMID {pmid}: offsets {fields[1]!r}-{fields[2]!r} are not integers"
            ) from None
        raw_ids = fields[5] if len(fields) > 5 else ""
        ids, composite, nil = split_ids(raw_ids)
        if crosswalk:
            ids = apply_crosswalk(ids, crosswalk)
        parts = tuple(p for p in fields[6].split("|")) if len(fields) > 6 and fields[6] else ()
        ann = PubTatorAnnotation(start, end, fields[3], fields[4].strip(), ids, composite, nil, parts, raw_ids)
        if check_offsets:
            check_mention_offsets(doc, ann, where)
        doc.annotations.append(ann)
    done = finish(doc)
    if done is not None:
        yield done


def _ids_column(ann: PubTatorAnnotation) -> str:
    if ann.raw_ids:
        ids, composite, nil = split_ids(ann.raw_ids)
        if ids == ann.ids and composite == ann.composite and nil == ann.nil:
            return ann.raw_ids
    if ann.nil or not ann.ids:
        return "-1"
    return "|".join(ann.ids)


def write_pubtator(documents: Iterable[PubTatorDocument], path: PathLike) -> int:
    """Write documents as PubTator (a blank line after each); returns how many.

    Newlines and tabs inside texts become spaces (same length, offsets kept).
    """
    count = 0

    def flat(text: str) -> str:
        return text.replace("\r", " ").replace("\n", " ").replace("\t", " ")

    with Path(path).open("w", encoding="utf8", newline="\n") as out:
        for doc in documents:
            out.write(f"{doc.pmid}|t|{flat(doc.title)}\n")
            out.write(f"{doc.pmid}|a|{flat(doc.abstract)}\n")
            for ann in doc.annotations:
                # (a KB refuses IDs with tabs or line ends: flat() only keeps the lines whole
                # should one come all the same)
                cols = [doc.pmid, str(ann.start), str(ann.end), flat(ann.text), flat(ann.type), flat(_ids_column(ann))]
                if ann.parts:
                    cols.append("|".join(ann.parts))
                out.write("\t".join(cols) + "\n")
            for rel in doc.relations:
                out.write("\t".join([doc.pmid, *rel]) + "\n")
            out.write("\n")
            count += 1
    return count


# -- mentions -----------------------------------------------------------------------
def document_mentions(
    doc: PubTatorDocument, context_chars: Optional[int] = None, skip_nil: bool = False
) -> Iterator[Mention]:
    """The document's annotations as Mentions, with left/right context.

    The mention text is the document slice (so it agrees with the offsets);
    ``context_chars`` limits each side's context (None: the whole document).
    NIL mentions have ``ids=()``; ``skip_nil`` leaves them out.
    """
    text = doc.text
    for ann in doc.annotations:
        if skip_nil and ann.nil:
            continue
        left = text[: ann.start]
        right = text[ann.end :]
        if context_chars is not None:
            left = left[max(0, len(left) - context_chars) :] if context_chars > 0 else ""
            right = right[:context_chars]
        yield Mention(
            text=text[ann.start : ann.end],
            ids=ann.ids,
            left=left,
            right=right,
            doc_id=doc.pmid,
            start=ann.start,
            end=ann.end,
            label=ann.type,
            composite=ann.composite,
        )


def mentions_from_pubtator(
    path: PathLike,
    context_chars: Optional[int] = None,
    skip_nil: bool = False,
    crosswalk: Optional[Mapping[str, str]] = None,
) -> Iterator[Mention]:
    """Mentions with context from a PubTator file (see :func:`document_mentions`)."""
    for doc in read_pubtator(path, crosswalk=crosswalk):
        yield from document_mentions(doc, context_chars=context_chars, skip_nil=skip_nil)
