"""UMLS and RxNorm readers (kb/umls.py) on small files in the real RRF formats
(tests/fixtures/kb_sources/umls, .../rxnorm): folders, filters, types, definitions."""

from __future__ import annotations

import gzip
import shutil
from pathlib import Path

import pytest

from spacy_genbioel.kb import KBFormatError, RRFFilters, build_kb, read_rxnorm, read_umls
from spacy_genbioel.linking.kb_view import LinkerKB

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "kb_sources"
META = FIXTURES / "umls"
RXNORM = FIXTURES / "rxnorm"


def by_id(concepts):
    return {c.id: c for c in concepts}


def test_a_meta_folder_reads_names_types_and_definitions():
    concepts = by_id(read_umls(META))
    assert list(concepts) == ["C0011849", "C0020538", "C0004057"]
    diabetes = concepts["C0011849"]
    # English, unsuppressed, preferred atom (TS=P, STT=PF, ISPREF=Y) first
    assert diabetes.names == ["Diabetes Mellitus", "Diabetes mellitus (disorder)", "Diabetes"]
    assert diabetes.types == ["T047"]
    assert diabetes.definition.startswith("A heterogeneous group")  # MSH: a preferred definition source
    # a preferred source's definition wins over an earlier one from another source (CSP, then NCI)
    assert concepts["C0004057"].definition.startswith("A salicylate")
    assert concepts["C0004057"].types == ["T109", "T121"]
    # the file alone: no types, no definitions
    assert by_id(read_umls(META / "MRCONSO.RRF"))["C0011849"].types == []


def test_umls_filters_by_source_language_term_type_and_suppression():
    msh = by_id(read_umls(META, sabs=["MSH"]))
    assert msh["C0011849"].names == ["Diabetes Mellitus", "Diabetes"]
    assert "Hypertensive disorder" not in msh["C0020538"].names
    # definitions follow the source filter
    assert by_id(read_umls(META, sabs=["SNOMEDCT_US"]))["C0011849"].definition is None
    every = by_id(read_umls(META, languages=None, include_suppressed=True))
    assert {"Diabète", "Diabetes mellitus, NOS"} <= set(every["C0011849"].names)
    assert "high blood pressures" in every["C0020538"].names
    assert by_id(read_umls(META, languages=["FRE"]))["C0011849"].names == ["Diabète"]
    assert [c.names for c in read_umls(META, term_types=["MH"])] == [
        ["Diabetes Mellitus"],
        ["Hypertension"],
        ["Aspirin"],
    ]


@pytest.mark.parametrize("wanted", [["T047"], ["disease or syndrome"], ["Disease or Syndrome", "T999"]])
def test_semantic_types_by_tui_or_name(wanted):
    assert [c.id for c in read_umls(META, semantic_types=wanted)] == ["C0011849", "C0020538"]


def test_semantic_type_errors_name_the_file():
    with pytest.raises(ValueError, match=r"MRSTY\.RRF: semantic type 'Nope' is neither"):
        list(read_umls(META, semantic_types=["Nope"]))
    with pytest.raises(ValueError, match="need MRSTY"):
        list(read_umls(META / "MRCONSO.RRF", semantic_types=["T047"]))


def test_a_folder_without_the_concept_file_is_refused(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"no MRCONSO\.RRF"):
        list(read_umls(tmp_path))
    with pytest.raises(FileNotFoundError, match=r"no RXNCONSO\.RRF"):
        list(read_rxnorm(tmp_path))


def test_gzipped_files_in_a_folder(tmp_path):
    for name in ("MRCONSO.RRF", "MRSTY.RRF"):
        (tmp_path / f"{name}.gz").write_bytes(gzip.compress((META / name).read_bytes()))
    concepts = by_id(read_umls(tmp_path))
    assert concepts["C0020538"].types == ["T047"] and concepts["C0020538"].definition is None


def test_bad_rows_name_file_and_line(tmp_path):
    shutil.copy(META / "MRCONSO.RRF", tmp_path / "MRCONSO.RRF")
    (tmp_path / "MRSTY.RRF").write_text("C0011849|T047\n", encoding="utf8")
    with pytest.raises(KBFormatError, match=r"MRSTY\.RRF:1: semantic type row needs"):
        list(read_umls(tmp_path))
    (tmp_path / "MRSTY.RRF").unlink()
    (tmp_path / "MRDEF.RRF").write_text("C0011849|A1|AT1\n", encoding="utf8")
    with pytest.raises(KBFormatError, match=r"MRDEF\.RRF:1: MRDEF row needs"):
        list(read_umls(tmp_path))


def test_rxnorm_keeps_its_own_source_and_ranks_normal_forms_first():
    concepts = by_id(read_rxnorm(RXNORM))
    assert list(concepts) == ["1191", "198464", "215568"]
    assert concepts["1191"].names == ["aspirin", "acetylsalicylic acid"]  # IN first; MSH and ATC atoms out
    assert concepts["198464"].names == ["aspirin 300 MG Rectal Suppository"]  # the suppressed SY out
    assert concepts["1191"].types == ["T109", "T121"] and concepts["198464"].types == ["T200"]
    assert by_id(read_rxnorm(RXNORM, sabs=None))["215568"].names == ["Bayer Aspirin", "Bayer Aspirin Brand"]
    assert [c.id for c in read_rxnorm(RXNORM, term_types=["BN"])] == ["215568"]
    assert [c.id for c in read_rxnorm(RXNORM, semantic_types=["Clinical Drug"])] == ["198464"]


def test_filters_object():
    default = RRFFilters()
    assert default.keeps("ENG", "MSH", "PT", "N") and not default.keeps("FRE", "MSH", "PT", "N")
    assert not default.keeps("ENG", "MSH", "PT", "O") and RRFFilters(include_suppressed=True).keeps(
        "ENG", "MSH", "PT", "O"
    )
    assert not RRFFilters(sabs=("RXNORM",)).keeps("ENG", "MSH", "PT", "N")
    assert not RRFFilters(term_types=("SY",)).keeps("ENG", "MSH", "PT", "N")


def test_scispacy_view_gives_semantic_types():
    """scispacy's ``cui_to_entity[cui].types`` holds TUIs; so does ours for a UMLS-built KB."""
    kb = build_kb("umls", META, name="umls")
    entity = LinkerKB(kb).cui_to_entity["C0011849"]
    assert entity.types == ["T047"] and entity.canonical_name == "Diabetes Mellitus"
    assert "TUI(s): T047" in repr(entity) and entity.definition.startswith("A heterogeneous")


@pytest.mark.parametrize("name,problem", [("Diabetes|Mellitus", "a '|' inside a field"), ("  ", "empty name")])
def test_a_pipe_inside_a_name_or_an_empty_name_is_refused_with_its_line(tmp_path, name, problem):
    good = "C0011849|ENG|P|L0011849|PF|S0028929|Y|A0045493||M0006153|D003920|MSH|MH|D003920|Diabetes Mellitus|0|N|256|"
    bad = good.replace("Diabetes Mellitus", name)
    path = tmp_path / "MRCONSO.RRF"
    path.write_text(good + "\n" + bad + "\n", encoding="utf8")
    with pytest.raises(KBFormatError, match=rf"MRCONSO.RRF:2.*{problem}"):
        list(read_umls(path))
