"""The training workflow's steps as plain functions (``project.yml`` runs them
through ``python -m spacy_genbioel ...``): corpus, tokenizer, init-model,
pretrain, finetune, package.

Settings of the training stages live in ``configs/<stage>_<preset>.cfg``
(confection/thinc format) with sections:

* ``[training]``: :class:`~spacy_genbioel.training.engine.EngineConfig`;
* ``[inputs]``: the encoder input (``context_words``, ``max_mention_words``,
  ``lowercase``, ``decoder_prompt``), shared with the packaged pipeline;
* ``[data]``: stage-specific data settings (pre-training templates; how many
  KB-guided examples fine-tuning mixes in; the dev subset and beams used for
  evaluation during training).

Overrides use dotted keys, as in spaCy: ``{"training.max_seconds": 600}``
(``--training.max_seconds 600`` on the command line).
"""
from __future__ import annotations

import json
import logging
import random
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, Iterable, List, Mapping, Optional, Sequence, Union

import typer  # light; annotations of the commands below are resolved in this module
from spacy_genbioel.util import PathLike, fingerprint as _fingerprint

if TYPE_CHECKING:  # the command-line app imports this module: keep torch out until a step runs
    from spacy_genbioel.linking.decoder import InputBuilder
    from spacy_genbioel.kb.base import KnowledgeBase
    from spacy_genbioel.ty import Mention
    from spacy_genbioel.training.engine import EngineConfig, ExampleSource, TrainResult
    from spacy_genbioel.training.examples import TrainingExample

logger = logging.getLogger(__name__)


_INPUT_KEYS = ("context_words", "max_mention_words", "lowercase", "decoder_prompt")
_DATA_DEFAULTS: Dict[str, Any] = {
    # pre-training (GenBioEL section 2.2)
    "max_context_synonyms": 3,
    "use_definitions": True,
    "max_synonyms_per_concept": None,
    # fine-tuning: KB-guided examples mixed into each epoch (0: none), so a
    # small model keeps every name reachable while it learns the corpus
    "kb_examples_per_epoch": 0,
    # evaluation during training
    "eval_mentions": 0,  # first N dev mentions (0: all)
    "eval_beams": 5,
    "eval_batch_size": 64,
}
#: further sections that the stage owning them reads and checks itself
#: (``[angel]``: :mod:`~spacy_genbioel.training.angel`), kept in ``StageConfig.sections``
_STAGE_SECTIONS = ("angel",)


@dataclass
class StageConfig:
    """One training stage's settings, read from a ``.cfg`` file."""

    training: EngineConfig
    inputs: InputBuilder
    data: Dict[str, Any] = field(default_factory=dict)
    text: str = ""  # the resolved config, written next to the outputs
    sections: Dict[str, Dict[str, Any]] = field(default_factory=dict)  # e.g. {"angel": {...}}

    def to_dict(self) -> Dict[str, Any]:
        return {"training": asdict(self.training), "inputs": {k: getattr(self.inputs, k) for k in _INPUT_KEYS}, "data": self.data}


def load_stage_config(path: PathLike, overrides: Optional[Mapping[str, Any]] = None) -> StageConfig:
    """Read a stage config (``configs/*.cfg``) with dotted-key overrides."""
    from confection import Config

    from spacy_genbioel.linking.decoder import InputBuilder
    from spacy_genbioel.training.engine import EngineConfig

    config = Config().from_disk(str(path), overrides=dict(overrides or {}))
    unknown_sections = sorted(set(config) - {"training", "inputs", "data", *_STAGE_SECTIONS})
    if unknown_sections:
        raise ValueError(f"{path}: unknown sections {unknown_sections}; use [training], [inputs] and [data]")
    training = EngineConfig.from_dict(dict(config.get("training", {})))
    inputs_cfg = dict(config.get("inputs", {}))
    bad = sorted(set(inputs_cfg) - set(_INPUT_KEYS))
    if bad:
        raise ValueError(f"{path}: unknown [inputs] settings {bad}; known: {list(_INPUT_KEYS)}")
    data = dict(_DATA_DEFAULTS)
    extra = sorted(set(config.get("data", {})) - set(_DATA_DEFAULTS))
    if extra:
        raise ValueError(f"{path}: unknown [data] settings {extra}; known: {sorted(_DATA_DEFAULTS)}")
    data.update(config.get("data", {}))
    sections = {name: dict(config[name]) for name in _STAGE_SECTIONS if name in config}
    return StageConfig(training, InputBuilder(**inputs_cfg), data, config.to_str(), sections)


def _write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, default=str), encoding="utf8")


# -- corpus ---------------------------------------------------------------------------
def _read_corpus(path: PathLike, crosswalk: Optional[Mapping[str, str]], context_chars: Optional[int]):
    from spacy_genbioel.corpus.readers import document_mentions, read_pubtator

    documents = list(read_pubtator(path, crosswalk=crosswalk))
    mentions = [m for doc in documents for m in document_mentions(doc, context_chars=context_chars)]
    return documents, mentions


def make_corpus(
    train_pubtator: PathLike,
    dev_pubtator: PathLike,
    kb_path: PathLike,
    out_dir: PathLike,
    top_k_targets: int = 1,
    abbreviations: bool = False,
    crosswalk: Optional[PathLike] = None,
    context_chars: int = 2000,
    labels: Sequence[str] = (),
    target_strategy: str = "tfidf",
    seed: int = 0,
) -> Dict[str, Any]:
    """Training and dev examples from PubTator corpora.

    Writes ``out_dir/train.jsonl`` (one line per target: ``top_k_targets``
    per usable mention, chosen by :func:`~spacy_genbioel.training.targets.select_targets`),
    ``out_dir/dev.jsonl`` (every dev mention, composite ones included, no
    target: the evaluation set), ``out_dir/texts.txt`` (training documents, one
    per line, for the tokenizer) and ``out_dir/stats.json``. ``abbreviations``
    replaces short forms by their long forms (scispacy's detector) before the
    targets are chosen, as GenBioEL did with Ab3P. ``labels`` keeps only
    mentions of those entity types. ``target_strategy`` picks the synonym a
    training mention is taught (``tfidf``, GenBioEL's synonyms-aware choice;
    ``shortest``, ``random`` and ``first`` for ablations).
    """
    from spacy_genbioel.kb.base import KnowledgeBase
    from spacy_genbioel.kb.sources import read_crosswalk
    from spacy_genbioel.training.examples import write_examples_jsonl
    from spacy_genbioel.training.targets import select_targets

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    walk = read_crosswalk(crosswalk) if crosswalk else None
    kb = KnowledgeBase.load(kb_path)
    train_docs, train_mentions = _read_corpus(train_pubtator, walk, None)
    dev_docs, dev_mentions = _read_corpus(dev_pubtator, walk, None)
    if labels:
        train_mentions = [m for m in train_mentions if m.label in labels]
        dev_mentions = [m for m in dev_mentions if m.label in labels]
    stats: Dict[str, Any] = {"train_documents": len(train_docs), "dev_documents": len(dev_docs)}
    if abbreviations:
        from spacy_genbioel.linking.abbreviations import AbbreviationExpander

        expander = AbbreviationExpander()
        train_mentions, stats["train_expanded"] = expander.expand(train_mentions, {d.pmid: d.text for d in train_docs})
        dev_mentions, stats["dev_expanded"] = expander.expand(dev_mentions, {d.pmid: d.text for d in dev_docs})

    def cut(m: Mention) -> Mention:
        import dataclasses

        return dataclasses.replace(m, left=m.left[len(m.left) - context_chars:] if context_chars else "",
                                   right=m.right[:context_chars])

    examples, target_stats = select_targets(kb, train_mentions, top_k=top_k_targets, strategy=target_strategy, seed=seed)
    stats["targets"] = {**target_stats, "strategy": target_strategy}
    stats["train_lines"] = write_examples_jsonl(((cut(e.mention), e.target) for e in examples), out / "train.jsonl")
    stats["dev_lines"] = write_examples_jsonl(((cut(m), None) for m in dev_mentions), out / "dev.jsonl")
    with (out / "texts.txt").open("w", encoding="utf8") as texts:
        for doc in train_docs:
            texts.write(" ".join(doc.text.split()) + "\n")
    stats["kb"] = {"path": str(kb_path), "concepts": len(kb), "names": kb.n_names}
    _write_json(out / "stats.json", stats)
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
    from spacy_genbioel.kb.base import KnowledgeBase
    from spacy_genbioel.models.bart import PRESETS, train_tokenizer
    from spacy_genbioel.models.bert2bert import is_warm_start, save_marker_tokenizer

    if is_warm_start(preset):
        return save_marker_tokenizer(preset, out_dir)
    kb = KnowledgeBase.load(kb_path)
    size = vocab_size or PRESETS[preset].vocab_size
    lines: Iterable[str] = ()
    if texts:
        lines = (line.strip() for line in Path(texts).open(encoding="utf8") if line.strip())
    tokenizer = train_tokenizer(kb.names, lines, vocab_size=size)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(str(out))
    logger.info("Tokenizer with %d tokens -> %s", len(tokenizer), out)
    return out


def init_model_step(tokenizer_dir: PathLike, out_dir: PathLike, preset: Union[str, Any] = "tiny", seed: int = 0) -> Path:
    """A randomly initialized preset model (a name or a :class:`~spacy_genbioel.models.bart.Preset`)
    for a saved tokenizer, saved with it; a warm-start preset (``minilm``) builds a
    BERT2BERT from its checkpoint with that tokenizer (the ``tokenizer`` step's output)."""
    from spacy_genbioel.models.bart import PRESETS, build_model, load_tokenizer, save_model
    from spacy_genbioel.models.bert2bert import WARM_START_PRESETS, init_warm_start, is_warm_start

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
class SampledSource:
    """``n`` examples of another source per epoch, a new seeded sample each epoch."""

    def __init__(self, source: ExampleSource, n: int, seed: int = 0) -> None:
        self.source, self.n, self.seed = source, n, seed

    def epoch(self, epoch: int) -> Sequence[TrainingExample]:
        full = self.source.epoch(epoch)
        if self.n >= len(full):
            return full
        picks = random.Random(f"{self.seed}/{epoch}/sample").sample(range(len(full)), self.n)
        return [full[i] for i in picks]


def _load_for_training(model_dir: PathLike, device: str):
    from spacy_genbioel.models.bart import load_model, resolve_device

    dev = resolve_device(device)
    model, tokenizer = load_model(model_dir, device=dev, dtype="fp32")  # fp32 master weights; bf16 via autocast
    return model, tokenizer, dev


def _evaluator(stage: StageConfig, kb: KnowledgeBase, dev_jsonl: Optional[PathLike]):
    from spacy_genbioel.training.engine import linking_evaluator
    from spacy_genbioel.training.examples import read_mentions_jsonl

    if not dev_jsonl:
        return None
    mentions = [m for m, _ in read_mentions_jsonl(dev_jsonl)]
    return linking_evaluator(
        kb, mentions, inputs=stage.inputs, num_beams=int(stage.data["eval_beams"]),
        batch_size=int(stage.data["eval_batch_size"]), max_mentions=int(stage.data["eval_mentions"]) or None,
    )


def _run_stage(stage: StageConfig, model_dir: PathLike, kb: KnowledgeBase, source: ExampleSource, out_dir: PathLike,
               dev_jsonl: Optional[PathLike], device: str, resume: bool, inputs: Sequence[PathLike] = ()) -> TrainResult:
    from spacy_genbioel.training.engine import TrainingEngine

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    # a checkpoint is only resumed when it grew from the same start model and data
    # (a rerun after an earlier step changed must start afresh); the config may change
    fingerprint = _fingerprint([model_dir, *inputs])
    stamp = out / "inputs.sha256"
    if resume and stamp.exists() and stamp.read_text(encoding="utf8").strip() != fingerprint:
        logger.warning("%s: the start model or the data changed since the checkpoint was written; starting afresh", out)
        resume = False
    stamp.write_text(fingerprint + "\n", encoding="utf8")
    model, tokenizer, dev = _load_for_training(model_dir, device)
    (out / "config.cfg").write_text(stage.text, encoding="utf8")
    engine = TrainingEngine(model, tokenizer, stage.training, inputs=stage.inputs, out_dir=out,
                            evaluate=_evaluator(stage, kb, dev_jsonl), device=dev)
    result = engine.train(source, resume=resume)
    _write_json(out / "result.json", result.to_dict())
    return result


def pretrain(
    model_dir: PathLike,
    kb_path: PathLike,
    config_path: PathLike,
    out_dir: PathLike,
    dev_jsonl: Optional[PathLike] = None,
    overrides: Optional[Mapping[str, Any]] = None,
    device: str = "auto",
    resume: bool = True,
) -> TrainResult:
    """KB-guided pre-training; the model ends in ``out_dir/model`` (best on dev when ``dev_jsonl`` is given)."""
    from spacy_genbioel.kb.base import KnowledgeBase
    from spacy_genbioel.training.pretraining import PretrainingExamples

    stage = load_stage_config(config_path, overrides)
    kb = KnowledgeBase.load(kb_path)
    d = stage.data
    source = PretrainingExamples(kb, stage.training.seed, max_context_synonyms=int(d["max_context_synonyms"]),
                                 use_definitions=bool(d["use_definitions"]), max_synonyms_per_concept=d["max_synonyms_per_concept"])
    logger.info("Pre-training on %d (concept, synonym) pairs per epoch", len(source))
    return _run_stage(stage, model_dir, kb, source, out_dir, dev_jsonl, device, resume, inputs=[kb_path])


def finetune(
    model_dir: PathLike,
    train_jsonl: PathLike,
    dev_jsonl: Optional[PathLike],
    kb_path: PathLike,
    config_path: PathLike,
    out_dir: PathLike,
    overrides: Optional[Mapping[str, Any]] = None,
    device: str = "auto",
    resume: bool = True,
) -> TrainResult:
    """Synonyms-aware fine-tuning on ``train_jsonl``, evaluated on ``dev_jsonl``
    every ``eval_every`` steps; the best model ends in ``out_dir/model``."""
    from spacy_genbioel.kb.base import KnowledgeBase
    from spacy_genbioel.training.engine import FixedExamples, MixedExamples
    from spacy_genbioel.training.examples import read_examples_jsonl
    from spacy_genbioel.training.pretraining import PretrainingExamples

    stage = load_stage_config(config_path, overrides)
    kb = KnowledgeBase.load(kb_path)
    examples = read_examples_jsonl(train_jsonl)
    if not examples:
        raise ValueError(f"{train_jsonl}: no training examples with a target")
    source: ExampleSource = FixedExamples(examples)
    n_kb = int(stage.data["kb_examples_per_epoch"])
    if n_kb > 0:
        d = stage.data
        kb_source = PretrainingExamples(kb, stage.training.seed, max_context_synonyms=int(d["max_context_synonyms"]),
                                        use_definitions=bool(d["use_definitions"]))
        source = MixedExamples(source, SampledSource(kb_source, n_kb, stage.training.seed))
    return _run_stage(stage, model_dir, kb, source, out_dir, dev_jsonl, device, resume, inputs=[train_jsonl, kb_path])


# -- package -----------------------------------------------------------------------------
def add_kb_entity_ruler(nlp, kb: KnowledgeBase, label: Optional[str] = None, min_chars: int = 3) -> int:
    """A case-insensitive dictionary NER over the KB's raw names (the entity
    source until a trained NER is available); returns the pattern count.
    Names shorter than ``min_chars`` (``AS``, ``MS``...) are left out: as
    dictionary patterns they match ordinary words far more often than concepts."""
    ruler = nlp.add_pipe("entity_ruler", config={"phrase_matcher_attr": "LOWER"})
    patterns = []
    seen = set()
    for concept in kb:
        tag = label or (concept.types[0] if concept.types else "ENTITY")
        for name in concept.names:
            key = (tag, name.lower())
            if len(name) < min_chars or key in seen:
                continue
            seen.add(key)
            patterns.append({"label": tag, "pattern": name})
    ruler.add_patterns(patterns)
    return len(patterns)


def package(
    model_dir: PathLike,
    kb_path: PathLike,
    out_dir: PathLike,
    name: str = "genbioel_pipeline",
    version: str = "0.0.0",
    config_path: Optional[PathLike] = None,
    entity_label: Optional[str] = None,
    entity_ruler: bool = True,
    abbreviations: bool = True,
    num_beams: int = 5,
    top_k: int = 5,
    min_name_chars: int = 3,
    lang: str = "en",
    ner: Optional[PathLike] = None,
    exact_match: bool = False,
    candidates: str = "none",
    num_candidates: int = 20,
    restrict_to_candidates: bool = True,
    shortcut_threshold: Optional[float] = None,
) -> Path:
    """A spaCy pipeline directory: scispacy's ``abbreviation_detector`` (when
    installed), an ``entity_ruler`` over the KB names, and ``genbioel`` with
    the trained model, KB and trie inside. ``spacy.load(out_dir)`` reads it;
    ``spacy package out_dir dist`` makes an installable package of it.
    ``config_path`` (the fine-tuning config) supplies the encoder-input settings
    the model was trained with. ``ner`` (a trained spaCy pipeline directory)
    replaces the entity ruler: its tokenizer, ``tok2vec`` and ``ner`` are
    sourced (:func:`~spacy_genbioel.ner.source_ner`), giving tokenizer,
    abbreviation_detector, tok2vec, ner, genbioel. ``exact_match``,
    ``candidates``, ``num_candidates``, ``restrict_to_candidates`` and
    ``shortcut_threshold`` set the component's settings of those names (a
    retriever is rebuilt from the KB on first use; nothing extra is stored)."""
    import spacy

    from spacy_genbioel.linking.decoder import GenerativeLinker, InputBuilder
    from spacy_genbioel.kb.base import KnowledgeBase
    from spacy_genbioel.models.bart import load_model

    inputs = InputBuilder()
    max_source_tokens = 256
    if config_path:
        stage = load_stage_config(config_path)
        inputs, max_source_tokens = stage.inputs, stage.training.max_source_tokens
        if inputs.max_mention_words != InputBuilder().max_mention_words:
            logger.warning("max_mention_words=%d is not a pipeline setting; the pipeline uses %d",
                           inputs.max_mention_words, InputBuilder().max_mention_words)
    kb = KnowledgeBase.load(kb_path)
    model, tokenizer = load_model(model_dir, device="cpu", dtype="fp32")
    ner_nlp = spacy.load(ner) if ner is not None else None
    if ner_nlp is not None and ner_nlp.lang != lang:
        logger.warning("The NER pipeline's language is %r, not %r: the package uses %r", ner_nlp.lang, lang, ner_nlp.lang)
        lang = ner_nlp.lang
    nlp = spacy.blank(lang)
    source = f"the NER trained in {ner}" if ner is not None else "a dictionary entity source"
    nlp.meta.update({
        "name": name,
        "version": version,
        "description": f"Generative biomedical entity linking (GenBioEL) with {source}",
        "requirements": _requirements(),
    })
    if abbreviations:
        from spacy_genbioel.demo import abbreviation_detector_available

        if abbreviation_detector_available():
            nlp.add_pipe("abbreviation_detector")
        else:
            logger.warning("scispacy is not installed: the pipeline has no abbreviation detector")
    if ner_nlp is not None:
        from spacy_genbioel.ner import source_ner

        logger.info("Sourced %s from %s", source_ner(nlp, ner_nlp), ner)
    elif entity_ruler:
        n_patterns = add_kb_entity_ruler(nlp, kb, entity_label, min_name_chars)
        logger.info("entity_ruler with %d patterns", n_patterns)
    component = nlp.add_pipe("genbioel", config={
        "num_beams": num_beams, "top_k": top_k, "exact_match": exact_match, "candidates": candidates,
        "num_candidates": num_candidates, "restrict_to_candidates": restrict_to_candidates,
        "shortcut_threshold": shortcut_threshold, "context_words": inputs.context_words,
        "lowercase": inputs.lowercase, "decoder_prompt": inputs.decoder_prompt, "max_source_tokens": max_source_tokens,
        "device": "auto",
    })
    component.set_linker(GenerativeLinker(model, tokenizer, kb, inputs=component.inputs, config=component.decoding))
    out = Path(out_dir)
    if out.exists():
        shutil.rmtree(out)
    nlp.to_disk(out)
    return out


def _requirements() -> List[str]:
    try:
        from importlib.metadata import version

        return [f"spacy_genbioel>={version('spacy_genbioel')}"]
    except Exception:  # not installed as a distribution (a source checkout)
        return ["spacy_genbioel"]


def parse_overrides(args: Sequence[str]) -> Dict[str, Any]:
    """``["--training.max_steps", "100"]`` -> ``{"training.max_steps": 100}`` (spaCy's rules)."""
    from spacy.cli._util import parse_config_overrides

    return parse_config_overrides(list(args))


# -- command-line wiring ---------------------------------------------------------------------
def register_commands(app) -> None:
    """Add ``corpus``, ``tokenizer``, ``pretrain``, ``finetune`` and ``package``
    to a typer app (``cli.py``: ``register_commands(app)``). ``pretrain`` and
    ``finetune`` take config overrides as extra options
    (``--training.max_seconds 600``). Heavy imports wait until a command runs."""
    from wasabi import msg

    def setup(verbose: bool) -> None:
        logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, format="%(asctime)s %(name)s %(message)s")
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()

    overrides_ok = {"allow_extra_args": True, "ignore_unknown_options": True}

    @app.command("corpus")
    def corpus_cmd(
        train: Path = typer.Option(..., help="Training split (PubTator)"),
        dev: Path = typer.Option(..., help="Dev split (PubTator)"),
        kb: Path = typer.Option(..., help="KB (.jsonl or target_kb.json)"),
        out: Path = typer.Option(..., help="Output folder: train.jsonl, dev.jsonl, texts.txt, stats.json"),
        top_k_targets: int = typer.Option(1, help="Synonyms per training mention as separate targets (ANGEL: 3)"),
        abbreviations: bool = typer.Option(False, help="Expand short forms with scispacy before choosing targets"),
        crosswalk: Optional[Path] = typer.Option(None, help="Old -> new ID TSV applied to gold IDs"),
        context_chars: int = typer.Option(2000, help="Characters of context kept on each side"),
        labels: List[str] = typer.Option([], help="Only mentions with these entity types"),
        targets: str = typer.Option("tfidf", help="Target synonym: tfidf (synonyms-aware) | shortest | random | first (ablations)"),
        seed: int = typer.Option(0, help="Seed of --targets random"),
        verbose: bool = typer.Option(False, "--verbose", "-v"),
    ) -> None:
        """Training examples with synonyms-aware targets (char 3-gram TF-IDF) and dev mentions."""
        setup(verbose)
        from spacy_genbioel.training.targets import TARGET_STRATEGIES

        if targets not in TARGET_STRATEGIES:
            raise typer.BadParameter(f"--targets must be one of {', '.join(TARGET_STRATEGIES)}")
        stats = make_corpus(train, dev, kb, out, top_k_targets=top_k_targets, abbreviations=abbreviations,
                            crosswalk=crosswalk, context_chars=context_chars, labels=labels,
                            target_strategy=targets, seed=seed)
        t = stats["targets"]
        msg.good(f"{stats['train_lines']} training examples from {t['used']} of {t['mentions']} mentions "
                 f"(composite {t['composite']}, no gold {t['no_gold']}, not in KB {t['not_in_kb']}); "
                 f"{stats['dev_lines']} dev mentions -> {out}")

    @app.command("tokenizer")
    def tokenizer_cmd(
        kb: Optional[Path] = typer.Option(None, help="KB whose names the tokenizer learns (not needed for minilm)"),
        out: Path = typer.Option(..., help="Output tokenizer directory"),
        texts: Optional[Path] = typer.Option(None, help="Extra text, one document per line"),
        preset: str = typer.Option("tiny", help="Preset whose vocabulary size to use; minilm: save its pretrained tokenizer"),
        vocab_size: Optional[int] = typer.Option(None, help="Vocabulary size (default: the preset's)"),
        verbose: bool = typer.Option(False, "--verbose", "-v"),
    ) -> None:
        """Train a byte-level BPE tokenizer (BART's special tokens, START/END markers) on KB names and text
        (a warm-start preset such as minilm: its pretrained WordPiece tokenizer plus the markers)."""
        setup(verbose)
        from spacy_genbioel.models.bert2bert import is_warm_start

        if kb is None and not is_warm_start(preset):
            raise typer.BadParameter("--kb is required to train a tokenizer")
        train_tokenizer_step(kb, out, texts=texts, vocab_size=vocab_size, preset=preset)
        msg.good(f"Tokenizer saved to {out}")

    def stage_options(ctx: typer.Context) -> Dict[str, Any]:
        return parse_overrides(ctx.args)

    @app.command("pretrain", context_settings=overrides_ok)
    def pretrain_cmd(
        ctx: typer.Context,
        model: Path = typer.Option(..., help="Model directory to start from (init-model output)"),
        kb: Path = typer.Option(..., help="KB whose synonyms (and definitions) make the examples"),
        config: Path = typer.Option(..., help="Stage config, e.g. configs/pretrain_tiny.cfg"),
        out: Path = typer.Option(..., help="Output folder (checkpoint, best, model, log, curve)"),
        dev: Optional[Path] = typer.Option(None, help="Dev mentions (corpus output) to monitor zero-shot recall"),
        device: str = typer.Option("auto", help="auto | cpu | cuda | cuda:N"),
        resume: bool = typer.Option(True, help="Continue from out/checkpoint when there is one"),
        verbose: bool = typer.Option(False, "--verbose", "-v"),
    ) -> None:
        """KB-guided pre-training (extra options override the config: --training.max_steps 100)."""
        setup(verbose)
        result = pretrain(model, kb, config, out, dev_jsonl=dev, overrides=stage_options(ctx), device=device, resume=resume)
        msg.good(f"Pre-trained {result.step} steps ({result.stopped_by}, {result.seconds:.0f}s) -> {result.model_dir}")

    @app.command("finetune", context_settings=overrides_ok)
    def finetune_cmd(
        ctx: typer.Context,
        model: Path = typer.Option(..., help="Model directory to start from (pre-trained)"),
        train: Path = typer.Option(..., help="Training examples (corpus output train.jsonl)"),
        kb: Path = typer.Option(..., help="KB the model decodes into"),
        config: Path = typer.Option(..., help="Stage config, e.g. configs/finetune_tiny.cfg"),
        out: Path = typer.Option(..., help="Output folder (checkpoint, best, model, log, curve)"),
        dev: Optional[Path] = typer.Option(None, help="Dev mentions (corpus output dev.jsonl) for evaluation and best model"),
        device: str = typer.Option("auto", help="auto | cpu | cuda | cuda:N"),
        resume: bool = typer.Option(True, help="Continue from out/checkpoint when there is one"),
        verbose: bool = typer.Option(False, "--verbose", "-v"),
    ) -> None:
        """Synonyms-aware fine-tuning, evaluated on dev every N steps (extra options override the config)."""
        setup(verbose)
        result = finetune(model, train, dev, kb, config, out, overrides=stage_options(ctx), device=device, resume=resume)
        best = f", best {result.best_metric:.4f} at step {result.best_step}" if result.best_metric is not None else ""
        msg.good(f"Fine-tuned {result.step} steps ({result.stopped_by}, {result.seconds:.0f}s{best}) -> {result.model_dir}")

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
        setup(verbose)
        path = package(model, kb, out, name=name, version=version, config_path=config, entity_label=entity_label,
                       entity_ruler=entity_ruler, abbreviations=abbreviations, num_beams=num_beams, top_k=top_k,
                       min_name_chars=min_name_chars, lang=lang, ner=ner, exact_match=exact_match, candidates=candidates,
                       num_candidates=num_candidates, restrict_to_candidates=restrict, shortcut_threshold=shortcut_threshold)
        msg.good(f"Pipeline saved to {path}")
