"""Batch annotation: readers, writers, errors, provenance, and the kill-and-resume guarantee."""
import gzip
import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
import tracemalloc
from pathlib import Path

import pytest
import spacy

import spacy_genbioel  # noqa: F401  (registers the factory)
from spacy_genbioel.annotate import AnnotateError, InputRecord, RecordError, annotate, detect_format, read_records
from spacy_genbioel.annotate import checkpoint, readers, records, writers
from spacy_genbioel.corpus import read_bioc, read_jsonl_corpus, read_pubtator
from spacy_genbioel.models import save_model
from spacy_genbioel.util import atomic_write

from conftest import WORDS, assert_same_links, data_dir, random_kb

REPO = Path(__file__).resolve().parents[1]
PHRASES = WORDS + ["renal failure", "cystic fibrosis", "liver", "the", "of", "patients"]


# -- fixtures ------------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def pipeline_dir(tmp_path_factory, micro_model, word_tokenizer):
    """entity_ruler + genbioel over the micro model, saved as a spaCy pipeline directory."""
    root = tmp_path_factory.mktemp("annotate_pipeline")
    save_model(micro_model, word_tokenizer, root / "model")
    random_kb(1, n_concepts=30).to_jsonl(root / "kb.jsonl")
    nlp = spacy.blank("en")
    nlp.add_pipe("entity_ruler").add_patterns([
        {"label": "Disease", "pattern": "renal failure"},
        {"label": "Disease", "pattern": "cystic fibrosis"},
        {"label": "Chemical", "pattern": "liver"},
        {"label": "Disease", "pattern": "!!"},
    ])
    nlp.add_pipe("genbioel", config={"model": str(root / "model"), "kb": str(root / "kb.jsonl"), "num_beams": 3, "top_k": 3, "device": "cpu"})
    nlp.get_pipe("genbioel").linker  # load now so that to_disk stores model, KB and trie
    nlp.to_disk(root / "nlp")
    return root / "nlp"


def make_texts(n, seed=0):
    rng = random.Random(seed)
    return [" ".join(rng.choices(PHRASES, k=rng.randint(4, 14))) for _ in range(n)]


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf8")
    return path


@pytest.fixture(scope="session")
def docs_200(tmp_path_factory):
    path = tmp_path_factory.mktemp("annotate_inputs") / "docs.jsonl"
    return write_jsonl(path, [{"id": f"d{i}", "text": t} for i, t in enumerate(make_texts(200))])


RUN = dict(chunk_size=20, batch_size=8, progress=False, device="cpu")


@pytest.fixture(scope="session")
def reference(tmp_path_factory, pipeline_dir, docs_200):
    """One uninterrupted run over the 200 documents (JSONL out)."""
    out = tmp_path_factory.mktemp("annotate_reference") / "out"
    summary = annotate([docs_200], pipeline_dir, out, format="jsonl", **RUN)
    return out, summary


def chunk_files(out):
    return {p.name: p.read_bytes() for p in sorted(Path(out).glob("part-*"))}


def chunk_docs(out):
    return {p.name: [json.loads(line) for line in p.read_text(encoding="utf8").splitlines()] for p in sorted(Path(out).glob("part-*.jsonl"))}


def jsonl_docs(out):
    return [json.loads(line) for p in sorted(Path(out).glob("part-*.jsonl")) for line in p.read_text(encoding="utf8").splitlines()]


def stable(summary):
    return {k: v for k, v in summary.items() if k not in ("this_run", "out", "errors_file")}


def assert_same_as_reference(out, reference, exact_scores=True):
    """The output folder of an interrupted and rerun job is that of one uninterrupted run: the
    chunk files byte for byte, or, where chunks were written by another process with another
    thread count (``exact_scores=False``), the same files, documents and mentions with candidate
    scores up to float noise."""
    ref_out, ref_summary = reference
    if exact_scores:
        assert chunk_files(out) == chunk_files(ref_out)
    else:
        assert list(chunk_files(out)) == list(chunk_files(ref_out))
        assert_same_links(chunk_docs(out), chunk_docs(ref_out))
    ids = [d["id"] for d in jsonl_docs(out)]
    assert len(ids) == len(set(ids)) == 200
    assert not list(Path(out).glob(".*.tmp"))
    summary = json.loads((Path(out) / "summary.json").read_text())
    assert stable(summary) == stable(ref_summary)
    checkpoint = [json.loads(line) for line in (Path(out) / "checkpoint.jsonl").read_text().splitlines()]
    assert [e["chunk"] for e in checkpoint] == sorted(chunk_files(out))
    assert [i for e in checkpoint for i in e["ids"]] == ids
    assert (Path(out) / "checkpoint.jsonl").read_text() == (ref_out / "checkpoint.jsonl").read_text()


# -- readers ---------------------------------------------------------------------------------------
PUBTATOR = """\
100|t|Renal failure in mice.
100|a|We saw cystic fibrosis.
100\t0\t13\tRenal failure\tDisease\tD051437
100\tCID\tD1\tD2

200|t|Title only
200|a|

300|t|Broken document
300|a|abstract
999\t0\t3\tBro\tDisease\tD1

stray line without a document
400|t|Last one
400|a|with abstract
"""


def records_and_errors(items):
    items = list(items)
    return [i for i in items if isinstance(i, InputRecord)], [i for i in items if isinstance(i, RecordError)]


def test_pubtator_reader(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text(PUBTATOR, encoding="utf8")
    assert detect_format(path) == "pubtator"
    records, errors = records_and_errors(read_records(path))
    assert [(r.doc_id, r.text, r.line) for r in records] == [
        ("100", "Renal failure in mice. We saw cystic fibrosis.", 1),
        ("200", "Title only", 6),
        ("400", "Last one with abstract", 14),
    ]
    assert records[0].title == "Renal failure in mice." and records[0].abstract == "We saw cystic fibrosis."
    assert [(e.line, e.doc_id) for e in errors] == [(9, "300"), (13, None)]
    assert "PMID '999'" in errors[0].reason and "outside a document" in errors[1].reason


def test_jsonl_and_text_readers(tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_text("\n".join([
        json.dumps({"id": "a", "text": "renal failure"}),
        json.dumps({"pmid": 7, "title": "T", "abstract": "the liver"}),
        "",
        json.dumps({"id": "b"}),
        "{not json",
        json.dumps({"id": "c", "text": "   "}),
        json.dumps(["a", "list"]),
        json.dumps({"text": "no id"}),
        json.dumps({"id": "d", "text": 5}),
    ]) + "\n", encoding="utf8")
    assert detect_format(path) == "jsonl"
    records, errors = records_and_errors(read_records(path))
    assert [(r.doc_id, r.text, r.title, r.line) for r in records] == [("a", "renal failure", None, 1), ("7", "T the liver", "T", 2)]
    assert [e.line for e in errors] == [4, 5, 6, 7, 8, 9]
    reasons = [e.reason for e in errors]
    assert "no 'text'" in reasons[0] and "not valid JSON" in reasons[1] and "empty document" in reasons[2]
    assert "JSON object" in reasons[3] and "no ID" in reasons[4] and "not a string" in reasons[5]

    text = tmp_path / "plain.txt"
    text.write_bytes(b"first doc\n\nthird \xff doc\nlast\n")
    assert detect_format(text) == "text"
    records, errors = records_and_errors(read_records(text))
    assert [(r.doc_id, r.text) for r in records] == [(f"{text}:1", "first doc"), (f"{text}:4", "last")]
    assert [(e.line, "empty" in e.reason or "UTF-8" in e.reason) for e in errors] == [(2, True), (3, True)]


def pubmed_article(pmid, title, abstracts=(), book=False):
    sections = "".join(f'<AbstractText Label="L{i}">{a}</AbstractText>' for i, a in enumerate(abstracts))
    abstract = f"<Abstract>{sections}</Abstract>" if abstracts else ""
    if book:
        return (f"<PubmedBookArticle><BookDocument><PMID Version=\"1\">{pmid}</PMID><Book><BookTitle>{title}</BookTitle></Book>"
                f"{abstract}</BookDocument></PubmedBookArticle>\n")
    return (f"<PubmedArticle>\n<MedlineCitation Status=\"MEDLINE\">\n<PMID Version=\"1\">{pmid}</PMID>\n"
            f"<Article><ArticleTitle>{title}</ArticleTitle>{abstract}</Article>\n"
            f"<CommentsCorrectionsList><CommentsCorrections><PMID>1</PMID></CommentsCorrections></CommentsCorrectionsList>\n"
            f"</MedlineCitation>\n</PubmedArticle>\n")


def test_pubmed_reader_and_gz(tmp_path):
    body = "".join([
        pubmed_article(11, "Renal <i>failure</i> &amp; more", ["Part one.", "Part <sup>two</sup>."]),
        pubmed_article(12, "Broken & unescaped", ["x"]),
        "<PubmedArticle><MedlineCitation><PMID>13</PMID><Article><ArticleTitle>cut off\n",  # no end tag
        pubmed_article(14, "Title only"),
        "<PubmedArticle><MedlineCitation><Article><ArticleTitle>No PMID</ArticleTitle></Article></MedlineCitation></PubmedArticle>\n",
        pubmed_article(15, "A book", ["Book abstract."], book=True),
        "<DeleteCitation><PMID>99</PMID></DeleteCitation>\n",
    ])
    xml = f'<?xml version="1.0" encoding="utf-8"?>\n<!DOCTYPE PubmedArticleSet PUBLIC "-//NLM//DTD PubMedArticle, 1st January 2024//EN" "x.dtd">\n<PubmedArticleSet>\n{body}</PubmedArticleSet>\n'
    path = tmp_path / "pubmed24n0001.xml.gz"
    with gzip.open(path, "wt", encoding="utf8") as handle:
        handle.write(xml)
    assert detect_format(path) == "pubmed"
    records, errors = records_and_errors(read_records(path))
    assert [(r.doc_id, r.text) for r in records] == [
        ("11", "Renal failure & more Part one. Part two."),
        ("14", "Title only"),
        ("15", "A book Book abstract."),
    ]
    assert records[0].title == "Renal failure & more"
    lines = xml.splitlines()
    assert [(e.line, lines[e.line - 1].startswith("<PubmedArticle>")) for e in errors] == [(e.line, True) for e in errors]
    reasons = [e.reason for e in errors]
    assert len(errors) == 3 and "bad XML" in reasons[0] and "without its end tag" in reasons[1] and "PMID" in reasons[2]

    truncated = tmp_path / "truncated.xml.gz"
    truncated.write_bytes(gzip.compress((xml * 200).encode())[:-40])
    records, errors = records_and_errors(read_records(truncated, "pubmed"))
    assert len(records) >= 3 and "cannot be read further" in errors[-1].reason


def test_xml_scanner_memory_is_bounded(tmp_path):
    path = tmp_path / "big.xml"
    with path.open("w", encoding="utf8") as handle:
        handle.write("<PubmedArticleSet>\n")
        for i in range(3000):
            handle.write(pubmed_article(i + 1, f"title {i}", ["renal failure " * 20]))
        handle.write("</PubmedArticleSet>\n")
    assert path.stat().st_size > 1_500_000
    tracemalloc.start()
    try:
        n = sum(1 for _, record, _ in readers._xml_records(path, ("PubmedArticle",), block_chars=8192) if record)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert n == 3000
    assert peak < 200_000, peak  # a few blocks and one record, not the 1.6 MB file
    records, errors = records_and_errors(read_records(path))
    assert len(records) == 3000 and not errors and records[-1].line == 2 + 7 * 2999


def bioc_xml(docs):
    parts = []
    for doc_id, passages in docs:
        ps = "".join(f"<passage><infon key=\"type\">p</infon><offset>{o}</offset><text>{t}</text></passage>" for o, t in passages)
        parts.append(f"<document><id>{doc_id}</id>{ps}</document>\n")
    return '<?xml version="1.0" encoding="UTF-8"?>\n<collection><source>test</source><date/><key/>\n' + "".join(parts) + "</collection>\n"


def test_bioc_readers_lay_out_text_as_corpus_read_bioc(tmp_path):
    docs = [("A1", [(0, "Renal failure"), (14, "in the liver.")]), ("A2", [(0, "Gap"), (10, "after a gap")]), ("A3", [(0, "Solo")])]
    xml_path = tmp_path / "c.xml"
    xml_path.write_text(bioc_xml(docs), encoding="utf8")
    assert detect_format(xml_path) == "bioc"
    records, errors = records_and_errors(read_records(xml_path))
    expected = [(d.pmid, d.text) for d in read_bioc(xml_path)]
    assert [(r.doc_id, r.text) for r in records] == expected and not errors
    assert records[1].text == "Gap       after a gap"

    json_docs = [{"id": d, "passages": [{"offset": o, "text": t} for o, t in ps]} for d, ps in docs]
    collection = tmp_path / "c.json"
    collection.write_text(json.dumps({"source": "", "documents": json_docs + [{"id": "bad", "passages": [{"offset": "x", "text": "t"}]}]}))
    lines = tmp_path / "c.bioc.jsonl"
    lines.write_text("\n".join(json.dumps(d) for d in json_docs) + "\n{\"id\": \"broken\"\n")
    for path, position in ((collection, "record"), (lines, "line")):
        assert detect_format(path) == "bioc"
        records, errors = records_and_errors(read_records(path))
        assert [(r.doc_id, r.text) for r in records] == expected
        assert len(errors) == 1 and getattr(errors[0], position) == 4

    broken = tmp_path / "broken.xml"
    broken.write_text(bioc_xml(docs).replace("<text>Solo</text>", "<text>Solo &nope;</text>"))
    records, errors = records_and_errors(read_records(broken))
    assert [r.doc_id for r in records] == ["A1", "A2"] and errors[0].line == 5


def test_detect_format_edge_cases(tmp_path):
    cases = {
        "a.pubtator": "1|t|x\n1|a|y\n",
        "b.jsonl": '{"id": 1, "text": "x"}\n',
        "c.txt": "just words\n",
        "d.bioc.json": '[{"id": "1", "passages": []}]',
        "e.xml": '<?xml version="1.0"?>\n<!DOCTYPE collection SYSTEM "BioC.dtd">\n<collection><source/></collection>',
    }
    expected = {"a.pubtator": "pubtator", "b.jsonl": "jsonl", "c.txt": "text", "d.bioc.json": "bioc", "e.xml": "bioc"}
    for name, content in cases.items():
        (tmp_path / name).write_text(content)
        gz = tmp_path / (name + ".gz")
        gz.write_bytes(gzip.compress(content.encode()))
        assert detect_format(tmp_path / name) == expected[name] == detect_format(gz)
    (tmp_path / "f.xml").write_text("<html></html>")
    with pytest.raises(AnnotateError, match="input-format"):
        detect_format(tmp_path / "f.xml")
    with pytest.raises(AnnotateError, match="unknown input format"):
        list(read_records(tmp_path / "c.txt", "csv"))


# -- writers ------------------------------------------------------------------------------------------
def test_jsonl_output_and_provenance(reference, pipeline_dir):
    out, summary = reference
    docs = jsonl_docs(out)
    assert summary["documents_read"] == summary["documents_written"] == 200 and summary["chunks"] == 10
    assert summary["mentions"] == sum(len(d["mentions"]) for d in docs) > 100
    assert summary["mentions_linked"] == sum(1 for d in docs for m in d["mentions"] if m["kb_id"])
    mention = next(m for d in docs for m in d["mentions"])
    assert set(mention) == {"start", "end", "text", "label", "kb_id", "candidates"}
    assert all(len(c) == 3 and isinstance(c[2], float) for c in mention["candidates"])
    assert mention["candidates"][0][0] == mention["kb_id"]
    # the JSONL output is also a corpus this project reads (offsets checked)
    read = list(read_jsonl_corpus(sorted(out.glob("part-*"))[0]))
    assert [len(d.annotations) for d in read] == [len(d["mentions"]) for d in docs[:20]]

    provenance = json.loads((out / "provenance.json").read_text())
    nlp = spacy.load(pipeline_dir)
    kb = nlp.get_pipe("genbioel").linker.kb
    assert provenance["kb"]["checksum"] == kb.checksum() and provenance["kb"]["concepts"] == len(kb)
    assert provenance["version"] == spacy_genbioel.__version__ and provenance["model"]["type"] == "bart"
    assert provenance["format"] == "jsonl" and provenance["device"] == "cpu" and provenance["command"]


@pytest.fixture(scope="module")
def mixed_input(tmp_path_factory):
    """Title/abstract documents, single texts, and text with newlines and tabs."""
    path = tmp_path_factory.mktemp("annotate_mixed") / "mixed.jsonl"
    texts = make_texts(12, seed=3)
    records = [{"id": f"m{i}", "title": t, "abstract": texts[i + 1]} for i, t in enumerate(texts[:6])]
    records += [{"id": f"s{i}", "text": t} for i, t in enumerate(texts[6:])]
    records.append({"id": "nl", "text": "renal failure\nand\tthe liver"})
    records.append({"id": "t_only", "title": "cystic fibrosis of the liver"})
    return write_jsonl(path, records)


@pytest.fixture(scope="module")
def mixed_reference(tmp_path_factory, pipeline_dir, mixed_input):
    out = tmp_path_factory.mktemp("annotate_mixed_ref") / "out"
    annotate(mixed_input, pipeline_dir, out, format="jsonl", chunk_size=5, batch_size=4, progress=False)
    return {d["id"]: d for d in jsonl_docs(out)}


def test_pubtator_output_round_trips(tmp_path, pipeline_dir, mixed_input, mixed_reference):
    out = tmp_path / "out"
    annotate(mixed_input, pipeline_dir, out, format="pubtator", chunk_size=5, batch_size=4, progress=False)
    docs = [d for p in sorted(out.glob("part-*.pubtator")) for d in read_pubtator(p)]  # offsets checked
    assert [d.pmid for d in docs] == list(mixed_reference)
    for doc in docs:
        ref = mixed_reference[doc.pmid]
        assert doc.text == ref["text"].replace("\n", " ").replace("\t", " ")
        if "title" in ref:
            assert doc.title == ref["title"]
        got = [(a.start, a.end, a.type, a.ids[0] if a.ids else None) for a in doc.annotations]
        assert got == [(m["start"], m["end"], m["label"], m["kb_id"]) for m in ref["mentions"]]
    assert sum(len(d.annotations) for d in docs) > 5


def test_bioc_output_round_trips(tmp_path, pipeline_dir, mixed_input, mixed_reference):
    out = tmp_path / "out"
    annotate(mixed_input, pipeline_dir, out, format="bioc", chunk_size=5, batch_size=4, progress=False)
    docs = [d for p in sorted(out.glob("part-*.bioc.xml")) for d in read_bioc(p)]  # offsets checked
    assert [d.pmid for d in docs] == list(mixed_reference)
    for doc in docs:
        ref = mixed_reference[doc.pmid]
        assert doc.text == ref["text"].replace("\r", " ")
        got = [(a.start, a.end, a.type, a.ids[0] if a.ids else None) for a in doc.annotations]
        assert got == [(m["start"], m["end"], m["label"], m["kb_id"]) for m in ref["mentions"]]
    # our own BioC output is a valid annotate input, with the same texts
    records, errors = records_and_errors(read_records(sorted(out.glob("part-*"))))
    assert [(r.doc_id, r.text) for r in records] == [(d.pmid, d.text) for d in docs] and not errors
    from bioc import biocxml

    with sorted(out.glob("part-*"))[0].open(encoding="utf8") as handle:
        collection = biocxml.load(handle)
    annotations = [a for d in collection.documents for p in d.passages for a in p.annotations]
    assert annotations and all(json.loads(a.infons["candidates"])[0][0] == a.infons["identifier"] for a in annotations)


def test_docbin_output(tmp_path, pipeline_dir, mixed_input, mixed_reference):
    from spacy.tokens import DocBin

    out = tmp_path / "out"
    annotate(mixed_input, pipeline_dir, out, format="docbin", chunk_size=5, batch_size=4, progress=False)
    nlp = spacy.blank("en")
    docs = [d for p in sorted(out.glob("part-*.spacy")) for d in DocBin().from_disk(p).get_docs(nlp.vocab)]
    assert [d.user_data["doc_id"] for d in docs] == list(mixed_reference)
    for doc in docs:
        ref = mixed_reference[doc.user_data["doc_id"]]
        assert doc.text == ref["text"] and doc.user_data["source"].startswith(str(mixed_input))
        assert [(e.start_char, e.end_char, e.label_, e.kb_id_ or None) for e in doc.ents] == [
            (m["start"], m["end"], m["label"], m["kb_id"]) for m in ref["mentions"]]
        assert [[list(c) for c in e._.kb_candidates] for e in doc.ents] == [m["candidates"] for m in ref["mentions"]]


# -- errors, duplicates, summary ---------------------------------------------------------------------
def test_bad_records_go_to_the_errors_file_and_the_run_goes_on(tmp_path, pipeline_dir):
    good = make_texts(6, seed=5)
    jsonl = tmp_path / "a.jsonl"
    jsonl.write_text("\n".join([
        json.dumps({"id": "x1", "text": good[0]}),
        json.dumps({"id": "x2"}),
        "{broken",
        json.dumps({"id": "x1", "text": good[1]}),  # duplicate: the first is kept
        json.dumps({"id": "x3", "text": ""}),
        json.dumps({"id": "x4", "text": good[2]}),
    ]) + "\n")
    pubtator = tmp_path / "b.txt.gz"
    pubtator.write_bytes(gzip.compress(f"x4|t|{good[3]}\nx4|a|\n\nx5|t|{good[4]}\nx5|a|again\n\nBAD LINE\n".encode()))
    out = tmp_path / "out"
    errors_path = tmp_path / "logs" / "errors.jsonl"
    summary = annotate([jsonl, pubtator], pipeline_dir, out, format="pubtator", chunk_size=2, batch_size=2,
                       errors_path=errors_path, progress=False)
    assert summary["documents_read"] == 9
    assert (summary["documents_written"], summary["documents_skipped"], summary["errors"]) == (3, 2, 4)
    assert summary["documents_read"] == summary["documents_written"] + summary["documents_skipped"] + summary["errors"]
    entries = [json.loads(line) for line in errors_path.read_text().splitlines()]
    assert [(e["kind"], Path(e["file"]).name, e["line"]) for e in entries] == [
        ("error", "a.jsonl", 2), ("error", "a.jsonl", 3), ("duplicate", "a.jsonl", 4), ("error", "a.jsonl", 5),
        ("duplicate", "b.txt.gz", 1), ("error", "b.txt.gz", 7)]
    assert all(e["reason"] for e in entries) and entries[2]["id"] == "x1"
    written = [d.pmid for p in sorted(out.glob("part-*")) for d in read_pubtator(p)]
    assert written == ["x1", "x4", "x5"]
    assert json.loads((out / "summary.json").read_text()) == summary

    # a rerun of a finished job changes nothing and logs nothing twice
    again = annotate([jsonl, pubtator], pipeline_dir, out, format="pubtator", chunk_size=2, batch_size=2,
                     errors_path=errors_path, progress=False)
    assert stable(again) == stable(summary) and again["this_run"]["documents_resumed"] == 3
    assert len(errors_path.read_text().splitlines()) == len(entries)
    with pytest.raises(AnnotateError, match="pubtator"):
        annotate([jsonl], pipeline_dir, out, format="jsonl", progress=False)


def test_pubtator_output_rejects_ids_it_cannot_hold(tmp_path, pipeline_dir):
    path = write_jsonl(tmp_path / "ids.jsonl", [{"id": "a|b", "text": "renal failure"}, {"id": "ok", "text": "the liver"}])
    summary = annotate(path, pipeline_dir, tmp_path / "out", format="pubtator", progress=False)
    assert (summary["documents_written"], summary["errors"]) == (1, 1)


def poison(monkeypatch):
    from spacy_genbioel.linking.component import GenBioELLinker

    original = GenBioELLinker._process

    def process(self, docs):
        if any("POISON" in d.text for d in docs):
            raise RuntimeError("poisoned")
        return original(self, docs)

    monkeypatch.setattr(GenBioELLinker, "_process", process)


@pytest.mark.parametrize("n_process", [1, 2])
def test_a_document_the_pipeline_fails_on_is_an_error(tmp_path, pipeline_dir, monkeypatch, n_process):
    poison(monkeypatch)
    texts = make_texts(12, seed=7)
    texts[5] = "POISON renal failure"
    path = write_jsonl(tmp_path / "in.jsonl", [{"id": f"p{i}", "text": t} for i, t in enumerate(texts)])
    out = tmp_path / "out"
    summary = annotate(path, pipeline_dir, out, chunk_size=4, batch_size=3, n_process=n_process, progress=False)
    assert (summary["documents_written"], summary["errors"]) == (11, 1)
    entry = json.loads((out / "errors.jsonl").read_text())
    assert entry["id"] == "p5" and "poisoned" in entry["reason"]
    serial = tmp_path / "serial"
    monkeypatch.undo()
    clean = write_jsonl(tmp_path / "clean.jsonl", [{"id": f"p{i}", "text": t} for i, t in enumerate(texts) if i != 5])
    annotate(clean, pipeline_dir, serial, chunk_size=4, batch_size=3, progress=False)
    docs = {d["id"]: d["mentions"] for d in jsonl_docs(out)}
    # p5's batch was retried one document at a time and, without p5, the clean run batches the
    # rest differently: the same mentions and links, scores up to float noise
    assert_same_links({d["id"]: d["mentions"] for d in jsonl_docs(serial) if d["id"] in docs},
                      {k: v for k, v in docs.items() if k != "p5"})


def test_parallel_equals_serial(tmp_path, pipeline_dir, mixed_input, mixed_reference):
    out = tmp_path / "out"
    annotate(mixed_input, pipeline_dir, out, chunk_size=5, batch_size=2, n_process=2, progress=False)
    docs = jsonl_docs(out)
    assert [d["id"] for d in docs] == list(mixed_reference)
    # other batches (2 documents, not 4) in other processes: scores up to float noise
    assert_same_links({d["id"]: d for d in docs}, mixed_reference)
    with pytest.raises((AnnotateError, ValueError)):
        annotate(mixed_input, pipeline_dir, tmp_path / "gpu", n_process=2, device="cuda", progress=False)


# -- crashes and resume ----------------------------------------------------------------------------------
class Crash(Exception):
    pass


def crash_on_call(monkeypatch, owner, name, n, before=None):
    """Make owner.name raise Crash on its n-th call (after calling ``before(*args)`` if given)."""
    original = getattr(owner, name)
    calls = {"n": 0}

    def wrapper(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == n:
            if before is not None:
                before(*args, **kwargs)
            raise Crash(name)
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, wrapper)


ORIGINAL_JSONL_WRITE = writers.JsonlWriter.write


def write_half(self, items, path):
    ORIGINAL_JSONL_WRITE(self, items, path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def append_half(self, entry):
    with self.path.open("a") as handle:
        handle.write(json.dumps(entry)[:30])


def rename_then_crash(self, items):
    # the chunk lands, the checkpoint append never happens
    atomic_write(self.out / f"part-{self.next_number:06d}{self.writer.suffix}", lambda p: self.writer.write(items, p))


@pytest.mark.parametrize("where", ["mid_write", "after_rename", "torn_checkpoint_line", "before_rename"])
def test_crash_at_each_step_then_rerun_equals_one_run(tmp_path, pipeline_dir, docs_200, reference, monkeypatch, where):
    out = tmp_path / "out"
    if where == "mid_write":
        crash_on_call(monkeypatch, writers.JsonlWriter, "write", 4, before=write_half)
    elif where == "after_rename":
        crash_on_call(monkeypatch, checkpoint.Checkpoint, "commit", 4, before=rename_then_crash)
    elif where == "torn_checkpoint_line":
        crash_on_call(monkeypatch, checkpoint.Checkpoint, "_append", 4, before=append_half)
    else:
        original_replace = os.replace

        def replace(src, dst):
            if Path(dst).name == "part-000003.jsonl":
                raise Crash("rename")
            original_replace(src, dst)

        monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(Crash):
        annotate([docs_200], pipeline_dir, out, format="jsonl", **RUN)
    monkeypatch.undo()
    assert not (out / "summary.json").exists()
    if where == "after_rename":
        assert (out / "part-000003.jsonl").exists() and len((out / "checkpoint.jsonl").read_text().splitlines()) == 3
    summary = annotate([docs_200], pipeline_dir, out, format="jsonl", **RUN)
    # a chunk renamed into place counts even when its checkpoint line is missing or torn
    assert summary["this_run"]["documents_resumed"] == (80 if where in ("after_rename", "torn_checkpoint_line") else 60)
    assert_same_as_reference(out, reference)


@pytest.mark.parametrize("format", ["jsonl", "pubtator", "bioc", "docbin"])
def test_every_format_reads_its_chunks_back_after_a_crash(tmp_path, pipeline_dir, mixed_input, monkeypatch, format):
    settings = dict(format=format, chunk_size=4, batch_size=3, progress=False)
    whole = tmp_path / "whole"
    annotate(mixed_input, pipeline_dir, whole, **settings)
    crash_on_call(monkeypatch, checkpoint.Checkpoint, "commit", 3, before=rename_then_crash)
    out = tmp_path / "out"
    with pytest.raises(Crash):
        annotate(mixed_input, pipeline_dir, out, **settings)
    monkeypatch.undo()
    assert len((out / "checkpoint.jsonl").read_text().splitlines()) == 2 and len(chunk_files(out)) == 3
    summary = annotate(mixed_input, pipeline_dir, out, **settings)
    assert summary["this_run"]["documents_resumed"] == 12 and summary["documents_written"] == 14
    assert chunk_files(out) == chunk_files(whole) and len(chunk_files(out)) == 4
    assert (out / "checkpoint.jsonl").read_text() == (whole / "checkpoint.jsonl").read_text()


def test_id_keys_keep_ids_apart():
    keys = [records.id_key(i) for i in ["123", "0123", "00", "0", "１２", "12345678901234567890", "PMC1"]]
    assert keys == [123, "0123", "00", 0, "１２", "12345678901234567890", "PMC1"]
    assert len(set(keys)) == len(keys)


def test_missing_chunk_and_stray_entries_are_reconciled(tmp_path, pipeline_dir, docs_200, reference):
    out = tmp_path / "out"
    annotate([docs_200], pipeline_dir, out, format="jsonl", **RUN)
    lost = json.loads((out / "part-000004.jsonl").read_text().splitlines()[0])["id"]
    (out / "part-000004.jsonl").unlink()  # e.g. lost in a crash of the file system, or removed by hand
    (out / ".part-000010.jsonl.tmp").write_text("half a chu")
    summary = annotate([docs_200], pipeline_dir, out, format="jsonl", **RUN)
    assert summary["this_run"]["documents_annotated"] == 20 and summary["documents_written"] == 200
    assert (out / "part-000010.jsonl").exists() and lost in (out / "part-000010.jsonl").read_text()
    ref_docs = {d["id"]: d for d in jsonl_docs(reference[0])}
    docs = jsonl_docs(out)
    assert len(docs) == 200 and {d["id"]: d for d in docs} == ref_docs
    assert stable(summary) == stable(reference[1])


KILL_SCRIPT = """
import sys, time
from spacy_genbioel.annotate import annotate, writers

original = writers.JsonlWriter.write

def slow_write(self, items, path):
    original(self, items, path)  # the temporary file is there while we sleep
    time.sleep(0.1)

writers.JsonlWriter.write = slow_write
annotate([sys.argv[1]], sys.argv[2], sys.argv[3], format="jsonl", chunk_size=20, batch_size=8, progress=False, device="cpu")
"""


@pytest.mark.parametrize("kill_when", [".part-000001.jsonl.tmp"])
def test_kill_9_midway_then_rerun_equals_one_run(tmp_path, pipeline_dir, docs_200, reference, kill_when):
    script = tmp_path / "run.py"
    script.write_text(textwrap.dedent(KILL_SCRIPT))
    out = tmp_path / "out"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.Popen([sys.executable, str(script), str(docs_200), str(pipeline_dir), str(out)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    try:
        while not (out / kill_when).exists():
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
            assert time.monotonic() < deadline, "the run never reached the kill point"
            time.sleep(0.005)
        time.sleep(random.Random(kill_when).uniform(0, 0.1))
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait(timeout=30)
        proc.stderr.close()
    assert proc.returncode == -signal.SIGKILL
    assert not (out / "summary.json").exists()
    done = len((out / "checkpoint.jsonl").read_text().splitlines())
    assert 1 <= done < 10
    annotate([docs_200], pipeline_dir, out, format="jsonl", **RUN)
    # the first chunks come from a process with one thread (OMP_NUM_THREADS=1), the reference
    # from this one: other CPU kernels, so scores may differ in the 6th decimal
    assert_same_as_reference(out, reference, exact_scores=False)


def _slow_child(docs, pipeline_dir, out):
    """A forked run whose chunk writes take a while, so that kills land in every phase."""
    def slow_write(self, items, path):
        ORIGINAL_JSONL_WRITE(self, items, path)
        time.sleep(0.04)

    writers.JsonlWriter.write = slow_write
    annotate([docs], pipeline_dir, out, format="jsonl", **RUN)


def test_repeated_kill_9_at_random_moments(tmp_path, pipeline_dir, docs_200, reference):
    import multiprocessing

    out = tmp_path / "out"
    rng = random.Random(0)
    import torch

    context = multiprocessing.get_context("fork")  # the parent's imports come along: a run starts in a second, not ten
    # torch's OpenMP pool is not fork-safe: with more than one thread a forked child can hang
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        _kill_three_times(context, rng, docs_200, pipeline_dir, out)
    finally:
        torch.set_num_threads(threads)
    annotate([docs_200], pipeline_dir, out, format="jsonl", **RUN)
    # the killed children ran with one torch thread, the reference with this process's threads:
    # other CPU kernels, so the scores of their chunks may differ in the 6th decimal
    assert_same_as_reference(out, reference, exact_scores=False)


def _kill_three_times(context, rng, docs_200, pipeline_dir, out):
    for kill_after in (1, 4, 7):
        child = context.Process(target=_slow_child, args=(docs_200, pipeline_dir, out))
        child.start()
        deadline = time.monotonic() + 30
        while len(list(out.glob("part-*"))) < kill_after:
            assert child.is_alive() and time.monotonic() < deadline
            time.sleep(0.002)
        time.sleep(rng.uniform(0, 0.06))
        os.kill(child.pid, signal.SIGKILL)
        child.join()
        assert child.exitcode == -signal.SIGKILL and not (out / "summary.json").exists()


def test_one_run_per_output_folder(tmp_path, pipeline_dir, docs_200):
    import fcntl

    out = tmp_path / "out"
    out.mkdir()
    with (out / ".lock").open("w") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        with pytest.raises(AnnotateError, match="another annotate run"):
            annotate([docs_200], pipeline_dir, out, progress=False)


# -- command line ----------------------------------------------------------------------------------------------
def test_cli_command(tmp_path, pipeline_dir, mixed_input):
    from typer.testing import CliRunner

    from spacy_genbioel.cli import app

    out = tmp_path / "out"
    runner = CliRunner()
    result = runner.invoke(app, ["annotate", str(mixed_input), "--pipeline", str(pipeline_dir), "--out", str(out),
                                 "--format", "bioc", "--chunk-size", "4", "--batch-size", "2", "--device", "cpu",
                                 "--input-format", "jsonl", "--no-progress"])
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["documents_written"] == 14 and summary["chunks"] == 4
    assert json.loads((out / "provenance.json").read_text())["chunk_size"] == 4
    bad = runner.invoke(app, ["annotate", str(mixed_input), "--pipeline", str(pipeline_dir), "--out", str(tmp_path / "o2"),
                              "--format", "csv", "--no-progress"])
    assert bad.exit_code == 1 and "unknown output format" in bad.output


# -- shared data -------------------------------------------------------------------------------------------------
@pytest.mark.skipif(data_dir() is None, reason="needs ../shared/data")
def test_shared_pubtator_corpora(tmp_path, pipeline_dir):
    data = data_dir()
    dev = data / "ncbi_disease" / "NCBIdevelopset_corpus.txt"
    train = data / "ncbi_disease" / "NCBItrainset_corpus.txt"
    if not dev.exists() or not train.exists():
        pytest.skip("NCBI-disease files absent")
    assert detect_format(dev) == detect_format(train) == "pubtator"
    records, errors = records_and_errors(read_records(dev))
    assert [(r.doc_id, r.text) for r in records] == [(d.pmid, d.text) for d in read_pubtator(dev)] and not errors
    assert len(records) == 100
    train_records = [r for r in read_records(train) if isinstance(r, InputRecord)]
    assert len(train_records) == 593  # 8528200 twice: annotate keeps the first
    subset = tmp_path / "dev20.txt"
    subset.write_text("\n\n".join(dev.read_text(encoding="utf8").split("\n\n")[:20]) + "\n\n", encoding="utf8")
    summary = annotate(subset, pipeline_dir, tmp_path / "out", format="pubtator", chunk_size=8, progress=False)
    assert summary["documents_written"] == 20 and summary["errors"] == 0
    written = [d for p in sorted((tmp_path / "out").glob("part-*")) for d in read_pubtator(p)]
    assert [(d.pmid, d.text) for d in written] == [(r.doc_id, r.text) for r in records[:20]]


@pytest.mark.gpu
def test_cuda_device(tmp_path, pipeline_dir, mixed_input):
    summary = annotate(mixed_input, pipeline_dir, tmp_path / "out", device="cuda", chunk_size=5, progress=False)
    assert summary["documents_written"] == 14
    assert json.loads((tmp_path / "out" / "provenance.json").read_text())["device"].startswith("cuda")
