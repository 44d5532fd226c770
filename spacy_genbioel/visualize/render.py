"""Linked entities through displaCy: each entity labelled with its type and the
concept's name, its ID linking to the concept's page.

spaCy's ``displacy.render(doc, style="ent")`` shows ``ent.label_`` and links
``ent.kb_id_`` through one ``kb_url_template``; :func:`displacy_input` builds
the manual-format input instead (``{"text", "ents": [{"start", "end", "label",
"kb_id", "kb_url"}], "title"}``) so that the label can carry the concept's
preferred name and the link is chosen per ID (:mod:`.urls`). displaCy inserts
labels, IDs, URLs and titles into its HTML as they are, so they are escaped
here; the text it escapes itself.
"""

from __future__ import annotations

import html
import logging
import re
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Union

from spacy import displacy
from spacy.language import Language
from spacy.tokens import Doc, Span
from spacy.util import filter_spans

from spacy_genbioel.kb.base import KnowledgeBase
from spacy_genbioel.linking.component import GenBioELLinker
from spacy_genbioel.visualize.urls import TemplateSpec, concept_url, resolve_templates

logger = logging.getLogger(__name__)

__all__ = [
    "LABEL_MODES",
    "Names",
    "displacy_input",
    "entity_label",
    "genbioel_kb",
    "pipeline_templates",
    "render_html",
    "type_colors",
]

LABEL_MODES = ("both", "name", "type")

#: Background of an entity by its type (upper-cased); other types take the palette in turn.
TYPE_COLORS: Dict[str, str] = {"DISEASE": "#ffb3b3", "CHEMICAL": "#b3d9ff", "GENE": "#c5e8b7", "SPECIES": "#f5e0a3"}
PALETTE = ("#e0c3f0", "#ffd8a8", "#b8e6e0", "#f0c8d8", "#d8d8a8", "#c8d0f0")

#: Where a pipeline records the URL templates of its KB (``package --kb-url``).
META_KEY = "kb_url_templates"

_COMPOSITE = re.compile(r"[|+]")

Names = Union[None, KnowledgeBase, Mapping[str, str], Callable[[str], Optional[str]]]


def _name_lookup(names: Names) -> Callable[[str], Optional[str]]:
    if names is None:
        return lambda cid: None
    if isinstance(names, KnowledgeBase):
        return lambda cid: names.preferred_name(cid) if cid in names else None
    if isinstance(names, Mapping):
        return names.get
    return names


def genbioel_kb(nlp: Language, component: Optional[str] = None) -> KnowledgeBase:
    """The KB of the pipeline's ``genbioel`` component (``component`` names it where
    there are several; loaded on first use, as linking does)."""
    linkers = {name: pipe for name, pipe in nlp.pipeline if isinstance(pipe, GenBioELLinker)}
    if component is not None:
        if component not in linkers:
            raise ValueError(
                f"no genbioel component named {component!r} in the pipeline (it has: {', '.join(linkers) or 'none'})"
            )
        return linkers[component].linker.kb
    if not linkers:
        raise ValueError(f"the pipeline has no genbioel component (its pipes: {', '.join(nlp.pipe_names) or 'none'})")
    if len(linkers) > 1:
        logger.warning("several genbioel components (%s): names come from %r", ", ".join(linkers), next(iter(linkers)))
    return next(iter(linkers.values())).linker.kb


def pipeline_templates(nlp: Language, templates: TemplateSpec = None) -> Dict[str, str]:
    """The URL templates to use with a pipeline: ``templates`` when given, else the
    ones its ``meta.json`` records under ``kb_url_templates``, else every known scheme."""
    if templates is None:
        templates = nlp.meta.get(META_KEY) or None
    return resolve_templates(templates)


def entity_label(type_label: str, name: Optional[str], mode: str = "both") -> str:
    """The label displaCy shows (not escaped): ``"Disease: Reiter syndrome"``
    (``both``), ``"Reiter syndrome"`` (``name``) or ``"Disease"`` (``type``); an
    entity without a concept name shows its type."""
    if mode not in LABEL_MODES:
        raise ValueError(f"unknown label mode {mode!r}; use one of {', '.join(LABEL_MODES)}")
    if not name or mode == "type":
        return type_label
    if mode == "name" or not type_label:
        return name
    return f"{type_label}: {name}"


def _kb_id(span: Span, kb_id_attr: Optional[str]) -> Optional[str]:
    value = getattr(span._, kb_id_attr) if kb_id_attr else span.kb_id_
    return str(value) if value else None


def _candidate_name(span: Span, kb_id: str) -> Optional[str]:
    """The name the linker matched for ``kb_id``, from ``span._.kb_candidates`` ``(id, name, score)``."""
    candidates = span._.kb_candidates if span.has_extension("kb_candidates") else None
    for candidate in candidates or ():
        if len(candidate) >= 2 and candidate[0] == kb_id:
            return str(candidate[1])
    return None


def type_colors(labels: Iterable[str], colors: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
    """Background per upper-cased type: ``colors`` (type -> CSS colour) first, then
    :data:`TYPE_COLORS`, the other types taking :data:`PALETTE` in order of appearance."""
    palette = {**TYPE_COLORS, **{k.upper(): v for k, v in (colors or {}).items()}}
    n_new = 0
    for label in labels:
        if label.upper() not in palette:
            palette[label.upper()] = PALETTE[n_new % len(PALETTE)]
            n_new += 1
    return palette


def displacy_input(
    doc: Doc,
    *,
    templates: TemplateSpec = None,
    names: Names = None,
    label: str = "both",
    spans_key: Optional[str] = None,
    kb_id_attr: Optional[str] = None,
    colors: Optional[Dict[str, str]] = None,
    title: Optional[str] = None,
) -> Dict[str, Any]:
    """displaCy's manual ``ent`` input for one linked doc.

    ``names`` gives a concept's name (a KB, a mapping or a function; default and
    fallback: the name the linker matched, from ``span._.kb_candidates``);
    ``label`` is ``both``, ``name`` or ``type`` (:func:`entity_label`);
    ``templates`` as :func:`~spacy_genbioel.visualize.urls.resolve_templates`
    reads them. Spans come from ``doc.ents`` or ``doc.spans[spans_key]``
    (overlaps resolved with spaCy's ``filter_spans``), the concept ID from
    ``span.kb_id_`` or the extension ``kb_id_attr``. An entity without a
    concept has no link; an ID no template fits shows without a page (``#``);
    a composite ID (``D001|D002``, gold corpora) shows its first concept's name and page.
    Each entity's ``params["bg"]`` colours it by type (``colors``: type ->
    CSS colour). Everything displaCy does not escape is escaped here."""
    if label not in LABEL_MODES:
        raise ValueError(f"unknown label mode {label!r}; use one of {', '.join(LABEL_MODES)}")
    resolved = resolve_templates(templates)
    lookup = _name_lookup(names)
    spans: Sequence[Span] = (
        doc.ents if spans_key is None else filter_spans(doc.spans[spans_key]) if spans_key in doc.spans else []
    )
    palette = type_colors((span.label_ for span in spans), colors)
    ents: List[Dict[str, Any]] = []
    for span in spans:
        kb_id = _kb_id(span, kb_id_attr)
        first = _COMPOSITE.split(kb_id)[0] if kb_id else None  # a gold "D001|D002" shows the first concept
        name = (lookup(first) or _candidate_name(span, first)) if first else None
        url = concept_url(first, resolved) if first else None
        ents.append(
            {
                "start": span.start_char,
                "end": span.end_char,
                "label": html.escape(entity_label(span.label_, name, label), quote=False),
                "kb_id": html.escape(kb_id, quote=False) if kb_id else "",
                "kb_url": html.escape(url, quote=True) if url else "#",
                "params": {"bg": palette[span.label_.upper()]},
            }
        )
    if title is None:
        title = doc.user_data.get("title") if doc.user_data else None
    return {"text": doc.text, "ents": ents, "title": html.escape(str(title), quote=False) if title else None}


def render_html(
    docs: Union[Doc, Iterable[Doc]],
    *,
    page: bool = True,
    titles: Optional[Sequence[Optional[str]]] = None,
    **options: Any,
) -> str:
    """displaCy HTML of linked docs (a whole page unless ``page=False``), ``titles``
    one per doc; ``options`` are :func:`displacy_input`'s (``names``, ``label``,
    ``templates``, ``spans_key``, ``kb_id_attr``, ``colors``), a type keeping one
    colour across the docs."""
    docs = [docs] if isinstance(docs, Doc) else list(docs)
    titles = list(titles) if titles is not None else [None] * len(docs)
    if len(titles) != len(docs):
        raise ValueError(f"{len(titles)} titles for {len(docs)} docs")
    spans_key = options.get("spans_key")
    labels = (s.label_ for doc in docs for s in (doc.ents if spans_key is None else doc.spans.get(spans_key, [])))
    options = {
        **options,
        "templates": resolve_templates(options.get("templates")),
        "colors": type_colors(labels, options.get("colors")),
    }
    parsed = [displacy_input(doc, title=title, **options) for doc, title in zip(docs, titles)]
    return displacy.render(parsed, style="ent", manual=True, page=page, jupyter=False)
