"""The component's config blocks: defaults defined once, overrides, the 0.1 flat names."""
import pytest
import spacy
from hypothesis import given, settings, strategies as st

from spacy_genbioel.linking.settings import (
    DEFAULT_CONFIG, LEGACY_SETTINGS, SETTING_BLOCKS, CandidateSettings, DecodingConfig, apply_legacy, linking_overrides,
    make_candidates, make_decoding, make_inputs,
)


def test_blocks_are_registered_under_versioned_names():
    for block, name in (("inputs", "genbioel.inputs.v1"), ("decoding", "genbioel.decoding.v1"),
                        ("candidates", "genbioel.candidates.v1")):
        assert DEFAULT_CONFIG[block]["@misc"] == name
        assert spacy.util.registry.misc.get(name)


def test_default_config_matches_the_registered_functions_defaults():
    assert make_decoding() == DecodingConfig()
    assert make_candidates() == CandidateSettings()
    nlp = spacy.blank("en")
    pipe = nlp.add_pipe("genbioel")
    assert pipe.decoding == DecodingConfig() and pipe.inputs == make_inputs() and pipe.candidates == "none"


def test_overrides_reach_the_right_block():
    assert linking_overrides(num_beams=3, retriever="tfidf", device="cpu", exact_match=None) == {
        "decoding": {"num_beams": 3}, "candidates": {"retriever": "tfidf"}, "device": "cpu"}
    assert linking_overrides(**{"candidates.model": "dir", "model": "m"}) == {"candidates": {"model": "dir"}, "model": "m"}
    with pytest.raises(ValueError, match="Unknown genbioel setting"):
        linking_overrides(beams=3)
    with pytest.raises(ValueError, match="Unknown genbioel setting"):
        linking_overrides(**{"decoding.nope": 1})


def test_every_legacy_name_maps_onto_a_block_setting():
    for old, (block, key) in LEGACY_SETTINGS.items():
        assert key in DEFAULT_CONFIG[block], old
        assert SETTING_BLOCKS.get(key) == block or key == "model"


@settings(max_examples=25, deadline=None)
@given(num_beams=st.integers(1, 8), context=st.integers(0, 100), k=st.integers(1, 50), exact=st.booleans())
def test_flat_0_1_settings_and_blocks_build_the_same_component(num_beams, context, k, exact):
    flat = {"num_beams": num_beams, "top_k": 1, "context_words": context, "candidates": "tfidf", "num_candidates": k,
            "exact_match": exact}
    blocks = {"decoding": {"num_beams": num_beams, "top_k": 1, "exact_match": exact}, "inputs": {"context_words": context},
              "candidates": {"retriever": "tfidf", "num_candidates": k}}
    a = spacy.blank("en").add_pipe("genbioel", config=flat)
    b = spacy.blank("en").add_pipe("genbioel", config=blocks)
    assert (a.decoding, a.inputs, a.candidates) == (b.decoding, b.inputs, b.candidates)


def test_apply_legacy_without_flat_settings_changes_nothing():
    inputs, decoding, candidates = make_inputs(), make_decoding(), make_candidates()
    assert apply_legacy({"num_beams": None}, inputs, decoding, candidates) == (inputs, decoding, candidates)


def test_bad_block_values_fail_at_creation():
    with pytest.raises(ValueError, match="top_k"):
        make_decoding(num_beams=2, top_k=3)
    with pytest.raises(ValueError, match="context_words"):
        make_inputs(context_words=-1)
