"""Exact dictionary match: the normalized mention looked up in the KB's name index.

The simplest retriever (:class:`~spacy_genbioel.ty.Linker` protocol): mention
texts are normalized with ``kb.normalize``, as every retriever does, so its
recall@1 is the floor the others are measured against.
"""

from __future__ import annotations

from typing import List, Sequence

from spacy_genbioel.kb.base import KnowledgeBase
from spacy_genbioel.ty import Candidate, MentionLike, mention_text

__all__ = ["ExactLinker"]


class ExactLinker:
    """Exact dictionary match on normalized names.

    The normalized mention is looked up in ``kb``'s name index; a hit gives one
    candidate (the name, all the concept IDs it maps to, score 1.0), a miss
    gives no candidates.
    """

    name = "exact"

    def __init__(self, kb: KnowledgeBase) -> None:
        self.kb = kb

    def link(self, mentions: Sequence[MentionLike], top_k: int = 5) -> List[List[Candidate]]:
        results: List[List[Candidate]] = []
        for mention in mentions:
            key = self.kb.normalize(mention_text(mention))
            idx = self.kb.name_index(key)
            if idx is None or top_k <= 0:
                results.append([])
            else:
                results.append([Candidate(tuple(self.kb.ids_for_name_index(idx)), self.kb.names[idx], 1.0)])
        return results
