"""Tests for the corpus readers and writers, on small files written here."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import spacy

from spacy_genbioel.corpus import (
    CorpusFormatError,
    PubTatorAnnotation,
    PubTatorDocument,
    UnknownFormatError,
    bioc_document,
    document_mentions,
    load_corpus,
    mentions_from_pubtator,
    read_askapatient,
    read_bioc,
    read_jsonl_corpus,
    read_pubtator,
    to_spacy_docs,
    write_pubtator,
)

TITLE = "Naloxone reverses the antihypertensive effect of clonidine."
ABSTRACT = "In rats breast and ovarian cancers and X-linked immunodeficiency disease were seen with nalozone."
TEXT = f"{TITLE} {ABSTRACT}"


def span(text: str, needle: str) -> str:
    start = TEXT.index(needle)
    return f"{start}\t{start + len(needle)}\t{text}"


PUBTATOR = "\n".join(
    [
        f"227508|t|{TITLE}",
        f"227508|a|{ABSTRACT}",
        f"227508\t{span('Naloxone', 'Naloxone')}\tChemical\tMESH:D009270",
        f"227508\t{span('antihypertensive', 'antihypertensive')}\tDisease\t D006973",
        f"227508\t{span('breast and ovarian cancers', 'breast and ovarian cancers')}\tDisease\tD001943|D010051"
        "\tbreast cancers|ovarian cancers",
        f"227508\t{span('ovarian cancers', 'ovarian cancers')}\tDisease\tD010051",
        f"227508\t{span('X-linked immunodeficiency disease  ', 'X-linked immunodeficiency disease')}"
        "\tDisease\tD007153+D040181",
        f"227508\t{span('nalozone', 'nalozone')}\tChemical\t-1",
        "227508\tCID\tD008750\tD007022",
        "",
        "1|t|Second doc about OMIM disease.",
        "1|a|",
        "1\t17\t21\tOMIM\tDisease\tOMIM:123456",
        "",
    ]
)


@pytest.fixture
def pubtator(tmp_path: Path) -> Path:
    path = tmp_path / "corpus.txt"
    path.write_text(PUBTATOR, encoding="utf8")
    return path


def test_read_pubtator(pubtator: Path) -> None:
    docs = list(read_pubtator(pubtator))
    assert [d.pmid for d in docs] == ["227508", "1"]
    doc = docs[0]
    assert doc.text == TEXT
    anns = doc.annotations
    assert [a.ids for a in anns] == [
        ("D009270",),
        ("D006973",),
        ("D001943", "D010051"),
        ("D010051",),
        ("D007153", "D040181"),
        (),
    ]
    assert [a.composite for a in anns] == [False, False, True, False, True, False]
    assert [a.nil for a in anns] == [False] * 5 + [True]
    assert anns[2].parts == ("breast cancers", "ovarian cancers")
    assert doc.relations == [("CID", "D008750", "D007022")]
    assert docs[1].annotations[0].ids == ("123456",)
    assert docs[1].text == "Second doc about OMIM disease."


def test_read_pubtator_crosswalk(pubtator: Path) -> None:
    doc = next(read_pubtator(pubtator, crosswalk={"D009270": "D999"}))
    assert doc.annotations[0].ids == ("D999",)


def test_pubtator_round_trip(pubtator: Path, tmp_path: Path) -> None:
    docs = list(read_pubtator(pubtator))
    out = tmp_path / "out.txt"
    assert write_pubtator(docs, out) == 2
    assert list(read_pubtator(out)) == docs
    assert out.read_text(encoding="utf8") == PUBTATOR + "\n"


def test_write_pubtator_from_built_documents(tmp_path: Path) -> None:
    doc = PubTatorDocument(
        "9", "Title with\nnewline", "abc", [PubTatorAnnotation(0, 5, "Title", "X", ("D1", "D2"), True)]
    )
    doc.annotations.append(PubTatorAnnotation(19, 22, "abc", "X", (), nil=True))
    out = tmp_path / "built.txt"
    write_pubtator([doc], out)
    back = next(read_pubtator(out))
    assert back.title == "Title with newline"
    assert [(a.ids, a.nil) for a in back.annotations] == [(("D1", "D2"), False), ((), True)]


def test_duplicate_pmids_are_kept(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    block = "5|t|Same title.\n5|a|Same abstract.\n5\t0\t4\tSame\tDisease\tD1\n\n"
    path = tmp_path / "dup.txt"
    path.write_text(block + block, encoding="utf8")
    with caplog.at_level(logging.WARNING, logger="spacy_genbioel.corpus.pubtator"):
        docs = list(read_pubtator(path))
    assert len(docs) == 2 and docs[0] == docs[1]
    assert "PMID 5 seen before (line 1)" in caplog.text


@pytest.mark.parametrize(
    "line, message",
    [
        ("227508\t0\t8\tNalaxone\tChemical\tD1", r"corpus\.txt:3: PMID 227508: mention 'Nalaxone' does not match"),
        ("227508\t0\t999\tNaloxone\tChemical\tD1", r"corpus\.txt:3: PMID 227508: offsets 0-999 outside"),
        ("227508\tzero\t8\tNaloxone\tChemical\tD1", r"corpus\.txt:3: PMID 227508: offsets 'zero'-'8' are not integers"),
        ("227509\t0\t8\tNaloxone\tChemical\tD1", r"corpus\.txt:3: PMID 227509: line inside document 227508"),
        ("227508\t0\t8", r"corpus\.txt:3: PMID 227508: expected"),
    ],
)
def test_read_pubtator_errors(tmp_path: Path, line: str, message: str) -> None:
    path = tmp_path / "corpus.txt"
    path.write_text(f"227508|t|{TITLE}\n227508|a|{ABSTRACT}\n{line}\n", encoding="utf8")
    with pytest.raises(CorpusFormatError, match=message):
        list(read_pubtator(path))


def test_read_pubtator_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "latin.txt"
    path.write_bytes(b"1|t|ok\n1|a|Sj\xf6gren\n")
    with pytest.raises(CorpusFormatError, match=r"latin\.txt:2: not UTF-8"):
        list(read_pubtator(path))


def test_read_pubtator_structure_errors(tmp_path: Path) -> None:
    path = tmp_path / "c.txt"
    path.write_text("1\t0\t1\tx\tD\tD1\n", encoding="utf8")
    with pytest.raises(CorpusFormatError, match=r"c\.txt:1: PMID 1: mention line before any title"):
        list(read_pubtator(path))
    path.write_text("1|a|abstract first\n", encoding="utf8")
    with pytest.raises(CorpusFormatError, match=r"c\.txt:1: PMID 1: abstract line without its title"):
        list(read_pubtator(path))


def test_mentions_from_pubtator(pubtator: Path) -> None:
    mentions = list(mentions_from_pubtator(pubtator))
    assert len(mentions) == 7
    first = mentions[0]
    assert first.text == "Naloxone" and first.left == "" and first.right == TEXT[8:]
    assert first.doc_id == "227508" and first.label == "Chemical" and (first.start, first.end) == (0, 8)
    # the text with trailing spaces in the file becomes the document slice
    assert mentions[4].text == "X-linked immunodeficiency disease" and mentions[4].is_composite
    short = list(mentions_from_pubtator(pubtator, context_chars=5))
    assert short[1].left == TEXT[short[1].start - 5 : short[1].start] and len(short[1].right) == 5
    assert list(mentions_from_pubtator(pubtator, context_chars=0))[1].left == ""
    assert len(list(mentions_from_pubtator(pubtator, skip_nil=True))) == 6


BIOC_XML = """<?xml version='1.0' encoding='utf-8' standalone='yes'?>
<collection><source>test</source><date>2024</date><key>test.key</key>
<document><id>42</id>
<passage><infon key="type">title</infon><offset>0</offset><text>Aspirin causes ulcers.</text>
<annotation id="1"><infon key="type">Chemical</infon><infon key="MESH">MESH:D001241</infon>\
<location offset="0" length="7"/><text>Aspirin</text></annotation>
</passage>
<passage><infon key="type">abstract</infon><offset>23</offset><text>Gastric ulcers and bleeding were seen.</text>
<annotation id="2"><infon key="type">Disease</infon><infon key="MESH">D013276|D006470</infon>\
<location offset="23" length="14"/><text>Gastric ulcers</text></annotation>
<annotation id="3"><infon key="type">Disease</infon><infon key="MESH">-1</infon>\
<location offset="42" length="8"/><text>bleeding</text></annotation>
</passage>
<passage><infon key="type">abstract</infon><offset>61</offset><text>More text.</text>
<annotation id="4"><infon key="type">Disease</infon><location offset="66" length="4"/><text>text</text></annotation>
</passage>
</document>
</collection>
"""


def test_read_bioc_xml(tmp_path: Path) -> None:
    path = tmp_path / "corpus.xml"
    path.write_text(BIOC_XML, encoding="utf8")
    (doc,) = list(read_bioc(path))
    assert doc.pmid == "42"
    assert doc.title == "Aspirin causes ulcers."
    # the third passage abuts the second (61 = 23 + 38): it moves one space right
    assert doc.text == "Aspirin causes ulcers. Gastric ulcers and bleeding were seen. More text."
    assert [(doc.text[a.start : a.end], a.type, a.ids, a.nil) for a in doc.annotations] == [
        ("Aspirin", "Chemical", ("D001241",), False),
        ("Gastric ulcers", "Disease", ("D013276", "D006470"), False),
        ("bleeding", "Disease", (), True),
        ("text", "Disease", (), True),
    ]


def test_read_bioc_json_and_offset_error(tmp_path: Path) -> None:
    collection = {
        "source": "s",
        "date": "d",
        "key": "k",
        "infons": {},
        "documents": [
            {
                "id": "7",
                "infons": {},
                "relations": [],
                "passages": [
                    {
                        "offset": 0,
                        "infons": {"type": "title"},
                        "text": "Fever.",
                        "sentences": [],
                        "relations": [],
                        "annotations": [
                            {
                                "id": "T1",
                                "infons": {"type": "Disease", "identifier": "D005334"},
                                "text": "Fever",
                                "locations": [{"offset": 0, "length": 5}],
                            }
                        ],
                    },
                    # a gap in offsets (10, not 7) is padded with spaces
                    {
                        "offset": 10,
                        "infons": {"type": "abstract"},
                        "text": "High fever.",
                        "annotations": [
                            {
                                "id": "T2",
                                "infons": {"type": "Disease", "Identifier": "D005334"},
                                "text": "fever",
                                "locations": [{"offset": 15, "length": 5}],
                            }
                        ],
                    },
                ],
            }
        ],
    }
    path = tmp_path / "corpus.json"
    path.write_text(json.dumps(collection), encoding="utf8")
    (doc,) = list(read_bioc(path))
    assert doc.text == "Fever.    High fever."
    assert [(doc.text[a.start : a.end], a.ids) for a in doc.annotations] == [
        ("Fever", ("D005334",)),
        ("fever", ("D005334",)),
    ]
    # one document per line (BioC JSON lines) works too
    lines = tmp_path / "corpus.jsonl"
    lines.write_text("\n".join(json.dumps(d) for d in collection["documents"] * 2), encoding="utf8")
    assert len(list(read_bioc(lines))) == 2
    collection["documents"][0]["passages"][0]["annotations"][0]["text"] = "Fevers"
    path.write_text(json.dumps(collection), encoding="utf8")
    with pytest.raises(CorpusFormatError, match=r"corpus\.json: document 7 annotation T1: PMID 7: mention 'Fevers'"):
        list(read_bioc(path))
    garbage = tmp_path / "garbage.txt"
    garbage.write_text("hello\n", encoding="utf8")
    with pytest.raises(CorpusFormatError, match=r"garbage\.txt:1: "):
        list(read_bioc(garbage))


def test_read_askapatient(tmp_path: Path) -> None:
    path = tmp_path / "AskAPatient.fold-0.validation.txt"
    path.write_text(
        "267032009\tTired all the time\tpersisten feeling of tiredness\n"
        "22298006\tMyocardial infarction\tHEART ATTACK\n",
        encoding="utf8",
    )
    mentions = list(read_askapatient(path))
    assert [(m.text, m.ids) for m in mentions] == [
        ("persisten feeling of tiredness", ("267032009",)),
        ("HEART ATTACK", ("22298006",)),
    ]
    assert mentions[1].doc_id == "AskAPatient.fold-0.validation.txt:2" and mentions[1].left == ""
    path.write_bytes("83901003\tSj\u00f6gren's syndrome\tsore eyes\n".encode("latin-1"))
    assert next(read_askapatient(path)).text == "sore eyes"
    path.write_text("1\tname\tmention\n2\tonly two\n", encoding="utf8")
    with pytest.raises(CorpusFormatError, match=r"validation\.txt:2: expected"):
        list(read_askapatient(path))


def test_read_jsonl_corpus(tmp_path: Path) -> None:
    path = tmp_path / "corpus.jsonl"
    rows = [
        {
            "id": "a",
            "text": "Fever and cough.",
            "mentions": [
                {"start": 0, "end": 5, "label": "Disease", "ids": ["D005334"]},
                {"start": 10, "end": 15, "label": "Disease", "ids": "D003371|MESH:D1", "text": "cough"},
            ],
        },
        {"id": "b", "text": "Nothing.", "mentions": []},
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n", encoding="utf8")
    docs = list(read_jsonl_corpus(path))
    assert docs[0].text == "Fever and cough."
    assert [(a.text, a.ids, a.composite) for a in docs[0].annotations] == [
        ("Fever", ("D005334",), False),
        ("cough", ("D003371", "D1"), True),
    ]
    assert docs[1].annotations == []
    rows[1]["mentions"] = [{"start": 0, "end": 7, "label": "X", "ids": [], "text": "Nothin"}]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n", encoding="utf8")
    with pytest.raises(CorpusFormatError, match=r"corpus\.jsonl:2: PMID b: mention 'Nothin'"):
        list(read_jsonl_corpus(path))


def test_to_spacy_docs(pubtator: Path) -> None:
    nlp = spacy.blank("en")
    docs = list(read_pubtator(pubtator))
    # an offset inside a token ("alox" of "Naloxone") expands to the whole token
    docs[1].annotations.append(PubTatorAnnotation(1, 5, "econ", "Disease", ("D2",)))
    spacy_docs = list(to_spacy_docs(docs, nlp))
    first = spacy_docs[0]
    assert first.user_data["doc_id"] == "227508"
    gold = first.spans["gold"]
    assert len(gold) == 6
    assert [(s.text, s.label_, s.kb_id_) for s in gold][2] == (
        "breast and ovarian cancers",
        "Disease",
        "D001943|D010051",
    )
    # "ovarian cancers" overlaps the composite mention: in the span group, not in the ents
    ent_texts = [e.text for e in first.ents]
    assert "breast and ovarian cancers" in ent_texts and "ovarian cancers" not in ent_texts
    assert len(first.ents) == 5
    assert [e.kb_id_ for e in first.ents][-1] == ""  # the NIL mention
    second = spacy_docs[1]
    assert [(e.text, e.kb_id_) for e in second.ents] == [("Second", "D2"), ("OMIM", "123456")]


def test_document_mentions_on_built_document() -> None:
    doc = PubTatorDocument("x", "Title", "Body text", [PubTatorAnnotation(6, 10, "Body", "T", ("D1",))])
    (mention,) = document_mentions(doc, context_chars=3)
    assert (mention.left, mention.text, mention.right) == ("le ", "Body", " te")


def test_load_corpus_by_format(pubtator: Path, tmp_path: Path) -> None:
    walk = tmp_path / "crosswalk.tsv"
    walk.write_text("D009270\tD000001\n", encoding="utf8")
    mentions, texts = load_corpus(pubtator, "pubtator", crosswalk=walk)
    assert mentions == [
        m for doc in read_pubtator(pubtator, crosswalk={"D009270": "D000001"}) for m in document_mentions(doc)
    ]
    assert mentions[0].ids == ("D000001",) and texts["227508"] == TEXT
    with pytest.raises(
        UnknownFormatError, match="unknown corpus format 'nope'; use pubtator, bioc, jsonl or askapatient"
    ):
        load_corpus(pubtator, "nope")
    assert issubclass(UnknownFormatError, ValueError) and not issubclass(UnknownFormatError, CorpusFormatError)


def test_bioc_document_lays_out_passages() -> None:
    from bioc import BioCDocument, BioCPassage

    bdoc = BioCDocument()
    bdoc.id = "7"
    for offset, text in ((0, "Title."), (20, "Abstract.")):
        passage = BioCPassage()
        passage.offset, passage.text = offset, text
        bdoc.add_passage(passage)
    doc = bioc_document(bdoc, Path("x.xml"), (), check_offsets=False)
    assert (doc.pmid, doc.title, doc.text.index("Abstract.")) == ("7", "Title.", 20)


# -- issue 16: offsets, wrong types, damaged files, line ends ----------------------------------------------------
@pytest.mark.parametrize(
    "start, end",
    [
        ("154.0", "160"),
        ("154.0", "160.0"),
        ("abc", "def"),
        ("abc", "160"),
        ("1e2", "2e2"),
        ("", ""),
        ("0x0", "0x8"),
        ("\u0661", "8"),
    ],
)
def test_pubtator_offsets_that_are_not_integers_are_errors(tmp_path: Path, start: str, end: str) -> None:
    """Such a line used to pass as a relation line, so the gold mention silently left evaluation."""
    path = tmp_path / "corpus.txt"
    path.write_text(
        f"227508|t|{TITLE}\n227508|a|{ABSTRACT}\n227508\t{start}\t{end}\tNaloxone\tChemical\tD009270\n", encoding="utf8"
    )
    with pytest.raises(CorpusFormatError, match=r"corpus\.txt:3: PMID 227508: offsets .* are not integers"):
        list(read_pubtator(path))
    with pytest.raises(CorpusFormatError, match=r"corpus\.txt:3: "):
        load_corpus(path, "pubtator")


def test_pubtator_relation_lines_are_still_relations(tmp_path: Path) -> None:
    path = tmp_path / "corpus.txt"
    path.write_text(
        f"227508|t|{TITLE}\n227508|a|{ABSTRACT}\n227508\t0\t8\tNaloxone\tChemical\tD009270\n"
        "227508\tCID\tD008750\tD007022\n227508\tPositive_Correlation\tD008750\t3630\tNovel\n",
        encoding="utf8",
    )
    (doc,) = list(read_pubtator(path))
    assert len(doc.annotations) == 1
    assert doc.relations == [("CID", "D008750", "D007022"), ("Positive_Correlation", "D008750", "3630", "Novel")]


def test_pubtator_cr_only_and_crlf_read_as_lf(tmp_path: Path, pubtator: Path) -> None:
    expected = [(d.pmid, d.text, d.annotations, d.relations) for d in read_pubtator(pubtator)]
    for name, ending in (("cr.txt", "\r"), ("crlf.txt", "\r\n")):
        path = tmp_path / name
        path.write_bytes(PUBTATOR.replace("\n", ending).encode("utf8"))
        assert [(d.pmid, d.text, d.annotations, d.relations) for d in read_pubtator(path)] == expected
    # line numbers stay exact in a CR-only file
    bad = tmp_path / "bad_cr.txt"
    bad.write_bytes(f"227508|t|{TITLE}\r227508|a|{ABSTRACT}\r227508\t0\t8\tNalaxone\tChemical\tD1\r".encode("utf8"))
    with pytest.raises(CorpusFormatError, match=r"bad_cr\.txt:3: "):
        list(read_pubtator(bad))


def _gzip_truncated(path: Path, text: str) -> Path:
    import gzip

    data = gzip.compress(text.encode("utf8"))
    path.write_bytes(data[: len(data) - 12])
    return path


def test_truncated_gzip_in_every_corpus_reader(tmp_path: Path) -> None:
    jsonl = "".join(json.dumps({"id": str(i), "text": "Fever.", "mentions": []}) + "\n" for i in range(50))
    for fmt, text in (
        ("pubtator", PUBTATOR * 20),
        ("bioc", BIOC_XML),
        ("jsonl", jsonl),
        ("askapatient", "1\tname\tmention\n" * 50),
    ):
        path = _gzip_truncated(tmp_path / f"corpus.{fmt}.gz", text)
        with pytest.raises(CorpusFormatError, match=rf"corpus\.{fmt}\.gz:\d+: truncated or corrupt gzip"):
            load_corpus(path, fmt)


def test_bioc_xml_with_bad_utf8_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "corpus.xml"
    path.write_bytes(BIOC_XML.replace("Aspirin causes", "Aspirin caus\udcffes").encode("utf8", "surrogateescape"))
    line = BIOC_XML[: BIOC_XML.index("Aspirin causes")].count("\n") + 1
    with pytest.raises(CorpusFormatError, match=rf"corpus\.xml:{line}: not UTF-8"):
        list(read_bioc(path))


def test_askapatient_cr_only(tmp_path: Path) -> None:
    path = tmp_path / "AskAPatient.fold-0.test.txt"
    path.write_bytes(b"1\tname one\tmention one\r2\tname two\tmention two\r")
    assert [(m.text, m.ids, m.doc_id) for m in read_askapatient(path)] == [
        ("mention one", ("1",), "AskAPatient.fold-0.test.txt:1"),
        ("mention two", ("2",), "AskAPatient.fold-0.test.txt:2"),
    ]


@pytest.mark.parametrize("value", [["x"], {"a": 1}, True, 1.5, float("nan")])
def test_jsonl_corpus_ids_of_the_wrong_type_are_errors(tmp_path: Path, value) -> None:
    path = tmp_path / "corpus.jsonl"
    path.write_text(
        json.dumps({"id": "a", "text": "Fever."}) + "\n" + json.dumps({"id": value, "text": "Fever."}) + "\n"
    )
    with pytest.raises(CorpusFormatError, match=r"corpus\.jsonl:2: 'id' must be a string or an integer"):
        list(read_jsonl_corpus(path))


@pytest.mark.parametrize(
    "record, message",
    [
        ({"id": 7, "text": 5}, "'text' must be a string"),
        ({"id": 7, "text": "Fever.", "mentions": 5}, "'mentions' must be a list"),
        ({"id": 7, "text": "Fever.", "mentions": [{"start": 1.5, "end": 3}]}, "integer 'start' and 'end'"),
        ({"id": 7, "text": "Fever.", "mentions": [{"start": True, "end": 3}]}, "integer 'start' and 'end'"),
        (
            {"id": 7, "text": "Fever.", "mentions": [{"start": 0, "end": 5, "ids": 5}]},
            "'ids' must be a string or a list",
        ),
        ({"id": 7, "text": "Fever.", "mentions": [{"start": 0, "end": 5, "text": 5}]}, "must be strings"),
        ("[" * 100000 + "]" * 100000, "nested too deeply"),
    ],
)
def test_jsonl_corpus_fields_of_the_wrong_type_are_errors(tmp_path: Path, record, message: str) -> None:
    path = tmp_path / "corpus.jsonl"
    path.write_text(record if isinstance(record, str) else json.dumps(record))
    with pytest.raises(CorpusFormatError, match=rf"corpus\.jsonl:1: .*{message}"):
        list(read_jsonl_corpus(path))
    path.write_text(
        json.dumps({"id": 7, "text": "Fever.", "mentions": [{"start": 0, "end": 5, "ids": None, "label": None}]})
    )
    (doc,) = read_jsonl_corpus(path)
    assert doc.pmid == "7" and doc.annotations[0].nil


def test_a_document_joins_its_text_once_and_again_when_a_part_changes():
    from spacy_genbioel.corpus.pubtator import PubTatorDocument

    doc = PubTatorDocument("1", "Title here", "An abstract.")
    assert doc.text == "Title here An abstract." and doc.text is doc.text  # joined once, not per mention
    doc.abstract = "Another one."
    assert doc.text == "Title here Another one."
    doc.title, doc.abstract = "Only a title", ""
    assert doc.text == "Only a title"
    assert doc == PubTatorDocument("1", "Only a title", "")  # the cache takes no part in equality
