"""Forced scoring (linking/decoding/forced.py): the beam's own scores, batch-invariant, shared work."""

import pytest
from conftest import mentions_for
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spacy_genbioel.linking.decoding.decoder import DecodingSettings, GenerativeLinker
from spacy_genbioel.linking.decoding.forced import NameTokens, forced_scores, length_groups, merge_lists, rank_by_forced
from spacy_genbioel.linking.inputs.builder import InputBuilder
from spacy_genbioel.ty import Candidate, Mention


def _linker(model, tokenizer, kb, **decoding):
    return GenerativeLinker(
        model, tokenizer, kb, decoding=DecodingSettings(**{"num_beams": 5, "top_k": 5, "batch_size": 4, **decoding})
    )


@pytest.mark.parametrize("length_penalty", [1.0, 0.5])
def test_forced_score_equals_beam_score_for_every_returned_name(micro_model, word_tokenizer, small_kb, length_penalty):
    linker = _linker(micro_model, word_tokenizer, small_kb, length_penalty=length_penalty)
    mentions = mentions_for(small_kb)
    beams = linker.link(mentions)
    scores = forced_scores(linker, mentions, [[c.name for c in cands] for cands in beams])
    checked = 0
    for cands, forced in zip(beams, scores):
        for cand, score in zip(cands, forced):
            assert score == pytest.approx(cand.score, abs=1e-5)
            checked += 1
    assert checked >= len(mentions)


def test_forced_scores_are_batch_invariant(micro_model, word_tokenizer, small_kb):
    mentions = mentions_for(small_kb)
    names = [list(small_kb.names[i : i + 7]) for i in range(len(mentions))]
    together = forced_scores(_linker(micro_model, word_tokenizer, small_kb, batch_size=32), mentions, names)
    tiny = _linker(micro_model, word_tokenizer, small_kb, batch_size=1, num_beams=1, top_k=1, block_batches=1)
    alone = [forced_scores(tiny, [m], [n])[0] for m, n in zip(mentions, names)]
    for a, b in zip(together, alone):
        assert a == pytest.approx(b, abs=1e-5)
    chunked = forced_scores(tiny, mentions, names)  # one name set split over several passes
    for a, b in zip(together, chunked):
        assert a == pytest.approx(b, abs=1e-5)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_forced_scores_do_not_depend_on_the_other_names(micro_model, word_tokenizer, small_kb, data):
    linker = _linker(micro_model, word_tokenizer, small_kb)
    mention = mentions_for(small_kb, n=3)[data.draw(st.integers(0, 2))]
    names = data.draw(st.lists(st.sampled_from(list(small_kb.names)), min_size=1, max_size=9, unique=True))
    together = forced_scores(linker, [mention], [names])[0]
    for name, score in zip(names, together):
        assert forced_scores(linker, [mention], [[name]])[0][0] == pytest.approx(score, abs=1e-5)


def test_names_outside_the_trie_and_empty_mentions_get_no_score(micro_model, word_tokenizer, small_kb):
    linker = _linker(micro_model, word_tokenizer, small_kb)
    name = small_kb.names[0]
    scores = forced_scores(linker, [Mention("renal failure"), Mention("...")], [["not a kb name", name], [name]])
    assert scores[0][0] is None and isinstance(scores[0][1], float) and scores[0][1] <= 0
    assert scores[1] == [None]
    with pytest.raises(ValueError, match="entries for"):
        forced_scores(linker, [Mention("x")], [])


def test_document_input_scores_like_the_beam(micro_model, word_tokenizer, small_kb):
    linker = GenerativeLinker(
        micro_model,
        word_tokenizer,
        small_kb,
        inputs=InputBuilder(input_mode="document"),
        decoding=DecodingSettings(num_beams=4, top_k=4, batch_size=3),
    )
    mentions = [
        Mention(m.text, m.left, m.right, doc_id="d1", start=i * 40, end=i * 40 + len(m.text))
        for i, m in enumerate(mentions_for(small_kb, n=5))
    ]
    beams = linker.link(mentions)
    scores = forced_scores(linker, mentions, [[c.name for c in cands] for cands in beams])
    for cands, forced in zip(beams, scores):
        assert forced == pytest.approx([c.score for c in cands], abs=1e-5)


def test_name_tokens_read_back_the_trie(micro_model, word_tokenizer, small_kb):
    linker = _linker(micro_model, word_tokenizer, small_kb)
    tokens = NameTokens(linker.trie)
    for index, path in linker.trie.sequences()[:20]:
        assert tokens(index) == tuple(path)
    assert tokens(None) is None and tokens(10**9) is None


def test_rank_by_forced_and_merge(micro_model, word_tokenizer, small_kb):
    linker = _linker(micro_model, word_tokenizer, small_kb)
    mention = mentions_for(small_kb, n=1)[0]
    proposals = [Candidate(small_kb.ids_for_name_index(i), small_kb.names[i], 0.9) for i in range(6)]
    ranked = rank_by_forced(linker, [mention], [proposals + proposals[:2]])[0]
    assert sorted(c.name for c in ranked) == sorted({c.name for c in proposals})
    assert [c.score for c in ranked] == sorted((c.score for c in ranked), reverse=True)
    assert all(c.score <= 0 for c in ranked)
    merged = merge_lists(
        ranked[:3], [Candidate(("X",), ranked[0].name, ranked[0].score - 1), Candidate(("Y",), "other", 0.0)]
    )
    assert merged[0].name == "other" and [c.name for c in merged].count(ranked[0].name) == 1


@given(st.lists(st.integers(1, 30), max_size=60), st.sampled_from([1.0, 1.25, 2.0]))
def test_length_groups_partition_names_with_bounded_padding(lengths, slack):
    groups = length_groups(lengths, slack)
    assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
    flat = [lengths[i] for g in groups for i in g]
    assert flat == sorted(lengths)  # shortest first, each group a run of the sorted lengths
    for g in groups:
        padded, real = len(g) * max(lengths[i] for i in g), sum(lengths[i] for i in g)
        assert len(g) == 1 or padded <= slack * real + 1e-9
