"""Score fusion: features, the linear model and its file, the reranker, the cross-fitted
fit (``fit-fusion``) and the ``genbioel`` component carrying a fusion."""

import json
import math
import random
import re

import numpy as np
import pytest
import spacy
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from spacy_genbioel.cli import app
from spacy_genbioel.evaluation.run import EvaluationSetupError, check_component_settings
from spacy_genbioel.kb.base import Concept, KnowledgeBase
from spacy_genbioel.linking.reranking.fusion import (
    FusionFormatError,
    FusionModel,
    FusionReranker,
    concept_ranks,
    feature_names,
    fusion_features,
)
from spacy_genbioel.training.fusion_fit import (
    FusionExample,
    drop_examples,
    fit_fusion,
    read_fusion_examples,
    score_fusion,
)
from spacy_genbioel.ty import Candidate, Mention

runner = CliRunner()
SOURCES = ["genbioel", "tfidf"]


def cand(cid, name, score):
    ids = (cid,) if isinstance(cid, str) else tuple(cid)
    return Candidate(ids, name, score)


def small_kb():
    return KnowledgeBase(
        [
            Concept("C1", ["renal failure", "kidney failure"]),
            Concept("C2", ["cystic fibrosis"]),
            Concept("C3", ["breast cancer"]),
        ]
    ).with_priors({"C1": 3})


LISTS = {
    "genbioel": [cand("C2", "cystic fibrosis", -0.5), cand("C1", "renal failure", -1.0)],
    "tfidf": [cand("C1", "kidney failure", 0.9), cand("C3", "breast cancer", 0.3)],
}


# -- concept_ranks and features ------------------------------------------------------------------------
def test_concept_ranks_counts_distinct_concepts_at_their_best_place():
    cands = [cand(["A", "B"], "ab", -0.1), cand("A", "a2", -0.2), cand("C", "c", -0.3), cand("D", "d", -0.4)]
    assert concept_ranks(cands, 5) == {
        "A": (1, -0.1, "ab"),
        "B": (2, -0.1, "ab"),
        "C": (3, -0.3, "c"),
        "D": (4, -0.4, "d"),
    }
    assert list(concept_ranks(cands, 2)) == ["A", "B"]
    assert concept_ranks([], 3) == {}


@given(
    st.lists(st.tuples(st.lists(st.sampled_from("ABCDEFG"), min_size=1, max_size=3), st.floats(-5, 5)), max_size=12),
    st.integers(1, 6),
)
def test_concept_ranks_property(raw, depth):
    cands = [Candidate(tuple(ids), f"n{i}", score) for i, (ids, score) in enumerate(raw)]
    ranks = concept_ranks(cands, depth)
    distinct = list(dict.fromkeys(cid for c in cands for cid in c.ids))
    assert list(ranks) == distinct[:depth]
    assert [r for r, _, _ in ranks.values()] == list(range(1, len(ranks) + 1))
    for cid, (_, score, name) in ranks.items():
        first = next(c for c in cands if cid in c.ids)
        assert (score, name) == (first.score, first.name)


def test_feature_names_order():
    assert feature_names(SOURCES) == [
        "genbioel_in",
        "genbioel_score",
        "genbioel_rr",
        "genbioel_gap",
        "tfidf_in",
        "tfidf_score",
        "tfidf_rr",
        "tfidf_gap",
        "exact",
        "log_prior",
    ]
    assert feature_names(["genbioel"]) == [
        "genbioel_in",
        "genbioel_score",
        "genbioel_rr",
        "genbioel_gap",
        "exact",
        "log_prior",
    ]


def test_fusion_features_values():
    cache = {}
    ids, names, x = fusion_features("Kidney  Failure", LISTS, SOURCES, 5, small_kb(), cache)
    assert ids == ["C2", "C1", "C3"]  # the generator's concepts first, then the retriever's new ones
    assert names == ["cystic fibrosis", "renal failure", "breast cancer"] and x.shape == (3, 10)  # first source's name
    # per source: in, score, rr, gap (score minus the source's best: genbioel -0.5, tfidf 0.9)
    np.testing.assert_allclose(x[0], [1, -0.5, 1, 0, 0, 0, 0, 0.3 - 0.9, 0, 0])
    np.testing.assert_allclose(x[1], [1, -1.0, 0.5, -0.5, 1, 0.9, 1, 0, 1, math.log1p(3)])
    np.testing.assert_allclose(x[2], [0, 0, 0, -1.0 - -0.5, 1, 0.3, 0.5, -0.6, 0, 0])
    assert cache == {"C2": 0.0, "C1": 3.0, "C3": 0.0}
    gen_gap, tfidf_gap = (
        x[:, feature_names(SOURCES).index("genbioel_gap")],
        x[:, feature_names(SOURCES).index("tfidf_gap")],
    )
    # the source's best concept 0 (C2, C1), the others behind by the exact difference, absent ones as far as its last
    assert gen_gap.tolist() == [0.0, -1.0 - -0.5, -1.0 - -0.5] and tfidf_gap.tolist() == [0.3 - 0.9, 0.0, 0.3 - 0.9]


def test_fusion_gap_is_against_the_best_score_within_depth():  # the highest score, not the first's, not beyond depth
    lists = {
        "genbioel": [cand("C1", "a", -0.6), cand(["C2", "C3"], "b", -0.1), cand("C2", "b2", -0.05)],
        "tfidf": [cand("C3", "c", 0.7)],
    }
    ids, _, x = fusion_features("nothing", lists, SOURCES, 1, small_kb())
    assert ids == ["C1", "C3"] and x[0, 3] == 0.0 and x[1, 3] == 0.0 and x[1, 7] == 0.0  # C2 beyond depth 1
    ids, _, x = fusion_features("nothing", lists, SOURCES, 5, small_kb())
    assert ids == ["C1", "C2", "C3"] and x[:, 7].tolist() == [0.0, 0.0, 0.0]  # C3 is tfidf's only (best and last)
    np.testing.assert_allclose(x[:, 3], [-0.5, 0.0, 0.0])  # C2 and C3 share the best candidate; C2's repeat is ignored


def test_fusion_features_depth_blank_text_and_unknown_concepts():
    kb = small_kb()
    lists = {"genbioel": [cand("C1", "renal failure", -0.2), cand("X9", "elsewhere", -0.4)], "tfidf": []}
    ids, _, x = fusion_features("   ", lists, SOURCES, 1, kb)
    assert ids == ["C1"] and x[0, -2] == 0.0 and x[0, 3] == 0.0  # depth 1; blank text matches no name
    ids, _, x = fusion_features("elsewhere", lists, SOURCES, 5, kb)
    assert ids == ["C1", "X9"] and x[1, -1] == 0.0  # a concept the KB lacks has prior 0
    ids, names, x = fusion_features("x", {}, SOURCES, 5, kb)
    assert ids == [] and names == [] and x.shape == (0, 10)


# -- the model -------------------------------------------------------------------------------------------
def weights(**named):
    return [float(named.get(f, 0.0)) for f in feature_names(SOURCES)]


def test_model_validation():
    with pytest.raises(ValueError, match="start with 'genbioel'"):
        FusionModel(["tfidf", "genbioel"], weights())
    with pytest.raises(ValueError, match="repeat"):
        FusionModel(["genbioel", "tfidf", "tfidf"], [0.0] * 14)
    with pytest.raises(ValueError, match="8 weights for 10 features"):  # a three-feature-per-source weight vector
        FusionModel(SOURCES, [0.0] * 8)
    with pytest.raises(ValueError, match="depth"):
        FusionModel(SOURCES, weights(), depth=0)
    assert FusionModel(SOURCES, weights()).retriever_sources == ["tfidf"]


def test_rank_is_a_softmax_over_the_union():
    kb, model = small_kb(), FusionModel(SOURCES, weights(exact=5.0))
    ranked = model.rank("kidney failure", LISTS, kb, top_k=5)
    assert [c.ids for c in ranked] == [("C1",), ("C2",), ("C3",)]  # ties keep the union's order
    z = math.exp(5) + 2
    assert ranked[0].score == pytest.approx(math.exp(5) / z) and ranked[1].score == pytest.approx(1 / z)
    assert sum(c.score for c in ranked) == pytest.approx(1.0) and ranked[0].name == "renal failure"
    assert len(model.rank("kidney failure", LISTS, kb, top_k=1)) == 1
    assert model.rank("kidney failure", {"genbioel": [], "tfidf": []}, kb, top_k=5) == []
    flat = FusionModel(SOURCES, weights()).rank("nothing", LISTS, kb, top_k=5)
    assert [c.ids[0] for c in flat] == ["C2", "C1", "C3"] and all(c.score == pytest.approx(1 / 3) for c in flat)


cand_lists = st.lists(st.tuples(st.sampled_from(["C1", "C2", "C3", "X1", "X2"]), st.floats(-3, 3)), max_size=6)


@settings(max_examples=60, deadline=None)
@given(cand_lists, cand_lists, st.lists(st.floats(-4, 4), min_size=10, max_size=10), st.integers(1, 6))
def test_rank_property(gen, ret, w, top_k):
    kb = small_kb()
    lists = {"genbioel": [cand(c, c.lower(), s) for c, s in gen], "tfidf": [cand(c, c.lower(), s) for c, s in ret]}
    ranked = FusionModel(SOURCES, w, depth=3).rank("renal failure", lists, kb, top_k)
    union = set(concept_ranks(lists["genbioel"], 3)) | set(concept_ranks(lists["tfidf"], 3))
    assert len(ranked) == min(top_k, len(union))
    assert {c.ids[0] for c in ranked} <= union and len({c.ids for c in ranked}) == len(ranked)
    scores = [c.score for c in ranked]
    assert all(0.0 <= s <= 1.0 for s in scores) and scores == sorted(scores, reverse=True)
    assert sum(scores) <= 1.0 + 1e-9
    if top_k >= len(union) and union:
        assert sum(scores) == pytest.approx(1.0)
    ids, _, x = fusion_features("renal failure", lists, SOURCES, 3, kb)
    for k, ranks in enumerate(concept_ranks(lists[s], 3) for s in SOURCES):  # gap: score - best in the source, or 0
        gap, scores = x[:, 4 * k + 3], {cid: score for cid, (_, score, _) in ranks.items()}
        behind = min(scores.values(), default=0.0) - max(
            scores.values(), default=0.0
        )  # absent: as far as the last listed
        assert (
            gap.tolist() == [scores[c] - max(scores.values()) if c in scores else behind for c in ids]
            and (gap <= 0).all()
        )


def test_model_file_round_trip(tmp_path):
    model = FusionModel(
        SOURCES,
        weights(genbioel_rr=1.25, tfidf_score=-0.5, exact=2.0),
        depth=3,
        retrievers={"tfidf": {}},
        fit={"mentions": 4},
    )
    data = model.to_dict()
    assert data["version"] == 1 and data["weights"]["exact"] == 2.0 and list(data["weights"]) == model.features
    assert FusionModel.from_dict(json.loads(json.dumps(data))) == model
    model.save(tmp_path / "sub" / "fusion.json")
    assert FusionModel.load(tmp_path / "sub" / "fusion.json") == model


@pytest.mark.parametrize(
    "change,problem",
    [
        (lambda d: d.update(version=2), "version 2"),
        (lambda d: d["weights"].pop("exact"), "missing \\['exact'\\]"),
        (lambda d: d["weights"].update(dense_rr=1.0), "unknown \\['dense_rr'\\]"),
        (
            lambda d: [d["weights"].pop(f"{s}_gap") for s in SOURCES],
            "missing \\['genbioel_gap', 'tfidf_gap'\\]",
        ),  # a 3-feature file
        (lambda d: d.update(sources=["genbioel", "tfidf", "dense"]), "weights do not match"),
        (lambda d: d.update(sources="genbioel"), "'sources'"),
        (lambda d: d["weights"].update(exact="big"), "'weights'"),
        (lambda d: d.update(retrievers={"tfidf": 3}), "'retrievers'"),
        (lambda d: d.update(depth=0), "depth"),
        (
            lambda d: d.update(
                sources=["tfidf", "genbioel"], weights=dict.fromkeys(feature_names(["tfidf", "genbioel"]), 0.0)
            ),
            "start with",
        ),
    ],
)
def test_bad_fusion_files_are_named(tmp_path, change, problem):
    data = FusionModel(SOURCES, weights()).to_dict()
    change(data)
    path = tmp_path / "bad_fusion.json"
    path.write_text(json.dumps(data))
    with pytest.raises(FusionFormatError, match=re.escape(str(path)) + ".*" + problem):
        FusionModel.load(path)


@pytest.mark.parametrize(
    "name,content,problem",
    [
        ("nope.json", None, ".*not found"),
        ("broken.json", b"{not json", ".*not a JSON"),
        ("list.json", b"[1, 2]", ": expected a JSON object"),
        ("latin.json", b'{"version": "\xff"}', ""),
    ],
)
def test_unreadable_fusion_files_are_named(tmp_path, name, content, problem):
    if content is not None:
        (tmp_path / name).write_bytes(content)
    with pytest.raises(FusionFormatError, match=re.escape(str(tmp_path / name)) + problem):
        FusionModel.load(tmp_path / name)


# -- the reranker ----------------------------------------------------------------------------------------
class FakeRetriever:
    def __init__(self, table):
        self.table, self.calls = table, []

    def link(self, mentions, top_k):
        self.calls.append(([m.text for m in mentions], top_k))
        return [self.table.get(m.text, [])[:top_k] for m in mentions]


def test_reranker_fuses_and_leaves_empty_mentions_empty():
    kb, model = small_kb(), FusionModel(SOURCES, weights(tfidf_rr=3.0), depth=2)
    fake = FakeRetriever(
        {
            "kidney failure": [
                cand("C1", "kidney failure", 0.9),
                cand("C3", "breast cancer", 0.2),
                cand("C2", "cystic fibrosis", 0.1),
            ]
        }
    )
    reranker = FusionReranker(model, kb, {"tfidf": fake, "unused": object()})
    mentions = [Mention("kidney failure"), Mention("😷"), Mention("other")]
    generated = [[cand("C2", "cystic fibrosis", -0.3)], [], [cand("C3", "breast cancer", -0.1)]]
    out = reranker.rerank(mentions, generated, top_k=5)
    assert fake.calls == [(["kidney failure", "other"], 2)]  # only mentions with generated candidates, at depth
    assert out[1] == [] and [c.ids[0] for c in out[0]] == ["C1", "C3", "C2"]
    assert [c.ids[0] for c in out[2]] == ["C3"] and out[2][0].score == pytest.approx(1.0)
    assert all(0 <= c.score <= 1 for c in out[0]) and sum(c.score for c in out[0]) == pytest.approx(1.0)
    assert set(reranker._priors) == {"C1", "C2", "C3"}  # priors cached across calls


def test_reranker_needs_every_retriever_and_skips_work_when_nothing_was_generated():
    model = FusionModel(SOURCES, weights())
    with pytest.raises(ValueError, match="tfidf"):
        FusionReranker(model, small_kb(), {})
    fake = FakeRetriever({})
    assert FusionReranker(model, small_kb(), {"tfidf": fake}).rerank([Mention("a"), Mention("b")], [[], []], 3) == [
        [],
        [],
    ]
    assert fake.calls == []


def test_retrieve_keeps_the_last_texts_and_asks_only_for_new_ones():
    kb, model = small_kb(), FusionModel(SOURCES, weights(), depth=2)
    table = {t: [cand("C1", t, 0.5)] for t in ("a", "b", "c")}
    fake = FakeRetriever(table)
    reranker = FusionReranker(model, kb, {"tfidf": fake}, cache_size=2)
    first = reranker.retrieve("tfidf", [Mention("a"), Mention("b"), Mention("a")])
    assert fake.calls == [(["a", "b", "a"], 2)] and first == [table["a"], table["b"], table["a"]]
    first[0].append(cand("C9", "changed by the caller", 0.1))  # a copy: the cache is not changed
    assert reranker.retrieve("tfidf", [Mention("b"), Mention("a")]) == [table["b"], table["a"]]
    assert len(fake.calls) == 1 and reranker.cache_stats == {"hits": 2, "misses": 3}
    reranker.retrieve("tfidf", [Mention("c")])  # "b" is the least recently used of the 2 kept: dropped
    assert fake.calls[-1] == (["c"], 2)
    reranker.retrieve("tfidf", [Mention("a"), Mention("b")])
    assert fake.calls[-1] == (["b"], 2)
    reranker.clear_cache()  # TF-IDF's answer for a text is the same whatever shares its call: kept
    reranker.retrieve("tfidf", [Mention("A")])  # the same text once normalized: found
    assert fake.calls[-1] == (["b"], 2)
    reranker.clear_cache(every=True)
    reranker.retrieve("tfidf", [Mention("a")])
    assert fake.calls[-1] == (["a"], 2)
    dense = FakeRetriever(table)
    three = ["genbioel", "tfidf", "dense"]
    model3 = FusionModel(three, [0.0] * len(feature_names(three)), depth=2)
    both = FusionReranker(model3, kb, {"tfidf": fake, "dense": dense}, cache_size=5)
    both.retrieve("tfidf", [Mention("a")]), both.retrieve("dense", [Mention("a")])
    both.clear_cache()  # a neural encoder's floats depend on its batch: forgotten at each annotate chunk
    assert both._cache["dense"] == {} and list(both._cache["tfidf"]) == ["a"]
    uncached = FusionReranker(model, kb, {"tfidf": fake}, cache_size=0)
    calls = len(fake.calls)
    uncached.retrieve("tfidf", [Mention("a")])
    uncached.retrieve("tfidf", [Mention("a")])
    assert len(fake.calls) == calls + 2


@settings(max_examples=50, deadline=None)
@given(
    st.lists(st.lists(st.sampled_from("abcdefg"), min_size=0, max_size=6), min_size=1, max_size=6), st.integers(0, 4)
)
def test_retrieve_with_a_cache_returns_what_the_retriever_returns(batches, size):
    kb, model = small_kb(), FusionModel(SOURCES, weights(), depth=3)
    table = {t: [cand(f"C{i}", t, 1.0 / (i + 1)) for i in range(ord(t) % 4)] for t in "abcdefg"}
    fake = FakeRetriever(table)
    reranker = FusionReranker(model, kb, {"tfidf": fake}, cache_size=size)
    for batch in batches:
        mentions = [Mention(t) for t in batch]
        assert reranker.retrieve("tfidf", mentions) == [table[t][:3] for t in batch]
        assert len(reranker._cache["tfidf"]) <= size
    asked = sum(len(texts) for texts, _ in fake.calls)
    if size:  # every text is asked for or found, never both
        assert asked == reranker.cache_stats["misses"]
        assert asked + reranker.cache_stats["hits"] == sum(map(len, batches))
    else:
        assert asked == sum(map(len, batches))


# -- prediction files and the fit -----------------------------------------------------------------------
def record(doc, start, text, gold, cands):
    return {
        "doc_id": doc,
        "start": start,
        "end": start + len(text),
        "text": text,
        "gold": gold,
        "hit_rank": None,
        "candidates": [[list(c.ids), c.name, c.score] for c in cands],
    }


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf8")
    return path


def synthetic(n=40, seed=0):
    """The retriever is right when the mention is a KB name (exact), the generator otherwise."""
    rng = random.Random(seed)
    kb = KnowledgeBase([Concept(f"C{i}", [f"concept {i} name"]) for i in range(20)])
    gen, ret = [], []
    for i in range(n):
        g, w, x, y = (f"C{j}" for j in rng.sample(range(20), 4))
        j = lambda: rng.uniform(-0.05, 0.05)  # noqa: E731
        if i % 2 == 0:
            text = kb.preferred_name(g)
            g_list = [cand(w, "w", -0.3 + j()), cand(g, "g", -0.7 + j()), cand(x, "x", -1.2 + j())]
            r_list = [cand(g, "g", 0.8 + j()), cand(w, "w", 0.6 + j()), cand(y, "y", 0.4 + j())]
        else:
            text = f"paraphrase number {i}"
            g_list = [cand(g, "g", -0.3 + j()), cand(w, "w", -0.7 + j()), cand(x, "x", -1.2 + j())]
            r_list = [cand(w, "w", 0.8 + j()), cand(g, "g", 0.6 + j()), cand(y, "y", 0.4 + j())]
        gen.append(record(f"d{i // 3}", 10 * i, text, [g], g_list))
        ret.append(record(f"d{i // 3}", 10 * i, text, [g], r_list))
    return kb, gen, ret


def test_read_fusion_examples_joins_sources_in_any_order_and_split(tmp_path):
    kb, gen, ret = synthetic(12)
    files = {
        "genbioel": [write_jsonl(tmp_path / "g0.jsonl", gen[:5]), write_jsonl(tmp_path / "g1.jsonl", gen[5:])],
        "tfidf": [write_jsonl(tmp_path / "t.jsonl", list(reversed(ret)) + [record("zz", 0, "extra", ["C1"], [])])],
    }
    examples = read_fusion_examples(files, kb)
    assert len(examples) == 12 and all(ex.kb is kb for ex in examples)
    for ex, g, r in zip(examples, gen, ret):
        assert ex.text == g["text"] and ex.gold == frozenset(g["gold"])
        assert [c.ids[0] for c in ex.lists["tfidf"]] == [ids[0] for ids, _, _ in r["candidates"]]
        assert isinstance(ex.lists["genbioel"][0], Candidate)


def test_read_fusion_examples_refusals(tmp_path):
    _, gen, ret = synthetic(6)
    g = write_jsonl(tmp_path / "g.jsonl", gen)
    with pytest.raises(ValueError, match="no 'genbioel'"):
        read_fusion_examples({"tfidf": [g]})
    short = write_jsonl(tmp_path / "short_tfidf.jsonl", ret[:-1])
    with pytest.raises(ValueError, match="source 'tfidf' has no prediction.*short_tfidf.jsonl"):
        read_fusion_examples({"genbioel": [g], "tfidf": [short]})
    again = write_jsonl(
        tmp_path / "again.jsonl", gen[2:3]
    )  # a mention listed twice (a repeated document): two examples
    with pytest.raises(ValueError, match="source 'tfidf' has no prediction"):
        read_fusion_examples({"genbioel": [g, again], "tfidf": [write_jsonl(tmp_path / "t.jsonl", ret)]})
    twice = read_fusion_examples(
        {"genbioel": [g, again], "tfidf": [write_jsonl(tmp_path / "t2.jsonl", ret + ret[2:3])]}
    )
    assert len(twice) == len(read_fusion_examples({"genbioel": [g]})) + 1
    (tmp_path / "bad.jsonl").write_text(json.dumps(gen[0]) + "\n\n" + '{"doc_id": "d1"}\n')
    with pytest.raises(ValueError, match=re.escape(str(tmp_path / "bad.jsonl")) + ":3"):
        read_fusion_examples({"genbioel": [tmp_path / "bad.jsonl"]})


def test_mentions_without_gold_are_dropped(tmp_path):
    c = [cand("C1", "x", -0.1)]
    g = write_jsonl(
        tmp_path / "g.jsonl",
        [record("d", 0, "a", ["-1"], c), record("d", 5, "b", [], c), record("d", 9, "c", [" C1 ", "CUI-less"], c)],
    )
    examples = read_fusion_examples({"genbioel": [g]})
    assert [(ex.text, ex.gold) for ex in examples] == [("c", frozenset({"C1"}))]


def test_drop_examples_by_folded_text_and_gold(tmp_path):
    lists = {"genbioel": [cand("C1", "x", -0.1)]}
    examples = [
        FusionExample("Renal Failure", frozenset({"C1"}), lists),
        FusionExample("renal failure", frozenset({"C2"}), lists),
        FusionExample("lung", frozenset({"C3"}), lists),
    ]
    held = write_jsonl(
        tmp_path / "dev.jsonl",
        [record("x", 0, "renal   FAILURE", ["C1"], []), record("x", 30, "lung", ["C3", "-1"], [])],
    )
    kept, dropped = drop_examples(examples, [held])
    assert dropped == 2 and [ex.gold for ex in kept] == [frozenset({"C2"})]


def test_fit_fusion_beats_both_sources(tmp_path):
    kb, gen, ret = synthetic(40)
    unreachable = record("u", 0, "nothing useful", ["C19"], [cand("C0", "c0", -0.1)])
    files = {
        "genbioel": [write_jsonl(tmp_path / "g.jsonl", gen + [unreachable])],
        "tfidf": [write_jsonl(tmp_path / "t.jsonl", ret + [{**unreachable, "candidates": []}])],
    }
    examples = read_fusion_examples(files)
    model = fit_fusion(examples, kb, depth=3)
    assert model.sources == SOURCES and model.depth == 3 and model.retrievers == {}
    assert all(math.isfinite(w) for w in model.weights)
    w, fit = dict(zip(model.features, model.weights)), model.fit
    assert w["log_prior"] == 0.0 and w["exact"] > 0  # no priors in this KB: a constant feature
    assert set(fit) == {
        "mentions",
        "reachable",
        "unreachable",
        "l2",
        "converged",
        "loss",
        "standardized_weights",
        "recall",
        "generator_width",
    }
    assert fit["generator_width"] == max(len(r["candidates"]) for r in gen)
    assert (fit["mentions"], fit["reachable"], fit["unreachable"]) == (41, 40, 1)
    assert fit["converged"] and fit["standardized_weights"]["log_prior"] == 0.0
    recall = score_fusion(model, examples, kb)
    assert recall == fit["recall"] and set(recall) == {"genbioel", "tfidf", "fusion", "oracle"}
    best_alone = max(recall["genbioel"]["recall@1"], recall["tfidf"]["recall@1"])
    assert best_alone <= 0.6 and recall["fusion"]["recall@1"] > best_alone
    assert recall["fusion"]["recall@1"] == recall["oracle"]["recall"] == round(40 / 41, 4)
    assert recall["fusion"]["recall@5"] >= recall["fusion"]["recall@1"]
    model.save(tmp_path / "fusion.json")  # the saved weights rank as the fitted ones do
    assert score_fusion(FusionModel.load(tmp_path / "fusion.json"), examples, kb)["fusion"] == recall["fusion"]


def test_fit_fusion_uses_each_examples_own_kb_and_refuses_nothing_to_fit():
    kb, _, _ = synthetic(2)
    lists = {"genbioel": [cand("C1", "x", -0.1)], "tfidf": [cand("C2", "y", 0.5)]}
    with pytest.raises(ValueError, match="nothing to fit"):
        fit_fusion([FusionExample("t", frozenset({"C9"}), lists)], kb)
    prior_kb = kb.with_priors({"C1": 9})
    examples = [
        FusionExample("t", frozenset({"C1"}), lists, prior_kb),
        FusionExample("t", frozenset({"C2"}), lists, kb),
    ]
    model = fit_fusion(examples, kb, ["genbioel", "tfidf"], l2=0.01)
    assert model.fit["l2"] == 0.01 and model.fit["reachable"] == 2
    _, _, x = fusion_features(
        "t", lists, SOURCES, 5, prior_kb
    )  # prior 9 for one example's C1, 0 elsewhere: it varies, may get a weight
    assert x[0, -1] == pytest.approx(math.log(10))


# -- fit-fusion command -----------------------------------------------------------------------------------
@pytest.fixture()
def fold_files(tmp_path):
    kb, gen, ret = synthetic(40)
    kb.to_jsonl(tmp_path / "kb.jsonl")
    paths = {
        name: [write_jsonl(tmp_path / f"{name}{i}.jsonl", records[i * 20 : (i + 1) * 20]) for i in range(2)]
        for name, records in (("g", gen), ("t", ret))
    }
    return tmp_path, gen, paths


def fit_args(tmp_path, paths, *extra):
    return [
        "fit-fusion",
        "--source",
        f"tfidf={paths['t'][0]},{paths['t'][1]}",
        "--source",
        f"genbioel={paths['g'][0]},{paths['g'][1]}",
        "--kb",
        str(tmp_path / "kb.jsonl"),
        "--out",
        str(tmp_path / "out" / "fusion.json"),
        "--depth",
        "3",
        *extra,
    ]


def test_fit_fusion_command(fold_files):
    tmp_path, gen, paths = fold_files
    result = runner.invoke(app, fit_args(tmp_path, paths, "--retriever-model", "tfidf=some/dir"))
    assert result.exit_code == 0, result.output
    model = FusionModel.load(tmp_path / "out" / "fusion.json")
    assert model.sources == SOURCES and model.depth == 3 and model.retrievers == {"tfidf": {"model": "some/dir"}}
    assert (
        model.fit["mentions"] == 40
        and model.fit["recall"]["fusion"]["recall@1"] > model.fit["recall"]["tfidf"]["recall@1"]
    )
    assert "fusion" in result.output and "weight exact" in result.output
    held = write_jsonl(tmp_path / "dev.jsonl", gen[:10])
    pairs = {(" ".join(r["text"].lower().split()), tuple(r["gold"])) for r in gen[:10]}
    n_dropped = sum((" ".join(r["text"].lower().split()), tuple(r["gold"])) in pairs for r in gen)
    assert n_dropped >= 10  # exact-name mentions of one concept repeat across the set
    result = runner.invoke(
        app, fit_args(tmp_path, paths, "--exclude", str(held), "--kb", str(tmp_path / "kb.jsonl"))
    )  # a KB per fold
    assert result.exit_code == 0, result.output
    assert f"{n_dropped} examples dropped" in result.output
    again = FusionModel.load(tmp_path / "out" / "fusion.json")
    assert again.fit["mentions"] == 40 - n_dropped and again.retrievers == {"tfidf": {}}
    assert "generator_beams" not in again.fit
    assert runner.invoke(app, fit_args(tmp_path, paths, "--generator-beams", "2")).exit_code == 0
    assert FusionModel.load(tmp_path / "out" / "fusion.json").fit["generator_beams"] == 2


@pytest.mark.parametrize(
    "args",
    [
        ["--source", "genbioel"],
        ["--source", "=a.jsonl"],
        ["--source", "genbioel=a.jsonl,b.jsonl", "--source", "tfidf=c.jsonl"],
        ["--source", "genbioel=a.jsonl", "--retriever-model", "dense=dir"],
    ],
)
def test_fit_fusion_command_refuses_bad_options(tmp_path, args):
    result = runner.invoke(
        app, ["fit-fusion", *args, "--kb", str(tmp_path / "kb.jsonl"), "--out", str(tmp_path / "f.json")]
    )
    assert result.exit_code != 0 and not (tmp_path / "f.json").exists()


def test_fit_fusion_command_errors_name_the_problem(fold_files):
    tmp_path, _, paths = fold_files
    result = runner.invoke(
        app, fit_args(tmp_path, paths, "--kb", str(tmp_path / "kb.jsonl"), "--kb", str(tmp_path / "kb.jsonl"))
    )
    assert result.exit_code != 0  # three KBs for two folds
    paths["t"][1] = tmp_path / "missing.jsonl"
    result = runner.invoke(app, fit_args(tmp_path, paths))
    assert result.exit_code == 1 and "fit-fusion:" in result.output and "missing.jsonl" in result.output
    assert not (tmp_path / "out" / "fusion.json").exists()


# -- the component ----------------------------------------------------------------------------------------
@pytest.fixture()
def parts(tmp_path, micro_model, word_tokenizer):
    from conftest import random_kb

    from spacy_genbioel.models import save_model

    kb = random_kb(1, n_concepts=30)
    save_model(micro_model, word_tokenizer, tmp_path / "model")
    kb.to_jsonl(tmp_path / "kb.jsonl")
    fusion = FusionModel(
        SOURCES,
        [0.5, 0.25, 1.0, 0.75, 0.5, 2.0, 1.5, 1.0, 3.0, 0.25],
        depth=3,
        retrievers={"tfidf": {}},
        fit={"mentions": 10, "recall": {"fusion": {"recall@1": 0.5}}},
    )
    fusion.save(tmp_path / "fusion.json")
    text = f"We saw {kb.names[0]} and later {kb.names[7]} in the clinic ."
    return kb, tmp_path, fusion, text


def test_packaged_pipeline_carries_its_fusion(parts):
    from spacy_genbioel.training.package import EntitySource, package

    kb, tmp_path, fusion, text = parts
    out = package(
        tmp_path / "model",
        tmp_path / "kb.jsonl",
        tmp_path / "pkg",
        entities=EntitySource(entity_label="Disease", abbreviations=False),
        settings={"num_beams": 3, "top_k": 3, "reranker.fusion": str(tmp_path / "fusion.json")},
    )
    assert (out / "genbioel" / "fusion.json").exists()
    (tmp_path / "fusion.json").unlink()  # the pipeline travels with its own copy
    nlp = spacy.load(out)
    assert nlp.meta["genbioel_fusion"]["sources"] == SOURCES
    component = nlp.get_pipe("genbioel")
    assert component.fusion == fusion and component.reranker.model == fusion
    assert isinstance(component.reranker, FusionReranker)
    doc = nlp(text)
    assert doc.ents
    for ent in doc.ents:
        cands = ent._.kb_candidates
        assert 1 <= len(cands) <= 3 and all(cid in kb for cid, _, _ in cands)
        scores = [score for _, _, score in cands]
        assert all(0.0 <= s <= 1.0 for s in scores) and sum(scores) <= 1.0 + 1e-5
        assert scores == sorted(scores, reverse=True) and ent._.kb_id == cands[0][0]
    # bytes round trip keeps it
    clone = spacy.load(out)
    clone.get_pipe("genbioel").from_bytes(component.to_bytes())
    assert clone.get_pipe("genbioel").fusion == fusion


def test_pipeline_without_fusion_has_no_reranker(parts):
    from spacy_genbioel.training.package import EntitySource, package

    _, tmp_path, fusion, text = parts
    out = package(
        tmp_path / "model",
        tmp_path / "kb.jsonl",
        tmp_path / "pkg",
        settings={"num_beams": 3, "top_k": 3},
        entities=EntitySource(entity_label="Disease", abbreviations=False),
    )
    assert not (out / "genbioel" / "fusion.json").exists()
    nlp = spacy.load(out)
    assert nlp.get_pipe("genbioel").fusion is None and nlp.get_pipe("genbioel").reranker is None
    assert "genbioel_fusion" not in nlp.meta
    component = nlp.get_pipe("genbioel")  # a fusion set later is saved; dropping it again removes the file
    component.fusion = fusion
    nlp.to_disk(tmp_path / "again")
    assert FusionModel.load(tmp_path / "again" / "genbioel" / "fusion.json") == fusion
    component.fusion = None
    nlp.to_disk(tmp_path / "again")
    assert not (tmp_path / "again" / "genbioel" / "fusion.json").exists()


def test_fusion_factory_setting(parts, caplog):
    kb, tmp_path, fusion, text = parts
    nlp = spacy.blank("en")
    ruler = nlp.add_pipe("entity_ruler")
    ruler.add_patterns([{"label": "Disease", "pattern": kb.names[0]}])
    nlp.add_pipe(
        "genbioel",
        config={
            "model": str(tmp_path / "model"),
            "kb": str(tmp_path / "kb.jsonl"),
            "device": "cpu",
            "decoding": {"num_beams": 3, "top_k": 3},
            "fusion": str(tmp_path / "fusion.json"),
        },
    )
    component = nlp.get_pipe("genbioel")
    assert component.fusion == fusion and isinstance(component.reranker, FusionReranker)
    doc = nlp(text)
    scores = [s for ent in doc.ents for _, _, s in ent._.kb_candidates]
    assert scores and all(0.0 <= s <= 1.0 for s in scores)
    nlp.to_disk(tmp_path / "saved")
    assert FusionModel.load(tmp_path / "saved" / "genbioel" / "fusion.json") == fusion
    (tmp_path / "fusion.json").unlink()  # like the model and KB, the fusion travels inside the pipeline
    with caplog.at_level("WARNING", logger="spacy_genbioel"):
        loaded = spacy.load(tmp_path / "saved")
    assert "using the fusion saved with the pipeline" in caplog.text and loaded.get_pipe("genbioel").fusion == fusion
    assert isinstance(loaded.get_pipe("genbioel").reranker, FusionReranker)
    # a configured file that is missing (and no saved copy) is named on first use; a damaged one at once
    cfg = {
        "model": str(tmp_path / "model"),
        "kb": str(tmp_path / "kb.jsonl"),
        "device": "cpu",
        "fusion": str(tmp_path / "nope.json"),
    }
    bad = spacy.blank("en")
    bad.add_pipe("genbioel", config=cfg)
    with pytest.raises(FusionFormatError, match="nope.json"):
        bad("renal failure")
    (tmp_path / "damaged.json").write_text("{")
    with pytest.raises(FusionFormatError, match="damaged.json"):
        spacy.blank("en").add_pipe("genbioel", config={**cfg, "fusion": str(tmp_path / "damaged.json")})
    # a configured file that exists names another fusion than the saved one: it wins
    other = FusionModel(SOURCES, weights(log_prior=1.0), depth=2)
    other.save(tmp_path / "other.json")
    override = spacy.load(
        tmp_path / "saved", config={"components": {"genbioel": {"fusion": str(tmp_path / "other.json")}}}
    )
    assert override.get_pipe("genbioel").fusion == other


def test_a_fusion_reads_the_generators_lists_at_the_width_it_was_fitted_on(parts, caplog):
    kb, tmp_path, fusion, text = parts
    narrow = FusionModel(SOURCES, fusion.weights, depth=3, retrievers={"tfidf": {}}, fit={"generator_width": 2})
    narrow.save(tmp_path / "narrow.json")

    def component(**reranker):
        nlp = spacy.blank("en")
        nlp.add_pipe(
            "genbioel",
            config={
                "model": str(tmp_path / "model"),
                "kb": str(tmp_path / "kb.jsonl"),
                "device": "cpu",
                "decoding": {"num_beams": 3, "top_k": 3},
                "fusion": str(tmp_path / "narrow.json"),
                "reranker": {"@misc": "genbioel.reranker.v1", **reranker},
            },
        )
        caplog.clear()
        with caplog.at_level("WARNING", logger="spacy_genbioel"):
            found = nlp.get_pipe("genbioel").link([Mention(kb.names[0]), Mention(kb.names[7])])
        return nlp.get_pipe("genbioel"), found, caplog.text

    _, _, log = component()  # fitted on 2-beam lists, read at 3
    assert "fitted on the generator's top 2; it now reads its top 3" in log
    two, found, log = component(generator_beams=2)
    assert "fitted on the generator's top" not in log
    assert (two.linker.decoding.num_beams, two.linker.decoding.top_k, two.decoding.num_beams) == (2, 2, 3)
    assert max(len(c) for c in found) == 3  # decoding.top_k fused candidates, from a 2-beam search and TF-IDF's list
    with pytest.raises(ValueError, match="generator_beams"):
        component(generator_beams=0)
    # a file that records its fold predictions' width (fit-fusion --generator-beams) is searched at it
    FusionModel(
        SOURCES, fusion.weights, depth=3, retrievers={"tfidf": {}}, fit={"generator_width": 2, "generator_beams": 2}
    ).save(tmp_path / "narrow.json")
    recorded, _, log = component()
    assert recorded.linker.decoding.num_beams == 2 and "fitted on the generator's top" not in log


def test_evaluate_refuses_a_missing_fusion_override(tmp_path):
    FusionModel(SOURCES, weights()).save(tmp_path / "there.json")
    check_component_settings({"reranker.fusion": str(tmp_path / "there.json")})
    with pytest.raises(EvaluationSetupError, match="gone.json"):
        check_component_settings({"reranker.fusion": str(tmp_path / "gone.json")})
