"""End-to-end evaluation: entities found by a pipeline's NER and linked to concepts,
scored against the gold mentions of full documents.

Where :mod:`~spacy_genbioel.evaluation.report` links the gold mentions (recall@k),
this module lets the system find its own mentions: ``doc.ents`` of a spaCy
pipeline, linked by the pipeline itself (``span.kb_id_``, which ``genbioel``
writes) or by an external linker (any :class:`~spacy_genbioel.ty.Linker`:
the retrievers of :mod:`~spacy_genbioel.retrieval.registry`), which then sees the same mentions,
context and abbreviation long forms as ``genbioel`` -- it runs inside the
``genbioel`` component, which builds the mentions.

* :func:`predict_entities` -- run a pipeline (and a linker) over documents.
* :func:`score_end_to_end` -- micro P/R/F1 of predictions against gold.
* :func:`evaluate_end_to_end` -- both, with gold labels mapped to the NER's.
* :func:`run_end_to_end` -- ``python -m spacy_genbioel evaluate --end-to-end``.

Rules (micro-averaged over all documents; a document is its position in the
input, so a PMID that occurs twice is two documents):

* Matching is one-to-one: a gold mention is matched by at most one predicted
  entity and the other way round (a maximum bipartite matching per document), so
  true positives are the same count for precision and recall.
* ``strict``: same character offsets. ``partial``: the spans overlap.
* ``linking``: the span rule, and the predicted concept ID is one of the gold
  mention's IDs. A composite gold mention (``D001|D002``, ``D001+D002``) is one
  mention that a prediction of any of its IDs matches (the GenBioEL/BioSyn rule
  of :mod:`~spacy_genbioel.evaluation.recall`: an entity gets one concept, so asking
  for all parts would make composites unreachable); the report counts
  composites and how many were matched. A predicted entity has one concept ID:
  the first of its top candidate (``genbioel``'s ``span.kb_id_``); entities the
  linker left without an ID are abstentions, not predictions (counted as
  ``predicted_without_id``). Gold mentions without a concept (``-1``, NIL) are
  not gold for linking, and an unmatched prediction that matches a NIL mention
  under the span rule (same offsets; overlap for ``partial``) is ignored rather
  than a false positive (counted as ``ignored_nil``).
* ``linking_top_name``: as ``linking``, but a hit when any concept of the
  top-ranked KB name is gold -- the recall@1 rule of
  :mod:`~spacy_genbioel.evaluation.recall`, which the single ``kb_id`` misses when a
  name names several concepts (MEDIC's ``breast cancer``: a MeSH and an OMIM ID).
* ``ner``: the span rule and the same label (gold labels after the label map,
  e.g. NCBI-disease's four types -> ``Disease``); ``ner_untyped``: the span rule
  only. Concepts play no part, and NIL gold mentions count: they are entities.
* Per label: gold mentions and predictions of that label only, scored as above
  (so a prediction with the wrong label but the right concept is a true positive
  overall and an error in the per-label rows).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Dict, FrozenSet, Iterable, List, Mapping, Optional, Sequence, Tuple

from spacy_genbioel.evaluation.recall import gold_id_set
from spacy_genbioel.linking.settings import load_overrides

if TYPE_CHECKING:
    from spacy.language import Language

    from spacy_genbioel.corpus.pubtator import PubTatorAnnotation, PubTatorDocument
    from spacy_genbioel.evaluation.run import GoldOptions
    from spacy_genbioel.ty import Linker

logger = logging.getLogger(__name__)

__all__ = [
    "EndToEndReport",
    "PRF",
    "PredictedEntity",
    "evaluate_end_to_end",
    "load_pipeline",
    "predict_entities",
    "read_documents",
    "run_end_to_end",
    "score_end_to_end",
]

MODES = ("strict", "partial")
TASKS = ("linking", "linking_top_name", "ner", "ner_untyped")


@dataclass(frozen=True)
class PredictedEntity:
    """One entity a system found: character offsets, label, concept ID (None:
    not linked) and ``ids``, every concept of the top-ranked KB name (a name may
    name several concepts; ``kb_id`` is the first)."""

    start: int
    end: int
    label: str = ""
    kb_id: Optional[str] = None
    ids: Tuple[str, ...] = ()

    @property
    def top_name_ids(self) -> FrozenSet[str]:
        return frozenset(self.ids or ((self.kb_id,) if self.kb_id else ()))


@dataclass
class PRF:
    """True positives, false positives and false negatives, with micro P/R/F1."""

    tp: int = 0
    fp: int = 0
    fn: int = 0

    @property
    def precision(self) -> Optional[float]:
        return self.tp / (self.tp + self.fp) if self.tp + self.fp else None

    @property
    def recall(self) -> Optional[float]:
        return self.tp / (self.tp + self.fn) if self.tp + self.fn else None

    @property
    def f1(self) -> Optional[float]:
        p, r = self.precision, self.recall
        if p is None or r is None:
            return None
        return 2 * p * r / (p + r) if p + r else 0.0

    def add(self, other: "PRF") -> None:
        self.tp += other.tp
        self.fp += other.fp
        self.fn += other.fn

    def to_dict(self) -> Dict[str, Any]:
        return {
            "precision": self.precision,
            "recall": self.recall,
            "f1": self.f1,
            "tp": self.tp,
            "fp": self.fp,
            "fn": self.fn,
        }


def _scores() -> Dict[str, Dict[str, PRF]]:
    return {task: {mode: PRF() for mode in MODES} for task in TASKS}


@dataclass
class EndToEndReport:
    """``scores[task][mode]`` and ``per_label[label][task][mode]`` (see the module docstring)."""

    scores: Dict[str, Dict[str, PRF]] = field(default_factory=_scores)
    per_label: Dict[str, Dict[str, Dict[str, PRF]]] = field(default_factory=dict)
    counts: Counter = field(default_factory=Counter)
    meta: Dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> Dict[str, Any]:
        def table(scores: Dict[str, Dict[str, PRF]]) -> Dict[str, Any]:
            return {task: {mode: prf.to_dict() for mode, prf in modes.items()} for task, modes in scores.items()}

        return {
            **table(self.scores),
            "per_label": {label: table(scores) for label, scores in sorted(self.per_label.items())},
            "counts": dict(self.counts),
            "meta": dict(self.meta),
        }

    def format_table(self) -> str:
        from wasabi import table

        def fmt(value: Optional[float]) -> str:
            return "-" if value is None else f"{value:.4f}"

        def rows(label: str, scores: Dict[str, Dict[str, PRF]]) -> List[Tuple[Any, ...]]:
            return [
                (label, task, mode, fmt(prf.precision), fmt(prf.recall), fmt(prf.f1), prf.tp, prf.fp, prf.fn)
                for task, modes in scores.items()
                for mode, prf in modes.items()
            ]

        lines = rows("all", self.scores)
        for label, scores in sorted(self.per_label.items()):
            lines += rows(label, scores)
        header = ("label", "task", "match", "P", "R", "F1", "tp", "fp", "fn")
        parts = [table(lines, header=header, divider=True, aligns=("l", "l", "l", "r", "r", "r", "r", "r", "r"))]
        parts.append(table(sorted(self.counts.items()), header=("count", "value"), divider=True))
        return "\n".join(parts)


# -- scoring -------------------------------------------------------------------------------
def _same_span(a: Any, b: Any) -> bool:
    return a.start == b.start and a.end == b.end


def _overlap(a: Any, b: Any) -> bool:
    return a.start < b.end and b.start < a.end


SPAN_RULES: Dict[str, Callable[[Any, Any], bool]] = {"strict": _same_span, "partial": _overlap}


def _max_matching(predicted: Sequence[Any], gold: Sequence[Any], ok: Callable[[Any, Any], bool]) -> Dict[int, int]:
    """A maximum one-to-one matching (augmenting paths): gold index -> predicted index."""
    edges = [[g for g, gold_item in enumerate(gold) if ok(pred, gold_item)] for pred in predicted]
    owner: Dict[int, int] = {}

    def assign(p: int, seen: set) -> bool:
        for g in edges[p]:
            if g in seen:
                continue
            seen.add(g)
            if g not in owner or assign(owner[g], seen):
                owner[g] = p
                return True
        return False

    for p in range(len(predicted)):
        assign(p, set())
    return owner


def _has_concept(ann: "PubTatorAnnotation") -> bool:
    return not ann.nil and bool(gold_id_set(ann))  # type: ignore[arg-type]  (reads only .ids)


def _is_composite(ann: "PubTatorAnnotation") -> bool:
    return ann.composite or len(ann.ids) > 1


def _score_document(
    gold: Sequence["PubTatorAnnotation"], predicted: Sequence[PredictedEntity], counts: Optional[Counter] = None
) -> Dict[str, Dict[str, PRF]]:
    scores = _scores()
    linkable = [g for g in gold if _has_concept(g)]
    nil = [g for g in gold if not _has_concept(g)]
    linked = [p for p in predicted if p.kb_id]
    concept_rules: Dict[str, Callable[[PredictedEntity, Any], bool]] = {
        "linking": lambda p, g: p.kb_id in gold_id_set(g),
        "linking_top_name": lambda p, g: bool(p.top_name_ids & gold_id_set(g)),
    }
    for mode, span_ok in SPAN_RULES.items():
        for task, concept_ok in concept_rules.items():
            owner = _max_matching(
                linked,
                linkable,
                lambda p, g, span_ok=span_ok, concept_ok=concept_ok: span_ok(p, g) and concept_ok(p, g),
            )
            matched = set(owner.values())
            ignored = sum(1 for i, p in enumerate(linked) if i not in matched and any(span_ok(p, g) for g in nil))
            prf = scores[task][mode]
            prf.tp, prf.fn = len(owner), len(linkable) - len(owner)
            prf.fp = len(linked) - len(owner) - ignored
            if counts is not None and task == "linking":
                counts[f"ignored_nil_{mode}"] += ignored
                counts[f"composite_matched_{mode}"] += sum(1 for g in owner if _is_composite(linkable[g]))
        # ner: spans (and labels) only, NIL mentions included
        for task, rule in (
            ("ner", lambda p, g, span_ok=span_ok: span_ok(p, g) and p.label == g.type),
            ("ner_untyped", span_ok),
        ):
            n_matched = len(_max_matching(predicted, gold, rule))
            prf = scores[task][mode]
            prf.tp, prf.fp, prf.fn = n_matched, len(predicted) - n_matched, len(gold) - n_matched
    return scores


def _accumulate(total: Dict[str, Dict[str, PRF]], scores: Dict[str, Dict[str, PRF]]) -> None:
    for task, modes in scores.items():
        for mode, prf in modes.items():
            total[task][mode].add(prf)


def score_end_to_end(
    gold: Sequence[Sequence["PubTatorAnnotation"]],
    predicted: Sequence[Sequence[PredictedEntity]],
    labels: Iterable[str] = (),
) -> EndToEndReport:
    """Score per-document predictions against per-document gold annotations
    (labels already mapped); ``labels`` keeps only gold and predictions with
    those labels. Rules: see the module docstring."""
    if len(gold) != len(predicted):
        raise ValueError(f"{len(gold)} gold documents but {len(predicted)} predicted ones")
    keep = set(labels)
    report = EndToEndReport()
    counts = report.counts
    per_label: Dict[str, Dict[str, Dict[str, PRF]]] = {}
    for gold_doc, pred_doc in zip(gold, predicted):
        gold_doc = [g for g in gold_doc if not keep or g.type in keep]
        pred_doc = [p for p in pred_doc if not keep or p.label in keep]
        counts["documents"] += 1
        counts["gold_mentions"] += len(gold_doc)
        counts["gold_nil"] += sum(1 for g in gold_doc if not _has_concept(g))
        counts["gold_composite"] += sum(1 for g in gold_doc if _has_concept(g) and _is_composite(g))
        counts["predicted_entities"] += len(pred_doc)
        counts["predicted_without_id"] += sum(1 for p in pred_doc if not p.kb_id)
        _accumulate(report.scores, _score_document(gold_doc, pred_doc, counts))
        for label in {g.type for g in gold_doc} | {p.label for p in pred_doc}:
            scores = _score_document(
                [g for g in gold_doc if g.type == label], [p for p in pred_doc if p.label == label]
            )
            _accumulate(per_label.setdefault(label, _scores()), scores)
    report.per_label = per_label
    for mode in MODES:
        counts.setdefault(f"ignored_nil_{mode}", 0)
        counts.setdefault(f"composite_matched_{mode}", 0)
    return report


# -- prediction --------------------------------------------------------------------------------
def _use_abbreviations(nlp: "Language", abbreviations: bool) -> None:
    """Make the pipeline's ``genbioel`` components use (or not) long forms, and
    add scispacy's detector first when they should and there is none."""
    from spacy_genbioel.linking.component import GenBioELLinker

    for _, component in nlp.pipeline:
        if isinstance(component, GenBioELLinker):
            component.resolve_abbreviations = abbreviations
    if abbreviations and "abbreviation_detector" not in {nlp.get_pipe_meta(n).factory for n in nlp.pipe_names}:
        import scispacy.abbreviation  # noqa: F401  (registers the factory)

        nlp.add_pipe("abbreviation_detector", first=True)


def predict_entities(
    texts: Iterable[str],
    nlp: "Language",
    linker: Optional["Linker"] = None,
    *,
    abbreviations: Optional[bool] = None,
    batch_size: int = 16,
) -> List[List[PredictedEntity]]:
    """``doc.ents`` of ``nlp`` over ``texts``, with ``span.kb_id_`` as concept
    (or, with ``linker``, its top concept for each entity). ``abbreviations``
    True/False switches long forms on/off for ``genbioel`` and the linker (adding
    scispacy's detector when needed); None leaves the pipeline as it is."""
    from spacy_genbioel.linking.component import GenBioELLinker
    from spacy_genbioel.linking.settings import ComponentResources, LinkerSettings

    if abbreviations is not None:
        _use_abbreviations(nlp, abbreviations)
    docs: Iterable[Any] = nlp.pipe(texts, batch_size=batch_size)
    if linker is not None:
        # the genbioel component builds the mentions (context, long forms) and
        # writes the results; the linker only needs the Linker protocol
        has_detector = "abbreviation_detector" in {nlp.get_pipe_meta(n).factory for n in nlp.pipe_names}
        resources = ComponentResources(resolve_abbreviations=bool(abbreviations is not False and has_detector))
        component = GenBioELLinker(nlp.vocab, "external_linker", LinkerSettings(resources=resources))
        component.set_linker(linker)  # type: ignore[arg-type]
        docs = component.pipe(docs, batch_size=batch_size)
    return [
        [PredictedEntity(e.start_char, e.end_char, e.label_, e.kb_id_ or None, _top_name_ids(e)) for e in doc.ents]
        for doc in docs
    ]


def _top_name_ids(span: Any) -> Tuple[str, ...]:
    """The concept IDs of the top-ranked name in ``span._.kb_candidates`` (``genbioel``
    writes one ``(id, name, score)`` per concept of each name), empty without them."""
    from spacy.tokens import Span

    candidates = span._.kb_candidates if Span.has_extension("kb_candidates") else None
    if not candidates:
        return ()
    _, name, score = candidates[0]
    return tuple(cid for cid, other, other_score in candidates if other == name and other_score == score)


def evaluate_end_to_end(
    documents: Sequence["PubTatorDocument"],
    nlp: "Language",
    linker: Optional["Linker"] = None,
    *,
    label_map: Optional[Mapping[str, str]] = None,
    single_label: Optional[str] = None,
    labels: Iterable[str] = (),
    abbreviations: Optional[bool] = None,
    batch_size: int = 16,
) -> EndToEndReport:
    """Run ``nlp`` (and ``linker``) over the documents' texts and score the
    entities against their gold annotations, whose labels go through
    ``label_map`` / ``single_label`` first (as in :mod:`~spacy_genbioel.ner`)."""
    from spacy_genbioel.ner import label_mapper

    map_label = label_mapper(label_map, single_label)
    documents = list(documents)
    began = time.perf_counter()
    predicted = predict_entities(
        [d.text for d in documents], nlp, linker, abbreviations=abbreviations, batch_size=batch_size
    )
    seconds = time.perf_counter() - began
    gold = [[dataclasses.replace(a, type=map_label(a.type)) for a in d.annotations] for d in documents]
    report = score_end_to_end(gold, predicted, labels=labels)
    report.meta.update(
        {
            "pipeline": nlp.pipe_names,
            "linker": type(linker).__name__ if linker is not None else None,
            "seconds": seconds,
            "documents_per_second": len(documents) / seconds if seconds > 0 else None,
            "labels": sorted(set(labels)),
        }
    )
    logger.info("End-to-end: %d documents in %.1f s", len(documents), seconds)
    return report


# -- command line -----------------------------------------------------------------------------
def read_documents(path: Any, fmt: str = "pubtator", crosswalk: Optional[Any] = None) -> List["PubTatorDocument"]:
    """Gold documents of a corpus file (``pubtator``, ``bioc`` or ``jsonl``);
    ``crosswalk`` (a TSV of old -> new IDs) applies to PubTator gold IDs."""
    from spacy_genbioel.corpus.load import DOCUMENT_FORMATS
    from spacy_genbioel.corpus.load import read_documents as read_corpus_documents
    from spacy_genbioel.kb.crosswalk import read_crosswalk

    walk = read_crosswalk(crosswalk) if crosswalk else None
    if fmt not in DOCUMENT_FORMATS:
        raise ValueError(f"end-to-end evaluation needs documents: use pubtator, bioc or jsonl, not {fmt!r}")
    return read_corpus_documents(path, fmt, walk)


def load_pipeline(
    path: Any, *, without_linkers: bool = False, component_config: Optional[Mapping[str, Any]] = None
) -> "Language":
    """``spacy.load`` a pipeline directory; ``without_linkers`` leaves its
    ``genbioel`` components out (their model is not even loaded), otherwise
    ``component_config`` (None values dropped) overrides their settings."""
    from pathlib import Path

    import spacy
    from spacy.util import load_config

    from spacy_genbioel.linking.inputs.abbreviations import abbreviation_detector_available

    abbreviation_detector_available()  # scispacy registers its factory on import
    config = load_config(Path(path) / "config.cfg")
    linkers = [name for name, comp in config["components"].items() if comp.get("factory") == "genbioel"]
    if without_linkers:
        return spacy.load(path, exclude=linkers)
    overrides = {k: v for k, v in (component_config or {}).items() if v is not None}
    return spacy.load(path, config={"components": {name: load_overrides(overrides) for name in linkers}})


def run_end_to_end(
    corpus_path: Any,
    *,
    pipeline: Any,
    linker: str = "genbioel",
    kb: Optional[Any] = None,
    settings: Optional[Mapping[str, Any]] = None,
    gold: Optional["GoldOptions"] = None,
    label_map: Optional[str] = None,
    single_label: Optional[str] = None,
) -> EndToEndReport:
    """``evaluate --end-to-end``: with ``linker="genbioel"`` the pipeline's own
    ``genbioel`` links its entities, with ``settings`` over its config (as
    :func:`~spacy_genbioel.evaluation.run.run_evaluation` takes them); with a peer
    name (``exact``, ``tfidf``, ``scispacy``...) the pipeline's NER runs without its
    ``genbioel`` and the peer, built on ``kb`` with ``settings`` as its keyword
    settings, links. ``gold`` says how the documents are read (``fmt``, ``labels``,
    ``crosswalk``; ``abbreviations`` True/False switches long forms on/off, None
    leaves the pipeline as it is). ``label_map`` is a spec for
    :func:`~spacy_genbioel.ner.parse_label_map` (``ncbi`` for NCBI-disease)."""
    from spacy_genbioel.evaluation.run import GoldOptions, check_component_settings

    gold = gold or GoldOptions(abbreviations=None)
    fmt, labels, abbreviations, crosswalk = gold.fmt, gold.labels, gold.abbreviations, gold.crosswalk
    from spacy_genbioel.ner import parse_label_map

    if pipeline is None:
        raise ValueError("end-to-end evaluation needs a pipeline (pipeline: a spaCy pipeline that sets doc.ents)")
    if label_map and single_label:
        raise ValueError("give a label map or a single label, not both")
    documents = read_documents(corpus_path, fmt, crosswalk)
    peer = None
    kb_name = None
    if linker == "genbioel":
        nlp = load_pipeline(pipeline, component_config=check_component_settings(settings or {}))
        if "genbioel" not in {nlp.get_pipe_meta(n).factory for n in nlp.pipe_names}:
            raise ValueError(f"{pipeline} has no genbioel component: give linker exact, tfidf or scispacy, with kb")
    else:
        if kb is None:
            raise ValueError(f"kb is required for linker {linker}")
        from spacy_genbioel.kb.base import KnowledgeBase
        from spacy_genbioel.retrieval.registry import get_retriever

        knowledge_base = KnowledgeBase.load(kb)
        kb_name = str(kb)
        peer = get_retriever(linker, knowledge_base, **dict(settings or {}))
        nlp = load_pipeline(pipeline, without_linkers=True)
    report = evaluate_end_to_end(
        documents,
        nlp,
        peer,
        label_map=parse_label_map(label_map),
        single_label=single_label,
        labels=labels,
        abbreviations=abbreviations,
    )
    report.meta.update(
        {
            "corpus": str(corpus_path),
            "pipeline_path": str(pipeline),
            "linker": linker,
            "kb": kb_name,
            "abbreviations": abbreviations,
            "label_map": label_map,
            "single_label": single_label,
            "crosswalk": str(crosswalk) if crosswalk else None,
            # abstention (issue 18): an entity its linker scores below the threshold is left without an ID
            "thresholds": {
                name: nlp.get_pipe(name).output.threshold
                for name in nlp.pipe_names
                if linker == "genbioel" and nlp.get_pipe_meta(name).factory == "genbioel"
            },
        }
    )
    return report
