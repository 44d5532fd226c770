"""Where a linker fails: GenBioEL's sub-populations (Table 9) and accuracy by
bins of mention / gold-name TF-IDF similarity (ANGEL, Fig. 4).

* :func:`subpopulation_table` -- count and recall@1 on sub-populations of the
  evaluated mentions (single/multi-word, unseen mentions or concepts, ...).
* :func:`similarity_bins` -- accuracy by bins of the max TF-IDF cosine between
  a mention and its gold concepts' names (:mod:`.plots` draws them).
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np

from spacy_genbioel.evaluation.recall import check_lengths, gold_id_set, hit_rank, ratio
from spacy_genbioel.kb.base import KnowledgeBase
from spacy_genbioel.ty import Candidate, Mention

logger = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_BINS",
    "SUBPOPULATIONS",
    "SubpopulationRow",
    "subpopulation_table",
    "SimilarityBin",
    "SimilarityBins",
    "similarity_bins",
]

DEFAULT_BINS: Tuple[float, ...] = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)


# -- GenBioEL Table 9 ---------------------------------------------------------


@dataclass
class SubpopulationRow:
    subset: str
    count: int
    hits: int
    recall_at_1: Optional[float]

    def to_dict(self) -> Dict[str, Any]:
        return asdict(self)


SUBPOPULATIONS = (
    "all",
    "single-word mentions",
    "multi-word mentions",
    "unseen mentions",
    "unseen concepts",
    "not a direct match",
    "top-100 concepts",
)


def subpopulation_table(
    train_mentions: Iterable[Mention],
    eval_mentions: Sequence[Mention],
    predictions: Sequence[Sequence[Candidate]],
    kb: KnowledgeBase,
    *,
    top_n_concepts: int = 100,
) -> List[SubpopulationRow]:
    """GenBioEL's Table 9: count and recall@1 on subpopulations of ``eval_mentions``.

    Mentions without gold IDs are left out of every row. Surfaces are compared
    after ``kb.normalize`` (so ``G6PD-deficiency`` is two words):

    * ``all``: every mention with gold IDs;
    * ``single-word`` / ``multi-word mentions``: one / several tokens in the
      normalized mention;
    * ``unseen mentions``: normalized surface not among the training mentions';
    * ``unseen concepts``: none of the gold IDs occurs in the training mentions;
    * ``not a direct match``: the normalized mention is not a KB name of any
      gold concept;
    * ``top-100 concepts``: a gold ID is among the ``top_n_concepts`` most
      frequent training concepts (ties: first seen first).
    """
    check_lengths(eval_mentions, predictions)
    normalize = kb.normalize
    train_surfaces = set()
    concept_counts: Counter = Counter()
    for mention in train_mentions:
        train_surfaces.add(normalize(mention.text))
        concept_counts.update(gold_id_set(mention))
    top_concepts = {cid for cid, _ in concept_counts.most_common(top_n_concepts)}
    counts = {name: 0 for name in SUBPOPULATIONS}
    hits = {name: 0 for name in SUBPOPULATIONS}
    for mention, candidates in zip(eval_mentions, predictions):
        ids = gold_id_set(mention)
        if not ids:
            continue
        surface = normalize(mention.text)
        members = ["all"]
        members.append("single-word mentions" if len(surface.split()) <= 1 else "multi-word mentions")
        if surface not in train_surfaces:
            members.append("unseen mentions")
        if not any(i in concept_counts for i in ids):
            members.append("unseen concepts")
        if not any(surface in kb.names_of(i) for i in ids):
            members.append("not a direct match")
        if ids & top_concepts:
            members.append("top-100 concepts")
        hit = hit_rank(ids, candidates[:1]) is not None
        for name in members:
            counts[name] += 1
            hits[name] += int(hit)
    rows = []
    for name in SUBPOPULATIONS:
        label = name if name != "top-100 concepts" or top_n_concepts == 100 else f"top-{top_n_concepts} concepts"
        rows.append(SubpopulationRow(label, counts[name], hits[name], ratio(hits[name], counts[name])))
    return rows


# -- similarity bins (ANGEL Fig. 4) -----------------------------------------


@dataclass
class SimilarityBin:
    low: float
    high: float
    count: int
    hits: int
    accuracy: Optional[float]

    @property
    def label(self) -> str:
        return f"[{self.low:.2f}, {self.high:.2f}{']' if self.high >= 1.0 else ')'}"

    def to_dict(self) -> Dict[str, Any]:
        data = asdict(self)
        data["label"] = self.label
        return data


@dataclass
class SimilarityBins:
    """Accuracy (recall@1) by bin of max TF-IDF cosine between mention and gold names.

    Bins are ``[edge_i, edge_i+1)``, the last one closed. ``n_no_gold``
    mentions had no gold IDs; ``n_no_gold_names`` had gold IDs none of which
    has a name in the KB (no similarity is defined; they are in no bin).
    """

    edges: Tuple[float, ...]
    bins: List[SimilarityBin]
    n_no_gold: int = 0
    n_no_gold_names: int = 0

    def to_dict(self) -> Dict[str, Any]:
        return {
            "edges": list(self.edges),
            "bins": [b.to_dict() for b in self.bins],
            "n_no_gold": self.n_no_gold,
            "n_no_gold_names": self.n_no_gold_names,
        }


def similarity_bins(
    eval_mentions: Sequence[Mention],
    predictions: Sequence[Sequence[Candidate]],
    kb: KnowledgeBase,
    bins: Sequence[float] = DEFAULT_BINS,
    *,
    tfidf: Optional[Any] = None,
) -> SimilarityBins:
    """Accuracy by bins of TF-IDF similarity between mentions and their gold names (ANGEL Fig. 4).

    The similarity of a mention is the max cosine, in a character 3-gram
    (``char_wb``) TF-IDF space fit on the KB names, between the normalized
    mention and any KB name of any of its gold concepts. Pass ``tfidf`` (a
    :class:`~spacy_genbioel.retrieval.tfidf.TfidfLinker` on ``kb``) to reuse a fit
    vectorizer.
    """
    check_lengths(eval_mentions, predictions)
    edges = tuple(float(b) for b in bins)
    if len(edges) < 2 or not all(a < b for a, b in zip(edges, edges[1:])):
        raise ValueError(f"bins must be at least two increasing edges, got {bins}")
    if tfidf is None:
        from spacy_genbioel.retrieval.tfidf import TfidfLinker

        tfidf = TfidfLinker(kb)
    texts: List[str] = []
    gold_names: List[List[str]] = []
    hit_flags: List[bool] = []
    n_no_gold = n_no_gold_names = 0
    for mention, candidates in zip(eval_mentions, predictions):
        ids = gold_id_set(mention)
        if not ids:
            n_no_gold += 1
            continue
        names = [name for cid in sorted(ids) for name in kb.names_of(cid)]
        if not names:
            n_no_gold_names += 1
            continue
        texts.append(mention.text)
        gold_names.append(names)
        hit_flags.append(hit_rank(ids, candidates[:1]) is not None)
    sims = tfidf.similarity(texts, gold_names) if texts else np.zeros(0)
    sims = np.clip(np.nan_to_num(sims, nan=0.0), edges[0], edges[-1])
    # interior edges: bin i holds [edges[i], edges[i+1]); the top edge falls in the last bin
    which = np.clip(np.searchsorted(np.asarray(edges[1:-1]), sims, side="right"), 0, len(edges) - 2)
    flags = np.asarray(hit_flags, dtype=bool)
    result = []
    for i in range(len(edges) - 1):
        members = which == i
        count = int(members.sum())
        n_hits = int(flags[members].sum()) if count else 0
        result.append(SimilarityBin(edges[i], edges[i + 1], count, n_hits, ratio(n_hits, count)))
    if n_no_gold_names:
        logger.warning(
            "similarity_bins: %d mentions have no gold concept name in the KB; left out of the bins", n_no_gold_names
        )
    return SimilarityBins(edges, result, n_no_gold, n_no_gold_names)
