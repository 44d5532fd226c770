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
from pathlib import Path
from typing import Any, Dict, Iterable, Mapping, Optional, Sequence, Tuple

from spacy_genbioel.corpus.load import load_corpus
from spacy_genbioel.evaluation.calibration import DEFAULT_TARGET_PRECISION, CalibrationCurve, write_calibration
from spacy_genbioel.evaluation.plots import plot_calibration, plot_similarity_bins
from spacy_genbioel.evaluation.report import EvaluationReport, evaluate_linker, write_predictions
from spacy_genbioel.kb.base import KnowledgeBase
from spacy_genbioel.linking.settings import NO_RETRIEVER, linking_overrides
from spacy_genbioel.ty import Linker
from spacy_genbioel.util import PathLike

logger = logging.getLogger(__name__)

__all__ = ["EvaluationSetupError", "check_component_overrides", "component_overrides", "run_evaluation", "write_calibration_plot",
           "write_report_json"]



class EvaluationSetupError(ValueError):
    """Evaluation settings that cannot work together (a missing KB or pipeline...)."""


def component_overrides(device: Optional[str] = None, candidates: Optional[str] = None, num_candidates: Optional[int] = None,
                        exact_match: Optional[bool] = None, restrict: Optional[bool] = None,
                        shortcut_threshold: Optional[float] = None, fusion: Optional[PathLike] = None) -> Dict[str, Any]:
    """The ``genbioel`` component settings to override (None: keep the pipeline's), as the
    nested config blocks ``spacy.load`` takes; :func:`check_component_overrides` tells whether they can work."""
    return linking_overrides(device=device, retriever=candidates, num_candidates=num_candidates, exact_match=exact_match,
                             restrict_to_candidates=restrict, shortcut_threshold=shortcut_threshold,
                             fusion=str(fusion) if fusion is not None else None)


def check_component_overrides(config: Mapping[str, Any]) -> None:
    """Fail on overrides that cannot work together (a shortcut without a retriever)."""
    candidates = config.get("candidates", {})
    if candidates.get("retriever") == NO_RETRIEVER and candidates.get("shortcut_threshold") is not None:
        raise EvaluationSetupError("--shortcut-threshold needs a retriever: --candidates tfidf | dense")
    fusion = config.get("fusion")
    if fusion is not None and not Path(fusion).is_file():  # else a pipeline's own fusion.json would stand in for it
        raise EvaluationSetupError(f"--fusion {fusion}: fusion file not found")


def write_report_json(path: PathLike, report: Any) -> None:
    """A report's ``to_dict()`` as indented JSON."""
    Path(path).write_text(json.dumps(report.to_dict(), indent=2), encoding="utf8")


def _pipeline_linker(pipeline: Optional[PathLike], overrides: Dict[str, Any]) -> Tuple[Linker, KnowledgeBase, Dict[str, Any]]:
    """The ``genbioel`` linker of a pipeline (its lazy retriever already fit), its KB and its settings."""
    if pipeline is None:
        raise EvaluationSetupError("--pipeline is required for --linker genbioel")
    check_component_overrides(overrides)
    import spacy

    nlp = spacy.load(pipeline, config={"components": {"genbioel": overrides}})
    component = nlp.get_pipe("genbioel")
    model = component.linker
    getattr(model.candidate_generator, "generator", None)  # fit a lazy retriever before the clock starts
    for retriever in (model.reranker.retrievers.values() if model.reranker is not None else ()):
        getattr(retriever, "generator", None)
    decoding = component.decoding
    run_meta = {"candidates": component.candidates, "num_candidates": decoding.num_candidates,
                "candidates_model": component.candidates_model, "exact_match": decoding.exact_match,
                "restrict_to_candidates": decoding.restrict_to_candidates, "shortcut_threshold": decoding.shortcut_threshold,
                # the pipeline's abstention threshold: recall@k and the calibration curve use every top score regardless
                "threshold": component.output.threshold,
                "fusion": component.fusion.to_dict() if component.fusion is not None else None}
    return model, model.kb, run_meta


def run_evaluation(
    corpus_path: PathLike,
    *,
    fmt: str = "pubtator",
    linker: str = "genbioel",
    model: Optional[PathLike] = None,
    pipeline: Optional[PathLike] = None,
    component_config: Optional[Mapping[str, Any]] = None,
    kb: Optional[PathLike] = None,
    train: Optional[PathLike] = None,
    labels: Iterable[str] = (),
    abbreviations: bool = False,
    crosswalk: Optional[PathLike] = None,
    top_k: int = 5,
    json_path: Optional[PathLike] = None,
    predictions_path: Optional[PathLike] = None,
    plots: Optional[PathLike] = None,
    calibration: Optional[PathLike] = None,
    target_precision: float = DEFAULT_TARGET_PRECISION,
) -> EvaluationReport:
    """Recall@k of ``linker`` on the gold mentions of ``corpus_path``.

    ``linker="genbioel"`` evaluates the ``genbioel`` component of ``pipeline``
    with ``component_config`` (see :func:`component_overrides`) over its own KB;
    any other name is a retriever (:func:`~spacy_genbioel.retrieval.registry.get_retriever`)
    built on ``kb``. ``model`` is the dense encoder directory (``dense``, or
    ``genbioel`` with ``candidates="dense"``). ``train`` adds GenBioEL's
    sub-population table; ``abbreviations`` expands short forms with scispacy
    first (the count is ``report.abbreviations_expanded``). The report, the
    predictions and the similarity-bin plot are written where asked; ``calibration``
    (a ``.json`` path) gets the precision-coverage curve of the top score, and a
    PNG of it beside (same name, ``.png``), with the threshold that reaches
    ``target_precision``.
    """
    mentions, texts = load_corpus(corpus_path, fmt, crosswalk)
    labels = list(labels)
    if labels:
        mentions = [m for m in mentions if m.label in labels]
    train_mentions = load_corpus(train, fmt, crosswalk)[0] if train else None
    n_expanded = None
    if abbreviations:
        from spacy_genbioel.linking.abbreviations import AbbreviationExpander

        mentions, n_expanded = AbbreviationExpander().expand(mentions, texts)
        logger.info("%d mentions expanded from abbreviations", n_expanded)
    if linker == "genbioel":
        overrides = {key: dict(value) if isinstance(value, dict) else value for key, value in (component_config or {}).items()}
        if model and overrides.get("candidates", {}).get("retriever") == "dense":
            overrides["candidates"]["model"] = str(model)
        retriever, knowledge_base, run_meta = _pipeline_linker(pipeline, overrides)
    else:
        if kb is None:
            raise EvaluationSetupError(f"--kb is required for --linker {linker}")
        from spacy_genbioel.retrieval.registry import get_retriever

        knowledge_base = KnowledgeBase.load(kb)
        retriever = get_retriever(linker, knowledge_base, **({"model": model} if model else {}))
        run_meta = {}
    report = evaluate_linker(retriever, mentions, top_k=top_k, train_mentions=train_mentions, kb=knowledge_base, name=linker,
                             target_precision=target_precision)
    report.meta.update({"corpus": str(corpus_path), "abbreviations": abbreviations, "kb_names": knowledge_base.n_names, **run_meta})
    report.abbreviations_expanded = n_expanded
    if json_path:
        write_report_json(json_path, report)
    if predictions_path:
        write_predictions(predictions_path, mentions, report.predictions or [])
    if plots and report.similarity is not None:
        plot_similarity_bins(report.similarity, Path(plots) / f"similarity_bins_{linker}.png")
    if calibration and report.calibration is not None:
        write_calibration(calibration, report.calibration)
        write_calibration_plot([report.calibration], Path(calibration).with_suffix(".png"), target_precision)
    return report


def write_calibration_plot(curves: Sequence[CalibrationCurve], path: PathLike, target_precision: Optional[float] = None) -> Optional[Path]:
    """:func:`~spacy_genbioel.evaluation.plots.plot_calibration`, or a warning without matplotlib (extra ``plots``)."""
    try:
        return plot_calibration(curves, path, target_precision=target_precision)
    except ImportError as err:
        logger.warning("No calibration plot (%s): install the 'plots' extra (matplotlib)", err)
        return None
