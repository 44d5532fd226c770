"""The ``evaluate`` workflow as a library function: read the gold mentions,
build the linker (a pipeline's ``genbioel`` or a registered retriever), evaluate
it and write the report, the predictions, the plot and the precision-coverage
curve (:mod:`.calibration`: JSON and PNG).

:func:`run_evaluation` is what ``python -m spacy_genbioel evaluate`` runs
(``--end-to-end`` runs :func:`~spacy_genbioel.evaluation.end_to_end.run_end_to_end`);
settings that cannot work together raise :class:`EvaluationSetupError`.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

from spacy_genbioel.corpus.load import load_corpus
from spacy_genbioel.evaluation.calibration import DEFAULT_TARGET_PRECISION, CalibrationCurve, write_calibration
from spacy_genbioel.evaluation.plots import plot_calibration, plot_similarity_bins
from spacy_genbioel.evaluation.report import EvaluationReport, evaluate_linker, write_predictions
from spacy_genbioel.kb.base import KnowledgeBase
from spacy_genbioel.linking.reranking.fusion import FusionFormatError, resolve_fusion_path
from spacy_genbioel.linking.reranking.settings import NO_FUSION
from spacy_genbioel.linking.settings import NO_RETRIEVER, UnknownSettingError, load_overrides, nested_overrides
from spacy_genbioel.ty import Linker
from spacy_genbioel.util import PathLike, resolve_device

logger = logging.getLogger(__name__)

__all__ = [
    "EvaluationSetupError",
    "GoldOptions",
    "ReportOutputs",
    "check_component_settings",
    "run_evaluation",
    "write_calibration_plot",
    "write_report_json",
]


class EvaluationSetupError(ValueError):
    """Evaluation settings that cannot work together (a missing KB or pipeline...)."""


@dataclass(frozen=True)
class GoldOptions:
    """How the gold mentions are read."""

    #: corpus format: pubtator | bioc | jsonl | askapatient
    fmt: str = "pubtator"
    #: only gold mentions with these labels (empty: all)
    labels: Tuple[str, ...] = ()
    #: old -> new ID TSV applied to gold IDs
    crosswalk: Optional[PathLike] = None
    #: expand short forms with scispacy before linking (None: end to end, leave the pipeline as it is)
    abbreviations: Optional[bool] = False
    #: the training split, for GenBioEL's sub-population table
    train: Optional[PathLike] = None


@dataclass(frozen=True)
class ReportOutputs:
    """What an evaluation writes besides its report, and the precision it reports a threshold for."""

    #: the report as JSON
    json_path: Optional[PathLike] = None
    #: each mention's gold IDs, hit rank and ranked candidates (JSON lines)
    predictions: Optional[PathLike] = None
    #: folder for the similarity-bin plot
    plots: Optional[PathLike] = None
    #: the precision-coverage curve of the top score (JSON, and a PNG beside it)
    calibration: Optional[PathLike] = None
    #: the abstention threshold reported is the one reaching this precision
    target_precision: float = DEFAULT_TARGET_PRECISION


def check_component_settings(settings: Mapping[str, Any]) -> Dict[str, Any]:
    """The ``genbioel`` settings (dotted or bare names) as nested config overrides, or
    :class:`EvaluationSetupError` for settings that cannot work together (a shortcut
    without a retriever, a fusion file that is not there)."""
    try:
        nested = nested_overrides(settings)
    except UnknownSettingError as err:
        raise EvaluationSetupError(str(err)) from None
    candidates = nested.get("candidates", {})
    if candidates.get("retriever") == NO_RETRIEVER and candidates.get("shortcut_threshold") is not None:
        raise EvaluationSetupError(
            "candidates.shortcut_threshold needs a retriever: candidates.retriever tfidf | dense"
        )
    fusion = nested.get("reranker", {}).get("fusion")
    try:
        fusion_file = resolve_fusion_path(fusion) if fusion not in (None, NO_FUSION) else None
    except FusionFormatError as err:
        raise EvaluationSetupError(str(err)) from None
    if fusion_file is not None and not fusion_file.is_file():  # else a pipeline's own fusion.json would stand in for it
        raise EvaluationSetupError(
            f"reranker.fusion {fusion}: "
            + ("a folder, not a fusion file" if Path(fusion).is_dir() else "fusion file not found")
        )
    device = nested.get("device")
    if device is not None:
        try:
            resolve_device(device)
        except (ValueError, RuntimeError) as err:  # no CUDA, or a malformed device
            raise EvaluationSetupError(str(err)) from None
    return nested


def write_report_json(path: PathLike, report: Any) -> None:
    """A report's ``to_dict()`` as indented JSON."""
    Path(path).write_text(json.dumps(report.to_dict(), indent=2), encoding="utf8")


def _pipeline_linker(
    pipeline: Optional[PathLike], settings: Mapping[str, Any]
) -> Tuple[Linker, KnowledgeBase, Dict[str, Any]]:
    """The ``genbioel`` component of a pipeline (its lazy retrievers already fit), its KB and its settings."""
    if pipeline is None:
        raise EvaluationSetupError("a pipeline is required to evaluate the genbioel linker")
    overrides = check_component_settings(settings)
    import spacy

    if not (Path(pipeline) / "config.cfg").is_file() and not spacy.util.is_package(str(pipeline)):
        raise EvaluationSetupError(
            f"pipeline {pipeline}: not a spaCy pipeline directory (no config.cfg) nor an installed one"
        )

    nlp = spacy.load(pipeline, config={"components": {"genbioel": load_overrides(overrides)}})
    component = nlp.get_pipe("genbioel")
    generator = component.linker
    getattr(generator.retriever, "generator", None)  # fit a lazy retriever before the clock starts
    for retriever in component.reranker.retrievers.values() if component.reranker is not None else ():
        getattr(retriever, "generator", None)
    candidates = component.candidates
    run_meta = {
        "candidates": candidates.retriever,
        "num_candidates": candidates.num_candidates,
        "candidates_model": candidates.model,
        "exact_match": component.decoding.exact_match,
        "restrict_to_candidates": candidates.restrict_to_candidates,
        "shortcut_threshold": candidates.shortcut_threshold,
        # the pipeline's abstention threshold: recall@k and the calibration curve use every top score regardless
        "threshold": component.output.threshold,
        "fusion": component.fusion.to_dict() if component.fusion is not None else None,
    }
    return component, generator.kb, run_meta


def run_evaluation(
    corpus_path: PathLike,
    *,
    linker: str = "genbioel",
    pipeline: Optional[PathLike] = None,
    kb: Optional[PathLike] = None,
    settings: Optional[Mapping[str, Any]] = None,
    gold: GoldOptions = GoldOptions(),
    outputs: ReportOutputs = ReportOutputs(),
    top_k: int = 5,
) -> EvaluationReport:
    """Recall@k of ``linker`` on the gold mentions of ``corpus_path``.

    ``linker="genbioel"`` evaluates the ``genbioel`` component of ``pipeline``
    over its own KB, with ``settings`` over its config (dotted or bare names:
    ``{"candidates.retriever": "tfidf", "decoding.num_beams": 10}``); any other
    name is a retriever (:func:`~spacy_genbioel.retrieval.registry.get_retriever`)
    built on ``kb`` with ``settings`` as its keyword settings (``{"model": DIR}``
    for ``dense``). ``gold`` says how the gold mentions are read (with
    ``gold.train``, GenBioEL's sub-population table is added; with
    ``gold.abbreviations``, short forms are expanded with scispacy first and
    counted in ``report.abbreviations_expanded``); ``outputs`` what is written
    besides the report: the report as JSON, the predictions, the similarity-bin
    plot, and the precision-coverage curve of the top score (a ``.json`` path; a
    PNG of it beside), with the threshold that reaches ``outputs.target_precision``.
    """
    mentions, texts = load_corpus(corpus_path, gold.fmt, gold.crosswalk)
    labels = list(gold.labels)
    if labels:
        mentions = [m for m in mentions if m.label in labels]
    train_mentions = load_corpus(gold.train, gold.fmt, gold.crosswalk)[0] if gold.train else None
    n_expanded = None
    if gold.abbreviations:
        from spacy_genbioel.linking.inputs.abbreviations import AbbreviationExpander

        mentions, n_expanded = AbbreviationExpander().expand(mentions, texts)
        logger.info("%d mentions expanded from abbreviations", n_expanded)
    if linker == "genbioel":
        retriever, knowledge_base, run_meta = _pipeline_linker(pipeline, settings or {})
    else:
        if kb is None:
            raise EvaluationSetupError(f"a KB is required to evaluate the {linker} linker")
        from spacy_genbioel.retrieval.registry import get_retriever

        knowledge_base = KnowledgeBase.load(kb)
        retriever = get_retriever(linker, knowledge_base, **dict(settings or {}))
        run_meta = {}
    report = evaluate_linker(
        retriever,
        mentions,
        top_k=top_k,
        train_mentions=train_mentions,
        kb=knowledge_base,
        name=linker,
        target_precision=outputs.target_precision,
    )
    report.meta.update(
        {
            "corpus": str(corpus_path),
            "abbreviations": bool(gold.abbreviations),
            "kb_names": knowledge_base.n_names,
            **run_meta,
        }
    )
    report.abbreviations_expanded = n_expanded
    if outputs.json_path:
        write_report_json(outputs.json_path, report)
    if outputs.predictions:
        write_predictions(outputs.predictions, mentions, report.predictions or [])
    if outputs.plots and report.similarity is not None:
        plot_similarity_bins(report.similarity, Path(outputs.plots) / f"similarity_bins_{linker}.png")
    if outputs.calibration and report.calibration is not None:
        write_calibration(outputs.calibration, report.calibration)
        write_calibration_plot(
            [report.calibration], Path(outputs.calibration).with_suffix(".png"), outputs.target_precision
        )
    return report


def write_calibration_plot(
    curves: Sequence[CalibrationCurve], path: PathLike, target_precision: Optional[float] = None
) -> Optional[Path]:
    """:func:`~spacy_genbioel.evaluation.plots.plot_calibration`, or a warning without matplotlib (extra ``plots``)."""
    try:
        return plot_calibration(curves, path, target_precision=target_precision)
    except ImportError as err:
        logger.warning("No calibration plot (%s): install the 'plots' extra (matplotlib)", err)
        return None
