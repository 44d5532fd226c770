"""`build-kb` as users need it: every name kept by default (de-duplication on request, with what it
took reported), the UMLS / RxNorm / OBO filters on the command line, semantic types from MeSH XML."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from typer.testing import CliRunner

from spacy_genbioel.cli import app
from spacy_genbioel.kb import Concept, KnowledgeBase, build_kb, dedup_losses, read_mesh_xml

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "kb_sources"
runner = CliRunner()
MEDIC = "D1||Tooth agenesis|Hypodontia\nD2||Tooth agenesis\nD3||Reiter syndrome|Reactive arthritis|ReA\nD4||ReA\n"


def _records(path: Path):
    return [json.loads(line) for line in path.read_text(encoding="utf8").splitlines()]


def test_every_name_is_kept_by_default(tmp_path):
    (tmp_path / "medic.txt").write_text(MEDIC, encoding="utf8")
    kb = build_kb("medic", tmp_path / "medic.txt")
    assert not kb.dedup and kb.ids_for_name("tooth agenesis") == ("D1", "D2") and kb.names_of("D4") == ["rea"]
    assert dedup_losses(kb) == (0, 0)


def test_dedup_on_request_reports_what_it_took(tmp_path, caplog):
    (tmp_path / "medic.txt").write_text(MEDIC, encoding="utf8")
    with caplog.at_level(logging.WARNING, logger="spacy_genbioel.kb.build"):
        kb = build_kb("medic", tmp_path / "medic.txt", dedup=True)
    # "tooth agenesis" stays on D2 (fewer names), "rea" on D4: D1 and D3 lose one name each, none is left nameless
    assert kb.ids_for_name("tooth agenesis") == ("D2",) and dedup_losses(kb) == (2, 0)
    assert "took 2 name entries from their concepts and left 0 of 4 concepts without a name" in caplog.text
    nameless = KnowledgeBase([Concept("A", ["x", "y"]), Concept("B", ["x"]), Concept("C", ["y"])], dedup=True)
    assert dedup_losses(nameless) == (2, 1)


def test_cli_default_keeps_every_name_and_dedup_is_opt_in(tmp_path):
    (tmp_path / "medic.txt").write_text(MEDIC, encoding="utf8")
    kept = runner.invoke(
        app, ["build-kb", "-f", "medic", str(tmp_path / "medic.txt"), "--out", str(tmp_path / "kb.jsonl")]
    )
    assert kept.exit_code == 0, kept.output
    assert KnowledgeBase.load(tmp_path / "kb.jsonl").ids_for_name("tooth agenesis") == ("D1", "D2")
    deduped = runner.invoke(
        app, ["build-kb", "-f", "medic", str(tmp_path / "medic.txt"), "--out", str(tmp_path / "d.jsonl"), "--dedup"]
    )
    assert deduped.exit_code == 0, deduped.output
    assert KnowledgeBase.load(tmp_path / "d.jsonl").ids_for_name("tooth agenesis") == ("D2",)


def test_cli_umls_filters(tmp_path):
    out = tmp_path / "umls.jsonl"
    result = runner.invoke(
        app,
        [
            "build-kb",
            "-f",
            "umls",
            str(FIXTURES / "umls"),
            "--sab",
            "MSH",
            "--semantic-types",
            "Disease or Syndrome",
            "--out",
            str(out),
            "--no-progress",
        ],
    )
    assert result.exit_code == 0, result.output
    records = {r["id"]: r for r in _records(out)}
    assert list(records) == ["C0011849", "C0020538"]
    assert records["C0011849"]["names"] == ["Diabetes Mellitus", "Diabetes"] and records["C0011849"]["types"] == [
        "T047"
    ]
    assert records["C0020538"]["definition"].startswith("Persistently high")
    # files given one by one; every language; suppressed names too; TUIs comma-separated
    result = runner.invoke(
        app,
        [
            "build-kb",
            "-f",
            "umls",
            str(FIXTURES / "umls" / "MRCONSO.RRF"),
            "--mrsty",
            str(FIXTURES / "umls" / "MRSTY.RRF"),
            "--lang",
            "ALL",
            "--suppressed",
            "--semantic-types",
            "T109,T121",
            "--out",
            str(out),
            "--no-progress",
        ],
    )
    assert result.exit_code == 0, result.output
    (aspirin,) = _records(out)
    assert "acetylsalicylic acid" in aspirin["names"] and "definition" not in aspirin


def test_cli_rxnorm_and_obo_filters(tmp_path):
    out = tmp_path / "kb.jsonl"
    result = runner.invoke(
        app,
        [
            "build-kb",
            "-f",
            "rxnorm",
            str(FIXTURES / "rxnorm"),
            "--tty",
            "IN",
            "--tty",
            "BN",
            "--out",
            str(out),
            "--no-progress",
        ],
    )
    assert result.exit_code == 0, result.output
    assert [(r["id"], r["names"]) for r in _records(out)] == [("1191", ["aspirin"]), ("215568", ["Bayer Aspirin"])]
    result = runner.invoke(
        app,
        [
            "build-kb",
            "-f",
            "obo",
            str(FIXTURES / "hp.obo"),
            "--prefix",
            "HP,GO",
            "--obsolete",
            "--synonym-scopes",
            "EXACT",
            "--out",
            str(out),
            "--no-progress",
        ],
    )
    assert result.exit_code == 0, result.output
    records = {r["id"]: r for r in _records(out)}
    assert "HP:0000005" in records and "GO:0007610" in records and "UBERON:0000955" not in records
    assert records["HP:0001250"]["names"] == ["Seizure", "Seizures", "Fits"]


@pytest.mark.parametrize(
    "args, message",
    [
        (["-f", "obo", "hp.obo", "--sab", "MSH"], "--sab applies to -f umls or -f rxnorm, not -f obo"),
        (["-f", "rxnorm", "rxnorm", "--mrdef", "x"], "--mrdef applies to -f umls, not -f rxnorm"),
        (["-f", "medic", "hp.obo", "--prefix", "HP"], "--prefix applies to -f obo, not -f medic"),
        (["-f", "umls", "umls", "--semantic-types", "Nope"], "semantic type 'Nope' is neither"),
        (["-f", "umls", "rxnorm"], "no MRCONSO.RRF"),
    ],
)
def test_cli_option_errors_are_one_line(tmp_path, args, message):
    args = [str(FIXTURES / a) if i == 2 else a for i, a in enumerate(args)]
    result = runner.invoke(app, ["build-kb", *args, "--out", str(tmp_path / "kb.jsonl"), "--no-progress"])
    assert result.exit_code == 1, result.output
    assert message in " ".join(result.output.split()) and "Traceback" not in result.output


def test_mesh_xml_types_are_semantic_types():
    concepts = {c.id: c for c in read_mesh_xml(FIXTURES / "desc_sample.xml")}
    assert concepts["D003920"].types == ["T047"] and concepts["D001241"].types == ["T109", "T121"]
    assert concepts["D001241"].names == ["Aspirin", "Acetylsalicylic Acid"]
