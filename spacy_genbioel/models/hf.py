"""Hugging Face model directories: load, save, tokenizers and special ids.

Any local Hugging Face encoder-decoder directory loads (BART, BioBART, the
dmis-lab ANGEL checkpoints whose tokenizer lives elsewhere, an
``EncoderDecoderModel``, T5), always with ``local_files_only``: these machines
reach no model hub. Weights are written as safetensors only.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Optional, Tuple, Union

from spacy_genbioel.util import PathLike, resolve_device, resolve_dtype

if TYPE_CHECKING:  # pragma: no cover
    import torch

MARKERS = ("START", "END")
TOKENIZER_FILES = ("tokenizer.json", "vocab.json", "vocab.txt", "spiece.model", "sentencepiece.bpe.model")


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
    device: Union[str, "torch.device"] = "cpu",
    dtype: str = "fp32",
):
    """Load ``(model, tokenizer)`` from local directories, in eval mode on ``device``."""
    from transformers import AutoModelForSeq2SeqLM

    path = Path(path)
    if not (path / "config.json").exists():
        raise FileNotFoundError(f"No Hugging Face model (config.json) in {path}")
    dev = resolve_device(device) if isinstance(device, str) else device
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
