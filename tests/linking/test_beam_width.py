"""One function decides the generator's beam width (:func:`generator_decoding`): decoding.num_beams,
reranker.generator_beams and a fusion file's generator_beams, in that order of precedence reversed, with a
warning when the file overrides a width the user set, and when reranker.beam cannot apply."""

import pytest

from spacy_genbioel.linking.decoding.decoder import DecodingSettings
from spacy_genbioel.linking.reranking.beam_width import generator_decoding
from spacy_genbioel.linking.reranking.fusion import FusionModel
from spacy_genbioel.linking.reranking.settings import RerankerSettings

SOURCES = ["genbioel", "tfidf"]
WEIGHTS = [0.5, 0.25, 1.0, 0.75, 0.5, 2.0, 1.5, 1.0, 3.0, 0.25]


def fusion(generator="beam", **fit):
    return FusionModel(SOURCES, WEIGHTS, depth=3, retrievers={"tfidf": {}}, fit=fit, generator=generator)


def decide(decoding, reranker=RerankerSettings(), model=None, caplog=None):
    if caplog is not None:
        caplog.clear()
    return generator_decoding(decoding, reranker, model, "genbioel")


def test_without_a_fusion_decoding_is_as_configured():
    decoding = DecodingSettings(num_beams=7, top_k=3)
    assert decide(decoding, RerankerSettings(generator_beams=2)) is decoding


def test_the_order_setting_then_file_then_decoding(caplog):
    decoding = DecodingSettings(num_beams=5, top_k=5)
    assert decide(decoding, model=fusion()).num_beams == 5  # nothing recorded: decoding.num_beams
    recorded = fusion(generator_beams=3)
    with caplog.at_level("WARNING", logger="spacy_genbioel"):
        assert (decide(decoding, model=recorded).num_beams, decide(decoding, model=recorded).top_k) == (3, 3)
    assert "not decoding.num_beams" not in caplog.text  # the default width: nothing the user chose is overridden
    chosen = decide(decoding, RerankerSettings(generator_beams=8), recorded)
    assert (chosen.num_beams, chosen.top_k) == (8, 5)  # reranker.generator_beams wins; top_k is kept within it


def test_a_file_overriding_an_explicit_width_says_so(caplog):
    with caplog.at_level("WARNING", logger="spacy_genbioel"):
        decided = decide(DecodingSettings(num_beams=10, top_k=4), model=fusion(generator_beams=3), caplog=caplog)
    assert decided.num_beams == 3 and decided.top_k == 3
    assert "searches 3 beams" in caplog.text and "not decoding.num_beams = 10" in caplog.text
    with caplog.at_level("WARNING", logger="spacy_genbioel"):
        decide(DecodingSettings(num_beams=10), RerankerSettings(generator_beams=3), fusion(generator_beams=3), caplog)
    assert "not decoding.num_beams" not in caplog.text  # reranker.generator_beams: the user's own choice


@pytest.mark.parametrize("recorded", ["nan", 0, "abc", 2.5])
def test_a_bad_recorded_width_is_refused_naming_it(recorded):
    with pytest.raises(ValueError, match="generator_beams must be a whole number >= 1"):
        decide(DecodingSettings(), model=fusion(generator_beams=recorded))


def test_reranker_beam_set_on_a_beam_fitted_cascade_is_said_to_have_no_effect(caplog):
    cascade = fusion()
    with caplog.at_level("WARNING", logger="spacy_genbioel"):
        decide(DecodingSettings(), RerankerSettings(cascade="on", beam="weak"), cascade, caplog)
    assert "reranker.beam = 'weak' has no effect" in caplog.text
    with caplog.at_level("WARNING", logger="spacy_genbioel"):
        decide(DecodingSettings(), RerankerSettings(cascade="on", beam="weak"), fusion("forced"), caplog)
        decide(DecodingSettings(), RerankerSettings(cascade="on"), cascade)
    assert "has no effect" not in caplog.text


def test_lists_read_at_another_length_than_fitted_are_said(caplog):
    with caplog.at_level("WARNING", logger="spacy_genbioel"):
        decide(DecodingSettings(num_beams=3, top_k=3), model=fusion(generator_width=2), caplog=caplog)
    assert "fitted on the generator's top 2; it now reads its top 3" in caplog.text
