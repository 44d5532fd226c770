"""What the model reads and is prompted with: GenBioEL's encoder text
``left START mention END right`` and decoder prompt ``mention is``
(:class:`InputBuilder`), and their token ids: the encoder's
(:class:`SourceEncoder`) and the decoder prompt's (:class:`PromptTokenizer`),
shared by inference and training so both see exactly the same tokens.

The encoder input never loses its mention: a text longer than
``max_source_tokens`` has its context trimmed in tokens around ``START mention
END``, from both sides, and a mention longer than the cap is itself shortened
(its start kept). A text that fits is tokenized in one piece, exactly as it
always was. :func:`has_linkable_text` tells whether a mention has anything to
link at all (not only control characters, whitespace or emoji).

``InputBuilder.style`` picks how the text is written: ``genbioel.v1`` (this
package's: whitespace collapsed, ``context_words`` each side) or one of the
released styles of :mod:`~spacy_genbioel.linking.inputs.released_style`, which write
exactly what the published GenBioEL and ANGEL models were trained on."""

from __future__ import annotations

import logging
import re
import unicodedata
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Dict, List, Optional, Sequence, Tuple

from spacy_genbioel.linking.inputs.released_style import (
    RELEASED_MAX_WORDS,
    RELEASED_STYLES,
    MentionRules,
    document_words,
    released_mention,
    released_parts,
)
from spacy_genbioel.linking.numbers import Bound, bounded, check_numbers
from spacy_genbioel.models import MARKERS
from spacy_genbioel.ty import Mention

if TYPE_CHECKING:  # pragma: no cover
    import torch

logger = logging.getLogger(__name__)

_SPACES = re.compile(r"\s+")
# control, format, private-use and unassigned characters, separators, marks and
# "other"/modifier symbols (emoji, skin tones): a text made only of these has
# nothing the KB could name
_NOTHING_TO_LINK = ("C", "Z", "M", "So", "Sk")
#: what one encoder input holds: a mention in its context, or a document with all its mentions
INPUT_MODES = ("mention", "document")
#: how the encoder text and the decoder prompt are written (``InputBuilder.style``)
INPUT_STYLES = ("genbioel.v1", *RELEASED_STYLES)


def has_linkable_text(text: str, normalize: Callable[[str], str]) -> bool:
    """Whether ``normalize(text)`` keeps a character a KB name could hold (a
    letter, digit, punctuation, ...), not only control characters, whitespace or emoji."""
    return any(not unicodedata.category(ch).startswith(_NOTHING_TO_LINK) for ch in normalize(text))


@dataclass
class InputBuilder:
    """Turns a mention into GenBioEL's encoder text and decoder prompt text: the
    ``inputs`` block of the component and of the training configs (registered as
    ``genbioel.inputs.v1``). ``decoder_prompt`` and ``input_mode`` must match what
    the model was trained with."""

    start_marker: str = MARKERS[0]
    end_marker: str = MARKERS[1]
    context_words: int = bounded(64, Bound(int, 0))
    max_mention_words: int = bounded(32, Bound(int, 1))
    lowercase: bool = True
    prompt_suffix: str = "is"
    #: GenBioEL prompts the decoder with "mention is"; False starts the name
    #: right after the decoder's start tokens (GenBioEL's Table 4 ablation)
    decoder_prompt: bool = True
    #: "mention": one encoder input per mention, ``context_words`` around it
    #: (GenBioEL); "document": one input per document (or window of it) with
    #: every mention marked, encoded once for all its mentions
    #: (:mod:`~spacy_genbioel.linking.inputs.documents`)
    input_mode: str = "mention"
    #: "genbioel.v1": this package's text (whitespace collapsed, ``context_words``
    #: each side, ``max_mention_words``, ``lowercase``); "genbioel-released-ncbi.v1" /
    #: "genbioel-released-bc5cdr.v1": exactly the inputs the published models of that
    #: corpus were trained on (:mod:`~spacy_genbioel.linking.inputs.released_style`: the whole
    #: lower-cased document cut at 384 words, the mention as GenBioEL wrote it, a
    #: leading space before the encoder text and the prompt, no ``<s>`` in the decoder
    #: prefix); these fix the context, the mention and the case themselves
    style: str = "genbioel.v1"

    def __post_init__(self) -> None:
        check_numbers(self, "inputs")
        if self.input_mode not in INPUT_MODES:
            raise ValueError(f"input_mode must be one of {INPUT_MODES} (got {self.input_mode!r})")
        if self.style not in INPUT_STYLES:
            raise ValueError(f"style must be one of {INPUT_STYLES} (got {self.style!r})")
        if self.released is not None and self.input_mode != "mention":
            raise ValueError(
                f"style {self.style!r} writes one input per mention (input_mode 'mention'), "
                f"as the published models read them (got input_mode {self.input_mode!r})"
            )

    @property
    def released(self) -> Optional[MentionRules]:
        """The released style's mention rules; None for ``genbioel.v1``."""
        return RELEASED_STYLES.get(self.style)

    @property
    def window_words(self) -> int:
        """Words of the document a caller should give on each side of a mention: the
        released styles cut the whole document themselves (at most 384 words in all)."""
        return max(self.context_words, RELEASED_MAX_WORDS) if self.released is not None else self.context_words

    @property
    def text_prefix(self) -> str:
        """What goes before the encoder text and the decoder prompt when tokenized: GenBioEL
        tokenized ``" " + text`` (so its first word is a word inside a sentence)."""
        return " " if self.released is not None else ""

    def clean(self, text: str) -> str:
        """Unicode NFC, whitespace collapsed (and lowercased when ``lowercase``), as the model reads text."""
        text = _SPACES.sub(" ", unicodedata.normalize("NFC", text)).strip()  # NFC: as the KB's names (kb.normalizers)
        return text.lower() if self.lowercase else text

    def mention_text(self, mention: Mention) -> str:
        """The mention as the model reads it between the markers and in the prompt."""
        rules = self.released
        if rules is not None:
            return released_mention(mention.text, mention.ids, rules)
        return " ".join(self.clean(mention.text).split(" ")[: self.max_mention_words])

    def parts(self, mention: Mention, n_words: Optional[int] = None) -> Tuple[str, str, str, str, str]:
        """``(left, START, mention, END, right)``: the pieces :meth:`source` joins
        with single spaces (``left`` and ``right`` empty when there is no context).
        ``n_words`` (released styles): the words of the whole document, which decide
        the cut; by default counted from ``left``, the mention and ``right``, exact
        unless the caller replaced the mention by a long form of another length in a
        document of about 384 words."""
        if self.released is not None:
            if n_words is None:
                n_words = document_words(mention.left, mention.text, mention.right)
            markers = (self.start_marker, self.end_marker)
            return released_parts(mention.left, self.mention_text(mention), mention.right, markers, n_words)
        n = self.context_words
        left = self.clean(mention.left).split(" ")[-n:] if n > 0 and mention.left.strip() else []
        right = self.clean(mention.right).split(" ")[:n] if n > 0 and mention.right.strip() else []
        return " ".join(left), self.start_marker, self.mention_text(mention), self.end_marker, " ".join(right)

    def source(self, mention: Mention, n_words: Optional[int] = None) -> str:
        """The encoder text (``n_words``: see :meth:`parts`)."""
        left, start, text, end, right = self.parts(mention, n_words)
        return " ".join([*([left] if left else []), start, text, end, *([right] if right else [])])

    def prompt(self, mention: Mention) -> str:
        """The decoder prompt text, ``"mention is"`` (empty without a prompt)."""
        if not self.decoder_prompt:
            return ""
        if self.released is not None:  # GenBioEL wrote mention + " is", as it is
            return f"{self.mention_text(mention)} {self.prompt_suffix}"
        return f"{self.mention_text(mention)} {self.prompt_suffix}".strip()


class SourceEncoder:
    """Encoder token ids of :meth:`InputBuilder.source` texts, the one function
    inference and training both use, so a model is trained on the tokens it reads.

    A text that fits in ``max_tokens`` (special tokens included) is tokenized
    in one piece, exactly as it always was. A longer one is rebuilt from its
    parts, each tokenized alone: ``START mention END`` always stays (a mention
    longer than the cap keeps its first tokens, and is counted in the log), and
    the context is trimmed in tokens from both sides, each side getting half of
    the room left and the part of its half the other side cannot use.
    ``stats`` counts the trimmed inputs (``context_trimmed``, ``mention_shortened``).
    """

    #: no tokenizer spends this many characters on one token: a longer text
    #: cannot fit, and longer parts are cut to this before tokenizing (bounded work)
    MAX_CHARS_PER_TOKEN = 100

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.stats: Counter = Counter()
        # the special tokens the tokenizer wraps a text in (<s> ... </s>, [CLS] ... [SEP])
        bare = tokenizer("x", add_special_tokens=False)["input_ids"]
        full = tokenizer("x")["input_ids"]
        at = next((i for i in range(len(full) - len(bare) + 1) if full[i : i + len(bare)] == bare), None)
        if at is None:
            raise ValueError(
                f"Cannot tell the special tokens of {type(tokenizer).__name__}: {full} does not contain {bare}"
            )
        self.prefix, self.suffix = full[:at], full[at + len(bare) :]
        self._documents = None

    @property
    def documents(self):
        """The per-document inputs (:class:`~spacy_genbioel.linking.inputs.documents.DocumentSources`)
        this encoder builds when ``inputs.input_mode == "document"``; ``register`` a
        corpus's mentions on it so that batches holding part of a document still see all of it."""
        if self._documents is None:
            from spacy_genbioel.linking.inputs.documents import DocumentSources

            self._documents = DocumentSources(self)
        return self._documents

    def ids(self, mentions: Sequence[Mention], inputs: InputBuilder, max_tokens: int) -> List[List[int]]:
        """Token ids (special tokens included, at most ``max_tokens``) per mention;
        in document mode, mentions of one document window share one list."""
        if inputs.input_mode == "document":
            return self.documents.ids(mentions, inputs, max_tokens)
        texts = [inputs.text_prefix + inputs.source(m) for m in mentions]
        out: List[Optional[List[int]]] = [None] * len(texts)
        whole = [i for i, text in enumerate(texts) if len(text) <= self.MAX_CHARS_PER_TOKEN * max_tokens]
        if whole:
            # one more than the cap tells a text that fits from one that does not
            encoded = self.tokenizer([texts[i] for i in whole], truncation=True, max_length=max_tokens + 1)["input_ids"]
            for i, ids in zip(whole, encoded):
                if len(ids) <= max_tokens:
                    out[i] = list(ids)
        todo = [i for i, ids in enumerate(out) if ids is None]
        if todo:
            trimmed = self._trimmed([inputs.parts(mentions[i]) for i in todo], max_tokens, inputs.text_prefix)
            for i, ids in zip(todo, trimmed):
                out[i] = ids
        return out  # type: ignore[return-value]

    def encode(self, mentions: Sequence[Mention], inputs: InputBuilder, max_tokens: int) -> Dict[str, "torch.Tensor"]:
        """``input_ids`` and ``attention_mask`` of :meth:`ids`, padded as the tokenizer pads."""
        return self.pad(self.ids(mentions, inputs, max_tokens))

    def pad(self, rows: Sequence[Sequence[int]]) -> Dict[str, "torch.Tensor"]:
        import torch

        pad_id = self.tokenizer.pad_token_id
        if pad_id is None:
            raise ValueError(f"{type(self.tokenizer).__name__} has no padding token")
        width = max((len(r) for r in rows), default=0)
        ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for row, seq in enumerate(rows):
            cols = slice(width - len(seq), width) if self.tokenizer.padding_side == "left" else slice(0, len(seq))
            ids[row, cols] = torch.tensor(seq, dtype=torch.long)
            mask[row, cols] = 1
        return {"input_ids": ids, "attention_mask": mask}

    def pieces(self, texts: Sequence[str]) -> List[List[int]]:
        """Token ids of text pieces, without special tokens (the pieces of a trimmed
        or per-document input, tokenized alone and joined)."""
        return self.tokenizer(list(texts), add_special_tokens=False)["input_ids"] if texts else []

    def fit_mention(self, text: List[int], markers: int, budget: int, max_tokens: int) -> Tuple[List[int], bool]:
        """A mention's tokens cut to the room ``budget`` leaves beside its ``markers``
        tokens (its first tokens kept), and whether they were cut; no room at all is an error."""
        room = budget - markers
        if room < min(1, len(text)):
            raise ValueError(
                f"max_source_tokens ({max_tokens}) leaves no room for a mention between its markers "
                f"({markers} marker and {len(self.prefix) + len(self.suffix)} special tokens)"
            )
        return (text[:room], True) if len(text) > room else (text, False)

    def _trimmed(
        self, parts: Sequence[Tuple[str, str, str, str, str]], max_tokens: int, prefix: str = ""
    ) -> List[List[int]]:
        pieces = self.pieces(self._piece_texts(parts, self.MAX_CHARS_PER_TOKEN * max_tokens, prefix))
        budget = max_tokens - len(self.prefix) - len(self.suffix)
        out: List[List[int]] = []
        shortened = 0
        for k in range(len(parts)):
            left, start, text, end, right = (list(p) for p in pieces[5 * k : 5 * k + 5])
            text, cut = self.fit_mention(text, len(start) + len(end), budget, max_tokens)
            shortened += cut
            rest = budget - len(start) - len(end) - len(text)
            left_quota, right_quota = rest // 2, rest - rest // 2
            # the part of one side's half the other side cannot use goes to it
            left_quota, right_quota = (
                left_quota + max(0, right_quota - len(right)),
                right_quota + max(0, left_quota - len(left)),
            )
            kept_left = left[len(left) - min(left_quota, len(left)) :]
            kept_right = right[:right_quota]
            if len(kept_left) < len(left) or len(kept_right) < len(right):
                self.stats["context_trimmed"] += 1
            out.append(self.prefix + kept_left + start + text + end + kept_right + self.suffix)
        self.stats["mention_shortened"] += shortened
        if shortened:
            logger.warning(
                "%d mention(s) longer than max_source_tokens (%d) shortened to their first tokens (%d so far)",
                shortened,
                max_tokens,
                self.stats["mention_shortened"],
            )
        logger.debug("%d encoder input(s) over %d tokens trimmed around their mention", len(parts), max_tokens)
        return out

    @staticmethod
    def _piece_texts(parts: Sequence[Tuple[str, str, str, str, str]], cap: int, prefix: str) -> List[str]:
        """The five pieces of each part as :meth:`source` joins them (single spaces, none before the first;
        the text's ``prefix``, a released style's leading space, before the first), the context and the
        mention cut to ``cap`` characters."""
        texts: List[str] = []
        for left, start, text, end, right in parts:
            left = left[-cap:]
            texts += [
                prefix + left if left else "",
                (" " if left else prefix) + start,
                " " + text[:cap],
                " " + end,
                " " + right[:cap] if right else "",
            ]
        return texts


class PromptTokenizer:
    """Token ids of decoder prompts and targets, shared by inference and training
    so both see exactly the same decoder prefix (ANGEL's released code does not).

    ``inputs`` with a released style gives the published models' decoder inputs:
    the start token alone (``</s>``; GenBioEL's labels had no ``<s>``) and the
    prompt tokenized after a space (``" mention is"``), so that without a prompt the
    trie is rooted at the start token, as GenBioEL rooted it."""

    def __init__(
        self,
        tokenizer,
        decoder_start_token_id: int,
        eos_token_id: int,
        max_prompt_tokens: int = 48,
        inputs: Optional[InputBuilder] = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.decoder_start_token_id = decoder_start_token_id
        self.eos_token_id = eos_token_id
        self.max_prompt_tokens = max_prompt_tokens
        self.text_prefix = inputs.text_prefix if inputs is not None else ""
        bos = tokenizer.bos_token_id
        # BART-style models see "</s> <s> ..." after fine-tuning with shifted labels
        with_bos = bos is not None and bos != decoder_start_token_id and (inputs is None or inputs.released is None)
        self.prefix = [decoder_start_token_id] + ([bos] if with_bos else [])

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
        if any(texts):
            encoded = self.tokenizer([self.text_prefix + t if t else t for t in texts], add_special_tokens=False)[
                "input_ids"
            ]
        else:
            encoded = [[] for _ in texts]
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
