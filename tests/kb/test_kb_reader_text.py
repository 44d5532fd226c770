"""What the KB readers make of the text in names (kb/umls.py, kb/obo.py, kb/sources.py, kb/base.py):
control characters and terminal escapes dropped and counted with file and line, MRDEF definitions
holding '|' read whole, OBO end-of-line comments and trailing modifiers stripped."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spacy_genbioel.kb import KBFormatError
from spacy_genbioel.kb.base import read_concepts_jsonl, read_target_kb_json
from spacy_genbioel.kb.normalizers import strip_controls
from spacy_genbioel.kb.obo import read_obo
from spacy_genbioel.kb.sources import read_askapatient_kb, read_ctd, read_medic, read_scispacy_jsonl
from spacy_genbioel.kb.umls import read_umls


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf8")
    return path


def conso_row(cui: str, name: str, aui: str = "A1") -> str:
    return f"{cui}|ENG|P|L1|PF|S1|Y|{aui}||M1|D1|MSH|MH|D1|{name}|0|N|256|"


# -- control characters ------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "raw, clean",
    [
        ("renal\x00 failure", "renal failure"),
        ("\x1b[31mrenal failure\x1b[0m", "renal failure"),
        ("renal\x1b]0;pwned\x07 failure", "renal failure"),
        ("renal\x7f failure\x9b2J", "renal failure"),
        ("renal\x0bfailure", "renal failure"),
        ("Sjögren\u200b syndrome", "Sjögren\u200b syndrome"),  # invisible format characters: the normalizers' job
    ],
)
def test_strip_controls(raw, clean):
    assert strip_controls(raw) == clean
    assert strip_controls("a\tb", keep_tabs=True) == "a\tb" and strip_controls("a\tb") == "a b"


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=40))
def test_fuzz_strip_controls_leaves_no_control_character(text):
    cleaned = strip_controls(text)
    assert not any(ord(c) < 32 or 0x7F <= ord(c) <= 0x9F for c in cleaned)
    assert strip_controls(cleaned) == cleaned


def test_umls_names_lose_nul_and_escapes_with_a_warning_naming_the_line(tmp_path, caplog):
    conso = write(
        tmp_path / "MRCONSO.RRF",
        "\n".join([conso_row("C1", "Renal failure"), conso_row("C1", "Kidney\x00 failure", "A2")])
        + "\n"
        + conso_row("C2", "\x1b[1;31mHeart attack\x1b[0m", "A3")
        + "\n",
    )
    with caplog.at_level(logging.WARNING):
        concepts = {c.id: c for c in read_umls(conso)}
    assert concepts["C1"].names == ["Renal failure", "Kidney failure"]
    assert concepts["C2"].names == ["Heart attack"]
    assert "MRCONSO.RRF: control characters" in caplog.text and "2 lines" in caplog.text
    assert "line 2, line 3" in caplog.text


def test_medic_names_lose_controls_raw_or_as_entities(tmp_path, caplog):
    path = write(tmp_path / "medic.txt", "MESH:D1||Renal\x1b[31m failure|Kidney\x00&#27; failure\n")
    with caplog.at_level(logging.WARNING):
        (concept,) = read_medic(path)
    assert concept.names == ["Renal failure", "Kidney failure"]
    assert "medic.txt" in caplog.text and "line 1" in caplog.text


def test_ctd_keeps_its_tabs_and_drops_the_nul(tmp_path):
    path = write(tmp_path / "CTD_diseases.tsv", "Kid\x00ney failure\tMESH:D1\t\t\t\t\t\tRenal failure\x1b[0m\t\n")
    (concept,) = read_ctd(path)
    assert concept.id == "D1" and concept.names == ["Kidney failure", "Renal failure"]


def test_json_readers_drop_escaped_controls(tmp_path, caplog):
    jsonl = write(
        tmp_path / "kb.jsonl", json.dumps({"id": "D1", "names": ["a\u0000b", "c"], "definition": "x\u001b[2Jy"})
    )
    with caplog.at_level(logging.WARNING):
        (concept,) = read_concepts_jsonl(jsonl)
    assert concept.names == ["ab", "c"] and concept.definition == "xy" and "kb.jsonl" in caplog.text
    target = write(tmp_path / "target_kb.json", json.dumps({"D1": ["a\u001bb"]}))
    assert list(read_target_kb_json(target))[0].names == ["ab"]
    scispacy = write(
        tmp_path / "s.jsonl", json.dumps({"concept_id": "C1", "canonical_name": "x\u0007y", "aliases": []})
    )
    assert list(read_scispacy_jsonl(scispacy))[0].names == ["xy"]
    ask = write(tmp_path / "askapatient.json", json.dumps({"1": [["primary", "head\u0000ache"]]}))
    assert list(read_askapatient_kb(ask))[0].names == ["headache"]


def test_a_clean_file_logs_no_warning(tmp_path, caplog):
    path = write(tmp_path / "MRCONSO.RRF", conso_row("C1", "Renal failure") + "\n")
    with caplog.at_level(logging.WARNING):
        list(read_umls(path))
    assert "control characters" not in caplog.text


# -- MRDEF ---------------------------------------------------------------------------------------------------------
def test_a_pipe_inside_an_mrdef_definition_keeps_the_whole_definition(tmp_path):
    conso = write(tmp_path / "MRCONSO.RRF", conso_row("C1", "Renal failure") + "\n")
    mrdef = write(tmp_path / "MRDEF.RRF", "C1|A1|AT1||MSH|Loss of function | of the kidneys|a|b.|N||\n")
    (concept,) = read_umls(conso, mrdef)
    assert concept.definition == "Loss of function | of the kidneys|a|b."


def test_a_suppressed_definition_with_a_pipe_stays_suppressed(tmp_path):
    conso = write(tmp_path / "MRCONSO.RRF", conso_row("C1", "Renal failure") + "\n")
    mrdef = write(tmp_path / "MRDEF.RRF", "C1|A1|AT1||MSH|Old | text.|O||\n")
    (concept,) = read_umls(conso, mrdef)
    assert concept.definition is None


def test_an_mrdef_row_whose_end_is_not_suppress_and_cvf_is_refused_with_its_line(tmp_path):
    conso = write(tmp_path / "MRCONSO.RRF", conso_row("C1", "Renal failure") + "\n")
    mrdef = write(tmp_path / "MRDEF.RRF", "C1|A1|AT1||MSH|fine.|N||\nC1|A1|AT1||MSH|a|b|c|d|\n")
    with pytest.raises(KBFormatError, match=r"MRDEF\.RRF:2: MRDEF row has 9 fields.*cannot tell where DEF ends"):
        list(read_umls(conso, mrdef))


# -- OBO -------------------------------------------------------------------------------------------------------
OBO = r"""format-version: 1.4
ontology: doid ! the disease ontology

[Term]
id: DOID:1 ! angiosarcoma
name: angiosarcoma {source="DOID"} ! a vascular cancer
def: "A cancer ! not a comment {not a modifier}." [url:http\://example.org] {source="x"} ! comment
synonym: "hemangio\!sarcoma" EXACT [] {source="MONDO"} ! a synonym
synonym: "malignant \"hemangioendothelioma\"" RELATED [ORDO:1] ! another
namespace: disease_ontology ! the namespace
is_obsolete: false ! kept

[Term]
id: DOID:2
name: Ewing\! sarcoma\, bone
is_obsolete: true ! replaced
"""


def test_obo_comments_and_trailing_modifiers_are_not_names(tmp_path):
    path = write(tmp_path / "doid.obo", OBO)
    (concept,) = read_obo(path)
    assert concept.id == "DOID:1"
    assert concept.names == ["angiosarcoma", "hemangio!sarcoma", 'malignant "hemangioendothelioma"']
    assert concept.definition == "A cancer ! not a comment {not a modifier}."
    assert concept.types == ["disease_ontology"]
    (obsolete,) = [c for c in read_obo(path, obsolete=True) if c.id == "DOID:2"]
    assert obsolete.names == ["Ewing! sarcoma, bone"]
