"""Gold corpora: readers and writers of the corpus formats, as one document record.

* :mod:`.pubtator` -- :class:`PubTatorDocument` / :class:`PubTatorAnnotation`
  (the record every reader yields), :class:`CorpusFormatError`, PubTator
  read/write, gold mentions with context;
* :mod:`.bioc` -- BioC XML and JSON;
* :mod:`.jsonl` -- the project's JSONL corpus format;
* :mod:`.askapatient` -- AskAPatient folds (mentions without context);
* :mod:`.spacy_docs` -- documents as spaCy ``Doc`` objects;
* :mod:`.load` -- a corpus file by format name (:func:`load_corpus`).
"""

from spacy_genbioel.corpus.askapatient import read_askapatient
from spacy_genbioel.corpus.bioc import bioc_document, read_bioc
from spacy_genbioel.corpus.jsonl import read_jsonl_corpus
from spacy_genbioel.corpus.load import CORPUS_FORMATS, DOCUMENT_FORMATS, UnknownFormatError, load_corpus, read_documents
from spacy_genbioel.corpus.pubtator import (
    CorpusFormatError,
    PubTatorAnnotation,
    PubTatorDocument,
    check_mention_offsets,
    document_mentions,
    mentions_from_pubtator,
    read_pubtator,
    write_pubtator,
)
from spacy_genbioel.corpus.spacy_docs import to_spacy_docs

__all__ = [
    "CORPUS_FORMATS",
    "DOCUMENT_FORMATS",
    "CorpusFormatError",
    "PubTatorAnnotation",
    "PubTatorDocument",
    "UnknownFormatError",
    "bioc_document",
    "check_mention_offsets",
    "document_mentions",
    "load_corpus",
    "mentions_from_pubtator",
    "read_askapatient",
    "read_bioc",
    "read_documents",
    "read_jsonl_corpus",
    "read_pubtator",
    "to_spacy_docs",
    "write_pubtator",
]
