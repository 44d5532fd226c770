"""``annotate``: link the mentions of many documents, streaming and resumable.

The job is :func:`spacy_genbioel.annotate.annotate`; this module parses the
options, turns :class:`~spacy_genbioel.annotate.AnnotateError` into a failure
message and prints the summary.
"""
from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import List, Optional

import typer
from wasabi import msg

from spacy_genbioel.cli._util import app, setup_logging


@app.command("annotate")
def annotate_cmd(
    inputs: List[Path] = typer.Argument(..., help="Input files or folders: PubTator, BioC XML/JSON, PubMed XML, JSONL, plain text (.gz too)"),
    pipeline: Path = typer.Option(..., "--pipeline", help="spaCy pipeline directory with NER and a genbioel component"),
    out: Path = typer.Option(..., "--out", help="Output folder of one job (chunk files, job.json, checkpoint, errors, provenance, summary); another job's folder is refused"),
    format: str = typer.Option("jsonl", "--format", "-f", help="jsonl | pubtator | bioc | docbin"),
    input_format: Optional[str] = typer.Option(None, "--input-format", help="pubtator | bioc | pubmed | jsonl | text (default: detected per file; needed where the format cannot be told)"),
    n_process: int = typer.Option(1, "--n-process", help="Worker processes for nlp.pipe (CPU); with --engine ray: Ray workers, each with one GPU (--device cuda, or auto on a cluster with GPUs) or one CPU"),
    device: str = typer.Option("auto", "--device", help="auto | cpu | cuda | cuda:N"),
    batch_size: int = typer.Option(64, "--batch-size", help="Documents per nlp.pipe batch"),
    chunk_size: int = typer.Option(500, "--chunk-size", help="Documents per output chunk (the unit of commit; with --engine ray also the unit of work)"),
    errors: Optional[Path] = typer.Option(None, "--errors", help="Errors JSONL (default: OUT/errors.jsonl)"),
    engine: str = typer.Option("local", "--engine", help="local (this machine) | ray (Ray workers; needs the package's ray extra; see docs/scale.md)"),
    ray_address: Optional[str] = typer.Option(None, "--ray-address", help="With --engine ray: the cluster to run on (auto, or the head node HOST:6379); default: a local Ray started for the run"),
    progress: bool = typer.Option(True, "--progress/--no-progress"),
    verbose: bool = typer.Option(False, "--verbose", "-v"),
) -> None:
    """Link the mentions of many documents, streaming and resumable (rerun the same command after an interruption;
    an output folder holds one job, see docs/annotate.md)."""
    setup_logging(verbose)
    from spacy_genbioel.annotate import AnnotateError, annotate

    try:
        summary = annotate(inputs, pipeline, out, format=format, input_format=input_format, batch_size=batch_size,
                           n_process=n_process, device=device, chunk_size=chunk_size, errors_path=errors,
                           progress=progress, command=shlex.join(sys.argv), engine=engine, ray_address=ray_address)
    except AnnotateError as err:
        msg.fail(str(err), exits=1)
        return
    run = summary["this_run"]
    msg.good(
        f"{summary['documents_written']} documents, {summary['mentions']} mentions ({summary['mentions_linked']} linked) "
        f"in {summary['chunks']} chunks -> {out}"
    )
    msg.info(f"read {summary['documents_read']}, skipped {summary['documents_skipped']} duplicates, "
             f"{summary['errors']} errors ({summary['errors_file']}); this run: {run['documents_annotated']} documents, "
             f"{run['documents_per_s']} docs/s, {run['mentions_per_s']} mentions/s")
