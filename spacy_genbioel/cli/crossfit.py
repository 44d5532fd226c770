"""``crossfit`` and ``crossfit-folds``: cross-fitted fusion files (:mod:`spacy_genbioel.training.crossfit`);
``folds-report`` and ``cascade-folds-report``: their per-fold reports summed up
(:mod:`spacy_genbioel.evaluation.folds`)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, List, Optional, Tuple

import click
import typer
from wasabi import msg

from spacy_genbioel.cli._util import VERBOSE, app, fail, setup_logging

if TYPE_CHECKING:
    from spacy_genbioel.training.crossfit import Step


def run_here(job: Step, log: Optional[Path] = None) -> None:
    """Run a step of a package command in this process (no interpreter and torch start-up per step); a step with
    a log (folds trained side by side) or a script in a process of its own."""
    from spacy_genbioel.training.crossfit import StepError, run_subprocess

    if log is not None or job.script:
        run_subprocess(job, log)
        return
    typer.secho(f"$ {job}", fg="blue")  # whole, unwrapped: a line to copy
    try:
        code = app(args=list(job.argv), prog_name="python -m spacy_genbioel", standalone_mode=False)
    except SystemExit as exit:
        code = exit.code
    except click.ClickException as err:
        raise StepError(f"`{job}`: {err.format_message()}") from None
    if isinstance(code, (int, str)) and code not in (0, ""):
        raise StepError(f"`{job}` failed (exit {code})")


def _words(text: str) -> Tuple[str, ...]:
    """``"0 1,2"`` -> ``("0", "1", "2")``: lists as one option, as the shell scripts took them."""
    return tuple(w for w in re.split(r"[\s,]+", text) if w)


def _optional(text: str, kind: type, option: str) -> Optional[object]:
    """``null`` / ``none`` / empty -> None, else the number (a bad one: a usage error naming ``option``)."""
    if text.strip().lower() in ("", "null", "none"):
        return None
    try:
        return kind(text)
    except ValueError:
        raise typer.BadParameter(f"{option} {text!r}: a number, or null") from None


ANCHOR = typer.Option(
    "none",
    help="The fits: centre their L2 penalty on this fusion's weights (a file, or genbioel:retrieval: the shipped "
    "retrieval fusion; none: on zero), fit-fusion --anchor",
)
L2 = typer.Option("null", help="The fits' L2 strength (null: fit-fusion's; with --anchor, say 0.1)")


def _penalty(anchor: str, l2: str, fitting: bool) -> Tuple[Optional[str], Optional[float]]:
    """``--anchor`` and ``--l2`` as the settings take them; an anchor file that is not there refused (ValueError)
    before hours of training when the stages will ``fitting``."""
    named = None if anchor.strip().lower() in ("", "none", "null") else anchor
    if named and fitting:
        _anchor_file(named)
    return named, _optional(l2, float, "--l2")  # type: ignore[return-value]


def _anchor_file(anchor: str) -> None:
    """Refuse, before hours of training, an ``--anchor`` that names no fusion file (ValueError)."""
    from spacy_genbioel.linking.reranking.fusion import resolve_fusion_path

    if not resolve_fusion_path(anchor).is_file():
        raise ValueError(f"--anchor {anchor}: no such fusion file")


def _threads() -> None:
    """One thread unless ``OMP_NUM_THREADS`` says otherwise, for the steps of this process and the ones it starts."""
    if "OMP_NUM_THREADS" not in os.environ:
        import torch

        os.environ["OMP_NUM_THREADS"] = "1"
        torch.set_num_threads(1)


def _stages(stages: List[str], known: Tuple[str, ...]) -> List[str]:
    unknown = [stage for stage in stages if stage not in (*known, "all")]
    if unknown:
        raise ValueError(f"unknown stage {unknown[0]!r} ({' | '.join(known)} | all)")
    return stages


def _run(stage_fn, settings, stages: List[str]) -> None:
    from spacy_genbioel.training.crossfit import StepError

    _threads()
    try:
        for stage in stages:
            stage_fn(settings, stage, runner=run_here)
    except StepError as err:
        fail(err)


@app.command("crossfit")
def crossfit_cmd(
    stages: List[str] = typer.Argument(
        ...,
        help="train (fold models, side by side) | score (held-out predictions) | fit (fusion files) | all; "
        "several run in order",
    ),
    corpus: str = typer.Option(
        "ncbi",
        help="Names the outputs; ncbi and bc5cdr know their inputs under --data-dir, another corpus gives --train, "
        "--kb-sources and --kb-format",
    ),
    data_dir: Path = typer.Option(Path("../shared/data"), help="Shared data folder (the known corpora's inputs)"),
    preset: str = typer.Option(
        "tiny", help="Model preset: names the outputs, the checkpoint and the fine-tuning config"
    ),
    k: int = typer.Option(2, "--k", help="Folds of whole documents"),
    seconds: int = typer.Option(1200, help="Fine-tuning budget of each fold model (as the final model's)"),
    rescnn_seconds: int = typer.Option(
        0,
        help="Also train a ResCNN per fold for this long (0: none); score and fit then use the fold ResCNNs (found "
        "by themselves once trained), and fit keeps the retrievers (tfidf+dense, tfidf+rescnn or all three) "
        "whose fusion links the held-out folds best",
    ),
    angel_config: Optional[Path] = typer.Option(
        None,
        help="Run the final model's ANGEL stage on each fold generator with this config (configs/angel_<preset>.cfg "
        "or angel_rank_<preset>.cfg), so the fusion is fitted on the generator the pipeline links with",
    ),
    beams: str = typer.Option(
        "null",
        help="The fold generators' beam width and top-k (null: the model config's); the fusion file records it and "
        "pipelines linking with it search at that width (held-out files *_genbioel_b<N>.jsonl)",
    ),
    variants: str = typer.Option(
        "plain,aug", help="Fold KBs scored and fitted: plain, aug (+ the fold's training mentions)"
    ),
    forced: bool = typer.Option(
        True,
        "--forced/--no-forced",
        help="Forced-score rows and the forced-score cascade (cascade_<variant>.json); the packages' cascade "
        "(fusion_<variant>.json) needs only the beam lists",
    ),
    anchor: str = ANCHOR,
    l2: str = L2,
    out: Optional[Path] = typer.Option(None, help="Output folder (training/<corpus>/<preset>/crossfit)"),
    pretrained: Optional[Path] = typer.Option(
        None, help="Checkpoint the fold models start from (training/<corpus>/<preset>/pretrain/model)"
    ),
    config: Optional[Path] = typer.Option(None, help="Fine-tuning config (configs/finetune_<preset>.cfg)"),
    rescnn_config: Path = typer.Option(Path("configs/rescnn.cfg"), help="The fold ResCNNs' config"),
    rescnn_model: Optional[Path] = typer.Option(
        None, help="The ResCNN the fitted fusion links with (training/<corpus>/rescnn/model, train-rescnn's)"
    ),
    train: Optional[Path] = typer.Option(
        None, help="Training split cut into folds (PubTator; default: the known corpus's)"
    ),
    dev: Optional[Path] = typer.Option(
        None, help="Dev examples of the fold models' fine-tuning (corpus/<corpus>/dev.jsonl)"
    ),
    eval_mentions: int = typer.Option(
        300,
        help="The fold models' dev evaluations read the first N dev mentions (0: all); they only report and pick "
        "the best of at most a few checkpoints, and all of BC5CDR dev costs about 9 CPU minutes each",
    ),
    kb_sources: Optional[str] = typer.Option(
        None, help="build-kb's sources, space-separated (FORMAT:PATH for another format; default: the known corpus's)"
    ),
    kb_format: Optional[str] = typer.Option(None, help="build-kb's --format (default: the known corpus's)"),
    crosswalk: Optional[Path] = typer.Option(
        None, help="Old -> new ID TSV of KB and gold (default: the known corpus's)"
    ),
    refresh_pool: Optional[int] = typer.Option(
        None, help="The fold ResCNNs' candidate refresh pool (0: the whole KB; bc5cdr: 50)"
    ),
    abbreviations: bool = typer.Option(True, help="Expand short forms in the fold corpora and held-out folds"),
    fold: List[int] = typer.Option(
        [], "--fold", help="train and score this fold only (repeat; one process per core side by side)"
    ),
    jobs: int = typer.Option(0, help="train: folds side by side (0: all)"),
    device: str = typer.Option("cpu", help="Device of fine-tuning and scoring"),
    verbose: bool = VERBOSE,
) -> None:
    """Score fusion fitted by cross-fitting on folds of the training split, never on dev: fold models (train),
    their held-out predictions (score), fit-fusion with the cascade on them (fit). Steps whose outputs exist
    are skipped: rerun after a crash to finish."""
    setup_logging(verbose)
    from spacy_genbioel.training.crossfit import CROSSFIT_STAGES, CrossfitSettings, crossfit_stage

    try:
        named, strength = _penalty(anchor, l2, fitting=bool({"fit", "all"} & set(stages)))
        settings = CrossfitSettings(
            corpus=corpus,
            data_dir=data_dir,
            preset=preset,
            k=k,
            seconds=seconds,
            rescnn_seconds=rescnn_seconds,
            angel_config=angel_config,
            beams=_optional(beams, int, "--beams"),
            variants=_words(variants),
            forced=forced,
            anchor=named,
            l2=strength,
            out=out,
            pretrained=pretrained,
            config=config,
            rescnn_config=rescnn_config,
            rescnn_model=rescnn_model,
            train=train,
            dev=dev,
            eval_mentions=eval_mentions,
            kb_sources=_words(kb_sources or ""),
            kb_format=kb_format,
            crosswalk=crosswalk,
            refresh_pool=refresh_pool,
            abbreviations=abbreviations,
            folds=tuple(fold),
            jobs=jobs,
            device=device,
        )
        _stages(stages, CROSSFIT_STAGES)
    except ValueError as err:
        raise typer.BadParameter(str(err)) from None
    _run(crossfit_stage, settings, stages)
    if {"fit", "all"} & set(stages):
        msg.good(f"Fusion files -> {settings.out}")


@app.command("crossfit-folds")
def crossfit_folds_cmd(
    stages: List[str] = typer.Argument(..., help="prepare | folds | fusion | cascade | all; several run in order"),
    data_dir: Path = typer.Option(
        Path("../shared/data"), help="Shared data folder ({data} in --kb-source and --splits)"
    ),
    out: Path = typer.Option(Path("training/aap/tiny"), help="Output folder: kb.jsonl, pretrain/, folds/fold-<k>/"),
    folds: str = typer.Option(
        "0 1 2 3 4 5 6 7 8 9",
        help="The folds this run trains, fits and scores (two processes can share them: '0 2 4 6 8' and '1 3 5 7 9')",
    ),
    folds_fit: str = typer.Option(
        "0 1 2 3 4 5 6 7 8 9",
        help="The folds whose predictions fit each fold's fusion and cascade (the fold itself left out)",
    ),
    jobs: int = typer.Option(2, help="folds: folds trained side by side (each one's output in OUT/fold-<k>.log)"),
    pretrain_steps: int = typer.Option(
        1500, help="Step budgets, so that folds trained side by side get the same training; the seconds are a cap"
    ),
    pretrain_seconds: int = typer.Option(900),
    finetune_steps: int = typer.Option(1500),
    finetune_seconds: int = typer.Option(1800),
    rescnn_seconds: int = typer.Option(1200, help="Each fold's ResCNN retriever's training budget"),
    seed: int = typer.Option(0),
    preset: str = typer.Option(
        "tiny", help="Model preset (configs/pretrain_<preset>.cfg, configs/finetune_<preset>.cfg)"
    ),
    kb_source: str = typer.Option("{data}/askapatient/askapatient.json", help="The vocabulary (build-kb source)"),
    kb_format: str = typer.Option("askapatient", help="Its build-kb --format"),
    splits: str = typer.Option(
        "{data}/askapatient/AskAPatient.fold-{fold}.{split}.txt",
        help="Each fold's train and validation split ({split})",
    ),
    corpus_format: str = typer.Option("askapatient", help="The splits' format (corpus, evaluate --format)"),
    metrics: Path = typer.Option(
        Path("metrics"), help="Where cascade writes its benches: <prefix>_fold<k>_<kb>[_loss].json"
    ),
    report_prefix: str = typer.Option("cascade_aap", help="The benches' file names"),
    max_recall_loss: str = typer.Option(
        "0.002",
        help="cascade: also fit thresholds for this recall budget (fit-fusion --max-recall-loss; 0.002: 0.2 points) "
        "and bench them beside the precision-targeted cascade; none: that cascade alone",
    ),
    extra_rows: str = typer.Option("", help="cascade: more bench rows (cascade_grouped_loss,...)"),
    cascade_bench: Path = typer.Option(
        Path("bench/cascade.py"), help="cascade: the bench script of a repository checkout"
    ),
    anchor: str = ANCHOR,
    l2: str = L2,
    device: str = typer.Option("cpu"),
    verbose: bool = VERBOSE,
) -> None:
    """A corpus given in folds (AskAPatient's ten), every linker on the same folds: a KB, tokenizer, model and
    pre-training shared by the folds (prepare); per fold fine-tuning, ResCNN and every linker on its validation
    split (folds); per fold a fusion (fusion) and the cascade (cascade) fitted on the other folds' predictions
    minus this fold's mention/concept pairs. Steps whose outputs exist are skipped."""
    setup_logging(verbose)
    from spacy_genbioel.training.crossfit import FOLDS_STAGES, FoldsSettings, given_folds_stage

    try:
        named, strength = _penalty(anchor, l2, fitting=bool({"fusion", "cascade", "all"} & set(stages)))
        settings = FoldsSettings(
            data_dir=data_dir,
            out=out,
            folds=tuple(map(int, _words(folds))),
            folds_fit=tuple(map(int, _words(folds_fit))),
            jobs=jobs,
            pretrain_steps=pretrain_steps,
            pretrain_seconds=pretrain_seconds,
            finetune_steps=finetune_steps,
            finetune_seconds=finetune_seconds,
            rescnn_seconds=rescnn_seconds,
            seed=seed,
            preset=preset,
            kb_source=kb_source,
            kb_format=kb_format,
            splits=splits,
            corpus_format=corpus_format,
            metrics=metrics,
            report_prefix=report_prefix,
            max_recall_loss=_optional(max_recall_loss, float, "--max-recall-loss"),
            extra_rows=_words(extra_rows),
            cascade_bench=cascade_bench,
            device=device,
            anchor=named,
            l2=strength,
        )
        _stages(stages, FOLDS_STAGES)
    except ValueError as err:
        raise typer.BadParameter(str(err)) from None
    _run(given_folds_stage, settings, stages)


def _write_json(path: Optional[Path], summary: dict) -> None:
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(summary, indent=2) + "\n", encoding="utf8")


@app.command("folds-report")
def folds_report_cmd(
    folds_dir: Path = typer.Argument(..., help="The folds folder (fold-<k>/<kb>_<linker>.json: crossfit-folds')"),
    json_path: Optional[Path] = typer.Option(None, "--json", help="Write the summary as JSON"),
) -> None:
    """Mean and spread over folds of every linker's recall, per KB (markdown; a linker missing on some folds \
says so)."""
    from spacy_genbioel.evaluation.folds import linker_markdown, linker_summary

    summary = linker_summary(folds_dir)
    typer.echo("\n".join(linker_markdown(summary)))
    _write_json(json_path, summary)


@app.command("cascade-folds-report")
def cascade_folds_report_cmd(
    metrics: Path = typer.Argument(..., help="The folder of the per-fold cascade benches"),
    prefix: str = typer.Option("cascade_aap", help="<prefix>_fold<k>_<kb><suffix>.json"),
    suffix: str = typer.Option("_loss", help="After the KB in the file names ('' for the precision-targeted benches)"),
    kbs: str = typer.Option("plain,aug"),
    json_path: Optional[Path] = typer.Option(None, "--json", help="Write the summary as JSON"),
) -> None:
    """The cascade against the fusion over folds, per KB and row: recall@1 (points from the fusion's), mentions
    per CPU second and its ratios to the fusion and the generator, the share of mentions per path."""
    from spacy_genbioel.evaluation.folds import cascade_markdown, cascade_summary

    summary = cascade_summary(metrics, prefix, suffix, _words(kbs))
    typer.echo("\n".join(cascade_markdown(summary)))
    _write_json(json_path, summary)
