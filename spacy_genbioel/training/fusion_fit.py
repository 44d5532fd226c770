"""Fit score fusion (:mod:`spacy_genbioel.linking.reranking.fusion`) on cross-fitted predictions.

Input: ``evaluate --predictions`` files of each source (the generator and the
retrievers) over training mentions that the scoring models never saw, from
``python -m spacy_genbioel crossfit`` (folds of whole documents: a model trained on the other
folds scores each fold). Files of one source are concatenated; sources are
joined on the mention (document, offsets, text), so the folds may come in any
order. The fit is a conditional logit: per mention, a softmax over the union
of the sources' top concepts, maximising the probability of the gold concepts,
with an L2 penalty on standardized features. Mentions whose gold concept is in
no source's list teach nothing and are counted apart (``unreachable``).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, FrozenSet, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from spacy_genbioel.evaluation.recall import NO_GOLD_IDS, hit_rank
from spacy_genbioel.linking.reranking.fusion import (
    GENERATOR,
    FusionModel,
    concept_ranks,
    feature_names,
    fusion_features,
)
from spacy_genbioel.ty import Candidate
from spacy_genbioel.util import PathLike

logger = logging.getLogger(__name__)

__all__ = ["FusionExample", "read_fusion_examples", "drop_examples", "fit_fusion", "score_fusion", "choose_sources"]


@dataclass(frozen=True)
class FusionExample:
    """One mention: its text, gold concepts, each source's ranked candidates, and the KB
    its fold was scored with (exact-match and prior features; None: the one given to the fit)."""

    text: str
    gold: FrozenSet[str]
    lists: Dict[str, List[Candidate]]
    kb: Any = None


def _records(path: Path) -> List[Tuple[Tuple[Any, ...], dict]]:
    out = []
    with path.open(encoding="utf8") as lines:
        for lineno, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                key = (record["doc_id"], record["start"], record["end"], record["text"])
                record["candidates"] = [
                    Candidate(tuple(ids), name, float(score)) for ids, name, score in record["candidates"]
                ]
            except (json.JSONDecodeError, KeyError, TypeError, ValueError) as err:
                raise ValueError(f"{path}:{lineno}: not an `evaluate --predictions` line ({err!r})") from None
            out.append((key, record))
    return out


def read_fusion_examples(files: Mapping[str, Sequence[PathLike]], kb: Any = None) -> List[FusionExample]:
    """Examples from prediction files per source (``{"genbioel": [fold0, fold1], "tfidf": [...]}``).

    The generator's files define the mentions; every other source must list the same
    mentions (any order, any split into files), else a ``ValueError`` names the first
    one missing; a mention listed twice is two examples, matched copy by copy. Mentions
    without a gold concept are dropped. ``kb``: the KB these
    predictions were made with (a fold's own, whose dictionary lacks the fold's mentions)."""
    if GENERATOR not in files:
        raise ValueError(f"no {GENERATOR!r} prediction files")
    by_source: Dict[str, Dict[Tuple[Any, ...], dict]] = {}
    for source, paths in files.items():
        table: Dict[Tuple[Any, ...], dict] = {}
        for path in paths:
            for key, record in _records(Path(path)):
                # a corpus may list a mention twice (NCBI-disease's training file has one document twice):
                # the n-th copy in one source is the n-th copy in every other
                copy = 0
                while (*key, copy) in table:
                    copy += 1
                table[(*key, copy)] = record
        by_source[source] = table
    examples = []
    for key, record in by_source[GENERATOR].items():
        gold = frozenset(i.strip() for i in record["gold"] if i.strip() not in NO_GOLD_IDS)
        if not gold:
            continue
        lists = {}
        for source, table in by_source.items():
            if key not in table:
                raise ValueError(
                    f"source {source!r} has no prediction for mention {key} (files {list(map(str, files[source]))})"
                )
            lists[source] = table[key]["candidates"]
        examples.append(FusionExample(record["text"], gold, lists, kb))
    return examples


def mention_pair(text: str, gold: Sequence[str]) -> Tuple[str, FrozenSet[str]]:
    return " ".join(text.lower().split()), frozenset(g.strip() for g in gold if g.strip() not in NO_GOLD_IDS)


def drop_examples(
    examples: Sequence[FusionExample], prediction_files: Sequence[PathLike]
) -> Tuple[List[FusionExample], int]:
    """``examples`` minus those whose (case- and space-folded text, gold concepts) pair is a mention of
    ``prediction_files`` (the evaluation set a fusion will be reported on); also the number dropped."""
    held = {
        mention_pair(record["text"], record["gold"]) for path in prediction_files for _, record in _records(Path(path))
    }
    kept = [ex for ex in examples if mention_pair(ex.text, sorted(ex.gold)) not in held]
    return kept, len(examples) - len(kept)


def _design(examples: Sequence[FusionExample], sources: Sequence[str], depth: int, kb: Any):
    """Padded features ``(n, width, d)``, validity and gold masks, for the examples whose gold is reachable."""
    priors: Dict[int, Dict[str, float]] = {}
    rows = []
    for ex in examples:
        ex_kb = ex.kb if ex.kb is not None else kb
        ids, _, x = fusion_features(ex.text, ex.lists, sources, depth, ex_kb, priors.setdefault(id(ex_kb), {}))
        gold = np.array([cid in ex.gold for cid in ids], dtype=bool)
        if gold.any():
            rows.append((x, gold))
    d = len(feature_names(sources))
    width = max((len(g) for _, g in rows), default=1)
    x = np.zeros((len(rows), width, d))
    valid = np.zeros((len(rows), width), dtype=bool)
    gold = np.zeros((len(rows), width), dtype=bool)
    for i, (xi, gi) in enumerate(rows):
        x[i, : len(gi)], valid[i, : len(gi)], gold[i, : len(gi)] = xi, True, gi
    return x, valid, gold


def _masked_softmax(logits: np.ndarray, mask: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    z = np.where(mask, logits, -np.inf)
    top = z.max(axis=1, keepdims=True)
    e = np.where(mask, np.exp(z - top), 0.0)
    total = e.sum(axis=1, keepdims=True)
    return e / total, (np.log(total) + top)[:, 0]


def fit_fusion(
    examples: Sequence[FusionExample],
    kb: Any,
    sources: Optional[Sequence[str]] = None,
    *,
    depth: int = 5,
    l2: float = 1e-3,
    retrievers: Optional[Dict[str, Dict[str, Any]]] = None,
    anchor: Optional[Mapping[str, float]] = None,
) -> FusionModel:
    """Fit the fusion weights (L-BFGS on the conditional log-likelihood, features standardized
    so that ``l2`` treats them alike; the saved weights apply to raw features).

    ``anchor``: raw weights by feature name (another fusion's, say the shipped retrieval
    fusion fitted on thousands of training mentions) that ``l2`` pulls toward instead of zero;
    a feature it lacks is pulled toward zero. On a few hundred labelled mentions (``fit-fusion
    --model`` on a dev split) the weights then stay near the anchor's unless the split says
    otherwise."""
    from scipy.optimize import minimize

    if sources is None:
        sources = [GENERATOR, *sorted(s for s in examples[0].lists if s != GENERATOR)] if examples else [GENERATOR]
    x, valid, gold = _design(examples, sources, depth, kb)
    if len(x) == 0:
        raise ValueError("no example has its gold concept among the sources' candidates: nothing to fit")
    rows = x[valid]
    mean, scale = rows.mean(axis=0), rows.std(axis=0)
    scale = np.where(scale > 1e-12, scale, np.inf)  # a constant feature gets weight 0
    z = (x - mean) / scale
    n = len(z)
    names = feature_names(sources)
    # the anchor in standardized units (raw weight x the feature's spread; 0 for a constant feature)
    center = np.array([float((anchor or {}).get(f, 0.0)) for f in names]) * np.where(np.isfinite(scale), scale, 0.0)

    def objective(w: np.ndarray) -> Tuple[float, np.ndarray]:
        logits = z @ w
        p, lse_all = _masked_softmax(logits, valid)
        q, lse_gold = _masked_softmax(logits, gold)
        loss = float((lse_all - lse_gold).sum() / n + l2 * (w - center) @ (w - center))
        grad = np.einsum("nc,ncd->d", p - q, z) / n + 2 * l2 * (w - center)
        return loss, grad

    result = minimize(objective, center.copy(), jac=True, method="L-BFGS-B")
    weights = result.x / scale
    model = FusionModel(list(sources), [float(w) for w in weights], depth=depth, retrievers=dict(retrievers or {}))
    model.fit = {
        "mentions": len(examples),
        "reachable": n,
        "unreachable": len(examples) - n,
        "l2": l2,
        **({"anchored": True} if anchor else {}),
        "converged": bool(result.success),
        "loss": round(float(result.fun), 6),
        "standardized_weights": dict(zip(model.features, (round(float(w), 4) for w in result.x))),
        "recall": score_fusion(model, examples, kb),
        # candidates per mention in the generator's lists it was fitted on (beam search: its top_k); the
        # component warns when it links with other lists (linking.component)
        "generator_width": max((len(ex.lists.get(GENERATOR, ())) for ex in examples), default=0),
    }
    logger.info("Fusion fitted on %d mentions (%d reachable): %s", len(examples), n, model.fit["recall"])
    return model


def score_fusion(
    model: FusionModel, examples: Sequence[FusionExample], kb: Any, ks: Sequence[int] = (1, 5)
) -> Dict[str, Dict[str, float]]:
    """recall@k of each source alone, of the fusion, and of the union (``oracle``: the gold concept is in
    some source's top ``depth`` concepts); a candidate hits when any of its IDs is gold, ``evaluate``'s rule."""
    priors: Dict[int, Dict[str, float]] = {}
    hits: Dict[str, Dict[int, int]] = {name: {k: 0 for k in ks} for name in [*model.sources, "fusion"]}
    oracle = 0
    for ex in examples:
        ex_kb = ex.kb if ex.kb is not None else kb
        ranked = model.rank(ex.text, ex.lists, ex_kb, max(ks), priors.setdefault(id(ex_kb), {}))
        for name, cands in [(s, ex.lists.get(s, [])) for s in model.sources] + [("fusion", ranked)]:
            rank = hit_rank(ex.gold, cands[: max(ks)])
            for k in ks:
                hits[name][k] += rank is not None and rank <= k
        oracle += any(cid in ex.gold for s in model.sources for cid in concept_ranks(ex.lists.get(s, ()), model.depth))
    n = max(len(examples), 1)
    report = {name: {f"recall@{k}": round(v / n, 4) for k, v in per_k.items()} for name, per_k in hits.items()}
    report["oracle"] = {"recall": round(oracle / n, 4)}
    return report


def choose_sources(
    folds: Sequence[Sequence[FusionExample]],
    kb: Any,
    alternatives: Sequence[Sequence[str]],
    *,
    depth: int = 5,
    l2: float = 1e-3,
) -> Tuple[List[str], Dict[str, Dict[str, float]]]:
    """The retriever sources the fusion should read, chosen on training predictions only.

    For each alternative (retriever names, e.g. ``["tfidf", "dense"]`` or ``["tfidf", "rescnn"]``), the
    fusion is fitted on all folds but one and scored on the one left out, in turn; the alternative with
    the best pooled held-out recall@1 wins (then recall@5; a tie goes to the one listed first, so list the
    cheaper first). Returns ``([GENERATOR, *chosen], {label: {"recall@1": .., "recall@5": ..}})``."""
    if len(folds) < 2:
        raise ValueError(f"choosing sources needs at least 2 folds of predictions, got {len(folds)}")
    if not alternatives:
        raise ValueError("no alternative source lists to choose from")
    report: Dict[str, Dict[str, float]] = {}
    best: Optional[Tuple[Tuple[float, float], List[str]]] = None
    for alternative in alternatives:
        sources = [GENERATOR, *(s for s in alternative if s != GENERATOR)]
        hits, n = np.zeros(2), 0
        for k, held in enumerate(folds):
            train = [ex for j, fold in enumerate(folds) if j != k for ex in fold]
            recall = score_fusion(fit_fusion(train, kb, sources, depth=depth, l2=l2), held, kb)["fusion"]
            hits += (recall["recall@1"] * len(held), recall["recall@5"] * len(held))
            n += len(held)
        pooled = (round(hits[0] / max(n, 1), 4), round(hits[1] / max(n, 1), 4))
        report["+".join(sources[1:])] = {"recall@1": pooled[0], "recall@5": pooled[1]}
        logger.info("Sources %s: held-out-fold recall@1 %.4f, @5 %.4f", sources, *pooled)
        if best is None or pooled > best[0]:
            best = (pooled, sources)
    assert best is not None
    return best[1], report
