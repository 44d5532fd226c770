"""Peer linkers (exact, TF-IDF, scispacy) on tiny hand-made KBs."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spacy_genbioel.kb.base import Concept, KnowledgeBase
from spacy_genbioel.retrieval.exact import ExactLinker
from spacy_genbioel.retrieval.registry import SHORT_NAMES, get_retriever, known_retrievers
from spacy_genbioel.retrieval.scispacy import (
    ScispacyLinker,
    ScispacySettings,
    kb_to_scispacy_entities,
    write_scispacy_jsonl,
)
from spacy_genbioel.retrieval.tfidf import TfidfLinker
from spacy_genbioel.ty import Candidate, Mention


@pytest.fixture(scope="module")
def kb() -> KnowledgeBase:
    return KnowledgeBase(
        [
            Concept("D009203", ["Myocardial Infarction", "Heart Attack", "cardiac infarction"]),
            Concept("D006331", ["Heart Diseases", "cardiac disease"]),
            Concept("D003920", ["Diabetes Mellitus", "diabetes"]),
            Concept("D003924", ["Diabetes Mellitus, Type 2", "type 2 diabetes", "NIDDM"]),
            Concept("D001943", ["Breast Neoplasms", "breast cancer", "breast tumor"]),
            Concept("D010051", ["Ovarian Neoplasms", "ovarian cancer"]),
            # two IDs sharing every name (MEDIC's MeSH + OMIM pattern)
            Concept("D015179", ["Colorectal Neoplasms, Hereditary Nonpolyposis", "HNPCC"]),
            Concept("OMIM:120435", ["Colorectal Neoplasms, Hereditary Nonpolyposis", "HNPCC"]),
        ],
        name="tiny",
    )


def m(text: str, *ids: str) -> Mention:
    return Mention(text=text, ids=tuple(ids))


def assert_kb_candidates(kb: KnowledgeBase, results, n: int, top_k: int) -> None:
    assert len(results) == n
    for cands in results:
        assert len(cands) <= top_k
        scores = [c.score for c in cands]
        assert scores == sorted(scores, reverse=True)
        for cand in cands:
            assert isinstance(cand, Candidate)
            assert cand.name in kb.names
            assert cand.ids, "a candidate names at least one concept"
            assert set(cand.ids) <= set(kb.ids_for_name(cand.name, normalize=False))
            assert 0.0 <= cand.score <= 1.0


# -- exact ------------------------------------------------------------------


def test_exact_linker_normalized_match_and_miss(kb):
    linker = ExactLinker(kb)
    res = linker.link([m("HEART-ATTACK"), m("heart failure"), m("hnpcc")], top_k=5)
    assert res[0] == [Candidate(("D009203",), "heart attack", 1.0)]
    assert res[1] == []
    # a shared name carries every concept it maps to
    assert res[2] == [Candidate(("D015179", "OMIM:120435"), "hnpcc", 1.0)]
    assert linker.link([], top_k=5) == []
    assert linker.link([m("diabetes")], top_k=0) == [[]]


def test_exact_linker_accepts_plain_strings(kb):
    assert ExactLinker(kb).link(["Diabetes"])[0][0].ids == ("D003920",)


# -- tfidf ------------------------------------------------------------------


def test_tfidf_ranks_exact_synonym_first(kb):
    linker = TfidfLinker(kb)
    res = linker.link([m("Heart attack"), m("breast tumour"), m("type 2 diabetes")], top_k=3)
    assert res[0][0] == Candidate(("D009203",), "heart attack", 1.0)
    assert res[1][0].name == "breast tumor" and res[1][0].ids == ("D001943",)
    assert res[2][0].name == "type 2 diabetes"
    assert_kb_candidates(kb, res, 3, 3)


def test_tfidf_scores_are_cosines_and_sorted(kb):
    linker = TfidfLinker(kb)
    res = linker.link([m("cardiac")], top_k=len(kb.names))
    dense = linker.scores(["cardiac"])[0]
    expected = sorted((float(s) for s in dense if s > 0), reverse=True)
    assert [c.score for c in res[0]] == pytest.approx(expected, abs=1e-6)
    assert {c.name for c in res[0]} >= {"cardiac infarction", "cardiac disease"}


def test_tfidf_no_overlap_gives_no_candidates(kb):
    res = TfidfLinker(kb).link([m("zzqx"), m("")], top_k=5)
    assert res == [[], []]


def test_tfidf_chunking_does_not_change_results(kb):
    mentions = [m(t) for t in ["heart attack", "ovarian tumour", "diabetic", "colorectal cancer", "NIDDM"]]
    whole = TfidfLinker(kb).link(mentions, top_k=4)
    chunked = TfidfLinker(kb, chunk_size=1).link(mentions, top_k=4)
    tiny_block = TfidfLinker(kb, max_block=1).link(mentions, top_k=4)
    assert whole == chunked == tiny_block


def test_tfidf_top_k_larger_than_kb(kb):
    res = TfidfLinker(kb).link([m("neoplasms")], top_k=1000)
    assert 0 < len(res[0]) <= len(kb.names)


def test_tfidf_custom_ngrams(kb):
    # a misspelt word shares character 3-grams with "breast ..." but no word: the settings must reach the vectorizer
    chars, words = TfidfLinker(kb), TfidfLinker(kb, ngram_range=(1, 2), analyzer="word")
    assert chars.link([m("brest")], top_k=2)[0][0].name.startswith("breast")
    assert words.link([m("brest")], top_k=2) == [[]]
    # word bigrams: the name with both words in that order outranks the one sharing a word
    ranked = [c.name for c in words.link([m("ovarian cancer risk")], top_k=2)[0]]
    assert ranked == ["ovarian cancer", "breast cancer"]


def test_tfidf_similarity_helper(kb):
    linker = TfidfLinker(kb)
    sims = linker.similarity(
        ["Heart Attack", "heart attack", "zzqx", "diabetes"],
        ["heart attack", ["diabetes", "heart attack"], ["diabetes"], []],
    )
    assert sims[0] == pytest.approx(1.0, abs=1e-6)
    assert sims[1] == pytest.approx(1.0, abs=1e-6)
    assert sims[2] == 0.0
    assert math.isnan(sims[3])
    mid = linker.similarity(["breast tumour"], [["breast tumor"]])[0]
    assert 0.3 < mid < 1.0
    with pytest.raises(ValueError):
        linker.similarity(["a"], [])


# -- scispacy ---------------------------------------------------------------


@pytest.fixture(scope="module")
def scispacy_linker(kb):
    pytest.importorskip("scispacy", reason="scispacy is not installed")
    pytest.importorskip("nmslib", reason="nmslib (scispacy's ANN library) is not installed")
    try:
        return ScispacyLinker(kb)
    except Exception as err:  # pragma: no cover - depends on the installed scispacy/nmslib
        pytest.skip(f"scispacy could not build a TF-IDF/nmslib index on a tiny KB: {err!r}")


def test_scispacy_linker_exact_alias_first(kb, scispacy_linker):
    res = scispacy_linker.link([m("Heart Attack"), m("ovarian cancer"), m("breast tumour")], top_k=3)
    assert_kb_candidates(kb, res, 3, 3)
    assert res[0][0].ids == ("D009203",) and res[0][0].score == pytest.approx(1.0, abs=1e-4)
    assert res[1][0].ids == ("D010051",)
    assert res[2][0].ids == ("D001943",)


def test_scispacy_linker_groups_concepts_sharing_a_name(kb, scispacy_linker):
    grouped = scispacy_linker.link([m("HNPCC")], top_k=5)[0]
    assert grouped[0].name == "hnpcc"
    assert set(grouped[0].ids) == {"D015179", "OMIM:120435"}
    per_concept = ScispacyLinker(kb, ScispacySettings(group_by_name=False)).link([m("HNPCC")], top_k=5)[0]
    assert [c.ids for c in per_concept[:2]] == [("D015179",), ("OMIM:120435",)]
    assert all(len(c.ids) == 1 for c in per_concept)


def test_scispacy_linker_threshold_and_empty(kb):
    pytest.importorskip("scispacy", reason="scispacy is not installed")
    strict = ScispacyLinker(kb, ScispacySettings(threshold=0.99))
    res = strict.link([m("breast tumour"), m("diabetes"), m("zzqx")], top_k=5)
    assert res[0] == []
    assert [c.ids for c in res[1]] == [("D003920",)]
    assert res[2] == []
    assert strict.link([], top_k=5) == []


def test_scispacy_kb_conversion(kb, tmp_path):
    pytest.importorskip("scispacy", reason="scispacy is not installed")
    from scispacy.linking_utils import KnowledgeBase as ScispacyKB

    entities = kb_to_scispacy_entities(kb)
    assert len(entities) == len(kb)
    path = write_scispacy_jsonl(kb, tmp_path / "kb.jsonl")
    sci = ScispacyKB(str(path))
    assert sci.alias_to_cuis["hnpcc"] == {"D015179", "OMIM:120435"}
    assert set(sci.alias_to_cuis) == set(kb.names)


# -- factory ----------------------------------------------------------------


def test_get_retriever(kb):
    assert isinstance(get_retriever("exact", kb), ExactLinker)
    tfidf = get_retriever("TFIDF", kb, ngram_range=(2, 3))
    assert isinstance(tfidf, TfidfLinker)
    assert tfidf.vectorizer.ngram_range == (2, 3)
    assert isinstance(get_retriever("genbioel.exact_retriever.v1", kb), ExactLinker)
    assert set(SHORT_NAMES) == {"exact", "tfidf", "scispacy", "dense", "sapbert", "rescnn"}
    assert set(SHORT_NAMES.values()) <= set(known_retrievers())
    with pytest.raises(ValueError, match="Unknown linker"):
        get_retriever("bm25", kb)
    with pytest.raises(ValueError, match="Unknown linker"):
        get_retriever("spacy.first_longest_spans_filter.v1", kb)  # in registry.misc, but not a retriever


def test_retrievers_resolve_from_a_config(kb):
    from spacy.util import registry
    from thinc.api import Config

    config = Config().from_str("""
[retriever]
@misc = "genbioel.tfidf_retriever.v1"
ngram_range = [2, 3]
""")
    build = registry.resolve(config)["retriever"]
    tfidf = build(kb)
    assert isinstance(tfidf, TfidfLinker) and tfidf.vectorizer.ngram_range == (2, 3)


def test_retriever_settings_keep_their_flat_names(kb):
    """The scispacy and dense settings are one dataclass each; config blocks and
    ``get_retriever(name, kb, **settings)`` still take the flat setting names."""
    from spacy.util import registry
    from thinc.api import Config

    from spacy_genbioel.retrieval.registry import make_retriever_builder, retriever_takes
    from spacy_genbioel.retrieval.settings import DenseSettings

    config = Config().from_str("""
[retriever]
@misc = "genbioel.dense_retriever.v1"
device = "cpu"
batch_size = 16
cache = false
""")
    assert registry.resolve(config)["retriever"] == DenseSettings(device="cpu", batch_size=16, cache=False)
    with pytest.raises(Exception, match="no_such_setting"):
        registry.resolve(Config().from_str('[retriever]\n@misc = "genbioel.dense_retriever.v1"\nno_such_setting = 1\n'))
    assert make_retriever_builder("scispacy", threshold=0.5, k=7) == ScispacySettings(k=7, threshold=0.5)
    assert retriever_takes("dense", "model") and not retriever_takes("scispacy", "model")
    with pytest.raises(TypeError):
        make_retriever_builder("scispacy", no_such_setting=1)


# -- property: peers only return KB names and IDs -----------------------------

_words = st.text(alphabet="abcdefgh", min_size=1, max_size=6)
_names = st.lists(_words, min_size=1, max_size=3).map(" ".join)
_kbs = st.lists(
    st.tuples(st.sampled_from([f"C{i}" for i in range(8)]), st.lists(_names, min_size=1, max_size=3)),
    min_size=1,
    max_size=8,
).map(lambda rows: KnowledgeBase([Concept(cid, names) for cid, names in rows]))
_mentions = st.lists(st.one_of(_names, st.text(alphabet="abcdefgh -XY", max_size=12)), min_size=1, max_size=6)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kb=_kbs, texts=_mentions, top_k=st.integers(min_value=1, max_value=6))
def test_exact_and_tfidf_return_only_kb_names(kb, texts, top_k):
    mentions = [m(t) for t in texts]
    for linker in (ExactLinker(kb), TfidfLinker(kb)):
        assert_kb_candidates(kb, linker.link(mentions, top_k=top_k), len(mentions), top_k)
    # a mention equal to a KB name gets it first from both
    name = kb.names[0]
    for linker in (ExactLinker(kb), TfidfLinker(kb)):
        assert linker.link([m(name)], top_k=top_k)[0][0].name == name


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kb=_kbs, texts=_mentions, top_k=st.integers(min_value=1, max_value=6))
def test_scispacy_returns_only_kb_names(kb, texts, top_k):
    pytest.importorskip("scispacy", reason="scispacy is not installed")
    mentions = [m(t) for t in texts]
    linker = ScispacyLinker(kb)
    assert_kb_candidates(kb, linker.link(mentions, top_k=top_k), len(mentions), top_k)
    per_concept = ScispacyLinker(kb, ScispacySettings(group_by_name=False))
    ids = {i for cands in per_concept.link(mentions, top_k=top_k) for c in cands for i in c.ids}
    assert ids <= set(kb.concept_ids)


def test_shared_name_concepts_follow_the_kb_order_in_every_peer(kb):
    """kb_id is the first concept of the top name: every peer must list a shared
    name's concepts in the KB's order (highest prior first), not its own."""
    ranked = kb.with_priors({"OMIM:120435": 5})
    assert ranked.ids_for_name("HNPCC") == ("OMIM:120435", "D015179")
    for linker in (ExactLinker(ranked), TfidfLinker(ranked), ScispacyLinker(ranked)):
        top = linker.link([m("HNPCC")], top_k=1)[0][0]
        assert top.ids == ("OMIM:120435", "D015179"), type(linker).__name__
