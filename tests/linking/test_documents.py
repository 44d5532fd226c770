"""Per-document encoder input (``InputBuilder(input_mode="document")``,
:mod:`spacy_genbioel.linking.inputs.documents`): a document is read once with every
mention marked; long documents are cut into as few windows as keep every
mention whole; training and inference read the same ids."""

import dataclasses
import itertools
import random

import pytest
import torch
from conftest import WORDS
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spacy_genbioel.linking.decoding.decoder import GenerativeLinker
from spacy_genbioel.linking.inputs.builder import INPUT_MODES, InputBuilder, SourceEncoder
from spacy_genbioel.linking.inputs.documents import DocumentSources, document_key, document_text, layers, mention_key
from spacy_genbioel.linking.settings import DEFAULT_CONFIG, DecodingSettings
from spacy_genbioel.ty import Mention

DOC = InputBuilder(input_mode="document")


def marked_document(segments, doc_id="doc", window=None):
    """``segments``: (text, marked) pieces joined by single spaces; returns the
    text and a Mention per marked piece (contexts cut to ``window`` characters)."""
    text, spans = "", []
    for piece, marked in segments:
        if text:
            text += " "
        start = len(text)
        text += piece
        if marked:
            spans.append((start, len(text)))
    return text, mentions_at(text, spans, doc_id, window)


def mentions_at(text, spans, doc_id="doc", window=None):
    out = []
    for s, e in spans:
        left = text[:s] if window is None else text[max(0, s - window) : s]
        right = text[e:] if window is None else text[e : e + window]
        out.append(Mention(text[s:e], left=left, right=right, doc_id=doc_id, start=s, end=e))
    return out


def markers(tokenizer):
    (start,), (end,) = [tokenizer(" " + m, add_special_tokens=False)["input_ids"] for m in ("START", "END")]
    return start, end


def marked_span(tokenizer, mention, inputs=DOC):
    """START <mention tokens> END, as a per-document input holds it."""
    start, end = markers(tokenizer)
    return [start, *tokenizer(" " + inputs.mention_text(mention), add_special_tokens=False)["input_ids"], end]


def contains(ids, part):
    return any(ids[i : i + len(part)] == part for i in range(len(ids) - len(part) + 1))


def encoder_ids(tokenizer, mentions, max_tokens, inputs=DOC, register=()):
    encoder = SourceEncoder(tokenizer)
    if register:
        encoder.documents.register(register)
    return encoder.ids(mentions, inputs, max_tokens), encoder.documents


# -- a document that fits ------------------------------------------------------------------------------------------
def test_a_document_that_fits_is_one_input_with_every_mention_marked(word_tokenizer):
    _, mentions = marked_document(
        [
            ("acute", False),
            ("renal failure", True),
            ("and", False),
            ("chronic", False),
            ("lung cancer", True),
            ("with", False),
            ("cystic fibrosis", True),
            ("of the liver", False),
        ]
    )
    rows, docs = encoder_ids(word_tokenizer, mentions, 64)
    first = rows[0]
    assert all(row is first for row in rows), "mentions of one window share one list"
    start, end = markers(word_tokenizer)
    assert first.count(start) == first.count(end) == len(mentions) == 3
    assert first[0] == word_tokenizer.bos_token_id and first[-1] == word_tokenizer.eos_token_id
    assert len(first) <= 64
    for m in mentions:
        assert contains(first, marked_span(word_tokenizer, m))
    assert word_tokenizer.decode(first[1:-1]).split() == (
        [
            "acute",
            "START",
            "renal",
            "failure",
            "END",
            "and",
            "chronic",
            "START",
            "lung",
            "cancer",
            "END",
            "with",
            "START",
            "cystic",
            "fibrosis",
            "END",
            "of",
            "the",
            "liver",
        ]
    )
    assert docs.stats["documents"] == 1 and docs.stats["windows"] == 1 and docs.stats["mentions_shortened"] == 0


def test_mentions_of_other_documents_are_not_marked(word_tokenizer):
    _, a = marked_document([("acute", False), ("renal failure", True), ("lung cancer", True)], doc_id="a")
    _, b = marked_document([("heart attack", True), ("pain", False)], doc_id="b")
    rows, _ = encoder_ids(word_tokenizer, [a[0], b[0], a[1]], 64)
    start, _ = markers(word_tokenizer)
    assert rows[0] is rows[2] and rows[0] != rows[1]
    assert rows[0].count(start) == 2 and rows[1].count(start) == 1


# -- a long document -------------------------------------------------------------------------------------------------
def long_document(n_mentions=24, seed=0):
    rng = random.Random(seed)
    segments = []
    for _ in range(n_mentions):
        segments += [
            (" ".join(rng.choices(WORDS, k=rng.randint(1, 4))), False),
            (" ".join(rng.choices(WORDS, k=rng.randint(1, 3))), True),
        ]
    return marked_document(segments + [("the end", False)])


def test_a_long_document_is_cut_into_few_windows_that_keep_every_mention_whole(word_tokenizer):
    _, mentions = long_document()
    rows, docs = encoder_ids(word_tokenizer, mentions, 40)
    windows = {tuple(r) for r in rows}
    assert 1 < len(windows) < len(mentions)
    assert docs.stats["windows"] == len(windows) and docs.stats["mentions_shortened"] == 0
    start, _ = markers(word_tokenizer)
    for m, ids in zip(mentions, rows):
        assert len(ids) <= 40
        assert ids[0] == word_tokenizer.bos_token_id and ids[-1] == word_tokenizer.eos_token_id
        assert contains(ids, marked_span(word_tokenizer, m)), m
    # the whole document is more than one window holds
    whole, _ = encoder_ids(word_tokenizer, mentions, 10_000)
    assert len(whole[0]) > 40 and whole[0].count(start) == len(mentions)
    # a window is a stretch of the whole document's tokens
    for ids in windows:
        assert contains(whole[0][1:-1], list(ids[1:-1]))


def test_a_mention_longer_than_a_window_keeps_its_first_tokens_and_is_counted(word_tokenizer):
    _, mentions = marked_document([("acute", False), ("renal failure " * 10, True), ("lung cancer", True)])
    rows, docs = encoder_ids(word_tokenizer, mentions, 12)
    start, end = markers(word_tokenizer)
    assert all(len(r) <= 12 for r in rows)
    long_ids = word_tokenizer(" " + DOC.mention_text(mentions[0]), add_special_tokens=False)["input_ids"]
    assert rows[0][1:-1] == [start, *long_ids[:8], end]
    assert docs.stats["mentions_shortened"] == 1
    assert contains(rows[1], marked_span(word_tokenizer, mentions[1]))


def test_a_cap_without_room_for_the_markers_is_a_clear_error(word_tokenizer):
    _, mentions = marked_document([("renal failure", True)])
    with pytest.raises(ValueError, match="no room for a mention"):
        encoder_ids(word_tokenizer, mentions, 4)


@pytest.mark.parametrize(
    "spans,total,budget",
    [
        ([(0, 3)], 3, 10),
        ([(0, 3), (5, 8), (20, 25), (40, 44)], 50, 12),
        ([(2, 14)], 30, 12),
        ([(i, i + 2) for i in range(0, 60, 3)], 60, 9),
    ],
)
def test_cut_windows_keep_spans_whole_in_order(spans, total, budget):
    out = DocumentSources._cut(spans, total, budget)
    assert [k for _, members in out for k in members] == list(range(len(spans)))
    for (begin, end), members in out:
        assert 0 <= begin < end <= total and end - begin <= budget and members
        assert all(begin <= spans[k][0] and spans[k][1] <= end for k in members)
    if total <= budget:
        assert out == [((0, total), [0])]


# -- properties ------------------------------------------------------------------------------------------------------
@st.composite
def documents(draw, overlapping=False):
    n_words = draw(st.integers(1, 50))
    words = draw(st.lists(st.sampled_from(WORDS), min_size=n_words, max_size=n_words))
    starts = [0]
    for w in words[:-1]:
        starts.append(starts[-1] + len(w) + 1)
    text = " ".join(words)

    def chars(a, b):  # words a..b-1
        return starts[a], starts[b - 1] + len(words[b - 1])

    if overlapping:
        pairs = draw(st.lists(st.tuples(st.integers(0, n_words - 1), st.integers(1, 4)), min_size=1, max_size=12))
        word_spans = sorted({(a, min(n_words, a + n)) for a, n in pairs})
    else:
        cuts = sorted(set(draw(st.lists(st.integers(0, n_words), min_size=2, max_size=24))))
        word_spans = [(a, min(b, a + 4)) for a, b in zip(cuts[::2], cuts[1::2]) if a < b]
        if not word_spans:
            word_spans = [(0, 1)]
    window = draw(st.sampled_from([None, None, 8, 30, 80]))
    mentions = mentions_at(text, [chars(a, b) for a, b in word_spans], "doc", window)
    return mentions, draw(st.integers(10, 80)), draw(st.randoms(use_true_random=False))


@given(documents())
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_every_mention_reads_a_window_holding_its_marks_whatever_the_order_or_subset(word_tokenizer, doc):
    mentions, max_tokens, rnd = doc
    rows, docs = encoder_ids(word_tokenizer, mentions, max_tokens)
    assert docs.stats["mentions_shortened"] == 0
    start, _ = markers(word_tokenizer)
    for m, ids in zip(mentions, rows):
        assert len(ids) <= max_tokens
        assert ids[0] == word_tokenizer.bos_token_id and ids[-1] == word_tokenizer.eos_token_id
        assert contains(ids, marked_span(word_tokenizer, m))
    if len({tuple(r) for r in rows}) == 1:
        assert rows[0].count(start) == len(mentions)
    # the order mentions come in changes nothing
    order = list(range(len(mentions)))
    rnd.shuffle(order)
    shuffled, _ = encoder_ids(word_tokenizer, [mentions[i] for i in order], max_tokens)
    assert [shuffled[order.index(i)] for i in range(len(mentions))] == rows
    # a subset of a registered document reads the windows of the whole document
    subset = sorted(rnd.sample(range(len(mentions)), rnd.randint(1, len(mentions))))
    part, _ = encoder_ids(word_tokenizer, [mentions[i] for i in subset], max_tokens, register=mentions)
    assert part == [rows[i] for i in subset]


@given(documents(overlapping=True))
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_overlapping_mentions_go_to_layers_and_each_reads_its_own_marks(word_tokenizer, doc):
    mentions, max_tokens, _ = doc
    split = layers(mentions)
    assert sorted(mention_key(m) for layer in split for m in layer) == sorted(mention_key(m) for m in mentions)
    for layer in split:
        assert all(a.end <= b.start for a, b in itertools.pairwise(layer))
    rows, _ = encoder_ids(word_tokenizer, mentions, max_tokens)
    start, end = markers(word_tokenizer)
    for m, ids in zip(mentions, rows):
        assert len(ids) <= max_tokens and contains(ids, marked_span(word_tokenizer, m))
        # markings never nest (one layer per marking): START and END alternate, but for
        # a marking the window's edge cuts (an END first, a START last)
        marks = [t for t in ids if t in (start, end)]
        marks = marks[1:] if marks[:1] == [end] else marks
        marks = marks[:-1] if marks[-1:] == [start] else marks
        assert marks == [start, end] * (len(marks) // 2)


def test_nested_mentions_are_separate_layers_each_with_its_own_markers(word_tokenizer):
    text = "acute renal failure and lung cancer"
    outer, inner, other = mentions_at(text, [(0, 19), (6, 19), (24, 35)])
    assert [[m.text for m in layer] for layer in layers([inner, other, outer])] == [
        ["acute renal failure", "lung cancer"],
        ["renal failure"],
    ]
    rows, docs = encoder_ids(word_tokenizer, [outer, inner, other], 64)
    assert rows[0] is rows[2] and rows[1] is not rows[0]
    assert word_tokenizer.decode(rows[0][1:-1]).split() == [
        "START",
        "acute",
        "renal",
        "failure",
        "END",
        "and",
        "START",
        "lung",
        "cancer",
        "END",
    ]
    assert word_tokenizer.decode(rows[1][1:-1]).split() == [
        "acute",
        "START",
        "renal",
        "failure",
        "END",
        "and",
        "lung",
        "cancer",
    ]
    assert docs.stats["documents"] == 2


def test_identical_mentions_given_twice_read_one_window(word_tokenizer):
    _, mentions = marked_document([("acute", False), ("renal failure", True), ("lung cancer", True)])
    rows, _ = encoder_ids(word_tokenizer, [mentions[0], mentions[1], dataclasses.replace(mentions[0], label="X")], 64)
    start, _ = markers(word_tokenizer)
    assert rows[0] is rows[1] is rows[2] and rows[0].count(start) == 2


def test_mentions_without_a_document_or_offsets_are_documents_of_their_own(word_tokenizer):
    a = Mention("renal failure", left="acute ", right=" and lung cancer")
    b = Mention("lung cancer", left="acute renal failure and ", right="", start=-1, end=-1, doc_id="same")
    c = Mention("lung cancer", left="acute renal failure and ", right="", doc_id="", start=24, end=35)
    assert document_key(a) is None and document_key(b) is None and document_key(c) is None
    assert document_key(Mention("x", doc_id="d", start=0, end=1)) == "d"
    rows, _ = encoder_ids(word_tokenizer, [a, b, c], 64)
    start, end = markers(word_tokenizer)
    assert all(r.count(start) == 1 and r.count(end) == 1 for r in rows)
    assert word_tokenizer.decode(rows[0][1:-1]).split() == [
        "acute",
        "START",
        "renal",
        "failure",
        "END",
        "and",
        "lung",
        "cancer",
    ]
    assert word_tokenizer.decode(rows[1][1:-1]).split() == [
        "acute",
        "renal",
        "failure",
        "and",
        "START",
        "lung",
        "cancer",
        "END",
    ]
    assert rows[1] == rows[2]
    # alone, a mention reads what the mention mode reads from the same context
    mention_mode = SourceEncoder(word_tokenizer).ids([a], InputBuilder(), 64)[0]
    assert rows[0] == mention_mode


def test_document_text_pieces_contexts_together_by_offset():
    text = "acute renal failure and then much later chronic lung cancer came back"
    a, b = mentions_at(text, [(6, 19), (48, 59)], window=6)
    assert (a.left, a.right, b.left, b.right) == ("acute ", " and t", "ronic ", " came ")
    joined, lo = document_text([b, a])
    assert lo == 0 and len(joined) == 65
    assert joined == "acute " + " " * 13 + " and t" + " " * 17 + "ronic " + " " * 11 + " came "
    # whole contexts give the text back, mention spans included (read from the other mention's context)
    joined, lo = document_text(mentions_at(text, [(6, 19), (48, 59)]))
    assert (joined, lo) == (text, 0)
    # contexts starting late: the offset of the first character covered
    (c,) = mentions_at(text, [(48, 59)], window=10)
    joined, lo = document_text([c])
    assert lo == 38 and joined == text[38:48] + " " * 11 + text[59:69]


def test_cut_contexts_read_as_the_text_with_gaps_collapsed(word_tokenizer):
    text = "acute renal failure and then much later chronic lung cancer came back"
    cut = mentions_at(text, [(6, 19), (48, 59)], window=6)
    rows, _ = encoder_ids(word_tokenizer, cut, 64)
    assert rows[0] is rows[1]
    assert (
        word_tokenizer.decode(rows[0][1:-1]) == " acute START renal failure END and t ronic START lung cancer END came"
    )


# -- training reads what inference reads ------------------------------------------------------------------------------
def test_training_batches_of_one_mention_read_the_whole_registered_document(micro_model, word_tokenizer, small_kb):
    from spacy_genbioel.training.examples import TrainingExample
    from spacy_genbioel.training.seq2seq import encode_examples

    _, mentions = long_document(n_mentions=10, seed=3)
    linker = GenerativeLinker(
        micro_model,
        word_tokenizer,
        small_kb,
        inputs=InputBuilder(input_mode="document"),
        decoding=DecodingSettings(max_source_tokens=40),
    )
    inference = linker.encode_sources(mentions)
    assert len({tuple(r) for r in inference}) > 1  # several windows
    sources = SourceEncoder(word_tokenizer)
    assert sources.documents.register(mentions) == 1
    start, _ = markers(word_tokenizer)
    for i in (0, 4, 9):
        example = [TrainingExample(mentions[i], small_kb.names[0])]
        batch = encode_examples(
            example,
            word_tokenizer,
            linker.prompt_tokens,
            linker.inputs,
            linker.pad_token_id,
            linker.max_source_tokens,
            sources=sources,
        )
        assert batch["input_ids"][0].tolist() == inference[i]
        assert bool(batch["attention_mask"].all())
        # unregistered, the lone mention would be the only one marked
        alone = encode_examples(
            example, word_tokenizer, linker.prompt_tokens, linker.inputs, linker.pad_token_id, linker.max_source_tokens
        )
        assert alone["input_ids"][0].tolist().count(start) == 1 < inference[i].count(start)
    # a batch of several mentions, each reading its own window, padded as inference pads
    batch = encode_examples(
        [TrainingExample(m, small_kb.names[0]) for m in mentions[3:7]],
        word_tokenizer,
        linker.prompt_tokens,
        linker.inputs,
        linker.pad_token_id,
        linker.max_source_tokens,
        sources=sources,
    )
    padded = linker.sources.pad(inference[3:7])
    assert torch.equal(batch["input_ids"], padded["input_ids"]) and torch.equal(
        batch["attention_mask"], padded["attention_mask"]
    )


def test_registering_again_refreshes_the_cached_windows(word_tokenizer):
    text, mentions = marked_document(
        [("acute", False), ("renal failure", True), ("lung cancer", True), ("heart attack", True)]
    )
    encoder = SourceEncoder(word_tokenizer)
    encoder.documents.register(mentions[:2])
    start, _ = markers(word_tokenizer)
    assert encoder.ids(mentions[:1], DOC, 64)[0].count(start) == 2
    encoder.documents.register(mentions[2:])
    assert encoder.ids(mentions[:1], DOC, 64)[0].count(start) == 3
    # a mention the registry does not know: the given mentions alone make the document
    unknown = Mention("lung", left=text[:24], right=text[28:], doc_id="doc", start=24, end=28)
    assert encoder.ids([unknown], DOC, 64)[0].count(start) == 1


# -- settings -------------------------------------------------------------------------------------------------------
def test_input_mode_is_checked_and_configurable():
    assert INPUT_MODES == ("mention", "document")
    assert InputBuilder().input_mode == "mention" and DEFAULT_CONFIG["inputs"]["input_mode"] == "mention"
    with pytest.raises(ValueError, match="input_mode"):
        InputBuilder(input_mode="bogus")
    assert InputBuilder(input_mode="document").input_mode == "document"
    assert InputBuilder().input_mode == "mention"
    with pytest.raises(ValueError, match="input_mode"):
        InputBuilder(input_mode="bogus")
