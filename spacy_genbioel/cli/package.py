"""``package``: a trained model and its KB as a spaCy pipeline directory
(:func:`spacy_genbioel.training.package.package`)."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from wasabi import msg

from spacy_genbioel.cli._util import app, setup_logging


@app.command("package")
def package_cmd(
    model: Path = typer.Option(..., help="Trained model directory"),
    kb: Path = typer.Option(..., help="KB the model decodes into"),
    out: Path = typer.Option(..., help="Output spaCy pipeline directory"),
    config: Optional[Path] = typer.Option(None, help="The fine-tuning config (encoder-input settings)"),
    name: str = typer.Option("genbioel_pipeline", help="Pipeline name in meta.json"),
    version: str = typer.Option("0.0.0", help="Pipeline version in meta.json"),
    entity_label: Optional[str] = typer.Option(None, help="Label of the entity ruler's spans (default: the concept's type)"),
    entity_ruler: bool = typer.Option(True, help="Add an entity ruler over the KB names"),
    abbreviations: bool = typer.Option(True, help="Add scispacy's abbreviation detector when installed"),
    num_beams: int = typer.Option(5),
    top_k: int = typer.Option(5),
    min_name_chars: int = typer.Option(3, help="Shortest KB name the entity ruler matches"),
    lang: str = typer.Option("en"),
    ner: Optional[Path] = typer.Option(None, help="Trained spaCy NER pipeline whose tokenizer, tok2vec and ner replace the entity ruler"),
    exact_match: bool = typer.Option(False, "--exact-match/--no-exact-match", help="A KB name equal to the mention is ranked first (measure it on dev: it helps on BC5CDR, hurts on NCBI)"),
    candidates: str = typer.Option("none", help="Retriever over the KB names: none | tfidf | dense"),
    num_candidates: int = typer.Option(20, help="Concepts the retriever proposes per mention"),
    restrict: bool = typer.Option(True, "--restrict/--no-restrict", help="Decode only the retrieved concepts' names (--no-restrict: the retriever serves --shortcut-threshold only)"),
    shortcut_threshold: Optional[float] = typer.Option(None, help="A mention whose top retrieved candidate scores at least this takes it without generating"),
    verbose: bool = typer.Option(False, "--verbose", "-v"),
) -> None:
    """A spaCy pipeline directory (abbreviation detector, entity ruler or trained NER, genbioel) for spacy.load / spacy package."""
    setup_logging(verbose)
    from spacy_genbioel.training.package import package

    path = package(model, kb, out, name=name, version=version, config_path=config, entity_label=entity_label,
                   entity_ruler=entity_ruler, abbreviations=abbreviations, num_beams=num_beams, top_k=top_k,
                   min_name_chars=min_name_chars, lang=lang, ner=ner, exact_match=exact_match, candidates=candidates,
                   num_candidates=num_candidates, restrict_to_candidates=restrict, shortcut_threshold=shortcut_threshold)
    msg.good(f"Pipeline saved to {path}")
