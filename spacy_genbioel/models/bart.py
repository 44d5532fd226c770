"""Loading, saving and building seq2seq models and their tokenizers.

Any local Hugging Face encoder-decoder directory loads (BART, BioBART, the
dmis-lab ANGEL checkpoints whose tokenizer lives elsewhere, an
``EncoderDecoderModel``, T5), always with ``local_files_only``: these machines
reach no model hub. Since no pretrained weights can be downloaded here, the
presets build a BART from scratch with a byte-level BPE tokenizer trained on the
KB names (and optional corpus text). Warm-start presets (``minilm``) and any local
BERT directory build a BERT2BERT instead: see :mod:`spacy_genbioel.models.bert2bert`.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator, Optional, Tuple, Union

import torch
from spacy_genbioel.util import PathLike, resolve_device, resolve_dtype

logger = logging.getLogger(__name__)

MARKERS = ("START", "END")
SPECIAL_TOKENS = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
TOKENIZER_FILES = ("tokenizer.json", "vocab.json", "vocab.txt", "spiece.model", "sentencepiece.bpe.model")


@dataclass(frozen=True)
class Preset:
    d_model: int
    encoder_layers: int
    decoder_layers: int
    attention_heads: int
    ffn_dim: int
    max_position_embeddings: int
    vocab_size: int


PRESETS = {
    # CPU-trainable; about 8M parameters with an 8k vocabulary.
    "tiny": Preset(256, 3, 3, 4, 1024, 512, 8000),
    # the shapes of facebook/bart-base and facebook/bart-large
    "base": Preset(768, 6, 6, 12, 3072, 1024, 32000),
    "large": Preset(1024, 12, 12, 16, 4096, 1024, 50265),
}


def load_tokenizer(path: PathLike):
    from transformers import AutoTokenizer

    path = Path(path)
    if not any((path / name).exists() for name in TOKENIZER_FILES):
        raise FileNotFoundError(
            f"No tokenizer in {path} (looked for {', '.join(TOKENIZER_FILES)}); "
            "checkpoints such as dmis-lab/ANGEL_* ship without one: pass the tokenizer directory separately"
        )
    return AutoTokenizer.from_pretrained(str(path), local_files_only=True)


def load_model(
    path: PathLike,
    tokenizer_path: Optional[PathLike] = None,
    device: Union[str, torch.device] = "cpu",
    dtype: str = "fp32",
):
    """Load ``(model, tokenizer)`` from local directories, in eval mode on ``device``."""
    from transformers import AutoModelForSeq2SeqLM

    path = Path(path)
    if not (path / "config.json").exists():
        raise FileNotFoundError(f"No Hugging Face model (config.json) in {path}")
    dev = device if isinstance(device, torch.device) else resolve_device(device)
    tokenizer = load_tokenizer(tokenizer_path or path)
    model = AutoModelForSeq2SeqLM.from_pretrained(str(path), local_files_only=True, dtype=resolve_dtype(dtype, dev))
    model.to(dev).eval()
    return model, tokenizer


def save_model(model, tokenizer, path: PathLike) -> None:
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(path), safe_serialization=True)
    tokenizer.save_pretrained(str(path))


def special_ids(model, tokenizer) -> Tuple[int, int, int]:
    """(decoder_start, eos, pad) ids for any encoder-decoder family."""
    cfg = model.config
    gen = getattr(model, "generation_config", None)
    start = getattr(cfg, "decoder_start_token_id", None)
    if start is None and gen is not None:
        start = gen.decoder_start_token_id
    eos = getattr(gen, "eos_token_id", None) if gen is not None else None
    if isinstance(eos, (list, tuple)):
        eos = eos[0]
    if eos is None:
        eos = getattr(cfg, "eos_token_id", None)
    if eos is None:
        eos = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else tokenizer.sep_token_id
    pad = getattr(cfg, "pad_token_id", None)
    if pad is None:
        pad = tokenizer.pad_token_id
    if start is None:
        start = pad
    if start is None or eos is None or pad is None:
        raise ValueError("The model needs decoder_start_token_id, eos_token_id and pad_token_id")
    return int(start), int(eos), int(pad)


def _training_lines(names: Iterable[str], texts: Iterable[str]) -> Iterator[str]:
    for name in names:
        yield name
    # the markers must be single tokens; a few hundred lines make BPE learn them
    for _ in range(500):
        yield f"{MARKERS[0]} x {MARKERS[1]} is"
    for text in texts:
        yield text


def train_tokenizer(names: Iterable[str], texts: Iterable[str] = (), vocab_size: int = 8000, min_frequency: int = 2):
    """A byte-level BPE tokenizer (BART's special tokens and ids) trained on KB names and text."""
    from tokenizers import ByteLevelBPETokenizer, processors
    from transformers import PreTrainedTokenizerFast

    bpe = ByteLevelBPETokenizer(add_prefix_space=True)
    bpe.train_from_iterator(
        _training_lines(names, texts), vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=SPECIAL_TOKENS
    )
    bpe.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0), add_prefix_space=True)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe._tokenizer,
        bos_token="<s>", eos_token="</s>", pad_token="<pad>", unk_token="<unk>", mask_token="<mask>",
        model_max_length=1024,
    )
    return tokenizer


def build_model(preset: Union[str, Preset], tokenizer, seed: int = 0, dropout: float = 0.1):
    """A randomly initialized BART of a preset's shape for ``tokenizer``."""
    from transformers import BartConfig, BartForConditionalGeneration, GenerationConfig

    spec = PRESETS[preset] if isinstance(preset, str) else preset
    config = BartConfig(
        vocab_size=len(tokenizer),
        d_model=spec.d_model,
        encoder_layers=spec.encoder_layers,
        decoder_layers=spec.decoder_layers,
        encoder_attention_heads=spec.attention_heads,
        decoder_attention_heads=spec.attention_heads,
        encoder_ffn_dim=spec.ffn_dim,
        decoder_ffn_dim=spec.ffn_dim,
        max_position_embeddings=spec.max_position_embeddings,
        dropout=dropout,
        attention_dropout=0.0,
        activation_dropout=0.0,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        decoder_start_token_id=tokenizer.eos_token_id,
        forced_bos_token_id=None,
        forced_eos_token_id=None,
        scale_embedding=True,
        tie_word_embeddings=True,
    )
    torch.manual_seed(seed)
    model = BartForConditionalGeneration(config)
    # a plain generation config: no forced tokens, no n-gram blocking
    model.generation_config = GenerationConfig(
        decoder_start_token_id=config.decoder_start_token_id,
        bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id,
    )
    return model


def init_model(
    preset: str,
    names: Iterable[str],
    out: PathLike,
    texts: Iterable[str] = (),
    vocab_size: Optional[int] = None,
    seed: int = 0,
):
    """Train a tokenizer on KB names (+ texts), build a preset model, save both to ``out``.
    A warm-start preset (``minilm``) brings its own tokenizer and weights: ``names``,
    ``texts`` and ``vocab_size`` are not used."""
    from spacy_genbioel.models.bert2bert import WARM_START_PRESETS, init_warm_start

    if preset in WARM_START_PRESETS:
        return init_warm_start(preset, out, seed=seed)
    if preset not in PRESETS:
        raise ValueError(f"Unknown preset {preset!r}; choose from {', '.join([*PRESETS, *WARM_START_PRESETS])}")
    tokenizer = train_tokenizer(names, texts, vocab_size=vocab_size or PRESETS[preset].vocab_size)
    model = build_model(preset, tokenizer, seed=seed)
    save_model(model, tokenizer, out)
    n_params = sum(p.numel() for p in model.parameters())
    logger.info("Built %s model with %.1fM parameters, vocabulary %d, at %s", preset, n_params / 1e6, len(tokenizer), out)
    return model, tokenizer
