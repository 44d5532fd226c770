"""The OBO reader (kb/obo.py) on small ontologies in the real format (tests/fixtures/kb_sources):
its own terms only by default, obsolete terms, synonym scopes, namespaces as types."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from spacy_genbioel.kb import KBFormatError, read_obo

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "kb_sources"


def ids(concepts):
    return [c.id for c in concepts]


def test_the_ontologys_own_terms_only_by_default():
    # hp.obo imports a GO and an UBERON term; its header says `ontology: hp`
    assert ids(read_obo(FIXTURES / "hp.obo")) == ["HP:0000118", "HP:0001250", "HP:0001263", "HP:0031797"]
    assert ids(read_obo(FIXTURES / "mondo.obo")) == ["MONDO:0005015", "MONDO:0007254"]
    assert ids(read_obo(FIXTURES / "hp.obo", prefix=None))[-2:] == ["GO:0007610", "UBERON:0000955"]
    assert ids(read_obo(FIXTURES / "hp.obo", prefix=["GO", "UBERON:"])) == ["GO:0007610", "UBERON:0000955"]


def test_obsolete_terms_on_request():
    assert "HP:0000005" not in ids(read_obo(FIXTURES / "hp.obo"))
    kept = {c.id: c for c in read_obo(FIXTURES / "go.obo", obsolete=True)}
    assert kept["GO:0000005"].names == ["obsolete ribosomal chaperone activity"]


def test_synonym_scopes_and_types():
    seizure = next(c for c in read_obo(FIXTURES / "hp.obo") if c.id == "HP:0001250")
    # EXACT (typed: layperson) and RELATED; BROAD "Epilepsy" names another concept
    assert seizure.names == ["Seizure", "Epileptic seizure", "Seizures", "Fits"]
    assert seizure.types == ["human_phenotype"]  # the header's default-namespace
    assert seizure.definition.startswith("A seizure is")
    delay = next(c for c in read_obo(FIXTURES / "hp.obo", synonym_scopes=["exact", "NARROW"]) if c.id == "HP:0001263")
    assert delay.names == ["Global developmental delay", "Developmental delay", "Retarded development"]
    go = {c.id: c for c in read_obo(FIXTURES / "go.obo")}
    assert go["GO:0006915"].types == ["biological_process"] and "apoptosis" not in go["GO:0006915"].names
    with pytest.raises(ValueError, match="synonym scopes"):
        list(read_obo(FIXTURES / "go.obo", synonym_scopes=["SIMILAR"]))


def test_a_header_prefix_no_term_has_warns(tmp_path, caplog):
    path = tmp_path / "ordo.obo"
    path.write_text(
        "format-version: 1.2\nontology: ordo\n\n[Term]\nid: Orphanet:558\nname: Marfan syndrome\n", encoding="utf8"
    )
    with caplog.at_level(logging.WARNING, logger="spacy_genbioel.kb.obo"):
        assert list(read_obo(path)) == []
    assert "no term has an ID starting with ORDO:" in caplog.text
    assert ids(read_obo(path, prefix="Orphanet")) == ["Orphanet:558"]
    url = tmp_path / "url.obo"
    url.write_text(
        "ontology: http://purl.obolibrary.org/obo/mondo.owl\n\n[Term]\nid: MONDO:1\nname: x\n\n"
        "[Term]\nid: HP:1\nname: y\n",
        encoding="utf8",
    )
    assert ids(read_obo(url)) == ["MONDO:1"]


def test_no_header_keeps_every_term(tmp_path):
    path = tmp_path / "plain.obo"
    path.write_text(
        "[Term]\nid: A:1\nname: a\n\n[Term]\nid: B:1\nname: b\n\n[Typedef]\nid: r\nname: rel\n", encoding="utf8"
    )
    assert ids(read_obo(path)) == ["A:1", "B:1"]


def test_errors_name_file_and_line(tmp_path):
    path = tmp_path / "bad.obo"
    path.write_text("ontology: x\n\n[Term]\nid: X:1\nname: x\ndef: no quotes\n", encoding="utf8")
    with pytest.raises(KBFormatError, match=r"bad\.obo:6: expected a quoted string"):
        list(read_obo(path))
    path.write_text("ontology: x\n\n[Term]\nid: X:1\n", encoding="utf8")
    with pytest.raises(KBFormatError, match=r"bad\.obo:3: term X:1 has no name"):
        list(read_obo(path))
