"""Pipelines saved by spacy_genbioel 0.1 (flat settings) and 0.2 (blocks, top-level fusion)
load and link as they did."""

import json
import subprocess
import sys
from pathlib import Path

import spacy
from conftest import assert_same_links

from spacy_genbioel.linking.settings import LEGACY_NAMES

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "legacy_v0_1"
FIXTURE_0_2 = Path(__file__).resolve().parents[1] / "fixtures" / "pipeline_v0_2"


def test_a_0_1_pipeline_loads_and_links_identically(tmp_path):
    out = tmp_path / "legacy"
    subprocess.run([sys.executable, str(FIXTURE / "make_fixture.py"), str(out)], check=True, capture_output=True)
    assert "num_beams = 4" in (out / "config.cfg").read_text()  # the flat 0.1 config, not a re-saved one
    nlp = spacy.load(out)
    component = nlp.get_pipe("genbioel")
    # the flat settings reached the blocks
    assert (component.decoding.num_beams, component.decoding.top_k, component.candidates.num_candidates) == (4, 3, 6)
    assert (component.inputs.context_words, component.decoding.exact_match, component.candidates.retriever) == (
        8,
        True,
        "tfidf",
    )
    sys.path.insert(0, str(FIXTURE))
    from make_fixture import TEXTS, linked

    expected = json.loads((FIXTURE / "expected.json").read_text())
    got = linked(nlp)
    assert len(got) == len(TEXTS)
    assert_same_links(got, expected)


def test_a_0_1_pipeline_resaved_keeps_linking_the_same(tmp_path):
    out = tmp_path / "legacy"
    subprocess.run([sys.executable, str(FIXTURE / "make_fixture.py"), str(out)], check=True, capture_output=True)
    nlp = spacy.load(out)
    nlp.to_disk(tmp_path / "resaved")
    config = spacy.util.load_config(tmp_path / "resaved" / "config.cfg")["components"]["genbioel"]
    # the 0.1 names given keep precedence over the blocks' defaults
    assert config["num_beams"] == 4 and config["candidates"] == "tfidf" and "decoding" in config
    again = spacy.load(tmp_path / "resaved")
    assert again.get_pipe("genbioel").decoding == nlp.get_pipe("genbioel").decoding
    sys.path.insert(0, str(FIXTURE))
    from make_fixture import linked

    assert_same_links(linked(again), json.loads((FIXTURE / "expected.json").read_text()))


def test_a_0_1_trie_file_without_fingerprint_loads_as_it_is(tmp_path, caplog):
    """0.1 wrote format 1 tries (no tokenizer fingerprint): they load, are checked
    by re-tokenizing a sample of KB names, and are used as they are."""
    from safetensors import safe_open
    from safetensors.numpy import load_file, save_file

    out = tmp_path / "legacy"
    subprocess.run([sys.executable, str(FIXTURE / "make_fixture.py"), str(out)], check=True, capture_output=True)
    trie_file = out / "genbioel" / "trie.safetensors"
    with safe_open(str(trie_file), framework="np") as handle:
        meta = handle.metadata()
    old = {"format_version": "1", **{k: meta[k] for k in ("vocab_size", "eos_token_id", "root_token_id", "max_depth")}}
    save_file(load_file(str(trie_file)), str(trie_file), metadata=old)
    with caplog.at_level("WARNING", logger="spacy_genbioel"):
        nlp = spacy.load(out)
    assert "rebuild" not in caplog.text
    assert nlp.get_pipe("genbioel").linker.trie.tokenizer_fingerprint is None  # the stored trie, not a rebuilt one
    sys.path.insert(0, str(FIXTURE))
    from make_fixture import linked

    assert_same_links(linked(nlp), json.loads((FIXTURE / "expected.json").read_text()))


def _load_0_2(out):
    subprocess.run([sys.executable, str(FIXTURE_0_2 / "make_fixture.py"), str(out)], check=True, capture_output=True)
    return spacy.load(out)


def test_a_0_2_pipeline_loads_and_links_identically(tmp_path):
    nlp = _load_0_2(tmp_path / "p02")
    assert "fusion = null" in (tmp_path / "p02" / "config.cfg").read_text()  # the 0.2 config, not a re-saved one
    component = nlp.get_pipe("genbioel")
    assert (component.decoding.num_beams, component.decoding.top_k, component.decoding.exact_match) == (4, 3, True)
    assert (component.candidates.retriever, component.candidates.num_candidates) == ("tfidf", 6)
    assert (component.inputs.context_words, component.output.threshold, component.fusion) == (8, -4.0, None)
    expected = json.loads((FIXTURE_0_2 / "expected.json").read_text())
    sys.path.insert(0, str(FIXTURE))
    from make_fixture import linked  # the 0.1 fixture's, which the 0.2 one reuses

    assert_same_links(linked(nlp), expected)
    nlp.to_disk(tmp_path / "resaved")
    # its `num_beams = null` lines meant "not given": the re-saved config leaves them out and links the same
    resaved = spacy.util.load_config(tmp_path / "resaved" / "config.cfg")["components"]["genbioel"]
    assert not set(LEGACY_NAMES) & set(resaved) and resaved["decoding"]["num_beams"] == 4
    assert_same_links(linked(spacy.load(tmp_path / "resaved")), expected)
