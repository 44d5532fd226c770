"""``init-model``: a from-scratch BART with a trained tokenizer, or a BERT2BERT warm start;
``import-checkpoint``: a released pickled checkpoint made a verified safetensors folder."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from wasabi import msg

from spacy_genbioel.cli._util import VERBOSE, app, setup_logging


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


@app.command("import-checkpoint")
def import_checkpoint_cmd(
    src: Path = typer.Argument(
        ...,
        help="Released checkpoint: a folder with config.json and pytorch_model.bin "
        "(or pytorch_model.bin.index.json), or one .bin/.pt/.ckpt file",
    ),
    out: Path = typer.Option(..., help="Output Hugging Face folder (must not exist, or be empty)"),
    tokenizer: Optional[Path] = typer.Option(
        None,
        help="Tokenizer folder to write beside the weights "
        "(facebook/bart-large's for the released GenBioEL/ANGEL models)",
    ),
    no_tokenizer: bool = typer.Option(False, "--no-tokenizer", help="Import the weights without a tokenizer"),
    replace: bool = typer.Option(
        False,
        "--replace",
        help="Replace an earlier import in --out (a folder holding only what an import wrote, listed in its "
        "import.json) once the new one is verified; anything else in it is never removed",
    ),
    config: Optional[Path] = typer.Option(None, help="The model's config.json, when it is not beside the weights"),
    inputs_style: Optional[str] = typer.Option(
        None,
        "--inputs.style",
        help="The released input style the weights were trained on "
        "(genbioel-released-ncbi.v1 | genbioel-released-bc5cdr.v1), recorded for `package` "
        "to apply (default: read from the source folder's name, ANGEL_ncbi)",
    ),
    probes: int = typer.Option(4, min=1, help="Probe inputs whose logits the written model must reproduce"),
    verbose: bool = VERBOSE,
) -> None:
    """Import a pickled GenBioEL/ANGEL checkpoint once, safely: refuse any pickle global that is not a tensor,
    storage or plain container (nothing in the file runs) and any config.json with custom code; write
    model.safetensors, config.json, the tokenizer and import.json (SHA-256 of the sources, key mapping, versions);
    check the written model's logits against the source weights'. The tokenizer folder must load with a padding token
    (facebook/bart-large's needs its config.json); the input style the weights were trained on is recorded \
for `package`."""
    setup_logging(verbose)
    from spacy_genbioel.models import ImportOptions, ModelFormatError, import_checkpoint

    options = ImportOptions(
        tokenizer=tokenizer,
        no_tokenizer=no_tokenizer,
        config=config,
        probes=probes,
        replace=replace,
        inputs_style=inputs_style,
    )
    try:
        record = import_checkpoint(src, out, options)
    except (ModelFormatError, OSError) as err:
        msg.fail(f"import-checkpoint: {err}")
        raise typer.Exit(1) from None
    mapping = record["key_mapping"]
    renamed = " ".join(
        part
        for part in (
            f"under '{mapping['container']}'" if mapping["container"] else "",
            f"prefix '{mapping['stripped_prefix']}' stripped" if mapping["stripped_prefix"] else "",
            f"prefix '{mapping['added_prefix']}' added" if mapping["added_prefix"] else "",
            f"{len(mapping['tied'])} tied" if mapping["tied"] else "",
            f"{', '.join(mapping['zero_filled'])} zeros" if mapping["zero_filled"] else "",
            f"{len(mapping['unexpected'])} ignored" if mapping["unexpected"] else "",
        )
        if part
    )
    msg.good(
        f"Imported {src} into {out} (keys: {renamed or 'as they were'}; "
        f"max |logit diff| {record['verification']['max_abs_diff']:.2g}); record in {out / 'import.json'}"
    )
    style = record["inputs_style"]
    if style["style"]:
        msg.info(f"inputs.style {style['style']} ({style['from']}): `package` applies it")
    else:
        msg.warn(
            "No input style recorded (the corpus the weights were trained on is not known): import again with "
            "--inputs.style genbioel-released-<corpus>.v1, or give it to `package`"
        )
    if record["tokenizer"] is None:
        msg.warn(
            f"No tokenizer in {out}: copy facebook/bart-large's tokenizer files into it, "
            "or give the tokenizer folder whenever the model is loaded"
        )
