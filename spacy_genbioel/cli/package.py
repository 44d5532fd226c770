"""``package``: a trained model and its KB as a spaCy pipeline directory
(:func:`spacy_genbioel.training.package.package`); ``package-wheel``: that
directory as an installable wheel (:func:`spacy_genbioel.training.wheel.build_wheel`)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Tuple

import typer
from wasabi import msg

from spacy_genbioel.cli._util import OVERRIDES, app, component_settings, setup_logging


@app.command("package", context_settings=OVERRIDES)
def package_cmd(
    ctx: typer.Context,
    model: Optional[Path] = typer.Option(
        None,
        help="Trained model directory (none: the retrievers link, fused by the package's default weights or --fusion)",
    ),
    kb: Path = typer.Option(..., help="KB the model decodes into"),
    out: Path = typer.Option(..., help="Output spaCy pipeline directory"),
    config: Optional[Path] = typer.Option(None, help="The fine-tuning config (encoder-input settings)"),
    name: str = typer.Option("genbioel_pipeline", help="Pipeline name in meta.json"),
    version: str = typer.Option("0.0.0", help="Pipeline version in meta.json"),
    entity_label: Optional[str] = typer.Option(
        None, help="Label of the entity ruler's spans (default: the concept's type)"
    ),
    entity_ruler: bool = typer.Option(True, help="Add an entity ruler over the KB names"),
    abbreviations: bool = typer.Option(True, help="Add scispacy's abbreviation detector when installed"),
    min_name_chars: int = typer.Option(
        3, help="Shortest KB name the entity ruler matches (abbreviations, matched case-sensitively, from 2 characters)"
    ),
    entity_types: Optional[str] = typer.Option(
        None,
        help="The entity ruler matches only names of concepts with one of these comma-separated types (and untyped "
        "ones): C,D,F for BC5CDR's CTD + MeSH KB",
    ),
    lang: str = typer.Option("en"),
    ner: Optional[Path] = typer.Option(
        None, help="Trained spaCy NER pipeline whose tokenizer, tok2vec and ner replace the entity ruler"
    ),
    threshold: Optional[float] = typer.Option(
        None, help="Abstain below this top score (output.threshold): the span keeps its candidates, kb_id is None"
    ),
    calibration: Optional[Path] = typer.Option(
        None,
        help="Take the threshold from a curve written by `evaluate --calibration`: the one reaching "
        "--target-precision on that data",
    ),
    target_precision: Optional[float] = typer.Option(
        None, help="With --calibration: the precision to reach (default: the file's)"
    ),
    kb_url: Optional[str] = typer.Option(
        None,
        "--kb-url",
        help="The KB's concept pages, recorded in meta.json for visualize: schemes (mesh,omim,umls,snomedct) or a "
        "template with {} for the ID",
    ),
    fusion: Optional[Path] = typer.Option(
        None,
        help="Score fusion weights from `fit-fusion` (reranker.fusion): rerank the generator's candidates with its "
        "retrievers'; decode freely as the fusion was fitted",
    ),
    verbose: bool = typer.Option(False, "--verbose", "-v"),
) -> None:
    """A spaCy pipeline directory (abbreviation detector, entity ruler or trained NER, genbioel) for spacy.load /
    spacy package; without --model it links with exact match, TF-IDF and MiniLM fused (no training needed). Any
    genbioel setting follows as --block.setting VALUE: --inputs.style genbioel-released-ncbi.v1 (a released
    checkpoint's inputs; recorded by import-checkpoint and applied by default), --decoding.num_beams 10,
    --decoding.exact_match true, --candidates.retriever tfidf, --candidates.shortcut_threshold 0.9 \
(docs/training.md)."""
    setup_logging(verbose)
    from spacy_genbioel.kb import KBFormatError
    from spacy_genbioel.linking.reranking.fusion import FusionFormatError
    from spacy_genbioel.models import ModelFormatError
    from spacy_genbioel.training.package import EntitySource, PackageError, PipelineMeta, package

    threshold, source = _threshold(threshold, calibration, target_precision)
    settings = component_settings(
        ctx.args, **{"output.threshold": threshold, "reranker.fusion": str(fusion) if fusion else None}
    )
    entities = EntitySource(
        ner=ner,
        entity_ruler=entity_ruler,
        entity_label=entity_label,
        min_name_chars=min_name_chars,
        abbreviations=abbreviations,
        lang=lang,
        entity_types=tuple(t for t in entity_types.split(",") if t) if entity_types else None,
    )
    try:
        path = package(
            model,
            kb,
            out,
            config_path=config,
            settings=settings,
            entities=entities,
            meta=PipelineMeta(name=name, version=version, kb_url=kb_url, calibration=source),
        )
    except (PackageError, ModelFormatError, KBFormatError, FusionFormatError, FileNotFoundError) as err:
        msg.fail(str(err), exits=1)
        return
    msg.good(f"Pipeline saved to {path}")


def _threshold(
    threshold: Optional[float], calibration: Optional[Path], target: Optional[float]
) -> Tuple[Optional[float], Optional[dict]]:
    """``--threshold`` as given, or the one ``--calibration`` reaches ``--target-precision`` with (and its source)."""
    if calibration is None:
        if target is not None:
            raise typer.BadParameter("--target-precision needs --calibration")
        return threshold, None
    if threshold is not None:
        raise typer.BadParameter("--threshold and --calibration both set the threshold: give one")
    from spacy_genbioel.evaluation.calibration import CalibrationError, calibrated_threshold

    try:
        threshold, source = calibrated_threshold(calibration, target)
    except (CalibrationError, FileNotFoundError) as err:
        msg.fail(str(err), exits=1)
    if threshold is None:
        msg.warn(
            f"No threshold in {calibration} reaches precision {source['target_precision']}: "
            "the pipeline links every mention"
        )
    else:
        msg.info(
            f"Threshold {threshold:.6g}: precision {source['dev_precision']:.4f} at coverage "
            f"{source['dev_coverage']:.4f} on the {source['dev_mentions']} calibration mentions"
        )
    return threshold, source


@app.command("package-wheel")
def package_wheel_cmd(
    pipeline: Path = typer.Argument(..., help="Pipeline directory written by `package`"),
    out: Path = typer.Option(..., "--out", help="Folder the wheel goes to"),
    name: Optional[str] = typer.Option(None, help="Package name without the language prefix (default: meta.json's)"),
    version: Optional[str] = typer.Option(None, help="Package version (default: meta.json's)"),
    verbose: bool = typer.Option(False, "--verbose", "-v"),
) -> None:
    """An installable wheel of a pipeline (spacy package --build wheel; needs the [package] extra), checked to \
require spacy_genbioel."""
    setup_logging(verbose)
    from spacy_genbioel.training.wheel import WheelError, build_wheel, wheel_requirements

    try:
        wheel = build_wheel(pipeline, out, name=name, version=version)
    except WheelError as err:
        msg.fail(str(err), exits=1)
        return
    msg.good(f"Wheel saved to {wheel}", f"requires: {', '.join(wheel_requirements(wheel))}")
