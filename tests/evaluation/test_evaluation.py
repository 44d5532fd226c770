"""recall@k, GenBioEL subpopulations, similarity bins, reports, on hand-made data."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from spacy_genbioel.evaluation.analysis import SimilarityBins, similarity_bins, subpopulation_table
from spacy_genbioel.evaluation.plots import plot_similarity_bins
from spacy_genbioel.evaluation.recall import gold_id_set, hit_rank, recall_at_k
from spacy_genbioel.evaluation.report import EvaluationReport, evaluate_linker, write_predictions
from spacy_genbioel.kb.base import Concept, KnowledgeBase
from spacy_genbioel.retrieval.exact import ExactLinker
from spacy_genbioel.retrieval.tfidf import TfidfLinker
from spacy_genbioel.ty import Candidate, Mention


def m(text: str, *ids: str) -> Mention:
    return Mention(text=text, ids=tuple(ids))


def c(*ids: str, name: str = "x", score: float = 1.0) -> Candidate:
    return Candidate(tuple(ids), name, score)


@pytest.fixture(scope="module")
def kb() -> KnowledgeBase:
    return KnowledgeBase(
        [
            Concept("C1", ["Heart Attack", "myocardial infarction"]),
            Concept("C2", ["diabetes"]),
            Concept("C3", ["breast cancer"]),
            Concept("C4", ["asthma"]),
        ],
        name="tiny",
    )


# -- recall@k -----------------------------------------------------------------


def test_gold_id_set_drops_no_concept_markers():
    assert gold_id_set(m("a", "-1")) == frozenset()
    assert gold_id_set(m("a")) == frozenset()
    assert gold_id_set(m("a", "D1", "-1")) == {"D1"}


def test_hit_rank_uses_union_of_top_k_ids():
    cands = [c("C2"), c("C3", "C1"), c("C1")]
    assert hit_rank({"C1"}, cands) == 2
    assert hit_rank({"C9", "C3"}, cands) == 2
    assert hit_rank({"C9"}, cands) is None
    assert hit_rank(set(), cands) is None
    assert hit_rank({"C1"}, []) is None


def test_recall_rule_composite_skipped_and_coverage(kb, caplog):
    gold = [
        m("a", "C1"),  # hit at 2
        m("b", "C1", "C2"),  # composite, hit at 1 through C2, counts once
        m("c", "-1"),  # skipped
        m("d"),  # skipped
        m("e", "C9"),  # gold not in KB: a miss, in the denominator
        m("f", "C1", "C9"),  # composite, partly missing from KB, hit at 1
        m("g", "C3"),  # no candidates
    ]
    preds = [[c("C2"), c("C1")], [c("C3", "C2"), c("C1")], [c("C1")], [], [c("C1")], [c("C1")], []]
    with caplog.at_level("WARNING"):
        res = recall_at_k(gold, preds, ks=(5, 1, 2), kb=kb)
    assert res.ks == (1, 2, 5)
    assert res.n_mentions == 7
    assert res.n_evaluated == 5
    assert res.n_no_gold == 2
    assert res.n_composite == 2
    assert res.hits == {1: 2, 2: 3, 5: 3}
    assert res[1] == pytest.approx(2 / 5)
    assert res.recall[2] == pytest.approx(3 / 5)
    cov = res.coverage
    assert (cov.n_mentions, cov.n_all_in_kb, cov.n_any_missing, cov.n_all_missing) == (5, 3, 2, 1)
    assert cov.missing_ids == ["C9"]
    assert cov.fraction_all_in_kb == pytest.approx(3 / 5)
    assert "missing from KB" in caplog.text
    data = json.loads(json.dumps(res.to_dict()))
    assert data["recall"]["recall@1"] == pytest.approx(0.4)
    assert data["coverage"]["n_all_missing"] == 1


def test_recall_without_kb_and_edge_cases():
    res = recall_at_k([m("a", "C1")], [[c("C1")]])
    assert res.coverage is None and res.recall == {1: 1.0, 5: 1.0}
    empty = recall_at_k([m("a", "-1")], [[c("C1")]])
    assert empty.n_evaluated == 0 and empty.recall[1] is None
    with pytest.raises(ValueError, match="prediction lists"):
        recall_at_k([m("a", "C1")], [])
    with pytest.raises(ValueError, match="positive"):
        recall_at_k([m("a", "C1")], [[]], ks=(0,))


# -- Table 9 ------------------------------------------------------------------

TRAIN = [m("heart attack", "C1"), m("Heart-Attack", "C1"), m("diabetes", "C2"), m("tumor", "C3"), m("n/a", "-1")]
EVAL = [
    m("Heart Attack", "C1"),  # multi, seen mention, seen concept, direct match
    m("MI", "C1"),  # single, unseen mention, not a direct match
    m("asthma", "C4"),  # single, unseen mention, unseen concept, direct match
    m("breast tumour", "C3"),  # multi, unseen mention, seen concept, not a direct match
    m("whatever", "-1"),  # left out
]
PREDS = [[c("C1")], [c("C2"), c("C1")], [c("C4")], [c("C3")], [c("C1")]]


def test_subpopulation_table(kb):
    rows = {r.subset: r for r in subpopulation_table(TRAIN, EVAL, PREDS, kb)}
    expected = {
        "all": (4, 3),
        "single-word mentions": (2, 1),
        "multi-word mentions": (2, 2),
        "unseen mentions": (3, 2),
        "unseen concepts": (1, 1),
        "not a direct match": (2, 1),
        "top-100 concepts": (3, 2),
    }
    assert list(rows) == list(expected)
    for name, (count, hits) in expected.items():
        assert (rows[name].count, rows[name].hits) == (count, hits), name
        assert rows[name].recall_at_1 == pytest.approx(hits / count)


def test_subpopulation_top_n_and_empty_rows(kb):
    rows = subpopulation_table(TRAIN, EVAL, PREDS, kb, top_n_concepts=1)
    top = rows[-1]
    assert top.subset == "top-1 concepts"  # C1 is the most frequent training concept
    assert (top.count, top.hits) == (2, 1)
    none = subpopulation_table([], [m("x", "-1")], [[]], kb)
    assert all(r.count == 0 and r.recall_at_1 is None for r in none)


# -- similarity bins ------------------------------------------------------------


def test_similarity_bins_counts_and_accuracy(kb):
    mentions = [
        m("heart attack", "C1"),  # similarity 1.0 -> last bin, hit
        m("Diabetes", "C2"),  # 1.0, miss
        m("zzqx", "C3"),  # 0.0 -> first bin, miss
        m("breast tumour", "C3"),  # somewhere in between, hit
        m("whatever", "-1"),  # no gold
        m("gout", "C9"),  # gold not in KB: no names, in no bin
    ]
    preds = [[c("C1")], [c("C1")], [], [c("C3")], [], [c("C1")]]
    res = similarity_bins(mentions, preds, kb)
    assert isinstance(res, SimilarityBins)
    assert [b.count for b in res.bins][0] == 1 and res.bins[0].hits == 0
    assert res.bins[-1].count == 2 and res.bins[-1].hits == 1 and res.bins[-1].accuracy == 0.5
    assert sum(b.count for b in res.bins) == 4
    assert sum(b.hits for b in res.bins) == 2
    assert res.n_no_gold == 1 and res.n_no_gold_names == 1
    assert res.bins[-1].label == "[0.80, 1.00]" and res.bins[0].label == "[0.00, 0.20)"
    two = similarity_bins(mentions, preds, kb, bins=(0.0, 0.5, 1.0), tfidf=TfidfLinker(kb))
    assert [b.count for b in two.bins] == [1 + int(_mid(kb) < 0.5), 2 + int(_mid(kb) >= 0.5)]
    with pytest.raises(ValueError):
        similarity_bins(mentions, preds, kb, bins=(0.5, 0.2))


def _mid(kb) -> float:
    return float(TfidfLinker(kb).similarity(["breast tumour"], [kb.names_of("C3")])[0])


def test_plot_similarity_bins_writes_png(kb, tmp_path):
    res = similarity_bins([m("heart attack", "C1"), m("diabetic", "C2")], [[c("C1")], []], kb)
    out = plot_similarity_bins(res, tmp_path / "plots" / "bins.png")
    assert out.exists() and out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    out2 = plot_similarity_bins(json.loads(json.dumps(res.to_dict())), tmp_path / "from_dict.png")
    assert out2.stat().st_size > 1000


def test_evaluation_module_imports_matplotlib_lazily():
    code = (
        "import sys, spacy_genbioel.evaluation.plots, spacy_genbioel.evaluation.report; "
        "assert 'matplotlib' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_only_the_plots_module_uses_matplotlib():
    import re
    from pathlib import Path

    import spacy_genbioel.evaluation

    package = Path(spacy_genbioel.evaluation.__file__).parent
    uses = re.compile(r"^\s*(import|from) matplotlib", re.M)
    assert {p.name for p in package.glob("*.py") if uses.search(p.read_text(encoding="utf8"))} == {"plots.py"}


# -- evaluate_linker ----------------------------------------------------------------


class _FixedLinker:
    """A linker without a KB that returns canned predictions."""

    def __init__(self, preds):
        self.preds = preds

    def link(self, mentions, top_k=5):
        return [p[:top_k] for p in self.preds]


def test_evaluate_linker_full_report(kb):
    report = evaluate_linker(ExactLinker(kb), EVAL, top_k=5, train_mentions=TRAIN)
    assert isinstance(report, EvaluationReport)
    assert report.linker == "exact"
    assert report.n_mentions == 5 and report.top_k == 5
    assert report.seconds >= 0.0
    assert report.recall.ks == (1, 5)
    # exact matches: "Heart Attack" and "asthma"
    assert report.recall.hits == {1: 2, 5: 2}
    assert report.recall.coverage is not None and report.recall.coverage.n_all_in_kb == 4
    assert report.subpopulations is not None and report.subpopulations[0].count == 4
    assert report.similarity is not None
    data = json.loads(json.dumps(report.to_dict()))
    assert data["recall"]["recall"]["recall@1"] == pytest.approx(0.5)
    assert data["subpopulations"][0]["subset"] == "all"
    table = report.format_table()
    for text in ("recall@1", "recall@5", "not a direct match", "tf-idf similarity", "mentions/s"):
        assert text in table


def test_evaluate_linker_without_kb_and_ks(kb):
    preds = [[c("C1"), c("C2")], [c("C3")]]
    report = evaluate_linker(_FixedLinker(preds), [m("a", "C2"), m("b", "C1")], top_k=10, name="fixed")
    assert report.linker == "fixed"
    assert report.recall.ks == (1, 5, 10)
    assert report.recall.hits == {1: 0, 5: 1, 10: 1}
    assert report.subpopulations is None and report.similarity is None and report.recall.coverage is None
    assert "recall@10" in report.format_table()
    one = evaluate_linker(_FixedLinker(preds), [m("a", "C2"), m("b", "C1")], top_k=1, kb=kb, bins=None)
    assert one.recall.ks == (1,) and one.similarity is None and one.recall.coverage is not None


def test_write_predictions_one_line_per_mention(tmp_path):
    preds = [[c("C1", name="heart attack", score=0.5), c("C2", "C4", name="d")], [], [c("C3")]]
    mentions = [Mention("MI", ("C2",), doc_id="7", start=3, end=5), m("none", "-1"), m("bc", "C3", "C9")]
    report = evaluate_linker(_FixedLinker(preds), mentions, top_k=5, name="fixed")
    assert report.predictions == preds and "predictions" not in report.to_dict()
    path = tmp_path / "p.jsonl"
    assert write_predictions(path, mentions, report.predictions) == 3
    lines = [json.loads(line) for line in path.read_text(encoding="utf8").splitlines()]
    assert lines[0] == {
        "doc_id": "7",
        "start": 3,
        "end": 5,
        "text": "MI",
        "gold": ["C2"],
        "hit_rank": 2,
        "candidates": [[["C1"], "heart attack", 0.5], [["C2", "C4"], "d", 1.0]],
    }
    assert lines[1]["hit_rank"] is None and lines[1]["candidates"] == []  # no gold concept
    assert lines[2]["hit_rank"] == 1
    with pytest.raises(ValueError, match="prediction lists"):
        write_predictions(path, mentions[:2], preds)


def test_evaluate_linker_rejects_wrong_prediction_count():
    with pytest.raises(ValueError, match="prediction lists"):
        evaluate_linker(_FixedLinker([[]]), [m("a", "C1"), m("b", "C2")])


def test_evaluate_tfidf_reuses_its_vectorizer(kb):
    linker = TfidfLinker(kb)
    report = evaluate_linker(linker, EVAL, top_k=3, train_mentions=TRAIN)
    assert report.recall.recall[1] is not None
    assert report.similarity.bins[-1].count >= 2
