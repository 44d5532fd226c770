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

from spacy_genbioel.cli._util import OVERRIDES, app, component_settings, fail, setup_logging


@app.command("evaluate", context_settings=OVERRIDES)
def evaluate_cmd(
    ctx: typer.Context,
    corpus_path: Path = typer.Option(..., "--corpus", help="Evaluation corpus (dev split)"),
    fmt: str = typer.Option("pubtator", "--format", help="pubtator | bioc | jsonl | askapatient"),
    linker: str = typer.Option("genbioel", help="genbioel | exact | tfidf | scispacy | dense"),
    dense_model: Optional[Path] = typer.Option(
        None,
        "--model",
        help="--linker dense (or genbioel's candidates.model): encoder directory "
        "(default: the installed all-MiniLM-L6-v2)",
    ),
    pipeline: Optional[Path] = typer.Option(None, help="spaCy pipeline directory with a genbioel component"),
    fusion: Optional[Path] = typer.Option(
        None,
        help="genbioel: rerank with these score-fusion weights (reranker.fusion: `fit-fusion` JSON) instead of "
        "the pipeline's own (--reranker.fusion none: no fusion at all, the generator alone)",
    ),
    kb: Optional[Path] = typer.Option(None, help="KB for the peers (genbioel uses the pipeline's)"),
    train: Optional[Path] = typer.Option(None, help="Training split, for GenBioEL's sub-population table"),
    labels: List[str] = typer.Option([], help="Only gold mentions with these labels"),
    abbreviations: bool = typer.Option(False, help="Expand short forms with scispacy before linking"),
    crosswalk: Optional[Path] = typer.Option(None, help="Old -> new ID TSV applied to gold IDs"),
    top_k: int = typer.Option(5),
    json_path: Optional[Path] = typer.Option(None, "--json", help="Write the report as JSON"),
    predictions_path: Optional[Path] = typer.Option(
        None, "--predictions", help="Write each mention's gold IDs, hit rank and ranked candidates as JSON lines"
    ),
    plots: Optional[Path] = typer.Option(None, help="Folder for the similarity-bin plot"),
    calibration: Optional[Path] = typer.Option(
        None,
        help="Write the precision-coverage curve of the top score (abstaining below a threshold) to this JSON "
        "file, and its plot beside it (.png)",
    ),
    target_precision: float = typer.Option(
        0.95,
        help="Report the abstention threshold that reaches this precision (and, in --calibration, the file's "
        "default for `package --calibration`)",
    ),
    device: Optional[str] = typer.Option(None, help="genbioel: auto | cpu | cuda | cuda:N (default: the pipeline's)"),
    dtype: Optional[str] = typer.Option(
        None,
        "--dtype",
        help="auto | fp32 | bf16 | fp16 | int8: the generator's dtype (the genbioel setting dtype; default: the "
        "pipeline's). bf16 on a CPU with AMX or AVX512-BF16: the generator about 2x faster (docs/scale.md)",
    ),
    end_to_end: bool = typer.Option(
        False,
        "--end-to-end",
        help="Score the pipeline's own entities: NER + linking P/R/F1, strict and partial (a peer --linker "
        "links the pipeline's NER entities)",
    ),
    label_map: Optional[str] = typer.Option(
        None, help="--end-to-end: gold labels -> NER labels: ncbi or FROM=TO,FROM=TO"
    ),
    single_label: Optional[str] = typer.Option(None, help="--end-to-end: every gold label becomes this one"),
    skip_missing: bool = typer.Option(
        False,
        "--skip-missing",
        help="A --corpus that does not exist scores nothing and exits 0 "
        "with a message, instead of failing (a test split that is not there yet)",
    ),
    verbose: bool = typer.Option(False, "--verbose", "-v"),
) -> None:
    """Recall@1/@5 with GenBioEL's rules, KB coverage, sub-populations and similarity bins
    (or, with --end-to-end, NER + linking P/R/F1 on the pipeline's own entities). Any genbioel
    setting follows as --block.setting VALUE (default: the pipeline's): --candidates.retriever tfidf,
    --candidates.num_candidates 10, --candidates.shortcut_threshold 0.9, --decoding.exact_match true.
    --reranker.fusion none (or null) links without any fusion, the pipeline's own fusion.json included:
    the generator alone."""
    setup_logging(verbose)
    if skip_missing and not corpus_path.exists():
        written = f" {json_path} not written." if json_path else ""
        msg.warn(f"No corpus at {corpus_path}: nothing scored (--skip-missing).{written}")
        return
    from spacy_genbioel.corpus import CorpusFormatError
    from spacy_genbioel.corpus.load import UnknownFormatError
    from spacy_genbioel.evaluation.run import (
        EvaluationSetupError,
        GoldOptions,
        ReportOutputs,
        run_evaluation,
        write_report_json,
    )
    from spacy_genbioel.kb import KBFormatError
    from spacy_genbioel.linking.reranking.fusion import FusionFormatError
    from spacy_genbioel.models import ModelFormatError

    if linker != "genbioel":  # a mistyped --linker: one line naming the known ones
        from spacy_genbioel.retrieval.registry import resolve_retriever

        try:
            resolve_retriever(linker)
        except ValueError as err:
            fail(f"--linker: {err}")
    if linker == "genbioel":
        settings = component_settings(
            ctx.args,
            device=device,
            dtype=dtype,
            **{
                "reranker.fusion": str(fusion) if fusion else None,
                "candidates.model": str(dense_model) if dense_model else None,
            },
        )
    elif ctx.args or fusion or device or dtype:
        raise typer.BadParameter(f"--linker {linker} takes no component settings (--fusion, --device, --block.setting)")
    else:
        settings = {"model": dense_model} if dense_model else {}
    gold = GoldOptions(fmt=fmt, labels=tuple(labels), crosswalk=crosswalk, train=train, abbreviations=abbreviations)
    try:
        if end_to_end:
            from spacy_genbioel.evaluation.end_to_end import run_end_to_end

            if predictions_path or calibration:
                raise typer.BadParameter(
                    "--predictions and --calibration score gold mentions' candidates: not with --end-to-end"
                )
            e2e = run_end_to_end(
                corpus_path,
                pipeline=pipeline,
                linker=linker,
                kb=kb,
                settings=settings,
                gold=gold,
                label_map=label_map,
                single_label=single_label,
            )
            print(e2e.format_table())
            if json_path:
                write_report_json(json_path, e2e)
            return
        outputs = ReportOutputs(
            json_path=json_path,
            predictions=predictions_path,
            plots=plots,
            calibration=calibration,
            target_precision=target_precision,
        )
        report = run_evaluation(
            corpus_path,
            linker=linker,
            pipeline=pipeline,
            kb=kb,
            settings=settings,
            gold=gold,
            outputs=outputs,
            top_k=top_k,
        )
    except (EvaluationSetupError, UnknownFormatError) as err:
        raise typer.BadParameter(_as_flags(str(err))) from None
    except (KBFormatError, CorpusFormatError, ModelFormatError, FusionFormatError, FileNotFoundError) as err:
        # a bad KB, corpus, pipeline file or fusion file: the message names the file
        msg.fail(str(err), exits=1)
    if report.abbreviations_expanded is not None:
        msg.info(f"{report.abbreviations_expanded} mentions expanded from abbreviations")
    print(report.format_table())
    if predictions_path:
        msg.info(f"{report.n_mentions} predictions written to {predictions_path}")
    if calibration:
        msg.info(f"Precision-coverage curve written to {calibration} and {calibration.with_suffix('.png')}")


def _as_flags(message: str) -> str:
    """A library error in this command's words: settings become the options that set them."""
    for setting, flag in (
        ("reranker.fusion", "--fusion"),
        ("a pipeline is required", "--pipeline is required"),
        ("a KB is required", "--kb is required"),
    ):
        message = message.replace(setting, flag)
    return message


@app.command("calibration-plot")
def calibration_plot_cmd(
    curves: List[Path] = typer.Argument(..., help="Curves written by `evaluate --calibration` (one per linker)"),
    out: Optional[Path] = typer.Option(None, help="PNG with every curve on one plot"),
    target_precision: Optional[float] = typer.Option(
        None, help="Precision whose threshold is reported (default: each file's)"
    ),
    json_path: Optional[Path] = typer.Option(None, "--json", help="Write the comparison table as JSON"),
) -> None:
    """Compare linkers' precision-coverage curves: precision at 90% and 95% coverage, the threshold for a
    target precision."""
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
