"""The fused ranking speaks the linkers' language: a candidate is a name with its concepts, the fused one first."""

from spacy_genbioel.kb.base import Concept, KnowledgeBase
from spacy_genbioel.linking.reranking.fusion import FusionModel, feature_names
from spacy_genbioel.training.fusion_fit import FusionExample, score_fusion
from spacy_genbioel.ty import Candidate

SOURCES = ["genbioel", "tfidf"]


def kb():
    # "cancer" names two concepts; the KB lists C1 first
    return KnowledgeBase(
        [Concept("C1", ["cancer", "neoplasm"]), Concept("C2", ["cancer", "tumour"]), Concept("C3", ["fever"])]
    )


def model(**named):
    return FusionModel(SOURCES, [float(named.get(f, 0.0)) for f in feature_names(SOURCES)])


def test_a_shared_name_keeps_its_other_concepts_after_the_fused_one():
    lists = {
        "genbioel": [Candidate(("C2", "C1"), "cancer", -0.1), Candidate(("C3",), "fever", -2.0)],
        "tfidf": [Candidate(("C2",), "tumour", 0.9)],
    }
    ranked = model(genbioel_rr=1.0, tfidf_score=5.0).rank("tumor", lists, kb(), top_k=5)
    # C1 is listed under "cancer" only, a name already ranked (for C2): it comes under another of its KB names
    assert [(c.ids[0], c.name) for c in ranked] == [("C2", "cancer"), ("C1", "neoplasm"), ("C3", "fever")]
    assert ranked[0].ids == ("C2", "C1") and ranked[1].ids == ("C1",)  # a name's other concepts follow the fused one
    assert sum(c.score for c in ranked) <= 1.0 + 1e-9
    # a concept with no other name is left out rather than repeating a ranked name
    one = KnowledgeBase([Concept("C1", ["cancer"]), Concept("C2", ["cancer"])])
    ranked = model(genbioel_rr=1.0).rank(
        "x", {"genbioel": [Candidate(("C1", "C2"), "cancer", -0.1)], "tfidf": []}, one, top_k=5
    )
    assert [(c.ids, c.name) for c in ranked] == [(("C1", "C2"), "cancer")]


def test_score_fusion_uses_the_evaluation_rule_any_id_of_a_candidate():
    lists = {"genbioel": [Candidate(("C2", "C1"), "cancer", -0.1)], "tfidf": [Candidate(("C3",), "fever", 0.2)]}
    ex = FusionExample("cancer", frozenset({"C1"}), lists, kb())
    report = score_fusion(model(genbioel_rr=1.0), [ex], None)
    # the generator's first name holds C1 (second): a hit at rank 1 for it and for the fusion alike
    assert report["genbioel"]["recall@1"] == 1.0 and report["fusion"]["recall@1"] == 1.0
    assert report["tfidf"]["recall@5"] == 0.0 and report["oracle"]["recall"] == 1.0
