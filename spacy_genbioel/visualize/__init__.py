"""Linked entities in displaCy: concept pages per ID (:mod:`.urls`), the
manual-format input with concept names as labels (:mod:`.render`), and the
``visualize`` workflow that writes an HTML page (:mod:`.run`).

    from spacy import displacy
    from spacy_genbioel.visualize import kb_url_template, render_html

    displacy.render(doc, style="ent", options={"kb_url_template": kb_url_template("mesh,omim")})
    html = render_html(doc, names=kb)  # labels "Disease: Reiter syndrome"
"""

from spacy_genbioel.visualize.render import (
    LABEL_MODES,
    displacy_input,
    entity_label,
    genbioel_kb,
    pipeline_templates,
    render_html,
)
from spacy_genbioel.visualize.run import (
    DocumentSource,
    PageOptions,
    VisualizeError,
    VisualizeSummary,
    sample,
    visualize,
)
from spacy_genbioel.visualize.urls import (
    KNOWN_TEMPLATES,
    KBUrlTemplate,
    concept_url,
    id_schemes,
    kb_url_template,
    resolve_templates,
)

__all__ = [
    "DocumentSource",
    "KBUrlTemplate",
    "KNOWN_TEMPLATES",
    "LABEL_MODES",
    "PageOptions",
    "VisualizeError",
    "VisualizeSummary",
    "concept_url",
    "displacy_input",
    "entity_label",
    "genbioel_kb",
    "id_schemes",
    "kb_url_template",
    "pipeline_templates",
    "render_html",
    "resolve_templates",
    "sample",
    "visualize",
]
