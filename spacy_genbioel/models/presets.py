"""One entry point for a new model: a from-scratch BART preset (``tiny``,
``base``, ``large``; :mod:`.bart`) or a warm start from pretrained weights
(``minilm``; :mod:`.bert2bert`). It sits above both, so neither imports the other."""

from __future__ import annotations

import logging
from typing import Iterable, List, Optional

from spacy_genbioel.models.bart import PRESETS, build_model, train_tokenizer
from spacy_genbioel.models.bert2bert import WARM_START_PRESETS, init_warm_start
from spacy_genbioel.models.hf import save_model
from spacy_genbioel.util import PathLike

logger = logging.getLogger(__name__)

__all__ = ["init_model", "known_presets"]


def known_presets() -> List[str]:
    return [*PRESETS, *WARM_START_PRESETS]


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
    if preset in WARM_START_PRESETS:
        return init_warm_start(preset, out, seed=seed)
    if preset not in PRESETS:
        raise ValueError(f"Unknown preset {preset!r}; choose from {', '.join(known_presets())}")
    tokenizer = train_tokenizer(names, texts, vocab_size=vocab_size or PRESETS[preset].vocab_size)
    model = build_model(preset, tokenizer, seed=seed)
    save_model(model, tokenizer, out)
    n_params = sum(p.numel() for p in model.parameters())
    logger.info(
        "Built %s model with %.1fM parameters, vocabulary %d, at %s", preset, n_params / 1e6, len(tokenizer), out
    )
    return model, tokenizer
