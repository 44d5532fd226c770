"""Output of an annotation run: one chunk of annotated documents as one file
(JSONL, PubTator, BioC XML or a spaCy ``DocBin``), and the document IDs and
mention counts read back from such a file (used when a run resumes and a
chunk's checkpoint line is missing). PubTator and BioC chunks are written and
read back with :mod:`spacy_genbioel.corpus`'s format code.

Concept IDs are written as they are, not escaped: a KB refuses an ID that
holds whitespace, a control character or an ID separator (``| + , ;``, see
:func:`spacy_genbioel.kb.base.id_problem`), which neither PubTator nor BioC
could write back (they have no escape), so every ID a linker gives fits every
format."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Dict, Iterator, Optional, Sequence

from spacy_genbioel.annotate.records import PROVENANCE, Annotated, ChunkSummary, InputRecord, doc_mentions
from spacy_genbioel.corpus.bioc import read_bioc
from spacy_genbioel.corpus.pubtator import PubTatorAnnotation, PubTatorDocument, read_pubtator, write_pubtator

__all__ = ["OUTPUT_FORMATS", "WRITERS", "BioCWriter", "ChunkWriter", "DocBinWriter", "JsonlWriter", "PubTatorWriter"]

OUTPUT_FORMATS = ("jsonl", "pubtator", "bioc", "docbin")


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
                    {
                        "start": m.start,
                        "end": m.end,
                        "text": m.text,
                        "label": m.label,
                        "kb_id": m.kb_id,
                        "candidates": [list(c) for c in m.candidates],
                    }
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


class PubTatorWriter(ChunkWriter):
    """Title and abstract lines and one line per predicted mention, ``kb_id`` in the ID
    column (``-1`` when the linker gave none); readable by :func:`~spacy_genbioel.corpus.pubtator.read_pubtator`.
    Newlines and tabs in texts become spaces (same length, offsets kept)."""

    suffix = ".pubtator"

    def check(self, record: InputRecord) -> Optional[str]:
        if any(c in record.doc_id for c in "|\t\r\n") or record.doc_id != record.doc_id.strip():
            return f"document ID {record.doc_id!r} cannot be written as PubTator (it has '|', a tab or a newline)"
        return None

    def write(self, items: Sequence[Annotated], path: Path) -> None:
        def documents() -> Iterator[PubTatorDocument]:
            for item in items:
                rec = item.record
                title, abstract = (rec.title, rec.abstract) if rec.title is not None else (rec.text, "")
                anns = [
                    PubTatorAnnotation(
                        m.start,
                        m.end,
                        m.text,
                        m.label,
                        (m.kb_id,) if m.kb_id else (),
                        nil=not m.kb_id,
                        raw_ids=m.kb_id or "-1",
                    )
                    for m in item.mentions
                ]
                yield PubTatorDocument(rec.doc_id, title, abstract, anns)

        write_pubtator(documents(), path)

    def read_back(self, path: Path, vocab: Any) -> ChunkSummary:
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
    become spaces, so offsets stay. Readable by :func:`~spacy_genbioel.corpus.bioc.read_bioc`."""

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


WRITERS: Dict[str, type] = {
    "jsonl": JsonlWriter,
    "pubtator": PubTatorWriter,
    "bioc": BioCWriter,
    "docbin": DocBinWriter,
}
