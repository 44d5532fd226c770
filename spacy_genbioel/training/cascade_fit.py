"""Fit the cascade (:mod:`spacy_genbioel.linking.reranking.cascade`) on cross-fitted training predictions.

Given a fusion fitted on the same examples (the generator's lists made of forced
scores of the retrievers' candidates), the cascade needs three things, all
chosen on those training predictions, never on dev:

* a retrieval-only fusion: the same features and fit with the generator's lists
  left empty (its weights come out 0), so that a mention can be judged before
  the generator runs;
* ``settle_threshold``: the lowest retrieval-only probability of the best
  concept from which retrieval's answers are right at least
  ``target_precision`` (0.95) of the time (the largest set of most confident
  mentions whose top-1 precision meets the target); mentions at or above it
  skip the generator. ``max_recall_loss`` chooses it for accuracy instead: as
  many settled mentions as keep the cascade's recall@1 (retrieval's answer where
  settled, the fusion's elsewhere) within that of the fusion's;
* ``beam_threshold``: the highest probability below which the retrieved names
  hold the gold concept at most ``beam_reach`` of the time (the largest set of
  least confident mentions that weak): forced scoring reads only the retrieved
  names, so there beam search runs too. (Chosen by reach, not by retrieval's
  top-1 precision: on NCBI training folds, precision <= 0.5 sent 36% of the
  mentions to the beam, reach <= 0.5 sends 9%, the ones forced scoring cannot help.)

A threshold whose target no set of at least ``min_mentions`` mentions meets is
None (that step never triggers). The report gives the shares and precision on
the fit data.

``defer`` names costly retrievers (MiniLM: about 2.4 ms of every mention on one
CPU thread, more than TF-IDF and ResCNN together) that need not run where the
others are sure: a second retrieval-only fusion, with the deferred lists left
empty too, and its own threshold chosen the same way (``cascade["early"]``).
Mentions at or above it are linked before the deferred retrievers run; the rest
get every retriever and the steps above.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from spacy_genbioel.linking.reranking.fusion import GENERATOR, FusionModel, concept_ranks
from spacy_genbioel.training.fusion_fit import FusionExample, fit_fusion

logger = logging.getLogger(__name__)

__all__ = [
    "CascadeTargets",
    "fit_cascade",
    "settle_threshold",
    "settle_for_recall",
    "beam_threshold",
    "top1",
    "without_lists",
]


@dataclasses.dataclass(frozen=True)
class CascadeTargets:
    """What the cascade's thresholds are chosen for."""

    #: top-1 precision the mentions retrieval settles must reach (on NCBI training folds retrieval's
    #: precision plateaus near 0.97: 0.98 settled 11% of dev mentions, 0.95 most of them at no cost on dev)
    target_precision: float = 0.95
    #: how often the retrieved names may hold the gold concept where retrieval looks weak (beam search runs too)
    beam_reach: float = 0.5
    #: the fewest mentions a threshold may be chosen on
    min_mentions: int = 20
    #: instead of a precision: settle as many mentions as keep the cascade's recall@1 on these predictions
    #: (retrieval's answer where settled, the fusion's elsewhere) within this of the fusion's (0.002: 0.2 points)
    max_recall_loss: Optional[float] = None

    def __post_init__(self) -> None:
        for name in ("target_precision", "beam_reach", "max_recall_loss"):
            value = getattr(self, name)
            if value is not None and not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {value}")
        if self.min_mentions < 1:
            raise ValueError("min_mentions must be at least 1")


def settle_threshold(probability: np.ndarray, correct: np.ndarray, target: float, min_mentions: int) -> Optional[float]:
    """The lowest probability whose mentions at or above it reach ``target`` top-1 precision
    (None: no set of at least ``min_mentions`` does)."""
    order = np.argsort(-probability, kind="stable")
    p, hit = probability[order], correct[order].astype(np.float64)
    precision = np.cumsum(hit) / np.arange(1, len(hit) + 1)
    # a threshold must take every mention tied with the last one it takes
    last_of_tie = np.r_[p[1:] != p[:-1], True]
    ok = np.nonzero((precision >= target) & last_of_tie & (np.arange(1, len(p) + 1) >= min_mentions))[0]
    return float(p[ok[-1]]) if len(ok) else None


def settle_for_recall(
    probability: np.ndarray, correct: np.ndarray, fused_correct: np.ndarray, max_loss: float, min_mentions: int
) -> Optional[float]:
    """The lowest probability such that settling every mention at or above it (retrieval's answer, ``correct``)
    and fusing the rest (``fused_correct``) loses at most ``max_loss`` recall@1 against fusing them all
    (None: no set of at least ``min_mentions`` does)."""
    order = np.argsort(-probability, kind="stable")
    p = probability[order]
    loss = np.cumsum(fused_correct[order].astype(np.float64) - correct[order].astype(np.float64)) / max(len(p), 1)
    last_of_tie = np.r_[p[1:] != p[:-1], True]
    ok = np.nonzero((loss <= max_loss + 1e-12) & last_of_tie & (np.arange(1, len(p) + 1) >= min_mentions))[0]
    return float(p[ok[-1]]) if len(ok) else None


def beam_threshold(probability: np.ndarray, reached: np.ndarray, at_most: float, min_mentions: int) -> Optional[float]:
    """The highest probability below which the share of ``reached`` mentions (the gold concept among the
    retrieved names) is at most ``at_most`` (mentions strictly below it get beam search; None: no such set
    of ``min_mentions``)."""
    order = np.argsort(probability, kind="stable")
    p, hit = probability[order], reached[order].astype(np.float64)
    precision = np.cumsum(hit) / np.arange(1, len(hit) + 1)
    first_of_next = np.r_[p[1:] != p[:-1], True]
    ok = np.nonzero((precision <= at_most) & first_of_next & (np.arange(1, len(p) + 1) >= min_mentions))[0]
    if not len(ok):
        return None
    k = ok[-1]
    return float(p[k + 1]) if k + 1 < len(p) else float(np.nextafter(p[k], np.inf))


def without_lists(examples: Sequence[FusionExample], sources: Sequence[str]) -> List[FusionExample]:
    """``examples`` with the lists of ``sources`` left empty (as if they had not run)."""
    return [dataclasses.replace(ex, lists={**ex.lists, **{s: [] for s in sources}}) for ex in examples]


def _reached(model: FusionModel, examples: Sequence[FusionExample]) -> np.ndarray:
    """Whether some retriever's top ``depth`` concepts hold a gold concept, per example."""
    return np.asarray(
        [
            any(
                cid in ex.gold
                for s in model.retriever_sources
                for cid in concept_ranks(ex.lists.get(s, ()), model.depth)
            )
            for ex in examples
        ],
        dtype=bool,
    )


def top1(model: FusionModel, examples: Sequence[FusionExample], kb: Any) -> Tuple[np.ndarray, np.ndarray]:
    """The fused probability of each example's best concept and whether it is gold."""
    priors: Dict[int, Dict[str, float]] = {}
    probability, correct = [], []
    for ex in examples:
        ex_kb = ex.kb if ex.kb is not None else kb
        ranked = model.rank(ex.text, ex.lists, ex_kb, 1, priors.setdefault(id(ex_kb), {}))
        probability.append(ranked[0].score if ranked else 0.0)
        correct.append(bool(ranked) and ranked[0].ids[0] in ex.gold)
    return np.asarray(probability, dtype=np.float64), np.asarray(correct, dtype=bool)


def _settle_fit(
    model: FusionModel,
    examples: Sequence[FusionExample],
    kb: Any,
    targets: CascadeTargets,
    fused_correct: np.ndarray,
    l2: float,
    left_out: Sequence[str],
    anchor: Optional[Mapping[str, float]] = None,
):
    """A fusion without the lists of ``left_out`` fitted on ``examples``, its top-1 probability and
    correctness per example, and the threshold from which it settles a mention (``targets``);
    ``anchor``: the weights ``l2`` pulls toward (:func:`~.fusion_fit.fit_fusion`)."""
    partial = without_lists(examples, left_out)
    settle = fit_fusion(
        partial, kb, model.sources, depth=model.depth, l2=l2, retrievers=model.retrievers, anchor=anchor
    )
    probability, correct = top1(settle, partial, kb)
    if targets.max_recall_loss is not None:
        settle_at = settle_for_recall(
            probability, correct, fused_correct, targets.max_recall_loss, targets.min_mentions
        )
    else:
        settle_at = settle_threshold(probability, correct, targets.target_precision, targets.min_mentions)
    return settle, probability, correct, settle_at


def _weights(model: FusionModel) -> Dict[str, float]:
    return dict(zip(model.features, (round(float(w), 8) for w in model.weights)))


def fit_cascade(
    model: FusionModel,
    examples: Sequence[FusionExample],
    kb: Any,
    targets: CascadeTargets = CascadeTargets(),
    *,
    l2: float = 1e-3,
    defer: Sequence[str] = (),
    anchor: Optional[FusionModel] = None,
) -> FusionModel:
    """``model`` with its ``cascade`` fitted on ``examples`` (those ``model`` was fitted on); ``defer``:
    retrievers that run only for mentions the others do not settle (none of ``model``'s: no early step);
    ``anchor``: a fusion whose weights ``l2`` pulls the settling weights toward (its early step's for the
    early step, when it has one)."""
    fused_p, fused_correct = top1(model, examples, kb)
    toward = _weights(anchor) if anchor is not None else None
    settle, probability, correct, settle_at = _settle_fit(
        model, examples, kb, targets, fused_correct, l2, [GENERATOR], toward
    )
    reached = _reached(model, examples)
    beam_below = beam_threshold(probability, reached, targets.beam_reach, targets.min_mentions)
    settled = probability >= settle_at if settle_at is not None else np.zeros(len(probability), dtype=bool)
    beamed = (probability < beam_below) & ~settled if beam_below is not None else np.zeros(len(probability), dtype=bool)
    n = max(len(examples), 1)
    report = {
        "mentions": len(examples),
        "settled_share": round(float(settled.mean()) if len(settled) else 0.0, 4),
        "settled_precision": round(float(correct[settled].mean()), 4) if settled.any() else None,
        "fusion_precision_on_settled": round(float(fused_correct[settled].mean()), 4) if settled.any() else None,
        "beam_share": round(float(beamed.sum()) / n, 4),
        "reach_where_beam": round(float(reached[beamed].mean()), 4) if beamed.any() else None,
        "retrieval_reach": round(float(reached.mean()) if len(reached) else 0.0, 4),
        "retrieval_recall@1": round(float(correct.mean()) if len(correct) else 0.0, 4),
        "fusion_recall@1": round(float(fused_correct.mean()) if len(fused_correct) else 0.0, 4),
        "cascade_recall@1_without_beam": round(
            float(np.where(settled, correct, fused_correct).mean()) if n else 0.0, 4
        ),
    }
    cascade: Dict[str, Any] = {
        "settle_weights": _weights(settle),
        "settle_threshold": settle_at,
        "beam_threshold": beam_below,
        "targets": dataclasses.asdict(targets),
        "report": report,
    }
    deferred = [s for s in model.retriever_sources if s in set(defer)]
    if deferred and len(deferred) < len(model.retriever_sources):
        early_toward = toward
        if anchor is not None and isinstance((anchor.cascade or {}).get("early"), dict):
            early_toward = dict(anchor.cascade["early"].get("weights") or {})
        early, early_p, early_correct, early_at = _settle_fit(
            model, examples, kb, targets, fused_correct, l2, [GENERATOR, *deferred], early_toward
        )
        first = early_p >= early_at if early_at is not None else np.zeros(len(early_p), dtype=bool)
        report["early_share"] = round(float(first.mean()) if len(first) else 0.0, 4)
        report["early_precision"] = round(float(early_correct[first].mean()), 4) if first.any() else None
        report["settled_share_with_early"] = round(float((first | settled).mean()) if len(first) else 0.0, 4)
        cascade["early"] = {"defer": deferred, "weights": _weights(early), "threshold": early_at}
    out = dataclasses.replace(model, cascade=cascade)
    logger.info("Cascade fitted on %d mentions: %s", len(examples), report)
    return out
