"""The ``visualize`` workflow: an HTML page of linked entities (displaCy) for
given texts or a sample of a corpus, linked by a pipeline or, with ``gold``,
as a PubTator/BioC/JSONL corpus annotates them.

Documents are read by the annotation readers (:mod:`spacy_genbioel.annotate.readers`:
PubTator, BioC, PubMed XML, JSONL, plain text; records that cannot be read
are counted and skipped); gold documents by :mod:`spacy_genbioel.corpus.load`.
The sample is the first ``n_docs`` documents, a seeded random sample of them
(``seed``) or the documents named by ``ids``.
"""

from __future__ import annotations

import logging
import os
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple, TypeVar

from spacy_genbioel.annotate.readers import read_records
from spacy_genbioel.annotate.records import AnnotateError, InputRecord, RecordError
from spacy_genbioel.corpus.load import UnknownFormatError, read_documents
from spacy_genbioel.corpus.pubtator import CorpusFormatError
from spacy_genbioel.corpus.spacy_docs import to_spacy_docs
from spacy_genbioel.kb.base import KnowledgeBase
from spacy_genbioel.util import PathLike, atomic_write
from spacy_genbioel.visualize.render import Names, genbioel_kb, pipeline_templates, render_html
from spacy_genbioel.visualize.urls import TemplateSpec, resolve_templates

logger = logging.getLogger(__name__)

__all__ = ["DocumentSource", "PageOptions", "VisualizeError", "VisualizeSummary", "sample", "visualize"]

T = TypeVar("T")


class VisualizeError(ValueError):
    """The page cannot be made (no input, an unreadable pipeline or corpus, bad options)."""


@dataclass
class VisualizeSummary:
    """What :func:`visualize` wrote."""

    out: Path
    documents: int
    entities: int
    linked: int
    with_page: int
    skipped_records: int = 0
    missing_ids: List[str] = field(default_factory=list)


def sample(items: Iterable[T], n_docs: int, seed: Optional[int] = None) -> List[T]:
    """The first ``n_docs`` items, or with ``seed`` a uniform random sample of
    ``n_docs`` (reservoir sampling: one pass, in input order)."""
    if n_docs < 1:
        raise VisualizeError(f"n_docs must be at least 1, got {n_docs}")
    if seed is None:
        chosen: List[T] = []
        for item in items:
            chosen.append(item)
            if len(chosen) >= n_docs:
                break
        return chosen
    rng = random.Random(seed)
    reservoir: List[Tuple[int, T]] = []
    for i, item in enumerate(items):
        if i < n_docs:
            reservoir.append((i, item))
        else:
            j = rng.randint(0, i)
            if j < n_docs:
                reservoir[j] = (i, item)
    return [item for _, item in sorted(reservoir, key=lambda pair: pair[0])]


def _select(
    pairs: Iterable[Tuple[str, T]], n_docs: int, seed: Optional[int], ids: Optional[Sequence[str]]
) -> Tuple[List[Tuple[str, T]], List[str]]:
    """Pairs ``(doc_id, item)``: those named by ``ids`` (in that order; missing ones listed), else a sample."""
    if not ids:
        return sample(pairs, n_docs, seed), []
    wanted = {i: None for i in ids}
    found: Dict[str, Tuple[str, T]] = {}
    for doc_id, item in pairs:
        if doc_id in wanted and doc_id not in found:
            found[doc_id] = (doc_id, item)
            if len(found) == len(wanted):
                break
    return [found[i] for i in wanted if i in found], [i for i in wanted if i not in found]


def _input_records(
    inputs: Sequence[PathLike], input_format: Optional[str], skipped: List[RecordError]
) -> Iterable[Tuple[str, InputRecord]]:
    for item in read_records(inputs, input_format):
        if isinstance(item, RecordError):
            logger.warning("skipped a record of %s (line %s): %s", item.file, item.line, item.reason)
            skipped.append(item)
            continue
        yield item.doc_id, item


def _load(pipeline: PathLike, device: Optional[str]) -> Any:
    import spacy

    path = Path(pipeline)
    if not (path / "config.cfg").is_file():
        raise VisualizeError(f"{path} is not a spaCy pipeline directory (no config.cfg)")
    try:
        nlp = spacy.load(path)
    except Exception as err:  # noqa: BLE001  (whatever loading a damaged pipeline raises)
        raise VisualizeError(f"the pipeline in {path} cannot be loaded ({type(err).__name__}: {err})") from err
    if device is not None:
        for name, config in nlp.config["components"].items():
            if config.get("factory") == "genbioel":
                nlp.get_pipe(name).device = device
    return nlp


def _check_writable(target: Path) -> None:
    """A :class:`VisualizeError` naming ``target`` when the page cannot be written there: a
    folder, or a path under a file or under a folder this process cannot write in."""
    if target.is_dir():
        raise VisualizeError(f"{target}: a folder, not an HTML file to write")
    existing = target.parent
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise VisualizeError(f"{target}: cannot write the page ({existing} is a file, not a folder)")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise VisualizeError(f"{target}: cannot write the page (no permission to write in {existing})")


@dataclass(frozen=True)
class DocumentSource:
    """The documents a page shows: ``texts``, or a sample of the documents of ``inputs``."""

    #: texts to link (instead of input files)
    texts: Sequence[str] = ()
    #: input files or folders: PubTator, BioC XML/JSON, PubMed XML, JSONL, plain text (``.gz`` too)
    inputs: Sequence[PathLike] = ()
    #: the inputs' format (default: detected per file; with ``gold``: pubtator, bioc or jsonl, default pubtator)
    input_format: Optional[str] = None
    #: the inputs are an annotated corpus, shown with its own IDs (no pipeline)
    gold: bool = False
    #: documents in the sample
    n_docs: int = 5
    #: draw a seeded random sample (default: the first ``n_docs`` documents)
    seed: Optional[int] = None
    #: the IDs of the documents to show, in that order, instead of a sample
    ids: Optional[Sequence[str]] = None


@dataclass(frozen=True)
class PageOptions:
    """How the entities of a page are labelled and linked (:func:`~.render.render_html`)."""

    #: concept pages: schemes (``mesh,omim``), a template with ``{}`` for the ID, or a mapping
    #: (default: the pipeline's ``meta.json`` ``kb_url_templates``, else every known scheme)
    templates: TemplateSpec = None
    #: ``both`` (``Disease: Reiter syndrome``), ``name`` or ``type``
    label: str = "both"
    #: which ``genbioel`` component's KB names the concepts, where a pipeline has several
    component: Optional[str] = None
    #: show ``doc.spans[spans_key]`` instead of ``doc.ents``
    spans_key: Optional[str] = None
    #: read the concept ID from ``span._.<kb_id_attr>`` instead of ``span.kb_id_``
    kb_id_attr: Optional[str] = None


def visualize(
    out: PathLike,
    source: DocumentSource,
    *,
    pipeline: Optional[PathLike] = None,
    kb: Optional[PathLike] = None,
    page: Optional[PageOptions] = None,
    device: Optional[str] = None,
) -> VisualizeSummary:
    """Write the displaCy page of the documents of ``source`` to ``out``.

    With a ``pipeline``, documents are linked by it (on ``device``, default the
    pipeline's); concept names come from its ``genbioel`` component's KB
    (``page.component`` names one) unless ``kb`` is given, and URL templates
    from ``page.templates``, else the pipeline's ``meta.json``
    (``kb_url_templates``), else every known scheme. With ``source.gold``, the
    inputs are an annotated corpus shown with its own IDs, names from ``kb`` if
    given. ``page.spans_key`` and ``page.kb_id_attr`` read a span group and an
    extension attribute instead of ``doc.ents`` and ``span.kb_id_``
    (:func:`~.render.displacy_input`)."""
    page = page or PageOptions()
    src = source
    if bool(src.texts) == bool(src.inputs):
        raise VisualizeError("give texts or input files (one of them)")
    if src.gold and (not src.inputs or pipeline is not None):
        raise VisualizeError("gold shows an annotated corpus: give input files and no pipeline")
    if not src.gold and pipeline is None:
        raise VisualizeError("give a pipeline to link with (or gold with an annotated corpus)")
    target = Path(out)
    _check_writable(target)  # before linking, which takes a while
    try:
        names: Names = KnowledgeBase.load(kb) if kb is not None else None
        resolved = resolve_templates(page.templates) if page.templates is not None else None
    except ValueError as err:
        raise VisualizeError(str(err)) from err
    skipped: List[RecordError] = []
    try:
        if src.gold:
            fmt = src.input_format or "pubtator"
            documents = (d for path in src.inputs or () for d in read_documents(path, fmt))
            chosen, missing = _select(((d.pmid, d) for d in documents), src.n_docs, src.seed, src.ids)
            import spacy

            docs = list(to_spacy_docs([d for _, d in chosen], spacy.blank("en")))
            titles = [doc_id for doc_id, _ in chosen]
            resolved = resolved or resolve_templates(None)
        else:
            nlp = _load(pipeline, device)  # type: ignore[arg-type]
            if src.texts:
                chosen, missing = [(None, text) for text in src.texts], []
                titles = [None] * len(src.texts)
            else:
                chosen, missing = _select(
                    _input_records(src.inputs or (), src.input_format, skipped), src.n_docs, src.seed, src.ids
                )
                titles = [doc_id for doc_id, _ in chosen]
            docs = list(nlp.pipe(item if isinstance(item, str) else item.text for _, item in chosen))
            if names is None:
                names = genbioel_kb(nlp, page.component)
            resolved = resolved or pipeline_templates(nlp)
    except (AnnotateError, CorpusFormatError, UnknownFormatError, OSError) as err:
        raise VisualizeError(str(err)) from err
    if not docs:
        raise VisualizeError("no document to show" + (f" (not found: {', '.join(missing)})" if missing else ""))
    for doc_id in missing:
        logger.warning("document %s not found in the inputs", doc_id)
    spans_key, kb_id_attr = page.spans_key, page.kb_id_attr
    try:
        html = render_html(
            docs,
            templates=resolved,
            names=names,
            label=page.label,
            titles=titles,
            spans_key=spans_key,
            kb_id_attr=kb_id_attr,
        )
    except AttributeError as err:  # an extension attribute that is not registered
        raise VisualizeError(f"kb_id attribute {kb_id_attr!r}: {err}") from err
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(target, lambda p: p.write_text(html, encoding="utf8"))
    except OSError as err:
        raise VisualizeError(f"{target}: cannot write the page ({err.strerror or err})") from None
    ents = [e for doc in docs for e in (doc.ents if spans_key is None else doc.spans.get(spans_key, []))]
    return VisualizeSummary(
        out=target,
        documents=len(docs),
        entities=len(ents),
        linked=sum(1 for e in ents if (getattr(e._, kb_id_attr) if kb_id_attr else e.kb_id_)),
        with_page=html.count('href="http'),
        skipped_records=len(skipped),
        missing_ids=missing,
    )
