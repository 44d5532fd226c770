"""The input format of an annotation input file, from its first 64 KB (the
extension breaking ties), and the refusal of files whose format cannot be told.

A file is read as plain text only when nothing says it is something else: when
the first line is not PubTator, JSON or XML but a later line of the head is
(a PubTator file with one stray first line, JSON lines after a comment line),
or when the start of a ``.gz`` cannot be read at all, detection stops with an
:class:`~spacy_genbioel.annotate.records.AnnotateError` that asks for
the input format (annotate's ``input_format``).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Dict, Optional

from spacy_genbioel.annotate.lines import read_head
from spacy_genbioel.annotate.records import AnnotateError, named
from spacy_genbioel.corpus.pubtator import pubtator_text_line
from spacy_genbioel.util import PathLike

__all__ = ["detect_format"]

_SUFFIXES: Dict[str, Optional[str]] = {
    ".pubtator": "pubtator",
    ".bioc": "bioc",
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".txt": None,
    ".xml": None,
    ".json": None,
}
_XML_RECORD = re.compile(r"<(PubmedArticleSet|PubmedArticle|PubmedBookArticle|collection|document)[\s>/]")


def _json_object(line: str) -> bool:
    try:
        return isinstance(json.loads(line), dict)
    except (ValueError, RecursionError):
        return False


def _pubtator_title(line: str) -> bool:
    parsed = pubtator_text_line(line)
    return parsed is not None and parsed[1] == "t" and "|t|" in line


def _looks_like(line: str) -> Optional[str]:
    """The format a line of the head says its file is in, if any."""
    if _pubtator_title(line):
        return "pubtator"
    if line.lstrip().startswith("{") and _json_object(line):
        return "jsonl"
    if _XML_RECORD.search(line):
        return "XML"
    return None


def detect_format(path: PathLike) -> str:
    """Input format of a file from its content, the extension (``.gz`` stripped) breaking ties.

    ``<collection`` -> bioc; ``<PubmedArticleSet``/``<PubmedArticle`` -> pubmed;
    JSON whose first document has ``passages`` -> bioc (JSON), other JSON
    objects -> jsonl; ``ID|t|title`` first line -> pubtator; otherwise
    ``.pubtator``/``.jsonl`` by extension, else plain text, unless a later line
    of the head is PubTator, JSON or XML (then :class:`AnnotateError`: give
    the input format, annotate's ``input_format``).
    """
    path = Path(path)
    name = path.name.lower()
    if name.endswith(".gz"):
        name = name[:-3]
    by_suffix = _SUFFIXES.get(Path(name).suffix)
    try:
        head, problem = read_head(path)
    except OSError as err:
        raise AnnotateError(f"{path}: cannot be read ({err})") from err
    stripped = head.lstrip()
    if not stripped:
        if problem:
            raise AnnotateError(
                f"{path}: the start of the file cannot be read ({problem}), so its format cannot be told; "
                f"give the input format ({named('input_format')}) to read what can be read"
            )
        return by_suffix or "text"  # an empty file: no documents either way
    if stripped.startswith("<"):
        if (
            re.search(r"<(PubmedArticleSet|PubmedArticle|PubmedBookArticle)[\s>/]", head)
            or "pubmed_" in head[:2000].lower()
        ):
            return "pubmed"
        if re.search(r"<collection[\s>/]", head):
            return "bioc"
        raise AnnotateError(
            f"{path}: XML, but neither BioC (<collection>) nor PubMed (<PubmedArticleSet>); "
            f"give the input format ({named('input_format')})"
        )
    lines = re.split(r"\r\n|\r|\n", stripped)
    if len(lines) > 1 and not head.endswith(("\n", "\r")):
        lines = lines[:-1]  # the last line of a cut head is not whole
    first = next((i for i, line in enumerate(lines) if line.strip()), 0)
    first_line = lines[first]
    if re.match(r"\[\s*[{\]]", stripped):
        return "bioc"  # a JSON list of BioC documents
    if stripped.startswith("{"):
        if '"passages"' in head or '"documents"' in head[:4096]:
            return "bioc"
        if _json_object(first_line):
            return "jsonl"
    if _pubtator_title(first_line):
        return "pubtator"
    if by_suffix:
        return by_suffix
    skipped = len(re.findall(r"\r\n|\r|\n", head[: len(head) - len(stripped)]))  # blank lines before the first
    for index in range(first + 1, len(lines)):
        kind = _looks_like(lines[index])
        if kind:
            choices = {"pubtator": "pubtator", "jsonl": "jsonl", "XML": "pubmed or bioc"}[kind]
            raise AnnotateError(
                f"{path}: the format cannot be told: line {skipped + index + 1} looks like {kind} "
                f"({lines[index][:60]!r}) but the first line ({first_line[:60]!r}) does not; give the input format "
                f"({named('input_format')}: {choices}, and the lines that are not become errors; or text)"
            )
    return "text"
