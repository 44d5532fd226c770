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
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

import numpy as np

from spacy_genbioel.kb.base import KnowledgeBase
from spacy_genbioel.linking.numbers import Bound, bounded, check_numbers
from spacy_genbioel.retrieval.registry import (
    RetrieverBuilder,
    known_retrievers,
    make_retriever_builder,
    resolve_retriever,
    retriever_takes,
)
from spacy_genbioel.ty import Candidate, Linker, Mention

logger = logging.getLogger(__name__)

__all__ = [
    "CandidateSettings",
    "CandidateUnion",
    "LazyCandidateGenerator",
    "make_candidate_generator",
    "check_candidates",
    "known_candidates",
    "NO_CANDIDATES",
    "model_for",
    "exact_matches",
    "allowed_name_sets",
]

NO_CANDIDATES = "none"


def known_candidates() -> List[str]:
    return sorted([NO_CANDIDATES, *known_retrievers()])


def check_candidates(name: str) -> None:
    """Fail early (at component creation) on an unknown generator name (``a+b``: each part)."""
    if name == NO_CANDIDATES:
        return
    for part in name.split("+"):
        try:
            resolve_retriever(part)
        except ValueError:
            raise ValueError(
                f"Unknown candidate generator {part!r}; known: {', '.join(known_candidates())} (join several with '+')"
            ) from None


@dataclass(frozen=True)
class CandidateSettings:
    """Retrieve, then generate: which retriever proposes concepts, and how the decoder uses them.

    ``retriever`` names a registered retriever (see :mod:`spacy_genbioel.retrieval`),
    built from the component's KB on first use; each mention's beam search is limited
    to its ``num_candidates`` retrieved concepts (``restrict_to_candidates = false``:
    decode unrestricted, the retriever serves ``shortcut_threshold`` only)."""

    #: a registered retriever (short or versioned name: "tfidf", "genbioel.tfidf_retriever.v1"), or "none"
    retriever: str = NO_CANDIDATES
    #: directory of the retriever's model, for those that need one (dense, rescnn); not copied by to_disk.
    #: ``NAME=DIR[,NAME=DIR]`` gives each retriever of a union its own (``rescnn=training/ncbi/rescnn/model``)
    model: Optional[str] = None
    #: concepts the retriever proposes per mention (its top names' IDs)
    num_candidates: int = bounded(20, Bound(int, 1))
    #: decode only names of the retrieved concepts (false: the retriever serves the shortcut only)
    restrict_to_candidates: bool = True
    #: a mention whose top retrieved candidate scores at least this takes it without generating (null: off)
    shortcut_threshold: Optional[float] = bounded(None, Bound(float, optional=True))

    def __post_init__(self) -> None:
        check_numbers(self, "candidates")
        check_candidates(self.retriever)

    @property
    def enabled(self) -> bool:
        return self.retriever != NO_CANDIDATES


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
            logger.info(
                "Candidate generator %r built on %d KB names in %.1f s",
                self.name,
                self.kb.n_names,
                time.perf_counter() - began,
            )
        return self._generator

    def link(self, mentions: Sequence[Mention], top_k: int = 5) -> List[List[Candidate]]:
        return self.generator.link(mentions, top_k)

    def __repr__(self) -> str:
        state = "built" if self._generator is not None else "not built yet"
        return f"LazyCandidateGenerator({self.name!r}, {state})"


class CandidateUnion:
    """Several retrievers as one (``tfidf+dense``): each one's ``top_k`` candidates, one list after
    the other (what the decoder restricts to, or forced scoring ranks, is their union)."""

    def __init__(self, parts: Sequence[Linker]) -> None:
        self.parts = list(parts)

    @property
    def generator(self) -> "CandidateUnion":
        """Build every part now (each is lazy), as :attr:`LazyCandidateGenerator.generator` does."""
        for part in self.parts:
            getattr(part, "generator", None)
        return self

    def link(self, mentions: Sequence[Mention], top_k: int = 5) -> List[List[Candidate]]:
        lists = [part.link(mentions, top_k) for part in self.parts]
        return [[c for per_part in found for c in per_part] for found in zip(*lists)]

    def __repr__(self) -> str:
        return f"CandidateUnion({self.parts!r})"


def make_candidate_generator(name: str, kb: KnowledgeBase, model: Optional[str] = None) -> Optional[Linker]:
    """The retriever ``name`` over ``kb``, built lazily; None for ``"none"``; ``a+b``: the union
    of retrievers ``a`` and ``b`` (:class:`CandidateUnion`)."""
    check_candidates(name)
    if name == NO_CANDIDATES:
        return None
    if "+" in name:
        return CandidateUnion([_retriever(part, kb, model) for part in name.split("+")])
    return _retriever(name, kb, model)


def _retriever(name: str, kb: KnowledgeBase, model: Optional[str]) -> Linker:
    """One retriever (``name`` is not ``none``, and no union), built lazily."""
    model = model_for(name, model)
    settings = {"model": model} if model and retriever_takes(name, "model") else {}
    return LazyCandidateGenerator(name, kb, make_retriever_builder(name, **settings))


def model_for(name: str, model: Optional[str]) -> Optional[str]:
    """The model directory retriever ``name`` gets from ``candidates.model``: a directory goes to every
    retriever that takes one; ``NAME=DIR`` pairs (comma-separated) each to the retriever named (None to others)."""
    if not model:
        return None
    pairs = [part.partition("=") for part in model.split(",")]
    if not all(sep and key in known_retrievers() for key, sep, _ in pairs):
        return model
    return next((path for key, _, path in pairs if resolve_retriever(key) == resolve_retriever(name)), None)


def exact_matches(kb: KnowledgeBase, mentions: Sequence[Mention], which: Sequence[int]) -> Dict[int, Candidate]:
    """``exact_match``: for the mentions in ``which`` whose normalized text is a KB name,
    that name first (score 0, the highest a mean log-probability can be)."""
    out: Dict[int, Candidate] = {}
    for i in which:
        idx = kb.name_index(kb.normalize(mentions[i].text))
        if idx is not None:
            out[i] = Candidate(tuple(kb.ids_for_name_index(idx)), kb.names[idx], 0.0)
    return out


def allowed_name_sets(
    kb: KnowledgeBase, allowed: Sequence[Optional[Sequence[str]]]
) -> Optional[List[Optional[np.ndarray]]]:
    """KB name indices of the allowed concepts, per mention (None: unrestricted; None
    overall when no mention is restricted). A mention whose allowed concepts have no
    name gets an empty set, which the decoder treats as unrestricted."""
    sets: List[Optional[np.ndarray]] = []
    for ids in allowed:
        if ids is None:
            sets.append(None)
            continue
        found = [kb.name_index(name) for cid in ids for name in kb.names_of(cid)]
        sets.append(np.fromiter((x for x in found if x is not None), dtype=np.int64))
    if all(s is None for s in sets):
        return None
    n_empty = sum(1 for s in sets if s is not None and not len(s))
    if n_empty:
        logger.debug("%d mentions have no allowed name; decoding them unrestricted", n_empty)
    return sets
