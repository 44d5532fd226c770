"""Candidate generators for retrieve-then-generate decoding.

A candidate generator is any :class:`~spacy_genbioel.ty.Linker`
(``link(mentions, top_k) -> List[List[Candidate]]``). The generative linker asks
it for ``num_candidates`` candidates per mention and decodes only names of the
concepts they carry (:meth:`GenerativeLinker.link`).

Generators are the retrievers of :mod:`spacy_genbioel.retrieval.registry`,
named the same way as for ``evaluate --linker``: a short name (``tfidf``,
``dense``, ``exact``, ``scispacy``) or a registered versioned name
(``genbioel.tfidf_retriever.v1``, or a retriever another package registers;
see that module for how). ``none`` means no generator. ``model`` (a directory,
e.g. a trained dense encoder) goes to retrievers that have a ``model`` setting
and is ignored by the others.

Generators are built from the component's KB on first use
(:class:`LazyCandidateGenerator`), so nothing extra is stored with a pipeline:
fitting the TF-IDF generator on MEDIC's 72k names takes about 2 s.
"""
from __future__ import annotations

import logging
import time
from typing import List, Optional, Sequence

from spacy_genbioel.kb.base import KnowledgeBase
from spacy_genbioel.retrieval.registry import RetrieverBuilder, known_retrievers, make_retriever_builder, resolve_retriever, retriever_takes
from spacy_genbioel.ty import Candidate, Linker, Mention

logger = logging.getLogger(__name__)

__all__ = ["LazyCandidateGenerator", "make_candidate_generator", "check_candidates", "known_candidates", "NO_CANDIDATES"]

NO_CANDIDATES = "none"


def known_candidates() -> List[str]:
    return sorted([NO_CANDIDATES, *known_retrievers()])


def check_candidates(name: str) -> None:
    """Fail early (at component creation) on an unknown generator name."""
    if name == NO_CANDIDATES:
        return
    try:
        resolve_retriever(name)
    except ValueError:
        raise ValueError(f"Unknown candidate generator {name!r}; known: {', '.join(known_candidates())}") from None


class LazyCandidateGenerator:
    """Builds the generator from ``kb`` with ``builder`` on the first ``link`` call."""

    def __init__(self, name: str, kb: KnowledgeBase, builder: RetrieverBuilder) -> None:
        self.name = name
        self.kb = kb
        self._builder = builder
        self._generator: Optional[Linker] = None

    @property
    def generator(self) -> Linker:
        if self._generator is None:
            began = time.perf_counter()
            self._generator = self._builder(self.kb)
            logger.info("Candidate generator %r built on %d KB names in %.1f s", self.name, self.kb.n_names, time.perf_counter() - began)
        return self._generator

    def link(self, mentions: Sequence[Mention], top_k: int = 5) -> List[List[Candidate]]:
        return self.generator.link(mentions, top_k)

    def __repr__(self) -> str:
        state = "built" if self._generator is not None else "not built yet"
        return f"LazyCandidateGenerator({self.name!r}, {state})"


def make_candidate_generator(name: str, kb: KnowledgeBase, model: Optional[str] = None) -> Optional[LazyCandidateGenerator]:
    """The retriever ``name`` over ``kb``, built lazily; None for ``"none"``."""
    check_candidates(name)
    if name == NO_CANDIDATES:
        return None
    settings = {"model": model} if model and retriever_takes(name, "model") else {}
    return LazyCandidateGenerator(name, kb, make_retriever_builder(name, **settings))
