"""Retrievers: non-generative linkers that rank KB names for mentions.

One module per retriever (:mod:`.exact`, :mod:`.tfidf`, :mod:`.scispacy`,
:mod:`.dense`), the settings of the configurable ones (:mod:`.settings`)
and one registry (:mod:`.registry`) through which both
``evaluate --linker NAME`` and the generative linker's candidate generation
build them. Importing this package registers the retrievers in spaCy's
``registry.misc``.
"""

from spacy_genbioel.retrieval.registry import get_retriever, known_retrievers

__all__ = ["get_retriever", "known_retrievers"]
