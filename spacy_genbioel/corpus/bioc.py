"""BioC XML and BioC JSON as :class:`~spacy_genbioel.corpus.pubtator.PubTatorDocument` records.

:func:`bioc_document` holds the project's one rule for laying BioC passages
out as ``title + " " + abstract`` (the annotation pipeline reuses it, through
:func:`bioc_text_document`, for its streamed BioC input).

BioC XML is parsed with the package's safe parser (:mod:`spacy_genbioel.kb.safe_xml`:
no entities, no network, whatever lxml version is installed). A document
must have an ID; a document ID seen twice is kept twice with a warning (as
:func:`~spacy_genbioel.corpus.pubtator.read_pubtator` does); passage offsets in
BioC JSON must be JSON integers.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

from spacy_genbioel.corpus.pubtator import (
    CorpusFormatError,
    PubTatorAnnotation,
    PubTatorDocument,
    check_mention_offsets,
)
from spacy_genbioel.kb.crosswalk import split_ids
from spacy_genbioel.kb.safe_xml import parse_xml, safe_default_parser
from spacy_genbioel.util import PathLike, read_text, text_lines

logger = logging.getLogger(__name__)

__all__ = ["bioc_document", "bioc_text_document", "read_bioc"]

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
    content = read_text(path, CorpusFormatError)  # a corrupt .gz or bad UTF-8: the error names file and line
    try:
        documents = _bioc_documents(content, path)
    except CorpusFormatError:
        raise
    except Exception as err:  # the bioc package raises many kinds
        position = getattr(err, "position", None)
        line = position[0] if position else getattr(err, "lineno", 1)
        raise CorpusFormatError(f"{path}:{line}: could not read BioC ({err})") from err
    seen: Dict[str, int] = {}
    for index, bdoc in enumerate(documents, start=1):
        doc_id = "" if bdoc.id is None else str(bdoc.id).strip()
        if not doc_id:
            raise CorpusFormatError(f"{path}: document #{index} has no ID")
        if doc_id in seen:
            logger.warning(
                "%s: document #%d: ID %s seen before (document #%d); kept both", path, index, doc_id, seen[doc_id]
            )
        seen.setdefault(doc_id, index)
        try:
            yield bioc_document(bdoc, path, id_keys, check_offsets)
        except CorpusFormatError:
            raise
        except (TypeError, ValueError, AttributeError) as err:  # e.g. an offset that is not a number
            raise CorpusFormatError(
                f"{path}: document {getattr(bdoc, 'id', '?')}: could not read BioC ({err})"
            ) from err


def _bioc_documents(content: str, path: Path) -> List[Any]:
    from bioc import biocjson, biocxml  # optional dependency, only needed here

    head = content.lstrip()
    if head.startswith("<"):
        parse_xml(content)  # refuses entity references (the bioc decoder would drop them silently)
        with safe_default_parser():
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
    for lineno, line in enumerate(text_lines(content), start=1):
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
        if isinstance(passage["offset"], bool) or not isinstance(passage["offset"], int):
            raise TypeError(f"passage offset {passage['offset']!r} is not a JSON integer")
        passage["annotations"] = [
            {"id": "", "infons": {}, "text": "", "locations": [], **ann} for ann in passage["annotations"]
        ]
        passages.append(passage)
    doc["passages"] = passages
    return doc


def bioc_text_document(doc_id: str, passages: Iterable[Tuple[Any, Optional[str]]]) -> PubTatorDocument:
    """A document without annotations from one BioC record's ``(offset, text)``
    passages, laid out as :func:`read_bioc` does; for readers that parse one
    record at a time and keep going past a bad one. A non-integer offset raises
    ``ValueError``."""
    from bioc import BioCDocument, BioCPassage

    doc = BioCDocument()
    doc.id = doc_id
    for offset, text in passages:
        passage = BioCPassage()
        try:
            passage.offset = int(offset)
        except (TypeError, ValueError):
            raise ValueError(f"passage offset {offset!r} is not an integer") from None
        passage.text = text or ""
        doc.add_passage(passage)
    return bioc_document(doc, Path(""), (), check_offsets=False)


def bioc_document(bdoc: Any, path: Path, id_keys: Sequence[str], check_offsets: bool) -> PubTatorDocument:
    """One ``bioc`` document as a record: the first passage is the title, the
    others are laid out by their offsets into the abstract (see :func:`read_bioc`)."""
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
                check_mention_offsets(doc, record, f"{where} annotation {ann.id}")
            doc.annotations.append(record)
    doc.annotations.sort(key=lambda a: (a.start, a.end))
    return doc
