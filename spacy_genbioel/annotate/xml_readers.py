"""Annotation input from PubMed XML and BioC (XML or JSON): each record is cut
out of the stream and parsed alone.

XML files are cut into records (``<PubmedArticle>``, ``<document>``) by a
scanner, so one broken record costs that record, not the rest of the file, and
memory is bounded by the largest record. Bytes that are not UTF-8 are carried
through the scanner (``surrogateescape``) and make only the record they are in
an error. The layout of BioC passages (``title + " " + abstract``) is
:func:`spacy_genbioel.corpus.bioc.bioc_text_document`'s.
"""
from __future__ import annotations

import codecs
import contextlib
import io
import json
import re
import xml.etree.ElementTree as ET
from functools import partial
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, Optional, Sequence, Tuple, Union

from spacy_genbioel.annotate.lines import BLOCK, READ_ERRORS, first_json_value, json_lines, read_blocks, read_head
from spacy_genbioel.annotate.records import Item, RecordError, guarded, record_id, titled_record
from spacy_genbioel.corpus.bioc import bioc_text_document
from spacy_genbioel.util import PathLike, open_binary

__all__ = ["MAX_LAYOUT", "read_bioc_records", "read_pubmed_records", "xml_records"]

# the most characters BioC passage offsets may lay one document out over (far more than
# a pipeline takes: spaCy's default nlp.max_length is 1,000,000)
MAX_LAYOUT = 10_000_000
_ESCAPED = re.compile("[\udc80-\udcff]")  # a byte that is not UTF-8, as surrogateescape carries it


class _StopFile(Exception):
    pass


def xml_records(path: Path, tags: Sequence[str], block_chars: int = BLOCK) -> Iterator[Tuple[int, Optional[str], Optional[str]]]:
    """(line, record text or None, problem) for each ``<tag ...>...</tag>`` in the file.

    A record whose end tag never comes (the next record starts first, or the
    file ends), or that holds bytes that are not UTF-8, gives ``None`` with the
    problem. Only the text from the current record on is kept in memory.
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

    def checked(line: int, record: str) -> Tuple[int, Optional[str], Optional[str]]:
        bad = _ESCAPED.search(record)
        if bad is None:
            return line, record, None
        byte = ord(bad.group()) - 0xDC00
        return line, None, f"not UTF-8 text (byte 0x{byte:02x} on line {line + record.count(chr(10), 0, bad.start())})"

    decoder = codecs.getincrementaldecoder("utf-8")("surrogateescape")
    fresh = True  # nothing decoded yet (a BOM is dropped)
    with contextlib.closing(read_blocks(path, block_chars)) as blocks:
        def read_more() -> bool:
            nonlocal buf, eof, fresh
            try:
                data = next(blocks, None)
            except READ_ERRORS as err:
                raise _StopFile(err) from err
            if data is None:
                eof = True
                buf += decoder.decode(b"", final=True)
                return False
            text = decoder.decode(data)
            if fresh and text:
                fresh = False
                text = text[1:] if text.startswith("\ufeff") else text
            buf += text
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
                    yield checked(line_at(start), buf[start:stop])
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


def _parsed(path: Path, tags: Sequence[str], build: Callable[..., Item], bad_xml: str, what: str) -> Iterator[Item]:
    """``build(element, file, line=...)`` for each record of the file that parses; the rest are errors."""
    file = str(path)
    for line, record, problem in xml_records(path, tags):
        if record is None:
            yield RecordError(file, problem or "bad record", line)
            continue
        try:
            element = ET.fromstring(record)
        except ET.ParseError as err:
            yield RecordError(file, f"{bad_xml} ({err})", line)
            continue
        yield guarded(partial(build, element, file, line=line), file, line=line, what=what)


def _pubmed_record(root: ET.Element, file: str, *, line: int) -> Item:
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


def read_pubmed_records(path: PathLike) -> Iterator[Item]:
    """PubMed XML (annual baseline and update files): ``PubmedArticle`` and ``PubmedBookArticle``.

    ID: the citation's PMID; title: ``ArticleTitle`` (``VernacularTitle`` or
    ``BookTitle`` when empty), inline markup kept as text; abstract: the
    ``AbstractText`` sections joined with spaces (section labels left out, as
    PubTator does). ``DeleteCitation`` blocks are not documents.
    """
    yield from _parsed(Path(path), ("PubmedArticle", "PubmedBookArticle"), _pubmed_record, "bad XML in the record",
                       "cannot read the record")


# -- BioC -----------------------------------------------------------------------------------------------
def _bioc_record(data: Union[ET.Element, Dict[str, Any]], file: str, *, line: Optional[int] = None,
                 record: Optional[int] = None) -> Item:
    """One BioC document (a parsed ``<document>`` or a JSON object) laid out by
    :func:`~spacy_genbioel.corpus.bioc.bioc_text_document`; its annotations are ignored."""
    if isinstance(data, dict):
        doc_id, problem = record_id(data.get("id"))
        passages = [(p.get("offset", 0), p.get("text")) for p in data.get("passages", [])]
    else:
        doc_id, problem = record_id(data.findtext("id"))
        passages = [(p.findtext("offset"), p.findtext("text")) for p in data.findall("passage")]
    if doc_id is None:
        return RecordError(file, problem or "document has no ID", line, record)
    offsets = [o for o, _ in passages if isinstance(o, int) or (isinstance(o, str) and o.strip().lstrip("-").isdecimal())]
    if offsets and max(map(int, offsets)) - min(map(int, offsets)) > MAX_LAYOUT:
        return RecordError(file, f"passage offsets {min(map(int, offsets))}..{max(map(int, offsets))} would lay the document "
                                 f"out over more than {MAX_LAYOUT:,} characters", line, record, doc_id)
    built = bioc_text_document(doc_id, passages)
    return titled_record(built.pmid, built.title, built.abstract, file, line=line, record=record)


def _bioc_json_record(data: Any, file: str, *, line: Optional[int] = None, record: Optional[int] = None) -> Item:
    if not isinstance(data, dict) or not isinstance(data.get("passages"), list):
        return RecordError(file, "bad BioC JSON document (a BioC document needs 'passages')", line, record)
    return guarded(partial(_bioc_record, data, file, line=line, record=record), file, line=line, record=record,
                   what="bad BioC JSON document")


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
    if read_head(path)[0].lstrip().startswith("<"):
        yield from _parsed(path, ("document",), _bioc_record, "bad BioC document", "bad BioC document")
        return
    first = first_json_value(path)
    if isinstance(first, dict) and "passages" in first:  # BioC JSON lines
        for item in json_lines(path):
            yield item if isinstance(item, RecordError) else _bioc_json_record(item[1], file, line=item[0])
        return
    try:
        with io.TextIOWrapper(open_binary(path), encoding="utf-8-sig") as handle:
            data = json.load(handle)
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
