"""``train-rescnn``: the tiny residual-CNN retriever (Lai et al. 2021) trained as BioSyn on KB
synonyms and training mentions (:mod:`spacy_genbioel.training.rescnn`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, Mapping, Optional

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
        settings = checked_settings(config, parse_overrides(ctx.args))
        result = train_rescnn_step(kb, out, ResCNNRun(config, train, wordpieces, index, device), overrides=settings)
    except (ValueError, FileNotFoundError) as err:
        msg.fail(" ".join(line.strip() for line in str(err).splitlines() if line.strip())[:500], exits=1)
        return
    last = sum(result.losses[-50:]) / max(1, len(result.losses[-50:]))
    msg.good(
        f"Trained {result.trainable_parameters:,} parameters for {result.step} steps, {result.epoch} epochs "
        f"({result.stopped_by}, {result.seconds:.0f}s, loss {last:.4f}) -> {result.model_dir}"
    )


def checked_settings(config: Optional[Path], overrides: Mapping[str, Any]) -> Dict[str, Any]:
    """The overrides, and the numeric settings of ``config``, checked and coerced
    (:mod:`spacy_genbioel.retrieval.rescnn_checks`): a NaN ``initial_scale`` or negative ``epochs``
    is refused naming the setting and where it came from, ``.5`` or ``+1`` become numbers.
    The config file's values are passed on as overrides, so training reads the numbers."""
    from spacy_genbioel.retrieval.rescnn_checks import check_rescnn_settings

    settings: Dict[str, Any] = {}
    if config is not None:
        from spacy_genbioel.training.rescnn import RESCNN_SECTIONS
        from spacy_genbioel.training.settings import read_config

        values, _ = read_config(config, None, RESCNN_SECTIONS)
        dotted = {f"{section}.{name}": value for section, names in values.items() for name, value in names.items()}
        settings.update(check_rescnn_settings(dotted, str(config)))
    for name, value in overrides.items():
        settings.update(check_rescnn_settings({name: value}, f"--{name}"))
    return settings
