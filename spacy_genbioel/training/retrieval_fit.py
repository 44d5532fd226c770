"""Fit a retrieval-only fusion (:mod:`spacy_genbioel.linking.reranking.retrieval_only`) on cross-fitted predictions.

What a pipeline with no model links with: exact match, TF-IDF and MiniLM fused
by a conditional logit (:func:`~.fusion_fit.fit_fusion`), with MiniLM deferred
to the mentions the cheap retrievers are unsure of (:func:`~.cascade_fit.fit_cascade`'s
early step, its threshold chosen for a recall budget). The predictions come from
training splits only, each scored as a user's KB would score it:

* ``plain``: the vocabulary as it is (no training names, no priors), every
  training mention scored once: the retrievers learn nothing from them;
* ``aug``: the training split cut into ``k`` folds of whole documents; each
  fold is scored against the vocabulary plus the other folds' mentions as names
  and their gold IDs as priors (``build-kb --augment-pubtator --prior-pubtator``),
  so a mention never finds itself in the dictionary.

Examples of every corpus and both variants are pooled into one fit, so the
weights are one set for any biomedical vocabulary. ``exclude`` drops the
(mention, gold) pairs of evaluation files (AskAPatient's folds share pairs
across training and validation splits).
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, FrozenSet, List, Optional, Sequence, Tuple

import numpy as np

from spacy_genbioel.corpus.folds import assign_folds
from spacy_genbioel.evaluation.recall import NO_GOLD_IDS
from spacy_genbioel.kb.base import KnowledgeBase
from spacy_genbioel.kb.build import augment_kb
from spacy_genbioel.linking.reranking.cascade import early_model
from spacy_genbioel.linking.reranking.fusion import GENERATOR, FusionModel
from spacy_genbioel.training.cascade_fit import CascadeTargets, fit_cascade, settle_for_recall, top1, without_lists
from spacy_genbioel.training.fusion_fit import FusionExample, fit_fusion, mention_pair, score_fusion
from spacy_genbioel.ty import Mention

logger = logging.getLogger(__name__)

__all__ = [
    "FitCorpus",
    "SplitSpec",
    "VARIANTS",
    "crossfit_retrieval",
    "fit_retrieval_fusion",
    "fold_of_mentions",
    "read_fit_corpus",
    "read_splits",
]

#: the dictionaries a training split is scored against
VARIANTS = ("plain", "aug")
#: candidates asked of each retriever, of which the fusion reads the first 5 concepts (``FusionModel.list_depth``):
#: with 5, a list was often one concept's synonyms, certain where it should not be (237 NCBI-disease training
#: mentions at probability 1, 0.23 points of recall lost by settling them early)
LIST_DEPTH = 20

Retrieve = Callable[[str, KnowledgeBase], Any]


@dataclass
class FitCorpus:
    """One training split, read: its name, the vocabulary's KB and the gold mentions."""

    name: str
    kb: KnowledgeBase
    mentions: List[Mention]
    #: (case- and space-folded text, gold IDs) pairs kept out of the fit (:func:`~.fusion_fit.mention_pair`)
    exclude: FrozenSet[Tuple[str, FrozenSet[str]]] = field(default_factory=frozenset)


def _gold(mention: Mention) -> FrozenSet[str]:
    return frozenset(i.strip() for i in mention.ids if i.strip() and i.strip() not in NO_GOLD_IDS)


def fold_of_mentions(mentions: Sequence[Mention], k: int, seed: int = 0) -> List[int]:
    """The fold of each mention: its document's (:func:`~spacy_genbioel.corpus.folds.assign_folds`),
    or, for corpora of phrases without documents (AskAPatient), its text's, so a phrase is never on
    both sides of a fold."""
    keys = [m.doc_id or f"text:{' '.join(m.text.lower().split())}" for m in mentions]
    folds = assign_folds(sorted(set(keys)), k, seed)
    return [folds[key] for key in keys]


@dataclass(frozen=True)
class SplitSpec:
    """Where one corpus's training split and vocabulary are: a KB file (``kb``), or the sources
    ``build-kb`` reads (``kb_sources`` in ``kb_format``, ``FORMAT:PATH`` for another format)."""

    name: str
    train: str
    format: str = "pubtator"
    kb: Optional[str] = None
    kb_format: Optional[str] = None
    kb_sources: Tuple[str, ...] = ()
    crosswalk: Optional[str] = None
    exclude: Tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if (self.kb is None) == (not self.kb_sources):
            raise ValueError(f"split {self.name!r}: give a kb file or kb_sources (with kb_format), not both")
        if self.kb_sources and not self.kb_format:
            raise ValueError(f"split {self.name!r}: kb_sources needs kb_format")

    def load_kb(self) -> KnowledgeBase:
        """The vocabulary as a user has it: no training names, no priors."""
        if self.kb is not None:
            return KnowledgeBase.load(self.kb)
        from spacy_genbioel.kb.build import build_kb, parse_source

        return build_kb(
            self.kb_format, [parse_source(s) for s in self.kb_sources], crosswalk=self.crosswalk, name=self.name
        )


def read_splits(path: Any, data_dir: Optional[Any] = None) -> List[SplitSpec]:
    """The ``[splits.<name>]`` blocks of a config file (``configs/retrieval/default.cfg``), ``${paths.data}``
    set to ``data_dir`` when given; an unknown key or a missing ``train`` raises a ``ValueError`` naming the block."""
    from confection import Config

    overrides = {"paths.data": str(data_dir)} if data_dir is not None else {}
    config = Config().from_disk(path, overrides=overrides)
    blocks = config.get("splits")
    if not isinstance(blocks, dict) or not blocks:
        raise ValueError(f"{path}: no [splits.<name>] blocks")
    known = {f.name for f in dataclasses.fields(SplitSpec)} - {"name"}
    out = []
    for name, block in blocks.items():
        unknown = sorted(set(block) - known)
        if unknown or "train" not in block:
            raise ValueError(
                f"{path}: [splits.{name}] "
                + (f"has unknown keys {unknown} (known: {sorted(known)})" if unknown else "needs a train file")
            )
        values = {k: tuple(v) if isinstance(v, list) else v for k, v in block.items()}
        out.append(SplitSpec(name=name, **values))
    return out


def read_fit_corpus(spec: SplitSpec, *, abbreviations: bool = True) -> FitCorpus:
    """A training split and its vocabulary, read as ``evaluate`` reads them (short forms expanded with
    scispacy when ``abbreviations`` and it is installed); the ``exclude`` files' (mention, gold) pairs,
    in the split's format, stay out of the fit."""
    from spacy_genbioel.corpus.load import load_corpus

    name, train, fmt, crosswalk, exclude = spec.name, spec.train, spec.format, spec.crosswalk, spec.exclude

    mentions, texts = load_corpus(train, fmt, crosswalk)
    if abbreviations and texts:
        from spacy_genbioel.linking.inputs.abbreviations import AbbreviationExpander, abbreviation_detector_available

        if abbreviation_detector_available():
            mentions, _ = AbbreviationExpander().expand(mentions, texts)
        else:
            logger.warning("scispacy is not installed: %s's short forms are left as they are", name)
    held = frozenset(mention_pair(m.text, m.ids) for path in exclude for m in load_corpus(path, fmt, crosswalk)[0])
    return FitCorpus(name, spec.load_kb(), list(mentions), held)


def _score(
    mentions: Sequence[Mention], kb: KnowledgeBase, sources: Sequence[str], retrieve: Retrieve, depth: int
) -> List[FusionExample]:
    lists = {source: retrieve(source, kb).link(list(mentions), depth) for source in sources}
    return [
        FusionExample(m.text, _gold(m), {GENERATOR: [], **{s: lists[s][n] for s in sources}}, kb)
        for n, m in enumerate(mentions)
    ]


def crossfit_retrieval(
    corpus: FitCorpus,
    sources: Sequence[str],
    retrieve: Retrieve,
    *,
    variants: Sequence[str] = VARIANTS,
    k: int = 2,
    seed: int = 0,
    depth: int = LIST_DEPTH,
) -> Dict[str, List[FusionExample]]:
    """Held-out predictions of ``sources`` over ``corpus``'s mentions, per variant (:data:`VARIANTS`);
    ``retrieve(source, kb)`` builds a retriever. Mentions without a gold ID, or excluded, are left out
    of the examples (an excluded mention still names its concept in the other folds' dictionaries)."""
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown:
        raise ValueError(f"unknown variant(s) {unknown}: use {', '.join(VARIANTS)}")
    kept = [m for m in corpus.mentions if _gold(m) and mention_pair(m.text, m.ids) not in corpus.exclude]
    out: Dict[str, List[FusionExample]] = {}
    for variant in variants:
        if variant == "plain":
            out[variant] = _score(kept, corpus.kb, sources, retrieve, depth)
            continue
        folds = fold_of_mentions(corpus.mentions, k, seed)
        fold_of = {id(m): f for m, f in zip(corpus.mentions, folds)}
        examples: List[FusionExample] = []
        for fold in range(k):
            others = [m for m in corpus.mentions if fold_of[id(m)] != fold]
            held = [m for m in kept if fold_of[id(m)] == fold]
            kb, _ = augment_kb(corpus.kb, augment_mentions=others, prior_mentions=others)
            logger.info(
                "%s %s fold %d: %d held-out mentions, %d names", corpus.name, variant, fold, len(held), kb.n_names
            )
            examples.extend(_score(held, kb, sources, retrieve, depth))
        out[variant] = examples
    return out


def fit_retrieval_fusion(
    groups: Dict[str, List[FusionExample]],
    sources: Sequence[str],
    *,
    defer: Sequence[str] = ("dense",),
    targets: CascadeTargets = CascadeTargets(max_recall_loss=0.002),
    depth: int = 5,
    list_depth: Optional[int] = LIST_DEPTH,
    l2: float = 1e-3,
    provenance: Optional[Dict[str, Any]] = None,
) -> FusionModel:
    """A retrieval-only fusion (``generator = "none"``) fitted on every group's examples pooled
    (``{"ncbi/plain": [...], ...}``), with the early step that defers ``defer`` (its threshold chosen for
    ``targets``); the fit report gives each group's recall@1/@5 per source and fused, on the fit data."""
    examples = [ex for group in groups.values() for ex in group]
    if not examples:
        raise ValueError("no training examples to fit the retrieval fusion on")
    model = fit_fusion(examples, None, [GENERATOR, *sources], depth=depth, l2=l2)
    model = dataclasses.replace(model, generator="none", list_depth=list_depth)
    deferred = [s for s in defer if s in sources]
    if deferred:
        model = _early_step(fit_cascade(model, examples, None, targets, l2=l2, defer=deferred), groups, targets)
    model.fit["groups"] = {
        name: {"mentions": len(group), **score_fusion(model, group, None)} for name, group in groups.items()
    }
    for name in model.fit["groups"]:
        model.fit["groups"][name].pop(GENERATOR, None)
    model.fit["recall"].pop(GENERATOR, None)
    if provenance:
        model.fit["provenance"] = provenance
    return model


def _early_step(model: FusionModel, groups: Dict[str, List[FusionExample]], targets: CascadeTargets) -> FusionModel:
    """``model``'s cascade reduced to what a retrieval-only fusion reads, its early step (the fusion without the
    deferred retrievers), with the threshold that keeps *every* group's recall@1 within ``targets.max_recall_loss``
    of the full fusion's: a budget met on the pooled data alone let the early step cost NCBI-disease dev 1.3 points.
    The report gives each group's share settled early and its recall@1 with and without the step."""
    early = early_model(model)
    assert early is not None
    early_fusion, deferred, _ = early
    budget = targets.max_recall_loss if targets.max_recall_loss is not None else 0.0
    thresholds, per_group = [], {}
    for name, group in groups.items():
        full_p, full_correct = top1(model, group, None)
        early_p, early_correct = top1(early_fusion, without_lists(group, deferred), None)
        threshold = settle_for_recall(early_p, early_correct, full_correct, budget, targets.min_mentions)
        thresholds.append(float("inf") if threshold is None else threshold)
        per_group[name] = (early_p, early_correct, full_correct)
    threshold = max(thresholds, default=float("inf"))
    report = {}
    for name, (early_p, early_correct, full_correct) in per_group.items():
        settled = early_p >= threshold
        report[name] = {
            "early_share": round(float(settled.mean()), 4) if len(settled) else 0.0,
            "recall@1": round(float(full_correct.mean()), 4) if len(settled) else 0.0,
            "recall@1_with_early": round(float(np.where(settled, early_correct, full_correct).mean()), 4)
            if len(settled)
            else 0.0,
        }
    cascade = {
        "early": {**model.cascade["early"], "threshold": None if threshold == float("inf") else threshold},
        "targets": dataclasses.asdict(targets),
        "report": report,
    }
    logger.info("Early step: %s deferred, settle at p >= %s: %s", deferred, threshold, report)
    return dataclasses.replace(model, cascade=cascade)
