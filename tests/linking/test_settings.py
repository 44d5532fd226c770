"""The component's settings: each defined once (a dataclass field), everything else derived from it."""

import dataclasses
import inspect
import typing

import pytest
import spacy
from hypothesis import given, settings
from hypothesis import strategies as st

from spacy_genbioel.linking.inputs.builder import InputBuilder
from spacy_genbioel.linking.settings import (
    BLOCKS,
    DEFAULT_CONFIG,
    LEGACY_NAMES,
    LEGACY_SETTINGS,
    SETTING_BLOCKS,
    CandidateSettings,
    ComponentResources,
    DecodingSettings,
    LinkerSettings,
    OutputSettings,
    RerankerSettings,
    UnknownSettingError,
    load_overrides,
    nested_overrides,
)


def test_blocks_are_registered_under_versioned_names():
    for block, name in (
        ("inputs", "genbioel.inputs.v1"),
        ("decoding", "genbioel.decoding.v1"),
        ("candidates", "genbioel.candidates.v1"),
        ("output", "genbioel.output.v1"),
        ("reranker", "genbioel.reranker.v1"),
    ):
        assert DEFAULT_CONFIG[block]["@misc"] == name
        assert spacy.util.registry.misc.get(name) is BLOCKS[block][1]


def test_the_registered_default_config_round_trips_to_the_documented_defaults(tmp_path):
    nlp = spacy.blank("en")
    nlp.add_pipe("genbioel")
    # what spaCy registered for the factory is the derived config (not a copy that can drift)
    registered = dict(nlp.get_factory_meta("genbioel").default_config)
    assert registered.pop("scorer") == {"@scorers": "genbioel.linking_scorer.v1"} and registered == DEFAULT_CONFIG
    # through a saved config.cfg and spaCy's own resolution, a pipe without settings gets the defaults
    nlp.config.to_disk(tmp_path / "config.cfg")
    pipe = spacy.util.load_model_from_config(spacy.util.load_config(tmp_path / "config.cfg")).get_pipe("genbioel")
    assert pipe.settings == LinkerSettings()
    # and those are the documented ones (docs/configuration.md), pinned here by value, not derived
    s = pipe.settings
    assert (s.decoding.num_beams, s.decoding.top_k, s.decoding.search, s.inputs.context_words) == (5, 5, "beam", 64)
    assert (s.candidates.retriever, s.candidates.num_candidates, s.output.threshold) == ("none", 20, None)
    assert (s.reranker.fusion, s.reranker.cascade, s.resources.device) == (None, "off", "auto")


def test_the_factory_takes_one_keyword_per_resource_and_per_block():
    """The factory's own parameters are the settings classes': a new block or resource cannot be forgotten."""
    from spacy_genbioel.linking.component import make_genbioel

    hints = typing.get_type_hints(make_genbioel)  # the def's parameters, in order (not the legacy names)
    own = [name for name in hints if name not in ("nlp", "name", "scorer", "legacy", "return")]
    assert own == [f.name for f in dataclasses.fields(ComponentResources)] + list(BLOCKS)
    resources = typing.get_type_hints(ComponentResources)
    assert all(hints[name] == resources[name] for name in resources)
    for block, (_, cls) in BLOCKS.items():  # candidates also takes 0.1's retriever name
        assert hints[block] is cls or hints[block] == typing.Union[cls, str], block
    # what spaCy validates a config against: those, and the legacy names (None: not given)
    params = inspect.signature(make_genbioel).parameters
    assert set(DEFAULT_CONFIG) <= set(params) and set(LEGACY_SETTINGS) <= set(params)
    assert all(params[name].default is None for name in LEGACY_NAMES)
    assert not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


def test_a_new_field_reaches_the_config_and_the_overrides():
    # what adding a decoding setting amounts to: one field; the config, the overrides and
    # the factory's validation follow (checked on a derived copy of the block)
    assert SETTING_BLOCKS["length_penalty"] == "decoding" and DEFAULT_CONFIG["decoding"]["length_penalty"] == 1.0
    nlp = spacy.blank("en")
    assert nlp.add_pipe("genbioel", config={"decoding": {"length_penalty": 0.5}}).decoding.length_penalty == 0.5


def test_overrides_reach_the_right_block():
    assert nested_overrides({"num_beams": 3, "retriever": "tfidf", "device": "cpu", "exact_match": None}) == {
        "decoding": {"num_beams": 3},
        "candidates": {"retriever": "tfidf"},
        "device": "cpu",
    }
    assert nested_overrides({"candidates.model": "dir", "model": "m"}) == {"candidates": {"model": "dir"}, "model": "m"}
    assert nested_overrides({"reranker.fusion": "f.json"}) == {"reranker": {"fusion": "f.json"}}
    # loading, the flat name an earlier pipeline may hold for a setting is cleared, so the block value reaches it
    assert load_overrides({"decoding": {"num_beams": 3}, "device": "cpu"}) == {
        "num_beams": None,
        "decoding": {"num_beams": 3},
        "device": "cpu",
    }
    assert load_overrides({"reranker": {"fusion": "f.json"}}) == {"fusion": None, "reranker": {"fusion": "f.json"}}
    with pytest.raises(UnknownSettingError, match="Unknown genbioel setting 'beams'"):
        nested_overrides({"beams": 3})
    with pytest.raises(UnknownSettingError, match="decoding.nope"):
        nested_overrides({"decoding.nope": 1})


def test_every_legacy_name_maps_onto_a_block_setting():
    for old, (block, key) in LEGACY_SETTINGS.items():
        assert key in DEFAULT_CONFIG[block], old
        assert SETTING_BLOCKS.get(key) == block or key == "model"


@settings(max_examples=25, deadline=None)
@given(num_beams=st.integers(1, 8), context=st.integers(0, 100), k=st.integers(1, 50), exact=st.booleans())
def test_flat_0_1_settings_and_blocks_build_the_same_component(num_beams, context, k, exact):
    flat = {
        "num_beams": num_beams,
        "top_k": 1,
        "context_words": context,
        "candidates": "tfidf",
        "num_candidates": k,
        "exact_match": exact,
    }
    blocks = {
        "decoding": {"num_beams": num_beams, "top_k": 1, "exact_match": exact},
        "inputs": {"context_words": context},
        "candidates": {"retriever": "tfidf", "num_candidates": k},
    }
    a = spacy.blank("en").add_pipe("genbioel", config=flat)
    b = spacy.blank("en").add_pipe("genbioel", config=blocks)
    assert a.settings == b.settings


def test_a_block_value_set_on_purpose_wins_over_a_flat_name():
    built = LinkerSettings.from_config({"num_beams": 4, "top_k": 3, "decoding": {"num_beams": 6}})
    assert (built.decoding.num_beams, built.decoding.top_k) == (6, 3)


def test_overrides_reach_a_pipeline_saved_with_flat_names(tmp_path):
    nlp = spacy.blank("en")
    nlp.add_pipe("genbioel", config={"num_beams": 2, "top_k": 2})
    nlp.to_disk(tmp_path / "p")
    again = spacy.load(
        tmp_path / "p", config={"components": {"genbioel": load_overrides({"decoding": {"num_beams": 5}})}}
    )
    assert again.get_pipe("genbioel").decoding.num_beams == 5


def test_from_config_without_flat_settings_keeps_the_blocks():
    built = LinkerSettings.from_config({"decoding": DecodingSettings(num_beams=3, top_k=2), "num_beams": None})
    assert built.decoding == DecodingSettings(num_beams=3, top_k=2) and built.inputs == InputBuilder()
    assert LinkerSettings.from_config({"fusion": "f.json"}).reranker == RerankerSettings(fusion="f.json")


def test_a_misplaced_setting_names_the_blocks():
    with pytest.raises(UnknownSettingError, match=r"\[output\]"):
        LinkerSettings.from_config({"threshold": 0.7})


def test_bad_block_values_fail_at_creation():
    with pytest.raises(ValueError, match="top_k"):
        DecodingSettings(num_beams=2, top_k=3)
    with pytest.raises(ValueError, match="context_words"):
        InputBuilder(context_words=-1)
    with pytest.raises(ValueError, match="num_candidates"):
        CandidateSettings(num_candidates=0)
    with pytest.raises(ValueError, match="Unknown candidate generator"):
        CandidateSettings(retriever="nope")
    with pytest.raises(ValueError, match="threshold"):
        OutputSettings(threshold=float("nan"))
    with pytest.raises(Exception, match="num_beams"):  # spaCy validates config types against the dataclass
        spacy.blank("en").add_pipe("genbioel", config={"decoding": {"num_beams": "many"}})


def test_a_saved_config_holds_no_null_legacy_names(tmp_path):
    nlp = spacy.blank("en")
    nlp.add_pipe("genbioel", config={"decoding": {"num_beams": 3, "top_k": 2}, "threshold": None})
    nlp.to_disk(tmp_path / "nlp")
    section = spacy.util.load_config(tmp_path / "nlp" / "config.cfg")["components"]["genbioel"]
    assert not set(LEGACY_NAMES) & set(section)
    assert {key for key, value in section.items() if value is None} == {"model", "tokenizer", "kb", "spans_key"}
    loaded = spacy.load(tmp_path / "nlp")
    assert loaded.get_pipe("genbioel").settings == nlp.get_pipe("genbioel").settings
    # a flat name given a value is kept: the config means what it meant
    old = spacy.blank("en")
    old.add_pipe("genbioel", config={"num_beams": 6})
    assert old.config["components"]["genbioel"]["num_beams"] == 6
