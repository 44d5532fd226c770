"""``annotate``: link the mentions of many documents, streaming and resumable.

    python -m spacy_genbioel annotate pubmed/ --pipeline P --out O --format pubtator \\
        --device cuda --decoding.batch_size 64 --candidates.retriever tfidf

The job is :func:`spacy_genbioel.annotate.annotate`; this module parses the
flags (the job's :class:`~spacy_genbioel.annotate.AnnotateOptions`, plus
``--device``) and the dotted genbioel settings after them (spaCy's override
syntax), turns :class:`~spacy_genbioel.annotate.AnnotateError` into a failure
message that names flags (:data:`FLAGS`) and prints the summary.
"""

from __future__ import annotations

import shlex
import sys
from dataclasses import fields
from pathlib import Path
from typing import Any, Dict, List, Optional

import typer
from wasabi import msg

from spacy_genbioel.annotate.options import DEFAULT_DEVICE, AnnotateOptions
from spacy_genbioel.cli._util import app, parse_overrides, setup_logging

#: the flags' defaults are the options' (one definition), read from the fields: making AnnotateOptions imports the
#: readers and writers, which ``--help`` does without
DEFAULTS: Dict[str, Any] = {field.name: field.default for field in fields(AnnotateOptions)}
#: annotate()'s arguments, options and settings -> this command's flags, for its error messages
FLAGS = {
    "inputs": "INPUTS",
    "pipeline_dir": "--pipeline",
    "out": "--out",
    "format": "--format",
    "input_format": "--input-format",
    "batch_size": "--batch-size",
    "n_process": "--n-process",
    "chunk_size": "--chunk-size",
    "max_record_bytes": "--max-record-bytes",
    "max_json_bytes": "--max-json-bytes",
    "errors_path": "--errors",
    "progress": "--progress",
    "engine": "--engine",
    "ray_address": "--ray-address",
    "device": "--device",
    "dtype": "--dtype",
}


def flag(name: str) -> str:
    """The flag of an argument, option or setting named in an AnnotateError (a dotted setting: ``--block.key``)."""
    return FLAGS.get(name, f"--{name}" if "." in name else name)


@app.command("annotate", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def annotate_cmd(
    ctx: typer.Context,
    inputs: List[str] = typer.Argument(
        ...,
        metavar="INPUTS...",
        help="Input files or folders: PubTator, BioC XML/JSON, PubMed XML, JSONL, plain text (.gz too); then, after "
        "the flags, genbioel settings in spaCy's override syntax: --decoding.batch_size 16 "
        "--candidates.retriever tfidf",
    ),
    pipeline: Path = typer.Option(..., "--pipeline", help="spaCy pipeline directory with NER and a genbioel component"),
    out: Path = typer.Option(
        ...,
        "--out",
        help="Output folder of one job (chunk files, job.json, checkpoint, errors, provenance, summary); another "
        "job's folder is refused",
    ),
    format: str = typer.Option(DEFAULTS["format"], "--format", "-f", help="jsonl | pubtator | bioc | docbin"),
    input_format: Optional[str] = typer.Option(
        DEFAULTS["input_format"],
        "--input-format",
        help="pubtator | bioc | pubmed | jsonl | text "
        "(default: detected per file; needed where the format cannot be told)",
    ),
    n_process: int = typer.Option(
        DEFAULTS["n_process"],
        "--n-process",
        help="Worker processes for nlp.pipe (CPU); with --engine ray: Ray workers, each with one GPU (--device cuda, "
        "or auto on a cluster with GPUs) or one CPU",
    ),
    device: str = typer.Option(
        DEFAULT_DEVICE, "--device", help="auto | cpu | cuda | cuda:N (the genbioel setting device)"
    ),
    dtype: Optional[str] = typer.Option(
        None,
        "--dtype",
        help="auto | fp32 | bf16 | fp16 | int8: the generator's dtype (the genbioel setting dtype; default: the "
        "pipeline's). bf16 on a CPU with AMX or AVX512-BF16: the generator about 2x faster (docs/scale.md)",
    ),
    batch_size: int = typer.Option(
        DEFAULTS["batch_size"],
        "--batch-size",
        help="Documents per nlp.pipe batch (mentions per decoding batch: --decoding.batch_size)",
    ),
    chunk_size: int = typer.Option(
        DEFAULTS["chunk_size"],
        "--chunk-size",
        help="Documents per output chunk (the unit of commit; with --engine ray also the unit of work)",
    ),
    errors: Optional[Path] = typer.Option(None, "--errors", help="Errors JSONL (default: OUT/errors.jsonl)"),
    max_record_bytes: int = typer.Option(
        DEFAULTS["max_record_bytes"],
        "--max-record-bytes",
        help="The most bytes one input line or XML record may hold; a larger one is an error entry naming the cap "
        "(memory per record stays bounded)",
    ),
    max_json_bytes: int = typer.Option(
        DEFAULTS["max_json_bytes"],
        "--max-json-bytes",
        help="The most bytes of a BioC JSON collection file (parsed whole)",
    ),
    engine: str = typer.Option(
        DEFAULTS["engine"],
        "--engine",
        help="local (this machine) | ray (Ray workers; needs the package's ray extra; see docs/scale.md)",
    ),
    ray_address: Optional[str] = typer.Option(
        DEFAULTS["ray_address"],
        "--ray-address",
        help="With --engine ray: the cluster to run on (auto, or the head node HOST:6379); default: a local Ray "
        "started for the run",
    ),
    progress: bool = typer.Option(DEFAULTS["progress"], "--progress/--no-progress"),
    verbose: bool = typer.Option(False, "--verbose", "-v"),
) -> None:
    """Link the mentions of many documents, streaming and resumable (rerun the same command after an interruption;
    an output folder holds one job, see docs/annotate.md). Genbioel settings go after the flags, dotted:
    --decoding.batch_size 16 --candidates.retriever tfidf --output.threshold 0.5."""
    setup_logging(verbose)
    from spacy_genbioel.annotate.options import bound_kernel_cache

    bound_kernel_cache()  # before torch runs anything (spacy_genbioel.annotate imports it)
    from spacy_genbioel.annotate import AnnotateError, annotate

    # the unknown options (the dotted settings) and their values land among the inputs: they start at the first "--"
    split = next((i for i, item in enumerate(inputs) if item.startswith("--")), len(inputs))
    paths = [Path(p) for p in inputs[:split]]
    try:
        settings = parse_overrides([*inputs[split:], *ctx.args])
    except Exception as err:  # noqa: BLE001  (click's NoSuchOption for an undotted name: not typer's own click)
        msg.fail(
            f"{str(getattr(err, 'message', None) or err).rstrip('.')}; genbioel settings are dotted: "
            "--decoding.batch_size 16",
            exits=1,
        )
    if not paths:
        msg.fail("give the input files or folders before the dotted settings", exits=1)
    try:
        options = AnnotateOptions(
            format=format,
            input_format=input_format,
            batch_size=batch_size,
            n_process=n_process,
            chunk_size=chunk_size,
            errors_path=errors,
            progress=progress,
            max_record_bytes=max_record_bytes,
            max_json_bytes=max_json_bytes,
            command=shlex.join(sys.argv),
            engine=engine,
            ray_address=ray_address,
        )
        given = {"device": device, **({"dtype": dtype} if dtype else {})}
        summary = annotate(paths, pipeline, out, options, {**given, **settings})
    except AnnotateError as err:
        msg.fail(err.naming(flag), exits=1)
        return
    except OSError as err:  # annotate() names the file it cannot write; this is the last line of defence
        msg.fail(
            f"cannot read or write a file ({err}); what was committed in {out} is kept: "
            "rerun the same command to resume",
            exits=1,
        )
        return
    run = summary["this_run"]
    msg.good(
        f"{summary['documents_written']} documents, {summary['mentions']} mentions "
        f"({summary['mentions_linked']} linked) in {summary['chunks']} chunks -> {out}"
    )
    msg.info(
        f"read {summary['documents_read']}, skipped {summary['documents_skipped']} duplicates, "
        f"{summary['errors']} errors ({summary['errors_file']}); this run: {run['documents_annotated']} documents, "
        f"{run['documents_per_s']} docs/s, {run['mentions_per_s']} mentions/s"
    )
