"""``ner-corpus``: PubTator corpora as spaCy NER training data (:mod:`spacy_genbioel.ner.convert`)."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer
from wasabi import msg

from spacy_genbioel.cli._util import app, setup_logging


@app.command("ner-corpus")
def ner_corpus_cmd(
    inputs: List[Path] = typer.Argument(..., help="PubTator files (one split; several files are concatenated)"),
    out: Path = typer.Option(..., help="Output DocBin (.spacy)"),
    label_map: Optional[str] = typer.Option(None, help="ncbi (NCBI-disease types -> Disease) or FROM=TO,FROM=TO"),
    single_label: Optional[str] = typer.Option(None, help="Give every entity this label"),
    tokenizer: str = typer.Option(
        "default", help="default (spaCy's English) | scispacy (keeps hyphenated words whole; see the module docs)"
    ),
    tokenizer_out: Optional[Path] = typer.Option(
        None, help="Save the tokenizer as a blank pipeline here (the config's paths.tokenizer)"
    ),
    verbose: bool = typer.Option(False, "--verbose", "-v"),
) -> None:
    """PubTator corpora as a spaCy DocBin with doc.ents, for `spacy train`."""
    setup_logging(verbose)
    from spacy_genbioel.ner.convert import convert_pubtator, parse_label_map

    if label_map and single_label:
        raise typer.BadParameter("give --label-map or --single-label, not both")
    try:
        mapping = parse_label_map(label_map)
    except ValueError as err:
        raise typer.BadParameter(str(err)) from None
    stats = convert_pubtator(
        inputs, out, tokenizer=tokenizer, label_map=mapping, single_label=single_label, tokenizer_out=tokenizer_out
    )
    labels = ", ".join(f"{label} {n}" for label, n in sorted(stats.labels.items()))
    msg.good(f"{stats.documents} documents, {stats.entities} entities ({labels}) -> {out}")
    msg.info(
        f"{stats.boundary_changed} mentions expanded to token boundaries, "
        f"{stats.overlaps_dropped} overlapping dropped, {stats.skipped} covering no token skipped"
    )
