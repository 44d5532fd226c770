"""Corpus readers and writers: PubTator, BioC (XML/JSON), AskAPatient, JSONL.

Documents are :class:`PubTatorDocument` (title, abstract, gold annotations);
:func:`mentions_from_pubtator` and :func:`document_mentions` flatten them into
:class:`~spacy_genbioel.ty.Mention` records with context;
:func:`to_spacy_docs` turns them into spaCy ``Doc`` objects.

Decisions:

* IDs are cleaned with :func:`~spacy_genbioel.kb.sources.normalize_id`;
  composite fields (``D001|D002``, ``D014527+D012492``) give several IDs and
  ``composite=True``; ``-1`` parts are dropped, and a mention with no ID left
  is kept with ``ids=()`` and ``nil=True`` so that evaluation can skip it.
* Offsets are checked against ``title + " " + abstract``; differences in
  whitespace only are tolerated (NCBI train has a mention text with trailing
  spaces), anything else raises :class:`CorpusFormatError` naming file, line
  and PMID.
* A PMID seen twice (NCBI train has 8528200 twice, identical) is kept twice,
  with a warning: the published counts (593 docs, 5,145 mentions) include both.
"""
from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Tuple

from spacy_genbioel.util import PathLike, iter_lines, open_binary, open_text

from spacy_genbioel.kb.sources import normalize_id, split_ids
from spacy_genbioel.ty import Mention

logger = logging.getLogger(__name__)


__all__ = [
    "CorpusFormatError",
    "PubTatorAnnotation",
    "PubTatorDocument",
    "document_mentions",
    "mentions_from_pubtator",
    "read_askapatient",
    "read_bioc",
    "read_jsonl_corpus",
    "read_pubtator",
    "to_spacy_docs",
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

    @property
    def text(self) -> str:
        return f"{self.title} {self.abstract}" if self.abstract else self.title


def _same_text(a: str, b: str) -> bool:
    return a == b or " ".join(a.split()) == " ".join(b.split())


def _check_offsets(doc: PubTatorDocument, ann: PubTatorAnnotation, where: str) -> None:
    text = doc.text
    if not 0 <= ann.start < ann.end <= len(text):
        raise CorpusFormatError(
            f"{where}: PMID {doc.pmid}: offsets {ann.start}-{ann.end} outside the text (length {len(text)})"
        )
    span = text[ann.start:ann.end]
    if not _same_text(span, ann.text):
        raise CorpusFormatError(
            f"{where}: PMID {doc.pmid}: mention {ann.text!r} does not match the text at "
            f"{ann.start}-{ann.end} ({span!r})"
        )
    if span != ann.text:
        logger.debug("%s: PMID %s: mention %r differs from the text %r in whitespace only", where, doc.pmid, ann.text, span)


def _apply_walk(ids: Tuple[str, ...], crosswalk: Optional[Mapping[str, str]]) -> Tuple[str, ...]:
    if not crosswalk:
        return ids
    return tuple(dict.fromkeys(crosswalk.get(cid, cid) for cid in ids))


def _is_int(text: str) -> bool:
    return text.strip().lstrip("-").isdigit()


# -- PubTator -------------------------------------------------------------------
_TEXT_LINE = re.compile(r"^([^|\t]+)\|([ta])\|(.*)$")


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
        match = _TEXT_LINE.match(line)
        if match:
            pmid, kind, text = match.group(1).strip(), match.group(2), match.group(3)
            if kind == "t":
                done = finish(doc)
                if done is not None:
                    yield done
                doc = PubTatorDocument(pmid, text)
                start_line = lineno
            else:
                if doc is None or doc.pmid != pmid:
                    raise CorpusFormatError(f"{where}: PMID {pmid}: abstract line without its title line")
                if doc.annotations:
                    raise CorpusFormatError(f"{where}: PMID {pmid}: abstract line after mention lines")
                doc.abstract = text
            continue
        fields = line.split("\t")
        pmid = fields[0].strip()
        if doc is None:
            raise CorpusFormatError(f"{where}: PMID {pmid}: mention line before any title line")
        if pmid != doc.pmid:
            raise CorpusFormatError(f"{where}: PMID {pmid}: line inside document {doc.pmid}")
        if len(fields) >= 3 and not _is_int(fields[1]) and not _is_int(fields[2]):
            doc.relations.append(tuple(fields[1:]))  # e.g. PMID CID chem disease
            continue
        if len(fields) < 5:
            raise CorpusFormatError(
                f"{where}: PMID {pmid}: expected PMID<TAB>start<TAB>end<TAB>text<TAB>type[<TAB>ids], "
                f"got {len(fields)} column(s)"
            )
        try:
            start, end = int(fields[1]), int(fields[2])
        except ValueError:
            raise CorpusFormatError(f"{where}: PMID {pmid}: offsets {fields[1]!r}-{fields[2]!r} are not integers") from None
        raw_ids = fields[5] if len(fields) > 5 else ""
        ids, composite, nil = split_ids(raw_ids)
        parts = tuple(p for p in fields[6].split("|")) if len(fields) > 6 and fields[6] else ()
        ann = PubTatorAnnotation(
            start, end, fields[3], fields[4].strip(), _apply_walk(ids, crosswalk), composite, nil, parts, raw_ids
        )
        if check_offsets:
            _check_offsets(doc, ann, where)
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
                cols = [doc.pmid, str(ann.start), str(ann.end), flat(ann.text), ann.type, _ids_column(ann)]
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
        right = text[ann.end:]
        if context_chars is not None:
            left = left[len(left) - context_chars:] if context_chars > 0 else ""
            right = right[:context_chars]
        yield Mention(
            text=text[ann.start:ann.end],
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


# -- BioC -----------------------------------------------------------------------------
_BIOC_ID_KEYS = ("identifier", "Identifier", "MESH", "MeSH", "mesh", "CUI", "cui", "NCBI Gene", "concept_id")
_BIOC_ID_SPLIT = "|+,;"


def read_bioc(
    path: PathLike, id_keys: Sequence[str] = _BIOC_ID_KEYS, check_offsets: bool = True
) -> Iterator[PubTatorDocument]:
    """BioC XML or BioC JSON (a collection, or one document per line) as documents.

    The first passage is the title and the others make up the abstract; the
    passages are laid out by their offsets (gaps padded with spaces), and
    offsets are shifted where needed so ``title + " " + abstract`` indexes them.
    The mention type comes from the ``type`` infon, IDs from the first of
    ``id_keys`` present (split on ``| + , ;``). Discontinuous annotations use
    their total span.
    """
    path = Path(path)
    with open_text(path) as handle:
        content = handle.read()
    try:
        documents = _bioc_documents(content, path)
    except CorpusFormatError:
        raise
    except Exception as err:  # the bioc package raises many kinds
        position = getattr(err, "position", None)
        line = position[0] if position else getattr(err, "lineno", 1)
        raise CorpusFormatError(f"{path}:{line}: could not read BioC ({err})") from err
    for bdoc in documents:
        yield _bioc_document(bdoc, path, id_keys, check_offsets)


def _bioc_documents(content: str, path: Path) -> List[Any]:
    from bioc import biocjson, biocxml  # optional dependency, only needed here

    head = content.lstrip()
    if head.startswith("<"):
        return list(biocxml.loads(content).documents)
    try:
        data = json.loads(content)
    except json.JSONDecodeError:
        data = None  # maybe one document per line
    parse_doc = biocjson.decoder.parse_doc
    if isinstance(data, dict) and "documents" in data:
        return [parse_doc(_bioc_json_defaults(d)) for d in data["documents"]]
    if isinstance(data, dict):
        return [parse_doc(_bioc_json_defaults(data))]
    if isinstance(data, list):
        return [parse_doc(_bioc_json_defaults(item)) for item in data]
    documents = []
    for lineno, line in enumerate(content.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            documents.append(parse_doc(_bioc_json_defaults(json.loads(line))))
        except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as err:
            raise CorpusFormatError(f"{path}:{lineno}: neither BioC XML nor BioC JSON ({err})") from err
    return documents


def _bioc_json_defaults(doc: Any) -> Dict[str, Any]:
    """Fill the keys the ``bioc`` JSON decoder insists on but many exporters leave out."""
    if not isinstance(doc, dict) or "passages" not in doc:
        raise KeyError("a BioC document needs 'passages'")
    doc = {"id": "", "infons": {}, "relations": [], **doc}
    passages = []
    for passage in doc["passages"]:
        passage = {"offset": 0, "infons": {}, "sentences": [], "annotations": [], "relations": [], **passage}
        passage["annotations"] = [
            {"id": "", "infons": {}, "text": "", "locations": [], **ann} for ann in passage["annotations"]
        ]
        passages.append(passage)
    doc["passages"] = passages
    return doc


def _bioc_document(bdoc: Any, path: Path, id_keys: Sequence[str], check_offsets: bool) -> PubTatorDocument:
    passages = sorted(bdoc.passages, key=lambda p: p.offset)
    doc_id = str(bdoc.id)
    if not passages:
        return PubTatorDocument(doc_id, "")
    first = passages[0]
    title = first.text or ""
    abstract = ""
    placed: List[Tuple[Any, int]] = [(first, 0)]  # (passage, its offset in our text)
    for passage in passages[1:]:
        wanted = passage.offset - first.offset
        # keep the passage where BioC put it unless that would overlap or glue to the text before
        earliest = len(title) + 1 + len(abstract) + (1 if abstract else 0)
        new = max(wanted, earliest)
        abstract += " " * (new - len(title) - 1 - len(abstract)) + (passage.text or "")
        placed.append((passage, new))
    doc = PubTatorDocument(doc_id, title, abstract)
    where = f"{path}: document {doc_id}"
    for passage, new in placed:
        for ann in passage.annotations:
            if not ann.locations:
                logger.warning("%s: annotation %s has no location, skipped", where, ann.id)
                continue
            span = ann.total_span
            start = span.offset - passage.offset + new
            end = start + span.length
            text = ann.text or doc.text[start:end]
            if len(ann.locations) > 1:
                # the annotation text is the parts glued together: only the span can be checked
                logger.debug("%s: discontinuous annotation %s, using its total span", where, ann.id)
                text = doc.text[start:end]
            raw_ids = next((str(ann.infons[k]) for k in id_keys if ann.infons.get(k)), "")
            ids, composite, nil = split_ids(raw_ids, _BIOC_ID_SPLIT)
            label = ann.infons.get("type") or ann.infons.get("Type") or ""
            record = PubTatorAnnotation(start, end, text, label, ids, composite, nil)
            if check_offsets:
                _check_offsets(doc, record, f"{where} annotation {ann.id}")
            doc.annotations.append(record)
    doc.annotations.sort(key=lambda a: (a.start, a.end))
    return doc


# -- AskAPatient and JSONL --------------------------------------------------------------------
def read_askapatient(path: PathLike, encoding: Optional[str] = None) -> Iterator[Mention]:
    """AskAPatient folds: ``concept_id<TAB>concept_name<TAB>mention`` per line, no context.

    ``doc_id`` is ``<file name>:<line>`` so that mentions stay traceable. Some
    folds are Latin-1 (fold 0 train has ``Sj\\xf6gren``): without ``encoding``, UTF-8 is tried
    first and Latin-1 used when it fails.
    """
    name = Path(path).name
    with open_binary(path) as handle:
        data = handle.read()
    if encoding is None:
        try:
            content = data.decode("utf-8-sig")
        except UnicodeDecodeError:
            logger.info("%s is not UTF-8, read as Latin-1", path)
            content = data.decode("latin-1")
    else:
        content = data.decode(encoding)
    for lineno, raw in enumerate(content.split("\n"), start=1):
        line = raw.rstrip("\r\n")
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) != 3:
            raise CorpusFormatError(
                f"{path}:{lineno}: expected concept_id<TAB>concept_name<TAB>mention, got {len(fields)} column(s)"
            )
        cid, mention = normalize_id(fields[0]), fields[2].strip()
        if not cid or not mention:
            raise CorpusFormatError(f"{path}:{lineno}: empty concept ID or mention")
        yield Mention(text=mention, ids=(cid,), doc_id=f"{name}:{lineno}")


def read_jsonl_corpus(path: PathLike, check_offsets: bool = True) -> Iterator[PubTatorDocument]:
    """``{"id", "text", "mentions": [{"start", "end", "label", "ids"}]}`` per line.

    ``ids`` may be a list or a ``|``-joined string; an optional mention
    ``"text"`` is checked against the offsets. The whole text is the title.
    """
    for lineno, raw in iter_lines(path, CorpusFormatError):
        if not raw.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            record = json.loads(raw)
        except json.JSONDecodeError as err:
            raise CorpusFormatError(f"{where}: not valid JSON ({err.msg})") from err
        if not isinstance(record, dict) or "text" not in record:
            raise CorpusFormatError(f"{where}: expected an object with 'id', 'text' and 'mentions'")
        doc_id = str(record.get("id", lineno))
        doc = PubTatorDocument(doc_id, str(record["text"]))
        for item in record.get("mentions", []):
            if not isinstance(item, dict):
                raise CorpusFormatError(f"{where}: document {doc_id}: each mention must be an object")
            try:
                start, end = int(item["start"]), int(item["end"])
            except (KeyError, TypeError, ValueError):
                raise CorpusFormatError(f"{where}: document {doc_id}: mention needs integer 'start' and 'end'") from None
            raw_ids = item.get("ids", ())
            if isinstance(raw_ids, str):
                raw_ids = [raw_ids]
            ids, composite, nil = split_ids("|".join(str(i) for i in raw_ids))
            text = item.get("text", doc.text[start:end] if 0 <= start < end <= len(doc.text) else "")
            ann = PubTatorAnnotation(start, end, text, str(item.get("label", "")), ids, composite, nil)
            if check_offsets:
                _check_offsets(doc, ann, where)
            doc.annotations.append(ann)
        yield doc


# -- spaCy ----------------------------------------------------------------------------------------
def to_spacy_docs(documents: Iterable[PubTatorDocument], nlp: Any, span_key: str = "gold") -> Iterator[Any]:
    """spaCy Docs (tokenized with ``nlp.make_doc``) carrying the gold mentions.

    Every mention goes to ``doc.spans[span_key]``; the non-overlapping ones
    (longest first, as ``spacy.util.filter_spans``) become ``doc.ents``. Each
    span has the mention type as label and the IDs ``|``-joined as ``kb_id_``
    (empty for NIL). Offsets off token boundaries expand to whole tokens.
    ``doc.user_data["doc_id"]`` holds the PMID.
    """
    from spacy.tokens import Span
    from spacy.util import filter_spans

    for document in documents:
        doc = nlp.make_doc(document.text)
        doc.user_data["doc_id"] = document.pmid
        spans: List[Span] = []
        for ann in document.annotations:
            span = doc.char_span(
                ann.start, ann.end, label=ann.type, kb_id="|".join(ann.ids), alignment_mode="expand"
            )
            if span is None or len(span) == 0:
                logger.warning("PMID %s: mention %r at %d-%d covers no token, skipped", document.pmid, ann.text, ann.start, ann.end)
                continue
            spans.append(span)
        doc.spans[span_key] = spans
        doc.ents = filter_spans(spans)
        yield doc
