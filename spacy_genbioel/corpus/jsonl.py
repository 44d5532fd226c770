"""The project's JSONL corpus format (``{"id", "text", "mentions"}`` per line) as
:class:`~spacy_genbioel.corpus.pubtator.PubTatorDocument` records."""
from __future__ import annotations

from typing import Iterator

from spacy_genbioel.corpus.pubtator import CorpusFormatError, PubTatorAnnotation, PubTatorDocument, check_mention_offsets
from spacy_genbioel.kb.crosswalk import split_ids
from spacy_genbioel.util import PathLike, iter_json_lines

__all__ = ["read_jsonl_corpus"]


def read_jsonl_corpus(path: PathLike, check_offsets: bool = True) -> Iterator[PubTatorDocument]:
    """``{"id", "text", "mentions": [{"start", "end", "label", "ids"}]}`` per line.

    ``ids`` may be a list or a ``|``-joined string; an optional mention
    ``"text"`` is checked against the offsets. The whole text is the title.
    """
    for lineno, record in iter_json_lines(path, CorpusFormatError):
        where = f"{path}:{lineno}"
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
                check_mention_offsets(doc, ann, where)
            doc.annotations.append(ann)
        yield doc
