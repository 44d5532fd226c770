"""``init-model``: a from-scratch BART with a trained tokenizer, or a BERT2BERT warm start."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from wasabi import msg

from spacy_genbioel.cli._util import app, setup_logging


@app.command("init-model")
def init_model_cmd(
    out: Path = typer.Option(..., help="Output model directory"),
    kb: Optional[Path] = typer.Option(None, help="KB file (.jsonl or target_kb.json) to train a tokenizer on"),
    tokenizer: Optional[Path] = typer.Option(None, help="Use this trained tokenizer directory instead of training one"),
    preset: str = typer.Option("tiny", help="tiny | base | large (from scratch) | minilm (BERT2BERT warm start)"),
    base_model: Optional[Path] = typer.Option(None, help="Warm-start a BERT2BERT from this local BERT-like directory"),
    texts: Optional[Path] = typer.Option(None, help="Extra text for the tokenizer, one document per line"),
    vocab_size: Optional[int] = typer.Option(None, help="Tokenizer vocabulary (default: the preset's)"),
    seed: int = typer.Option(0),
    verbose: bool = typer.Option(False, "--verbose", "-v"),
) -> None:
    """Train a byte-level BPE tokenizer on KB names (+ texts), or take one, and build a from-scratch BART;
    or warm-start a BERT2BERT from pretrained weights (--preset minilm, --base-model DIR)."""
    setup_logging(verbose)
    from spacy_genbioel.models.bert2bert import is_warm_start

    if base_model is not None or is_warm_start(preset):
        from spacy_genbioel.models.bert2bert import init_warm_start

        source = base_model if base_model is not None else preset
        model, tok = init_warm_start(source, out, tokenizer_dir=tokenizer, seed=seed)
        n_params = sum(p.numel() for p in model.parameters())
        msg.good(f"BERT2BERT from {source} ({n_params / 1e6:.1f}M parameters, vocabulary {len(tok)}) saved to {out}")
        return
    if tokenizer is not None:
        from spacy_genbioel.training.stages import init_model_step

        init_model_step(tokenizer, out, preset=preset, seed=seed)
        msg.good(f"{preset} model with the tokenizer of {tokenizer} saved to {out}")
        return
    if kb is None:
        raise typer.BadParameter("give --kb (to train a tokenizer) or --tokenizer")
    from spacy_genbioel.kb.base import KBFormatError, KnowledgeBase
    from spacy_genbioel.models import init_model

    try:
        knowledge_base = KnowledgeBase.load(kb)  # refuses a KB without a usable name (EmptyKBError)
    except (KBFormatError, OSError) as err:
        msg.fail(f"init-model: {err}")
        raise typer.Exit(1) from None
    lines = (line.strip() for line in texts.open(encoding="utf8")) if texts else ()
    model, tokenizer = init_model(preset, knowledge_base.names, out, texts=lines, vocab_size=vocab_size, seed=seed)
    n_params = sum(p.numel() for p in model.parameters())
    msg.good(f"{preset} model ({n_params / 1e6:.1f}M parameters, vocabulary {len(tokenizer)}) saved to {out}")
