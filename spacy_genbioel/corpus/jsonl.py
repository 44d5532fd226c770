"""The project's JSONL corpus format (``{"id", "text", "mentions"}`` per line) as
:class:`~spacy_genbioel.corpus.pubtator.PubTatorDocument` records.

Fields must have their JSON types: ``id`` a string or an integer (not a float,
a boolean, a list or an object: those would be turned into other IDs), ``text``
a string, ``mentions`` a list of objects with integer ``start``/``end``; anything
else raises :class:`~spacy_genbioel.corpus.pubtator.CorpusFormatError` with file and line.
"""

from __future__ import annotations

from typing import Any, Iterator, List

from spacy_genbioel.corpus.pubtator import (
    CorpusFormatError,
    PubTatorAnnotation,
    PubTatorDocument,
    check_mention_offsets,
)
from spacy_genbioel.kb.crosswalk import split_ids
from spacy_genbioel.util import PathLike, iter_json_lines

__all__ = ["read_jsonl_corpus"]


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _offset(item: dict, key: str) -> int:
    """``start``/``end``: a JSON integer (or a string of one, as before)."""
    value = item[key]
    if _is_int(value):
        return value
    if isinstance(value, str) and value.strip().lstrip("-").isdigit() and value.strip().isascii():
        return int(value)
    raise ValueError(value)


def _mention_ids(raw_ids: Any, where: str) -> List[str]:
    if raw_ids is None:
        return []
    if isinstance(raw_ids, str):
        return [raw_ids]
    if isinstance(raw_ids, list) and all(isinstance(i, str) or _is_int(i) for i in raw_ids):
        return [str(i) for i in raw_ids]
    raise CorpusFormatError(f"{where}: mention 'ids' must be a string or a list of strings")


def read_jsonl_corpus(path: PathLike, check_offsets: bool = True) -> Iterator[PubTatorDocument]:
    """``{"id", "text", "mentions": [{"start", "end", "label", "ids"}]}`` per line.

    ``ids`` may be a list or a ``|``-joined string; an optional mention
    ``"text"`` is checked against the offsets. The whole text is the title.
    """
    for lineno, record in iter_json_lines(path, CorpusFormatError):
        where = f"{path}:{lineno}"
        if not isinstance(record, dict) or "text" not in record:
            raise CorpusFormatError(f"{where}: expected an object with 'id', 'text' and 'mentions'")
        raw_id = record.get("id", lineno)
        if not (isinstance(raw_id, str) or _is_int(raw_id)):
            raise CorpusFormatError(
                f"{where}: 'id' must be a string or an integer, got {type(raw_id).__name__} {raw_id!r}"
            )
        if not isinstance(record["text"], str):
            raise CorpusFormatError(f"{where}: 'text' must be a string, got {type(record['text']).__name__}")
        doc_id = str(raw_id)
        doc = PubTatorDocument(doc_id, record["text"])
        mentions = record.get("mentions")
        mentions = [] if mentions is None else mentions
        if not isinstance(mentions, list):
            raise CorpusFormatError(f"{where}: document {doc_id}: 'mentions' must be a list")
        for item in mentions:
            if not isinstance(item, dict):
                raise CorpusFormatError(f"{where}: document {doc_id}: each mention must be an object")
            try:
                start, end = _offset(item, "start"), _offset(item, "end")
            except (KeyError, TypeError, ValueError):
                raise CorpusFormatError(
                    f"{where}: document {doc_id}: mention needs integer 'start' and 'end'"
                ) from None
            ids, composite, nil = split_ids("|".join(_mention_ids(item.get("ids"), f"{where}: document {doc_id}")))
            text = item.get("text", doc.text[start:end] if 0 <= start < end <= len(doc.text) else "")
            label = item.get("label")
            label = "" if label is None else label
            if not isinstance(text, str) or not isinstance(label, str):
                raise CorpusFormatError(f"{where}: document {doc_id}: mention 'text' and 'label' must be strings")
            ann = PubTatorAnnotation(start, end, text, label, ids, composite, nil)
            if check_offsets:
                check_mention_offsets(doc, ann, where)
            doc.annotations.append(ann)
        yield doc
