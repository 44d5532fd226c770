"""``visualize``: an HTML page (displaCy) of linked entities for a text or a
corpus sample (:func:`spacy_genbioel.visualize.visualize`)."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer
from wasabi import msg

from spacy_genbioel.cli._util import VERBOSE, app, setup_logging


@app.command("visualize")
def visualize_cmd(
    inputs: Optional[List[Path]] = typer.Argument(
        None, help="Input files or folders: PubTator, BioC XML/JSON, PubMed XML, JSONL, plain text (.gz too)"
    ),
    out: Path = typer.Option(..., "--out", help="HTML file to write"),
    pipeline: Optional[Path] = typer.Option(
        None, "--pipeline", help="spaCy pipeline directory with NER and a genbioel component"
    ),
    text: Optional[List[str]] = typer.Option(
        None, "--text", help="A text to link (repeat for several); instead of input files"
    ),
    input_format: Optional[str] = typer.Option(
        None,
        "--input-format",
        help="pubtator | bioc | pubmed | jsonl | text (default: detected per file; --gold: pubtator | bioc | jsonl, "
        "default pubtator)",
    ),
    gold: bool = typer.Option(False, "--gold", help="Show the input corpus's own annotations (no pipeline)"),
    kb: Optional[Path] = typer.Option(None, "--kb", help="KB for concept names (default: the pipeline's)"),
    n_docs: int = typer.Option(5, "--n-docs", help="Documents in the sample"),
    seed: Optional[int] = typer.Option(
        None, "--seed", help="Draw a random sample with this seed (default: the first documents)"
    ),
    ids: Optional[str] = typer.Option(None, "--ids", help="Comma-separated document IDs to show instead of a sample"),
    kb_url: Optional[str] = typer.Option(
        None,
        "--kb-url",
        help="Concept pages: schemes (mesh,omim,umls,snomedct) or a template with {} for the ID (default: the "
        "pipeline's meta.json, else every known scheme)",
    ),
    label: str = typer.Option("both", "--label", help="both ('Disease: Reiter syndrome') | name | type"),
    component: Optional[str] = typer.Option(
        None, "--component", help="Which genbioel component's KB names the concepts, where there are several"
    ),
    spans_key: Optional[str] = typer.Option(None, "--spans-key", help="Show doc.spans[KEY] instead of doc.ents"),
    kb_id_attr: Optional[str] = typer.Option(
        None, "--kb-id-attr", help="Read the concept ID from the extension span._.NAME instead of span.kb_id_"
    ),
    device: Optional[str] = typer.Option(None, "--device", help="auto | cpu | cuda | cuda:N (default: the pipeline's)"),
    verbose: bool = VERBOSE,
) -> None:
    """Write an HTML page of linked entities (type and concept name as the label, the ID linking to the \
concept's page)."""
    setup_logging(verbose)
    from spacy_genbioel.visualize import DocumentSource, PageOptions, VisualizeError, visualize

    source = DocumentSource(
        texts=tuple(text or ()),
        inputs=tuple(inputs or ()),
        input_format=input_format,
        gold=gold,
        n_docs=n_docs,
        seed=seed,
        ids=[i.strip() for i in ids.split(",") if i.strip()] if ids else None,
    )
    page = PageOptions(templates=kb_url, label=label, component=component, spans_key=spans_key, kb_id_attr=kb_id_attr)
    try:
        summary = visualize(out, source, pipeline=pipeline, kb=kb, page=page, device=device)
    except VisualizeError as err:
        msg.fail(str(err), exits=1)
        return
    if summary.missing_ids:
        msg.warn(f"not found: {', '.join(summary.missing_ids)}")
    if summary.skipped_records:
        msg.warn(f"{summary.skipped_records} input records could not be read and were skipped")
    msg.good(
        f"{summary.documents} documents, {summary.entities} entities ({summary.linked} linked, "
        f"{summary.with_page} with a concept page) -> {summary.out}"
    )
