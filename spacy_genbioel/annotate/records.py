"""What the parts of an annotation run share: the records they hand each other
(an input record or the error that replaces it, readers -> run; an annotated
document and its linked mentions, run -> writers; a chunk's figures, writers ->
checkpoint), the names of the output folder's files, and the run's one
exception, :class:`AnnotateError`.

:func:`make_record` is the one place that decides whether what a reader found
can be a document: an ID that is a string or an integer (not a list, object,
boolean or float), a text that is not blank and is valid Unicode (no lone
surrogates, which no output format can write); :func:`guarded` turns whatever
a reader raises on one record into that record's :class:`RecordError`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple, Union

__all__ = [
    "CHECKPOINT",
    "ERRORS",
    "JOB",
    "PROVENANCE",
    "SUMMARY",
    "AnnotateError",
    "Annotated",
    "ChunkSummary",
    "InputRecord",
    "Item",
    "LinkedMention",
    "RecordError",
    "chunk_summary",
    "doc_mentions",
    "guarded",
    "id_key",
    "make_record",
    "named",
    "record_id",
    "titled_record",
]


# the output folder, besides its part-NNNNNN chunk files
CHECKPOINT = "checkpoint.jsonl"
JOB = "job.json"
PROVENANCE = "provenance.json"
SUMMARY = "summary.json"
ERRORS = "errors.jsonl"


_NAMED = re.compile("\0([A-Za-z_][\\w.]*)\0")


def named(setting: str) -> str:
    """``setting`` (an argument or option of :func:`~.runner.annotate`, or a genbioel setting) as an
    :class:`AnnotateError` message names it: shown as is, or as a command line names it
    (:meth:`AnnotateError.naming`)."""
    return f"\0{setting}\0"


class AnnotateError(RuntimeError):
    """The run cannot start or go on (bad options, an output folder from another run...).

    The message names arguments, options and settings as Python code does (``out``, ``n_process``,
    ``device``); :meth:`naming` gives it with other names, such as the command line's flags."""

    def __init__(self, message: str) -> None:
        self.template = message  # the names marked by named()
        super().__init__(_NAMED.sub(r"\1", message))

    def __reduce__(self) -> Any:
        return type(self), (self.template,)

    @property
    def settings(self) -> List[str]:
        """The arguments, options and settings the message names, in order."""
        return _NAMED.findall(self.template)

    def naming(self, name: Callable[[str], str]) -> str:
        """The message with each setting it names as ``name(setting)`` (``"n_process"`` -> ``"--n-process"``)."""
        return _NAMED.sub(lambda match: name(match.group(1)), self.template)


@dataclass
class InputRecord:
    """One document to annotate. ``line`` is where it starts (1-based), ``record`` its
    index in files without usable line numbers. When the input separates title and
    abstract, ``title`` is set and ``text == title + " " + abstract`` (or the title
    alone when there is no abstract), the layout of :class:`~spacy_genbioel.corpus.pubtator.PubTatorDocument`."""

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

_SURROGATE = re.compile("[\ud800-\udfff]")
_KINDS = {bool: "a boolean", float: "a float", list: "a list", dict: "an object"}


def record_id(value: Any) -> Tuple[Optional[str], Optional[str]]:
    """``(ID, None)`` for a string or integer ID (stripped), ``(None, why not)`` for anything else."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None, "document has no ID"
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        kind = _KINDS.get(type(value), f"a {type(value).__name__}")
        return None, f"document ID {repr(value)[:60]} is {kind}, not a string or an integer"
    doc_id = str(value).strip()
    if _SURROGATE.search(doc_id):
        return None, "document ID is not valid Unicode (a lone surrogate)"
    return doc_id, None


def make_record(
    doc_id: Any,
    text: Optional[str],
    file: str,
    *,
    line: Optional[int] = None,
    record: Optional[int] = None,
    title: Optional[str] = None,
) -> Item:
    """An InputRecord, or the RecordError saying why it cannot be one."""
    checked, problem = record_id(doc_id)
    if checked is None:
        return RecordError(file, problem or "document has no ID", line, record)
    if text is None or not text.strip():
        return RecordError(file, "empty document (no text)", line, record, checked)
    bad = _SURROGATE.search(text)
    if bad:
        return RecordError(
            file,
            f"text is not valid Unicode (lone surrogate U+{ord(bad.group()):04X} at character {bad.start() + 1})",
            line,
            record,
            checked,
        )
    return InputRecord(checked, text, file, line, record, title)


def titled_record(
    doc_id: Any, title: str, abstract: str, file: str, *, line: Optional[int] = None, record: Optional[int] = None
) -> Item:
    """A title + abstract record laid out as a PubTatorDocument (``title + " " + abstract``), so that
    PubTator/BioC outputs read back with the same offsets."""
    from spacy_genbioel.corpus.pubtator import PubTatorDocument

    return make_record(doc_id, PubTatorDocument("", title, abstract).text, file, line=line, record=record, title=title)


def guarded(
    build: Callable[[], Item],
    file: str,
    *,
    line: Optional[int] = None,
    record: Optional[int] = None,
    what: str = "cannot read the record",
) -> Item:
    """``build()``, or the RecordError of whatever it raised (one bad record never ends a file)."""
    try:
        return build()
    except Exception as err:  # noqa: BLE001  (any failure on one record, RecursionError included, is that record's)
        return RecordError(file, f"{what} ({type(err).__name__}: {str(err)[:200]})", line, record)


def id_key(doc_id: str) -> Union[int, str]:
    """What the ID sets hold: PMID-like IDs as ints (about half the memory of a str), others as they are."""
    if doc_id.isascii() and doc_id.isdigit() and len(doc_id) < 19 and (doc_id[0] != "0" or doc_id == "0"):
        return int(doc_id)
    return doc_id


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


def chunk_summary(items: Sequence[Annotated]) -> ChunkSummary:
    """Document IDs, mentions and linked mentions of a chunk about to be committed."""
    return ChunkSummary(
        [a.record.doc_id for a in items],
        sum(len(a.mentions) for a in items),
        sum(1 for a in items for m in a.mentions if m.kb_id),
    )
