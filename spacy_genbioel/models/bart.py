"""From-scratch BART: the size presets, a byte-level BPE tokenizer trained on
KB names (and optional corpus text), and a randomly initialized model of a
preset's shape. No pretrained weights can be downloaded on these machines, so
this is how every test and workflow model starts (:mod:`.presets` dispatches
between these and the warm starts)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Iterable, Iterator, Union

import torch

from spacy_genbioel.models.hf import MARKERS

logger = logging.getLogger(__name__)

SPECIAL_TOKENS = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]


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
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        unk_token="<unk>",
        mask_token="<mask>",
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
