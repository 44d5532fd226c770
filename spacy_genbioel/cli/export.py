"""``export-sources``: a corpus written as GenBioEL's own ``.source`` / ``.target`` /
``label.txt`` files in a released input style (:mod:`spacy_genbioel.training.export_sources`)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from wasabi import msg

from spacy_genbioel.cli._util import VERBOSE, app, setup_logging


@app.command("export-sources")
def export_sources_cmd(
    corpus: Path = typer.Argument(..., help="Corpus file (PubTator, BioC or JSONL)", exists=True, dir_okay=False),
    out: Path = typer.Option(..., help="Output folder"),
    split: str = typer.Option(..., help="Split name: writes SPLIT.source, SPLIT.target, SPLITlabel.txt"),
    kb: Optional[Path] = typer.Option(
        None, help="KB (.jsonl or target_kb.json): target names, and mentions outside it left out"
    ),
    fmt: str = typer.Option("pubtator", "--format", help="pubtator | bioc | jsonl"),
    style: str = typer.Option(
        "genbioel-released-ncbi.v1",
        help="Released input style: genbioel-released-ncbi.v1 | genbioel-released-bc5cdr.v1",
    ),
    abbreviations: str = typer.Option(
        "schwartz-hearst", help="schwartz-hearst | none | Ab3P's output file for the corpus"
    ),
    verbose: bool = VERBOSE,
) -> None:
    """Write a corpus as GenBioEL's files, with the inputs its published models were trained on."""
    setup_logging(verbose)
    from spacy_genbioel.corpus.load import UnknownFormatError
    from spacy_genbioel.training.export_sources import export_sources

    try:
        result = export_sources(corpus, out, split, kb=kb, fmt=fmt, style=style, abbreviations=abbreviations)
    except (UnknownFormatError, ValueError) as err:
        raise typer.BadParameter(str(err)) from None
    counts = result["counts"]
    left_out = {k: v for k, v in counts.items() if k in ("nil", "not_in_kb", "composite_dropped") and v}
    msg.good(
        f"{counts.get('lines', 0)} lines from {counts.get('mentions', 0)} mentions of {result['documents']} documents "
        f"-> {result['paths']['source']}" + (f" (left out: {left_out})" if left_out else "")
    )
