"""scispacy's meaning (issue 30 item 2): ``[output] probability`` (scores in [0, 1]),
``filter_for_definitions``, and scispacy's arguments at the top level answered with
where they live (:mod:`spacy_genbioel.linking.scispacy_compat`)."""

import logging
import math

import pytest
import spacy
from conftest import random_kb
from hypothesis import given, settings
from hypothesis import strategies as st

import spacy_genbioel  # noqa: F401  (registers the factory)
from spacy_genbioel.kb.base import Concept, KnowledgeBase
from spacy_genbioel.linking.scispacy_compat import (
    SCISPACY_SETTINGS,
    as_probabilities,
    keep_defined,
    warn_on_scispacy_habits,
    written_candidates,
)
from spacy_genbioel.linking.settings import LinkerSettings, OutputSettings, UnknownSettingError
from spacy_genbioel.models import save_model
from spacy_genbioel.ty import Candidate

PATTERNS = [{"label": "Disease", "pattern": p} for p in ("renal failure", "cystic fibrosis", "lung cancer")]
TEXT = "The patient had renal failure , lung cancer and cystic fibrosis ."

scores = st.lists(st.floats(min_value=-30, max_value=0, allow_nan=False), min_size=1, max_size=12)


@given(scores)
@settings(max_examples=60, deadline=None)
def test_probabilities_are_a_softmax_over_the_list(values):
    candidates = [Candidate((f"D{i}",), f"name {i}", v) for i, v in enumerate(values)]
    probabilities = as_probabilities(candidates)
    ps = [c.score for c in probabilities]
    assert all(0.0 <= p <= 1.0 for p in ps) and math.isclose(sum(ps), 1.0, rel_tol=1e-9)
    assert [c.ids for c in probabilities] == [c.ids for c in candidates]  # the linker's order is kept
    # a higher score never gets a lower probability
    assert all(ps[i] >= ps[j] for i in range(len(ps)) for j in range(len(ps)) if values[i] > values[j])
    assert as_probabilities([]) == []


def test_a_fused_list_already_holds_probabilities():
    fused = [[Candidate(("D1",), "a", 0.7), Candidate(("D2",), "b", 0.2)]]
    assert written_candidates(fused, OutputSettings(probability=True), None, True) == fused
    assert written_candidates(fused, OutputSettings(), None, False) == fused
    softmaxed = written_candidates(fused, OutputSettings(probability=True), None, False)[0]
    assert math.isclose(softmaxed[0].score, math.exp(0.7) / (math.exp(0.7) + math.exp(0.2)))


def test_filter_for_definitions_keeps_defined_concepts_unless_above_the_threshold():
    kb = KnowledgeBase(
        [
            Concept("D1", ["alpha"], "a definition"),
            Concept("D2", ["beta"]),
            Concept("D3", ["gamma"], "another"),
            Concept("D4", ["delta"]),
        ]
    )
    listed = [
        Candidate(("D2", "D3"), "shared", -0.1),
        Candidate(("D2",), "beta", -0.5),
        Candidate(("D4",), "delta", -2.0),
        Candidate(("D1",), "alpha", -3.0),
    ]
    assert keep_defined(listed, kb, OutputSettings().keeps_undefined) == [
        Candidate(("D3",), "shared", -0.1),
        Candidate(("D1",), "alpha", -3.0),
    ]
    # scispacy's no_definition_threshold: an undefined concept scoring at least it stays
    out = OutputSettings(filter_for_definitions=True, no_definition_threshold=-1.0)
    assert [c.name for c in keep_defined(listed, kb, out.keeps_undefined)] == ["shared", "beta", "alpha"]
    assert written_candidates([listed], out, kb, False) == [keep_defined(listed, kb, out.keeps_undefined)]


@pytest.fixture()
def pipeline_files(tmp_path, micro_model, word_tokenizer):
    save_model(micro_model, word_tokenizer, tmp_path / "model")
    kb = random_kb(1, n_concepts=30)
    kb.to_jsonl(tmp_path / "kb.jsonl")
    return tmp_path, kb


def linked(tmp_path, **output):
    nlp = spacy.blank("en")
    nlp.add_pipe("entity_ruler").add_patterns(PATTERNS)
    nlp.add_pipe(
        "genbioel",
        config={
            "model": str(tmp_path / "model"),
            "kb": str(tmp_path / "kb.jsonl"),
            "device": "cpu",
            "decoding": {"num_beams": 4, "top_k": 4},
            "output": output,
        },
    )
    return nlp(TEXT)


def test_the_component_writes_probabilities_everywhere(pipeline_files):
    tmp_path, _ = pipeline_files
    raw = linked(tmp_path)
    prob = linked(tmp_path, probability=True)
    assert len(prob.ents) == 3
    for r, p in zip(raw.ents, prob.ents):
        assert all(s <= 0 for _, s in r._.kb_ents)  # the default: mean log-probabilities
        names = [(cid, name) for cid, name, _ in p._.kb_candidates]
        assert names == [(cid, name) for cid, name, _ in r._.kb_candidates] and p._.kb_id == r._.kb_id
        ps = [s for _, _, s in p._.kb_candidates]
        assert all(0.0 <= s <= 1.0 for s in ps) and sum(ps) == pytest.approx(1.0, abs=1e-5)  # one concept per name here
        assert [cid for cid, _ in p._.kb_ents] == [cid for cid, _ in r._.kb_ents]
        assert all(0.0 <= s <= 1.0 for _, s in p._.kb_ents)
    # the threshold reads the probability: above the top one, no ID; at it, the ID
    top = prob.ents[0]._.kb_ents[0][1]
    assert linked(tmp_path, probability=True, threshold=top + 1e-6).ents[0]._.kb_id is None
    assert linked(tmp_path, probability=True, threshold=top).ents[0]._.kb_id == prob.ents[0]._.kb_id


def test_the_component_filters_for_definitions(pipeline_files):
    tmp_path, kb = pipeline_files
    unfiltered = linked(tmp_path)
    first = unfiltered.ents[0]._.kb_ents
    # definitions for every concept but the first mention's top one (decoding reads names only)
    undefined = first[0][0]
    KnowledgeBase(
        [Concept(c.id, c.names, None if c.id == undefined else f"definition of {c.id}") for c in kb]
    ).to_jsonl(tmp_path / "kb.jsonl")
    doc = linked(tmp_path, filter_for_definitions=True)
    assert [e._.kb_ents for e in doc.ents][0] == [ent for ent in first if ent[0] != undefined]
    assert doc.ents[0]._.kb_id == first[1][0]  # the best defined concept is the link
    assert all(undefined not in {cid for cid, _, _ in e._.kb_candidates} for e in doc.ents)
    # scispacy's no_definition_threshold: an undefined concept scoring at least it stays
    kept = linked(tmp_path, filter_for_definitions=True, no_definition_threshold=first[0][1])
    assert kept.ents[0]._.kb_ents == first


@pytest.mark.parametrize(
    "name, where",
    [
        ("threshold", "[output]"),
        ("max_entities_per_mention", "top_k"),
        ("k", "num_beams"),
        ("filter_for_definitions", "[output]"),
        ("no_definition_threshold", "[output]"),
        ("linker_name", "'model'"),
    ],
)
def test_scispacy_arguments_at_the_top_level_say_where_they_live(name, where):
    value = "umls" if name == "linker_name" else 0.7
    with pytest.raises(
        UnknownSettingError, match=rf"{name}.*scispacy's EntityLinker.*{where.replace('[', '.').replace(']', '.')}"
    ):
        spacy.blank("en").add_pipe("genbioel", config={name: value})
    assert set(SCISPACY_SETTINGS) >= {name}


def test_a_block_setting_at_the_top_level_names_its_block():
    with pytest.raises(UnknownSettingError, match=r"'retriever' is a setting of the \[candidates\] block"):
        LinkerSettings.from_config({"retriever": "tfidf"})


def test_a_threshold_no_score_can_reach_is_warned_about(caplog):
    with caplog.at_level(logging.WARNING, logger="spacy_genbioel"):
        warn_on_scispacy_habits("genbioel", LinkerSettings(output=OutputSettings(threshold=0.7)))
    assert "above every score it writes" in caplog.text and "probability = true" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="spacy_genbioel"):
        for output in (
            OutputSettings(threshold=0.7, probability=True),
            OutputSettings(threshold=-0.5),
            OutputSettings(),
        ):
            warn_on_scispacy_habits("genbioel", LinkerSettings(output=output))
    assert not caplog.text


def test_no_definition_threshold_must_be_finite():
    with pytest.raises(ValueError, match="no_definition_threshold"):
        OutputSettings(no_definition_threshold=float("nan"))
