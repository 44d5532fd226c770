"""``evaluate``: recall@k of the generative linker or a peer retriever on a corpus, or end to end.

The workflow is :func:`spacy_genbioel.evaluation.run.run_evaluation` (and
:func:`~spacy_genbioel.evaluation.end_to_end.run_end_to_end`); this module
parses the options and prints the results.
"""
from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer
from wasabi import msg

from spacy_genbioel.cli._util import app, setup_logging


@app.command("evaluate")
def evaluate_cmd(
    corpus_path: Path = typer.Option(..., "--corpus", help="Evaluation corpus (dev split)"),
    fmt: str = typer.Option("pubtator", "--format", help="pubtator | bioc | jsonl | askapatient"),
    linker: str = typer.Option("genbioel", help="genbioel | exact | tfidf | scispacy | dense"),
    dense_model: Optional[Path] = typer.Option(None, "--model", help="--linker dense (or genbioel --candidates dense): encoder directory (default: the installed all-MiniLM-L6-v2)"),
    pipeline: Optional[Path] = typer.Option(None, help="spaCy pipeline directory with a genbioel component"),
    candidates: Optional[str] = typer.Option(None, help="genbioel: decode only names of retrieved concepts: none | tfidf | dense (default: the pipeline's config)"),
    num_candidates: Optional[int] = typer.Option(None, help="genbioel: concepts retrieved per mention (default: the pipeline's config)"),
    exact_match: Optional[bool] = typer.Option(None, "--exact-match/--no-exact-match", help="genbioel: a KB name equal to the mention comes first (default: the pipeline's config)"),
    restrict: Optional[bool] = typer.Option(None, "--restrict/--no-restrict", help="genbioel with --candidates: decode only the retrieved concepts' names; --no-restrict: the retriever serves --shortcut-threshold only (default: the pipeline's config)"),
    shortcut_threshold: Optional[float] = typer.Option(None, help="genbioel with --candidates: a mention whose top retrieved candidate scores at least this takes it without generating (default: the pipeline's config)"),
    fusion: Optional[Path] = typer.Option(None, help="genbioel: rerank with these score-fusion weights (`fit-fusion` JSON) instead of the pipeline's own (genbioel/fusion.json, if any)"),
    kb: Optional[Path] = typer.Option(None, help="KB for the peers (genbioel uses the pipeline's)"),
    train: Optional[Path] = typer.Option(None, help="Training split, for GenBioEL's sub-population table"),
    labels: List[str] = typer.Option([], help="Only gold mentions with these labels"),
    abbreviations: bool = typer.Option(False, help="Expand short forms with scispacy before linking"),
    crosswalk: Optional[Path] = typer.Option(None, help="Old -> new ID TSV applied to gold IDs"),
    top_k: int = typer.Option(5),
    json_path: Optional[Path] = typer.Option(None, "--json", help="Write the report as JSON"),
    predictions_path: Optional[Path] = typer.Option(None, "--predictions", help="Write each mention's gold IDs, hit rank and ranked candidates as JSON lines"),
    plots: Optional[Path] = typer.Option(None, help="Folder for the similarity-bin plot"),
    calibration: Optional[Path] = typer.Option(None, help="Write the precision-coverage curve of the top score (abstaining below a threshold) to this JSON file, and its plot beside it (.png)"),
    target_precision: float = typer.Option(0.95, help="Report the abstention threshold that reaches this precision (and, in --calibration, the file's default for `package --calibration`)"),
    device: str = typer.Option("auto"),
    end_to_end: bool = typer.Option(False, "--end-to-end", help="Score the pipeline's own entities: NER + linking P/R/F1, strict and partial (a peer --linker links the pipeline's NER entities)"),
    label_map: Optional[str] = typer.Option(None, help="--end-to-end: gold labels -> NER labels: ncbi or FROM=TO,FROM=TO"),
    single_label: Optional[str] = typer.Option(None, help="--end-to-end: every gold label becomes this one"),
    verbose: bool = typer.Option(False, "--verbose", "-v"),
) -> None:
    """Recall@1/@5 with GenBioEL's rules, KB coverage, sub-populations and similarity bins
    (or, with --end-to-end, NER + linking P/R/F1 on the pipeline's own entities)."""
    setup_logging(verbose)
    from spacy_genbioel.corpus import CorpusFormatError
    from spacy_genbioel.corpus.load import UnknownFormatError
    from spacy_genbioel.kb import KBFormatError
    from spacy_genbioel.evaluation.run import (
        EvaluationSetupError, check_component_overrides, component_overrides, run_evaluation, write_report_json,
    )

    overrides = component_overrides(device, candidates, num_candidates, exact_match, restrict, shortcut_threshold, fusion)
    try:
        if end_to_end:
            from spacy_genbioel.evaluation.end_to_end import run_end_to_end

            if predictions_path or calibration:
                raise typer.BadParameter("--predictions and --calibration score gold mentions' candidates: not with --end-to-end")
            check_component_overrides(overrides)
            e2e = run_end_to_end(
                corpus_path, pipeline=pipeline, fmt=fmt, linker=linker, kb=kb, labels=labels, abbreviations=abbreviations,
                crosswalk=crosswalk, label_map=label_map, single_label=single_label,
                component_config=overrides,
                linker_options={"model": dense_model} if dense_model else {},
            )
            print(e2e.format_table())
            if json_path:
                write_report_json(json_path, e2e)
            return
        report = run_evaluation(
            corpus_path, fmt=fmt, linker=linker, model=dense_model, pipeline=pipeline, component_config=overrides, kb=kb,
            train=train, labels=labels, abbreviations=abbreviations, crosswalk=crosswalk, top_k=top_k, json_path=json_path,
            predictions_path=predictions_path, plots=plots, calibration=calibration, target_precision=target_precision,
        )
    except (EvaluationSetupError, UnknownFormatError) as err:
        raise typer.BadParameter(str(err)) from None
    except (KBFormatError, CorpusFormatError, FileNotFoundError) as err:  # a bad KB or corpus: the message names the file
        msg.fail(str(err), exits=1)
    if report.abbreviations_expanded is not None:
        msg.info(f"{report.abbreviations_expanded} mentions expanded from abbreviations")
    print(report.format_table())
    if predictions_path:
        msg.info(f"{report.n_mentions} predictions written to {predictions_path}")
    if calibration:
        msg.info(f"Precision-coverage curve written to {calibration} and {calibration.with_suffix('.png')}")


@app.command("calibration-plot")
def calibration_plot_cmd(
    curves: List[Path] = typer.Argument(..., help="Curves written by `evaluate --calibration` (one per linker)"),
    out: Optional[Path] = typer.Option(None, help="PNG with every curve on one plot"),
    target_precision: Optional[float] = typer.Option(None, help="Precision whose threshold is reported (default: each file's)"),
    json_path: Optional[Path] = typer.Option(None, "--json", help="Write the comparison table as JSON"),
) -> None:
    """Compare linkers' precision-coverage curves: precision at 90% and 95% coverage, the threshold for a target precision."""
    import json

    from wasabi import table

    from spacy_genbioel.evaluation.calibration import CalibrationError, compare_calibrations, read_calibration
    from spacy_genbioel.evaluation.run import write_calibration_plot

    try:
        loaded = [read_calibration(path) for path in curves]
    except (CalibrationError, FileNotFoundError) as err:
        msg.fail(str(err), exits=1)
    rows = compare_calibrations(loaded, target_precision)
    header = list(rows[0]) if rows else []
    print(table([[_cell(row[key]) for key in header] for row in rows], header=header, divider=True))
    if json_path:
        json_path.write_text(json.dumps(rows, indent=2), encoding="utf8")
    if out and write_calibration_plot(loaded, out, target_precision):
        msg.good(f"Plot written to {out}")


def _cell(value: object) -> str:
    return "-" if value is None else f"{value:.4f}" if isinstance(value, float) else str(value)
