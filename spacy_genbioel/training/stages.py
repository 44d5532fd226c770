"""The training workflow's steps as plain functions (``project.yml`` runs them
through ``python -m spacy_genbioel ...``, :mod:`spacy_genbioel.cli.train`):
corpus, tokenizer, init-model, pretrain and finetune. The ``angel`` step is
:func:`spacy_genbioel.training.angel.angel`, ``train-dense``
:func:`spacy_genbioel.training.sapbert.train_dense`, ``package``
:func:`spacy_genbioel.training.package.package`.

Each training stage reads its settings with
:func:`~spacy_genbioel.training.settings.load_stage_config` (overrides are an
already parsed dotted-key dict: ``{"training.max_seconds": 600}``), trains
with the :class:`~spacy_genbioel.training.engine.TrainingEngine` and leaves
``config.cfg`` and ``result.json`` next to the engine's outputs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterable, Mapping, Optional, Sequence, Tuple, Union

import torch

from spacy_genbioel.corpus.askapatient import read_askapatient
from spacy_genbioel.corpus.pubtator import document_mentions, read_pubtator
from spacy_genbioel.kb.base import KnowledgeBase
from spacy_genbioel.kb.crosswalk import read_crosswalk
from spacy_genbioel.linking.inputs.abbreviations import AbbreviationExpander
from spacy_genbioel.models import PRESETS, build_model, load_model, load_tokenizer, save_model, train_tokenizer
from spacy_genbioel.models.bert2bert import WARM_START_PRESETS, init_warm_start, is_warm_start, save_marker_tokenizer
from spacy_genbioel.training.engine import TrainingEngine, TrainResult
from spacy_genbioel.training.evaluator import stage_evaluator
from spacy_genbioel.training.examples import TrainingExample, read_mentions_jsonl, write_examples_jsonl
from spacy_genbioel.training.pretraining import PretrainingExamples
from spacy_genbioel.training.settings import StageConfig, load_stage_config
from spacy_genbioel.training.sources import ExampleSource, FixedExamples, MixedExamples, SampledSource
from spacy_genbioel.training.targets import select_targets
from spacy_genbioel.ty import Mention
from spacy_genbioel.util import PathLike, atomic_json, fingerprint, resolve_device

logger = logging.getLogger(__name__)


# -- corpus ---------------------------------------------------------------------------
def _read_corpus(
    paths: Union[PathLike, Sequence[PathLike]],
    crosswalk: Optional[Mapping[str, str]],
    context_chars: Optional[int],
    fmt: str = "pubtator",
):
    """Documents and mentions of one split, or of several read as one (the published protocol's train + dev);
    ``askapatient`` files have mentions only."""
    documents, mentions = [], []
    for path in [paths] if isinstance(paths, (str, Path)) else paths:
        if fmt == "askapatient":
            mentions.extend(read_askapatient(path))
            continue
        if fmt != "pubtator":
            raise ValueError(f"unknown corpus format {fmt!r}: pubtator or askapatient")
        docs = list(read_pubtator(path, crosswalk=crosswalk))
        documents.extend(docs)
        mentions.extend(m for doc in docs for m in document_mentions(doc, context_chars=context_chars))
    return documents, mentions


@dataclass(frozen=True)
class CorpusSettings:
    """How :func:`make_corpus` reads the corpora and teaches their mentions."""

    #: ``pubtator``, or ``askapatient`` (AskAPatient folds: mentions without context)
    fmt: str = "pubtator"
    #: an old -> new ID TSV applied to the gold IDs
    crosswalk: Optional[PathLike] = None
    #: keep only mentions of these entity types (empty: all)
    labels: Sequence[str] = ()
    #: replace short forms by their long forms (scispacy's detector) before the targets are chosen,
    #: as GenBioEL did with Ab3P
    abbreviations: bool = False
    #: characters of context kept on each side of a mention
    context_chars: int = 2000
    #: synonyms per training mention, each a line of ``train.jsonl`` (ANGEL: 3)
    top_k_targets: int = 1
    #: the synonym a mention is taught: ``tfidf`` (GenBioEL's synonyms-aware choice);
    #: ``shortest``, ``random``, ``first``
    target_strategy: str = "tfidf"
    #: seed of the ``random`` strategy
    seed: int = 0


def make_corpus(
    train_pubtator: Union[PathLike, Sequence[PathLike]],
    dev_pubtator: PathLike,
    kb_path: PathLike,
    out_dir: PathLike,
    settings: Optional[CorpusSettings] = None,
) -> Dict[str, Any]:
    """Training and dev examples from PubTator corpora (or AskAPatient folds:
    :class:`CorpusSettings` says how they are read and taught). ``train_pubtator``
    may list several files, read as one split.

    Writes ``out_dir/train.jsonl`` (one line per target: ``top_k_targets``
    per usable mention, chosen by :func:`~spacy_genbioel.training.targets.select_targets`),
    ``out_dir/dev.jsonl`` (every dev mention, composite ones included, no
    target: the evaluation set), ``out_dir/texts.txt`` (training documents, one
    per line, for the tokenizer) and ``out_dir/stats.json``.
    """
    s = settings or CorpusSettings()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    walk = read_crosswalk(s.crosswalk) if s.crosswalk else None
    kb = KnowledgeBase.load(kb_path)
    train_docs, train_mentions = _read_corpus(train_pubtator, walk, None, s.fmt)
    dev_docs, dev_mentions = _read_corpus(dev_pubtator, walk, None, s.fmt)
    if s.labels:
        train_mentions = [m for m in train_mentions if m.label in s.labels]
        dev_mentions = [m for m in dev_mentions if m.label in s.labels]
    stats: Dict[str, Any] = {"train_documents": len(train_docs), "dev_documents": len(dev_docs)}
    if s.abbreviations:
        expander = AbbreviationExpander()
        train_mentions, stats["train_expanded"] = expander.expand(train_mentions, {d.pmid: d.text for d in train_docs})
        dev_mentions, stats["dev_expanded"] = expander.expand(dev_mentions, {d.pmid: d.text for d in dev_docs})

    context_chars = s.context_chars

    def cut(m: Mention) -> Mention:
        return dataclasses.replace(
            m,
            left=m.left[max(0, len(m.left) - context_chars) :] if context_chars else "",
            right=m.right[:context_chars],
        )

    examples, target_stats = select_targets(
        kb, train_mentions, top_k=s.top_k_targets, strategy=s.target_strategy, seed=s.seed
    )
    stats["targets"] = {**target_stats, "strategy": s.target_strategy}
    stats["train_lines"] = write_examples_jsonl(((cut(e.mention), e.target) for e in examples), out / "train.jsonl")
    stats["dev_lines"] = write_examples_jsonl(((cut(m), None) for m in dev_mentions), out / "dev.jsonl")
    with (out / "texts.txt").open("w", encoding="utf8") as texts:
        for doc in train_docs:
            texts.write(" ".join(doc.text.split()) + "\n")
        if not train_docs:  # mentions without documents (AskAPatient): their texts
            texts.writelines(" ".join(m.text.split()) + "\n" for m in train_mentions)
    stats["kb"] = {"path": str(kb_path), "concepts": len(kb), "names": kb.n_names}
    atomic_json(out / "stats.json", stats)
    logger.info("Corpus: %d training lines, %d dev mentions -> %s", stats["train_lines"], stats["dev_lines"], out)
    return stats


# -- tokenizer and model --------------------------------------------------------------
def train_tokenizer_step(
    kb_path: PathLike,
    out_dir: PathLike,
    texts: Optional[PathLike] = None,
    vocab_size: Optional[int] = None,
    preset: str = "tiny",
) -> Path:
    """A byte-level BPE tokenizer trained on the KB names (and ``texts``, one document per line).
    A warm-start preset (``minilm``) brings its own tokenizer: it is saved with the
    START/END markers added, and nothing is trained (``kb_path``, ``texts`` unused)."""
    if is_warm_start(preset):
        return save_marker_tokenizer(preset, out_dir)
    kb = KnowledgeBase.load(kb_path)
    size = vocab_size or PRESETS[preset].vocab_size
    with contextlib.ExitStack() as stack:  # the texts file is closed however training ends
        lines: Iterable[str] = ()
        if texts:
            source = stack.enter_context(Path(texts).open(encoding="utf8"))
            lines = (line.strip() for line in source if line.strip())
        tokenizer = train_tokenizer(kb.names, lines, vocab_size=size)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(str(out))
    logger.info("Tokenizer with %d tokens -> %s", len(tokenizer), out)
    return out


def init_model_step(
    tokenizer_dir: PathLike, out_dir: PathLike, preset: Union[str, Any] = "tiny", seed: int = 0
) -> Path:
    """A randomly initialized preset model (a name or a :class:`~spacy_genbioel.models.bart.Preset`)
    for a saved tokenizer, saved with it; a warm-start preset (``minilm``) builds a
    BERT2BERT from its checkpoint with that tokenizer (the ``tokenizer`` step's output)."""
    if is_warm_start(preset):
        init_warm_start(preset, out_dir, tokenizer_dir=tokenizer_dir, seed=seed)
        return Path(out_dir)
    if isinstance(preset, str) and preset not in PRESETS:
        raise ValueError(f"Unknown preset {preset!r}; choose from {', '.join([*PRESETS, *WARM_START_PRESETS])}")
    tokenizer = load_tokenizer(tokenizer_dir)
    model = build_model(preset, tokenizer, seed=seed)
    save_model(model, tokenizer, out_dir)
    return Path(out_dir)


# -- training stages ---------------------------------------------------------------------
def load_for_training(model_dir: PathLike, device: str) -> Tuple[Any, Any, torch.device]:
    """A saved model (fp32 master weights; bf16 comes from autocast), its tokenizer and the resolved device."""
    dev = resolve_device(device)
    model, tokenizer = load_model(model_dir, device=dev, dtype="fp32")  # fp32 master weights; bf16 via autocast
    return model, tokenizer, dev


@dataclass(frozen=True)
class StageRun:
    """Where a training stage runs and whether it continues from its checkpoint."""

    #: ``auto``, ``cpu``, ``cuda`` or ``cuda:N``
    device: str = "auto"
    #: continue from ``out_dir/checkpoint`` when there is one (and it grew from the same start model and inputs)
    resume: bool = True


@dataclass(frozen=True)
class StageData:
    """What a training stage learns from and is evaluated on."""

    #: the training examples
    source: ExampleSource
    #: the files the examples come from: a checkpoint is resumed only when they are unchanged
    inputs: Sequence[PathLike] = ()
    #: every mention of the training corpus, so that per-document inputs mark all of a document's mentions
    #: whatever the batch
    documents: Sequence[Mention] = ()
    #: dev mentions (the corpus step's ``dev.jsonl``) for the evaluation and the best model
    dev_jsonl: Optional[PathLike] = None


def run_stage(
    stage: StageConfig,
    model_dir: PathLike,
    kb: KnowledgeBase,
    data: StageData,
    out_dir: PathLike,
    run: Optional[StageRun] = None,
) -> TrainResult:
    """Train ``model_dir`` on ``data.source`` with the training engine into ``out_dir``
    (``config.cfg``, ``inputs.sha256``, ``result.json`` and the engine's files);
    a checkpoint there is resumed only when the start model and ``data.inputs`` are
    the ones it grew from."""
    run = run or StageRun()
    resume = run.resume
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    # a checkpoint is only resumed when it grew from the same start model and data
    # (a rerun after an earlier step changed must start afresh); the config may change
    stamp_value = fingerprint([model_dir, *data.inputs])
    stamp = out / "inputs.sha256"
    if resume and stamp.exists() and stamp.read_text(encoding="utf8").strip() != stamp_value:
        logger.warning("%s: the start model or the data changed since the checkpoint was written; starting afresh", out)
        resume = False
    stamp.write_text(stamp_value + "\n", encoding="utf8")
    model, tokenizer, dev = load_for_training(model_dir, run.device)
    (out / "config.cfg").write_text(stage.text, encoding="utf8")
    engine = TrainingEngine(
        model,
        tokenizer,
        stage.training,
        inputs=stage.inputs,
        out_dir=out,
        evaluate=stage_evaluator(stage, kb, data.dev_jsonl),
        device=dev,
    )
    if stage.inputs.input_mode == "document":
        engine.loss.sources.documents.register(data.documents)
    result = engine.train(data.source, resume=resume)
    atomic_json(out / "result.json", result.to_dict())
    return result


def kb_guided_examples(
    stage: StageConfig, kb: KnowledgeBase, max_synonyms_per_concept: Optional[int] = None
) -> PretrainingExamples:
    """KB-guided pre-training examples with the stage's ``[data]`` template
    settings (pre-training; fine-tuning and ANGEL mix some in)."""
    d = stage.data
    return PretrainingExamples(
        kb,
        stage.training.seed,
        max_context_synonyms=int(d["max_context_synonyms"]),
        use_definitions=bool(d["use_definitions"]),
        max_synonyms_per_concept=max_synonyms_per_concept,
    )


def pretrain(
    model_dir: PathLike,
    kb_path: PathLike,
    config_path: PathLike,
    out_dir: PathLike,
    dev_jsonl: Optional[PathLike] = None,
    overrides: Optional[Mapping[str, Any]] = None,
    run: Optional[StageRun] = None,
) -> TrainResult:
    """KB-guided pre-training; the model ends in ``out_dir/model`` (best on dev when ``dev_jsonl`` is given).
    ``overrides`` change the config (dotted keys); ``run``: the device and whether to resume."""
    stage = load_stage_config(config_path, overrides)
    kb = KnowledgeBase.load(kb_path)
    source = kb_guided_examples(stage, kb, max_synonyms_per_concept=stage.data["max_synonyms_per_concept"])
    logger.info("Pre-training on %d (concept, synonym) pairs per epoch", len(source))
    return run_stage(stage, model_dir, kb, StageData(source, inputs=[kb_path], dev_jsonl=dev_jsonl), out_dir, run)


def finetune(
    model_dir: PathLike,
    train_jsonl: PathLike,
    dev_jsonl: Optional[PathLike],
    kb_path: PathLike,
    config_path: PathLike,
    out_dir: PathLike,
    overrides: Optional[Mapping[str, Any]] = None,
    run: Optional[StageRun] = None,
) -> TrainResult:
    """Synonyms-aware fine-tuning on ``train_jsonl``, evaluated on ``dev_jsonl``
    every ``eval_every`` steps; the best model ends in ``out_dir/model``.
    ``overrides`` change the config (dotted keys); ``run``: the device and whether to resume."""
    stage = load_stage_config(config_path, overrides)
    kb = KnowledgeBase.load(kb_path)
    mentions = list(read_mentions_jsonl(train_jsonl))
    examples = [TrainingExample(m, t) for m, t in mentions if t]
    if not examples:
        raise ValueError(f"{train_jsonl}: no training examples with a target")
    source: ExampleSource = FixedExamples(examples)
    n_kb = int(stage.data["kb_examples_per_epoch"])
    if n_kb > 0:
        source = MixedExamples(source, SampledSource(kb_guided_examples(stage, kb), n_kb, stage.training.seed))
    data = StageData(source, inputs=[train_jsonl, kb_path], documents=[m for m, _ in mentions], dev_jsonl=dev_jsonl)
    return run_stage(stage, model_dir, kb, data, out_dir, run)
