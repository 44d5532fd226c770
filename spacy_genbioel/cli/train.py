"""The training workflow's commands: ``corpus``, ``tokenizer``, ``pretrain``,
``finetune``, ``angel`` and ``train-dense`` (``project.yml`` runs them in
that order). Each parses its options, calls the step in
:mod:`spacy_genbioel.training` and prints the outcome; the training commands
take config overrides as extra options (``--training.max_seconds 600``).
Library imports wait until a command runs, so ``--help`` stays fast."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Optional

import typer
from wasabi import msg

from spacy_genbioel.cli._util import app, parse_overrides, setup_logging

# -- options the training stages share -----------------------------------------------------------
#: extra ``--section.key value`` options reach the command as config overrides
OVERRIDES = {"allow_extra_args": True, "ignore_unknown_options": True}
DEVICE = typer.Option("auto", help="auto | cpu | cuda | cuda:N")
RESUME = typer.Option(True, help="Continue from out/checkpoint when there is one")
STAGE_OUT = typer.Option(..., help="Output folder (checkpoint, best, model, log, curve)")
DECODED_KB = typer.Option(..., help="KB the model decodes into")
VERBOSE_FLAG = typer.Option(False, "--verbose", "-v")


def stage_overrides(ctx: typer.Context) -> Dict[str, Any]:
    """The extra options of a training command as dotted config overrides."""
    return parse_overrides(ctx.args)


# -- data and model --------------------------------------------------------------------------------
@app.command("corpus")
def corpus_cmd(
    train: List[Path] = typer.Option(
        ..., help="Training split (PubTator); repeat to read several as one (the published protocol: train + dev)"
    ),
    dev: Path = typer.Option(..., help="Dev split (PubTator)"),
    fmt: str = typer.Option("pubtator", "--format", help="pubtator | askapatient (mentions without context)"),
    kb: Path = typer.Option(..., help="KB (.jsonl or target_kb.json)"),
    out: Path = typer.Option(..., help="Output folder: train.jsonl, dev.jsonl, texts.txt, stats.json"),
    top_k_targets: int = typer.Option(1, help="Synonyms per training mention as separate targets (ANGEL: 3)"),
    abbreviations: bool = typer.Option(False, help="Expand short forms with scispacy before choosing targets"),
    crosswalk: Optional[Path] = typer.Option(None, help="Old -> new ID TSV applied to gold IDs"),
    context_chars: int = typer.Option(2000, help="Characters of context kept on each side"),
    labels: List[str] = typer.Option([], help="Only mentions with these entity types"),
    targets: str = typer.Option(
        "tfidf", help="Target synonym: tfidf (synonyms-aware) | shortest | random | first (ablations)"
    ),
    seed: int = typer.Option(0, help="Seed of --targets random"),
    verbose: bool = VERBOSE_FLAG,
) -> None:
    """Training examples with synonyms-aware targets (char 3-gram TF-IDF) and dev mentions."""
    setup_logging(verbose)
    from spacy_genbioel.training.stages import CorpusSettings, make_corpus
    from spacy_genbioel.training.targets import TARGET_STRATEGIES

    if targets not in TARGET_STRATEGIES:
        raise typer.BadParameter(f"--targets must be one of {', '.join(TARGET_STRATEGIES)}")
    settings = CorpusSettings(
        fmt=fmt,
        crosswalk=crosswalk,
        labels=labels,
        abbreviations=abbreviations,
        context_chars=context_chars,
        top_k_targets=top_k_targets,
        target_strategy=targets,
        seed=seed,
    )
    stats = make_corpus(train, dev, kb, out, settings)
    t = stats["targets"]
    msg.good(
        f"{stats['train_lines']} training examples from {t['used']} of {t['mentions']} mentions "
        f"(composite {t['composite']}, no gold {t['no_gold']}, not in KB {t['not_in_kb']}); "
        f"{stats['dev_lines']} dev mentions -> {out}"
    )


@app.command("tokenizer")
def tokenizer_cmd(
    kb: Optional[Path] = typer.Option(None, help="KB whose names the tokenizer learns (not needed for minilm)"),
    out: Path = typer.Option(..., help="Output tokenizer directory"),
    texts: Optional[Path] = typer.Option(None, help="Extra text, one document per line"),
    preset: str = typer.Option(
        "tiny", help="Preset whose vocabulary size to use; minilm: save its pretrained tokenizer"
    ),
    vocab_size: Optional[int] = typer.Option(None, help="Vocabulary size (default: the preset's)"),
    verbose: bool = VERBOSE_FLAG,
) -> None:
    """Train a byte-level BPE tokenizer (BART's special tokens, START/END markers) on KB names and text
    (a warm-start preset such as minilm: its pretrained WordPiece tokenizer plus the markers)."""
    setup_logging(verbose)
    from spacy_genbioel.models.bert2bert import is_warm_start
    from spacy_genbioel.training.stages import train_tokenizer_step

    if kb is None and not is_warm_start(preset):
        raise typer.BadParameter("--kb is required to train a tokenizer")
    train_tokenizer_step(kb, out, texts=texts, vocab_size=vocab_size, preset=preset)
    msg.good(f"Tokenizer saved to {out}")


# -- the seq2seq training stages --------------------------------------------------------------------
@app.command("pretrain", context_settings=OVERRIDES)
def pretrain_cmd(
    ctx: typer.Context,
    model: Path = typer.Option(..., help="Model directory to start from (init-model output)"),
    kb: Path = typer.Option(..., help="KB whose synonyms (and definitions) make the examples"),
    config: Path = typer.Option(..., help="Stage config, e.g. configs/pretrain_tiny.cfg"),
    out: Path = STAGE_OUT,
    dev: Optional[Path] = typer.Option(None, help="Dev mentions (corpus output) to monitor zero-shot recall"),
    device: str = DEVICE,
    resume: bool = RESUME,
    verbose: bool = VERBOSE_FLAG,
) -> None:
    """KB-guided pre-training (extra options override the config: --training.max_steps 100)."""
    setup_logging(verbose)
    from spacy_genbioel.training.stages import StageRun, pretrain

    result = pretrain(
        model, kb, config, out, dev_jsonl=dev, overrides=stage_overrides(ctx), run=StageRun(device, resume)
    )
    msg.good(f"Pre-trained {result.step} steps ({result.stopped_by}, {result.seconds:.0f}s) -> {result.model_dir}")


@app.command("finetune", context_settings=OVERRIDES)
def finetune_cmd(
    ctx: typer.Context,
    model: Path = typer.Option(..., help="Model directory to start from (pre-trained)"),
    train: Path = typer.Option(..., help="Training examples (corpus output train.jsonl)"),
    kb: Path = DECODED_KB,
    config: Path = typer.Option(..., help="Stage config, e.g. configs/finetune_tiny.cfg"),
    out: Path = STAGE_OUT,
    dev: Optional[Path] = typer.Option(
        None, help="Dev mentions (corpus output dev.jsonl) for evaluation and best model"
    ),
    device: str = DEVICE,
    resume: bool = RESUME,
    verbose: bool = VERBOSE_FLAG,
) -> None:
    """Synonyms-aware fine-tuning, evaluated on dev every N steps (extra options override the config)."""
    setup_logging(verbose)
    from spacy_genbioel.training.stages import StageRun, finetune

    result = finetune(model, train, dev, kb, config, out, overrides=stage_overrides(ctx), run=StageRun(device, resume))
    best = f", best {result.best_metric:.4f} at step {result.best_step}" if result.best_metric is not None else ""
    msg.good(f"Fine-tuned {result.step} steps ({result.stopped_by}, {result.seconds:.0f}s{best}) -> {result.model_dir}")


@app.command("angel", context_settings=OVERRIDES)
def angel_cmd(
    ctx: typer.Context,
    model: Path = typer.Option(..., help="Positive-only model to start from (fine-tuned)"),
    train: Path = typer.Option(..., help="Training mentions (corpus output train.jsonl)"),
    kb: Path = DECODED_KB,
    config: Path = typer.Option(..., help="Stage config, e.g. configs/angel_tiny.cfg"),
    out: Path = typer.Option(..., help="Output folder (model, best, pairs, log, curve)"),
    dev: Optional[Path] = typer.Option(
        None, help="Dev mentions (corpus output dev.jsonl): recall@1 after each round, best model kept"
    ),
    device: str = DEVICE,
    kb_negatives: Optional[int] = typer.Option(
        None,
        help="KB-guided pre-training pairs (other concepts' most similar names as negatives) mixed into each round "
        "(overrides angel.kb_negatives)",
    ),
    verbose: bool = VERBOSE_FLAG,
) -> None:
    """ANGEL negative-aware training: mine the model's own wrong candidates, DPO, rounds until dev recall@1 \
stops improving."""
    setup_logging(verbose)
    from spacy_genbioel.training.angel import angel

    overrides = stage_overrides(ctx)
    if kb_negatives is not None:
        overrides["angel.kb_negatives"] = kb_negatives
    result = angel(model, train, dev, kb, config, out, overrides=overrides, device=device)
    best = ""
    if result.best_metric is not None:
        best = f", dev {result.best_metric:.4f} at round {result.best_round} (start {result.baseline_metric:.4f})"
    msg.good(
        f"ANGEL: {len(result.rounds)} rounds, {result.step} steps ({result.stopped_by}, {result.seconds:.0f}s{best}) "
        f"-> {result.model_dir}"
    )


# -- the dense retriever ----------------------------------------------------------------------------
@app.command("train-dense", context_settings=OVERRIDES)
def train_dense_cmd(
    ctx: typer.Context,
    kb: Path = typer.Option(..., help="KB whose synonyms make the positive pairs"),
    out: Path = typer.Option(..., help="Output folder: model/, train_log.jsonl, config.cfg, result.json"),
    config: Path = typer.Option(Path("configs/dense_minilm.cfg"), help="Settings, e.g. configs/dense_minilm.cfg"),
    model: Optional[Path] = typer.Option(
        None, help="Encoder directory to start from (default: the installed all-MiniLM-L6-v2)"
    ),
    train: Optional[Path] = typer.Option(
        None, help="Training examples (corpus output train.jsonl): mention -> gold name pairs"
    ),
    device: str = DEVICE,
    verbose: bool = VERBOSE_FLAG,
) -> None:
    """SapBERT-style fine-tuning of a dense encoder on KB synonym pairs (multi-similarity loss, online hard mining)."""
    setup_logging(verbose)
    from spacy_genbioel.training.sapbert import train_dense

    result = train_dense(
        kb, out, config, model_dir=model, train_jsonl=train, overrides=stage_overrides(ctx), device=device
    )
    last = sum(result.losses[-50:]) / max(1, len(result.losses[-50:]))
    msg.good(
        f"Trained {result.step} steps, {result.epoch} full epochs ({result.stopped_by}, {result.seconds:.0f}s, "
        f"loss {last:.4f}) -> {result.model_dir}"
    )
