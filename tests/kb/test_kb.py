import json
import logging
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from spacy_genbioel.kb.base import Concept, KBFormatError, KnowledgeBase
from spacy_genbioel.kb.normalizers import genbioel_normalize, get_normalizer


def test_genbioel_normalization():
    assert genbioel_normalize("Reiter's  Syndrome (ReA)") == "reiter s syndrome rea"
    assert genbioel_normalize("Tooth Agenesis, Selective, 6") == "tooth agenesis selective 6"
    assert genbioel_normalize('a-b_c*d/e?f!g`h"i=j%k>l<m;n{o}p[q]r+s') == "a b c d e f g h i j k l m n o p q r s"
    assert genbioel_normalize(" ,.; ") == ""


@given(st.text())
def test_normalization_is_idempotent(text):
    once = genbioel_normalize(text)
    assert genbioel_normalize(once) == once
    assert "  " not in once and once == once.strip()


def test_unknown_normalizer_is_named():
    with pytest.raises(ValueError, match="nope"):
        get_normalizer("nope")


def test_many_to_one_and_dedup_rule():
    concepts = [
        Concept("C1", ["Reiter Syndrome", "Reactive arthritis", "ReA"]),
        Concept("C2", ["ReA", "Retinal artery"]),
    ]
    kept = KnowledgeBase(concepts, dedup=False)
    assert kept.ids_for_name("REA") == ("C1", "C2")
    dedup = KnowledgeBase(concepts, dedup=True)
    # the shared name stays on the concept with fewer names
    assert dedup.ids_for_name("rea") == ("C2",)
    assert "rea" not in dedup.names_of("C1")
    assert dedup.names_of("C2") == ["rea", "retinal artery"]


def test_same_id_merges_and_empty_names_drop():
    kb = KnowledgeBase([Concept("C1", ["A b"], definition=None), Concept("C1", ["c", "()"], definition="def")])
    assert len(kb) == 1
    assert kb.names_of("C1") == ["a b", "c"]
    assert kb["C1"].definition == "def"


def test_jsonl_round_trip(tmp_path):
    kb = KnowledgeBase([Concept("C1", ["Alpha", "Beta"], "a definition", ["Disease"]), Concept("C2", ["Gamma"])])
    kb.to_jsonl(tmp_path / "kb.jsonl")
    again = KnowledgeBase.load(tmp_path / "kb.jsonl")
    assert again.names == kb.names
    assert again["C1"].definition == "a definition" and again["C1"].types == ["Disease"]
    assert again.checksum() == kb.checksum()


def test_target_kb_json_round_trip(tmp_path):
    kb = KnowledgeBase([Concept("C1", ["Alpha", "Beta"]), Concept("613097", ["Alpha"])])
    kb.to_target_kb_json(tmp_path / "target_kb.json")
    data = json.loads((tmp_path / "target_kb.json").read_text())
    assert data == {"C1": ["alpha", "beta"], "613097": ["alpha"]}
    again = KnowledgeBase.load(tmp_path / "target_kb.json")
    assert again.ids_for_name("alpha") == ("C1", "613097")


def test_malformed_jsonl_names_file_and_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"id": "C1", "names": ["a"]}\n{"id": "C2", "names": ["b"\n')
    with pytest.raises(KBFormatError, match=r"bad\.jsonl:2"):
        KnowledgeBase.load(path)
    path.write_text('{"id": "C1", "names": ["a"]}\n\n{"names": ["b"]}\n')
    with pytest.raises(KBFormatError, match=r"bad\.jsonl:3: record has no 'id'"):
        KnowledgeBase.load(path)


def test_missing_file():
    with pytest.raises(FileNotFoundError):
        KnowledgeBase.load("/nonexistent/kb.jsonl")


def test_extra_names_augmentation():
    kb = KnowledgeBase([Concept("C1", ["alpha"])])
    more = kb.with_extra_names([("C1", "Alfa"), ("C9", "ignored")])
    assert more.ids_for_name("alfa") == ("C1",)
    assert "ignored" not in more.names and kb.ids_for_name("alfa") == ()


def test_deduplicated_kb_reloads_as_the_same_index(tmp_path):
    concepts = [Concept("C1", ["A", "B", "Shared"]), Concept("C2", ["Shared"]), Concept("C3", ["B"])]
    kb = KnowledgeBase(concepts, dedup=True)
    kb.to_jsonl(tmp_path / "kb.jsonl")
    again = KnowledgeBase.load(tmp_path / "kb.jsonl", dedup=False)
    assert [(n, again.ids_for_name(n)) for n in again.names] == [(n, kb.ids_for_name(n)) for n in kb.names]
    assert len(again) == 3


def test_priors_order_the_concepts_of_a_shared_name(tmp_path):
    concepts = [
        Concept("OMIM:1", ["Breast cancer", "BRCA1 cancer"]),
        Concept("D001943", ["Breast Neoplasms", "breast cancer"]),
    ]
    kb = KnowledgeBase(concepts)
    assert kb.ids_for_name("breast cancer") == ("OMIM:1", "D001943")  # KB order without priors
    ranked = kb.with_priors({"D001943": 12, "unknown": 3})
    assert ranked.ids_for_name("breast cancer") == ("D001943", "OMIM:1")
    assert ranked.names == kb.names  # name indices (and so a trie) unchanged
    assert ranked["D001943"].prior == 12.0 and ranked["OMIM:1"].prior == 0.0
    path = tmp_path / "kb.jsonl"
    ranked.to_jsonl(path)
    reloaded = KnowledgeBase.load(path)
    assert reloaded.ids_for_name("breast cancer") == ("D001943", "OMIM:1")
    assert reloaded.checksum() == ranked.checksum() != kb.checksum()


def test_prior_must_be_a_number(tmp_path):
    path = tmp_path / "kb.jsonl"
    path.write_text('{"id": "D1", "names": ["a"]}\n{"id": "D2", "names": ["b"], "prior": "often"}\n', encoding="utf8")
    with pytest.raises(KBFormatError, match=r"kb.jsonl:2: 'prior'"):
        KnowledgeBase.load(path)


# -- normalizers in spaCy's registry ------------------------------------------------------
VERSIONED_NORMALIZERS = {
    "genbioel": "genbioel.normalizer.v1",
    "lower": "genbioel.lower_normalizer.v1",
    "none": "genbioel.whitespace_normalizer.v1",
}


@pytest.mark.parametrize("old, versioned", sorted(VERSIONED_NORMALIZERS.items()))
def test_versioned_normalizers_are_in_spacys_registry(old, versioned):
    from spacy.util import registry

    assert registry.misc.get(versioned)() is get_normalizer(versioned) is get_normalizer(old)


@given(st.text(), st.sampled_from(sorted(VERSIONED_NORMALIZERS.items())))
def test_old_and_versioned_names_normalize_identically(text, names):
    old, versioned = names
    assert get_normalizer(old)(text) == get_normalizer(versioned)(text)


def test_normalizer_from_a_config_block():
    from spacy.util import registry
    from thinc.api import Config

    config = Config().from_str('[x]\n\n[x.normalizer]\n@misc = "genbioel.normalizer.v1"\n')
    assert registry.resolve(config)["x"]["normalizer"]("Reiter's  (ReA)") == "reiter s rea"


def test_normalizer_names_keep_the_index_and_checksum(tmp_path):
    concepts = [Concept("C1", ["Reiter's Syndrome", "ReA"]), Concept("C2", ["Re-A", "Retinal  Artery"])]
    for old, versioned in VERSIONED_NORMALIZERS.items():
        by_old = KnowledgeBase(concepts, normalizer=old)
        by_versioned = KnowledgeBase(concepts, normalizer=versioned)
        assert by_old.normalizer_name == old and by_versioned.normalizer_name == versioned
        assert by_old.names == by_versioned.names and by_old.checksum() == by_versioned.checksum()
        by_old.to_jsonl(tmp_path / "kb.jsonl")
        assert KnowledgeBase.load(tmp_path / "kb.jsonl", normalizer=old).checksum() == by_old.checksum()


def test_checksums_of_the_old_normalizer_names_are_unchanged():
    # recorded with the 0.1 code (the catalogue registry); a saved pipeline's cfg.json keeps "kb_normalizer"
    concepts = [Concept("C1", ["Reiter's Syndrome", "ReA"]), Concept("C2", ["Re-A", "Retinal  Artery"])]
    expected = {
        "genbioel": "f2ea1b65484d755b07a595f727ab0557d723612e155f8be8702d7274f89d4f0f",
        "lower": "649eb10f5dd2dacaaff8dc7dd0df89b96fcded48e651217a3767a1a04e478997",
        "none": "80dc01dbebd8407a6f3baec411d8533206d54bf068774ee975b9ed76849ded09",
    }
    assert {name: KnowledgeBase(concepts, normalizer=name).checksum() for name in expected} == expected


def test_legacy_pipeline_kb_checksum_still_matches():
    from pathlib import Path

    from conftest import random_kb

    cfg_path = Path(__file__).resolve().parents[1] / "fixtures" / "legacy_v0_1" / "genbioel_cfg.json"
    cfg = json.loads(cfg_path.read_text(encoding="utf8"))
    kb = random_kb(3, n_concepts=40)  # the KB the 0.1 pipeline was saved with (make_fixture.py)
    reloaded = KnowledgeBase(list(kb), normalizer=cfg["kb_normalizer"], dedup=cfg["kb_dedup"])
    assert reloaded.normalizer_name == "genbioel"
    assert reloaded.checksum() == cfg["kb_checksum"]


# -- issue 16: one reading path, unusable and empty KBs ------------------------------------------------------------
def _records(*records) -> str:
    return "".join(json.dumps(r) + "\n" for r in records)


GOOD = _records({"id": "D1", "names": ["Alpha", "Beta"], "definition": "d"}, {"id": "D2", "names": ["Gamma"]})


def test_load_reads_bom_gzip_and_cr_only_as_build_kb_does(tmp_path):
    import gzip

    from spacy_genbioel.kb.build import build_kb

    reference = KnowledgeBase.load(_write(tmp_path / "kb.jsonl", GOOD.encode()))
    variants = {
        "bom.jsonl": b"\xef\xbb\xbf" + GOOD.encode(),
        "kb.jsonl.gz": gzip.compress(GOOD.encode()),
        "cr.jsonl": GOOD.replace("\n", "\r").encode(),
        "crlf.jsonl": GOOD.replace("\n", "\r\n").encode(),
    }
    for name, data in variants.items():
        path = _write(tmp_path / name, data)
        kb = KnowledgeBase.load(path)
        assert (kb.concept_ids, kb.names, kb.checksum()) == (
            reference.concept_ids,
            reference.names,
            reference.checksum(),
        ), name
        built = build_kb("jsonl", path, dedup=False)
        assert built.checksum() == kb.checksum(), name
    target = {"D1": ["alpha", "beta"], "D2": ["gamma"]}
    for name, data in {
        "target_kb.json": json.dumps(target).encode(),
        "bom.json": b"\xef\xbb\xbf" + json.dumps(target).encode(),
        "target_kb.json.gz": gzip.compress(json.dumps(target).encode()),
    }.items():
        path = _write(tmp_path / name, data)
        assert (
            KnowledgeBase.load(path).checksum()
            == reference.checksum()
            == build_kb("genbioel", path, dedup=False).checksum()
        ), name


def _write(path, data: bytes):
    path.write_bytes(data)
    return path


@pytest.mark.parametrize(
    "name, data, message",
    [
        (
            "latin.jsonl",
            b'{"id": "D1", "names": ["a"]}\n{"id": "D2", "names": ["Sj\xf6gren"]}\n',
            r"latin\.jsonl:2: not UTF-8",
        ),
        ("latin.json", b'{"D1": ["a"],\n "D2": ["Sj\xf6gren"]}', r"latin\.json:2: not UTF-8"),
        ("empty_id.json", b'{"D1": ["a"],\n "": ["b"]}', r"empty_id\.json:2: empty concept ID"),
        ("blank_id.json", b'{"D1": ["a"],\n " ": ["b"]}', r"blank_id\.json:2: empty concept ID"),
        ("deep.json", b"[" * 100000 + b"]" * 100000, r"deep\.json:1: JSON nested too deeply"),
        ("deep.jsonl", GOOD.encode() + b"[" * 100000 + b"]" * 100000, r"deep\.jsonl:3: JSON nested too deeply"),
    ],
)
def test_load_errors_name_file_and_line(tmp_path, name, data, message):
    path = _write(tmp_path / name, data)
    with pytest.raises(KBFormatError, match=message):
        KnowledgeBase.load(path)


def test_load_of_a_truncated_gzip_names_file_and_line(tmp_path):
    import gzip

    data = gzip.compress((GOOD * 200).encode())
    path = _write(tmp_path / "kb.jsonl.gz", data[: len(data) // 2])
    with pytest.raises(KBFormatError, match=r"kb\.jsonl\.gz:\d+: truncated or corrupt gzip"):
        KnowledgeBase.load(path)


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("types", 5, "'types' must be a list of strings"),
        ("types", [1], "'types' must be a list of strings"),
        ("names", [1], "'names' must be a list of strings"),
        ("names", {"a": 1}, "'names' must be a list of strings"),
        ("definition", 5, "'definition' must be a string"),
        ("definition", ["x"], "'definition' must be a string"),
        ("prior", float("nan"), "'prior' must be a number"),
        ("prior", True, "'prior' must be a number"),
        ("id", ["D3"], "'id' must be a string"),
        ("id", 1.5, "'id' must be a string"),
        ("id", True, "'id' must be a string"),
    ],
)
def test_kb_record_fields_of_the_wrong_type_are_errors(tmp_path, field, value, message):
    path = tmp_path / "kb.jsonl"
    path.write_text(GOOD + json.dumps({"id": "D3", "names": ["c"], field: value}) + "\n", encoding="utf8")
    with pytest.raises(KBFormatError, match=rf"kb\.jsonl:3: {re.escape(message)}"):
        KnowledgeBase.load(path)


def test_unusable_names_are_dropped_and_counted(caplog):
    with caplog.at_level(logging.WARNING, logger="spacy_genbioel"):
        kb = KnowledgeBase([Concept("D1", ["Alpha", "()"]), Concept("D2", ["[...]", " "]), Concept("D3", [])], name="k")
    assert kb.concept_ids == ["D1", "D3"] and kb.names == ["alpha"]
    assert kb["D1"].names == ["Alpha"] and kb.preferred_name("D1") == "Alpha"
    assert (kb.drops.names, kb.drops.concepts, kb.drops.nameless) == (3, 1, 1)
    assert "dropped 3 name(s) that normalize to nothing; dropped 1 concept(s)" in caplog.text and "D2" in caplog.text


def test_a_kb_without_a_usable_name_is_refused(tmp_path):
    from spacy_genbioel.kb import EmptyKBError

    with pytest.raises(EmptyKBError, match="has no usable name"):
        KnowledgeBase([])
    with pytest.raises(EmptyKBError, match=r"2 concept\(s\) read; dropped 2 name\(s\)"):
        KnowledgeBase([Concept("D1", ["()"]), Concept("D2", ["..."])])
    for name, text in (
        ("empty.jsonl", ""),
        ("blank.jsonl", "\n\n"),
        ("unusable.jsonl", _records({"id": "D1", "names": ["()"]})),
        ("nameless.jsonl", _records({"id": "D1"})),
        ("empty.json", "{}"),
        ("unusable.json", '{"D1": ["-"]}'),
    ):
        path = tmp_path / name
        path.write_text(text, encoding="utf8")
        with pytest.raises(EmptyKBError, match=rf"{re.escape(name)}: KB .* has no usable name"):
            KnowledgeBase.load(path)


def test_a_deduplicated_kb_keeps_concepts_whose_names_went_elsewhere(tmp_path):
    kb = KnowledgeBase([Concept("C567755", ["Tooth agenesis"]), Concept("613097", ["Tooth agenesis"])], dedup=True)
    assert kb.names_of("613097") == [] and "613097" in kb
    kb.to_jsonl(tmp_path / "kb.jsonl")
    again = KnowledgeBase.load(tmp_path / "kb.jsonl", dedup=True)
    assert "613097" in again and again.drops.nameless == 1 and again.checksum() == kb.checksum()


# -- the commands -----------------------------------------------------------------------------------------------
def _invoke(*args):
    from typer.testing import CliRunner

    from spacy_genbioel.cli import app

    return CliRunner().invoke(app, [str(a) for a in args])


@pytest.mark.parametrize(
    "fmt, name, text",
    [
        ("ctd", "CTD_diseases.tsv", ""),
        ("medic", "medic.txt", "\n\n"),
        ("medic", "medic.txt", "D1||()\nD2||[...]\n"),
        ("jsonl", "kb.jsonl", _records({"id": "D1"}, {"id": "D2", "names": []})),
        ("genbioel", "target_kb.json", "{}"),
    ],
)
def test_build_kb_refuses_sources_without_a_usable_name(tmp_path, fmt, name, text):
    path = tmp_path / name
    path.write_text(text, encoding="utf8")
    result = _invoke("build-kb", "-f", fmt, path, "--out", tmp_path / "out.jsonl")
    assert result.exit_code != 0
    assert name in result.output and "no usable name" in result.output
    assert not (tmp_path / "out.jsonl").exists()


def test_build_kb_counts_what_it_dropped(tmp_path):
    path = tmp_path / "medic.txt"
    path.write_text("D1||Alpha|()\nD2||[...]\nD3||Gamma\n", encoding="utf8")
    result = _invoke("build-kb", "-f", "medic", path, "--out", tmp_path / "out.jsonl")
    assert result.exit_code == 0, result.output
    assert "dropped 2 name(s) that normalize to nothing; dropped 1 concept(s) with no other name" in " ".join(
        result.output.split()
    )
    assert KnowledgeBase.load(tmp_path / "out.jsonl").concept_ids == ["D1", "D3"]


@pytest.mark.parametrize(
    "text, message", [("", "no usable name"), ('{"id": "D1", "names": ["a"], "types": 5}\n', "'types'")]
)
def test_build_kb_and_init_model_refuse_bad_kbs_with_a_message(tmp_path, text, message):
    path = tmp_path / "kb.jsonl"
    path.write_text(text, encoding="utf8")
    for args in (
        ("build-kb", "-f", "jsonl", path, "--out", tmp_path / "out.jsonl"),
        ("init-model", "--kb", path, "--out", tmp_path / "model"),
    ):
        result = _invoke(*args)
        assert result.exit_code != 0 and isinstance(result.exception, SystemExit), result.output
        assert "kb.jsonl" in result.output and message in result.output
    assert not (tmp_path / "model").exists()
