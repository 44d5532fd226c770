"""Annotation input from PubMed XML and BioC (XML or JSON): each record is cut
out of the stream and parsed alone.

XML files are cut into records (``<PubmedArticle>``, ``<document>``) by a
byte scanner (:func:`xml_records`), so one broken record costs that record,
not the rest of the file; every byte is searched a bounded number of times
(linear in the file, an unterminated record included), and no more than
``max_record_bytes`` (:class:`~spacy_genbioel.annotate.lines.ReadLimits`) of a
record is held. lxml's ``iterparse`` (what ``bioc.biocxml.iterparse`` runs) is
not used because it stops the whole file at the first record that is not
well-formed (or, with ``recover=True``, silently repairs it), where the scanner
keeps going after one bad record. Each record is parsed with the package's safe
parser (:mod:`spacy_genbioel.kb.safe_xml`: no entities, no network). A record
that is not UTF-8 is an error of its own. The layout of BioC passages
(``title + " " + abstract``) is :func:`spacy_genbioel.corpus.bioc.bioc_text_document`'s.
"""

from __future__ import annotations

import contextlib
import json
import re
from functools import partial
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple, Union

from spacy_genbioel.annotate.lines import (
    BLOCK,
    DEFAULT_LIMITS,
    READ_ERRORS,
    ReadLimits,
    json_lines,
    read_blocks,
    read_head,
)
from spacy_genbioel.annotate.records import Item, RecordError, guarded, record_id, titled_record
from spacy_genbioel.corpus.bioc import bioc_text_document
from spacy_genbioel.kb.safe_xml import XML_ERRORS, parse_xml
from spacy_genbioel.util import PathLike

__all__ = ["MAX_LAYOUT", "read_bioc_records", "read_pubmed_records", "xml_records"]

# the most characters BioC passage offsets may lay one document out over (far more than
# a pipeline takes: spaCy's default nlp.max_length is 1,000,000)
MAX_LAYOUT = 10_000_000
_OVERLAP = 64  # bytes kept from the end of what was searched: a tag may be cut by a block boundary


class _StopFile(Exception):
    pass


class _Scanner:
    """The bytes of a file from the record being cut out on: ``buf[0]`` is on line ``line0``."""

    def __init__(self, blocks: Iterator[bytes]) -> None:
        self.blocks, self.buf, self.eof, self.line0, self.fresh = blocks, b"", False, 1, True

    def line_at(self, index: int) -> int:
        return self.line0 + self.buf.count(b"\n", 0, index)

    def drop_before(self, index: int) -> None:
        """Forget ``buf[:index]`` (its lines counted)."""
        if index > 0:
            self.line0 += self.buf.count(b"\n", 0, index)
            self.buf = self.buf[index:]

    def read_more(self) -> None:
        try:
            data = next(self.blocks, None)
        except READ_ERRORS as err:
            raise _StopFile(err) from err
        if data is None:
            self.eof = True
            return
        if self.fresh and data:
            self.fresh = False
            data = data[3:] if data.startswith(b"\xef\xbb\xbf") else data
        self.buf += data


def _checked(line: int, record: bytes) -> Tuple[int, Optional[bytes], Optional[str]]:
    try:
        record.decode("utf-8")
    except UnicodeDecodeError as err:
        at = line + record.count(b"\n", 0, err.start)
        return line, None, f"not UTF-8 text (byte 0x{record[err.start]:02x} on line {at})"
    return line, record, None


def xml_records(
    path: Path, tags: Sequence[str], limits: ReadLimits = DEFAULT_LIMITS, block_chars: int = BLOCK
) -> Iterator[Tuple[int, Optional[bytes], Optional[str]]]:
    """(line, record bytes or None, problem) for each ``<tag ...>...</tag>`` in the file.

    A record whose end tag never comes (the next record starts first, or the
    file ends), that is longer than ``limits.max_record_bytes`` or that holds
    bytes that are not UTF-8 gives ``None`` with the problem.
    """
    names = b"|".join(re.escape(t.encode()) for t in tags)
    start_re = re.compile(rb"<(%s)(?=[\s>/])" % names)
    between_re = re.compile(rb"<(%s)(?=[\s>/])|</(%s)>" % (names, names))  # a start, or an end tag without its start
    cap = limits.max_record_bytes
    with contextlib.closing(read_blocks(path, block_chars)) as blocks:
        scan = _Scanner(blocks)
        try:
            yield from _cut(scan, (start_re, between_re), cap, limits)
        except _StopFile as stop_err:
            yield scan.line_at(0), None, f"file cannot be read further ({stop_err.args[0]}); the rest of it is skipped"


def _cut(
    scan: _Scanner, patterns: Tuple["re.Pattern[bytes]", "re.Pattern[bytes]"], cap: int, limits: ReadLimits
) -> Iterator[Tuple[int, Optional[bytes], Optional[str]]]:
    start_re, between_re = patterns
    pos = 0  # where the next record start is looked for
    while True:
        match = between_re.search(scan.buf, pos)
        if match is not None and match.group(2) is not None:  # a record whose start tag is damaged
            yield (
                scan.line_at(match.start()),
                None,
                f"</{match.group(2).decode()}> without its start tag (a damaged record)",
            )
            pos = match.end()
            continue
        if match is None:
            if scan.eof:
                return
            scan.drop_before(max(pos, len(scan.buf) - _OVERLAP))
            pos = 0
            scan.read_more()
            continue
        scan.drop_before(match.start())  # the record starts at buf[0]
        tag = match.group(1)
        end_tag = b"</" + tag + b">"
        line = scan.line_at(0)
        searched = match.end() - match.start()  # buf[:searched] holds neither the end tag nor another start
        over = False  # past the cap: bytes are dropped while the end is looked for
        while True:
            end = scan.buf.find(end_tag, searched)
            following = start_re.search(scan.buf, searched, end if end != -1 else len(scan.buf))
            if following is not None:
                if not over:
                    yield line, None, f"<{tag.decode()}> record without its end tag before the next record"
                pos = following.start()
                break
            if end != -1:
                stop = end + len(end_tag)
                if not over and stop > cap:
                    over = True
                    yield line, None, limits.over("max_record_bytes", f"<{tag.decode()}> record")
                if not over:
                    yield _checked(line, scan.buf[:stop])
                pos = stop
                break
            if not over and len(scan.buf) > cap:
                over = True
                yield line, None, limits.over("max_record_bytes", f"<{tag.decode()}> record")
            if scan.eof:
                if not over:
                    yield line, None, f"<{tag.decode()}> record without its end tag at the end of the file"
                return
            searched = max(searched, len(scan.buf) - _OVERLAP)
            if over:  # keep only the tail that a tag may start in
                scan.drop_before(searched)
                searched = 0
            scan.read_more()


def _all_text(element: Optional[Any]) -> str:
    return "".join(element.itertext()).strip() if element is not None else ""


def _parsed(
    path: Path, tags: Sequence[str], build: Callable[..., Item], bad_xml: str, what: str, limits: ReadLimits
) -> Iterator[Item]:
    """``build(element, file, line=...)`` for each record of the file that parses; the rest are errors."""
    file = str(path)
    for line, record, problem in xml_records(path, tags, limits):
        if record is None:
            yield RecordError(file, problem or "bad record", line)
            continue
        try:
            element = parse_xml(record)
        except XML_ERRORS as err:
            yield RecordError(file, f"{bad_xml} ({err})", line)
            continue
        yield guarded(partial(build, element, file, line=line), file, line=line, what=what)


def _pubmed_record(root: Any, file: str, *, line: int) -> Item:
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
        return RecordError(file, f"<{root.tag}> without a PMID", line)
    return titled_record(pmid, title, abstract, file, line=line)


def read_pubmed_records(path: PathLike, limits: ReadLimits = DEFAULT_LIMITS) -> Iterator[Item]:
    """PubMed XML (annual baseline and update files): ``PubmedArticle`` and ``PubmedBookArticle``.

    ID: the citation's PMID; title: ``ArticleTitle`` (``VernacularTitle`` or
    ``BookTitle`` when empty), inline markup kept as text; abstract: the
    ``AbstractText`` sections joined with spaces (section labels left out, as
    PubTator does). ``DeleteCitation`` blocks are not documents.
    """
    yield from _parsed(
        Path(path),
        ("PubmedArticle", "PubmedBookArticle"),
        _pubmed_record,
        "bad XML in the record",
        "cannot read the record",
        limits,
    )


# -- BioC -----------------------------------------------------------------------------------------------
def _bioc_record(
    data: Union[Any, Dict[str, Any]], file: str, *, line: Optional[int] = None, record: Optional[int] = None
) -> Item:
    """One BioC document (a parsed ``<document>`` or a JSON object) laid out by
    :func:`~spacy_genbioel.corpus.bioc.bioc_text_document`; its annotations are ignored."""
    if isinstance(data, dict):
        doc_id, problem = record_id(data.get("id"))
        passages = [(p.get("offset", 0), p.get("text")) for p in data.get("passages", [])]
        wrong = next((o for o, _ in passages if isinstance(o, bool) or not isinstance(o, int)), None)
        if wrong is not None or any(t is not None and not isinstance(t, str) for _, t in passages):
            what = (
                f"passage offset {json.dumps(wrong)[:40]} is not a JSON integer"
                if wrong is not None
                else "passage text is not a string"
            )
            return RecordError(file, f"bad BioC JSON document ({what})", line, record, doc_id)
    else:
        doc_id, problem = record_id(data.findtext("id"))
        passages = [(p.findtext("offset"), p.findtext("text")) for p in data.findall("passage")]
    if doc_id is None:
        return RecordError(file, problem or "document has no ID", line, record)
    offsets = [
        o for o, _ in passages if isinstance(o, int) or (isinstance(o, str) and o.strip().lstrip("-").isdecimal())
    ]
    if offsets and max(map(int, offsets)) - min(map(int, offsets)) > MAX_LAYOUT:
        return RecordError(
            file,
            f"passage offsets {min(map(int, offsets))}..{max(map(int, offsets))} would lay the document "
            f"out over more than {MAX_LAYOUT:,} characters",
            line,
            record,
            doc_id,
        )
    built = bioc_text_document(doc_id, passages)
    return titled_record(built.pmid, built.title, built.abstract, file, line=line, record=record)


def _bioc_json_record(data: Any, file: str, *, line: Optional[int] = None, record: Optional[int] = None) -> Item:
    if not isinstance(data, dict) or not isinstance(data.get("passages"), list):
        return RecordError(file, "bad BioC JSON document (a BioC document needs 'passages')", line, record)
    return guarded(
        partial(_bioc_record, data, file, line=line, record=record),
        file,
        line=line,
        record=record,
        what="bad BioC JSON document",
    )


def read_bioc_records(path: PathLike, limits: ReadLimits = DEFAULT_LIMITS) -> Iterator[Item]:
    """BioC XML (streamed by ``<document>``) or BioC JSON.

    BioC JSON with one document per line is streamed; a single JSON
    collection has to be parsed whole, up to ``limits.max_json_bytes`` (prefer BioC
    XML or JSON lines for big inputs). The text is laid out from the passages
    as :func:`spacy_genbioel.corpus.bioc.read_bioc` does (title = first passage);
    annotations in the input are ignored.
    """
    path = Path(path)
    file = str(path)
    if read_head(path)[0].lstrip().startswith("<"):
        yield from _parsed(path, ("document",), _bioc_record, "bad BioC document", "bad BioC document", limits)
        return
    first = _first_document(path, limits)
    if isinstance(first, dict) and "passages" in first:  # BioC JSON lines
        for item in json_lines(path, limits):
            yield item if isinstance(item, RecordError) else _bioc_json_record(item[1], file, line=item[0])
        return
    try:
        data = json.loads(_whole(path, limits).decode("utf-8-sig"))
    except _TooBig:
        yield RecordError(
            file,
            limits.over("max_json_bytes", "BioC JSON collection (read whole)")
            + "; write it as JSON lines (one document per line) or BioC XML",
            1,
        )
        return
    except RecursionError:
        yield RecordError(file, "neither BioC XML nor BioC JSON (JSON nested too deeply)", 1)
        return
    except (ValueError, *READ_ERRORS) as err:
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


def _first_document(path: Path, limits: ReadLimits) -> Any:
    """The first line's JSON value (None: not JSON), past lines over the cap (the errors of JSON lines)."""
    over = limits.over("max_line_bytes", "line")
    for item in json_lines(path, limits):
        if not isinstance(item, RecordError):
            return item[1]
        if item.reason != over:
            return None
    return None


class _TooBig(Exception):
    pass


def _whole(path: Path, limits: ReadLimits) -> bytes:
    """The whole file (``.gz`` inflated); :class:`_TooBig` past ``limits.max_json_bytes``."""
    parts: List[bytes] = []
    size = 0
    with contextlib.closing(read_blocks(path)) as blocks:
        for data in blocks:
            size += len(data)
            if size > limits.max_json_bytes:
                raise _TooBig
            parts.append(data)
    return b"".join(parts)
