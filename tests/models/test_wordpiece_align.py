"""Property tests of the word piece windows and the token <- (window, position) weights."""

import math
from collections import Counter, defaultdict

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spacy_genbioel.models.wordpiece_align import alignment, windows

SETTINGS = settings(max_examples=100, deadline=None, derandomize=True)


@st.composite
def window_args(draw, max_n=400):
    """(n_pieces, max_pieces, min_overlap) that windows() accepts."""
    max_pieces = draw(st.integers(1, 64))
    min_overlap = draw(st.integers(0, max_pieces - 1))
    return draw(st.integers(0, max_n)), max_pieces, min_overlap


@st.composite
def documents(draw):
    """(word_ids, piece_ids, n_tokens, max_pieces, min_overlap): tokens in order with 0-3 pieces each
    (0: whitespace), a few pieces of no token (None), piece ids unique (1000 + position)."""
    counts = draw(st.lists(st.integers(0, 3), max_size=60))
    word_ids = []
    for token, count in enumerate(counts):
        if draw(st.booleans()) and draw(st.booleans()):
            word_ids.append(None)
        word_ids.extend([token] * count)
    max_pieces = draw(st.integers(1, 24))
    min_overlap = draw(st.integers(0, max_pieces - 1))
    return word_ids, [1000 + i for i in range(len(word_ids))], len(counts), max_pieces, min_overlap


# -- windows --------------------------------------------------------------------------------------------
@SETTINGS
@given(window_args())
def test_windows_cover_every_piece_within_bounds(args):
    n, m, o = args
    spans = windows(n, m, o)
    covered = set()
    for start, end in spans:
        assert 0 <= start < end <= n
        assert end - start <= m
        covered.update(range(start, end))
    assert covered == set(range(n))


@SETTINGS
@given(window_args())
def test_windows_are_as_few_as_possible_and_overlap_by_min_overlap(args):
    n, m, o = args
    spans = windows(n, m, o)
    if n == 0:
        assert spans == []
    elif n <= m:
        assert spans == [(0, n)]
    else:
        # k windows of at most m pieces overlapping by >= o cover at most k*(m - o) + o pieces
        assert len(spans) == math.ceil((n - o) / (m - o)) >= 2
        assert spans[0][0] == 0 and spans[-1][1] == n
        assert len({end - start for start, end in spans}) == 1  # one length for all
        for (start, end), (next_start, next_end) in zip(spans, spans[1:]):
            assert start < next_start and end < next_end
            # the starts are rounded, yet the overlap never drops below min_overlap:
            # length - step >= o in reals, and the rounded step is floor or ceil of it
            assert end - next_start >= o


@pytest.mark.parametrize(
    "n, m, o, expected",
    [
        (10, 4, 0, [(0, 4), (3, 7), (6, 10)]),  # three windows of 4 cover 10 with no overlap needed
        (10, 6, 2, [(0, 6), (4, 10)]),
        (7, 3, 2, [(0, 3), (1, 4), (2, 5), (3, 6), (4, 7)]),  # step 1: every window shares 2
        (5, 5, 4, [(0, 5)]),
        (1, 1, 0, [(0, 1)]),
    ],
)
def test_windows_examples(n, m, o, expected):
    assert windows(n, m, o) == expected


@pytest.mark.parametrize(
    "m, o, message",
    [
        (0, 0, "max_pieces must be positive"),
        (-3, 0, "max_pieces must be positive"),
        (4, 4, "min_overlap must be in"),
        (4, 9, "min_overlap must be in"),
        (4, -1, "min_overlap must be in"),
    ],
)
def test_windows_reject_bad_arguments(m, o, message):
    for n in (0, 3, 100):  # checked even for documents that need no window
        with pytest.raises(ValueError, match=message):
            windows(n, m, o)


# -- alignment ------------------------------------------------------------------------------------------
@SETTINGS
@given(documents())
def test_alignment_weights_and_slots(doc):
    word_ids, piece_ids, n_tokens, m, o = doc
    aligned = alignment(word_ids, piece_ids, n_tokens, m, o)
    spans = windows(len(piece_ids), m, o)
    assert aligned.n_tokens == n_tokens
    assert aligned.piece_ids == [piece_ids[start:end] for start, end in spans]
    assert len(aligned.rows) == len(aligned.slots) == len(aligned.weights)

    total = defaultdict(float)
    slots_of = defaultdict(list)
    for token, (w, position), weight in zip(aligned.rows, aligned.slots, aligned.weights):
        assert 0 <= token < n_tokens and weight > 0
        assert 0 <= w < len(spans)
        assert 1 <= position < len(aligned.piece_ids[w]) + 1  # position 0 is [CLS]
        piece = aligned.piece_ids[w][position - 1] - 1000
        assert word_ids[piece] == token  # the slot holds one of the token's own pieces
        assert spans[w][0] + position - 1 == piece
        total[token] += weight
        slots_of[token].append((w, position))

    # every occurrence of a token's pieces in any window is one slot, all of equal weight
    occurrences = Counter(word_ids[i] for start, end in spans for i in range(start, end) if word_ids[i] is not None)
    with_pieces = {t for t in word_ids if t is not None}
    for token in range(n_tokens):
        if token in with_pieces:
            assert total[token] == pytest.approx(1.0)
            assert len(slots_of[token]) == len(set(slots_of[token])) == occurrences[token]
        else:
            assert token not in slots_of  # whitespace: no row, hence a zero vector


def test_alignment_of_an_empty_document():
    aligned = alignment([], [], 0, 10, 2)
    assert (aligned.piece_ids, aligned.rows, aligned.slots, aligned.weights) == ([], [], [], [])
    aligned = alignment([], [], 3, 10, 2)  # three whitespace tokens
    assert aligned.n_tokens == 3 and aligned.rows == []


def test_alignment_in_overlapping_windows():
    # token 0: pieces 0-1, token 1: piece 2, token 2: none, token 3: pieces 3-5; windows (0, 4), (2, 6)
    aligned = alignment([0, 0, 1, 3, 3, 3], [10, 11, 12, 13, 14, 15], 4, 4, 2)
    assert aligned.piece_ids == [[10, 11, 12, 13], [12, 13, 14, 15]]
    assert list(zip(aligned.rows, aligned.slots)) == [
        (0, (0, 1)),
        (0, (0, 2)),
        (1, (0, 3)),
        (1, (1, 1)),
        (3, (0, 4)),
        (3, (1, 2)),
        (3, (1, 3)),
        (3, (1, 4)),
    ]
    assert aligned.weights == pytest.approx([0.5, 0.5, 0.5, 0.5, 0.25, 0.25, 0.25, 0.25])


def test_alignment_rejects_mismatched_lengths():
    with pytest.raises(ValueError, match="3 word ids for 2 word pieces"):
        alignment([0, 0, 1], [5, 6], 2, 10, 2)


@pytest.mark.parametrize("bad", [2, 7, -1])
def test_alignment_rejects_word_ids_out_of_range(bad):
    with pytest.raises(ValueError, match=f"word piece 1 belongs to token {bad}, but the document has 2 tokens"):
        alignment([0, bad, 1], [5, 6, 7], 2, 10, 2)
