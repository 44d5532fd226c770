"""Input of an annotation run: :class:`~spacy_genbioel.annotate.records.InputRecord`
streams from PubTator, BioC XML/JSON, PubMed XML, JSONL or plain text, ``.gz``
or not, one reader per format (:data:`READERS`), and the input files of a run.

A malformed record becomes a :class:`~spacy_genbioel.annotate.records.RecordError`
and the stream goes on (a record over a cap of :class:`~spacy_genbioel.annotate.lines.ReadLimits`
too, the error naming the cap): lines are decoded one at a time (:mod:`.lines`), XML
records are parsed one at a time (:mod:`.xml_readers`), and whatever a reader
raises on one record is that record's error. :func:`safe_records` is the last
guard: a reader that fails all the same ends its file with one error entry
instead of ending the run. Format detection is :mod:`.detect`'s. The format rules
shared with the gold-corpus readers (what a PubTator text line is, how BioC
passages are laid out as ``title + " " + abstract``) are
:mod:`spacy_genbioel.corpus`'s.
"""

from __future__ import annotations

import logging
from functools import partial
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Union

from spacy_genbioel.annotate.detect import detect_format
from spacy_genbioel.annotate.lines import DEFAULT_LIMITS, ReadLimits, decoded_lines, json_lines
from spacy_genbioel.annotate.records import (
    AnnotateError,
    Item,
    RecordError,
    guarded,
    make_record,
    record_id,
    titled_record,
)
from spacy_genbioel.annotate.xml_readers import read_bioc_records, read_pubmed_records
from spacy_genbioel.corpus.pubtator import pubtator_text_line
from spacy_genbioel.util import PathLike

logger = logging.getLogger(__name__)

__all__ = [
    "INPUT_FORMATS",
    "READERS",
    "ReadLimits",
    "check_input_format",
    "detect_format",
    "expand_inputs",
    "read_bioc_records",
    "read_jsonl_records",
    "read_pubmed_records",
    "read_pubtator_records",
    "read_records",
    "read_text_records",
    "safe_records",
]

INPUT_FORMATS = ("pubtator", "bioc", "pubmed", "jsonl", "text")


# -- PubTator ----------------------------------------------------------------------------------
def read_pubtator_records(path: PathLike, limits: ReadLimits = DEFAULT_LIMITS) -> Iterator[Item]:
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
        return titled_record(doc["pmid"], doc["title"], doc["abstract"] or "", file, line=doc["line"])

    for lineno, line, problem in decoded_lines(path, limits):
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
            current["bad"] = (
                current["bad"] or f"line {lineno} belongs to PMID {pmid!r}, inside document {current['pmid']!r}"
            )
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
def _jsonl_record(data: Any, file: str, lineno: int) -> Item:
    if not isinstance(data, dict):
        return RecordError(file, f"expected a JSON object, got {type(data).__name__}", lineno)
    doc_id = next((data[k] for k in ("id", "pmid", "doc_id") if data.get(k) not in (None, "")), None)
    named = record_id(doc_id)[0]
    if "text" in data:
        text = data["text"]
        if not isinstance(text, str):
            return RecordError(file, f"'text' is {type(text).__name__}, not a string", lineno, doc_id=named)
        return make_record(doc_id, text, file, line=lineno)
    if "title" in data or "abstract" in data:
        title, abstract = data.get("title") or "", data.get("abstract") or ""
        if not isinstance(title, str) or not isinstance(abstract, str):
            return RecordError(file, "'title' and 'abstract' must be strings", lineno, doc_id=named)
        return titled_record(doc_id, title, abstract, file, line=lineno)
    return RecordError(file, "no 'text' (nor 'title'/'abstract')", lineno, doc_id=named)


def read_jsonl_records(path: PathLike, limits: ReadLimits = DEFAULT_LIMITS) -> Iterator[Item]:
    """``{"id", "text"}`` or ``{"id", "title", "abstract"}`` per line (``pmid``/``doc_id`` also name the ID).

    Blank lines are not records. Other keys (``mentions``...) are ignored. The ID
    must be a string or an integer: a list, object, boolean or float (NaN
    too) makes the line an error rather than a document with a made-up ID.
    """
    path = Path(path)
    file = str(path)
    for item in json_lines(path, limits):
        if isinstance(item, RecordError):
            yield item
        else:
            lineno, data = item
            yield guarded(partial(_jsonl_record, data, file, lineno), file, line=lineno)


def read_text_records(path: PathLike, limits: ReadLimits = DEFAULT_LIMITS) -> Iterator[Item]:
    """One document per line; the ID is ``<resolved path>:<line>``, the same however the path
    was spelled (``./a.txt``, ``../x/a.txt``, a symbolic link). A blank line is an empty document (an error)."""
    path = Path(path)
    file = str(path)
    name = str(path.resolve())
    for lineno, line, problem in decoded_lines(path, limits):
        if line is None:
            yield RecordError(file, problem or "unreadable line", lineno, doc_id=f"{name}:{lineno}")
            continue
        yield make_record(f"{name}:{lineno}", line, file, line=lineno)


READERS: Dict[str, Callable[[PathLike, ReadLimits], Iterator[Item]]] = {
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


def safe_records(path: Path, input_format: str, limits: ReadLimits = DEFAULT_LIMITS) -> Iterator[Item]:
    """The records of one file; should its reader raise all the same, one error entry
    (file, the line after the last record) ends the file and the run goes on."""
    last = 0
    records = READERS[input_format](path, limits)
    while True:
        try:
            item = next(records)
        except StopIteration:
            return
        except Exception as err:  # noqa: BLE001  (a reader bug must not end the whole run)
            yield RecordError(
                str(path),
                f"the {input_format} reader failed after line {last} ({type(err).__name__}: "
                f"{str(err)[:200]}); the rest of the file is skipped",
                last + 1,
            )
            return
        last = max(last, item.line or 0)
        yield item


def read_records(
    inputs: Union[PathLike, Iterable[PathLike]], input_format: Optional[str] = None, limits: ReadLimits = DEFAULT_LIMITS
) -> Iterator[Item]:
    """Records and record errors of all inputs, in order; each file's format detected unless given;
    ``limits``: the caps on one line or record (:class:`~spacy_genbioel.annotate.lines.ReadLimits`)."""
    check_input_format(input_format)
    for path in expand_inputs(inputs):
        fmt = input_format or detect_format(path)
        logger.info("reading %s as %s", path, fmt)
        yield from safe_records(path, fmt, limits)
