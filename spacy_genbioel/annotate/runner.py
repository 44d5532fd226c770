"""Streaming, resumable batch annotation: documents in, linked mentions out.

    annotate(["pubmed24n0001.xml.gz"], "pipeline/", "out/", format="jsonl")

or ``python -m spacy_genbioel annotate INPUT... --pipeline DIR --out OUT``.

Three parts, one responsibility each:

* **Readers** (:func:`read_records`) stream :class:`InputRecord` (ID, text,
  file, line) from PubTator, BioC XML/JSON, PubMed XML, JSONL or plain text,
  ``.gz`` or not; a malformed record becomes a :class:`RecordError` and the
  stream goes on. XML files are cut into records (``<PubmedArticle>``,
  ``<document>``) by a scanner and each record is parsed alone, so one broken
  record costs that record, not the rest of the file, and memory is bounded by
  the largest record.
* **Writers** (:data:`WRITERS`) turn a chunk of annotated docs into one file:
  JSONL, PubTator, BioC XML or a spaCy ``DocBin``, and read the document IDs
  back from such a file (used when a run resumes).
* **The run** (:func:`annotate`) feeds new documents through ``nlp.pipe`` and
  commits output in numbered chunk files.

Guarantees and decisions (``docs/annotate.md`` has the long version):

* A chunk is written to a temporary file, fsync'd and renamed into place; only
  then is a line with its document IDs appended (and fsync'd) to
  ``checkpoint.jsonl``. On start, the chunk files present are the truth:
  temporary files are removed, a checkpoint line whose chunk is missing is
  dropped, a chunk without a checkpoint line (a crash between rename and
  append) gets one, read from the chunk itself. Rerunning the same command
  after ``kill -9`` at any moment therefore finishes the job, and the chunk
  files are byte for byte those of an uninterrupted run (a resumed run starts
  at a chunk boundary, so batches and chunks line up the same way).
* Duplicate document IDs: the first valid record with an ID is annotated;
  later ones are logged as ``"kind": "duplicate"`` in the errors file and
  counted as skipped. Malformed records never claim an ID.
* The errors file is append-only and de-duplicated by (file, line, record) on
  resume, so a record re-read after a crash is never logged twice.
* A document on which the pipeline raises is retried alone; if it fails alone
  it is logged as an error and the run goes on.
"""
from __future__ import annotations

import collections
import contextlib
import datetime as _dt
import json
import logging
import os
import re
import shlex
import sys
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Deque, Dict, IO, Iterable, Iterator, List, NamedTuple, Optional, Sequence, Set, Tuple, Union


from spacy_genbioel.util import PathLike, open_binary, open_text, atomic_json as _atomic_json, atomic_write as _atomic_write

logger = logging.getLogger(__name__)


__all__ = [
    "INPUT_FORMATS",
    "OUTPUT_FORMATS",
    "AnnotateError",
    "InputRecord",
    "LinkedMention",
    "RecordError",
    "WRITERS",
    "annotate",
    "detect_format",
    "doc_mentions",
    "read_records",
    "register_annotate",
]

INPUT_FORMATS = ("pubtator", "bioc", "pubmed", "jsonl", "text")
OUTPUT_FORMATS = ("jsonl", "pubtator", "bioc", "docbin")

CHECKPOINT = "checkpoint.jsonl"
PROVENANCE = "provenance.json"
SUMMARY = "summary.json"
ERRORS = "errors.jsonl"
_CHUNK_NAME = re.compile(r"^part-(\d{6,})(\.[A-Za-z.]+)$")


class AnnotateError(RuntimeError):
    """The run cannot start or go on (bad options, an output folder from another run...)."""


# -- records -------------------------------------------------------------------------------
@dataclass
class InputRecord:
    """One document to annotate. ``line`` is where it starts (1-based), ``record`` its
    index in files without usable line numbers. When the input separates title and
    abstract, ``title`` is set and ``text == title + " " + abstract`` (or the title
    alone when there is no abstract), the layout of :class:`~spacy_genbioel.corpus.readers.PubTatorDocument`."""

    doc_id: str
    text: str
    file: str
    line: Optional[int] = None
    record: Optional[int] = None
    title: Optional[str] = None

    @property
    def abstract(self) -> str:
        if self.title is None:
            return ""
        return self.text[len(self.title) + 1 :]

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line if self.line is not None else '#' + str(self.record)}"


@dataclass
class RecordError:
    """A record that could not be read; ``line``/``record`` as in :class:`InputRecord`."""

    file: str
    reason: str
    line: Optional[int] = None
    record: Optional[int] = None
    doc_id: Optional[str] = None
    kind: str = "error"  # or "duplicate"

    @property
    def key(self) -> Tuple[str, str, str]:
        return (self.file, str(self.line), str(self.record))

    def to_dict(self) -> Dict[str, Any]:
        data: Dict[str, Any] = {"kind": self.kind, "reason": self.reason, "file": self.file}
        if self.line is not None:
            data["line"] = self.line
        if self.record is not None:
            data["record"] = self.record
        if self.doc_id is not None:
            data["id"] = self.doc_id
        return data


Item = Union[InputRecord, RecordError]


def _title_text(title: str, abstract: str) -> str:
    # the PubTatorDocument layout, so that PubTator/BioC outputs read back with the same offsets
    return f"{title} {abstract}" if abstract else title


def _document(doc_id: Any, text: Optional[str], file: str, *, line: Optional[int] = None,
              record: Optional[int] = None, title: Optional[str] = None) -> Item:
    """An InputRecord, or the RecordError saying why it cannot be one."""
    doc_id = "" if doc_id is None else str(doc_id).strip()
    if not doc_id:
        return RecordError(file, "document has no ID", line, record)
    if text is None or not text.strip():
        return RecordError(file, "empty document (no text)", line, record, doc_id)
    return InputRecord(doc_id, text, file, line, record, title)


# -- low-level input -------------------------------------------------------------------------
def _decoded_lines(path: Path) -> Iterator[Tuple[int, Optional[str], Optional[str]]]:
    """(line number, text or None, error) per line, decoded one by one so a bad line costs one line."""
    with open_binary(path) as handle:
        lineno = 0
        try:
            for lineno, raw in enumerate(handle, start=1):
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError as err:
                    yield lineno, None, f"not UTF-8 text ({err.reason} at column {err.start + 1})"
                    continue
                if lineno == 1 and line.startswith("\ufeff"):
                    line = line[1:]
                yield lineno, line.rstrip("\r\n"), None
        except (OSError, EOFError) as err:  # truncated or corrupt .gz
            yield lineno + 1, None, f"file cannot be read further ({err}); the rest of it is skipped"
            return


# -- PubTator ----------------------------------------------------------------------------------
_PUBTATOR_TEXT = re.compile(r"^([^|\t]+)\|([ta])\|(.*)$")


def read_pubtator_records(path: PathLike) -> Iterator[Item]:
    """Title + abstract per document; gold mention and relation lines are ignored.

    A document with a line that does not belong to it (another PMID, a second
    abstract...) is an error as a whole; a stray line between documents is an
    error of its own.
    """
    path = Path(path)
    file = str(path)
    current: Optional[Dict[str, Any]] = None

    def finish() -> Optional[Item]:
        nonlocal current
        doc, current = current, None
        if doc is None:
            return None
        if doc["bad"]:
            return RecordError(file, doc["bad"], doc["line"], doc_id=doc["pmid"] or None)
        return _document(doc["pmid"], _title_text(doc["title"], doc["abstract"] or ""), file, line=doc["line"], title=doc["title"])

    for lineno, line, problem in _decoded_lines(path):
        if line is None:
            if current is not None:
                current["bad"] = current["bad"] or f"line {lineno}: {problem}"
            else:
                yield RecordError(file, problem or "unreadable line", lineno)
            continue
        if not line.strip():
            done = finish()
            if done is not None:
                yield done
            continue
        match = _PUBTATOR_TEXT.match(line)
        if match and match.group(2) == "t":
            done = finish()
            if done is not None:
                yield done
            current = {"pmid": match.group(1).strip(), "title": match.group(3), "abstract": None, "line": lineno, "bad": None}
            continue
        pmid = match.group(1).strip() if match else line.split("\t", 1)[0].strip()
        if current is None:
            yield RecordError(file, "line outside a document (no title line before it)", lineno)
            continue
        if pmid != current["pmid"]:
            current["bad"] = current["bad"] or f"line {lineno} belongs to PMID {pmid!r}, inside document {current['pmid']!r}"
        elif match:  # abstract line
            if current["abstract"] is not None:
                current["bad"] = current["bad"] or f"line {lineno}: a second abstract line"
            else:
                current["abstract"] = match.group(3)
        elif "\t" not in line:
            current["bad"] = current["bad"] or f"line {lineno}: neither a text line nor a tab-separated annotation"
    done = finish()
    if done is not None:
        yield done


# -- JSONL and plain text -------------------------------------------------------------------------
def _json_lines(path: Path) -> Iterator[Union[RecordError, Tuple[int, Any]]]:
    """``(line number, parsed value)`` per non-blank line of a JSON-lines file, or a
    :class:`RecordError` for a line that cannot be decoded or parsed."""
    file = str(path)
    for lineno, line, problem in _decoded_lines(path):
        if line is None:
            yield RecordError(file, problem or "unreadable line", lineno)
            continue
        if not line.strip():
            continue
        try:
            yield lineno, json.loads(line)
        except json.JSONDecodeError as err:
            yield RecordError(file, f"not valid JSON ({err.msg} at column {err.colno})", lineno)


def read_jsonl_records(path: PathLike) -> Iterator[Item]:
    """``{"id", "text"}`` or ``{"id", "title", "abstract"}`` per line (``pmid``/``doc_id`` also name the ID).

    Blank lines are not records. Other keys (``mentions``...) are ignored.
    """
    path = Path(path)
    file = str(path)
    for item in _json_lines(path):
        if isinstance(item, RecordError):
            yield item
            continue
        lineno, data = item
        if not isinstance(data, dict):
            yield RecordError(file, f"expected a JSON object, got {type(data).__name__}", lineno)
            continue
        doc_id = next((data[k] for k in ("id", "pmid", "doc_id") if data.get(k) not in (None, "")), None)
        if "text" in data:
            text = data["text"]
            if not isinstance(text, str):
                yield RecordError(file, f"'text' is {type(text).__name__}, not a string", lineno, doc_id=None if doc_id is None else str(doc_id))
                continue
            yield _document(doc_id, text, file, line=lineno)
        elif "title" in data or "abstract" in data:
            title, abstract = data.get("title") or "", data.get("abstract") or ""
            if not isinstance(title, str) or not isinstance(abstract, str):
                yield RecordError(file, "'title' and 'abstract' must be strings", lineno, doc_id=None if doc_id is None else str(doc_id))
                continue
            yield _document(doc_id, _title_text(title, abstract), file, line=lineno, title=title)
        else:
            yield RecordError(file, "no 'text' (nor 'title'/'abstract')", lineno, doc_id=None if doc_id is None else str(doc_id))


def read_text_records(path: PathLike) -> Iterator[Item]:
    """One document per line; the ID is ``<path as given>:<line>``. A blank line is an empty document (an error)."""
    path = Path(path)
    file = str(path)
    for lineno, line, problem in _decoded_lines(path):
        if line is None:
            yield RecordError(file, problem or "unreadable line", lineno, doc_id=f"{file}:{lineno}")
            continue
        yield _document(f"{file}:{lineno}", line, file, line=lineno)


# -- XML: records cut out of the stream ---------------------------------------------------------------
def _xml_records(path: Path, tags: Sequence[str], block_chars: int = 1 << 16) -> Iterator[Tuple[int, Optional[str], Optional[str]]]:
    """(line, record text or None, problem) for each ``<tag ...>...</tag>`` in the file.

    A record whose end tag never comes (the next record starts first, or the
    file ends) gives ``None`` with the problem. Only the text from the current
    record on is kept in memory.
    """
    start_re = re.compile(r"<(%s)(?=[\s>/])" % "|".join(re.escape(t) for t in tags))
    buf, pos, eof = "", 0, False
    line_pos, line_no = 0, 1  # buf[line_pos] is on line line_no

    def line_at(index: int) -> int:
        nonlocal line_pos, line_no
        line_no += buf.count("\n", line_pos, index)
        line_pos = index
        return line_no

    def drop_before(index: int) -> None:
        nonlocal buf, pos, line_pos
        line_at(index)
        buf, pos, line_pos = buf[index:], max(0, pos - index), 0

    with open_text(path) as handle:
        def read_more() -> bool:
            nonlocal buf, eof
            try:
                data = handle.read(block_chars)
            except (OSError, EOFError, UnicodeDecodeError) as err:
                raise _StopFile(err) from err
            if not data:
                eof = True
                return False
            buf += data
            return True

        try:
            while True:
                match = start_re.search(buf, pos)
                if match is None:
                    if eof:
                        return
                    drop_before(max(pos, len(buf) - 256))  # a start tag may be cut by the block boundary
                    read_more()
                    continue
                tag, start = match.group(1), match.start()
                end_tag = f"</{tag}>"
                end = buf.find(end_tag, match.end())
                following = start_re.search(buf, match.end(), end if end != -1 else len(buf))
                if following is not None:
                    yield line_at(start), None, f"<{tag}> record without its end tag before the next record"
                    pos = following.start()
                    continue
                if end != -1:
                    stop = end + len(end_tag)
                    yield line_at(start), buf[start:stop], None
                    pos = stop
                    continue
                if eof:
                    yield line_at(start), None, f"<{tag}> record without its end tag at the end of the file"
                    return
                drop_before(start)
                read_more()
        except _StopFile as stop_err:
            yield line_at(min(pos, len(buf))), None, f"file cannot be read further ({stop_err.args[0]}); the rest of it is skipped"


class _StopFile(Exception):
    pass


def _parse_record(record: str) -> ET.Element:
    return ET.fromstring(record)


def _all_text(element: Optional[ET.Element]) -> str:
    return "".join(element.itertext()).strip() if element is not None else ""


def read_pubmed_records(path: PathLike) -> Iterator[Item]:
    """PubMed XML (annual baseline and update files): ``PubmedArticle`` and ``PubmedBookArticle``.

    ID: the citation's PMID; title: ``ArticleTitle`` (``VernacularTitle`` or
    ``BookTitle`` when empty), inline markup kept as text; abstract: the
    ``AbstractText`` sections joined with spaces (section labels left out, as
    PubTator does). ``DeleteCitation`` blocks are not documents.
    """
    path = Path(path)
    file = str(path)
    for line, record, problem in _xml_records(path, ("PubmedArticle", "PubmedBookArticle")):
        if record is None:
            yield RecordError(file, problem or "bad record", line)
            continue
        try:
            root = _parse_record(record)
        except ET.ParseError as err:
            yield RecordError(file, f"bad XML in the record ({err})", line)
            continue
        if root.tag == "PubmedArticle":
            pmid = root.findtext("MedlineCitation/PMID")
            base = root.find("MedlineCitation/Article")
            title = _all_text(base.find("ArticleTitle")) if base is not None else ""
            if not title and base is not None:
                title = _all_text(root.find("MedlineCitation/Article/VernacularTitle"))
        else:
            pmid = root.findtext("BookDocument/PMID")
            base = root.find("BookDocument")
            title = _all_text(base.find("ArticleTitle")) if base is not None else ""
            if not title and base is not None:
                title = _all_text(base.find("Book/BookTitle"))
        sections = [_all_text(t) for t in base.findall("Abstract/AbstractText")] if base is not None else []
        abstract = " ".join(s for s in sections if s)
        if pmid is None or not pmid.strip():
            yield RecordError(file, f"<{root.tag}> without a PMID", line)
            continue
        yield _document(pmid, _title_text(title, abstract), file, line=line, title=title)


# -- BioC -----------------------------------------------------------------------------------------------
def _bioc_record(data: Union[ET.Element, Dict[str, Any]]) -> Tuple[str, str, str]:
    """(id, title, abstract) laid out as :func:`spacy_genbioel.corpus.readers.read_bioc` does."""
    from bioc import BioCDocument, BioCPassage

    from spacy_genbioel.corpus.readers import _bioc_document  # the one passage-layout rule of the project

    doc = BioCDocument()
    if isinstance(data, dict):
        doc.id = str(data.get("id", ""))
        passages = [(p.get("offset", 0), p.get("text")) for p in data.get("passages", [])]
    else:
        doc.id = data.findtext("id") or ""
        passages = [(p.findtext("offset"), p.findtext("text")) for p in data.findall("passage")]
    for offset, text in passages:
        passage = BioCPassage()
        try:
            passage.offset = int(offset)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            raise ValueError(f"passage offset {offset!r} is not an integer") from None
        passage.text = text or ""
        doc.add_passage(passage)
    built = _bioc_document(doc, Path(""), (), check_offsets=False)
    return doc.id, built.title, built.abstract


def read_bioc_records(path: PathLike) -> Iterator[Item]:
    """BioC XML (streamed by ``<document>``) or BioC JSON.

    BioC JSON with one document per line is streamed; a single JSON
    collection has to be parsed whole (memory grows with the file: prefer BioC
    XML or JSON lines for big inputs). The text is laid out from the passages
    as :func:`spacy_genbioel.corpus.readers.read_bioc` does (title = first passage);
    annotations in the input are ignored.
    """
    path = Path(path)
    file = str(path)
    if _head(path).lstrip().startswith("<"):
        for line, record, problem in _xml_records(path, ("document",)):
            if record is None:
                yield RecordError(file, problem or "bad record", line)
                continue
            try:
                doc_id, title, abstract = _bioc_record(_parse_record(record))
            except (ET.ParseError, ValueError) as err:
                yield RecordError(file, f"bad BioC document ({err})", line)
                continue
            yield _document(doc_id, _title_text(title, abstract), file, line=line, title=title)
        return
    first = _first_json_line(path)
    if isinstance(first, dict) and "passages" in first:  # BioC JSON lines
        for item in _json_lines(path):
            if isinstance(item, RecordError):
                yield item
                continue
            lineno, data = item
            try:
                if not isinstance(data, dict) or not isinstance(data.get("passages"), list):
                    raise ValueError("a BioC document needs 'passages'")
                doc_id, title, abstract = _bioc_record(data)
            except (ValueError, TypeError, AttributeError) as err:
                yield RecordError(file, f"bad BioC JSON document ({err})", lineno)
                continue
            yield _document(doc_id, _title_text(title, abstract), file, line=lineno, title=title)
        return
    try:
        with open_text(path) as handle:
            data = json.load(handle)
    except (ValueError, OSError, EOFError) as err:
        yield RecordError(file, f"neither BioC XML nor BioC JSON ({err})", 1)
        return
    documents = data.get("documents") if isinstance(data, dict) and "documents" in data else data
    if isinstance(documents, dict):
        documents = [documents]
    if not isinstance(documents, list):
        yield RecordError(file, "BioC JSON without documents", 1)
        return
    for index, item in enumerate(documents, start=1):
        try:
            if not isinstance(item, dict) or not isinstance(item.get("passages"), list):
                raise ValueError("a BioC document needs 'passages'")
            doc_id, title, abstract = _bioc_record(item)
        except (ValueError, TypeError, AttributeError) as err:
            yield RecordError(file, f"bad BioC JSON document ({err})", record=index)
            continue
        yield _document(doc_id, _title_text(title, abstract), file, record=index, title=title)


def _first_json_line(path: Path) -> Any:
    for _, line, _ in _decoded_lines(path):
        if line is None:
            return None
        if line.strip():
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                return None
    return None


# -- format detection ---------------------------------------------------------------------------------------
def _head(path: Path, n_bytes: int = 1 << 16) -> str:
    try:
        with open_binary(path) as handle:
            data = handle.read(n_bytes)
    except (OSError, EOFError):
        return ""
    return data.decode("utf-8", errors="replace").lstrip("\ufeff")


_SUFFIXES = {".pubtator": "pubtator", ".bioc": "bioc", ".jsonl": "jsonl", ".ndjson": "jsonl", ".txt": None,
             ".xml": None, ".json": None}


def detect_format(path: PathLike) -> str:
    """Input format of a file from its content, the extension (``.gz`` stripped) breaking ties.

    ``<collection`` -> bioc; ``<PubmedArticleSet``/``<PubmedArticle`` -> pubmed;
    JSON whose first document has ``passages`` -> bioc (JSON), other JSON
    objects -> jsonl; ``ID|t|title`` first line -> pubtator; otherwise
    ``.pubtator``/``.jsonl`` by extension, else plain text.
    """
    path = Path(path)
    name = path.name.lower()
    if name.endswith(".gz"):
        name = name[:-3]
    by_suffix = _SUFFIXES.get(Path(name).suffix)
    head = _head(path)
    stripped = head.lstrip()
    if stripped.startswith("<"):
        if re.search(r"<(PubmedArticleSet|PubmedArticle|PubmedBookArticle)[\s>/]", head) or "pubmed_" in head[:2000].lower():
            return "pubmed"
        if re.search(r"<collection[\s>/]", head):
            return "bioc"
        raise AnnotateError(f"{path}: XML, but neither BioC (<collection>) nor PubMed (<PubmedArticleSet>); give --input-format")
    first_line = next((line for line in stripped.splitlines() if line.strip()), "")
    if stripped.startswith("["):
        return "bioc"  # a JSON list of BioC documents
    if stripped.startswith("{"):
        if '"passages"' in head or '"documents"' in head[:4096]:
            return "bioc"
        try:
            if isinstance(json.loads(first_line), dict):
                return "jsonl"
        except json.JSONDecodeError:
            pass
    if _PUBTATOR_TEXT.match(first_line) and "|t|" in first_line:
        return "pubtator"
    if by_suffix:
        return by_suffix
    return "text"


READERS: Dict[str, Callable[[PathLike], Iterator[Item]]] = {
    "pubtator": read_pubtator_records,
    "bioc": read_bioc_records,
    "pubmed": read_pubmed_records,
    "jsonl": read_jsonl_records,
    "text": read_text_records,
}


def _expand_inputs(inputs: Iterable[PathLike]) -> List[Path]:
    """Files as given; a folder stands for its files (not hidden, sorted by name)."""
    paths: List[Path] = []
    for item in [inputs] if isinstance(inputs, (str, Path)) else inputs:
        path = Path(item)
        if path.is_dir():
            paths.extend(sorted(p for p in path.iterdir() if p.is_file() and not p.name.startswith(".")))
        elif path.is_file():
            paths.append(path)
        else:
            raise AnnotateError(f"input not found: {path}")
    return paths


def read_records(inputs: Union[PathLike, Iterable[PathLike]], input_format: Optional[str] = None) -> Iterator[Item]:
    """Records and record errors of all inputs, in order; each file's format detected unless given."""
    if input_format is not None and input_format not in READERS:
        raise AnnotateError(f"unknown input format {input_format!r}; use one of {', '.join(INPUT_FORMATS)}")
    for path in _expand_inputs(inputs):
        fmt = input_format or detect_format(path)
        logger.info("reading %s as %s", path, fmt)
        yield from READERS[fmt](path)


# -- annotated documents ----------------------------------------------------------------------------------
class LinkedMention(NamedTuple):
    start: int
    end: int
    text: str
    label: str
    kb_id: Optional[str]
    candidates: List[Tuple[str, str, float]]


def doc_mentions(doc: Any, spans_key: Optional[str] = None) -> List[LinkedMention]:
    """The linker's spans of a doc (``doc.ents``, or ``doc.spans[spans_key]``) as plain records."""
    spans = doc.ents if spans_key is None else doc.spans.get(spans_key, [])
    mentions = []
    for span in spans:
        candidates = [(str(c[0]), str(c[1]), float(c[2])) for c in (span._.kb_candidates or ())]
        mentions.append(LinkedMention(span.start_char, span.end_char, span.text, span.label_, span._.kb_id, candidates))
    return mentions


@dataclass
class Annotated:
    record: InputRecord
    doc: Any
    mentions: List[LinkedMention] = field(default_factory=list)


class ChunkSummary(NamedTuple):
    ids: List[str]
    mentions: int
    linked: int


def _summary_of(items: Sequence[Annotated]) -> ChunkSummary:
    return ChunkSummary(
        [a.record.doc_id for a in items],
        sum(len(a.mentions) for a in items),
        sum(1 for a in items for m in a.mentions if m.kb_id),
    )


# -- writers ------------------------------------------------------------------------------------------------
class ChunkWriter:
    """Writes one chunk file and reads the document IDs back from one."""

    suffix = ""

    def __init__(self, spans_key: Optional[str] = None) -> None:
        self.spans_key = spans_key  # where the linker's spans are (None: doc.ents)

    def check(self, record: InputRecord) -> Optional[str]:
        """Why this record cannot be written in this format (None: it can)."""
        return None

    def write(self, items: Sequence[Annotated], path: Path) -> None:
        raise NotImplementedError

    def read_back(self, path: Path, vocab: Any) -> ChunkSummary:
        raise NotImplementedError


class JsonlWriter(ChunkWriter):
    """One document per line: ``id``, ``text`` (``title`` when the input had one) and
    ``mentions`` with ``start``, ``end``, ``text``, ``label``, ``kb_id`` and
    ``candidates`` as ``[id, name, score]`` lists."""

    suffix = ".jsonl"

    def write(self, items: Sequence[Annotated], path: Path) -> None:
        with path.open("w", encoding="utf8", newline="\n") as out:
            for item in items:
                record: Dict[str, Any] = {"id": item.record.doc_id, "text": item.record.text}
                if item.record.title is not None:
                    record["title"] = item.record.title
                record["mentions"] = [
                    {"start": m.start, "end": m.end, "text": m.text, "label": m.label, "kb_id": m.kb_id,
                     "candidates": [list(c) for c in m.candidates]}
                    for m in item.mentions
                ]
                out.write(json.dumps(record, ensure_ascii=False) + "\n")

    def read_back(self, path: Path, vocab: Any) -> ChunkSummary:
        ids, n_mentions, n_linked = [], 0, 0
        with path.open(encoding="utf8") as handle:
            for line in handle:
                if line.strip():
                    data = json.loads(line)
                    ids.append(str(data["id"]))
                    n_mentions += len(data["mentions"])
                    n_linked += sum(1 for m in data["mentions"] if m.get("kb_id"))
        return ChunkSummary(ids, n_mentions, n_linked)


def _flat(text: str) -> str:
    return text.replace("\r", " ").replace("\n", " ").replace("\t", " ")


class PubTatorWriter(ChunkWriter):
    """Title and abstract lines and one line per predicted mention, ``kb_id`` in the ID
    column (``-1`` when the linker gave none); readable by :func:`~spacy_genbioel.corpus.readers.read_pubtator`.
    Newlines and tabs in texts become spaces (same length, offsets kept)."""

    suffix = ".pubtator"

    def check(self, record: InputRecord) -> Optional[str]:
        if any(c in record.doc_id for c in "|\t\r\n") or record.doc_id != record.doc_id.strip():
            return f"document ID {record.doc_id!r} cannot be written as PubTator (it has '|', a tab or a newline)"
        return None

    def write(self, items: Sequence[Annotated], path: Path) -> None:
        from spacy_genbioel.corpus.readers import PubTatorAnnotation, PubTatorDocument, write_pubtator

        def documents() -> Iterator[PubTatorDocument]:
            for item in items:
                rec = item.record
                title, abstract = (rec.title, rec.abstract) if rec.title is not None else (rec.text, "")
                anns = [
                    PubTatorAnnotation(m.start, m.end, m.text, m.label, (m.kb_id,) if m.kb_id else (), nil=not m.kb_id,
                                       raw_ids=m.kb_id or "-1")
                    for m in item.mentions
                ]
                yield PubTatorDocument(rec.doc_id, title, abstract, anns)

        write_pubtator(documents(), path)

    def read_back(self, path: Path, vocab: Any) -> ChunkSummary:
        from spacy_genbioel.corpus.readers import read_pubtator

        ids, n_mentions, n_linked = [], 0, 0
        for doc in read_pubtator(path, check_offsets=False):
            ids.append(doc.pmid)
            n_mentions += len(doc.annotations)
            n_linked += sum(1 for a in doc.annotations if a.raw_ids not in ("", "-1"))
        return ChunkSummary(ids, n_mentions, n_linked)


# characters XML 1.0 cannot hold, and \r (a parser turns \r\n into \n, which would shift offsets)
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0d\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


class BioCWriter(ChunkWriter):
    """A BioC XML collection per chunk: a title passage (offset 0) and an abstract
    passage (offset ``len(title) + 1``), or one ``text`` passage; one annotation per
    mention with infons ``type`` (label), ``identifier`` (kb_id, absent when none),
    ``score`` and ``candidates`` (JSON). Characters XML cannot hold (and ``\\r``)
    become spaces, so offsets stay. Readable by :func:`~spacy_genbioel.corpus.readers.read_bioc`."""

    suffix = ".bioc.xml"

    def check(self, record: InputRecord) -> Optional[str]:
        if _NOT_XML.search(record.doc_id):
            return f"document ID {record.doc_id!r} has characters XML cannot hold"
        return None

    def write(self, items: Sequence[Annotated], path: Path) -> None:
        from bioc import BioCAnnotation, BioCCollection, BioCDocument, BioCLocation, BioCPassage, biocxml

        collection = BioCCollection()
        collection.source = "spacy_genbioel annotate"
        collection.key = PROVENANCE  # the sidecar that says which model and KB
        collection.date = ""  # kept out so that chunks are byte-identical across resumed runs
        for item in items:
            rec = item.record
            text = _NOT_XML.sub(" ", rec.text)
            doc = BioCDocument()
            doc.id = rec.doc_id
            if rec.title is not None:
                parts = [("title", 0, text[: len(rec.title)])]
                if rec.abstract:
                    parts.append(("abstract", len(rec.title) + 1, text[len(rec.title) + 1 :]))
            else:
                parts = [("text", 0, text)]
            passages = []
            for kind, offset, passage_text in parts:
                passage = BioCPassage()
                passage.offset = offset
                passage.text = passage_text
                passage.infons["type"] = kind
                doc.add_passage(passage)
                passages.append(passage)
            for index, m in enumerate(item.mentions):
                ann = BioCAnnotation()
                ann.id = f"T{index}"
                ann.text = _NOT_XML.sub(" ", m.text)
                ann.infons["type"] = m.label
                if m.kb_id:
                    ann.infons["identifier"] = m.kb_id
                if m.candidates:
                    ann.infons["score"] = repr(m.candidates[0][2])
                    ann.infons["candidates"] = json.dumps([list(c) for c in m.candidates], ensure_ascii=False)
                ann.add_location(BioCLocation(m.start, m.end - m.start))
                # the passage the mention starts in (offsets are document-level either way)
                owner = passages[-1] if len(passages) > 1 and m.start >= passages[-1].offset else passages[0]
                owner.add_annotation(ann)
            collection.add_document(doc)
        with path.open("w", encoding="utf8") as out:
            biocxml.dump(collection, out)

    def read_back(self, path: Path, vocab: Any) -> ChunkSummary:
        from spacy_genbioel.corpus.readers import read_bioc

        ids, n_mentions, n_linked = [], 0, 0
        for doc in read_bioc(path, check_offsets=False):
            ids.append(doc.pmid)
            n_mentions += len(doc.annotations)
            n_linked += sum(1 for a in doc.annotations if a.ids)
        return ChunkSummary(ids, n_mentions, n_linked)


class DocBinWriter(ChunkWriter):
    """A spaCy ``DocBin`` (``.spacy``) per chunk with user data: ``doc.user_data["doc_id"]``,
    ``["source"]`` (file:line) and the span extensions ``kb_id``/``kb_candidates``."""

    suffix = ".spacy"

    def write(self, items: Sequence[Annotated], path: Path) -> None:
        from spacy.tokens import DocBin

        docbin = DocBin(store_user_data=True)
        for item in items:
            item.doc.user_data["doc_id"] = item.record.doc_id
            item.doc.user_data["source"] = item.record.where
            docbin.add(item.doc)
        docbin.to_disk(path)

    def read_back(self, path: Path, vocab: Any) -> ChunkSummary:
        from spacy.tokens import DocBin

        ids, n_mentions, n_linked = [], 0, 0
        for doc in DocBin().from_disk(path).get_docs(vocab):
            ids.append(str(doc.user_data["doc_id"]))
            mentions = doc_mentions(doc, self.spans_key)
            n_mentions += len(mentions)
            n_linked += sum(1 for m in mentions if m.kb_id)
        return ChunkSummary(ids, n_mentions, n_linked)


WRITERS: Dict[str, type] = {"jsonl": JsonlWriter, "pubtator": PubTatorWriter, "bioc": BioCWriter, "docbin": DocBinWriter}


def _id_key(doc_id: str) -> Union[int, str]:
    """What the ID sets hold: PMID-like IDs as ints (about half the memory of a str), others as they are."""
    if doc_id.isascii() and doc_id.isdigit() and len(doc_id) < 19 and (doc_id[0] != "0" or doc_id == "0"):
        return int(doc_id)
    return doc_id


# -- durable files ------------------------------------------------------------------------------------------------


def _complete_lines(path: Path) -> List[str]:
    """The complete lines of an append-only file; a torn last line (a crash mid-append) is cut off."""
    if not path.exists():
        return []
    data = path.read_bytes()
    end = data.rfind(b"\n") + 1
    if end < len(data):
        logger.warning("%s: dropping an incomplete last line (interrupted write)", path)
        with path.open("r+b") as handle:
            handle.truncate(end)
            handle.flush()
            os.fsync(handle.fileno())
    return data[:end].decode("utf8").splitlines()


class _ErrorLog:
    """Append-only errors JSONL, de-duplicated against what an earlier run already wrote."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.seen: Set[Tuple[str, str, str]] = set()
        self.counts = collections.Counter()
        for line in _complete_lines(path):
            if not line.strip():
                continue
            data = json.loads(line)
            key = (data["file"], str(data.get("line")), str(data.get("record")))
            if key not in self.seen:
                self.seen.add(key)
                self.counts[data.get("kind", "error")] += 1
        path.parent.mkdir(parents=True, exist_ok=True)
        self.handle: IO[str] = path.open("a", encoding="utf8", newline="\n")

    def log(self, error: RecordError) -> None:
        if error.key in self.seen:
            return
        self.seen.add(error.key)
        self.counts[error.kind] += 1
        self.handle.write(json.dumps(error.to_dict(), ensure_ascii=False) + "\n")
        self.handle.flush()

    def close(self) -> None:
        self.handle.flush()
        os.fsync(self.handle.fileno())
        self.handle.close()


class _Checkpoint:
    """Committed chunks of an output folder, reconciled with the chunk files present."""

    def __init__(self, out: Path, writer: "ChunkWriter", vocab: Any) -> None:
        self.out = out
        self.path = out / CHECKPOINT
        self.writer = writer
        for tmp in out.glob(".*.tmp"):
            logger.info("removing %s left by an interrupted run", tmp)
            tmp.unlink()
        present = {p.name: p for p in out.iterdir() if _CHUNK_NAME.match(p.name)}
        foreign = [n for n in present if _CHUNK_NAME.match(n).group(2) != writer.suffix]  # type: ignore[union-attr]
        if foreign:
            raise AnnotateError(f"{out} holds chunks of another output format ({foreign[0]}); use another --out")
        entries: Dict[str, Dict[str, Any]] = {}
        lines = _complete_lines(self.path)
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                entry = json.loads(line)
                name = entry["chunk"]
            except (json.JSONDecodeError, KeyError, TypeError) as err:
                raise AnnotateError(f"{self.path}:{number}: corrupt checkpoint line ({err}); "
                                    "delete the checkpoint to rebuild it from the chunk files") from err
            entries[name] = entry
        changed = False
        for name in [n for n in entries if n not in present]:
            logger.warning("%s: chunk %s is in the checkpoint but not on disk; its documents will be annotated again", out, name)
            del entries[name]
            changed = True
        for name in sorted(set(present) - set(entries)):
            # committed (renamed) but the checkpoint append did not happen: the file is the truth
            logger.info("%s: chunk %s was not in the checkpoint; reading its IDs from the file", out, name)
            try:
                summary = writer.read_back(present[name], vocab)
            except Exception as err:  # noqa: BLE001  (whatever the format's reader raises)
                raise AnnotateError(f"{present[name]} cannot be read ({err}); delete it to annotate its documents again") from err
            entries[name] = {"chunk": name, "ids": summary.ids, "mentions": summary.mentions, "linked": summary.linked}
            changed = True
        ordered = [entries[n] for n in sorted(entries, key=lambda n: int(_CHUNK_NAME.match(n).group(1)))]  # type: ignore[union-attr]
        if changed or len(lines) != len(ordered):
            _atomic_write(self.path, lambda p: p.write_text("".join(json.dumps(e, ensure_ascii=False) + "\n" for e in ordered), encoding="utf8"))
        # IDs of committed documents; the entries keep only counts (memory: one set, not two copies)
        self.done: Set[Union[int, str]] = {_id_key(doc_id) for e in ordered for doc_id in e["ids"]}
        self.entries = [{k: v for k, v in e.items() if k != "ids"} | {"documents": len(e["ids"])} for e in ordered]
        numbers = [int(_CHUNK_NAME.match(e["chunk"]).group(1)) for e in ordered]  # type: ignore[union-attr]
        self.next_number = max(numbers) + 1 if numbers else 0

    def commit(self, items: Sequence[Annotated]) -> Dict[str, Any]:
        name = f"part-{self.next_number:06d}{self.writer.suffix}"
        _atomic_write(self.out / name, lambda p: self.writer.write(items, p))
        summary = _summary_of(items)
        entry = {"chunk": name, "ids": summary.ids, "mentions": summary.mentions, "linked": summary.linked}
        self._append(entry)
        self.entries.append({"chunk": name, "mentions": summary.mentions, "linked": summary.linked, "documents": len(summary.ids)})
        self.next_number += 1
        return entry

    def _append(self, entry: Dict[str, Any]) -> None:
        with self.path.open("a", encoding="utf8", newline="\n") as handle:
            handle.write(json.dumps(entry, ensure_ascii=False) + "\n")
            handle.flush()
            os.fsync(handle.fileno())

    @property
    def totals(self) -> Dict[str, int]:
        return {
            "documents_written": sum(e["documents"] for e in self.entries),
            "mentions": sum(e["mentions"] for e in self.entries),
            "mentions_linked": sum(e["linked"] for e in self.entries),
            "chunks": len(self.entries),
        }


@contextlib.contextmanager
def _locked(out: Path) -> Iterator[None]:
    """One run per output folder (the lock goes with the process, also on kill -9)."""
    import fcntl

    with (out / ".lock").open("w") as handle:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise AnnotateError(f"another annotate run is writing to {out}") from None
        yield


# -- running the pipeline ------------------------------------------------------------------------------------------
def _run_serial(nlp: Any, records: Sequence[InputRecord], batch_size: int) -> Iterator[Tuple[InputRecord, Any]]:
    """(record, doc or the exception) in order; a failing batch is retried one document at a time."""
    for start in range(0, len(records), batch_size):
        batch = records[start : start + batch_size]
        try:
            docs: List[Any] = list(nlp.pipe([r.text for r in batch], batch_size=len(batch)))
        except Exception as err:  # noqa: BLE001  (any component may fail; find the document)
            logger.warning("pipeline failed on a batch (%s); retrying its %d documents one by one", err, len(batch))
            docs = [_one(nlp, r) for r in batch]
        yield from zip(batch, docs)


def _one(nlp: Any, record: InputRecord) -> Any:
    try:
        return nlp(record.text)
    except Exception as err:  # noqa: BLE001
        return err


def _run_parallel(nlp: Any, records: Iterable[InputRecord], batch_size: int, n_process: int) -> Iterator[Tuple[InputRecord, Any]]:
    """``nlp.pipe`` with worker processes. Documents a worker failed on never come back;
    they are spotted by their sequence number and retried in this process."""
    inflight: Deque[Tuple[int, InputRecord]] = collections.deque()
    worker_errors: List[BaseException] = []

    def feed() -> Iterator[Tuple[str, int]]:
        for seq, record in enumerate(records):
            inflight.append((seq, record))
            yield record.text, seq

    def on_error(name: Optional[str], proc: Any, docs: Any, err: BaseException) -> None:
        if proc is not None:  # a call in this process (a retry): let it raise
            raise err
        worker_errors.append(err)  # a worker's batch came back empty: spotted below

    nlp.set_error_handler(on_error)
    # torch's OpenMP pool (libgomp) is not fork-safe: a forked worker of a
    # process whose pool has threads hangs. Workers run one thread each
    # anyway, so the parent drops to one thread while they are forked.
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for doc, seq in nlp.pipe(feed(), as_tuples=True, batch_size=batch_size, n_process=n_process):
            while inflight and inflight[0][0] < seq:
                _, lost = inflight.popleft()
                logger.warning("%s: a worker failed (%s); retrying the document here", lost.where, worker_errors[-1] if worker_errors else "?")
                yield lost, _one(nlp, lost)
            _, record = inflight.popleft()
            yield record, doc
        while inflight:
            _, lost = inflight.popleft()
            yield lost, _one(nlp, lost)
    finally:
        from spacy.util import raise_error

        nlp.set_error_handler(raise_error)
        torch.set_num_threads(threads)


def _provenance(nlp: Any, pipeline_dir: Path, component: Any, device: str, settings: Dict[str, Any], command: str) -> Dict[str, Any]:
    import spacy
    import torch
    import transformers

    from spacy_genbioel import __version__

    linker = component.linker
    kb = linker.kb
    model = linker.model
    try:
        model_device = str(next(model.parameters()).device)
    except StopIteration:
        model_device = device
    component_cfg = dict(nlp.config["components"].get(component.name, {}))
    now = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    return {
        "package": "spacy_genbioel",
        "version": __version__,
        "versions": {"spacy": spacy.__version__, "torch": torch.__version__, "transformers": transformers.__version__,
                     "python": sys.version.split()[0]},
        "pipeline": str(pipeline_dir.resolve()),
        "pipeline_meta": {k: nlp.meta.get(k) for k in ("lang", "name", "version")} | {"components": list(nlp.pipe_names)},
        "model": {
            "type": getattr(model.config, "model_type", type(model).__name__),
            "name_or_path": getattr(model.config, "_name_or_path", "") or "",
            "parameters": int(sum(p.numel() for p in model.parameters())),
            "component": component.name,
            "config": component_cfg,
        },
        "kb": {"name": kb.name, "checksum": kb.checksum(), "concepts": len(kb), "names": kb.n_names},
        "device": model_device,
        "created": now,
        "command": command,
        **settings,
        "runs": [{"started": now, "command": command}],
    }


def _genbioel_name(pipeline_dir: Path) -> str:
    """The name of the pipeline's genbioel component, from its config (usually ``genbioel``)."""
    from spacy.util import load_config

    config_path = pipeline_dir / "config.cfg"
    if not config_path.exists():
        raise AnnotateError(f"{pipeline_dir} is not a spaCy pipeline directory (no config.cfg)")
    components = load_config(config_path, interpolate=False).get("components", {})
    names = [n for n, cfg in components.items() if cfg.get("factory") == "genbioel"]
    if not names:
        raise AnnotateError(f"the pipeline in {pipeline_dir} has no genbioel component")
    return names[0]


def _genbioel_component(nlp: Any) -> Any:
    from spacy_genbioel.linking.component import GenBioELLinker

    for _, proc in nlp.pipeline:
        if isinstance(proc, GenBioELLinker):
            return proc
    raise AnnotateError(f"the pipeline has no genbioel component (components: {', '.join(nlp.pipe_names)})")


def annotate(
    inputs: Union[PathLike, Sequence[PathLike]],
    pipeline_dir: PathLike,
    out: PathLike,
    format: str = "jsonl",
    input_format: Optional[str] = None,
    batch_size: int = 64,
    n_process: int = 1,
    device: str = "auto",
    chunk_size: int = 500,
    errors_path: Optional[PathLike] = None,
    progress: bool = True,
    command: Optional[str] = None,
) -> Dict[str, Any]:
    """Annotate every document of ``inputs`` with the pipeline in ``pipeline_dir``; resumable.

    ``out`` is a folder: ``part-NNNNNN.<ext>`` chunk files of ``chunk_size``
    documents in input order, ``checkpoint.jsonl``, ``errors.jsonl`` (or
    ``errors_path``), ``provenance.json`` and ``summary.json``. Rerunning the
    same call continues where an interrupted one stopped. ``batch_size`` is the
    number of documents per ``nlp.pipe`` batch; ``n_process > 1`` runs
    ``nlp.pipe`` in worker processes (CPU only); ``device`` (``auto``,
    ``cpu``, ``cuda``, ``cuda:N``) is set on the genbioel component.

    Returns the summary written to ``summary.json``: ``documents_read``
    (records seen, valid or not), ``documents_written``, ``documents_skipped``
    (duplicate IDs), ``errors``, ``mentions``, ``mentions_linked`` (with a
    ``kb_id``), ``chunks``, and ``this_run`` figures (speed, documents found
    already done).
    """
    import spacy
    from spacy.util import minibatch

    from spacy_genbioel.models.bart import resolve_device
    from spacy_genbioel.linking import component as _pipeline  # noqa: F401  (registers the factory)

    if format not in WRITERS:
        raise AnnotateError(f"unknown output format {format!r}; use one of {', '.join(OUTPUT_FORMATS)}")
    if chunk_size < 1 or batch_size < 1 or n_process < 1:
        raise AnnotateError("chunk_size, batch_size and n_process must be at least 1")
    pipeline_dir = Path(pipeline_dir)
    out = Path(out)
    paths = _expand_inputs(inputs)
    if not paths:
        raise AnnotateError("no input files")
    if input_format is not None and input_format not in READERS:
        raise AnnotateError(f"unknown input format {input_format!r}; use one of {', '.join(INPUT_FORMATS)}")
    formats = [input_format or detect_format(p) for p in paths]  # fail on an unknown file before loading the model
    if n_process > 1:
        if device == "auto":
            device = "cpu"
        elif resolve_device(device).type != "cpu":
            raise AnnotateError("--n-process > 1 runs on CPU only; use one process with --device cuda")
    command = command or shlex.join(sys.argv)
    if out.exists() and not out.is_dir():
        raise AnnotateError(f"--out {out} is a file; it must be a folder")
    out.mkdir(parents=True, exist_ok=True)

    with _locked(out):
        (out / SUMMARY).unlink(missing_ok=True)  # present only after a run that finished
        name = _genbioel_name(pipeline_dir)
        nlp = spacy.load(pipeline_dir, config={"components": {name: {"device": device}}})
        component = _genbioel_component(nlp)
        writer: ChunkWriter = WRITERS[format](spans_key=component.spans_key)
        settings = {"format": format, "inputs": [{"path": str(p), "format": f} for p, f in zip(paths, formats)], "input_format": input_format,
                    "chunk_size": chunk_size, "batch_size": batch_size, "n_process": n_process}
        provenance = _provenance(nlp, pipeline_dir, component, device, settings, command)
        provenance_path = out / PROVENANCE
        if provenance_path.exists():
            previous = json.loads(provenance_path.read_text(encoding="utf8"))
            if previous.get("format") != format:
                raise AnnotateError(f"{out} was written as {previous.get('format')}, not {format}; use another --out")
            if previous.get("kb", {}).get("checksum") != provenance["kb"]["checksum"]:
                raise AnnotateError(f"{out} was written with another KB (checksum {previous.get('kb', {}).get('checksum')}); use another --out")
            if previous.get("chunk_size") != chunk_size:
                logger.warning("chunk size changed from %s to %s: chunk boundaries will differ from an uninterrupted run",
                               previous.get("chunk_size"), chunk_size)
            previous["runs"] = previous.get("runs", []) + provenance["runs"]
            provenance = previous
        _atomic_json(provenance_path, provenance)

        checkpoint = _Checkpoint(out, writer, nlp.vocab)
        errors = _ErrorLog(Path(errors_path) if errors_path else out / ERRORS)
        counts = collections.Counter()
        seen: Set[Union[int, str]] = set()  # IDs claimed in this pass over the inputs
        from tqdm import tqdm

        bar = tqdm(desc="annotate", unit=" docs", disable=not progress, dynamic_ncols=True, mininterval=0.5)

        def pending() -> Iterator[InputRecord]:
            """Valid, first-seen records not yet in a committed chunk; the rest goes to the errors file."""
            for item in (i for path, fmt in zip(paths, formats) for i in READERS[fmt](path)):
                counts["read"] += 1
                if isinstance(item, RecordError):
                    errors.log(item)
                    continue
                reason = writer.check(item)
                if reason:
                    errors.log(RecordError(item.file, reason, item.line, item.record, item.doc_id))
                    continue
                key = _id_key(item.doc_id)
                if key in seen:
                    errors.log(RecordError(item.file, f"duplicate document ID {item.doc_id!r}: the first one is kept",
                                           item.line, item.record, item.doc_id, kind="duplicate"))
                    continue
                seen.add(key)
                if key in checkpoint.done:
                    checkpoint.done.discard(key)  # now in `seen`: keep one copy
                    counts["resumed"] += 1
                    if counts["resumed"] % 10_000 == 0:
                        bar.set_postfix_str(f"{counts['resumed']} done before, skipped", refresh=True)
                    continue
                yield item

        spans_key = component.spans_key
        began = time.monotonic()

        def annotated(pairs: Iterable[Tuple[InputRecord, Any]]) -> Iterator[Annotated]:
            for record, doc in pairs:
                if isinstance(doc, BaseException):
                    errors.log(RecordError(record.file, f"pipeline failed on the document ({type(doc).__name__}: {doc})",
                                           record.line, record.record, record.doc_id))
                    continue
                item = Annotated(record, doc, doc_mentions(doc, spans_key))
                counts["run_docs"] += 1
                counts["run_mentions"] += len(item.mentions)
                bar.update(1)
                elapsed = max(time.monotonic() - began, 1e-9)
                resumed = f", {counts['resumed']} done before" if counts["resumed"] else ""
                bar.set_postfix_str(f"{counts['run_mentions'] / elapsed:.1f} mentions/s{resumed}", refresh=False)
                yield item

        try:
            if n_process == 1:
                # batches restart at each chunk, so a resumed run batches exactly as an uninterrupted one
                for chunk_records in minibatch(pending(), chunk_size):
                    items = list(annotated(_run_serial(nlp, list(chunk_records), batch_size)))
                    if items:
                        checkpoint.commit(items)
            else:
                for items in minibatch(annotated(_run_parallel(nlp, pending(), batch_size, n_process)), chunk_size):
                    checkpoint.commit(list(items))
        finally:
            bar.close()
            errors.close()

        seconds = time.monotonic() - began
        totals = checkpoint.totals
        summary: Dict[str, Any] = {
            "documents_read": counts["read"],
            "documents_written": totals["documents_written"],
            "documents_skipped": errors.counts["duplicate"],
            "errors": errors.counts["error"],
            "mentions": totals["mentions"],
            "mentions_linked": totals["mentions_linked"],
            "chunks": totals["chunks"],
            "complete": True,
            "out": str(out),
            "format": format,
            "errors_file": str(errors.path),
            "this_run": {
                "documents_resumed": counts["resumed"],
                "documents_annotated": counts["run_docs"],
                "mentions": counts["run_mentions"],
                "seconds": round(seconds, 3),
                "documents_per_s": round(counts["run_docs"] / seconds, 2) if seconds > 0 else None,
                "mentions_per_s": round(counts["run_mentions"] / seconds, 2) if seconds > 0 else None,
            },
        }
        _atomic_json(out / SUMMARY, summary)
        return summary


# -- command line ----------------------------------------------------------------------------------------------------
def register_annotate(app: Any) -> None:
    """Add the ``annotate`` command to a typer app (``cli.py``: ``register_annotate(app)``)."""
    import typer

    @app.command("annotate")
    def annotate_cmd(
        inputs: List[Path] = typer.Argument(..., help="Input files or folders: PubTator, BioC XML/JSON, PubMed XML, JSONL, plain text (.gz too)"),
        pipeline: Path = typer.Option(..., "--pipeline", help="spaCy pipeline directory with NER and a genbioel component"),
        out: Path = typer.Option(..., "--out", help="Output folder (chunk files, checkpoint, errors, provenance, summary)"),
        format: str = typer.Option("jsonl", "--format", "-f", help="jsonl | pubtator | bioc | docbin"),
        input_format: Optional[str] = typer.Option(None, "--input-format", help="pubtator | bioc | pubmed | jsonl | text (default: detected per file)"),
        n_process: int = typer.Option(1, "--n-process", help="Worker processes for nlp.pipe (CPU)"),
        device: str = typer.Option("auto", "--device", help="auto | cpu | cuda | cuda:N"),
        batch_size: int = typer.Option(64, "--batch-size", help="Documents per nlp.pipe batch"),
        chunk_size: int = typer.Option(500, "--chunk-size", help="Documents per output chunk (the unit of commit)"),
        errors: Optional[Path] = typer.Option(None, "--errors", help="Errors JSONL (default: OUT/errors.jsonl)"),
        progress: bool = typer.Option(True, "--progress/--no-progress"),
        verbose: bool = typer.Option(False, "--verbose", "-v"),
    ) -> None:
        """Link the mentions of many documents, streaming and resumable (rerun the same command after an interruption)."""
        from wasabi import msg

        logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, format="%(asctime)s %(name)s %(message)s")
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        hf_logging.set_verbosity_error()
        try:
            summary = annotate(inputs, pipeline, out, format=format, input_format=input_format, batch_size=batch_size,
                               n_process=n_process, device=device, chunk_size=chunk_size, errors_path=errors,
                               progress=progress, command=shlex.join(sys.argv))
        except AnnotateError as err:
            msg.fail(str(err), exits=1)
            return
        run = summary["this_run"]
        msg.good(
            f"{summary['documents_written']} documents, {summary['mentions']} mentions ({summary['mentions_linked']} linked) "
            f"in {summary['chunks']} chunks -> {out}"
        )
        msg.info(f"read {summary['documents_read']}, skipped {summary['documents_skipped']} duplicates, "
                 f"{summary['errors']} errors ({summary['errors_file']}); this run: {run['documents_annotated']} documents, "
                 f"{run['documents_per_s']} docs/s, {run['mentions_per_s']} mentions/s")
