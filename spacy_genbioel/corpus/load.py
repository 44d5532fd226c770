"""A corpus file by format name: the documents, or the gold mentions with their
document texts, as evaluation and the command line load them. A corpus file
without a single document (or AskAPatient mention) is refused
(:class:`~spacy_genbioel.corpus.pubtator.CorpusFormatError` naming it): an
empty gold split would evaluate to nothing without a word."""

from __future__ import annotations

from typing import Dict, List, Mapping, Optional, Tuple

from spacy_genbioel.corpus.askapatient import read_askapatient
from spacy_genbioel.corpus.bioc import read_bioc
from spacy_genbioel.corpus.jsonl import read_jsonl_corpus
from spacy_genbioel.corpus.pubtator import CorpusFormatError, PubTatorDocument, document_mentions, read_pubtator
from spacy_genbioel.kb.crosswalk import read_crosswalk
from spacy_genbioel.ty import Mention
from spacy_genbioel.util import PathLike

__all__ = ["CORPUS_FORMATS", "DOCUMENT_FORMATS", "UnknownFormatError", "load_corpus", "read_documents"]

#: Formats with documents (text and offsets); AskAPatient has bare mentions only.
DOCUMENT_FORMATS = ("pubtator", "bioc", "jsonl")
CORPUS_FORMATS = (*DOCUMENT_FORMATS, "askapatient")


class UnknownFormatError(ValueError):
    """A corpus format name this module does not know (a usage error, where
    :class:`~spacy_genbioel.corpus.pubtator.CorpusFormatError` is a bad file)."""


def read_documents(path: PathLike, fmt: str, crosswalk: Optional[Mapping[str, str]] = None) -> List[PubTatorDocument]:
    """The documents of a ``pubtator``, ``bioc`` or ``jsonl`` file; ``crosswalk``
    (old -> new IDs) applies to PubTator gold IDs."""
    if fmt == "pubtator":
        documents = list(read_pubtator(path, crosswalk=crosswalk))
    elif fmt == "bioc":
        documents = list(read_bioc(path))
    elif fmt == "jsonl":
        documents = list(read_jsonl_corpus(path))
    else:
        raise UnknownFormatError(f"unknown document format {fmt!r}; use {', '.join(DOCUMENT_FORMATS)}")
    return _not_empty(documents, path, fmt, "documents")


def _not_empty(items: List, path: PathLike, fmt: str, what: str) -> List:
    if not items:
        raise CorpusFormatError(f"{path}: no {what} in this {fmt} corpus file (an empty file, or not {fmt})")
    return items


def load_corpus(path: PathLike, fmt: str, crosswalk: Optional[PathLike] = None) -> Tuple[List[Mention], Dict[str, str]]:
    """Gold mentions (with context) and document texts (by document ID) of a
    corpus file; ``crosswalk`` is a TSV of old -> new IDs. AskAPatient has no
    texts. An unknown ``fmt`` raises :class:`UnknownFormatError`."""
    walk = read_crosswalk(crosswalk) if crosswalk else None
    if fmt == "askapatient":
        return _not_empty(list(read_askapatient(path)), path, fmt, "mentions"), {}
    if fmt not in DOCUMENT_FORMATS:
        raise UnknownFormatError(f"unknown corpus format {fmt!r}; use pubtator, bioc, jsonl or askapatient")
    documents = read_documents(path, fmt, walk)
    mentions = [m for doc in documents for m in document_mentions(doc)]
    return mentions, {doc.pmid: doc.text for doc in documents}
