"""End-to-end (NER + linking) evaluation: the scoring rules, predictions from
pipelines and external linkers, the ``evaluate --end-to-end`` command."""

import json

import pytest
import spacy
from conftest import data_dir
from typer.testing import CliRunner

from spacy_genbioel.cli import app
from spacy_genbioel.corpus.pubtator import PubTatorAnnotation, PubTatorDocument
from spacy_genbioel.evaluation.end_to_end import (
    PRF,
    PredictedEntity,
    evaluate_end_to_end,
    predict_entities,
    read_documents,
    run_end_to_end,
    score_end_to_end,
)
from spacy_genbioel.kb.base import Concept, KnowledgeBase
from spacy_genbioel.retrieval.exact import ExactLinker

runner = CliRunner()


def gold(start, end, ids=(), label="Disease", composite=False):
    return PubTatorAnnotation(start, end, "x" * (end - start), label, tuple(ids), composite, nil=not ids)


def pred(start, end, kb_id=None, label="Disease", ids=()):
    return PredictedEntity(start, end, label, kb_id, tuple(ids))


# document A: every rule once; document B: a gold mention nobody found
GOLD = [
    [
        gold(0, 10, ["D1"]),
        gold(20, 30, ["D2", "D3"], composite=True),
        gold(40, 50),  # NIL
        gold(60, 70, ["C1"], label="Chemical"),
        gold(80, 90, ["D5"]),
        gold(100, 110, ["D6"]),
        gold(112, 120, ["D6"]),
        gold(170, 180, ["D10"]),
    ],
    [gold(0, 5, ["D1"])],
]
PRED = [
    [
        pred(0, 10, "D1"),  # exact, right concept
        pred(20, 30, "D3"),  # a composite's second part
        pred(40, 50, "D9"),  # exactly on the NIL mention: ignored for linking, an entity for NER
        pred(60, 70, "C1"),  # right span and concept, wrong label
        pred(78, 90, "D5"),  # overlapping, right concept
        pred(100, 120, "D6"),  # overlaps two gold mentions: matches one of them
        pred(130, 140),  # not linked: an abstention
        pred(150, 160, "D8"),  # no gold at all
        pred(170, 180, "OMIM1", ids=["OMIM1", "D10"]),  # the top name's other concept is gold
    ],
    [],
]


def figures(prf):
    return (prf.tp, prf.fp, prf.fn)


def test_strict_and_partial_linking_and_ner_on_hand_made_predictions():
    report = score_end_to_end(GOLD, PRED)
    s = report.scores
    assert figures(s["linking"]["strict"]) == (3, 4, 5)
    assert (s["linking"]["strict"].precision, s["linking"]["strict"].recall) == pytest.approx((3 / 7, 3 / 8))
    assert s["linking"]["strict"].f1 == pytest.approx(0.4)
    assert figures(s["linking"]["partial"]) == (5, 2, 3)
    assert s["linking"]["partial"].f1 == pytest.approx(2 / 3)
    assert figures(s["linking_top_name"]["strict"]) == (4, 3, 4)
    assert s["linking_top_name"]["strict"].f1 == pytest.approx(8 / 15)
    assert figures(s["linking_top_name"]["partial"]) == (6, 1, 2)
    assert s["linking_top_name"]["partial"].f1 == pytest.approx(0.8)
    assert figures(s["ner"]["strict"]) == (4, 5, 5)
    assert figures(s["ner_untyped"]["strict"]) == (5, 4, 4)
    assert figures(s["ner"]["partial"]) == (6, 3, 3)
    assert figures(s["ner_untyped"]["partial"]) == (7, 2, 2)
    assert dict(report.counts) == {
        "documents": 2,
        "gold_mentions": 9,
        "gold_nil": 1,
        "gold_composite": 1,
        "predicted_entities": 9,
        "predicted_without_id": 1,
        "ignored_nil_strict": 1,
        "ignored_nil_partial": 1,
        "composite_matched_strict": 1,
        "composite_matched_partial": 1,
    }


def test_per_label_rows_score_each_label_alone():
    report = score_end_to_end(GOLD, PRED)
    chemical, disease = report.per_label["Chemical"], report.per_label["Disease"]
    assert figures(chemical["linking"]["strict"]) == (0, 0, 1) and chemical["linking"]["strict"].precision is None
    assert figures(chemical["ner"]["strict"]) == (0, 0, 1)
    # the Chemical mention predicted as Disease is an error here, though a linking hit overall
    assert figures(disease["linking"]["strict"]) == (2, 5, 5)
    assert figures(disease["ner"]["strict"]) == (4, 5, 4)
    only = score_end_to_end(GOLD, PRED, labels=["Chemical"])
    assert only.counts["gold_mentions"] == 1 and only.counts["predicted_entities"] == 0
    assert set(only.per_label) == {"Chemical"}


def test_matching_is_one_to_one_and_inputs_must_align():
    # two predictions on one gold mention: one true positive, one false positive
    report = score_end_to_end([[gold(0, 10, ["D1"])]], [[pred(0, 10, "D1"), pred(2, 8, "D1")]])
    assert figures(report.scores["linking"]["partial"]) == (1, 1, 0)
    # augmenting paths find the matching a greedy pass would miss
    report = score_end_to_end([[gold(0, 10, ["D1"]), gold(12, 20, ["D1"])]], [[pred(5, 15, "D1"), pred(0, 4, "D1")]])
    assert figures(report.scores["linking"]["partial"]) == (2, 0, 0)
    with pytest.raises(ValueError, match="2 gold documents but 1"):
        score_end_to_end([[], []], [[]])


def test_prf():
    assert PRF().precision is None and PRF().recall is None and PRF().f1 is None
    assert PRF(0, 1, 1).f1 == 0.0
    total = PRF(1, 1, 0)
    total.add(PRF(1, 0, 2))
    assert figures(total) == (2, 1, 2) and total.to_dict()["f1"] == pytest.approx(4 / 7)


# -- predictions from pipelines ------------------------------------------------------------------------
TEXT = "Reiter syndrome (RS) is rare. RS patients had arthritis."


def ruler_nlp(label="Disease"):
    nlp = spacy.blank("en")
    ruler = nlp.add_pipe("entity_ruler")
    ruler.add_patterns([{"label": label, "pattern": p} for p in ("Reiter syndrome", "RS", "arthritis")])
    return nlp


def reiter_documents():
    anns = [
        PubTatorAnnotation(TEXT.index(m, s), TEXT.index(m, s) + len(m), m, "SpecificDisease", ids)
        for m, s, ids in (("Reiter syndrome", 0, ("D1",)), ("RS", 0, ("D1",)), ("RS", 20, ("D1",)))
    ]
    anns.append(
        PubTatorAnnotation(TEXT.index("arthritis"), TEXT.index("arthritis") + 9, "arthritis", "Modifier", (), nil=True)
    )
    return [PubTatorDocument("1", TEXT, "", anns)]


def test_an_external_linker_gets_abbreviation_long_forms():
    pytest.importorskip("scispacy")
    linker = ExactLinker(KnowledgeBase([Concept("D1", ["Reiter syndrome"])]))
    nlp = ruler_nlp()
    expanded = predict_entities([TEXT], nlp, linker, abbreviations=True)[0]
    assert nlp.pipe_names == ["abbreviation_detector", "entity_ruler"]  # added where it was missing
    assert [(TEXT[p.start : p.end], p.kb_id) for p in expanded] == [
        ("Reiter syndrome", "D1"),
        ("RS", "D1"),
        ("RS", "D1"),
        ("arthritis", None),
    ]
    plain = predict_entities([TEXT], nlp, linker, abbreviations=False)[0]
    assert [p.kb_id for p in plain] == ["D1", None, None, None]


def test_evaluate_end_to_end_maps_gold_labels():
    pytest.importorskip("scispacy")
    linker = ExactLinker(KnowledgeBase([Concept("D1", ["Reiter syndrome"])]))
    report = evaluate_end_to_end(
        reiter_documents(),
        ruler_nlp(),
        linker,
        label_map={"SpecificDisease": "Disease", "Modifier": "Disease"},
        abbreviations=True,
    )
    assert figures(report.scores["linking"]["strict"]) == (3, 0, 0)
    assert figures(report.scores["ner"]["strict"]) == (4, 0, 0)  # the NIL arthritis is an entity
    assert report.counts["predicted_without_id"] == 1 and report.meta["linker"] == "ExactLinker"
    without = evaluate_end_to_end(reiter_documents(), ruler_nlp(), linker, single_label="Disease", abbreviations=False)
    assert figures(without.scores["linking"]["strict"]) == (1, 0, 2)
    unmapped = evaluate_end_to_end(reiter_documents(), ruler_nlp(), linker, abbreviations=False)
    assert figures(unmapped.scores["ner"]["strict"]) == (0, 4, 4) and figures(
        unmapped.scores["ner_untyped"]["strict"]
    ) == (4, 0, 0)


def test_a_linking_pipeline_writes_kb_id_and_top_name_ids(micro_model, word_tokenizer):
    kb = KnowledgeBase(
        [Concept("D1", ["renal failure"]), Concept("OMIM1", ["renal failure"]), Concept("D2", ["cystic fibrosis"])]
    )
    nlp = spacy.blank("en")
    nlp.add_pipe("entity_ruler").add_patterns([{"label": "Disease", "pattern": "renal failure"}])
    component = nlp.add_pipe("genbioel", config={"num_beams": 2, "top_k": 2, "device": "cpu"})
    component.set_model(micro_model, word_tokenizer, kb)
    [entity] = predict_entities(["Acute renal failure."], nlp)[0]
    # whichever name the untrained model picks, the entity carries all of that name's concepts
    assert entity.ids in (kb.ids_for_name("renal failure"), kb.ids_for_name("cystic fibrosis"))
    assert entity.kb_id == entity.ids[0] and kb.ids_for_name("renal failure") == ("D1", "OMIM1")


# -- the command ----------------------------------------------------------------------------------------
@pytest.fixture()
def package_dir(tmp_path, micro_model, word_tokenizer):
    from spacy_genbioel.models import save_model
    from spacy_genbioel.training.package import EntitySource, package

    save_model(micro_model, word_tokenizer, tmp_path / "model")
    KnowledgeBase([Concept("D1", ["renal failure"]), Concept("D2", ["cystic fibrosis"])]).to_jsonl(
        tmp_path / "kb.jsonl"
    )
    text = "Renal failure and cystic fibrosis."
    (tmp_path / "dev.txt").write_text(
        f"1|t|{text}\n1|a|\n"
        "1\t0\t13\tRenal failure\tSpecificDisease\tD1\n"
        "1\t18\t33\tcystic fibrosis\tModifier\tD2|D9\n\n"
    )
    return package(
        tmp_path / "model",
        tmp_path / "kb.jsonl",
        tmp_path / "pkg",
        settings={"num_beams": 2, "top_k": 2},
        entities=EntitySource(entity_label="Disease"),
    )


def test_evaluate_command_end_to_end(tmp_path, package_dir):
    pytest.importorskip("scispacy")
    base = [
        "evaluate",
        "--end-to-end",
        "--corpus",
        str(tmp_path / "dev.txt"),
        "--pipeline",
        str(package_dir),
        "--label-map",
        "ncbi",
    ]
    result = runner.invoke(
        app, [*base, "--linker", "exact", "--kb", str(tmp_path / "kb.jsonl"), "--json", str(tmp_path / "exact.json")]
    )
    assert result.exit_code == 0, result.output
    exact = json.loads((tmp_path / "exact.json").read_text())
    assert exact["linking"]["strict"] == {"precision": 1.0, "recall": 1.0, "f1": 1.0, "tp": 2, "fp": 0, "fn": 0}
    assert exact["ner"]["partial"]["f1"] == 1.0 and exact["counts"]["gold_composite"] == 1
    assert "genbioel" not in exact["meta"]["pipeline"] and exact["meta"]["linker"] == "exact"
    assert set(exact["per_label"]) == {"Disease"}
    result = runner.invoke(
        app, [*base, "--linker", "genbioel", "--device", "cpu", "--abbreviations", "--json", str(tmp_path / "g.json")]
    )
    assert result.exit_code == 0, result.output
    own = json.loads((tmp_path / "g.json").read_text())
    assert own["meta"]["pipeline"][-1] == "genbioel" and own["ner"]["strict"]["f1"] == 1.0
    assert own["linking"]["strict"]["tp"] + own["linking"]["strict"]["fp"] == 2  # each entity got a concept


def test_end_to_end_errors(tmp_path, package_dir):
    with pytest.raises(ValueError, match="kb is required for linker tfidf"):
        run_end_to_end(tmp_path / "dev.txt", pipeline=package_dir, linker="tfidf")
    with pytest.raises(ValueError, match="needs a pipeline"):
        run_end_to_end(tmp_path / "dev.txt", pipeline=None)
    with pytest.raises(ValueError, match="needs documents"):
        read_documents(tmp_path / "dev.txt", "askapatient")
    spacy.blank("en").to_disk(tmp_path / "blank")
    with pytest.raises(ValueError, match="no genbioel component"):
        run_end_to_end(tmp_path / "dev.txt", pipeline=tmp_path / "blank")


# -- the shared data -----------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.skipif(data_dir() is None, reason="needs ../shared/data")
def test_dictionary_ner_and_exact_linker_on_ncbi_dev():
    from spacy_genbioel.kb.build import build_kb
    from spacy_genbioel.ner import add_kb_entity_ruler

    data = data_dir()
    kb = build_kb("medic", [data / "vocab" / "medic_06Jul2012.txt"], dedup=False)
    nlp = spacy.blank("en")
    add_kb_entity_ruler(nlp, kb, "Disease")
    documents = read_documents(data / "ncbi_disease" / "NCBIdevelopset_corpus.txt")
    report = evaluate_end_to_end(
        documents,
        nlp,
        ExactLinker(kb),
        label_map={
            "SpecificDisease": "Disease",
            "DiseaseClass": "Disease",
            "Modifier": "Disease",
            "CompositeMention": "Disease",
        },
        abbreviations=False,
    )
    counts, s = report.counts, report.scores
    assert (counts["documents"], counts["gold_mentions"], counts["gold_nil"]) == (100, 787, 0)
    assert counts["predicted_without_id"] == 0  # every ruler match is a KB name
    assert s["ner"]["strict"].tp == s["ner_untyped"]["strict"].tp  # one label on both sides
    assert s["linking"]["strict"].tp <= s["linking_top_name"]["strict"].tp <= s["ner"]["strict"].tp
    assert s["ner"]["strict"].tp <= s["ner"]["partial"].tp
    assert 0.3 < s["ner"]["strict"].f1 < 0.9 and 0.3 < s["linking_top_name"]["strict"].f1 < 0.9
