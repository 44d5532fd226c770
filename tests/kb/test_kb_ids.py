"""Concept IDs every output format can write back, stripped names, and what the KB readers refuse or
report rather than accept silently (duplicate ``target_kb.json`` keys, swapped CTD columns, concepts
listed without names)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from spacy_genbioel.kb.base import Concept, KBFormatError, KnowledgeBase, id_problem
from spacy_genbioel.kb.compact import CompactKB
from spacy_genbioel.kb.sources import read_ctd, read_medic, read_mesh_tsv

BAD_IDS = ["D1\tX", "D1\nX", "D1\rX", "D|PIPE", "D1+D2", "D1,D2", "D1;D2", "D 1", "D\x001", "D\x851", "D\u20281"]


@pytest.mark.parametrize("cid", BAD_IDS)
def test_an_id_no_format_can_write_back_is_refused_by_the_kb(cid: str) -> None:
    assert id_problem(cid)
    for build in (KnowledgeBase, CompactKB.build):
        with pytest.raises(KBFormatError, match="concept #2: concept ID .* holds"):
            build([Concept("D0", ["renal failure"]), Concept(cid, ["cystic fibrosis"])])


@pytest.mark.parametrize("cid", ["D000001", "OMIM:123456", "DOID:0050117", "C0001175", "HP_0000118", "A01.1", "x-y.z"])
def test_ordinary_ids_pass(cid: str) -> None:
    assert id_problem(cid) is None
    assert KnowledgeBase([Concept(f" {cid} ", ["renal failure"])]).concept_ids == [cid]


@pytest.mark.parametrize("cid", ["D1\tX", "D|PIPE", "D1 X"])
def test_json_readers_name_the_file_and_line(tmp_path: Path, cid: str) -> None:
    jsonl = tmp_path / "kb.jsonl"
    jsonl.write_text(json.dumps({"id": "D0", "names": ["a"]}) + "\n" + json.dumps({"id": cid, "names": ["b"]}) + "\n")
    with pytest.raises(KBFormatError, match=r"kb.jsonl:2: concept ID"):
        KnowledgeBase.load(jsonl)
    target = tmp_path / "target_kb.json"
    target.write_text('{\n "D0": ["a"],\n %s: ["b"]\n}\n' % json.dumps(cid))
    with pytest.raises(KBFormatError, match=r"target_kb.json:3: concept ID"):
        KnowledgeBase.load(target)


def test_tsv_readers_name_the_file_and_line(tmp_path: Path) -> None:
    medic = tmp_path / "medic.txt"
    medic.write_text("D1||renal failure\nD2+D3||cystic fibrosis\n")
    with pytest.raises(KBFormatError, match=r"medic.txt:2: concept ID 'D2\+D3'"):
        list(read_medic(medic))
    mesh = tmp_path / "mesh.tsv"
    mesh.write_text("D000001\tName\t\tC01\t\nD0,2\tName\t\tC01\t\n")
    with pytest.raises(KBFormatError, match=r"mesh.tsv:2: concept ID"):
        list(read_mesh_tsv(mesh))


CTD_HEADER = (
    "# Fields:\n# DiseaseName\tDiseaseID\tAltDiseaseIDs\tDefinition\tParentIDs\tTreeNumbers\tParentTreeNumbers"
    "\tSynonyms\tSlimMappings\n#\n"
)


def test_swapped_ctd_columns_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "CTD_diseases.tsv"
    path.write_text(
        CTD_HEADER + "Renal failure\tMESH:D051437\t\t\t\tC12\t\t\t\nMESH:D003550\tCystic fibrosis\t\t\t\tC16\t\t\t\n"
    )
    with pytest.raises(KBFormatError, match=r"CTD_diseases.tsv:5: .*columns look swapped"):
        list(read_ctd(path))
    path.write_text(CTD_HEADER + "Renal failure\tRenal failure\t\t\t\tC12\t\t\t\n")
    with pytest.raises(KBFormatError, match=r"CTD_diseases.tsv:4: .*columns look swapped"):
        list(read_ctd(path))


def test_a_concept_listed_twice_in_target_kb_json_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "target_kb.json"
    path.write_text('{\n "D1": ["renal failure"],\n "D2": ["liver"],\n "D1": ["kidney failure"]\n}\n')
    with pytest.raises(KBFormatError, match=r"target_kb.json:4: concept 'D1' is listed twice"):
        KnowledgeBase.load(path)


def test_names_are_stripped_and_empty_ones_dropped_and_counted(caplog) -> None:
    concepts = [Concept("D1", ["  renal failure ", "renal failure", "", "   "]), Concept("D2", ["liver"])]
    with caplog.at_level(logging.WARNING, logger="spacy_genbioel"):
        kb = KnowledgeBase(concepts)
        compact = CompactKB.build(concepts)
    assert kb["D1"].names == ["renal failure"] and kb.drops.names == 1  # "" and "   " are one name once stripped
    assert compact.checksum() == kb.checksum() and compact.drops.names == 1
    assert any("dropped 1 name(s)" in r.getMessage() for r in caplog.records)


def test_a_concept_without_names_is_reported(tmp_path: Path, caplog) -> None:
    path = tmp_path / "kb.jsonl"
    path.write_text(
        json.dumps({"id": "D1", "names": ["renal failure"]}) + "\n" + json.dumps({"id": "D2", "names": []}) + "\n"
    )
    with caplog.at_level(logging.WARNING, logger="spacy_genbioel"):
        kb = KnowledgeBase.load(path)
    assert "D2" in kb and kb.drops.nameless == 1
    assert any("1 concept(s) without names" in r.getMessage() for r in caplog.records)
