"""The evaluation of a linker on gold mentions: :func:`evaluate_linker` times
``linker.link`` and gathers recall@k and KB coverage (:mod:`.recall`),
sub-populations and similarity bins (:mod:`.analysis`) and the
precision-coverage curve of the top score (:mod:`.calibration`) into an
:class:`EvaluationReport`; :func:`write_predictions` writes each mention's
ranked candidates for error analysis.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Sequence

from spacy_genbioel.evaluation.analysis import (
    DEFAULT_BINS,
    SimilarityBins,
    SubpopulationRow,
    similarity_bins,
    subpopulation_table,
)
from spacy_genbioel.evaluation.calibration import DEFAULT_TARGET_PRECISION, CalibrationCurve, calibration_curve
from spacy_genbioel.evaluation.recall import RecallResult, check_lengths, gold_id_set, hit_rank, recall_at_k
from spacy_genbioel.kb.base import KnowledgeBase
from spacy_genbioel.ty import Candidate, Linker, Mention

logger = logging.getLogger(__name__)

__all__ = ["EvaluationReport", "evaluate_linker", "write_predictions"]


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
    #: precision against coverage when abstaining below a top-score threshold (``to_dict``: its summary)
    calibration: Optional[CalibrationCurve] = None
    meta: Dict[str, Any] = field(default_factory=dict)
    #: the linker's ranked candidates per mention (not part of ``to_dict``; see :func:`write_predictions`)
    predictions: Optional[List[List[Candidate]]] = field(default=None, repr=False)
    #: mentions whose text became an abbreviation's long form before linking (None: no expansion; not in ``to_dict``)
    abbreviations_expanded: Optional[int] = field(default=None, repr=False)

    def to_dict(self) -> Dict[str, Any]:
        return {
            "linker": self.linker,
            "n_mentions": self.n_mentions,
            "top_k": self.top_k,
            "seconds": self.seconds,
            "mentions_per_second": self.mentions_per_second,
            "recall": self.recall.to_dict(),
            "subpopulations": [row.to_dict() for row in self.subpopulations]
            if self.subpopulations is not None
            else None,
            "similarity_bins": self.similarity.to_dict() if self.similarity is not None else None,
            "calibration": self.calibration.summary() if self.calibration is not None else None,
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
        if self.calibration is not None:
            summary += self.calibration.format_rows()
        parts = [table(summary, header=("", "value"), divider=True)]
        if self.subpopulations is not None:
            rows = [(r.subset, r.count, _fmt(r.recall_at_1)) for r in self.subpopulations]
            parts.append(
                table(rows, header=("subpopulation", "count", "recall@1"), divider=True, aligns=("l", "r", "r"))
            )
        if self.similarity is not None:
            rows = [(b.label, b.count, _fmt(b.accuracy)) for b in self.similarity.bins]
            rows.append(("no gold name in KB", self.similarity.n_no_gold_names, "-"))
            parts.append(
                table(rows, header=("tf-idf similarity", "count", "accuracy"), divider=True, aligns=("l", "r", "r"))
            )
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
    bins: Optional[Sequence[float]] = DEFAULT_BINS,
    name: Optional[str] = None,
    target_precision: float = DEFAULT_TARGET_PRECISION,
) -> EvaluationReport:
    """Run ``linker.link(mentions, top_k)``, time it, and evaluate.

    ``kb`` defaults to ``linker.kb`` when the linker has one; with a KB the
    report has KB coverage and similarity bins (unless ``bins=None``), and with
    ``train_mentions`` too, GenBioEL's subpopulation table. Recall is reported
    at 1, 5 and ``top_k`` (those not above ``top_k``). ``target_precision`` is the
    precision whose abstention threshold the calibration summary reports.
    """
    mentions = list(mentions)
    if kb is None:
        kb = getattr(linker, "kb", None)
        if not isinstance(kb, KnowledgeBase):
            kb = None
    ks = sorted({k for k in (1, 5, top_k) if 1 <= k <= max(1, top_k)})
    start = time.perf_counter()
    predictions = linker.link(mentions, top_k=top_k)
    seconds = time.perf_counter() - start
    check_lengths(mentions, predictions)
    label = name or _linker_name(linker)
    logger.info("%s: linked %d mentions in %.3f s", label, len(mentions), seconds)
    recall = recall_at_k(mentions, predictions, ks=ks, kb=kb)
    subpopulations = None
    similarity = None
    if kb is not None and train_mentions is not None:
        subpopulations = subpopulation_table(train_mentions, mentions, predictions, kb)
    if kb is not None and bins is not None:
        from spacy_genbioel.retrieval.tfidf import TfidfLinker

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
        calibration=calibration_curve(mentions, predictions, linker=label, target_precision=target_precision),
        meta={"kb": kb.name if kb is not None else None, "kb_concepts": len(kb) if kb is not None else None},
        predictions=predictions,
    )


def write_predictions(path: Any, mentions: Sequence[Mention], predictions: Sequence[Sequence[Candidate]]) -> int:
    """One JSON line per mention, in corpus order, for error analysis and for
    combining linkers offline: document, offsets, text (after abbreviation
    expansion), gold IDs, the rank of the first hit (:func:`recall_at_k`'s
    rule; None: a miss or no gold) and the ranked candidates as
    ``[ids, name, score]``. Returns the number of lines written."""
    check_lengths(mentions, predictions)
    with Path(path).open("w", encoding="utf8") as out:
        for m, cands in zip(mentions, predictions):
            gold = gold_id_set(m)
            record = {
                "doc_id": m.doc_id,
                "start": m.start,
                "end": m.end,
                "text": m.text,
                "gold": list(m.ids),
                "hit_rank": hit_rank(gold, cands) if gold else None,
                "candidates": [[list(c.ids), c.name, round(float(c.score), 6)] for c in cands],
            }
            out.write(json.dumps(record, ensure_ascii=False) + "\n")
    return len(mentions)
