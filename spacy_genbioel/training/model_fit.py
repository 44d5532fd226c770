"""Fit score fusion (and the cascade) for a model not trained here, on a labelled split it has not seen.

Cross-fitting (:mod:`.crossfit`) fits the fusion on held-out predictions of fold models trained from the
same starting point as the final one: impossible for a released BART-large checkpoint on a CPU, whose
training nobody repeats. A released model is a fixed function, so its own predictions on mentions it was
never trained on are held-out predictions already. :func:`fit_model_fusion` makes them in one go, as
``crossfit``'s score step makes a fold's (``evaluate --predictions`` rows,
:func:`~spacy_genbioel.evaluation.run.run_evaluation`):

* the generator's lists, as the cascade will read them: ``beam`` (beam search, no retriever, no exact
  match) or ``forced`` (its forced scores of the retrievers' top ``depth`` candidates);
* each retriever's (``tfidf``, ``dense``) over the same KB;

then fits the fusion and, with ``cascade``, the cascade's retrieval-only weights and thresholds on them
(:func:`fit_predictions`, the fit ``fit-fusion --source`` runs on cross-fitted files). Which split is unseen
depends on the model (docs/published.md, "A released model in the cascade"): the released models were
trained on train+dev of their corpus.

The model is a model folder (a Hugging Face directory: ``import-checkpoint`` output or a trained model),
packaged here without NER or abbreviation detector for the scoring, or a pipeline ``package`` wrote
without a fusion (used as it is, over its own KB).
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

from spacy_genbioel.kb.base import KnowledgeBase
from spacy_genbioel.linking.reranking.fusion import GENERATOR, FusionModel
from spacy_genbioel.training.cascade_fit import CascadeTargets, fit_cascade
from spacy_genbioel.training.fusion_fit import choose_sources, drop_examples, fit_fusion, read_fusion_examples
from spacy_genbioel.util import PathLike

logger = logging.getLogger(__name__)

__all__ = [
    "FitOptions",
    "FittedFusion",
    "HeldOutSplit",
    "ModelFitError",
    "Packaging",
    "fit_model_fusion",
    "fit_predictions",
    "generator_row",
    "model_kb",
    "score_model",
    "scoring_pipeline",
]

#: how the generator's lists are made: beam search, or forced scores of the retrievers' candidates
GENERATOR_LISTS = ("beam", "forced")


class ModelFitError(ValueError):
    """A model, KB or option that cannot be scored or fitted as asked (the message names it)."""


@dataclass(frozen=True)
class FitOptions:
    """How the fusion is fitted on predictions (``fit-fusion``'s options)."""

    #: candidates read from each source
    depth: int = 5
    #: L2 penalty on the standardized weights
    l2: float = 1e-3
    #: how the generator's lists were made: beam or forced
    generator: str = "beam"
    #: the beam width the generator's lists were made at, when not the model config's (recorded in the file)
    generator_beams: Optional[int] = None
    #: also fit the cascade (retrieval-only weights and thresholds)
    cascade: bool = False
    targets: CascadeTargets = CascadeTargets()
    #: costly retrievers that run only where the others do not settle (the cascade's early step)
    defer: Tuple[str, ...] = ()
    #: each retriever's settings at linking time (``{"dense": {"model": DIR}}``)
    retrievers: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    #: a fusion file (or ``genbioel:retrieval``) whose weights ``l2`` pulls toward instead of zero
    anchor: Optional[str] = None

    def __post_init__(self) -> None:
        if self.generator not in GENERATOR_LISTS:
            raise ModelFitError(f"generator must be one of {', '.join(GENERATOR_LISTS)}, got {self.generator!r}")
        if self.defer and not self.cascade:
            raise ModelFitError("defer is a step of the cascade: fit the cascade too")


@dataclass
class FittedFusion:
    """A fitted fusion, the sources it reads and how many examples ``exclude`` dropped."""

    model: FusionModel
    sources: List[str]
    dropped: int = 0


def fit_predictions(
    files: Mapping[str, Sequence[PathLike]],
    kbs: Sequence[Any],
    options: FitOptions = FitOptions(),
    *,
    exclude: Sequence[PathLike] = (),
    alternatives: Sequence[Sequence[str]] = (),
) -> FittedFusion:
    """The fusion (and cascade) fitted on ``evaluate --predictions`` files per source (fold ``i``'s file
    ``i``-th), each fold scored with ``kbs[i]`` (one KB: every fold's); ``exclude``: prediction files whose
    (mention, gold) pairs are kept out; ``alternatives``: retriever sets to choose among on the folds."""
    n_folds = {len(paths) for paths in files.values()}
    if len(n_folds) != 1:
        raise ModelFitError(f"every source needs one file per fold; got {sorted(n_folds)} files")
    folds_count = n_folds.pop()
    if len(kbs) not in (1, folds_count):
        raise ModelFitError(f"give one KB, or one per fold ({folds_count}); got {len(kbs)}")
    folds = [
        read_fusion_examples({s: [paths[i]] for s, paths in files.items()}, kbs[min(i, len(kbs) - 1)])
        for i in range(folds_count)
    ]
    dropped = 0
    if exclude:
        kept = [drop_examples(fold, exclude) for fold in folds]
        folds, dropped = [fold for fold, _ in kept], sum(n for _, n in kept)
    examples = [ex for fold in folds for ex in fold]
    sources = [GENERATOR, *(s for s in files if s != GENERATOR)]
    anchor = FusionModel.load(options.anchor) if options.anchor else None
    toward = dict(zip(anchor.features, anchor.weights)) if anchor is not None else None
    choice = None
    if alternatives:
        sources, choice = choose_sources(folds, kbs[0], alternatives, depth=options.depth, l2=options.l2)
    model = fit_fusion(
        examples,
        kbs[0],
        sources,
        depth=options.depth,
        l2=options.l2,
        retrievers={s: dict(options.retrievers.get(s, {})) for s in sources[1:]},
        anchor=toward,
    )
    model = dataclasses.replace(model, generator=options.generator)
    if options.anchor:
        model.fit["anchor"] = str(options.anchor)
    if choice is not None:
        model.fit["choice"] = choice
    if options.generator_beams is not None:
        model.fit["generator_beams"] = options.generator_beams
    if options.cascade:
        model = fit_cascade(
            model, examples, kbs[0], options.targets, l2=options.l2, defer=list(options.defer), anchor=anchor
        )
    return FittedFusion(model, sources, dropped)


# -- a model's own predictions -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class HeldOutSplit:
    """The labelled split the model is scored on (``evaluate``'s gold options): one it was not trained on."""

    corpus: PathLike
    fmt: str = "pubtator"
    crosswalk: Optional[PathLike] = None
    #: expand short forms with scispacy first (as the packaged pipeline's abbreviation detector does)
    abbreviations: bool = False
    #: only gold mentions with these labels (BC5CDR's ``Disease`` for a model of diseases; empty: all)
    labels: Tuple[str, ...] = ()


def _is_pipeline(path: Path) -> bool:
    return (path / "config.cfg").is_file() and (path / "genbioel" / "cfg.json").is_file()


def model_kb(
    model: PathLike,
    kb: Optional[PathLike],
    *,
    config: Optional[PathLike] = None,
    settings: Optional[Mapping[str, Any]] = None,
) -> Path:
    """The KB file every source links into, once ``model`` is checked: a pipeline ``package`` wrote without a
    fusion links into its own KB (``kb``, if given, must hold the same names and IDs) with its own settings; a
    model folder into ``kb`` (required)."""
    model = Path(model)
    if not model.is_dir():
        raise ModelFitError(f"{model}: model directory not found")
    if _is_pipeline(model):
        from spacy_genbioel.linking.paths import read_component_cfg

        component = model / "genbioel"
        meta = read_component_cfg(component / "cfg.json")
        if not meta.get("has_model", meta.get("has_linker")):
            raise ModelFitError(
                f"{model}: a pipeline without a generator (its retrieval-only fusion comes from fit-retrieval)"
            )
        if (component / "fusion.json").exists():
            raise ModelFitError(
                f"{model}: the pipeline links through its own fusion ({component / 'fusion.json'}), which "
                "would rerank the generator's lists: give its model folder with --kb, or a pipeline "
                "packaged without --fusion"
            )
        if config is not None or settings:
            raise ModelFitError(
                f"{model}: a packaged pipeline keeps its own settings: --config and component settings "
                "are for a model folder"
            )
        if kb is not None and KnowledgeBase.load(kb).checksum() != meta.get("kb_checksum"):
            raise ModelFitError(
                f"{kb}: not the KB the pipeline {model} links into: package the model with this KB, or leave out --kb"
            )
        return Path(kb) if kb is not None else component / "kb.jsonl"
    if not (model / "config.json").is_file():
        raise ModelFitError(
            f"{model}: neither a model folder (config.json) nor a pipeline package wrote (config.cfg, genbioel/)"
        )
    if kb is None:
        raise ModelFitError(f"{model}: a model folder needs the KB it links into (--kb)")
    return Path(kb)


def scoring_pipeline(
    model: PathLike,
    kb: Optional[PathLike],
    folder: PathLike,
    *,
    config: Optional[PathLike] = None,
    settings: Optional[Mapping[str, Any]] = None,
) -> Path:
    """The pipeline the generator is scored with: a pipeline ``package`` wrote, as it is (:func:`model_kb`); a
    model folder packaged into ``folder/pipeline`` with ``kb``, ``config`` (the fine-tuning config, for a model
    trained here) and ``settings`` (``inputs.style``...), as ``package`` would, but with no entity ruler nor
    abbreviation detector: gold mentions are scored."""
    kb_file = model_kb(model, kb, config=config, settings=settings)
    if _is_pipeline(Path(model)):
        return Path(model)
    from spacy_genbioel.training.package import EntitySource, package

    return package(
        model,
        kb_file,
        Path(folder) / "pipeline",
        config_path=config,
        settings=settings,
        entities=EntitySource(entity_ruler=False, abbreviations=False),
    )


def generator_row(options: FitOptions, retrievers: Sequence[str], device: str) -> Tuple[str, Dict[str, Any]]:
    """The name and component settings of the generator's row: beam search alone (``genbioel_beam[N]``, as
    ``crossfit``'s), or forced scores of each retriever's top ``depth`` candidates
    (``genbioel_forced_<retrievers>_<depth>``, what the cascade's forced step scores)."""
    settings: Dict[str, Any] = {"device": device, "decoding.exact_match": False}
    if options.generator == "forced":
        models = ",".join(
            f"{s}={v['model']}" for s, v in options.retrievers.items() if v.get("model") and s in retrievers
        )
        settings.update(
            {
                "decoding.search": "forced",
                "candidates.retriever": "+".join(retrievers),
                "candidates.num_candidates": options.depth,
                "candidates.model": models or None,
            }
        )
        return f"genbioel_forced_{'+'.join(retrievers)}_{options.depth}", settings
    settings["candidates.retriever"] = "none"
    if options.generator_beams is not None:
        settings.update({"decoding.num_beams": options.generator_beams, "decoding.top_k": options.generator_beams})
    return f"genbioel_beam{options.generator_beams or ''}", settings


def score_model(
    pipeline: Union[PathLike, Callable[[], PathLike]],
    kb: PathLike,
    split: HeldOutSplit,
    retrievers: Sequence[str],
    folder: PathLike,
    options: FitOptions = FitOptions(),
    device: str = "cpu",
) -> Dict[str, Path]:
    """``evaluate --predictions`` files of the generator (as ``options.generator`` says, :func:`generator_row`) and
    of each retriever over ``split``, by source; written to ``folder/<row>.jsonl`` (the report beside, ``.json``).
    A row whose two files are there already is not scored again (rerun after a crash to finish; a folder per
    model, KB and split). ``pipeline``: the generator's, or a function that makes it (called only if needed)."""
    from spacy_genbioel.evaluation.run import GoldOptions, ReportOutputs, run_evaluation

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    gold = GoldOptions(
        fmt=split.fmt, labels=tuple(split.labels), crosswalk=split.crosswalk, abbreviations=split.abbreviations
    )
    rows = {
        GENERATOR: ("genbioel", *generator_row(options, retrievers, device)),
        **{s: (s, s, dict(options.retrievers.get(s, {}))) for s in retrievers},
    }
    files = {}
    for source, (linker, row, settings) in rows.items():
        predictions, report = folder / f"{row}.jsonl", folder / f"{row}.json"
        files[source] = predictions
        if predictions.is_file() and report.is_file():
            logger.info("%s: scored already (%s)", row, predictions)
            continue
        if linker == "genbioel" and callable(pipeline):
            pipeline = pipeline()
        partial = folder / f".{row}.jsonl"  # renamed into place once whole: a crash leaves no half file to reuse
        result = run_evaluation(
            split.corpus,
            linker=linker,
            pipeline=pipeline if linker == "genbioel" else None,
            kb=None if linker == "genbioel" else kb,
            settings=settings,
            gold=gold,
            outputs=ReportOutputs(json_path=report, predictions=partial),
        )
        partial.replace(predictions)
        logger.info(
            "%s on %s: recall@1 %s over %d mentions", row, split.corpus, result.recall.recall.get(1), result.n_mentions
        )
    return files


@contextmanager
def _work_folder(folder: Optional[PathLike]) -> Iterator[Path]:
    if folder is not None:
        Path(folder).mkdir(parents=True, exist_ok=True)
        yield Path(folder)
        return
    tmp = Path(tempfile.mkdtemp(prefix="genbioel_model_fit_"))
    try:
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@dataclass(frozen=True)
class Packaging:
    """How a model folder is packaged and run to score a split: its fine-tuning ``config`` (a model trained
    here), component ``settings``, and the ``device``."""

    config: Optional[PathLike] = None
    settings: Optional[Mapping[str, Any]] = None
    device: str = "cpu"


def fit_model_fusion(
    model: PathLike,
    split: HeldOutSplit,
    *,
    kb: Optional[PathLike] = None,
    retrievers: Sequence[str] = ("tfidf", "dense"),
    options: FitOptions = FitOptions(),
    exclude: Sequence[PathLike] = (),
    packaging: Packaging = Packaging(),
    work: Optional[PathLike] = None,
) -> FittedFusion:
    """Score ``split`` with ``model`` and ``retrievers`` (:func:`score_model`; the predictions kept in ``work``, or
    a temporary folder) and fit the fusion on them (:func:`fit_predictions`); the file's ``fit["scored"]`` says
    what was scored."""
    retrievers = list(dict.fromkeys(retrievers))
    if not retrievers or GENERATOR in retrievers:
        raise ModelFitError(f"give one retriever or more to fuse with the generator, got {retrievers}")
    from spacy_genbioel.retrieval.registry import resolve_retriever

    for name in retrievers:
        try:
            resolve_retriever(name)
        except ValueError as err:
            raise ModelFitError(f"retriever {name!r}: {err}") from None
    unknown = [s for s in (*options.defer, *options.retrievers) if s not in retrievers]
    if unknown:
        raise ModelFitError(f"{', '.join(unknown)}: not among the retrievers scored ({', '.join(retrievers)})")
    with _work_folder(work) as folder:
        config, settings = packaging.config, packaging.settings
        kb_file = model_kb(model, kb, config=config, settings=settings)
        pipeline = (
            Path(model)
            if _is_pipeline(Path(model))
            else (lambda: scoring_pipeline(model, kb_file, folder, config=config, settings=settings))
        )
        files = score_model(pipeline, kb_file, split, retrievers, folder / "predictions", options, packaging.device)
        fitted = fit_predictions(
            {s: [path] for s, path in files.items()}, [KnowledgeBase.load(kb_file)], options, exclude=exclude
        )
    fitted.model.fit["scored"] = {
        "model": str(model),
        "corpus": str(split.corpus),
        "format": split.fmt,
        "abbreviations": split.abbreviations,
        "labels": list(split.labels),
        "kb": str(kb_file),
        "generator": options.generator,
    }
    return fitted
