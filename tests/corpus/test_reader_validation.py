"""What the gold-corpus readers refuse or report rather than accept silently: a second abstract line,
an empty corpus, BioC documents without an ID or with an ID seen before, string passage offsets in
BioC JSON, entities in BioC XML."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from spacy_genbioel.corpus import CorpusFormatError, load_corpus, read_bioc, read_documents, read_pubtator

BIOC = (
    '<?xml version="1.0" encoding="UTF-8"?>\n{doctype}<collection><source>t</source><date/><key/>\n'
    "{docs}</collection>\n"
)


def bioc_doc(doc_id: str, text: str = "Renal failure.") -> str:
    return f"<document><id>{doc_id}</id><passage><offset>0</offset><text>{text}</text></passage></document>\n"


def test_a_second_abstract_line_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "c.txt"
    path.write_text("1|t|Title.\n1|a|First abstract.\n1|a|Second abstract.\n\n", encoding="utf8")
    with pytest.raises(CorpusFormatError, match=r"c.txt:3: PMID 1: a second abstract line \(the first is line 2\)"):
        list(read_pubtator(path))
    path.write_text("1|t|Title.\n1|a|\n\n2|t|Other.\n2|a|x\n\n", encoding="utf8")  # an empty abstract is still one
    assert [d.abstract for d in read_pubtator(path)] == ["", "x"]


@pytest.mark.parametrize("fmt", ["pubtator", "bioc", "jsonl", "askapatient"])
def test_an_empty_corpus_is_refused_naming_the_file(tmp_path: Path, fmt: str) -> None:
    path = tmp_path / "empty.txt"
    path.write_text("\n\n" if fmt != "bioc" else BIOC.format(doctype="", docs=""), encoding="utf8")
    with pytest.raises(CorpusFormatError, match="empty.txt: no (documents|mentions)"):
        load_corpus(path, fmt)
    if fmt != "askapatient":
        with pytest.raises(CorpusFormatError, match="empty.txt"):
            read_documents(path, fmt)


def test_a_bioc_document_without_an_id_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "c.xml"
    for empty in ("", "  "):
        path.write_text(BIOC.format(doctype="", docs=bioc_doc("a") + bioc_doc(empty)), encoding="utf8")
        with pytest.raises(CorpusFormatError, match="c.xml: document #2 has no ID"):
            list(read_bioc(path))
    path.write_text(json.dumps({"passages": [{"offset": 0, "text": "x"}]}) + "\n", encoding="utf8")
    with pytest.raises(CorpusFormatError, match="document #1 has no ID"):
        list(read_bioc(path))


def test_a_bioc_document_id_seen_twice_is_reported(tmp_path: Path, caplog) -> None:
    path = tmp_path / "c.xml"
    path.write_text(
        BIOC.format(doctype="", docs=bioc_doc("a") + bioc_doc("b") + bioc_doc("a", "Cystic fibrosis.")), encoding="utf8"
    )
    with caplog.at_level(logging.WARNING, logger="spacy_genbioel"):
        docs = list(read_bioc(path))
    assert [d.pmid for d in docs] == ["a", "b", "a"]
    assert any("document #3: ID a seen before (document #1)" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("offset", ['"15"', "15.0", "true", "null"])
def test_a_bioc_json_passage_offset_must_be_an_integer(tmp_path: Path, offset: str) -> None:
    path = tmp_path / "c.json"
    line = (
        '{"id": "a", "passages": [{"offset": 0, "text": "Renal failure."}, {"offset": %s, "text": "More."}]}' % offset
    )
    path.write_text(line + "\n" + line.replace('"a"', '"b"') + "\n", encoding="utf8")
    with pytest.raises(CorpusFormatError, match="c.json:1: .*not a JSON integer"):
        list(read_bioc(path))
    path.write_text(json.dumps({"documents": [json.loads(line)]}), encoding="utf8")
    with pytest.raises(CorpusFormatError, match="not a JSON integer"):
        list(read_bioc(path))


def test_entities_in_bioc_xml_are_refused(tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("SECRET-CONTENT")
    path = tmp_path / "c.xml"
    for decl in (f'<!ENTITY x SYSTEM "{secret.as_uri()}">', '<!ENTITY x "Renal">'):
        path.write_text(
            BIOC.format(doctype=f"<!DOCTYPE collection [{decl}]>\n", docs=bioc_doc("a", "&x; failure.")),
            encoding="utf8",
        )
        with pytest.raises(CorpusFormatError, match="c.xml.*entity") as caught:
            list(read_bioc(path))
        assert "SECRET" not in str(caught.value)


def test_a_bioc_dtd_reference_is_still_read(tmp_path: Path) -> None:
    path = tmp_path / "c.xml"
    path.write_text(
        BIOC.format(doctype='<!DOCTYPE collection SYSTEM "BioC.dtd">\n', docs=bioc_doc("a")), encoding="utf8"
    )
    assert [d.text for d in read_bioc(path)] == ["Renal failure."]
