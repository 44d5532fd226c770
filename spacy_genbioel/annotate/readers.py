"""Input of an annotation run: :class:`~spacy_genbioel.annotate.records.InputRecord`
streams from PubTator, BioC XML/JSON, PubMed XML, JSONL or plain text, ``.gz``
or not, and the detection of a file's format.

A malformed record becomes a :class:`~spacy_genbioel.annotate.records.RecordError`
and the stream goes on: lines are decoded one at a time, and XML files are cut
into records (``<PubmedArticle>``, ``<document>``) by a scanner and each record
is parsed alone, so one broken record costs that record, not the rest of the
file, and memory is bounded by the largest record. The format rules shared
with the gold-corpus readers (what a PubTator text line is, how BioC passages
are laid out as ``title + " " + abstract``) are :mod:`spacy_genbioel.corpus`'s.
"""
from __future__ import annotations

import json
import logging
import re
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple, Union

from spacy_genbioel.annotate.records import AnnotateError, InputRecord, Item, RecordError
from spacy_genbioel.corpus.bioc import bioc_text_document
from spacy_genbioel.corpus.pubtator import PubTatorDocument, pubtator_text_line
from spacy_genbioel.util import PathLike, open_binary, open_text

logger = logging.getLogger(__name__)

__all__ = [
    "INPUT_FORMATS",
    "READERS",
    "check_input_format",
    "detect_format",
    "expand_inputs",
    "read_bioc_records",
    "read_jsonl_records",
    "read_pubmed_records",
    "read_pubtator_records",
    "read_records",
    "read_text_records",
]

INPUT_FORMATS = ("pubtator", "bioc", "pubmed", "jsonl", "text")


def _document(doc_id: Any, text: Optional[str], file: str, *, line: Optional[int] = None,
              record: Optional[int] = None, title: Optional[str] = None) -> Item:
    """An InputRecord, or the RecordError saying why it cannot be one."""
    doc_id = "" if doc_id is None else str(doc_id).strip()
    if not doc_id:
        return RecordError(file, "document has no ID", line, record)
    if text is None or not text.strip():
        return RecordError(file, "empty document (no text)", line, record, doc_id)
    return InputRecord(doc_id, text, file, line, record, title)


def _titled(doc_id: Any, title: str, abstract: str, file: str, *, line: Optional[int] = None,
            record: Optional[int] = None) -> Item:
    """A title + abstract record laid out as a PubTatorDocument, so that PubTator/BioC outputs read back with the same offsets."""
    return _document(doc_id, PubTatorDocument("", title, abstract).text, file, line=line, record=record, title=title)


# -- low-level input -------------------------------------------------------------------------
def _decoded_lines(path: Path) -> Iterator[Tuple[int, Optional[str], Optional[str]]]:
    """(line number, text or None, error) per line, decoded one by one so a bad line costs one line
    (:func:`spacy_genbioel.util.iter_lines` raises instead: a corpus file is read whole or not at all)."""
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
        return _titled(doc["pmid"], doc["title"], doc["abstract"] or "", file, line=doc["line"])

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
        text_line = pubtator_text_line(line)
        if text_line and text_line[1] == "t":
            done = finish()
            if done is not None:
                yield done
            current = {"pmid": text_line[0], "title": text_line[2], "abstract": None, "line": lineno, "bad": None}
            continue
        pmid = text_line[0] if text_line else line.split("\t", 1)[0].strip()
        if current is None:
            yield RecordError(file, "line outside a document (no title line before it)", lineno)
            continue
        if pmid != current["pmid"]:
            current["bad"] = current["bad"] or f"line {lineno} belongs to PMID {pmid!r}, inside document {current['pmid']!r}"
        elif text_line:  # abstract line
            if current["abstract"] is not None:
                current["bad"] = current["bad"] or f"line {lineno}: a second abstract line"
            else:
                current["abstract"] = text_line[2]
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
        named = None if doc_id is None else str(doc_id)
        if "text" in data:
            text = data["text"]
            if not isinstance(text, str):
                yield RecordError(file, f"'text' is {type(text).__name__}, not a string", lineno, doc_id=named)
                continue
            yield _document(doc_id, text, file, line=lineno)
        elif "title" in data or "abstract" in data:
            title, abstract = data.get("title") or "", data.get("abstract") or ""
            if not isinstance(title, str) or not isinstance(abstract, str):
                yield RecordError(file, "'title' and 'abstract' must be strings", lineno, doc_id=named)
                continue
            yield _titled(doc_id, title, abstract, file, line=lineno)
        else:
            yield RecordError(file, "no 'text' (nor 'title'/'abstract')", lineno, doc_id=named)


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
class _StopFile(Exception):
    pass


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
            root = ET.fromstring(record)
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
        yield _titled(pmid, title, abstract, file, line=line)


# -- BioC -----------------------------------------------------------------------------------------------
def _bioc_record(data: Union[ET.Element, Dict[str, Any]], file: str, *, line: Optional[int] = None,
                 record: Optional[int] = None) -> Item:
    """One BioC document (a parsed ``<document>`` or a JSON object) laid out by
    :func:`~spacy_genbioel.corpus.bioc.bioc_text_document`; its annotations are ignored."""
    if isinstance(data, dict):
        doc_id = str(data.get("id", ""))
        passages = [(p.get("offset", 0), p.get("text")) for p in data.get("passages", [])]
    else:
        doc_id = data.findtext("id") or ""
        passages = [(p.findtext("offset"), p.findtext("text")) for p in data.findall("passage")]
    built = bioc_text_document(doc_id, passages)
    return _titled(built.pmid, built.title, built.abstract, file, line=line, record=record)


def _bioc_json_record(data: Any, file: str, *, line: Optional[int] = None, record: Optional[int] = None) -> Item:
    try:
        if not isinstance(data, dict) or not isinstance(data.get("passages"), list):
            raise ValueError("a BioC document needs 'passages'")
        return _bioc_record(data, file, line=line, record=record)
    except (ValueError, TypeError, AttributeError) as err:
        return RecordError(file, f"bad BioC JSON document ({err})", line, record)


def read_bioc_records(path: PathLike) -> Iterator[Item]:
    """BioC XML (streamed by ``<document>``) or BioC JSON.

    BioC JSON with one document per line is streamed; a single JSON
    collection has to be parsed whole (memory grows with the file: prefer BioC
    XML or JSON lines for big inputs). The text is laid out from the passages
    as :func:`spacy_genbioel.corpus.bioc.read_bioc` does (title = first passage);
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
                item = _bioc_record(ET.fromstring(record), file, line=line)
            except (ET.ParseError, ValueError) as err:
                item = RecordError(file, f"bad BioC document ({err})", line)
            yield item
        return
    first = _first_json_line(path)
    if isinstance(first, dict) and "passages" in first:  # BioC JSON lines
        for item in _json_lines(path):
            yield item if isinstance(item, RecordError) else _bioc_json_record(item[1], file, line=item[0])
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
        yield _bioc_json_record(item, file, record=index)


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
    if pubtator_text_line(first_line) and "|t|" in first_line:
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


def expand_inputs(inputs: Union[PathLike, Iterable[PathLike]]) -> List[Path]:
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


def check_input_format(input_format: Optional[str]) -> None:
    """Raise :class:`AnnotateError` for an input format no reader reads (None: detected per file)."""
    if input_format is not None and input_format not in READERS:
        raise AnnotateError(f"unknown input format {input_format!r}; use one of {', '.join(INPUT_FORMATS)}")


def read_records(inputs: Union[PathLike, Iterable[PathLike]], input_format: Optional[str] = None) -> Iterator[Item]:
    """Records and record errors of all inputs, in order; each file's format detected unless given."""
    check_input_format(input_format)
    for path in expand_inputs(inputs):
        fmt = input_format or detect_format(path)
        logger.info("reading %s as %s", path, fmt)
        yield from READERS[fmt](path)
