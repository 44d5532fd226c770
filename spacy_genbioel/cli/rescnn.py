"""``train-rescnn``: the tiny residual-CNN retriever (Lai et al. 2021) trained as BioSyn on KB
synonyms and training mentions (:mod:`spacy_genbioel.training.rescnn`)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from wasabi import msg

from spacy_genbioel.cli._util import OVERRIDES, VERBOSE, app, parse_overrides, setup_logging


@app.command("train-rescnn", context_settings=OVERRIDES)
def train_rescnn_cmd(
    ctx: typer.Context,
    kb: Path = typer.Option(..., help="KB whose names are retrieved (its synonyms are queries too)"),
    out: Path = typer.Option(..., help="Output folder: model/, train_log.jsonl, config.cfg, result.json"),
    config: Optional[Path] = typer.Option(
        None, help="Settings, e.g. configs/rescnn.cfg (default: the built-in defaults)"
    ),
    train: Optional[Path] = typer.Option(
        None, help="Training examples (corpus output train.jsonl): mentions as queries"
    ),
    wordpieces: Optional[Path] = typer.Option(
        None, help="BERT directory whose word-piece table is taken (default: the installed all-MiniLM-L6-v2)"
    ),
    index: bool = typer.Option(True, help="Write the trained model's name index of --kb beside the KB"),
    device: str = typer.Option("cpu", help="cpu | cuda | cuda:N | auto"),
    verbose: bool = VERBOSE,
) -> None:
    """Train the ResCNN retriever: BioSyn's marginal likelihood over TF-IDF + dense candidates refreshed each epoch
    (extra options override the config: --training.epochs 3)."""
    setup_logging(verbose)
    from spacy_genbioel.training.rescnn import ResCNNRun, train_rescnn_step

    for path, what in ((kb, "--kb"), (train, "--train"), (config, "--config")):
        if path is not None and not path.exists():
            raise typer.BadParameter(f"{what} {path}: file not found")
    try:
        result = train_rescnn_step(
            kb, out, ResCNNRun(config, train, wordpieces, index, device), overrides=parse_overrides(ctx.args)
        )
    except (ValueError, FileNotFoundError) as err:
        msg.fail(str(err).splitlines()[0], exits=1)
        return
    last = sum(result.losses[-50:]) / max(1, len(result.losses[-50:]))
    msg.good(
        f"Trained {result.trainable_parameters:,} parameters for {result.step} steps, {result.epoch} epochs "
        f"({result.stopped_by}, {result.seconds:.0f}s, loss {last:.4f}) -> {result.model_dir}"
    )
