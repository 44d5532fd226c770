"""The caps on one input record (:class:`ReadLimits`): a line, an XML record or a whole BioC JSON
collection over its cap is one error entry naming the cap, the file goes on, and no more than the cap
of the record is ever held in memory. Low caps (1 KB) stand in for the real ones."""

from __future__ import annotations

import gzip
import json
import tracemalloc
from pathlib import Path

import pytest

from spacy_genbioel.annotate import InputRecord, RecordError, read_records
from spacy_genbioel.annotate.lines import ReadLimits, decoded_lines
from spacy_genbioel.annotate.xml_readers import xml_records

SMALL = ReadLimits(max_line_bytes=1024, max_record_bytes=1024, max_json_bytes=1024)


def split(items):
    items = list(items)
    return [i for i in items if isinstance(i, InputRecord)], [i for i in items if isinstance(i, RecordError)]


def article(pmid: int, title: str) -> str:
    return (
        f"<PubmedArticle><MedlineCitation><PMID>{pmid}</PMID><Article><ArticleTitle>{title}</ArticleTitle>"
        f"</Article></MedlineCitation></PubmedArticle>\n"
    )


@pytest.mark.parametrize(
    "fmt, make",
    [
        ("text", lambda text, i: text),
        ("jsonl", lambda text, i: json.dumps({"id": f"d{i}", "text": text})),
        ("bioc", lambda text, i: json.dumps({"id": f"d{i}", "passages": [{"offset": 0, "text": text}]})),
    ],
)
def test_a_line_over_the_cap_is_an_error_naming_the_cap(tmp_path: Path, fmt, make) -> None:
    path = tmp_path / "in.txt"
    lines = [make("renal failure", 1), make("x" * 2000, 2), make("the liver", 3)]
    path.write_text("\n".join(lines) + "\n", encoding="utf8")
    records, errors = split(read_records(path, fmt, SMALL))
    assert len(records) == 2 and [e.line for e in errors] == [2]
    assert "max_line_bytes" in errors[0].reason and "1,024 bytes" in errors[0].reason
    records, errors = split(read_records(path, fmt))  # the default cap takes the line
    assert len(records) == 3 and not errors


def test_a_pubtator_document_with_a_line_over_the_cap_is_one_error(tmp_path: Path) -> None:
    path = tmp_path / "in.pubtator"
    path.write_text(f"1|t|renal failure\n1|a|{'y' * 3000}\n\n2|t|the liver\n2|a|abstract\n\n", encoding="utf8")
    records, errors = split(read_records(path, "pubtator", SMALL))
    assert [r.doc_id for r in records] == ["2"]
    assert [(e.line, e.doc_id) for e in errors] == [(1, "1")] and "max_line_bytes" in errors[0].reason


def test_a_line_exactly_at_the_cap_is_read_and_crlf_does_not_count(tmp_path: Path) -> None:
    path = tmp_path / "in.txt"
    path.write_bytes(b"a" * 1024 + b"\r\n" + b"b" * 1025 + b"\r\n" + b"c\r\n")
    found = [(n, len(line) if line else None, problem) for n, line, problem in decoded_lines(path, SMALL)]
    assert [f[:2] for f in found] == [(1, 1024), (2, None), (3, 1)]
    assert "max_line_bytes" in found[1][2]


def test_one_huge_gz_line_holds_no_more_than_the_cap(tmp_path: Path) -> None:
    path = tmp_path / "huge.txt.gz"
    path.write_bytes(gzip.compress(b"renal failure\n" + b"x" * 8_000_000 + b"\nthe liver\n", mtime=0))
    tracemalloc.start()
    try:
        records, errors = split(read_records(path, "text", SMALL))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(records) == 2 and [e.line for e in errors] == [2] and "max_line_bytes" in errors[0].reason
    assert peak < 1_000_000, peak  # blocks of 64 KB and the cap, not the 8 MB line


def test_an_xml_record_over_the_cap_is_an_error_and_the_next_is_read(tmp_path: Path) -> None:
    path = tmp_path / "pubmed.xml"
    path.write_text(
        "<PubmedArticleSet>\n"
        + article(1, "renal failure")
        + article(2, "x" * 3000)
        + article(3, "the liver")
        + "</PubmedArticleSet>\n",
        encoding="utf8",
    )
    records, errors = split(read_records(path, "pubmed", SMALL))
    assert [r.doc_id for r in records] == ["1", "3"]
    assert [e.line for e in errors] == [3] and "max_record_bytes" in errors[0].reason
    assert [r.line for r in records] == [2, 4]


@pytest.mark.parametrize("block", [16, 100, 4096])
def test_an_unterminated_xml_record_is_skipped_holding_no_more_than_the_cap(tmp_path: Path, block: int) -> None:
    path = tmp_path / "pubmed.xml"
    body = "<PubmedArticleSet>\n" + article(1, "renal failure") + "<PubmedArticle><x>" + "renal\n" * 400_000
    path.write_text(body + article(3, "the liver") + "</PubmedArticleSet>\n", encoding="utf8")
    tracemalloc.start()
    try:
        found = list(xml_records(path, ("PubmedArticle",), SMALL, block_chars=max(block, 4096)))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert [(line, record is not None) for line, record, _ in found] == [(2, True), (3, False), (400_003, True)]
    assert "max_record_bytes" in found[1][2]
    assert peak < 200_000, peak  # not the 2.4 MB record


def test_an_unterminated_record_at_the_end_of_the_file(tmp_path: Path) -> None:
    path = tmp_path / "pubmed.xml"
    path.write_text("<PubmedArticleSet>\n" + article(1, "a") + "<PubmedArticle>\n" + "x" * 50, encoding="utf8")
    found = list(xml_records(path, ("PubmedArticle",), block_chars=16))
    assert [(line, problem) for line, _, problem in found][1] == (
        3,
        "<PubmedArticle> record without its end tag at the end of the file",
    )


def test_records_cut_by_small_blocks_are_found_with_their_lines(tmp_path: Path) -> None:
    path = tmp_path / "pubmed.xml"
    path.write_bytes(
        b"\xef\xbb\xbf<PubmedArticleSet>\n"
        + "".join(article(i, f"t{i}") for i in range(50)).encode()
        + b"</PubmedArticleSet>\n"
    )
    for block in (7, 64, 4096):
        found = list(xml_records(path, ("PubmedArticle", "PubmedBookArticle"), block_chars=block))
        assert [line for line, _, _ in found] == list(range(2, 52)) and all(r is not None for _, r, _ in found)


def test_a_bioc_json_collection_over_the_cap_is_refused_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    docs = [{"id": f"d{i}", "passages": [{"offset": 0, "text": "renal failure " * 20}]} for i in range(10)]
    path.write_text(json.dumps({"documents": docs}, indent=1), encoding="utf8")
    records, errors = split(read_records(path, "bioc", SMALL))
    assert (
        not records and len(errors) == 1 and "max_json_bytes" in errors[0].reason and "JSON lines" in errors[0].reason
    )
    assert len(split(read_records(path, "bioc"))[0]) == 10


def test_a_string_passage_offset_in_bioc_json_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "c.bioc.jsonl"
    good = {"id": "a", "passages": [{"offset": 0, "text": "renal failure"}]}
    path.write_text(
        "\n".join(
            json.dumps(d)
            for d in (
                good,
                {"id": "b", "passages": [{"offset": 0, "text": "x"}, {"offset": "15", "text": "y"}]},
                {"id": "c", "passages": [{"offset": True, "text": "x"}]},
                {"id": "d", "passages": [{"offset": 0, "text": 5}]},
            )
        )
        + "\n"
    )
    records, errors = split(read_records(path, "bioc"))
    assert [r.doc_id for r in records] == ["a"] and [e.line for e in errors] == [2, 3, 4]
    assert "not a JSON integer" in errors[0].reason and "not a string" in errors[2].reason


def test_an_entity_in_an_xml_record_is_an_error_not_text(tmp_path: Path) -> None:
    path = tmp_path / "pubmed.xml"
    path.write_text(
        '<?xml version="1.0"?>\n<!DOCTYPE PubmedArticleSet [<!ENTITY x SYSTEM "file:///etc/hostname">]>\n'
        "<PubmedArticleSet>\n" + article(1, "renal &x; failure") + article(2, "the liver") + "</PubmedArticleSet>\n"
    )
    records, errors = split(read_records(path, "pubmed"))
    assert [r.doc_id for r in records] == ["2"] and [e.line for e in errors] == [4]


@pytest.mark.parametrize(
    "field, value", [("max_line_bytes", 0), ("max_record_bytes", -1), ("max_json_bytes", 1.5), ("max_line_bytes", True)]
)
def test_limits_are_checked(field: str, value) -> None:
    with pytest.raises(ValueError, match=field):
        ReadLimits(**{field: value})
