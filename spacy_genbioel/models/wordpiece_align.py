"""Word pieces <-> spaCy tokens for a transformer tok2vec (no torch, no spaCy).

A document's word pieces rarely fit one encoder input: abstracts run to 300-600
BERT word pieces while an input holds at most ``max_length - 2`` (room for
[CLS] and [SEP]). :func:`windows` cuts them into as few windows as fit, of equal
length, that overlap by at least ``min_overlap`` pieces so no piece is encoded
without context on both sides more than it must be. :func:`alignment` then
says, for every spaCy token, which (window, position) slots hold its pieces
and with what weight: a token's vector is the mean of its pieces' states over
every window that holds them. Tokens without pieces (whitespace) get no slot,
hence a zero vector.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple


def windows(n_pieces: int, max_pieces: int, min_overlap: int = 32) -> List[Tuple[int, int]]:
    """``[start, end)`` windows over ``n_pieces`` word pieces, each at most
    ``max_pieces`` long, consecutive ones overlapping by at least
    ``min_overlap`` (when more than one is needed), all of one length,
    covering every piece; ``[]`` for an empty document."""
    if max_pieces < 1:
        raise ValueError(f"max_pieces must be positive, got {max_pieces}")
    if not 0 <= min_overlap < max_pieces:
        raise ValueError(f"min_overlap must be in [0, max_pieces), got {min_overlap} (max_pieces {max_pieces})")
    if n_pieces <= 0:
        return []
    if n_pieces <= max_pieces:
        return [(0, n_pieces)]
    count = math.ceil((n_pieces - min_overlap) / (max_pieces - min_overlap))
    length = math.ceil((n_pieces + (count - 1) * min_overlap) / count)
    last_start = n_pieces - length
    starts = [round(i * last_start / (count - 1)) for i in range(count)]
    return [(start, start + length) for start in starts]


@dataclass
class DocAlignment:
    """One document's windows and, for each (token, slot) pair, the weight of
    the slot in the token's mean. ``slots`` index ``window * stride + position``
    where ``position`` counts [CLS] as 0."""

    n_tokens: int
    piece_ids: List[List[int]]  # per window, the word piece ids without [CLS]/[SEP]
    rows: List[int]  # token index in the document
    slots: List[Tuple[int, int]]  # (window index, position in the window incl. [CLS])
    weights: List[float]


def alignment(
    word_ids: Sequence[Optional[int]], piece_ids: Sequence[int], n_tokens: int, max_pieces: int, min_overlap: int = 32
) -> DocAlignment:
    """The windows of one document and its token<-slot weights. ``word_ids[i]``
    is the spaCy token that piece ``i`` belongs to (the fast tokenizer's
    ``word_ids()``), ``piece_ids[i]`` its vocabulary id."""
    if len(word_ids) != len(piece_ids):
        raise ValueError(f"{len(word_ids)} word ids for {len(piece_ids)} word pieces")
    spans = windows(len(piece_ids), max_pieces, min_overlap)
    per_token: List[List[Tuple[int, int]]] = [[] for _ in range(n_tokens)]
    for w, (start, end) in enumerate(spans):
        for i in range(start, end):
            token = word_ids[i]
            if token is None:
                continue
            if not 0 <= token < n_tokens:
                raise ValueError(f"word piece {i} belongs to token {token}, but the document has {n_tokens} tokens")
            per_token[token].append((w, i - start + 1))
    rows: List[int] = []
    slots: List[Tuple[int, int]] = []
    weights: List[float] = []
    for token, token_slots in enumerate(per_token):
        for slot in token_slots:
            rows.append(token)
            slots.append(slot)
            weights.append(1.0 / len(token_slots))
    return DocAlignment(
        n_tokens=n_tokens,
        piece_ids=[list(piece_ids[start:end]) for start, end in spans],
        rows=rows,
        slots=slots,
        weights=weights,
    )
