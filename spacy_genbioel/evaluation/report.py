"""Evaluation of linkers: recall@k, GenBioEL's subpopulations, similarity bins, timing.

The recall rule is GenBioEL's: a mention is a hit at ``k`` when the union of
the concept IDs of its top-``k`` candidates intersects its gold ID set. A
composite mention (``D001|D002``, ``D001+D002``) is one mention and counts
once. Mentions without gold IDs (``-1``, empty) are skipped and counted
separately. With a KB, gold IDs missing from it are counted (all missing /
any missing) and reported -- those mentions stay in the denominator, they are
never dropped silently.

* :func:`recall_at_k` -- the rule above, with KB coverage.
* :func:`subpopulation_table` -- GenBioEL's Table 9 rows (count and recall@1).
* :func:`similarity_bins` / :func:`plot_similarity_bins` -- accuracy by bins
  of TF-IDF similarity between the mention and its gold concept's names
  (ANGEL, Fig. 4).
* :func:`evaluate_linker` -- times ``linker.link`` and gathers all of the above
  into an :class:`EvaluationReport`.
"""
from __future__ import annotations

import json
import logging
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Dict, FrozenSet, Iterable, List, Optional, Sequence, Tuple, Union

import numpy as np

from spacy_genbioel.kb.base import KnowledgeBase
from spacy_genbioel.ty import Candidate, Linker, Mention

logger = logging.getLogger(__name__)

__all__ = [
    "NO_GOLD_IDS",
    "gold_id_set",
    "hit_rank",
    "KBCoverage",
    "RecallResult",
    "recall_at_k",
    "SubpopulationRow",
    "subpopulation_table",
    "SimilarityBin",
    "SimilarityBins",
    "similarity_bins",
    "plot_similarity_bins",
    "EvaluationReport",
    "evaluate_linker",
]

#: Gold IDs that mean "no concept" (NCBI-disease / BC5CDR use ``-1``).
NO_GOLD_IDS: FrozenSet[str] = frozenset({"-1", "", "CUI-less", "CUI-LESS"})

DEFAULT_BINS: Tuple[float, ...] = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)


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


def _check_lengths(gold: Sequence[Any], predictions: Sequence[Any]) -> None:
    if len(gold) != len(predictions):
        raise ValueError(f"{len(gold)} gold mentions but {len(predictions)} prediction lists")


def _ratio(num: int, den: int) -> Optional[float]:
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
        return _ratio(self.n_all_in_kb, self.n_mentions)

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
    _check_lengths(gold, predictions)
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
        recall={k: _ratio(hits[k], n_evaluated) for k in ks},
        hits=hits,
        n_mentions=len(gold),
        n_evaluated=n_evaluated,
        n_no_gold=n_no_gold,
        n_composite=n_composite,
        coverage=coverage,
    )


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
    _check_lengths(eval_mentions, predictions)
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
        rows.append(SubpopulationRow(label, counts[name], hits[name], _ratio(hits[name], counts[name])))
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
    :class:`~spacy_genbioel.retrieval.peers.TfidfLinker` on ``kb``) to reuse a fit
    vectorizer.
    """
    _check_lengths(eval_mentions, predictions)
    edges = tuple(float(b) for b in bins)
    if len(edges) < 2 or not all(a < b for a, b in zip(edges, edges[1:])):
        raise ValueError(f"bins must be at least two increasing edges, got {bins}")
    if tfidf is None:
        from spacy_genbioel.retrieval.peers import TfidfLinker

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
        result.append(SimilarityBin(edges[i], edges[i + 1], count, n_hits, _ratio(n_hits, count)))
    if n_no_gold_names:
        logger.warning("similarity_bins: %d mentions have no gold concept name in the KB; left out of the bins", n_no_gold_names)
    return SimilarityBins(edges, result, n_no_gold, n_no_gold_names)


def plot_similarity_bins(
    result: Union[SimilarityBins, Dict[str, Any]],
    path: Union[str, Path],
    *,
    title: str = "Accuracy by mention / gold-name TF-IDF similarity",
) -> Path:
    """Bar chart (PNG) of accuracy per similarity bin, with counts on the bars.

    Uses matplotlib's Agg canvas directly (imported lazily), so no global
    backend is switched.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    data = result.to_dict() if isinstance(result, SimilarityBins) else result
    rows = data["bins"]
    labels = [row.get("label") or f"[{row['low']:.2f}, {row['high']:.2f})" for row in rows]
    accuracy = [row["accuracy"] if row["accuracy"] is not None else 0.0 for row in rows]
    counts = [row["count"] for row in rows]
    fig = Figure(figsize=(6.4, 4.0))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    bars = ax.bar(range(len(rows)), accuracy, color="#4c72b0")
    for bar, count in zip(bars, counts):
        ax.annotate(f"n={count}", (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels(labels, fontsize=8)
    ax.set_ylim(0, 1.1)
    ax.set_xlabel("max TF-IDF cosine(mention, gold concept names)")
    ax.set_ylabel("accuracy (recall@1)")
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(str(path), format="png", dpi=100)
    return path


# -- report -------------------------------------------------------------------

def _fmt(value: Optional[float], digits: int = 4) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


@dataclass
class EvaluationReport:
    """Everything :func:`evaluate_linker` measured."""

    linker: str
    n_mentions: int
    top_k: int
    seconds: float
    mentions_per_second: Optional[float]
    recall: RecallResult
    subpopulations: Optional[List[SubpopulationRow]] = None
    similarity: Optional[SimilarityBins] = None
    meta: Dict[str, Any] = field(default_factory=dict)
    #: the linker's ranked candidates per mention (not part of ``to_dict``; see :func:`write_predictions`)
    predictions: Optional[List[List[Candidate]]] = field(default=None, repr=False)

    def to_dict(self) -> Dict[str, Any]:
        return {
            "linker": self.linker,
            "n_mentions": self.n_mentions,
            "top_k": self.top_k,
            "seconds": self.seconds,
            "mentions_per_second": self.mentions_per_second,
            "recall": self.recall.to_dict(),
            "subpopulations": [row.to_dict() for row in self.subpopulations] if self.subpopulations is not None else None,
            "similarity_bins": self.similarity.to_dict() if self.similarity is not None else None,
            "meta": dict(self.meta),
        }

    def format_table(self) -> str:
        from wasabi import table

        rec = self.recall
        speed = f"{self.mentions_per_second:.1f}" if self.mentions_per_second is not None else "-"
        summary = [
            ("linker", self.linker),
            ("mentions", self.n_mentions),
            ("evaluated (with gold IDs)", rec.n_evaluated),
            ("skipped (no gold ID)", rec.n_no_gold),
            ("composite", rec.n_composite),
            ("link seconds", f"{self.seconds:.3f}"),
            ("mentions/s", speed),
        ]
        summary += [(f"recall@{k}", f"{_fmt(rec.recall[k])} ({rec.hits[k]}/{rec.n_evaluated})") for k in rec.ks]
        cov = rec.coverage
        if cov is not None:
            summary += [
                ("gold all in KB", f"{cov.n_all_in_kb}/{cov.n_mentions}"),
                ("gold any missing from KB", cov.n_any_missing),
                ("gold all missing from KB", cov.n_all_missing),
            ]
        parts = [table(summary, header=("", "value"), divider=True)]
        if self.subpopulations is not None:
            rows = [(r.subset, r.count, _fmt(r.recall_at_1)) for r in self.subpopulations]
            parts.append(table(rows, header=("subpopulation", "count", "recall@1"), divider=True, aligns=("l", "r", "r")))
        if self.similarity is not None:
            rows = [(b.label, b.count, _fmt(b.accuracy)) for b in self.similarity.bins]
            rows.append(("no gold name in KB", self.similarity.n_no_gold_names, "-"))
            parts.append(table(rows, header=("tf-idf similarity", "count", "accuracy"), divider=True, aligns=("l", "r", "r")))
        return "\n".join(parts)


def _linker_name(linker: Any) -> str:
    name = getattr(linker, "name", None)
    return name if isinstance(name, str) and name else type(linker).__name__


def evaluate_linker(
    linker: Linker,
    mentions: Sequence[Mention],
    top_k: int = 5,
    train_mentions: Optional[Iterable[Mention]] = None,
    kb: Optional[KnowledgeBase] = None,
    *,
    ks: Optional[Sequence[int]] = None,
    bins: Optional[Sequence[float]] = DEFAULT_BINS,
    name: Optional[str] = None,
) -> EvaluationReport:
    """Run ``linker.link(mentions, top_k)``, time it, and evaluate.

    ``kb`` defaults to ``linker.kb`` when the linker has one; with a KB the
    report has KB coverage and similarity bins (unless ``bins=None``), and with
    ``train_mentions`` too, GenBioEL's subpopulation table. ``ks`` defaults to
    1, 5 and ``top_k`` (those not above ``top_k``).
    """
    mentions = list(mentions)
    if kb is None:
        kb = getattr(linker, "kb", None)
        if not isinstance(kb, KnowledgeBase):
            kb = None
    if ks is None:
        ks = sorted({k for k in (1, 5, top_k) if 1 <= k <= max(1, top_k)})
    start = time.perf_counter()
    predictions = linker.link(mentions, top_k=top_k)
    seconds = time.perf_counter() - start
    _check_lengths(mentions, predictions)
    label = name or _linker_name(linker)
    logger.info("%s: linked %d mentions in %.3f s", label, len(mentions), seconds)
    recall = recall_at_k(mentions, predictions, ks=ks, kb=kb)
    subpopulations = None
    similarity = None
    if kb is not None and train_mentions is not None:
        subpopulations = subpopulation_table(train_mentions, mentions, predictions, kb)
    if kb is not None and bins is not None:
        from spacy_genbioel.retrieval.peers import TfidfLinker

        tfidf = None
        if isinstance(linker, TfidfLinker) and linker.kb is kb:
            params = linker.vectorizer.get_params()
            if params["analyzer"] == "char_wb" and tuple(params["ngram_range"]) == (3, 3) and params["min_df"] == 1:
                tfidf = linker  # same vectorizer as similarity_bins would fit
        similarity = similarity_bins(mentions, predictions, kb, bins, tfidf=tfidf)
    return EvaluationReport(
        linker=label,
        n_mentions=len(mentions),
        top_k=top_k,
        seconds=seconds,
        mentions_per_second=(len(mentions) / seconds) if seconds > 0 else None,
        recall=recall,
        subpopulations=subpopulations,
        similarity=similarity,
        meta={"kb": kb.name if kb is not None else None, "kb_concepts": len(kb) if kb is not None else None},
        predictions=predictions,
    )


def write_predictions(path: Any, mentions: Sequence[Mention], predictions: Sequence[Sequence[Candidate]]) -> int:
    """One JSON line per mention, in corpus order, for error analysis and for
    combining linkers offline: document, offsets, text (after abbreviation
    expansion), gold IDs, the rank of the first hit (:func:`recall_at_k`'s
    rule; None: a miss or no gold) and the ranked candidates as
    ``[ids, name, score]``. Returns the number of lines written."""
    _check_lengths(mentions, predictions)
    with Path(path).open("w", encoding="utf8") as out:
        for m, cands in zip(mentions, predictions):
            gold = gold_id_set(m)
            record = {
                "doc_id": m.doc_id, "start": m.start, "end": m.end, "text": m.text, "gold": list(m.ids),
                "hit_rank": hit_rank(gold, cands) if gold else None,
                "candidates": [[list(c.ids), c.name, round(float(c.score), 6)] for c in cands],
            }
            out.write(json.dumps(record, ensure_ascii=False) + "\n")
    return len(mentions)
