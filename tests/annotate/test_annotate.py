"""Batch annotation: readers, writers, errors, provenance, and the kill-and-resume guarantee."""

import dataclasses
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
import torch
from conftest import WORDS, assert_same_links, data_dir
from fuzz_annotate import bioc_xml, build_pipeline, pubmed_article

import spacy_genbioel  # noqa: F401  (registers the factory)
from spacy_genbioel.annotate import (
    AnnotateError,
    AnnotateOptions,
    InputRecord,
    RecordError,
    annotate,
    checkpoint,
    detect_format,
    read_records,
    records,
    writers,
    xml_readers,
)
from spacy_genbioel.corpus import read_bioc, read_jsonl_corpus, read_pubtator
from spacy_genbioel.util import atomic_write

REPO = Path(__file__).resolve().parents[2]
PHRASES = WORDS + ["renal failure", "cystic fibrosis", "liver", "the", "of", "patients"]


# -- fixtures ------------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def pipeline_dir(tmp_path_factory, micro_model, word_tokenizer):
    """entity_ruler + genbioel over the micro model, saved as a spaCy pipeline directory."""
    return build_pipeline(tmp_path_factory.mktemp("annotate_pipeline"), micro_model, word_tokenizer)


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


RUN = dict(format="jsonl", chunk_size=20, batch_size=8, progress=False)  # annotate()'s options
CPU = {"device": "cpu"}  # its genbioel settings


@pytest.fixture(scope="session")
def reference(tmp_path_factory, pipeline_dir, docs_200):
    """One uninterrupted run over the 200 documents (JSONL out)."""
    out = tmp_path_factory.mktemp("annotate_reference") / "out"
    summary = annotate([docs_200], pipeline_dir, out, RUN, CPU)
    return out, summary


def chunk_files(out):
    return {p.name: p.read_bytes() for p in sorted(Path(out).glob("part-*"))}


def chunk_docs(out):
    return {
        p.name: [json.loads(line) for line in p.read_text(encoding="utf8").splitlines()]
        for p in sorted(Path(out).glob("part-*.jsonl"))
    }


def jsonl_docs(out):
    return [
        json.loads(line)
        for p in sorted(Path(out).glob("part-*.jsonl"))
        for line in p.read_text(encoding="utf8").splitlines()
    ]


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
    path.write_text(
        "\n".join(
            [
                json.dumps({"id": "a", "text": "renal failure"}),
                json.dumps({"pmid": 7, "title": "T", "abstract": "the liver"}),
                "",
                json.dumps({"id": "b"}),
                "{not json",
                json.dumps({"id": "c", "text": "   "}),
                json.dumps(["a", "list"]),
                json.dumps({"text": "no id"}),
                json.dumps({"id": "d", "text": 5}),
            ]
        )
        + "\n",
        encoding="utf8",
    )
    assert detect_format(path) == "jsonl"
    records, errors = records_and_errors(read_records(path))
    assert [(r.doc_id, r.text, r.title, r.line) for r in records] == [
        ("a", "renal failure", None, 1),
        ("7", "T the liver", "T", 2),
    ]
    assert [e.line for e in errors] == [4, 5, 6, 7, 8, 9]
    reasons = [e.reason for e in errors]
    assert "no 'text'" in reasons[0] and "not valid JSON" in reasons[1] and "empty document" in reasons[2]
    assert "JSON object" in reasons[3] and "no ID" in reasons[4] and "not a string" in reasons[5]

    text = tmp_path / "plain.txt"
    text.write_bytes(b"first doc\n\nthird \xff doc\nlast\n")
    assert detect_format(text) == "text"
    records, errors = records_and_errors(read_records(text))
    assert [(r.doc_id, r.text) for r in records] == [
        (f"{text.resolve()}:1", "first doc"),
        (f"{text.resolve()}:4", "last"),
    ]
    assert [(e.line, "empty" in e.reason or "UTF-8" in e.reason) for e in errors] == [(2, True), (3, True)]


def test_pubmed_reader_and_gz(tmp_path):
    body = "".join(
        [
            pubmed_article(11, "Renal <i>failure</i> &amp; more", ["Part one.", "Part <sup>two</sup>."]),
            pubmed_article(12, "Broken & unescaped", ["x"]),
            "<PubmedArticle><MedlineCitation><PMID>13</PMID><Article><ArticleTitle>cut off\n",  # no end tag
            pubmed_article(14, "Title only"),
            "<PubmedArticle><MedlineCitation>"
            "<Article><ArticleTitle>No PMID</ArticleTitle></Article></MedlineCitation></PubmedArticle>\n",
            pubmed_article(15, "A book", ["Book abstract."], book=True),
            "<DeleteCitation><PMID>99</PMID></DeleteCitation>\n",
        ]
    )
    xml = (
        '<?xml version="1.0" encoding="utf-8"?>\n'
        '<!DOCTYPE PubmedArticleSet PUBLIC "-//NLM//DTD PubMedArticle, 1st January 2024//EN" "x.dtd">\n'
        f"<PubmedArticleSet>\n{body}</PubmedArticleSet>\n"
    )
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
    assert [(e.line, lines[e.line - 1].startswith("<PubmedArticle>")) for e in errors] == [
        (e.line, True) for e in errors
    ]
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
        n = sum(1 for _, record, _ in xml_readers.xml_records(path, ("PubmedArticle",), block_chars=8192) if record)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert n == 3000
    assert peak < 200_000, peak  # a few blocks and one record, not the 1.6 MB file
    records, errors = records_and_errors(read_records(path))
    assert len(records) == 3000 and not errors and records[-1].line == 2 + 7 * 2999


def test_bioc_readers_lay_out_text_as_corpus_read_bioc(tmp_path):
    docs = [
        ("A1", [(0, "Renal failure"), (14, "in the liver.")]),
        ("A2", [(0, "Gap"), (10, "after a gap")]),
        ("A3", [(0, "Solo")]),
    ]
    xml_path = tmp_path / "c.xml"
    xml_path.write_text(bioc_xml(docs), encoding="utf8")
    assert detect_format(xml_path) == "bioc"
    records, errors = records_and_errors(read_records(xml_path))
    expected = [(d.pmid, d.text) for d in read_bioc(xml_path)]
    assert [(r.doc_id, r.text) for r in records] == expected and not errors
    assert records[1].text == "Gap       after a gap"

    json_docs = [{"id": d, "passages": [{"offset": o, "text": t} for o, t in ps]} for d, ps in docs]
    collection = tmp_path / "c.json"
    collection.write_text(
        json.dumps({"source": "", "documents": json_docs + [{"id": "bad", "passages": [{"offset": "x", "text": "t"}]}]})
    )
    lines = tmp_path / "c.bioc.jsonl"
    lines.write_text("\n".join(json.dumps(d) for d in json_docs) + '\n{"id": "broken"\n')
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
    with pytest.raises(AnnotateError, match=r"give the input format \(input_format\)$"):
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
    annotate(mixed_input, pipeline_dir, out, AnnotateOptions(chunk_size=5, batch_size=4, progress=False))
    return {d["id"]: d for d in jsonl_docs(out)}


def test_pubtator_output_round_trips(tmp_path, pipeline_dir, mixed_input, mixed_reference):
    out = tmp_path / "out"
    annotate(mixed_input, pipeline_dir, out, dict(format="pubtator", chunk_size=5, batch_size=4, progress=False))
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
    annotate(mixed_input, pipeline_dir, out, dict(format="bioc", chunk_size=5, batch_size=4, progress=False))
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
    annotate(mixed_input, pipeline_dir, out, dict(format="docbin", chunk_size=5, batch_size=4, progress=False))
    nlp = spacy.blank("en")
    docs = [d for p in sorted(out.glob("part-*.spacy")) for d in DocBin().from_disk(p).get_docs(nlp.vocab)]
    assert [d.user_data["doc_id"] for d in docs] == list(mixed_reference)
    for doc in docs:
        ref = mixed_reference[doc.user_data["doc_id"]]
        assert doc.text == ref["text"] and doc.user_data["source"].startswith(str(mixed_input))
        assert [(e.start_char, e.end_char, e.label_, e.kb_id_ or None) for e in doc.ents] == [
            (m["start"], m["end"], m["label"], m["kb_id"]) for m in ref["mentions"]
        ]
        assert [[list(c) for c in e._.kb_candidates] for e in doc.ents] == [m["candidates"] for m in ref["mentions"]]


# -- errors, duplicates, summary ---------------------------------------------------------------------
def test_bad_records_go_to_the_errors_file_and_the_run_goes_on(tmp_path, pipeline_dir):
    good = make_texts(6, seed=5)
    jsonl = tmp_path / "a.jsonl"
    jsonl.write_text(
        "\n".join(
            [
                json.dumps({"id": "x1", "text": good[0]}),
                json.dumps({"id": "x2"}),
                "{broken",
                json.dumps({"id": "x1", "text": good[1]}),  # duplicate: the first is kept
                json.dumps({"id": "x3", "text": ""}),
                json.dumps({"id": "x4", "text": good[2]}),
            ]
        )
        + "\n"
    )
    pubtator = tmp_path / "b.txt.gz"
    pubtator.write_bytes(gzip.compress(f"x4|t|{good[3]}\nx4|a|\n\nx5|t|{good[4]}\nx5|a|again\n\nBAD LINE\n".encode()))
    out = tmp_path / "out"
    errors_path = tmp_path / "logs" / "errors.jsonl"
    options = AnnotateOptions(format="pubtator", chunk_size=2, batch_size=2, errors_path=errors_path, progress=False)
    summary = annotate([jsonl, pubtator], pipeline_dir, out, options)
    assert summary["documents_read"] == 9
    assert (summary["documents_written"], summary["documents_skipped"], summary["errors"]) == (3, 2, 4)
    assert summary["documents_read"] == summary["documents_written"] + summary["documents_skipped"] + summary["errors"]
    entries = [json.loads(line) for line in errors_path.read_text().splitlines()]
    assert [(e["kind"], Path(e["file"]).name, e["line"]) for e in entries] == [
        ("error", "a.jsonl", 2),
        ("error", "a.jsonl", 3),
        ("duplicate", "a.jsonl", 4),
        ("error", "a.jsonl", 5),
        ("duplicate", "b.txt.gz", 1),
        ("error", "b.txt.gz", 7),
    ]
    assert all(e["reason"] for e in entries) and entries[2]["id"] == "x1"
    written = [d.pmid for p in sorted(out.glob("part-*")) for d in read_pubtator(p)]
    assert written == ["x1", "x4", "x5"]
    assert json.loads((out / "summary.json").read_text()) == summary

    # a rerun of a finished job changes nothing and logs nothing twice
    again = annotate([jsonl, pubtator], pipeline_dir, out, options)
    assert stable(again) == stable(summary) and again["this_run"]["documents_resumed"] == 3
    assert len(errors_path.read_text().splitlines()) == len(entries)
    with pytest.raises(AnnotateError, match="pubtator"):
        annotate([jsonl], pipeline_dir, out, {"progress": False})


def test_pubtator_output_rejects_ids_it_cannot_hold(tmp_path, pipeline_dir):
    path = write_jsonl(
        tmp_path / "ids.jsonl", [{"id": "a|b", "text": "renal failure"}, {"id": "ok", "text": "the liver"}]
    )
    summary = annotate(path, pipeline_dir, tmp_path / "out", dict(format="pubtator", progress=False))
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
    summary = annotate(path, pipeline_dir, out, dict(chunk_size=4, batch_size=3, n_process=n_process, progress=False))
    assert (summary["documents_written"], summary["errors"]) == (11, 1)
    entry = json.loads((out / "errors.jsonl").read_text())
    assert entry["id"] == "p5" and "poisoned" in entry["reason"]
    serial = tmp_path / "serial"
    monkeypatch.undo()
    clean = write_jsonl(tmp_path / "clean.jsonl", [{"id": f"p{i}", "text": t} for i, t in enumerate(texts) if i != 5])
    annotate(clean, pipeline_dir, serial, dict(chunk_size=4, batch_size=3, progress=False))
    docs = {d["id"]: d["mentions"] for d in jsonl_docs(out)}
    # p5's batch was retried one document at a time and, without p5, the clean run batches the
    # rest differently: the same mentions and links, scores up to float noise
    assert_same_links(
        {d["id"]: d["mentions"] for d in jsonl_docs(serial) if d["id"] in docs},
        {k: v for k, v in docs.items() if k != "p5"},
    )


def test_parallel_equals_serial(tmp_path, pipeline_dir, mixed_input, mixed_reference):
    out = tmp_path / "out"
    annotate(mixed_input, pipeline_dir, out, dict(chunk_size=5, batch_size=2, n_process=2, progress=False))
    docs = jsonl_docs(out)
    assert [d["id"] for d in docs] == list(mixed_reference)
    # other batches (2 documents, not 4) in other processes: scores up to float noise
    assert_same_links({d["id"]: d for d in docs}, mixed_reference)
    if torch.cuda.device_count() == 0:
        with pytest.raises(AnnotateError, match="^device cuda: no CUDA device is available"):
            annotate(mixed_input, pipeline_dir, tmp_path / "gpu", dict(n_process=2, progress=False), {"device": "cuda"})
        assert not (tmp_path / "gpu").exists()


def test_forked_workers_take_their_gpus_themselves(tmp_path, pipeline_dir, mixed_input, mixed_reference, monkeypatch):
    """``n_process > 1`` with ``cuda``: this process loads on the CPU and never starts CUDA; each worker
    moves its generator to its GPU (here: told where, since this machine may have none) before its units."""
    from spacy_genbioel.linking.component import GenBioELLinker

    moved = tmp_path / "moved"
    moved.mkdir()

    def to_device(self, device):  # in the worker: say where it was sent, stay on the CPU
        (moved / f"{os.getpid()}-{device}").write_text("")

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(GenBioELLinker, "to_device", to_device)
    out = tmp_path / "out"
    summary = annotate(
        mixed_input,
        pipeline_dir,
        out,
        dict(chunk_size=5, batch_size=2, n_process=2, progress=False),
        {"device": "cuda"},
    )
    assert sorted(p.name.split("-", 1)[1] for p in moved.iterdir()) == ["cuda:0", "cuda:1"]
    assert summary["documents_written"] == len(mixed_reference)
    assert_same_links({d["id"]: d for d in jsonl_docs(out)}, mixed_reference)
    provenance = json.loads((out / "provenance.json").read_text())
    assert provenance["device"] == provenance["runs"][0]["device"] == "cuda (each worker's generator)"


def test_a_worker_that_cannot_take_its_gpu_stops_the_run(tmp_path, pipeline_dir, mixed_input, monkeypatch):
    from spacy_genbioel.linking.component import GenBioELLinker

    def to_device(self, device):
        raise RuntimeError(f"{device}: out of memory")

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(GenBioELLinker, "to_device", to_device)
    with pytest.raises(AnnotateError, match=r"could not start \(RuntimeError: cuda:0: out of memory\)"):
        annotate(
            mixed_input,
            pipeline_dir,
            tmp_path / "out",
            dict(chunk_size=5, n_process=2, progress=False),
            {"device": "cuda"},
        )


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
        annotate([docs_200], pipeline_dir, out, RUN, CPU)
    monkeypatch.undo()
    assert not (out / "summary.json").exists()
    if where == "after_rename":
        assert (out / "part-000003.jsonl").exists() and len((out / "checkpoint.jsonl").read_text().splitlines()) == 3
    summary = annotate([docs_200], pipeline_dir, out, RUN, CPU)
    # a chunk renamed into place counts even when its checkpoint line is missing or torn
    assert summary["this_run"]["documents_resumed"] == (80 if where in ("after_rename", "torn_checkpoint_line") else 60)
    assert_same_as_reference(out, reference)


@pytest.mark.parametrize("format", ["jsonl", "pubtator", "bioc", "docbin"])
def test_every_format_reads_its_chunks_back_after_a_crash(tmp_path, pipeline_dir, mixed_input, monkeypatch, format):
    options = dict(format=format, chunk_size=4, batch_size=3, progress=False)
    whole = tmp_path / "whole"
    annotate(mixed_input, pipeline_dir, whole, options)
    crash_on_call(monkeypatch, checkpoint.Checkpoint, "commit", 3, before=rename_then_crash)
    out = tmp_path / "out"
    with pytest.raises(Crash):
        annotate(mixed_input, pipeline_dir, out, options)
    monkeypatch.undo()
    assert len((out / "checkpoint.jsonl").read_text().splitlines()) == 2 and len(chunk_files(out)) == 3
    summary = annotate(mixed_input, pipeline_dir, out, options)
    assert summary["this_run"]["documents_resumed"] == 12 and summary["documents_written"] == 14
    assert chunk_files(out) == chunk_files(whole) and len(chunk_files(out)) == 4
    assert (out / "checkpoint.jsonl").read_text() == (whole / "checkpoint.jsonl").read_text()


def test_id_keys_keep_ids_apart():
    keys = [records.id_key(i) for i in ["123", "0123", "00", "0", "１２", "12345678901234567890", "PMC1"]]
    assert keys == [123, "0123", "00", 0, "１２", "12345678901234567890", "PMC1"]
    assert len(set(keys)) == len(keys)


def test_missing_chunk_and_stray_entries_are_reconciled(tmp_path, pipeline_dir, docs_200, reference):
    out = tmp_path / "out"
    annotate([docs_200], pipeline_dir, out, RUN, CPU)
    lost = json.loads((out / "part-000004.jsonl").read_text().splitlines()[0])["id"]
    (out / "part-000004.jsonl").unlink()  # e.g. lost in a crash of the file system, or removed by hand
    (out / ".part-000010.jsonl.tmp").write_text("half a chu")
    summary = annotate([docs_200], pipeline_dir, out, RUN, CPU)
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
annotate([sys.argv[1]], sys.argv[2], sys.argv[3], dict(format="jsonl", chunk_size=20, batch_size=8, progress=False),
         {"device": "cpu"})
"""


@pytest.mark.parametrize("kill_when", [".part-000001.jsonl.tmp"])
def test_kill_9_midway_then_rerun_equals_one_run(tmp_path, pipeline_dir, docs_200, reference, kill_when):
    script = tmp_path / "run.py"
    script.write_text(textwrap.dedent(KILL_SCRIPT))
    out = tmp_path / "out"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.Popen(
        [sys.executable, str(script), str(docs_200), str(pipeline_dir), str(out)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
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
    annotate([docs_200], pipeline_dir, out, RUN, CPU)
    # the first chunks come from a process with one thread (OMP_NUM_THREADS=1), the reference
    # from this one: other CPU kernels, so scores may differ in the 6th decimal
    assert_same_as_reference(out, reference, exact_scores=False)


def _slow_child(docs, pipeline_dir, out):
    """A forked run whose chunk writes take a while, so that kills land in every phase."""

    def slow_write(self, items, path):
        ORIGINAL_JSONL_WRITE(self, items, path)
        time.sleep(0.04)

    writers.JsonlWriter.write = slow_write
    annotate([docs], pipeline_dir, out, RUN, CPU)


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
    annotate([docs_200], pipeline_dir, out, RUN, CPU)
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
            annotate([docs_200], pipeline_dir, out, {"progress": False})


# -- command line ----------------------------------------------------------------------------------------------
def test_cli_command(tmp_path, pipeline_dir, mixed_input):
    from typer.testing import CliRunner

    from spacy_genbioel.cli import app

    out = tmp_path / "out"
    runner = CliRunner()
    result = runner.invoke(
        app,
        [
            "annotate",
            str(mixed_input),
            "--pipeline",
            str(pipeline_dir),
            "--out",
            str(out),
            "--format",
            "bioc",
            "--chunk-size",
            "4",
            "--batch-size",
            "2",
            "--device",
            "cpu",
            "--input-format",
            "jsonl",
            "--no-progress",
            "--dtype",
            "bf16",
        ],
    )
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["documents_written"] == 14 and summary["chunks"] == 4
    provenance = json.loads((out / "provenance.json").read_text())
    assert provenance["chunk_size"] == 4 and provenance["settings"] == {"device": "cpu", "dtype": "bf16"}
    bad = runner.invoke(
        app,
        [
            "annotate",
            str(mixed_input),
            "--pipeline",
            str(pipeline_dir),
            "--out",
            str(tmp_path / "o2"),
            "--format",
            "csv",
            "--no-progress",
        ],
    )
    assert bad.exit_code == 1 and "--format 'csv': unknown output format" in bad.output


def test_cli_settings_after_the_flags(tmp_path, pipeline_dir, mixed_input, mixed_reference):
    """Dotted genbioel settings (spaCy's override syntax) after the flags reach the component; an
    unknown one is a one-line failure naming it; errors name the flags, not annotate()'s arguments."""
    from typer.testing import CliRunner

    from spacy_genbioel.cli import app

    runner = CliRunner()
    base = ["annotate", str(mixed_input), "--pipeline", str(pipeline_dir), "--no-progress", "--device", "cpu"]
    out = tmp_path / "out"
    result = runner.invoke(
        app, [*base, "--out", str(out), "--chunk-size", "5", "--output.threshold", "0.999", "--decoding.batch_size=4"]
    )
    assert result.exit_code == 0, result.output
    docs = jsonl_docs(out)
    assert [d["id"] for d in docs] == list(mixed_reference)
    assert any(m["kb_id"] for d in mixed_reference.values() for m in d["mentions"])
    assert not any(m["kb_id"] for d in docs for m in d["mentions"])  # every score is below the threshold
    provenance = json.loads((out / "provenance.json").read_text())
    assert provenance["settings"] == {"device": "cpu", "output": {"threshold": 0.999}, "decoding": {"batch_size": 4}}
    assert provenance["model"]["config"]["output"]["threshold"] == 0.999
    for extra, named in (
        (["--decoding.beams", "3"], "'decoding.beams'"),
        (["--beams", "3"], "--beams"),
        (["--output.threshold", "0.5"], "another job"),
    ):
        bad = runner.invoke(app, [*base, "--out", str(out), "--chunk-size", "5", *extra])
        assert bad.exit_code == 1 and named in bad.output and isinstance(bad.exception, SystemExit), bad.output
    assert "another output folder (--out)" in bad.output
    wrong = runner.invoke(app, [*base, "--out", str(tmp_path / "o2"), "--n-process", "0"])
    assert wrong.exit_code == 1 and "--n-process must be a whole number of at least 1" in wrong.output
    assert not (tmp_path / "o2").exists()


def test_options_and_settings_are_checked_before_anything_is_written(tmp_path, pipeline_dir, mixed_input):
    out = tmp_path / "out"
    refused = [
        (dict(format="csv"), None, "^format 'csv': unknown output format"),
        (dict(chunk_size=0), None, "^chunk_size must be a whole number of at least 1, not 0"),
        (dict(batch_size=True), None, "^batch_size must be a whole number"),
        (dict(input_format="xml"), None, "^input_format 'xml': unknown input format"),
        (dict(device="cpu"), None, r"unknown annotate option 'device' \(a genbioel setting: give it in settings\)"),
        (dict(n_process=2), {"device": "cuda:7"}, "^device cuda:7: (no CUDA device is available|there are)"),
        (dict(n_process=2), {"device": "gpu"}, "^device gpu: "),
        (None, {"decoding.beams": 3}, "Unknown genbioel setting 'decoding.beams'"),
        (None, {"device": 0}, "^device 0: use auto, cpu, cuda or cuda:N"),
        (None, ["device", "cpu"], "^settings must be a mapping"),
    ]
    for options, settings, message in refused:
        with pytest.raises(AnnotateError, match=message):
            annotate(mixed_input, pipeline_dir, out, options, settings)
        assert not out.exists()
    with pytest.raises(AnnotateError, match="^out .* is a file; it must be a folder") as error:
        annotate(mixed_input, pipeline_dir, mixed_input, settings=CPU)
    assert error.value.settings == ["out"] and error.value.naming(str.upper).startswith("OUT ")
    with pytest.raises(dataclasses.FrozenInstanceError):
        AnnotateOptions().chunk_size = 5
    assert (
        AnnotateOptions.of({"format": "bioc"}) == AnnotateOptions(format="bioc")
        and AnnotateOptions.of(None) == AnnotateOptions()
    )


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
    summary = annotate(subset, pipeline_dir, tmp_path / "out", dict(format="pubtator", chunk_size=8, progress=False))
    assert summary["documents_written"] == 20 and summary["errors"] == 0
    written = [d for p in sorted((tmp_path / "out").glob("part-*")) for d in read_pubtator(p)]
    assert [(d.pmid, d.text) for d in written] == [(r.doc_id, r.text) for r in records[:20]]


@pytest.mark.gpu
def test_cuda_device(tmp_path, pipeline_dir, mixed_input):
    summary = annotate(
        mixed_input, pipeline_dir, tmp_path / "out", dict(chunk_size=5, progress=False), {"device": "cuda"}
    )
    assert summary["documents_written"] == 14
    assert json.loads((tmp_path / "out" / "provenance.json").read_text())["device"].startswith("cuda")


@pytest.mark.gpu
def test_forked_workers_on_a_gpu_equal_one_process_there(tmp_path, pipeline_dir, mixed_input):
    """The command with ``--n-process 2 --device cuda``: workers forked from a process that loaded on the
    CPU (never starting CUDA) each run their generator on the GPU, and their chunks hold one process's
    links there. The command runs in its own process: this one may have started CUDA in another test."""
    run = dict(chunk_size=5, batch_size=2, progress=False)
    annotate(mixed_input, pipeline_dir, tmp_path / "one", run, {"device": "cuda"})
    command = [sys.executable, "-m", "spacy_genbioel", "annotate", str(mixed_input), "--pipeline", str(pipeline_dir)]
    command += ["--out", str(tmp_path / "two"), "--chunk-size", "5", "--batch-size", "2", "--no-progress"]
    command += ["--n-process", "2", "--device", "cuda"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads((tmp_path / "two" / "summary.json").read_text())
    assert summary["documents_written"] == 14 and summary["this_run"]["workers"] == 2
    assert all(w.get("gpu_peak_mb", 0) > 0 for w in summary["this_run"]["memory"]["workers"])
    assert_same_links(
        {d["id"]: d for d in jsonl_docs(tmp_path / "two")}, {d["id"]: d for d in jsonl_docs(tmp_path / "one")}
    )


# -- one job per output folder ---------------------------------------------------------------------------------
def folder_state(out):
    return {p.name: p.read_bytes() for p in sorted(Path(out).iterdir()) if p.name != ".lock"}


def test_the_output_folder_records_its_job_and_refuses_another(tmp_path, pipeline_dir, mixed_input, monkeypatch):
    import shutil

    from spacy_genbioel.util import fingerprint

    mixed_input = Path(shutil.copy(mixed_input, tmp_path / "mixed.jsonl"))  # changed below
    out = tmp_path / "out"
    run = dict(chunk_size=5, batch_size=4, progress=False)
    annotate(mixed_input, pipeline_dir, out, run, CPU)
    job = json.loads((out / "job.json").read_text())
    assert job["format"] == "jsonl" and job["input_format"] is None
    assert job["inputs"] == [
        {
            "path": str(mixed_input.resolve()),
            "size": mixed_input.stat().st_size,
            "fingerprint": fingerprint([mixed_input.resolve()]),
            "format": "jsonl",
        }
    ]
    assert job["pipeline"]["model"] == fingerprint([pipeline_dir / "genbioel" / "model"])
    assert job["pipeline"]["config"]["num_beams"] == 3 and "device" not in job["pipeline"]["config"]
    # the same job resumes: another spelling of the input, an input_format that names the detected
    # format, a copy of the pipeline elsewhere, another device/batch size/n_process, settings that say
    # how the linker runs (device, decoding.batch_size) or that the pipeline has already are the same job
    monkeypatch.chdir(mixed_input.parent)
    copy = tmp_path / "copy"
    shutil.copytree(pipeline_dir, copy)
    settings = {"device": "auto", "decoding.batch_size": 3}
    again = annotate(
        f"../{mixed_input.parent.name}/{mixed_input.name}",
        copy,
        out,
        {**run, "input_format": "jsonl", "batch_size": 2},
        settings,
    )
    assert again["this_run"]["documents_annotated"] == 0 and again["this_run"]["documents_resumed"] == 14
    runs = json.loads((out / "provenance.json").read_text())["runs"]
    assert [r["settings"] for r in runs] == [{"device": "cpu"}, {"device": "auto", "decoding": {"batch_size": 3}}]

    before = folder_state(out)
    other_kb = tmp_path / "other_kb"
    shutil.copytree(pipeline_dir, other_kb)
    with (other_kb / "genbioel" / "kb.jsonl").open("a") as handle:
        handle.write(json.dumps({"id": "X1", "names": ["renal failure"]}) + "\n")
    other_config = tmp_path / "other_config"
    shutil.copytree(pipeline_dir, other_config)
    config = other_config / "config.cfg"
    config.write_text(config.read_text().replace("top_k = 3", "top_k = 2", 1))
    extra = write_jsonl(tmp_path / "extra.jsonl", [{"id": "e1", "text": "the liver"}])
    refusals = [
        (dict(inputs=mixed_input, pipeline=pipeline_dir, input_format="text"), "read as jsonl, now as text"),
        (dict(inputs=[mixed_input, extra], pipeline=pipeline_dir), "inputs added"),
        (dict(inputs=mixed_input, pipeline=other_kb), "KB differ"),
        (dict(inputs=mixed_input, pipeline=other_config), "top_k 3 before, 2 now"),
        (dict(inputs=mixed_input, pipeline=pipeline_dir, format="docbin"), "output format jsonl before, docbin now"),
        (
            dict(inputs=mixed_input, pipeline=pipeline_dir, settings={"output.threshold": 0.5}),
            "output.threshold null before, 0.5 now",
        ),
    ]
    for args, what in refusals:
        options = {**run, **args}
        inputs, pipeline, settings = options.pop("inputs"), options.pop("pipeline"), options.pop("settings", CPU)
        with pytest.raises(AnnotateError, match="another job") as refused:
            annotate(inputs, pipeline, out, options, settings)
        assert what in str(refused.value) and "another output folder (out)" in str(refused.value)
        assert folder_state(out) == before  # refused before anything changed
    with mixed_input.open("a") as handle:
        handle.write(json.dumps({"id": "late", "text": "renal failure"}) + "\n")
    with pytest.raises(AnnotateError, match=r"mixed.jsonl changed \(size"):
        annotate(mixed_input, pipeline_dir, out, run, CPU)


def test_text_ids_do_not_depend_on_how_the_path_is_spelled(tmp_path, pipeline_dir, monkeypatch):
    folder = tmp_path / "texts"
    folder.mkdir()
    notes = folder / "notes.txt"
    notes.write_text("renal failure\nthe liver\n")
    (folder / "link.txt").symlink_to(notes)
    monkeypatch.chdir(folder)
    expected = [f"{notes.resolve()}:1", f"{notes.resolve()}:2"]
    for spelling in ("notes.txt", "./notes.txt", "../texts/notes.txt", str(notes), "link.txt"):
        assert [r.doc_id for r in read_records(spelling)] == expected
    out = tmp_path / "out"
    annotate("notes.txt", pipeline_dir, out, {"progress": False}, CPU)
    for spelling in ("../texts/./notes.txt", "link.txt"):
        summary = annotate(spelling, pipeline_dir, out, {"progress": False}, CPU)
        assert summary["documents_written"] == 2 and summary["this_run"]["documents_annotated"] == 0
    assert [d["id"] for d in jsonl_docs(out)] == expected


def test_output_of_an_earlier_version_without_a_job_record_is_refused(tmp_path, pipeline_dir, mixed_input):
    out = tmp_path / "out"
    annotate(mixed_input, pipeline_dir, out, dict(chunk_size=5, progress=False), CPU)
    (out / "job.json").unlink()
    with pytest.raises(AnnotateError, match="no job.json"):
        annotate(mixed_input, pipeline_dir, out, dict(chunk_size=5, progress=False), CPU)
    (out / "job.json").write_text("{broken")
    with pytest.raises(AnnotateError, match="job.json cannot be read"):
        annotate(mixed_input, pipeline_dir, out, dict(chunk_size=5, progress=False), CPU)


# -- one bad record never stops the job ---------------------------------------------------------------------------
def test_a_record_the_parser_cannot_take_is_an_error_and_the_job_goes_on(tmp_path, pipeline_dir):
    path = tmp_path / "in.jsonl"
    path.write_text(
        "\n".join(
            [
                json.dumps({"id": "a", "text": "renal failure"}),
                "[" * 100_000 + "]" * 100_000,
                '{"id": "deep", "x": ' + '{"a": ' * 50_000 + "1" + "}" * 50_000 + "}",
                '{"id": ' + "9" * 5000 + ', "text": "the liver"}',
                '{"id": "s", "text": "renal \\ud800 failure"}',
                json.dumps({"id": "b", "text": "the liver"}),
            ]
        )
        + "\n"
    )
    for _ in range(2):  # and a rerun does not die at the same place either
        summary = annotate(path, pipeline_dir, tmp_path / "out", {"progress": False}, CPU)
        assert (summary["documents_written"], summary["errors"]) == (2, 4)
    entries = [json.loads(line) for line in (tmp_path / "out" / "errors.jsonl").read_text().splitlines()]
    assert [(Path(e["file"]).name, e["line"]) for e in entries] == [("in.jsonl", n) for n in (2, 3, 4, 5)]
    assert "nested too deeply" in entries[0]["reason"] and "surrogate" in entries[3]["reason"]


def test_a_reader_that_fails_all_the_same_ends_only_its_file(tmp_path, pipeline_dir, monkeypatch):
    from spacy_genbioel.annotate import readers

    def broken(path, limits):
        yield InputRecord("t1", "renal failure", str(path), 1)
        raise KeyError("bug")

    monkeypatch.setitem(readers.READERS, "pubtator", broken)
    first = tmp_path / "a.pubtator"
    first.write_text("1|t|x\n")
    second = write_jsonl(tmp_path / "b.jsonl", [{"id": "j1", "text": "the liver"}])
    summary = annotate([first, second], pipeline_dir, tmp_path / "out", {"progress": False}, CPU)
    assert [d["id"] for d in jsonl_docs(tmp_path / "out")] == ["t1", "j1"] and summary["errors"] == 1
    entry = json.loads((tmp_path / "out" / "errors.jsonl").read_text())
    assert entry["line"] == 2 and "reader failed after line 1 (KeyError" in entry["reason"]


# -- format detection, odd values, odd line ends -----------------------------------------------------------------
def test_a_file_whose_format_cannot_be_told_is_refused(tmp_path, pipeline_dir):
    stray = tmp_path / "corpus.txt"
    stray.write_text("exported by tool X\n" + PUBTATOR)
    with pytest.raises(AnnotateError, match=r"line 2 looks like pubtator .*input format \(input_format"):
        detect_format(stray)
    with pytest.raises(AnnotateError, match=r"give the input format \(input_format: pubtator"):
        annotate(stray, pipeline_dir, tmp_path / "out", {"progress": False}, CPU)
    assert not (tmp_path / "out").exists()
    summary = annotate(stray, pipeline_dir, tmp_path / "out", dict(input_format="pubtator", progress=False), CPU)
    assert summary["documents_written"] == 3 and summary["errors"] == 3  # the stray line is one of them

    xml = '<?xml version="1.0"?>\n<PubmedArticleSet>\n' + "".join(
        pubmed_article(i, "renal failure", ["the liver"]) for i in range(1, 40)
    )
    packed = gzip.compress(xml.encode())
    cut = tmp_path / "cut.xml.gz"
    cut.write_bytes(packed[: len(packed) * 4 // 5])
    assert detect_format(cut) == "pubmed"  # what the cut file still gives is enough to tell
    records, errors = records_and_errors(read_records(cut))
    assert records and [r.doc_id for r in records] == [str(i) for i in range(1, len(records) + 1)]
    assert "cannot be read further" in errors[-1].reason
    cut.write_bytes(packed[:12])
    with pytest.raises(AnnotateError, match=r"cannot be read .*input format \(input_format\)"):
        detect_format(cut)
    corrupt = tmp_path / "corrupt.txt.gz"
    corrupt.write_bytes(packed[:10] + b"\xff" * 40 + packed[50:])
    with pytest.raises(AnnotateError, match=r"corrupt gzip data.*input format \(input_format\)"):
        detect_format(corrupt)
    prose = tmp_path / "prose.txt"
    prose.write_text("[Renal failure in mice].\nplain text\n")
    assert detect_format(prose) == "text"  # a title in brackets is not a BioC JSON list


@pytest.mark.parametrize("value", [[1, 2], {"a": 1}, True, False, 1.5, 7.0, float("nan"), float("inf")])
def test_jsonl_ids_that_are_not_strings_or_integers_are_errors(tmp_path, value):
    path = tmp_path / "in.jsonl"
    path.write_text(json.dumps({"id": "ok", "text": "x"}) + "\n" + json.dumps({"id": value, "text": "x"}) + "\n")
    records, errors = records_and_errors(read_records(path))
    assert [r.doc_id for r in records] == ["ok"]
    assert [(e.file, e.line) for e in errors] == [(str(path), 2)] and "not a string or an integer" in errors[0].reason


def test_a_bad_byte_costs_only_its_xml_record(tmp_path):
    arts = [pubmed_article(i, f"title {i}", ["renal failure"]) for i in (1, 2, 3)]
    data = ("<PubmedArticleSet>\n" + "".join(arts) + "</PubmedArticleSet>\n").encode()
    path = tmp_path / "pubmed.xml"
    path.write_bytes(data.replace(b"title 1", b"title \xff 1"))
    records, errors = records_and_errors(read_records(path))
    assert [r.doc_id for r in records] == ["2", "3"]
    assert [e.line for e in errors] == [2] and "byte 0xff on line 5" in errors[0].reason
    bioc = tmp_path / "c.xml"
    bioc.write_bytes(bioc_xml([("A", [(0, "one")]), ("B", [(0, "two")])]).encode().replace(b"one", b"o\xc3e"))
    records, errors = records_and_errors(read_records(bioc))
    assert [r.doc_id for r in records] == ["B"] and [e.line for e in errors] == [3]


def test_cr_only_line_ends(tmp_path):
    files = {
        "a.pubtator": (PUBTATOR.split("\n\nstray")[0] + "\n\n", ["100", "200"]),
        "b.jsonl": ("".join(json.dumps({"id": f"j{i}", "text": "x"}) + "\n" for i in range(3)), ["j0", "j1", "j2"]),
        "c.txt": ("one\ntwo\nthree\n", [1, 2, 3]),
        "d.bioc.jsonl": (
            "".join(json.dumps({"id": f"b{i}", "passages": [{"offset": 0, "text": "x"}]}) + "\n" for i in range(2)),
            ["b0", "b1"],
        ),
    }
    for name, (text, ids) in files.items():
        path = tmp_path / name
        path.write_bytes(text.replace("\n", "\r").encode())
        items = list(read_records(path))
        expected = [f"{path.resolve()}:{i}" for i in ids] if name.endswith(".txt") else ids
        assert [i.doc_id for i in items if isinstance(i, InputRecord)] == expected, name
        assert [i.line for i in items if isinstance(i, RecordError)] == ([9] if name == "a.pubtator" else []), name


# -- devices -------------------------------------------------------------------------------------------------------
@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_without_cuda_is_a_clear_error_and_leaves_no_folder(tmp_path, pipeline_dir, mixed_input):
    from typer.testing import CliRunner

    from spacy_genbioel.cli import app

    for device in ("cuda", "cuda:1", "nonsense"):
        with pytest.raises(AnnotateError, match=f"^device {device}: ") as refused:
            annotate(mixed_input, pipeline_dir, tmp_path / "out", {"progress": False}, {"device": device})
        assert refused.value.settings == ["device"] and not (tmp_path / "out").exists()
    result = CliRunner().invoke(
        app,
        [
            "annotate",
            str(mixed_input),
            "--pipeline",
            str(pipeline_dir),
            "--out",
            str(tmp_path / "out"),
            "--device",
            "cuda",
            "--no-progress",
        ],
    )
    assert result.exit_code == 1 and "--device cuda: " in result.output and "no CUDA device" in result.output
    assert not (tmp_path / "out").exists()


def test_a_pipeline_that_cannot_load_leaves_no_folder(tmp_path, pipeline_dir, mixed_input):
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(pipeline_dir, broken)
    (broken / "genbioel" / "cfg.json").write_text("{not json")
    with pytest.raises(AnnotateError, match="cannot be loaded"):
        annotate(mixed_input, broken, tmp_path / "out", {"progress": False}, CPU)
    assert not (tmp_path / "out").exists()


# -- parallel runs: what a resume keeps ----------------------------------------------------------------------------
def test_a_resumed_parallel_run_writes_what_one_process_on_one_thread_writes(
    tmp_path, pipeline_dir, mixed_input, monkeypatch
):
    from annotate_jobs import one_thread

    options = AnnotateOptions(chunk_size=4, batch_size=2, n_process=2, progress=False)
    serial = tmp_path / "serial"
    with one_thread():  # as each worker runs
        annotate(mixed_input, pipeline_dir, serial, dataclasses.replace(options, n_process=1))
    crash_on_call(monkeypatch, checkpoint.Checkpoint, "commit_file", 3)  # the parent fails committing its third unit
    out = tmp_path / "out"
    with pytest.raises(Crash):
        annotate(mixed_input, pipeline_dir, out, options)
    monkeypatch.undo()
    summary = annotate(mixed_input, pipeline_dir, out, options)
    assert summary["this_run"]["documents_resumed"] == 8
    # each chunk is one worker's unit, batches starting at the unit, on one torch thread: byte for byte
    assert chunk_files(out) == chunk_files(serial)
    assert (out / "checkpoint.jsonl").read_text() == (serial / "checkpoint.jsonl").read_text()
    assert stable(summary) == stable(json.loads((serial / "summary.json").read_text()))


def test_only_a_failure_to_write_the_output_stops_the_run(tmp_path, pipeline_dir, docs_200, reference, monkeypatch):
    import errno

    def full_disk(self, items, path):
        raise OSError(errno.ENOSPC, "No space left on device")

    out = tmp_path / "out"
    crash_on_call(monkeypatch, writers.JsonlWriter, "write", 3, before=full_disk)
    with pytest.raises(AnnotateError, match="cannot write the output .*No space left.*rerun the same command"):
        annotate([docs_200], pipeline_dir, out, RUN, CPU)
    monkeypatch.undo()
    annotate([docs_200], pipeline_dir, out, RUN, CPU)
    assert_same_as_reference(out, reference)


def test_the_record_cap_is_an_annotate_option_named_in_the_error(tmp_path, pipeline_dir):
    good = make_texts(2, seed=7)
    jsonl = tmp_path / "a.jsonl"
    big = json.dumps({"id": "big", "text": " ".join(["renal failure"] * 200)})
    jsonl.write_text(
        "\n".join([json.dumps({"id": "x1", "text": good[0]}), big, json.dumps({"id": "x2", "text": good[1]})]) + "\n"
    )
    options = AnnotateOptions(chunk_size=2, batch_size=2, progress=False, max_record_bytes=len(big) - 1)
    assert options.read_limits.max_line_bytes == len(big) - 1
    summary = annotate([jsonl], pipeline_dir, tmp_path / "out", options)
    assert (summary["documents_written"], summary["errors"]) == (2, 1)
    entry = json.loads((tmp_path / "out" / "errors.jsonl").read_text().splitlines()[0])
    assert entry["line"] == 2 and f"{len(big) - 1:,} bytes" in entry["reason"]
    with pytest.raises(AnnotateError, match="max_record_bytes"):
        AnnotateOptions(max_record_bytes=0)
