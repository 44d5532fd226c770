"""Token ids of every KB name, for building the name trie: fast for 10M names.

Tokenizing ``" " + name`` name by name costs tens of microseconds each (minutes
for UMLS's names), and most of that is spent on words the KB repeats. A KB
name is normalized: words separated by single spaces. For the tokenizers whose
pre-tokenizer splits text at spaces and whose normalizer works character by
character (byte-level BPE as BART and GPT-2 use it, BERT's WordPiece), the ids
of ``" w1 w2"`` are the ids of ``" w1"`` followed by those of ``" w2"``, so
each distinct word of a chunk of names is tokenized once and the names are
put together from their words with numpy. The shortcut is only taken for
tokenizers of those kinds, and each chunk is compared with plain tokenization
on a sample of its names; any difference (or any other tokenizer) tokenizes
the names one by one, as before. Either way the result is the same ids.
"""

from __future__ import annotations

import itertools
import logging
import re
from typing import Callable, Dict, Iterator, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np

logger = logging.getLogger(__name__)

__all__ = ["NameTokens", "tokenize_names", "word_splitting"]

#: pre-tokenizers that split at spaces without letting a space inside a pre-token (but a leading one)
_SPLITTING = {"ByteLevel", "Whitespace", "WhitespaceSplit", "BertPreTokenizer"}
#: normalizers that work character by character
_LOCAL = {"NoneType", "Lowercase", "NFC", "NFD", "NFKC", "NFKD", "StripAccents", "BertNormalizer"}
_SAMPLE = 64
_OTHER_SPACE = re.compile(r"[^\S ]")  # whitespace other than the plain space


class NameTokens(NamedTuple):
    """The ids of the kept names end to end, each followed by EOS (int32), their lengths
    (EOS included), their indices in ``names``, and how many names were left out."""

    tokens: np.ndarray
    lengths: np.ndarray
    kept: np.ndarray
    skipped: int


def word_splitting(tokenizer) -> bool:
    """Whether ``tokenizer`` tokenizes space-separated words independently (see the module docstring)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or backend.truncation is not None or backend.padding is not None:
        return False
    return type(backend.pre_tokenizer).__name__ in _SPLITTING and type(backend.normalizer).__name__ in _LOCAL


def _encode(tokenizer, texts: List[str], batch: int = 16_384) -> List[List[int]]:
    """Token ids of ``texts``, a batch at a time (an ``Encoding`` object weighs about a kilobyte)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None and (backend.truncation is not None or backend.padding is not None):
        backend = None  # one that truncates or pads: the tokenizer's own call applies it
    out: List[List[int]] = []
    for begin in range(0, len(texts), batch):
        part = texts[begin : begin + batch]
        if backend is not None:
            out.extend(e.ids for e in backend.encode_batch(part, add_special_tokens=False))
        else:
            out.extend(tokenizer(part, add_special_tokens=False)["input_ids"])
    return out


def _flat(ids: List[List[int]]) -> Tuple[np.ndarray, np.ndarray]:
    lengths = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
    return np.fromiter(itertools.chain.from_iterable(ids), dtype=np.int32, count=int(lengths.sum())), lengths


def _by_words(tokenizer, names: Sequence[str]) -> Optional[Tuple[np.ndarray, np.ndarray]]:
    """(ids end to end, lengths) of ``" " + name`` from the ids of the distinct words; None
    when a name is not single-spaced words or a sample disagrees with plain tokenization."""
    text = " ".join(names)
    if _OTHER_SPACE.search(text):  # tabs, non-breaking spaces...: tokenized whole
        return None
    words = text.split(" ")
    n_words = np.fromiter(map(str.count, names, itertools.repeat(" ")), dtype=np.int64, count=len(names)) + 1
    if len(words) != int(n_words.sum()):
        return None
    # word -> first number drawn for it (C-level loop); numbers of distinct words rise in insertion order
    index: Dict[str, int] = {}
    drawn = np.fromiter(map(index.setdefault, words, itertools.count()), dtype=np.int64, count=len(words))
    del words, text
    if "" in index:  # an empty name, or doubled, leading or trailing spaces
        return None
    occ = np.searchsorted(np.fromiter(index.values(), dtype=np.int64, count=len(index)), drawn)
    del drawn
    word_flat, word_len = _flat(_encode(tokenizer, [" " + w for w in index]))
    del index
    word_start = np.concatenate([[0], np.cumsum(word_len)[:-1]]).astype(np.int64)
    occ_len = word_len[occ]
    total = int(occ_len.sum())
    out_start = np.concatenate([[0], np.cumsum(occ_len)[:-1]]).astype(np.int64)
    tokens = word_flat[np.repeat(word_start[occ] - out_start, occ_len) + np.arange(total)]
    name_of_occ = np.repeat(np.arange(len(names)), n_words)
    lengths = np.bincount(name_of_occ, weights=occ_len, minlength=len(names)).astype(np.int64)
    sample = np.unique(np.linspace(0, len(names) - 1, min(_SAMPLE, len(names))).astype(np.int64))
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    direct = _encode(tokenizer, [" " + names[int(i)] for i in sample])
    for i, ids in zip(sample.tolist(), direct):
        if tokens[starts[i] : starts[i] + lengths[i]].tolist() != ids:
            logger.info(
                "word-by-word tokenization differs from the tokenizer on %r; tokenizing names one by one", names[i]
            )
            return None
    return tokens, lengths


def _chunks(names: Sequence[str], size: int) -> Iterator[Tuple[int, List[str]]]:
    for begin in range(0, len(names), size):
        yield begin, list(names[begin : begin + size])


def tokenize_names(
    names: Sequence[str],
    tokenizer,
    *,
    eos_token_id: int,
    max_name_tokens: int,
    chunk_size: int = 20_000,
    on_chunk: Optional[Callable[[int], None]] = None,
) -> NameTokens:
    """Ids of ``" " + name`` + EOS for every name (see :class:`NameTokens`): words once each
    where the tokenizer allows it (chunks of 25 times ``chunk_size`` names), else name by name
    in chunks of ``chunk_size``. Names with no token or over ``max_name_tokens`` are left out."""
    by_words = word_splitting(tokenizer)
    tokens: List[np.ndarray] = []
    lens: List[np.ndarray] = []
    kept: List[np.ndarray] = []
    skipped = 0
    for begin, chunk in _chunks(names, chunk_size * 25 if by_words else chunk_size):
        found = _by_words(tokenizer, chunk) if by_words else None
        parts = (
            [found]
            if found is not None
            else [
                _flat(_encode(tokenizer, [" " + name for name in chunk[i : i + chunk_size]]))
                for i in range(0, len(chunk), chunk_size)
            ]
        )
        by_words = found is not None
        flat = np.concatenate([f for f, _ in parts])
        lengths = np.concatenate([n for _, n in parts])
        del parts, found
        ok = (lengths > 0) & (lengths <= max_name_tokens)
        if not ok.all():
            flat, lengths = flat[np.repeat(ok, lengths)], lengths[ok]
        skipped += int((~ok).sum())
        tokens.append(np.insert(flat, np.cumsum(lengths), np.int32(eos_token_id)))
        lens.append(lengths + 1)
        kept.append(np.flatnonzero(ok) + begin)
        if on_chunk is not None:
            on_chunk(len(chunk))
    empty = np.zeros(0, dtype=np.int64)
    return NameTokens(
        np.concatenate(tokens) if tokens else np.zeros(0, dtype=np.int32),
        np.concatenate(lens) if lens else empty,
        np.concatenate(kept) if kept else empty,
        skipped,
    )
