"""Corpus records as spaCy ``Doc`` objects: gold mentions in ``doc.spans`` and ``doc.ents``."""

from __future__ import annotations

import logging
from typing import Any, Iterable, Iterator, List

from spacy_genbioel.corpus.pubtator import PubTatorDocument

logger = logging.getLogger(__name__)

__all__ = ["to_spacy_docs"]


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
            span = doc.char_span(ann.start, ann.end, label=ann.type, kb_id="|".join(ann.ids), alignment_mode="expand")
            if span is None or len(span) == 0:
                logger.warning(
                    "PMID %s: mention %r at %d-%d covers no token, skipped", document.pmid, ann.text, ann.start, ann.end
                )
                continue
            spans.append(span)
        doc.spans[span_key] = spans
        doc.ents = filter_spans(spans)
        yield doc
