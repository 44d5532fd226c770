"""Fuzz the file readers: every KB reader (``kb/build.py`` FORMATS),
``KnowledgeBase.load`` (``.jsonl``, ``.jsonl.gz``, ``target_kb.json``), every
corpus reader (``corpus/load.py`` formats), the ``build-kb`` command and
annotate's input readers (``annotate:*``, read with low caps,
:data:`ANNOTATE_LIMITS`: an error entry naming the file is their refusal).

Each case is a malformed (or merely unusual) file and what must happen to it:

* ``refuse``: the project's error (``KBFormatError``/``CorpusFormatError``,
  or a non-zero exit of the command) naming the file;
* ``report``: accepted only with a warning in the log (or the command's summary);
* ``equal``: read exactly as the clean file (a BOM, CRLF or CR-only line ends);
* ``either``: works or is refused as above.

Whatever the expectation, no other exception type may escape. Outcomes:
``ok``, ``crash`` (another exception, or the project's error without the
file name), ``silent`` (accepted where it must be refused or reported) and
``misread`` (an ``equal`` case read differently from the clean file, or refused).

Run against any tree (the pytest module ``test_fuzz_readers.py`` uses the same
cases)::

    python tests/fuzz_readers.py --report                        # this checkout
    PYTHONPATH=/tmp/before python tests/fuzz_readers.py --report  # another tree
"""

from __future__ import annotations

import argparse
import gzip
import json
import logging
import random
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple

# -- clean samples, one per target ---------------------------------------------------------------------------
MEDIC = "".join(
    f"MESH:D{i:06d}{'|OMIM:6130' + str(i) if i % 4 == 0 else ''}||Disease {i}, type {i}|Syndrome {chr(65 + i)}\n"
    for i in range(25)
)
CTD = (
    "# Fields:\n"
    "# DiseaseName\tDiseaseID\tAltDiseaseIDs\tDefinition\tParentIDs\tTreeNumbers\tParentTreeNumbers"
    "\tSynonyms\tSlimMappings\n#\n"
    + "".join(
        f"Disease {i}\tMESH:D{i:06d}\tOMIM:{600000 + i}\tA definition {i}.\tMESH:D1"
        f"\tC0{i % 9}.{i:03d}\tC0{i % 9}\tAlias {i}|Other {i}\tSlim\n"
        for i in range(12)
    )
)
MESH_TSV = "".join(f"D{i:06d}\tName {i}\tSynonym {i}|Another {i}\tC{i % 9:02d}.{i:03d}\t\n" for i in range(12))
MESH_XML = (
    '<?xml version="1.0"?>\n<DescriptorRecordSet LanguageCode = "eng">\n'
    + "".join(
        f'<DescriptorRecord DescriptorClass = "1">\n  <DescriptorUI>D{i:06d}</DescriptorUI>\n'
        f"  <DescriptorName><String>Name {i}</String></DescriptorName>\n"
        f"  <TreeNumberList><TreeNumber>C0{i % 9}.{i:03d}</TreeNumber></TreeNumberList>\n"
        f'  <ConceptList><Concept PreferredConceptYN="Y"><ScopeNote>Note {i}.</ScopeNote>\n'
        f"    <TermList><Term><String>Term {i}</String></Term></TermList></Concept></ConceptList>\n"
        f"</DescriptorRecord>\n"
        for i in range(6)
    )
    + "</DescriptorRecordSet>\n"
)
MRCONSO = "".join(
    f"C{i:07d}|ENG|P|L{i:07d}|PF|S{i:07d}|Y|A{i:07d}||M{i}|D{i}|MSH|MH|D{i}|Concept name {i}|0|N|256|\n"
    f"C{i:07d}|ENG|S|L{i:07d}|VO|S{i:07d}|Y|B{i:07d}||M{i}|D{i}|MSH|EP|D{i}|Alias {i}|0|N|256|\n"
    for i in range(10)
)
OBO = "format-version: 1.2\nontology: doid\n\n" + "".join(
    f'[Term]\nid: DOID:{i:04d}\nname: term {i}\ndef: "Definition {i}." []\nsynonym: "alias {i}" EXACT []\n'
    f"namespace: disease_ontology\n\n"
    for i in range(8)
)
TARGET_KB = json.dumps({f"D{i:06d}": [f"name {i}", f"alias {i}"] for i in range(12)}, indent=1) + "\n"
KB_JSONL = "".join(
    json.dumps(
        {
            "id": f"D{i:06d}",
            "names": [f"Name {i}", f"Alias {i}"],
            "definition": f"Def {i}.",
            "types": ["C"],
            "prior": float(i % 3),
        }
    )
    + "\n"
    for i in range(12)
)
SCISPACY = "".join(
    json.dumps(
        {
            "concept_id": f"C{i:07d}",
            "canonical_name": f"Name {i}",
            "aliases": [f"Alias {i}"],
            "types": ["T047"],
            "definition": f"Def {i}.",
        }
    )
    + "\n"
    for i in range(12)
)


def _pubtator_doc(pmid: int) -> str:
    title, abstract = f"Renal failure in case {pmid}.", "Cystic fibrosis and renal failure were seen."
    text = f"{title} {abstract}"
    lines = [f"{pmid}|t|{title}", f"{pmid}|a|{abstract}"]
    for mention, cid in (("Renal failure", "D051437"), ("Cystic fibrosis", "D003550"), ("renal failure", "D051437")):
        start = text.index(mention, 1 if mention == "renal failure" else 0)
        lines.append(f"{pmid}\t{start}\t{start + len(mention)}\t{mention}\tDisease\t{cid}")
    lines.append(f"{pmid}\tCID\tD008750\tD003550")
    return "\n".join(lines) + "\n\n"


PUBTATOR = "".join(_pubtator_doc(1000 + i) for i in range(6))
CORPUS_JSONL = "".join(
    json.dumps(
        {
            "id": f"doc{i}",
            "text": "Renal failure and cystic fibrosis.",
            "mentions": [
                {"start": 0, "end": 13, "label": "Disease", "ids": ["D051437"]},
                {"start": 18, "end": 33, "label": "Disease", "ids": "D003550"},
            ],
        }
    )
    + "\n"
    for i in range(6)
)
BIOC_XML = (
    '<?xml version="1.0" encoding="UTF-8"?>\n<collection><source>test</source><date></date><key></key>\n'
    + "".join(
        f"<document><id>{i}</id>\n"
        '<passage><infon key="type">title</infon><offset>0</offset><text>Renal failure.</text>\n'
        f'<annotation id="a{i}"><infon key="type">Disease</infon><infon key="MESH">D051437</infon>'
        f'<location offset="0" length="13"/><text>Renal failure</text></annotation></passage>\n'
        f'<passage><infon key="type">abstract</infon><offset>15</offset><text>Cystic fibrosis.</text></passage>\n'
        f"</document>\n"
        for i in range(4)
    )
    + "</collection>\n"
)
BIOC_JSON = "".join(
    json.dumps(
        {
            "id": str(i),
            "passages": [
                {
                    "offset": 0,
                    "text": "Renal failure.",
                    "annotations": [
                        {
                            "id": "a",
                            "infons": {"type": "Disease", "MESH": "D051437"},
                            "text": "Renal failure",
                            "locations": [{"offset": 0, "length": 13}],
                        }
                    ],
                },
                {"offset": 15, "text": "Cystic fibrosis."},
            ],
        }
    )
    + "\n"
    for i in range(4)
)
ASKAPATIENT = "".join(f"C{i:07d}\tconcept {i}\tmy {i} aches\n" for i in range(10))
PUBMED_XML = (
    '<?xml version="1.0" encoding="utf-8"?>\n<PubmedArticleSet>\n'
    + "".join(
        f"<PubmedArticle>\n<MedlineCitation><PMID>{900 + i}</PMID>\n<Article><ArticleTitle>Renal failure {i}."
        f"</ArticleTitle><Abstract><AbstractText>Cystic fibrosis.</AbstractText></Abstract></Article>\n"
        f"</MedlineCitation>\n</PubmedArticle>\n"
        for i in range(5)
    )
    + "</PubmedArticleSet>\n"
)
TEXT = "".join(f"Renal failure and cystic fibrosis in patient {i}.\n" for i in range(8))
#: the caps annotate's readers run with here (far below the defaults, so that the cases stay small)
ANNOTATE_LIMITS = {"max_line_bytes": 4096, "max_record_bytes": 4096, "max_json_bytes": 8192}

#: target -> (file name, clean sample, line-based)
SAMPLES: Dict[str, Tuple[str, str, bool]] = {
    "kb:medic": ("medic.txt", MEDIC, True),
    "kb:ctd": ("CTD_diseases.tsv", CTD, True),
    "kb:mesh-tsv": ("mesh.tsv", MESH_TSV, True),
    "kb:mesh-xml": ("desc2024.xml", MESH_XML, True),
    "kb:umls": ("MRCONSO.RRF", MRCONSO, True),
    "kb:obo": ("doid.obo", OBO, True),
    "kb:genbioel": ("target_kb.json", TARGET_KB, True),
    "kb:jsonl": ("kb.jsonl", KB_JSONL, True),
    "kb:scispacy": ("umls_kb.jsonl", SCISPACY, True),
    "load:jsonl": ("kb.jsonl", KB_JSONL, True),
    "load:jsonl.gz": ("kb.jsonl.gz", KB_JSONL, True),
    "load:target_kb": ("target_kb.json", TARGET_KB, True),
    "corpus:pubtator": ("train.txt", PUBTATOR, True),
    "corpus:jsonl": ("train.jsonl", CORPUS_JSONL, True),
    "corpus:bioc-xml": ("train.xml", BIOC_XML, True),
    "corpus:bioc-json": ("train.json", BIOC_JSON, True),
    "corpus:askapatient": ("AskAPatient.fold-0.train.txt", ASKAPATIENT, True),
    "cli:medic": ("medic.txt", MEDIC, True),
    "cli:ctd": ("CTD_diseases.tsv", CTD, True),
    "cli:jsonl": ("kb.jsonl", KB_JSONL, True),
    "cli:genbioel": ("target_kb.json", TARGET_KB, True),
    "annotate:text": ("notes.txt", TEXT, True),
    "annotate:jsonl": ("in.jsonl", CORPUS_JSONL, True),
    "annotate:pubtator": ("in.pubtator", PUBTATOR, True),
    "annotate:pubmed": ("pubmed.xml", PUBMED_XML, True),
    "annotate:bioc-xml": ("in.xml", BIOC_XML, True),
    "annotate:bioc-json": ("in.json", BIOC_JSON, True),
}
JSON_LINES = {
    "kb:jsonl",
    "kb:scispacy",
    "load:jsonl",
    "load:jsonl.gz",
    "corpus:jsonl",
    "cli:jsonl",
    "corpus:bioc-json",
    "annotate:jsonl",
    "annotate:bioc-json",
}
TARGET_KB_TARGETS = {"kb:genbioel", "load:target_kb", "cli:genbioel"}


@dataclass
class Case:
    target: str
    kind: str
    data: bytes
    expect: str  # refuse | report | equal | either
    must_say: str = ""  # a refusal must say this (the cap it names...)

    @property
    def filename(self) -> str:
        return SAMPLES[self.target][0]


# -- mutations -------------------------------------------------------------------------------------------------
def _gz(data: bytes) -> bytes:
    return gzip.compress(data, mtime=0)


def _stored(target: str, text: str) -> bytes:
    """The bytes a target reads for a text: ``.gz`` targets get it gzipped."""
    data = text.encode("utf8")
    return _gz(data) if target.endswith(".gz") else data


def _lines(text: str) -> List[str]:
    return text.split("\n")


def _line_cases(target: str, text: str, rng: random.Random) -> Iterator[Case]:
    """Mutations any file gets: compression, encoding, line ends, sizes."""
    data = text.encode("utf8")
    empty_expect = "refuse" if target.startswith(("load:", "cli:", "corpus:")) else "either"
    gz = _gz(data)
    for cut in sorted(rng.sample(range(10, len(gz) - 1), 6)) + [len(gz) - 4, len(gz) - 1]:
        yield Case(target, f"gzip truncated at {cut}/{len(gz)}", gz[:cut], "refuse")
    for _ in range(3):
        bad = bytearray(gz)
        pos = rng.randrange(12, len(gz) - 8)
        bad[pos] ^= 0xFF
        yield Case(target, f"gzip byte {pos} flipped", bytes(bad), "refuse")
    yield Case(target, "gzip + trailing garbage", gz + b"garbage", "refuse")
    lines = _lines(text)
    utf8_expect = "either" if target == "corpus:askapatient" else "refuse"
    for _ in range(3):
        i = rng.randrange(len(lines) - 1)
        broken = (
            lines[:i] + [lines[i][: len(lines[i]) // 2] + "\udcff" + lines[i][len(lines[i]) // 2 :]] + lines[i + 1 :]
        )
        raw = "\n".join(broken).encode("utf8", "surrogateescape")
        yield Case(target, f"bad UTF-8 on line {i + 1}", _gz(raw) if target.endswith(".gz") else raw, utf8_expect)
    yield Case(target, "UTF-8 BOM", _stored(target, "\ufeff" + text), "equal")
    yield Case(target, "CRLF line ends", _stored(target, text.replace("\n", "\r\n")), "equal")
    yield Case(target, "CR-only line ends", _stored(target, text.replace("\n", "\r")), "equal")
    yield Case(target, "empty file", b"", empty_expect)
    yield Case(target, "blank lines only", _stored(target, "\n \n\t\n"), empty_expect)
    yield Case(target, "NUL bytes", _stored(target, text.replace("e", "e\x00", 3)), "either")
    for _ in range(4):
        cut = rng.randrange(1, len(data))
        yield Case(
            target, f"plain text truncated at {cut}", _stored(target, data[:cut].decode("utf8", "ignore")), "either"
        )
    for _ in range(4):
        raw = bytearray(data)
        for _ in range(rng.randint(1, 4)):
            raw[rng.randrange(len(raw))] = rng.randrange(256)
        yield Case(target, "random bytes changed", _stored(target, raw.decode("utf8", "replace")), "either")
    huge = text.replace("ame 1", "ame 1" + "x" * 2_000_000, 1).replace("isease 1", "isease 1" + "y" * 2_000_000, 1)
    if huge == text:
        huge = text[:10] + "x" * 2_000_000 + text[10:]
    yield Case(target, "2 MB line", _stored(target, huge), "either")
    if target in JSON_LINES or target in TARGET_KB_TARGETS:
        deep = "[" * 100_000 + "]" * 100_000
        yield Case(target, "100000 nested brackets", _stored(target, deep + "\n"), "refuse")
        if target not in TARGET_KB_TARGETS and target != "corpus:bioc-json":
            yield Case(target, "nested line after good lines", _stored(target, text + deep + "\n"), "refuse")
            for value in ("5", "null", "[]", '"text"'):
                yield Case(target, f"JSON {value} as a record", _stored(target, text + value + "\n"), "refuse")


def _record_cases(target: str, text: str) -> Iterator[Case]:
    """Wrong JSON types in one record of a JSON-lines KB or corpus."""
    if target not in ("kb:jsonl", "load:jsonl", "load:jsonl.gz", "cli:jsonl", "corpus:jsonl"):
        return
    first, rest = text.split("\n", 1)
    record = json.loads(first)
    if target != "corpus:jsonl":
        wrong = {
            "id": [["x"], {"a": 1}, True, 1.5, float("nan"), "", " "],
            "names": [5, [1], {"a": 1}, [None], [["x"]]],
            "types": [5, [1], {"a": 1}, [None]],
            "definition": [5, [], {"a": 1}, True],
            "prior": ["x", True, float("nan"), float("inf"), [], None],
        }
    else:
        wrong = {
            "id": [["x"], {"a": 1}, True, 1.5, float("nan")],
            "text": [5, ["x"], None, {"a": 1}],
            "mentions": [
                5,
                "abc",
                {"a": 1},
                [5],
                [{"start": "x", "end": 3}],
                [{"start": 1.5, "end": 3}],
                [{"start": True, "end": 3}],
                [{"start": 0, "end": 13, "ids": 5}],
                [{"start": 0, "end": 13, "ids": [["x"]]}],
                [{"start": 0, "end": 13, "text": 5}],
                [{"start": 0, "end": 13, "label": ["x"]}],
                [{"start": 0, "end": 99}],
            ],
        }
    for key, values in wrong.items():
        for value in values:
            changed = dict(record, **{key: value})
            yield Case(
                target, f"{key}: {json.dumps(value)}", _stored(target, json.dumps(changed) + "\n" + rest), "refuse"
            )


def _kb_name_cases(target: str) -> Iterator[Case]:
    """KBs whose names are unusable (normalize to nothing) or missing."""
    if target in ("load:jsonl", "load:jsonl.gz", "cli:jsonl", "kb:jsonl"):
        records = [json.loads(line) for line in KB_JSONL.splitlines()]
        none_usable = "".join(json.dumps({"id": r["id"], "names": ["()", " - "]}) + "\n" for r in records)
        some = "".join(json.dumps(dict(r, names=["(...)"]) if i == 3 else r) + "\n" for i, r in enumerate(records))
        one_bad_name = "".join(
            json.dumps(dict(r, names=r["names"] + ["[]"]) if i == 2 else r) + "\n" for i, r in enumerate(records)
        )
        whole = "refuse" if not target.startswith("kb:") else "either"
        part = "report" if not target.startswith("kb:") else "either"
        yield Case(target, "every name normalizes to nothing", _stored(target, none_usable), whole)
        yield Case(target, "one concept's names normalize to nothing", _stored(target, some), part)
        yield Case(target, "one name normalizes to nothing", _stored(target, one_bad_name), part)
        if target.startswith("cli:"):
            nameless = "".join(json.dumps({"id": r["id"]} if i == 1 else r) + "\n" for i, r in enumerate(records))
            yield Case(target, "one concept without names", _stored(target, nameless), "report")
            yield Case(
                target,
                "no concept has names",
                _stored(target, "".join(json.dumps({"id": r["id"]}) + "\n" for r in records)),
                "refuse",
            )
    if target in TARGET_KB_TARGETS:
        for key in ("", " "):
            yield Case(
                target,
                f"concept ID {key!r}",
                _stored(target, json.dumps({"D1": ["a"], key: ["b"]}, indent=1)),
                "refuse",
            )
        yield Case(target, "names 5", _stored(target, json.dumps({"D1": ["a"], "D2": 5}, indent=1)), "refuse")
        yield Case(target, "JSON list", _stored(target, json.dumps([["D1", "a"]])), "refuse")
        yield Case(target, "empty object", _stored(target, "{}"), "either" if target.startswith("kb:") else "refuse")
        yield Case(
            target,
            "every name normalizes to nothing",
            _stored(target, json.dumps({"D1": ["()"], "D2": ["..."]})),
            "either" if target.startswith("kb:") else "refuse",
        )
    if target in ("kb:medic", "cli:medic"):
        yield Case(
            target,
            "names normalize to nothing",
            _stored(target, MEDIC.replace("|Syndrome A", "|(--)", 1)),
            "report" if target.startswith("cli:") else "either",
        )
        yield Case(
            target,
            "every name normalizes to nothing",
            _stored(target, "D1||()\nD2||[...]\n"),
            "refuse" if target.startswith("cli:") else "either",
        )


#: target -> a name of its sample, where control characters are put (line-based KB readers and JSON ones)
_CONTROL_NAMES = {
    "medic": "Disease 0,",
    "ctd": "Disease 0\t",
    "mesh-tsv": "Name 0\t",
    "umls": "Concept name 0|",
    "obo": "name: term 0\n",
    "genbioel": '"name 0"',
    "target_kb": '"name 0"',
    "jsonl": '"Name 0"',
    "jsonl.gz": '"Name 0"',
    "scispacy": '"Name 0"',
}


def _control_cases(target: str, text: str) -> Iterator[Case]:
    """Names holding NUL or a terminal escape: read with them dropped, and reported (a warning naming the file);
    an OBO name with an end-of-line comment and a trailing modifier: read as the clean file."""
    name = _CONTROL_NAMES.get(target.partition(":")[2])
    if name is None or target.startswith("annotate:") or target.startswith("corpus:") or name not in text:
        return
    json_text = target.partition(":")[2] in ("genbioel", "target_kb", "jsonl", "jsonl.gz", "scispacy")
    for label, control in (("NUL", "\x00"), ("terminal escape", "\x1b[31m")):
        spelled = json.dumps(control)[1:-1] if json_text else control
        damaged = text.replace(name, name[:2] + spelled + name[2:], 1)
        yield Case(target, f"{label} in a name", _stored(target, damaged), "report")
    if target.endswith(":obo"):
        commented = text.replace("name: term 0\n", 'name: term 0 {source="x"} ! the first term\n', 1)
        yield Case(target, "OBO comment and trailing modifier", _stored(target, commented), "equal")


_BAD_OFFSETS = [
    ("154.0", "160"),
    ("154.0", "160.0"),
    ("abc", "def"),
    ("abc", "160"),
    ("1e2", "2e2"),
    ("", ""),
    ("-3", "5"),
    ("20", "10"),
    ("0", "9999"),
    (" 12", "x"),
    ("0x1", "0x5"),
    ("١٢", "١٥"),
]


def _corpus_cases(target: str, text: str) -> Iterator[Case]:
    """Format errors of the corpora: PubTator offsets, relation-like lines."""
    if target != "corpus:pubtator":
        return
    for start, end in _BAD_OFFSETS:
        changed = text.replace("1000\t0\t13\tRenal failure", f"1000\t{start}\t{end}\tRenal failure", 1)
        yield Case(target, f"mention offsets {start!r}-{end!r}", changed.encode("utf8"), "refuse")
    yield Case(
        target,
        "mention text differs",
        text.replace("\tCystic fibrosis\t", "\tCystic fibroma\t", 1).encode("utf8"),
        "refuse",
    )
    yield Case(
        target,
        "relation with 5 columns",
        text.replace("\tCID\tD008750\tD003550", "\tAssociation\tD008750\t3630\tNovel", 1).encode("utf8"),
        "either",
    )
    yield Case(target, "mention before the title", ("1000\t0\t4\tRena\tDisease\tD1\n" + text).encode("utf8"), "refuse")


def _round_two_cases(target: str, text: str) -> Iterator[Case]:
    """Issue 31: IDs no output can write back, silent acceptances, caps, entities in XML."""
    group, _, name = target.partition(":")
    if target in ("kb:jsonl", "load:jsonl", "load:jsonl.gz", "cli:jsonl", "kb:scispacy"):
        key = "concept_id" if name == "scispacy" else "id"
        first, rest = text.split("\n", 1)
        for cid in ("D1\tX", "D1\nX", "D|PIPE", "D1+D2", "D 1"):
            yield Case(
                target,
                f"ID {cid!r}",
                _stored(target, json.dumps(dict(json.loads(first), **{key: cid})) + "\n" + rest),
                "refuse",
            )
        if name != "scispacy":
            nameless = json.dumps(dict(json.loads(first), names=[])) + "\n" + rest
            yield Case(target, "names []", _stored(target, nameless), "report" if group != "kb" else "either")
    if target in TARGET_KB_TARGETS:
        yield Case(
            target,
            "concept listed twice",
            _stored(target, '{\n "D1": ["a"],\n "D2": ["b"],\n "D1": ["c"]\n}\n'),
            "refuse",
        )
        yield Case(target, "ID 'D|PIPE'", _stored(target, json.dumps({"D1": ["a"], "D|PIPE": ["b"]})), "refuse")
    if name == "medic":
        yield Case(target, "ID 'D1+D2'", _stored(target, MEDIC.replace("MESH:D000001", "MESH:D000001+D2", 1)), "refuse")
    if name == "ctd":
        lines = text.split("\n")
        row = lines[4].split("\t")
        swapped = "\n".join(lines[:4] + ["\t".join([row[1], row[0], *row[2:]])] + lines[5:])
        yield Case(target, "name and ID columns swapped", _stored(target, swapped), "refuse")
    if target == "corpus:pubtator":
        yield Case(
            target, "second abstract line", text.replace("1001|a|", "1001|a|First.\n1001|a|", 1).encode(), "refuse"
        )
    if target in ("corpus:bioc-xml", "annotate:bioc-xml"):
        yield Case(target, "empty document ID", text.replace("<id>2</id>", "<id> </id>", 1).encode(), "refuse")
        for decl in ('<!ENTITY x SYSTEM "file:///etc/hostname">', '<!ENTITY x "Renal">'):
            doctype = text.replace("<collection>", f"<!DOCTYPE collection [{decl}]>\n<collection>", 1)
            yield Case(
                target, f"entity {decl[:20]}", doctype.replace("Renal failure.", "&x; failure.", 1).encode(), "refuse"
            )
    if target == "corpus:bioc-xml":
        yield Case(target, "document ID seen twice", text.replace("<id>2</id>", "<id>1</id>", 1).encode(), "report")
    if target in ("corpus:bioc-json", "annotate:bioc-json"):
        yield Case(
            target, "string passage offset", text.replace('"offset": 15', '"offset": "15"', 1).encode(), "refuse"
        )
        yield Case(target, "empty document ID", text.replace('"id": "1"', '"id": ""', 1).encode(), "refuse")
    if target == "corpus:bioc-json":
        yield Case(target, "document ID seen twice", text.replace('"id": "1"', '"id": "0"', 1).encode(), "report")
    if group != "annotate":
        return
    big = "x" * (ANNOTATE_LIMITS["max_line_bytes"] + 10)
    if name in ("text", "jsonl", "pubtator", "bioc-json"):
        over = text.replace("Renal failure", "Renal failure" + big, 1)
        yield Case(target, "line over max_line_bytes", over.encode(), "refuse", "max_line_bytes")
        yield Case(target, "line over max_line_bytes, gzipped", _gz(over.encode()), "refuse", "max_line_bytes")
    if name in ("pubmed", "bioc-xml"):
        yield Case(
            target,
            "record over max_record_bytes",
            text.replace("Renal failure", "Renal failure" + big, 1).encode(),
            "refuse",
            "max_record_bytes",
        )
        tag = "</PubmedArticle>" if name == "pubmed" else "</document>"
        yield Case(
            target, "record without its end tag", text.replace(tag, "", 1).encode(), "refuse", "without its end tag"
        )
        cut = text[: text.rindex(tag)] + big  # the last record never ends: the cap comes first
        yield Case(target, "unterminated record over the cap", cut.encode(), "refuse", "max_record_bytes")
        start = "<PubmedArticle>" if name == "pubmed" else "<document>"
        damaged = text.replace(start, start[:4] + "\udcff" + start[4:], 2).replace(start[:4] + "\udcff", start, 1)
        yield Case(
            target, "damaged start tag", damaged.encode("utf8", "surrogateescape"), "refuse", "without its start tag"
        )
    if name == "bioc-json":
        docs = [json.loads(line) for line in text.splitlines()]
        whole = json.dumps({"documents": docs * 40}, indent=1)
        yield Case(target, "collection over max_json_bytes", whole.encode(), "refuse", "max_json_bytes")


def cases(seed: int = 0, targets: Optional[List[str]] = None) -> List[Case]:
    """Every malformed input for ``targets`` (all by default), deterministic for a seed."""
    out: List[Case] = []
    for target in targets or list(SAMPLES):
        rng = random.Random(f"{seed}:{target}")
        _, text, _ = SAMPLES[target]
        out.extend(_line_cases(target, text, rng))
        out.extend(_record_cases(target, text))
        out.extend(_kb_name_cases(target))
        out.extend(_control_cases(target, text))
        out.extend(_corpus_cases(target, text))
        out.extend(_round_two_cases(target, text))
    return out


# -- running one case ------------------------------------------------------------------------------------------
class _Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: List[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def _project_errors() -> Tuple[type, ...]:
    from spacy_genbioel.corpus.pubtator import CorpusFormatError
    from spacy_genbioel.kb.base import KBFormatError

    return (KBFormatError, CorpusFormatError)


def _run_target(target: str, path: Path, workdir: Path) -> Any:
    """Read ``path`` as ``target`` reads it; return something comparable."""
    group, _, name = target.partition(":")
    if group == "kb":
        from spacy_genbioel.kb.build import FORMATS

        return [(c.id, list(c.names), c.definition, list(c.types)) for c in FORMATS[name](path)]
    if group == "load":
        from spacy_genbioel.kb.base import KnowledgeBase

        kb = KnowledgeBase.load(path)
        return (kb.concept_ids, kb.names, kb.checksum())
    if group == "annotate":
        return _run_annotate(name, path)
    if group == "corpus":
        from spacy_genbioel.corpus.load import load_corpus

        fmt = name.split("-")[0]
        mentions, texts = load_corpus(path, fmt)
        return ([(m.text, m.ids, m.start, m.end, m.doc_id.replace(path.name, "")) for m in mentions], texts)
    return _run_cli(name, path, workdir)


def _run_annotate(name: str, path: Path) -> Any:
    """annotate's reader of a format: its records, or its first error entry raised as a refusal
    (an entry without the file and a line or record is a crash)."""
    from spacy_genbioel.annotate import InputRecord, RecordError, read_records
    from spacy_genbioel.corpus.pubtator import CorpusFormatError

    try:
        from spacy_genbioel.annotate.lines import ReadLimits
    except ImportError:  # a tree from before the caps: its readers as they are
        items = list(read_records(path, name.split("-")[0]))
    else:
        items = list(read_records(path, name.split("-")[0], ReadLimits(**ANNOTATE_LIMITS)))
    errors = [i for i in items if isinstance(i, RecordError)]
    if any(e.file != str(path) or (e.line is None and e.record is None) for e in errors):
        raise RuntimeError(f"an error entry without its file and line: {errors}")
    if any(
        not isinstance(i, (InputRecord, RecordError)) or (isinstance(i, InputRecord) and not i.text.strip())
        for i in items
    ):
        raise RuntimeError("not a usable record")
    if errors:
        raise CorpusFormatError(f"{errors[0].file}:{errors[0].line or errors[0].record}: {errors[0].reason}")
    return [(i.doc_id.replace(str(path.resolve()), path.name), i.text, i.title) for i in items]


class CliFailed(Exception):
    """The command exited non-zero; ``named`` says whether its message names the file."""

    def __init__(self, message: str, named: bool, exception: Optional[BaseException]) -> None:
        super().__init__(message)
        self.named, self.exception = named, exception


def _run_cli(fmt: str, path: Path, workdir: Path) -> Any:
    from typer.testing import CliRunner

    from spacy_genbioel.cli import app

    out = workdir / "out.jsonl"
    result = CliRunner().invoke(app, ["build-kb", "-f", fmt, str(path), "--out", str(out)])
    if result.exit_code == 0:
        return (out.read_text(encoding="utf8"), result.output)
    exc = result.exception
    text = (result.output or "") + str(exc or "")
    if exc is not None and not isinstance(exc, (SystemExit, *_project_errors())):
        raise exc
    raise CliFailed(text, path.name in text, exc)


_clean_results: Dict[Tuple[str, str], Any] = {}


def run_case(case: Case, workdir: Path) -> Tuple[str, str]:
    """``(outcome, detail)`` of one case; outcomes as in the module docstring."""
    import spacy_genbioel

    path = workdir / case.filename
    key = (spacy_genbioel.__file__, case.target)
    if case.expect == "equal" and key not in _clean_results:
        _, text, _ = SAMPLES[case.target]
        path.write_bytes(_stored(case.target, text))
        _clean_results[key] = _strip_output(_run_target(case.target, path, workdir))
    path.write_bytes(case.data)
    capture = _Capture()
    package_logger = logging.getLogger("spacy_genbioel")
    package_logger.addHandler(capture)
    level, propagate = package_logger.level, package_logger.propagate
    package_logger.setLevel(logging.WARNING)
    package_logger.propagate = False  # captured, not printed
    try:
        result = _run_target(case.target, path, workdir)
    except CliFailed as err:
        if not err.named:
            return "crash", f"exit message does not name the file: {str(err)[-200:]}"
        return ("misread", f"refused: {str(err)[-200:]}") if case.expect == "equal" else ("ok", "refused")
    except _project_errors() as err:
        if path.name not in str(err):
            return "crash", f"{type(err).__name__} without the file name: {err}"
        if case.must_say and case.must_say not in str(err):
            return "silent", f"refused without saying {case.must_say!r}: {str(err)[:200]}"
        return ("misread", f"refused: {err}") if case.expect == "equal" else ("ok", "refused")
    except Exception as err:  # noqa: BLE001  (the point: nothing else may escape)
        return "crash", f"{type(err).__name__}: {str(err)[:200]}"
    finally:
        package_logger.removeHandler(capture)
        package_logger.setLevel(level)
        package_logger.propagate = propagate
    if case.expect == "refuse":
        return "silent", "accepted"
    if case.expect == "report":
        summary = str(result[1]).lower() if case.target.startswith("cli:") else ""
        reported = capture.records or "dropped" in summary or "without names" in summary
        return ("ok", "reported") if reported else ("silent", "accepted without a warning")
    if case.expect == "equal" and _strip_output(result) != _clean_results[key]:
        return "misread", "read differently from the clean file"
    return "ok", "accepted"


def _strip_output(result: Any) -> Any:
    # the command's console output holds timings: compare the KB it wrote
    return (result[0], "") if isinstance(result, tuple) and len(result) == 2 and isinstance(result[1], str) else result


def run_all(all_cases: List[Case]) -> List[Tuple[Case, str, str]]:
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, case in enumerate(all_cases):
            workdir = Path(tmp) / str(i)
            workdir.mkdir()
            outcome, detail = run_case(case, workdir)
            results.append((case, outcome, detail))
    return results


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--report", action="store_true", help="print every failure and the counts")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--target", action="append", help="only these targets (e.g. kb:medic)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.CRITICAL)  # the cases' own warnings are captured, not printed
    import spacy_genbioel

    results = run_all(cases(args.seed, args.target))
    counts = Counter(outcome for _, outcome, _ in results)
    if args.report:
        for case, outcome, detail in results:
            if outcome != "ok":
                print(f"{outcome:8} {case.target:20} {case.kind:45} {detail[:160]}")
    per_target = Counter((case.target, outcome) for case, outcome, _ in results if outcome != "ok")
    print(f"tree: {Path(spacy_genbioel.__file__).parent}")
    for (target, outcome), n in sorted(per_target.items()):
        print(f"  {target:20} {outcome:8} {n}")
    print(
        f"inputs {len(results)}  crashes {counts['crash']}  "
        f"silent acceptances {counts['silent']}  misreads {counts['misread']}"
    )
    return 0 if len(results) == counts["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
