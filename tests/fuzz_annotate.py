"""Fuzz harness for ``annotate``: malformed inputs of every input format, job mix-ups
and a missing GPU, each run end to end through :func:`spacy_genbioel.annotate.annotate`
with a micro pipeline (a 1-layer BART, an entity ruler, a 30-concept KB).

A case passes when the run either refuses with the project's ``AnnotateError``
(where the case says it must or may) or finishes with every document accounted
for: each ID the case marks good is written exactly once, each line it marks bad
is in ``errors.jsonl`` with its file and line, ``documents_read`` = written +
skipped + errors, and every error entry names its file and a line or record.
Otherwise the case is a *crash* (another exception escaped), a *silent
acceptance* (a bad record not reported, a refusal that did not come, job
outputs mixed), *lost* (a good document neither written nor reported) or
*duplicated*.

As a script, against this tree or another one::

    python tests/fuzz_annotate.py --report [-v]
    PYTHONPATH=/tmp/before python tests/fuzz_annotate.py --report

The pytest module ``tests/annotate/test_fuzz_annotate.py`` runs the same cases.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import random
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Set, Tuple

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

CPU = {"device": "cpu"}  # the genbioel settings of the runs
PATTERNS = [("Disease", "renal failure"), ("Disease", "cystic fibrosis"), ("Chemical", "liver"), ("Disease", "!!")]
TEXTS = [
    "renal failure of the liver",
    "cystic fibrosis and renal failure",
    "the liver of patients",
    "chronic cystic fibrosis",
]


# -- the micro pipeline ---------------------------------------------------------------------------------------------
def build_pipeline(root: Path, model=None, tokenizer=None, seed: int = 0, num_beams: int = 3) -> Path:
    """entity_ruler + genbioel over a micro BART, saved as a spaCy pipeline directory ``root/nlp``."""
    import spacy
    import torch
    from conftest import MICRO, WORDS, random_kb

    import spacy_genbioel  # noqa: F401  (registers the factory)
    from spacy_genbioel.models import build_model, save_model, train_tokenizer

    if tokenizer is None:
        tokenizer = train_tokenizer([" ".join(WORDS)] * 5 + WORDS * 5, vocab_size=400, min_frequency=1)
    if model is None:
        torch.manual_seed(seed)
        model = build_model(MICRO, tokenizer, seed=seed, dropout=0.0).eval()
    save_model(model, tokenizer, root / "model")
    random_kb(1, n_concepts=30).to_jsonl(root / "kb.jsonl")
    nlp = spacy.blank("en")
    nlp.add_pipe("entity_ruler").add_patterns([{"label": label, "pattern": p} for label, p in PATTERNS])
    nlp.add_pipe(
        "genbioel",
        config={
            "model": str(root / "model"),
            "kb": str(root / "kb.jsonl"),
            "num_beams": num_beams,
            "top_k": 3,
            "device": "cpu",
        },
    )
    _ = nlp.get_pipe("genbioel").linker  # load now so that to_disk stores model, KB and trie
    nlp.to_disk(root / "nlp")
    return root / "nlp"


def edited_pipeline(source: Path, target: Path, old: str, new: str) -> Path:
    """A copy of a pipeline directory with one string of its config.cfg replaced."""
    shutil.copytree(source, target)
    config = target / "config.cfg"
    config.write_text(config.read_text(encoding="utf8").replace(old, new, 1), encoding="utf8")
    return target


@contextlib.contextmanager
def cached_pipelines() -> Iterator[None]:
    """``spacy.load`` loads each pipeline (path and config overrides) once while this lasts:
    the runs stay end to end, without a second of loading each."""
    import spacy

    original = spacy.load
    cache: Dict[Tuple[str, str], object] = {}

    def load(name, *args, **kwargs):
        key = (str(Path(name).resolve()), json.dumps(kwargs.get("config") or {}, sort_keys=True, default=str))
        if key not in cache:
            cache[key] = original(name, *args, **kwargs)
        return cache[key]

    spacy.load = load
    try:
        yield
    finally:
        spacy.load = original


# -- input makers ---------------------------------------------------------------------------------------------------
def jl(**record) -> str:
    return json.dumps(record)


def jsonl(*lines: str, end: str = "\n") -> bytes:
    return "".join(line + end for line in lines).encode("utf8")


def pubtator(*docs: Tuple[str, str, str], stray: Optional[str] = None, end: str = "\n") -> bytes:
    text = (stray + end) if stray is not None else ""
    for pmid, title, abstract in docs:
        text += f"{pmid}|t|{title}{end}{pmid}|a|{abstract}{end}{pmid}\t0\t5\tx\tDisease\tD1{end}{end}"
    return text.encode("utf8")


def pubmed_article(pmid, title, abstracts=(), book=False) -> str:
    sections = "".join(f'<AbstractText Label="L{i}">{a}</AbstractText>' for i, a in enumerate(abstracts))
    abstract = f"<Abstract>{sections}</Abstract>" if abstracts else ""
    if book:
        return (
            f'<PubmedBookArticle><BookDocument><PMID Version="1">{pmid}</PMID>'
            f"<Book><BookTitle>{title}</BookTitle></Book>"
            f"{abstract}</BookDocument></PubmedBookArticle>\n"
        )
    return (
        f'<PubmedArticle>\n<MedlineCitation Status="MEDLINE">\n<PMID Version="1">{pmid}</PMID>\n'
        f"<Article><ArticleTitle>{title}</ArticleTitle>{abstract}</Article>\n"
        f"<CommentsCorrectionsList><CommentsCorrections><PMID>1</PMID></CommentsCorrections></CommentsCorrectionsList>\n"
        f"</MedlineCitation>\n</PubmedArticle>\n"
    )


def pubmed(*records: str, doctype: str = "") -> str:
    return (
        f'<?xml version="1.0" encoding="utf-8"?>\n{doctype}<PubmedArticleSet>\n{"".join(records)}</PubmedArticleSet>\n'
    )


def bioc_xml(docs) -> str:
    parts = []
    for doc_id, passages in docs:
        ps = "".join(
            f'<passage><infon key="type">p</infon><offset>{o}</offset><text>{t}</text></passage>' for o, t in passages
        )
        parts.append(f"<document><id>{doc_id}</id>{ps}</document>\n")
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n<collection><source>test</source><date/><key/>\n'
        + "".join(parts)
        + "</collection>\n"
    )


def bioc_json_doc(doc_id, *texts, offsets=None) -> dict:
    offsets = offsets or [sum(len(t) + 1 for t in texts[:i]) for i in range(len(texts))]
    return {"id": doc_id, "passages": [{"offset": o, "text": t} for o, t in zip(offsets, texts)]}


def bulk(i: int) -> str:
    """Filler text for the many-document inputs: a few mentions, then none (fast to link)."""
    return TEXTS[i] if i < len(TEXTS) else f"plain words number {i} {'abc' * (i % 7)}"


def gz(data: bytes) -> bytes:
    return gzip.compress(data, mtime=0)


def corrupt_gz(data: bytes, at: float = 0.5) -> bytes:
    """Gzip with a run of bytes in the middle of the deflate stream overwritten."""
    packed = bytearray(gz(data))
    middle = int(len(packed) * at)
    packed[middle : middle + 16] = b"\xff" * 16
    return bytes(packed)


def line_of(data: bytes, needle: bytes) -> int:
    return data[: data.index(needle)].count(b"\n") + 1


def record_line(xml: bytes, pmid: int) -> int:
    """The line where the ``<PubmedArticle>`` of a PMID starts."""
    return line_of(xml, f'<PubmedArticle>\n<MedlineCitation Status="MEDLINE">\n<PMID Version="1">{pmid}<'.encode())


# -- cases ------------------------------------------------------------------------------------------------------------
@dataclass
class Case:
    """``files``: name -> bytes, in input order. ``good``: IDs that must be written (``@name:N`` is the
    text ID of line N of file ``name``); ``bad``: (file name, line) that must be in the errors file;
    ``refuse``: True when annotate must raise AnnotateError, None when it may; ``allowed``: when set,
    the only IDs that may be written."""

    name: str
    files: Dict[str, bytes]
    input_format: Optional[str] = None
    format: str = "jsonl"
    good: Set[str] = field(default_factory=set)
    bad: List[Tuple[str, int]] = field(default_factory=list)
    refuse: Optional[bool] = False
    allowed: Optional[Set[str]] = None
    min_errors: int = 0
    device: str = "cpu"


def _text_cases() -> List[Case]:
    big = "renal failure " + "x " * 600_000
    return [
        Case(
            "text/bad_utf8",
            {"notes.txt": b"renal failure\nthe \xff liver\ncystic fibrosis\n"},
            good={"@notes.txt:1", "@notes.txt:3"},
            bad=[("notes.txt", 2)],
        ),
        Case(
            "text/cr_only",
            {"notes.txt": b"renal failure\rthe liver\rcystic fibrosis\r"},
            good={"@notes.txt:1", "@notes.txt:2", "@notes.txt:3"},
        ),
        Case("text/crlf", {"notes.txt": b"renal failure\r\nthe liver\r\n"}, good={"@notes.txt:1", "@notes.txt:2"}),
        Case(
            "text/pubtator_after_a_stray_line",
            {"notes.txt": pubtator(("1", TEXTS[0], TEXTS[1]), ("2", TEXTS[2], ""), stray="stray line")},
            refuse=True,
        ),
        Case(
            "text/jsonl_after_a_stray_line",
            {"notes.txt": b"# exported\n" + jsonl(jl(id="a", text=TEXTS[0]), jl(id="b", text=TEXTS[1]))},
            refuse=True,
        ),
        Case(
            "text/control_and_emoji_lines",
            {"notes.txt": "\x00\x00\n\x01\x02 renal failure \x7f\n\U0001f600 !! \U0001f600\n\u2028\u0085\n".encode()},
        ),
        Case(
            "text/huge_line",
            {"notes.txt": ("the liver\n" + big + "\nrenal failure\n").encode()},
            good={"@notes.txt:1", "@notes.txt:3"},
            bad=[("notes.txt", 2)],
        ),
        Case("text/blank_lines", {"notes.txt": b"\r\n\r\n"}, bad=[("notes.txt", 1), ("notes.txt", 2)]),
        Case("text/empty_file", {"notes.txt": b""}),
        Case(
            "text/truncated_gz",
            {"notes.txt.gz": gz("".join(f"{bulk(i)}\n" for i in range(300)).encode())[:-40]},
            good={f"@notes.txt.gz:{i}" for i in range(1, 6)},
            min_errors=1,
        ),
    ]


def _jsonl_cases() -> List[Case]:
    good = [jl(id="a1", text=TEXTS[0]), jl(id="a2", text=TEXTS[1])]
    many = jsonl(*[jl(id=f"g{i}", text=bulk(i)) for i in range(400)])
    bad_ids = [
        '{"id": [1, 2], "text": "the liver"}',
        '{"id": {"a": 1}, "text": "the liver"}',
        '{"id": true, "text": "the liver"}',
        '{"id": 1.5, "text": "the liver"}',
        '{"id": NaN, "text": "the liver"}',
        '{"id": Infinity, "text": "the liver"}',
        '{"id": 7.0, "text": "the liver"}',
        '{"pmid": false, "text": "the liver"}',
        '{"id": ' + "9" * 5000 + ', "text": "x"}',
    ]
    return [
        Case(
            "jsonl/deep_list",
            {"in.jsonl": jsonl(good[0], "[" * 100_000 + "]" * 100_000, good[1])},
            good={"a1", "a2"},
            bad=[("in.jsonl", 2)],
        ),
        Case(
            "jsonl/deep_object",
            {"in.jsonl": jsonl(good[0], '{"id": "x", "m": ' + '{"a": ' * 50_000 + "1" + "}" * 50_000 + "}", good[1])},
            good={"a1", "a2"},
            bad=[("in.jsonl", 2)],
        ),
        Case(
            "jsonl/id_types",
            {"in.jsonl": jsonl(good[0], *bad_ids, jl(id=42, text=TEXTS[2]), good[1])},
            good={"a1", "a2", "42"},
            bad=[("in.jsonl", n) for n in range(2, 2 + len(bad_ids))],
        ),
        Case(
            "jsonl/lone_surrogate",
            {
                "in.jsonl": jsonl(
                    good[0],
                    '{"id": "s1", "text": "renal \\ud800 failure"}',
                    '{"id": "s\\udc00", "text": "the liver"}',
                    good[1],
                )
            },
            good={"a1", "a2"},
            bad=[("in.jsonl", 2), ("in.jsonl", 3)],
        ),
        Case(
            "jsonl/lone_surrogate_docbin",
            {"in.jsonl": jsonl(good[0], '{"id": "s1", "text": "renal \\ud800 failure"}', good[1])},
            format="docbin",
            good={"a1", "a2"},
            bad=[("in.jsonl", 2)],
        ),
        Case(
            "jsonl/bad_utf8",
            {"in.jsonl": jsonl(good[0]) + b'{"id": "u1", "text": "caf\xe9"}\n' + jsonl(good[1])},
            good={"a1", "a2"},
            bad=[("in.jsonl", 2)],
        ),
        Case(
            "jsonl/wrong_types",
            {
                "in.jsonl": jsonl(
                    good[0],
                    '{"id": "w1", "title": 5}',
                    '{"id": "w2", "text": null}',
                    '{"id": "w3", "abstract": ["x"]}',
                    '{"id": "w4", "text": {"a": 1}}',
                    good[1],
                )
            },
            good={"a1", "a2"},
            bad=[("in.jsonl", n) for n in (2, 3, 4, 5)],
        ),
        Case(
            "jsonl/not_objects",
            {"in.jsonl": jsonl("5", '"text"', "null", "[]", "true", good[0])},
            good={"a1"},
            bad=[("in.jsonl", n) for n in range(1, 6)],
        ),
        Case(
            "jsonl/trailing_garbage", {"in.jsonl": jsonl(good[0] + " xyz", good[1])}, good={"a2"}, bad=[("in.jsonl", 1)]
        ),
        Case(
            "jsonl/cr_only", {"in.jsonl": jsonl(*good, jl(id="a3", text=TEXTS[2]), end="\r")}, good={"a1", "a2", "a3"}
        ),
        Case("jsonl/bom_crlf", {"in.jsonl": b"\xef\xbb\xbf" + jsonl(*good, end="\r\n")}, good={"a1", "a2"}),
        Case("jsonl/truncated_gz", {"in.jsonl.gz": gz(many)[:-30]}, good={f"g{i}" for i in range(5)}, min_errors=1),
        Case("jsonl/corrupt_gz", {"in.jsonl.gz": corrupt_gz(many)}, good={"g0", "g1"}, min_errors=1),
        Case(
            "jsonl/huge_document",
            {"in.jsonl": jsonl(good[0], jl(id="big", text="the liver " * 120_000), good[1])},
            good={"a1", "a2"},
            bad=[("in.jsonl", 2)],
        ),
        Case(
            "jsonl/empty_and_blank_texts",
            {
                "in.jsonl": jsonl(
                    jl(id="e1", text=""), jl(id="e2", text=" \t "), jl(id="e3", title="", abstract=""), good[0]
                )
            },
            good={"a1"},
            bad=[("in.jsonl", 1), ("in.jsonl", 2), ("in.jsonl", 3)],
        ),
        Case(
            "jsonl/odd_ids",
            {
                "in.jsonl": jsonl(
                    jl(id="x" * 50_000, text=TEXTS[0]),
                    jl(id=10**30, text=TEXTS[1]),
                    jl(id=-5, text=TEXTS[2]),
                    jl(id=" pad ", text=TEXTS[3]),
                )
            },
            good={"x" * 50_000, str(10**30), "-5", "pad"},
        ),
        Case(
            "jsonl/pipe_in_id_as_pubtator",
            {"in.jsonl": jsonl(jl(id="a|b", text=TEXTS[0]), jl(id="c\nd", text=TEXTS[1]), good[0])},
            format="pubtator",
            good={"a1"},
            bad=[("in.jsonl", 1), ("in.jsonl", 2)],
        ),
        Case(
            "jsonl/duplicate_id",
            {"in.jsonl": jsonl(good[0], good[0], good[1])},
            good={"a1", "a2"},
            bad=[("in.jsonl", 2)],
        ),
        Case("jsonl/empty_file", {"in.jsonl": b""}),
        Case("jsonl/blank_lines_only", {"in.jsonl": b"\n \n\t\n"}),
    ] + [
        Case(
            f"jsonl/control_characters_as_{fmt}",
            {
                "in.jsonl": jsonl(
                    jl(id="c1", text="renal failure \x00\x01\x0b\x0c\x1c\x7f the liver"),
                    jl(id="c2", title="cystic\x85fibrosis\u2028x", abstract="\r!!\t"),
                    good[0],
                )
            },
            format=fmt,
            good={"a1"},
        )
        for fmt in ("jsonl", "pubtator", "bioc", "docbin")
    ]


def _pubtator_cases() -> List[Case]:
    docs = (("11", TEXTS[0], TEXTS[1]), ("12", TEXTS[2], TEXTS[3]), ("13", "cystic fibrosis", ""))
    ids = {"11", "12", "13"}
    plain = pubtator(*docs)
    bad_title = plain.replace(b"12|t|the liver", b"12|t|the \xfe liver")
    many = pubtator(*[(str(100 + i), bulk(i), bulk(i + 1)) for i in range(200)])
    return [
        Case("pubtator/stray_first_line_detected", {"corpus.txt": pubtator(*docs, stray="stray line")}, refuse=True),
        Case(
            "pubtator/stray_first_line_given",
            {"corpus.txt": pubtator(*docs, stray="stray line")},
            input_format="pubtator",
            good=ids,
            bad=[("corpus.txt", 1)],
        ),
        Case(
            "pubtator/stray_first_line_suffix",
            {"corpus.pubtator": pubtator(*docs, stray="stray line")},
            good=ids,
            bad=[("corpus.pubtator", 1)],
        ),
        Case("pubtator/cr_only", {"corpus.txt": pubtator(*docs, end="\r")}, good=ids),
        Case("pubtator/crlf", {"corpus.txt": pubtator(*docs, end="\r\n")}, good=ids),
        Case(
            "pubtator/bad_utf8_title",
            {"corpus.txt": bad_title},
            good={"11", "13"},
            bad=[("corpus.txt", line_of(bad_title, b"12|t|"))],
        ),
        Case(
            "pubtator/truncated_gz",
            {"corpus.txt.gz": gz(many)[:-30]},
            good={str(100 + i) for i in range(5)},
            min_errors=1,
        ),
        Case("pubtator/corrupt_gz", {"corpus.txt.gz": corrupt_gz(many)}, good={"100"}, min_errors=1),
        Case(
            "pubtator/no_pmid",
            {"corpus.pubtator": b"|t|title\n|a|abstract\n\n" + plain},
            good=ids,
            bad=[("corpus.pubtator", 1)],
        ),
        Case("pubtator/odd_mention_lines", {"corpus.txt": plain.replace(b"\t0\t5\t", b"\t154.0\tabc\t")}, good=ids),
        Case(
            "pubtator/control_characters_as_pubtator",
            {"corpus.txt": pubtator(("21", "renal\x0b\x0cfailure\x1c", "the \x85 liver"), *docs)},
            format="pubtator",
            good=ids,
        ),
    ]


def _xml_cases() -> List[Case]:
    arts = [
        pubmed_article(31, TEXTS[0], [TEXTS[1]]),
        pubmed_article(32, TEXTS[2], [TEXTS[3], "more"]),
        pubmed_article(33, "A book", ["x"], book=True),
    ]
    xml = pubmed(*arts).encode()
    first_bad = pubmed(arts[0].replace("renal failure", "renal \udcff failure"), *arts[1:]).encode(
        "utf8", "surrogateescape"
    )
    laughs = (
        '<!DOCTYPE PubmedArticleSet [<!ENTITY lol "lol"><!ENTITY lol2 "&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;">]>\n'
    )
    many = pubmed(*[pubmed_article(1000 + i, bulk(i), [bulk(i + 1)]) for i in range(300)]).encode()
    bomb = pubmed(arts[0].replace("renal", "&lol2; renal"), *arts[1:], doctype=laughs).encode()
    huge = pubmed(arts[0], pubmed_article(35, "big", ["the liver " * 120_000]), arts[1]).encode()
    deep = pubmed_article(34, "<i>" * 50_000 + "renal failure" + "</i>" * 50_000)
    docs = [("b1", [(0, TEXTS[0]), (len(TEXTS[0]) + 1, TEXTS[1])]), ("b2", [(0, TEXTS[2])]), ("b3", [(0, TEXTS[3])])]
    bioc = bioc_xml(docs).encode()
    bioc_bad = bioc.replace(b"<text>the liver", b"<text>the \xc3 liver")
    jdocs = [bioc_json_doc("j1", TEXTS[0], TEXTS[1]), bioc_json_doc("j2", TEXTS[2])]
    return [
        Case(
            "pubmed/bad_byte_in_first_record",
            {"pubmed.xml": first_bad},
            good={"32", "33"},
            bad=[("pubmed.xml", record_line(first_bad, 31))],
        ),
        Case(
            "pubmed/truncated_xml_gz",
            {"pubmed.xml.gz": gz(xml)[: len(gz(xml)) * 2 // 3]},
            refuse=None,
            allowed={"31", "32", "33"},
            min_errors=1,
        ),
        Case(
            "pubmed/truncated_big_xml_gz",
            {"pubmed.xml.gz": gz(many)[:-200]},
            refuse=None,
            allowed={str(1000 + i) for i in range(300)},
            min_errors=1,
        ),
        Case(
            "pubmed/corrupt_gz",
            {"pubmed.xml.gz": corrupt_gz(many, 0.7)},
            input_format="pubmed",
            good={"1000", "1001"},
            min_errors=1,
        ),
        Case(
            "pubmed/undefined_entity",
            {"pubmed.xml": pubmed(arts[0].replace("renal", "&nope; renal"), *arts[1:]).encode()},
            good={"32", "33"},
            bad=[("pubmed.xml", record_line(xml, 31))],
        ),
        Case(
            "pubmed/entity_bomb", {"pubmed.xml": bomb}, good={"32", "33"}, bad=[("pubmed.xml", record_line(bomb, 31))]
        ),
        Case(
            "pubmed/nul_byte",
            {"pubmed.xml": xml.replace(b"chronic cystic", b"chronic \x00 cystic")},
            good={"31", "33"},
            bad=[("pubmed.xml", record_line(xml, 32))],
        ),
        Case("pubmed/cr_only", {"pubmed.xml": xml.replace(b"\n", b"\r")}, good={"31", "32", "33"}),
        Case("pubmed/deep_markup", {"pubmed.xml": pubmed(arts[0], deep).encode()}, good={"31"}),
        Case(
            "pubmed/huge_abstract", {"pubmed.xml": huge}, good={"31", "32"}, bad=[("pubmed.xml", record_line(huge, 35))]
        ),
        Case("bioc/bad_byte", {"collection.xml": bioc_bad}, good={"b1", "b3"}, bad=[("collection.xml", 4)]),
        Case(
            "bioc/huge_offset",
            {"collection.xml": bioc_xml([("h1", [(0, "x"), (10**13, "renal failure")])] + docs).encode()},
            good={"b1", "b2", "b3"},
            bad=[("collection.xml", 3)],
        ),
        Case(
            "bioc/huge_offset_json",
            {
                "c.bioc.jsonl": jsonl(
                    json.dumps(bioc_json_doc("h1", "x", "y", offsets=[0, 10**20])), *map(json.dumps, jdocs)
                )
            },
            good={"j1", "j2"},
            bad=[("c.bioc.jsonl", 1)],
        ),
        Case(
            "bioc/no_id",
            {"collection.xml": bioc_xml([("", [(0, TEXTS[0])])] + docs).encode()},
            good={"b1", "b2", "b3"},
            bad=[("collection.xml", 3)],
        ),
        Case(
            "bioc/json_deep_collection",
            {"c.json": b'{"documents": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"},
            bad=[("c.json", 1)],
        ),
        Case(
            "bioc/json_id_types",
            {
                "c.bioc.jsonl": jsonl(
                    *map(json.dumps, jdocs),
                    '{"id": ["x"], "passages": [{"offset": 0, "text": "t"}]}',
                    '{"id": 2.5, "passages": [{"offset": 0, "text": "t"}]}',
                )
            },
            good={"j1", "j2"},
            bad=[("c.bioc.jsonl", 3), ("c.bioc.jsonl", 4)],
        ),
        Case(
            "bioc/json_wrong_types",
            {
                "c.bioc.jsonl": jsonl(
                    *map(json.dumps, jdocs),
                    '{"id": "w1", "passages": {"a": 1}}',
                    '{"id": "w2", "passages": [{"offset": 0, "text": 5}, {"offset": 3, "text": "x"}]}',
                    '{"id": "w3", "passages": [5]}',
                )
            },
            good={"j1", "j2"},
            bad=[("c.bioc.jsonl", n) for n in (3, 4, 5)],
        ),
        Case("bioc/json_cr_only", {"c.bioc.jsonl": jsonl(*map(json.dumps, jdocs), end="\r")}, good={"j1", "j2"}),
        Case(
            "bioc/truncated_gz",
            {"collection.xml.gz": gz(bioc)[:-25]},
            refuse=None,
            allowed={"b1", "b2", "b3"},
            min_errors=1,
        ),
    ]


def cases() -> List[Case]:
    """The curated malformed inputs, every input format."""
    import torch

    device = (
        []
        if torch.cuda.is_available()
        else [
            Case("device/cuda_without_cuda", {"in.jsonl": jsonl(jl(id="a", text=TEXTS[0]))}, device="cuda", refuse=True)
        ]
    )
    return _text_cases() + _jsonl_cases() + _pubtator_cases() + _xml_cases() + device


# -- random damage -----------------------------------------------------------------------------------------------------
def samples() -> Dict[str, bytes]:
    """One valid input per format, to be damaged by :func:`mutate`."""
    arts = [pubmed_article(40 + i, TEXTS[i % 4], [TEXTS[(i + 1) % 4]]) for i in range(4)]
    return {
        "in.jsonl": jsonl(*[jl(id=f"m{i}", text=f"{TEXTS[i % 4]} {i}") for i in range(6)]),
        "corpus.pubtator": pubtator(*[(str(50 + i), TEXTS[i % 4], TEXTS[(i + 2) % 4]) for i in range(4)]),
        "notes.txt": "".join(f"{TEXTS[i % 4]} {i}\n" for i in range(6)).encode(),
        "pubmed.xml": pubmed(*arts).encode(),
        "collection.xml": bioc_xml(
            [(f"c{i}", [(0, TEXTS[i % 4]), (40, TEXTS[(i + 1) % 4])]) for i in range(4)]
        ).encode(),
        "c.bioc.jsonl": jsonl(
            *[json.dumps(bioc_json_doc(f"k{i}", TEXTS[i % 4], TEXTS[(i + 1) % 4])) for i in range(4)]
        ),
    }


def mutate(data: bytes, rng: random.Random) -> bytes:
    """One to three random injuries: flipped, inserted or deleted bytes, a cut, bad UTF-8,
    control characters, CR line ends, deep nesting, a huge run, gzip (maybe cut)."""
    out = bytearray(data)
    for _ in range(rng.randint(1, 3)):
        kind = rng.randrange(9)
        at = rng.randrange(len(out) + 1)
        if kind == 0 and out:
            out[min(at, len(out) - 1)] = rng.randrange(256)
        elif kind == 1:
            out[at:at] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
        elif kind == 2:
            del out[at : at + rng.randint(1, 40)]
        elif kind == 3:
            del out[at:]
        elif kind == 4:
            out[at:at] = rng.choice([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\x00", b"\x0b\x1c\x85", "\u2028".encode()])
        elif kind == 5:
            out = bytearray(bytes(out).replace(b"\n", b"\r"))
        elif kind == 6:
            depth = rng.choice([10, 5_000, 60_000])
            out[at:at] = rng.choice([b"[", b'{"a":', b"<i>"]) * depth
        elif kind == 7:
            out[at:at] = rng.choice([b"renal failure ", b"x", b"\t"]) * rng.choice([100, 30_000])
        else:
            packed = gz(bytes(out))
            return packed[: rng.randint(10, len(packed))] if rng.random() < 0.7 else packed
    return bytes(out)


def mutated_cases(seed: int = 0, per_format: int = 3) -> List[Case]:
    """Damaged samples with no expectation beyond accounting: no crash, nothing lost or duplicated."""
    rng = random.Random(seed)
    result = []
    for name, data in samples().items():
        for i in range(per_format):
            damaged = mutate(data, rng)
            file = name + ".gz" if damaged[:2] == b"\x1f\x8b" else name
            result.append(Case(f"mutated/{name}/{i}", {file: damaged}, refuse=None))
    return result


def check_reader(path: Path, input_format: Optional[str]) -> Tuple[str, str]:
    """Read one file with the annotate readers (``input_format`` None: detected): every item must be a
    record or an error naming the file and a line or record; only AnnotateError may be raised."""
    from spacy_genbioel.annotate import AnnotateError, InputRecord, RecordError, read_records

    try:
        items = list(read_records(path, input_format))
    except AnnotateError as err:
        return "ok", f"refused: {str(err)[:100]}"
    except BaseException as err:  # noqa: BLE001
        return "crash", f"{type(err).__name__}: {str(err)[:200]}"
    for item in items:
        if isinstance(item, RecordError):
            if item.file != str(path) or (item.line is None and item.record is None) or not item.reason:
                return "unlocated", repr(item)[:200]
        elif not isinstance(item, InputRecord) or not item.doc_id or not item.text.strip():
            return "silent", f"not a usable record: {repr(item)[:200]}"
    return "ok", f"{len(items)} items"


def reader_fuzz(work: Path, seed: int = 0, n: int = 600) -> Dict[str, int]:
    """``n`` damaged samples, each read as detected and as every input format."""
    from spacy_genbioel.annotate import INPUT_FORMATS

    rng = random.Random(seed)
    counts: Dict[str, int] = {}
    items = sorted(samples().items())
    for i in range(n):
        name, data = items[i % len(items)]
        path = work / f"r{i}_{name}"
        path.write_bytes(mutate(data, rng))
        for fmt in (None, *INPUT_FORMATS):
            outcome, detail = check_reader(path, fmt)
            counts[outcome] = counts.get(outcome, 0) + 1
            if outcome != "ok":
                print(f"{outcome:>10}  reader/{path.name}/{fmt}: {detail}")
        path.unlink()
    return counts


# -- running a case ----------------------------------------------------------------------------------------------------
def resolve_ids(ids: Set[str], folder: Path) -> Set[str]:
    """``@name:N`` -> the text ID of line N of ``folder/name`` (its resolved path)."""
    return {
        f"{(folder / i[1:].rsplit(':', 1)[0]).resolve()}:{i.rsplit(':', 1)[1]}" if i.startswith("@") else i for i in ids
    }


def written_ids(out: Path, format: str) -> List[str]:
    """The document IDs of an output folder's chunks, in order (read with the project's readers)."""
    ids: List[str] = []
    for part in sorted(out.glob("part-*")):
        if format == "jsonl":
            ids.extend(json.loads(line)["id"] for line in part.read_text(encoding="utf8").split("\n") if line.strip())
        elif format == "docbin":
            import spacy
            from spacy.tokens import DocBin

            ids.extend(d.user_data["doc_id"] for d in DocBin().from_disk(part).get_docs(spacy.blank("en").vocab))
        else:
            from spacy_genbioel.corpus import read_bioc, read_pubtator

            reader = read_pubtator if format == "pubtator" else read_bioc
            ids.extend(d.pmid for d in reader(part, check_offsets=False))
    return ids


def run_case(case: Case, pipeline_dir: Path, work: Path) -> Tuple[str, str]:
    """(outcome, detail): ok, crash, silent, lost, duplicated or unlocated."""
    from spacy_genbioel.annotate import AnnotateError, annotate

    folder = work / "in"
    folder.mkdir(parents=True)
    paths = []
    for name, data in case.files.items():
        (folder / name).write_bytes(data)
        paths.append((folder / name).resolve())
    out = work / "out"
    try:
        summary = annotate(
            paths,
            pipeline_dir,
            out,
            dict(format=case.format, input_format=case.input_format, chunk_size=4, batch_size=4, progress=False),
            {"device": case.device},
        )
    except AnnotateError as err:
        if case.refuse is False:
            return "refused", f"the whole run refused: {err}"
        if case.name.startswith("device/") and out.exists():
            return "silent", f"refused but left {sorted(p.name for p in out.iterdir())} in the output folder"
        return "ok", f"refused: {str(err)[:150]}"
    except BaseException as err:  # noqa: BLE001  (what the fuzzer is after)
        return "crash", f"{type(err).__name__}: {str(err)[:200]}"
    if case.refuse:
        return "silent", "accepted where a refusal was due"
    try:
        ids = written_ids(out, case.format)
    except Exception as err:  # noqa: BLE001
        return "crash", f"output unreadable: {type(err).__name__}: {err}"
    errors = [
        json.loads(line) for line in (out / "errors.jsonl").read_text(encoding="utf8").splitlines() if line.strip()
    ]
    located = {(Path(e["file"]).name, e.get("line")) for e in errors}
    if any(not e.get("file") or (e.get("line") is None and e.get("record") is None) for e in errors):
        return "unlocated", f"an error entry without file and line: {errors}"
    if len(ids) != len(set(ids)):
        return "duplicated", f"{len(ids) - len(set(ids))} documents written twice"
    if summary["documents_read"] != summary["documents_written"] + summary["documents_skipped"] + summary["errors"]:
        return "lost", f"accounting: {summary}"
    good = resolve_ids(case.good, folder)
    missing = good - set(ids)
    if missing:
        return "lost", f"not written: {sorted(missing)[:5]}"
    unreported = [b for b in case.bad if b not in located]
    if unreported:
        return "silent", f"not in the errors file: {unreported}; written: {len(ids)}, errors: {sorted(located)[:6]}"
    if case.allowed is not None and set(ids) - resolve_ids(case.allowed, folder):
        return "silent", f"written but not documents of the input: {sorted(set(ids) - case.allowed)[:3]}"
    if len(errors) < case.min_errors:
        return "silent", f"expected at least {case.min_errors} error entries, got {len(errors)}"
    return "ok", f"{len(ids)} written, {len(errors)} errors"


# -- job identity ------------------------------------------------------------------------------------------------------
def job_scenarios(
    pipeline_dir: Path, other_model: Path, other_config: Path
) -> List[Tuple[str, Callable[[Path], Tuple[str, str]]]]:
    """(name, run): a first annotate run, then a second one into the same output folder that must be
    refused (another job) or must resume without duplicating anything (the same job)."""
    from spacy_genbioel.annotate import AnnotateError, annotate

    run = dict(chunk_size=4, batch_size=4, progress=False)  # options; "settings": the genbioel settings (default: CPU)

    def two_runs(first: dict, second: dict, must_refuse: bool, make: Callable[[Path], None] = lambda w: None):
        def scenario(work: Path) -> Tuple[str, str]:
            folder = work / "in"
            (folder / "sub").mkdir(parents=True)
            (folder / "a.jsonl").write_bytes(jsonl(*[jl(id=f"a{i}", text=TEXTS[i % 4]) for i in range(5)]))
            (folder / "b.jsonl").write_bytes(jsonl(*[jl(id=f"b{i}", text=TEXTS[i % 4]) for i in range(3)]))
            (folder / "notes.txt").write_bytes("".join(f"{TEXTS[i % 4]}\n" for i in range(6)).encode())
            make(folder)
            out = work / "out"

            def resolve(d: dict) -> dict:
                return {**run, **d, "inputs": [folder / p if not Path(p).is_absolute() else p for p in d["inputs"]]}

            try:
                annotate(*job_args(resolve(first), out))
                if "then" in second:
                    second["then"](folder)
                summary = annotate(*job_args(resolve({k: v for k, v in second.items() if k != "then"}), out))
            except AnnotateError as err:
                return (
                    ("ok", f"refused: {str(err)[:160]}") if must_refuse else ("refused", f"the same job refused: {err}")
                )
            except BaseException as err:  # noqa: BLE001
                return "crash", f"{type(err).__name__}: {err}"
            if must_refuse:
                return "silent", f"mixed into one output: {summary['documents_written']} documents"
            ids = written_ids(out, "jsonl")
            if len(ids) != len(set(ids)) or summary["this_run"]["documents_annotated"]:
                return "duplicated", f"{len(ids)} documents written, {len(set(ids))} distinct"
            return "ok", f"resumed: {len(ids)} documents"

        return scenario

    def job_args(args: dict, out: Path) -> tuple:
        """annotate()'s arguments: inputs, pipeline, out, options (the rest), settings."""
        options = dict(args)
        inputs, pipeline, settings = (
            options.pop("inputs"),
            options.pop("pipeline", pipeline_dir),
            options.pop("settings", CPU),
        )
        return inputs, pipeline, out, options, settings

    def append_line(folder: Path) -> None:
        with (folder / "a.jsonl").open("a") as handle:
            handle.write(jl(id="a99", text=TEXTS[0]) + "\n")

    return [
        ("job/same_job_again", two_runs({"inputs": ["a.jsonl"]}, {"inputs": ["a.jsonl"]}, False)),
        (
            "job/same_text_file_other_spelling",
            two_runs({"inputs": ["notes.txt"]}, {"inputs": ["sub/../notes.txt"]}, False),
        ),
        (
            "job/same_text_file_through_a_link",
            two_runs(
                {"inputs": ["notes.txt"]},
                {"inputs": ["link.txt"]},
                False,
                make=lambda f: (f / "link.txt").symlink_to(f / "notes.txt"),
            ),
        ),
        (
            "job/other_input_format",
            two_runs({"inputs": ["a.jsonl"]}, {"inputs": ["a.jsonl"], "input_format": "text"}, True),
        ),
        ("job/input_added", two_runs({"inputs": ["a.jsonl"]}, {"inputs": ["a.jsonl", "b.jsonl"]}, True)),
        ("job/input_changed", two_runs({"inputs": ["a.jsonl"]}, {"inputs": ["a.jsonl"], "then": append_line}, True)),
        (
            "job/other_model_same_kb",
            two_runs({"inputs": ["a.jsonl"]}, {"inputs": ["a.jsonl"], "pipeline": other_model}, True),
        ),
        (
            "job/other_component_config",
            two_runs({"inputs": ["a.jsonl"]}, {"inputs": ["a.jsonl"], "pipeline": other_config}, True),
        ),
        (
            "job/other_output_format",
            two_runs({"inputs": ["a.jsonl"]}, {"inputs": ["a.jsonl"], "format": "pubtator"}, True),
        ),
        (
            "job/other_setting",
            two_runs({"inputs": ["a.jsonl"]}, {"inputs": ["a.jsonl"], "settings": {"output.threshold": 0.5}}, True),
        ),
        (
            "job/other_device_and_decoding_batch",
            two_runs(
                {"inputs": ["a.jsonl"]},
                {"inputs": ["a.jsonl"], "settings": {"device": "auto", "decoding.batch_size": 2}},
                False,
            ),
        ),
    ]


# -- reliability: where a job writes, read-only output, kills (issue 31) -----------------------------------------------
def reliability_scenarios(pipeline_dir: Path) -> List[Tuple[str, Callable[[Path], Tuple[str, str]]]]:
    """(name, run): output folders where writing changes the job (refused), read-only output (refused
    unless the job is done there), and runs killed from outside, their parent or one worker (nothing
    lost or duplicated, no worker outliving its parent, no run hanging on a dead worker). Outcomes as
    the cases', plus ``stray`` (a worker outlived its parent), ``hung`` (a run waited on a dead worker)
    and ``skipped`` (no read-only mount can be made here)."""
    from annotate_jobs import job_input, killed_run, read_only_call

    from spacy_genbioel.annotate import AnnotateError, annotate

    run = dict(chunk_size=6, batch_size=4, progress=False)

    def folder_of(work: Path, n: int = 8) -> Path:
        folder = work / "in"
        folder.mkdir(parents=True)
        job_input(folder / "docs.jsonl", n=n)
        return folder

    def refused(make: Callable[[Path], Tuple[list, Path, dict]]) -> Callable[[Path], Tuple[str, str]]:
        def scenario(work: Path) -> Tuple[str, str]:
            inputs, out, options = make(work)
            files = lambda: sorted(str(p) for folder in (work, pipeline_dir) for p in folder.rglob("*"))  # noqa: E731
            before = files()
            try:
                summary = annotate(inputs, pipeline_dir, out, {**run, **options}, CPU)
            except AnnotateError as err:
                return (
                    ("silent", "refused, but files were written first")
                    if files() != before
                    else ("ok", f"refused: {str(err)[:120]}")
                )
            except BaseException as err:  # noqa: BLE001
                return "crash", f"{type(err).__name__}: {err}"
            finally:
                if pipeline_dir in out.parents:  # the pipeline is shared by the other cases
                    shutil.rmtree(out, ignore_errors=True)
            return (
                "silent",
                f"accepted: {summary['documents_written']} documents written where the job cannot be resumed",
            )

        return scenario

    def read_only(case: str) -> Callable[[Path], Tuple[str, str]]:
        def scenario(work: Path) -> Tuple[str, str]:
            work.mkdir(parents=True)
            docs = job_input(work / "docs.jsonl", n=8)
            out, errors = work / "out", work / "errors"
            errors.mkdir(parents=True)
            if case in ("finished", "unfinished"):
                annotate([docs], pipeline_dir, out, run, CPU)
                if case == "unfinished":
                    (out / "summary.json").unlink()
            else:
                out.mkdir()
            target = work / "o2" if case == "errors_file" else out
            options = {**run, "errors_path": errors / "e.jsonl"} if case == "errors_file" else run
            kind, value = read_only_call(
                [errors if case == "errors_file" else out],
                lambda: annotate([docs], pipeline_dir, target, options, CPU)["documents_written"],
            )
            if kind == "unavailable":
                return "skipped", f"no read-only mount here ({value})"
            if kind == "raised":
                if value[0] != "AnnotateError":
                    return "crash", f"{value[0]}: {value[1][:200]}"
                return (
                    ("refused", f"the finished job refused: {value[1]}")
                    if case == "finished"
                    else ("ok", f"refused: {value[1][:120]}")
                )
            if case != "finished":
                return "silent", f"accepted on a read-only folder: {value}"
            return ("ok", "finished: nothing to do") if value == 8 else ("lost", f"{value} documents")

        return scenario

    def killed(target: str, n_process: int) -> Callable[[Path], Tuple[str, str]]:
        def scenario(work: Path) -> Tuple[str, str]:
            work.mkdir(parents=True)
            docs, out, options = job_input(work / "docs.jsonl", n=60), work / "out", {**run, "n_process": n_process}
            report = killed_run(
                lambda: annotate([docs], pipeline_dir, out, options, CPU), out, target, random.Random(n_process)
            )
            if report["strays"]:
                return "stray", f"{len(report['strays'])} workers outlived their killed parent"
            if report["hung"]:
                return "hung", "the run waited on its dead worker"
            try:
                annotate([docs], pipeline_dir, out, options, CPU)
            except AnnotateError as err:
                return "refused", f"the rerun was refused: {err}"
            except BaseException as err:  # noqa: BLE001
                return "crash", f"{type(err).__name__}: {err}"
            ids = written_ids(out, "jsonl")
            if len(ids) != len(set(ids)):
                return "duplicated", f"{len(ids) - len(set(ids))} documents written twice"
            missing = {f"d{i}" for i in range(60)} - set(ids)
            if missing:
                return "lost", f"{len(missing)} documents never written"
            return (
                "ok",
                f"killed {report['killed']} with {report['committed']} chunks committed; 60 documents after the rerun",
            )

        return scenario

    return [
        ("place/out_is_the_input_folder", refused(lambda w: ([folder_of(w)], w / "in", {}))),
        ("place/out_in_the_pipeline_folder", refused(lambda w: ([folder_of(w)], pipeline_dir / "annotated", {}))),
        (
            "place/errors_file_in_the_input_folder",
            refused(lambda w: ([folder_of(w)], w / "out", {"errors_path": w / "in" / "e.jsonl"})),
        ),
        (
            "place/errors_file_is_an_input",
            refused(lambda w: ([folder_of(w) / "docs.jsonl"], w / "out", {"errors_path": w / "in" / "docs.jsonl"})),
        ),
        ("place/out_in_a_subfolder_of_the_input_folder", refused(lambda w: ([folder_of(w)], w / "in" / "out", {}))),
        ("place/out_is_the_folder_of_an_input_file", refused(lambda w: ([folder_of(w) / "docs.jsonl"], w / "in", {}))),
        (
            "place/errors_file_beside_an_input_file",
            refused(lambda w: ([folder_of(w) / "docs.jsonl"], w / "out", {"errors_path": w / "in" / "e.jsonl"})),
        ),
        ("readonly/new_job", read_only("new")),
        ("readonly/finished_job_rerun", read_only("finished")),
        ("readonly/unfinished_job", read_only("unfinished")),
        ("readonly/errors_file", read_only("errors_file")),
        *[(f"kill/parent_n{n}", killed("parent", n)) for n in (1, 2, 4)],
        *[(f"kill/worker_n{n}", killed("worker", n)) for n in (2, 4)],
    ]


# -- the script --------------------------------------------------------------------------------------------------------
def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--report", action="store_true", help="print counts per outcome (always done)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--per-format", type=int, default=5, help="randomly damaged inputs per sample format, end to end"
    )
    parser.add_argument("--readers", type=int, default=600, help="damaged files read by the readers alone")
    parser.add_argument("-v", "--verbose", action="store_true", help="one line per case")
    parser.add_argument(
        "--no-kills", action="store_true", help="leave out the runs killed from outside (a minute or two)"
    )
    args = parser.parse_args(argv)
    import logging

    import spacy_genbioel

    logging.disable(logging.WARNING)
    print(f"spacy_genbioel from {spacy_genbioel.__file__}")
    started = time.monotonic()
    counts: Dict[str, int] = {}
    with tempfile.TemporaryDirectory() as tmp, cached_pipelines():
        root = Path(tmp)
        pipeline = build_pipeline(root / "p0")
        other_model = build_pipeline(root / "p1", seed=1)
        other_config = edited_pipeline(pipeline, root / "p2", "num_beams = 3", "num_beams = 4")
        runs: List[Tuple[str, Callable[[Path], Tuple[str, str]]]] = [
            (c.name, lambda work, c=c: run_case(c, pipeline, work))
            for c in cases() + mutated_cases(args.seed, args.per_format)
        ]
        runs += job_scenarios(pipeline, other_model, other_config)
        runs += [(n, r) for n, r in reliability_scenarios(pipeline) if not args.no_kills or not n.startswith("kill/")]
        for index, (name, run) in enumerate(runs):
            outcome, detail = run(root / f"case{index}")
            counts[outcome] = counts.get(outcome, 0) + 1
            if args.verbose or outcome != "ok":
                print(f"{outcome:>10}  {name}: {detail}")
        readers = reader_fuzz(root, args.seed, args.readers)
    for title, found in (
        ("end to end (annotate)", counts),
        (f"readers ({args.readers} damaged files x 6 ways)", readers),
    ):
        print(
            f"\n{title}: inputs tried: {sum(found.values())}; crashes: {found.get('crash', 0)}; silent acceptances: "
            f"{found.get('silent', 0)}; lost: {found.get('lost', 0)}; duplicated: {found.get('duplicated', 0)}; "
            f"unlocated: {found.get('unlocated', 0)}; refused whole: {found.get('refused', 0)}; "
            f"workers outliving their parent: {found.get('stray', 0)}; "
            f"hung on a dead worker: {found.get('hung', 0)}; skipped: {found.get('skipped', 0)}; "
            f"ok: {found.get('ok', 0)}"
        )
    print(f"({time.monotonic() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
