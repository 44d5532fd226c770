"""spaCy's manners (issue 30 item 5): ``nlp.evaluate`` reports linking on gold ``kb_id``s
through the registered scorer, and the factory declares what it assigns and requires."""

import pytest
import spacy
from spacy.training import Example

import spacy_genbioel  # noqa: F401  (registers the factory)
from spacy_genbioel.linking.scorer import SCORER, score_links
from spacy_genbioel.ty import Candidate

PATTERNS = [
    {"label": label, "pattern": p}
    for label, p in (
        ("Disease", "renal failure"),
        ("Disease", "lung cancer"),
        ("Chemical", "aspirin"),
        ("Disease", "gout"),
    )
]
#: what the stub linker answers per mention text (score -1.0 each)
ANSWERS = {"renal failure": "D1", "lung cancer": "D9", "aspirin": "C1", "gout": "D4"}
#: (text, gold spans as (start, end, label, kb_id))
GOLD = [
    ("renal failure and lung cancer", [(0, 13, "Disease", "D1"), (18, 29, "Disease", "D2")]),  # right, wrong
    ("aspirin for gout", [(0, 7, "Chemical", "C0|C1"), (12, 16, "Disease", "")]),  # any of two IDs; gold with no ID
    ("no gold here but gout", []),  # a prediction without gold is not scored
]


class StubLinker:
    def __init__(self, answers, score=-1.0):
        self.answers, self.score = answers, score

    def link(self, mentions, top_k=5):
        return [[Candidate((self.answers[m.text],), m.text, self.score)] for m in mentions]


def make_nlp(name="genbioel", output=None, answers=ANSWERS, nlp=None):
    nlp = nlp or spacy.blank("en")
    if "entity_ruler" not in nlp.pipe_names:
        nlp.add_pipe("entity_ruler").add_patterns(PATTERNS)
    component = nlp.add_pipe("genbioel", name=name, config={"resolve_abbreviations": False, "output": output or {}})
    component.set_linker(StubLinker(answers))
    return nlp


def examples(nlp):
    out = []
    for text, spans in GOLD:
        reference = nlp.make_doc(text)
        reference.ents = [reference.char_span(s, e, label=label, kb_id=kb) for s, e, label, kb in spans]
        out.append(Example(nlp.make_doc(text), reference))
    return out


def test_nlp_evaluate_reports_linking_on_gold_kb_ids():
    nlp = make_nlp()
    scores = nlp.evaluate(examples(nlp))
    # scored: renal failure (right), lung cancer (wrong: fp + fn), aspirin (right: one of C0|C1)
    assert scores["nel_micro_p"] == pytest.approx(2 / 3) and scores["nel_micro_r"] == pytest.approx(2 / 3)
    assert scores["nel_micro_f"] == pytest.approx(2 / 3) and scores["nel_score"] == scores["nel_micro_f"]
    assert scores["nel_f_per_type"] == {
        "Disease": {"p": 0.5, "r": 0.5, "f": 0.5},
        "Chemical": {"p": 1.0, "r": 1.0, "f": 1.0},
    }
    assert scores["nel_macro_f"] == pytest.approx(0.75)


def test_an_abstention_is_a_false_negative_only():
    nlp = make_nlp(output={"threshold": -0.5})  # the stub's scores are -1.0: every span abstains
    scores = nlp.evaluate(examples(nlp))
    assert scores["nel_micro_r"] == 0.0 and scores["nel_micro_p"] == 0.0
    assert scores["nel_f_per_type"]["Disease"] == {"p": 0.0, "r": 0.0, "f": 0.0}


def test_two_linkers_score_under_their_own_names():
    nlp = make_nlp()
    wrong = {text: "X" for text in ANSWERS}
    make_nlp(
        "genbioel_mesh",
        {"kb_id_attr": "mesh_id", "candidates_attr": "mesh_candidates", "ents_attr": "mesh_ents", "write_kb_id": False},
        answers=wrong,
        nlp=nlp,
    )
    scores = nlp.evaluate(examples(nlp))
    assert scores["nel_micro_f"] == pytest.approx(2 / 3) and scores["nel_mesh_id_micro_f"] == 0.0


def test_the_scorer_is_in_the_config_and_survives_a_save(tmp_path):
    nlp = make_nlp()
    assert nlp.config["components"]["genbioel"]["scorer"] == {"@scorers": SCORER}
    assert spacy.registry.scorers.get(SCORER)() is score_links
    unlinked = spacy.blank("en")
    unlinked.add_pipe("entity_ruler").add_patterns(PATTERNS)
    unlinked.add_pipe("genbioel", config={"resolve_abbreviations": False})
    unlinked.to_disk(tmp_path / "nlp")  # a component without a model saves its settings only
    loaded = spacy.load(tmp_path / "nlp")
    loaded.get_pipe("genbioel").set_linker(StubLinker(ANSWERS))
    assert loaded.evaluate(examples(loaded))["nel_micro_f"] == pytest.approx(2 / 3)


def test_spans_key_linkers_are_scored_on_their_spans():
    nlp = spacy.blank("en")
    component = nlp.add_pipe("genbioel", config={"spans_key": "mentions", "resolve_abbreviations": False})
    component.set_linker(StubLinker(ANSWERS))
    predicted, reference = nlp.make_doc("renal failure and lung cancer"), nlp.make_doc("renal failure and lung cancer")
    predicted.spans["mentions"] = [predicted.char_span(0, 13, "Disease"), predicted.char_span(18, 29, "Disease")]
    reference.spans["mentions"] = [
        reference.char_span(0, 13, "Disease", kb_id="D1"),
        reference.char_span(18, 29, "Disease", kb_id="D9"),
    ]
    component(predicted)
    assert component.score([Example(predicted, reference)])["nel_micro_f"] == 1.0


def test_analyze_pipes_sees_what_the_component_assigns_and_requires():
    nlp = make_nlp()
    analysis = nlp.analyze_pipes()
    assert analysis["problems"] == {"entity_ruler": [], "genbioel": []}
    assert "token.ent_kb_id" in analysis["summary"]["genbioel"]["assigns"]
    assert "span._.kb_ents" in analysis["summary"]["genbioel"]["assigns"]
    assert "doc.ents" in analysis["summary"]["genbioel"]["requires"]
    alone = spacy.blank("en")
    alone.add_pipe("genbioel")
    assert "doc.ents" in alone.analyze_pipes()["problems"]["genbioel"]  # no NER before it


def test_score_links_on_examples_without_gold_links():
    nlp = make_nlp()
    doc = nlp("gout again")
    assert score_links([Example(doc, nlp.make_doc("gout again"))])["nel_micro_f"] == 0.0
