"""Candidate generators for retrieve-then-generate decoding.

A candidate generator is any :class:`~spacy_genbioel.ty.Linker`
(``link(mentions, top_k) -> List[List[Candidate]]``). The generative linker asks
it for ``num_candidates`` candidates per mention and decodes only names of the
concepts they carry (:meth:`GenerativeLinker.link`).

Generators are registered by name in the ``candidate_generators`` registry as
functions ``(kb, model=None) -> Linker`` (``model``: a directory for generators
that need one, e.g. a trained dense retriever), so the component config can pick one
(``candidates = "tfidf"``) and packages can add their own::

    from spacy_genbioel.linking.candidates import candidate_generators

    @candidate_generators.register("my_retriever")
    def make_my_retriever(kb, model=None):
        return MyRetriever(kb, model)

Generators are built from the component's KB on first use
(:class:`LazyCandidateGenerator`), so nothing extra is stored with a pipeline:
fitting the TF-IDF generator on MEDIC's 72k names takes about 2 s.
"""
from __future__ import annotations

import logging
import time
from typing import Callable, List, Optional, Sequence

import catalogue

from spacy_genbioel.kb.base import KnowledgeBase
from spacy_genbioel.ty import Candidate, Linker, Mention

logger = logging.getLogger(__name__)

__all__ = ["candidate_generators", "LazyCandidateGenerator", "make_candidate_generator", "check_candidates", "NO_CANDIDATES"]

NO_CANDIDATES = "none"

candidate_generators = catalogue.create("spacy_genbioel", "candidate_generators", entry_points=True)


@candidate_generators.register("tfidf")
def make_tfidf(kb: KnowledgeBase, model: Optional[str] = None) -> Linker:
    """Character 3-gram TF-IDF over the KB names (:class:`~spacy_genbioel.retrieval.peers.TfidfLinker`); no model."""
    from spacy_genbioel.retrieval.peers import get_linker

    return get_linker("tfidf", kb)


@candidate_generators.register("dense")
def make_dense(kb: KnowledgeBase, model: Optional[str] = None) -> Linker:
    """The dense (SapBERT-style) retriever of ``peers.get_linker("dense")``; ``model``:
    its encoder directory (default: the installed all-MiniLM-L6-v2, untrained for linking)."""
    from spacy_genbioel.retrieval.peers import get_linker

    return get_linker("dense", kb, **({"model": model} if model else {}))


def known_candidates() -> List[str]:
    return sorted([NO_CANDIDATES, *candidate_generators.get_all()])


def check_candidates(name: str) -> None:
    """Fail early (at component creation) on an unknown generator name."""
    if name != NO_CANDIDATES and name not in candidate_generators:
        raise ValueError(f"Unknown candidate generator {name!r}; known: {', '.join(known_candidates())}")


class LazyCandidateGenerator:
    """Builds the named generator from ``kb`` on the first ``link`` call."""

    def __init__(self, name: str, kb: KnowledgeBase, factory: Callable[..., Linker], model: Optional[str] = None) -> None:
        self.name = name
        self.kb = kb
        self.model = model
        self._factory = factory
        self._generator: Optional[Linker] = None

    @property
    def generator(self) -> Linker:
        if self._generator is None:
            began = time.perf_counter()
            self._generator = self._factory(self.kb, model=self.model)
            logger.info("Candidate generator %r built on %d KB names in %.1f s", self.name, self.kb.n_names, time.perf_counter() - began)
        return self._generator

    def link(self, mentions: Sequence[Mention], top_k: int = 5) -> List[List[Candidate]]:
        return self.generator.link(mentions, top_k)

    def __repr__(self) -> str:
        state = "built" if self._generator is not None else "not built yet"
        return f"LazyCandidateGenerator({self.name!r}, {state})"


def make_candidate_generator(name: str, kb: KnowledgeBase, model: Optional[str] = None) -> Optional[LazyCandidateGenerator]:
    """The registered generator ``name`` over ``kb``, built lazily; None for ``"none"``."""
    check_candidates(name)
    if name == NO_CANDIDATES:
        return None
    return LazyCandidateGenerator(name, kb, candidate_generators.get(name), model=model)
