"""What the model reads and is prompted with: GenBioEL's encoder text
``left START mention END right`` and decoder prompt ``mention is``
(:class:`InputBuilder`), and their token ids (:class:`PromptTokenizer`), shared
by inference and training so both see exactly the same decoder prefix."""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import List, Optional, Sequence

from spacy_genbioel.models import MARKERS
from spacy_genbioel.ty import Mention

_SPACES = re.compile(r"\s+")


@dataclass
class InputBuilder:
    """Turns a mention into GenBioEL's encoder text and decoder prompt text."""

    start_marker: str = MARKERS[0]
    end_marker: str = MARKERS[1]
    context_words: int = 64
    max_mention_words: int = 32
    lowercase: bool = True
    prompt_suffix: str = "is"
    #: GenBioEL prompts the decoder with "mention is"; False starts the name
    #: right after the decoder's start tokens (GenBioEL's Table 4 ablation)
    decoder_prompt: bool = True

    def _clean(self, text: str) -> str:
        text = _SPACES.sub(" ", text).strip()
        return text.lower() if self.lowercase else text

    def mention_text(self, mention: Mention) -> str:
        return " ".join(self._clean(mention.text).split(" ")[: self.max_mention_words])

    def source(self, mention: Mention) -> str:
        n = self.context_words
        left = self._clean(mention.left).split(" ")[-n:] if n > 0 and mention.left.strip() else []
        right = self._clean(mention.right).split(" ")[:n] if n > 0 and mention.right.strip() else []
        return " ".join([*left, self.start_marker, self.mention_text(mention), self.end_marker, *right])

    def prompt(self, mention: Mention) -> str:
        if not self.decoder_prompt:
            return ""
        return f"{self.mention_text(mention)} {self.prompt_suffix}".strip()


class PromptTokenizer:
    """Token ids of decoder prompts and targets, shared by inference and training
    so both see exactly the same decoder prefix (ANGEL's released code does not)."""

    def __init__(self, tokenizer, decoder_start_token_id: int, eos_token_id: int, max_prompt_tokens: int = 48) -> None:
        self.tokenizer = tokenizer
        self.decoder_start_token_id = decoder_start_token_id
        self.eos_token_id = eos_token_id
        self.max_prompt_tokens = max_prompt_tokens
        bos = tokenizer.bos_token_id
        # BART-style models see "</s> <s> ..." after fine-tuning with shifted labels
        self.prefix = [decoder_start_token_id] + ([bos] if bos is not None and bos != decoder_start_token_id else [])

    def root_token_id(self, suffix: Optional[str] = "is") -> int:
        """The last prompt token, which roots the name trie (derived, never
        hard-coded); without a prompt (``suffix=None``), the last start token."""
        if suffix is None:
            return int(self.prefix[-1])
        ids = self.tokenizer(f"x {suffix}", add_special_tokens=False)["input_ids"]
        return int(ids[-1])

    def prompts(self, texts: Sequence[str]) -> List[List[int]]:
        texts = list(texts)
        # no decoder prompt: empty texts, the prompt is the start tokens alone
        encoded = self.tokenizer(texts, add_special_tokens=False)["input_ids"] if any(texts) else [[] for _ in texts]
        room = self.max_prompt_tokens - len(self.prefix)
        # keep the end (" is") when a very long mention must be cut
        return [self.prefix + (ids[-room:] if len(ids) > room else ids) for ids in encoded]

    def targets(self, names: Sequence[str]) -> List[List[int]]:
        """Name tokens plus EOS: what the trie holds and what training predicts."""
        encoded = self.tokenizer([" " + n for n in names], add_special_tokens=False)["input_ids"] if names else []
        return [ids + [self.eos_token_id] for ids in encoded]


def model_max_positions(model) -> int:
    """Longest input the model's position embeddings allow (T5's relative positions: no limit)."""
    config = model.config
    for cfg in (getattr(config, "encoder", None), config):
        value = getattr(cfg, "max_position_embeddings", None) if cfg is not None else None
        if value:
            return int(value)
    return 4096
