"""recall@k with GenBioEL's rule, and the KB coverage of the gold IDs.

A mention is a hit at ``k`` when the union of the concept IDs of its top-``k``
candidates intersects its gold ID set. A composite mention (``D001|D002``,
``D001+D002``) is one mention and counts once. Mentions without gold IDs
(``-1``, empty) are skipped and counted separately. With a KB, gold IDs missing
from it are counted (all missing / any missing) and reported -- those mentions
stay in the denominator, they are never dropped silently.

The helpers here (:func:`gold_id_set`, :func:`hit_rank`) are the one place
that rule is written; sub-populations, similarity bins, end-to-end scores
and training-time evaluation all use them.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, FrozenSet, Iterable, List, Optional, Sequence, Tuple

from spacy_genbioel.kb.base import KnowledgeBase
from spacy_genbioel.ty import Candidate, Mention

logger = logging.getLogger(__name__)

__all__ = [
    "NO_GOLD_IDS",
    "gold_id_set",
    "hit_rank",
    "check_lengths",
    "ratio",
    "KBCoverage",
    "RecallResult",
    "recall_at_k",
]

#: Gold IDs that mean "no concept" (NCBI-disease / BC5CDR use ``-1``).
NO_GOLD_IDS: FrozenSet[str] = frozenset({"-1", "", "CUI-less", "CUI-LESS"})


def gold_id_set(mention: Mention) -> FrozenSet[str]:
    """The mention's gold concept IDs, without the "no concept" markers."""
    return frozenset(i.strip() for i in mention.ids if i.strip() not in NO_GOLD_IDS)


def hit_rank(gold: Iterable[str], candidates: Sequence[Candidate]) -> Optional[int]:
    """The smallest ``k`` (1-based) at which the top-``k`` candidate IDs meet ``gold``; None if never."""
    gold_set = gold if isinstance(gold, (set, frozenset)) else set(gold)
    if not gold_set:
        return None
    for rank, candidate in enumerate(candidates, start=1):
        if gold_set.intersection(candidate.ids):
            return rank
    return None


def check_lengths(gold: Sequence[Any], predictions: Sequence[Any]) -> None:
    """Gold mentions and prediction lists run in parallel: fail loudly when they do not."""
    if len(gold) != len(predictions):
        raise ValueError(f"{len(gold)} gold mentions but {len(predictions)} prediction lists")


def ratio(num: int, den: int) -> Optional[float]:
    """``num / den``, None for an empty denominator (a rate of nothing is undefined, not 0)."""
    return num / den if den else None


# -- recall@k ---------------------------------------------------------------


@dataclass
class KBCoverage:
    """How many evaluated gold mentions have their IDs in the KB.

    ``n_any_missing`` includes ``n_all_missing``. Those mentions stay in the
    recall denominator (a linker restricted to the KB cannot get them right,
    or only partly).
    """

    n_mentions: int = 0
    n_all_in_kb: int = 0
    n_any_missing: int = 0
    n_all_missing: int = 0
    missing_ids: List[str] = field(default_factory=list)

    @property
    def fraction_all_in_kb(self) -> Optional[float]:
        return ratio(self.n_all_in_kb, self.n_mentions)

    def to_dict(self) -> Dict[str, Any]:
        data = asdict(self)
        data["fraction_all_in_kb"] = self.fraction_all_in_kb
        return data


@dataclass
class RecallResult:
    """recall@k for each ``k``; the denominator is ``n_evaluated``."""

    ks: Tuple[int, ...]
    recall: Dict[int, Optional[float]]
    hits: Dict[int, int]
    n_mentions: int
    n_evaluated: int
    n_no_gold: int
    n_composite: int
    coverage: Optional[KBCoverage] = None

    def __getitem__(self, k: int) -> Optional[float]:
        return self.recall[k]

    def to_dict(self) -> Dict[str, Any]:
        return {
            "ks": list(self.ks),
            "recall": {f"recall@{k}": self.recall[k] for k in self.ks},
            "hits": {f"hits@{k}": self.hits[k] for k in self.ks},
            "n_mentions": self.n_mentions,
            "n_evaluated": self.n_evaluated,
            "n_no_gold": self.n_no_gold,
            "n_composite": self.n_composite,
            "coverage": self.coverage.to_dict() if self.coverage is not None else None,
        }


def recall_at_k(
    gold: Sequence[Mention],
    predictions: Sequence[Sequence[Candidate]],
    ks: Sequence[int] = (1, 5),
    kb: Optional[KnowledgeBase] = None,
) -> RecallResult:
    """GenBioEL's recall@k, with the mentions without gold skipped and counted.

    A mention is a hit at ``k`` when the union of the IDs of its top-``k``
    candidates intersects its gold IDs; a composite mention counts once. With
    ``kb``, gold IDs absent from the KB are counted in ``coverage`` (and logged)
    but the mentions stay in the denominator.
    """
    check_lengths(gold, predictions)
    ks = tuple(sorted({int(k) for k in ks}))
    if not ks or ks[0] < 1:
        raise ValueError(f"ks must be positive integers, got {ks}")
    hits = {k: 0 for k in ks}
    n_evaluated = n_no_gold = n_composite = 0
    coverage = KBCoverage() if kb is not None else None
    missing: set = set()
    for mention, candidates in zip(gold, predictions):
        ids = gold_id_set(mention)
        if not ids:
            n_no_gold += 1
            continue
        n_evaluated += 1
        if len(ids) > 1 or mention.is_composite:
            n_composite += 1
        if coverage is not None:
            absent = [i for i in ids if i not in kb]
            coverage.n_mentions += 1
            if not absent:
                coverage.n_all_in_kb += 1
            else:
                coverage.n_any_missing += 1
                missing.update(absent)
                if len(absent) == len(ids):
                    coverage.n_all_missing += 1
        rank = hit_rank(ids, candidates)
        if rank is not None:
            for k in ks:
                if rank <= k:
                    hits[k] += 1
    if coverage is not None:
        coverage.missing_ids = sorted(missing)
        if coverage.n_any_missing:
            logger.warning(
                "%d/%d gold mentions have IDs missing from KB %r (%d with all missing; %d distinct IDs, e.g. %s); "
                "they stay in the recall denominator",
                coverage.n_any_missing,
                coverage.n_mentions,
                kb.name,
                coverage.n_all_missing,
                len(missing),
                ", ".join(coverage.missing_ids[:5]),
            )
    if n_no_gold:
        logger.info("recall@k: skipped %d mentions without gold IDs", n_no_gold)
    return RecallResult(
        ks=ks,
        recall={k: ratio(hits[k], n_evaluated) for k in ks},
        hits=hits,
        n_mentions=len(gold),
        n_evaluated=n_evaluated,
        n_no_gold=n_no_gold,
        n_composite=n_composite,
        coverage=coverage,
    )
