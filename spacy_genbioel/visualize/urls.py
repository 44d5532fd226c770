"""A concept's web page from its KB ID: URL templates per vocabulary, the
scheme an ID belongs to, and an object displaCy takes as ``kb_url_template``.

A KB can mix vocabularies (MEDIC lists MeSH ``D…``/``C…`` IDs next to bare
OMIM numbers), so one ``{}`` template is not enough: :func:`concept_url` tells
each ID's scheme from its form and fills that scheme's template.

=============  ====================================  =================================
scheme         IDs                                   page
=============  ====================================  =================================
``mesh``       ``D012345``, ``C565588``,             MeSH browser (NLM)
               ``C000656484``, ``MESH:D012345``
``omim``       ``613097``, ``OMIM:613097``           omim.org entry
``umls``       ``C0035012``, ``UMLS:C0035012``       UMLS Terminology Services
``snomedct``   ``22298006``, ``SNOMEDCT_US:…``       SNOMED International browser
=============  ====================================  =================================

A bare 6-digit number is OMIM when ``omim`` is among the templates and SNOMED
CT otherwise. Templates are given as a spec (:func:`resolve_templates`): scheme
names (``"mesh,omim"``), a user template for every ID (``"https://…/{}"``), or
a mapping whose keys are scheme names, ID prefixes (``DOID`` or ``DOID:``
match ``DOID:0050589``; the page gets the whole ID) or ``"*"`` (any ID nothing
else matched).

Why not bioregistry or curies: they expand a CURIE whose prefix is written
(``MESH:D012345``), while the IDs here are mostly bare (MEDIC's ``D012345`` and
``613097``), so the work of this module, telling the scheme from an ID's form,
is not theirs; for four templates neither is worth a new dependency.
"""

from __future__ import annotations

import html
import re
from typing import Dict, Iterable, List, Mapping, Optional, Tuple, Union

from spacy.util import registry

__all__ = [
    "KNOWN_TEMPLATES",
    "KBUrlTemplate",
    "TemplateSpec",
    "concept_url",
    "id_schemes",
    "kb_url_template",
    "resolve_templates",
]

#: Page templates of the vocabularies whose IDs :func:`id_schemes` recognizes.
KNOWN_TEMPLATES: Dict[str, str] = {
    "mesh": "https://meshb.nlm.nih.gov/record/ui?ui={}",
    "omim": "https://omim.org/entry/{}",
    "umls": "https://uts.nlm.nih.gov/uts/umls/concept/{}",
    "snomedct": "https://browser.ihtsdotools.org/?perspective=full&conceptId1={}&edition=MAIN&languages=en",
}

TemplateSpec = Union[None, str, Mapping[str, str], Iterable[str]]

# (pattern, schemes in order of preference); the pattern's group 1 is what the page takes
_PREFIXED: List[Tuple[re.Pattern, Tuple[str, ...]]] = [
    (re.compile(r"^(?:MESH|MeSH|mesh):(.+)$"), ("mesh",)),
    (re.compile(r"^(?:OMIM|omim|MIM):(\d+)$"), ("omim",)),
    (re.compile(r"^(?:UMLS|umls|CUI):(C\d{7})$"), ("umls",)),
    (re.compile(r"^(?:SNOMEDCT(?:_US)?|SNOMED|SCTID|sctid):(\d{6,18})$"), ("snomedct",)),
]
_BARE: List[Tuple[re.Pattern, Tuple[str, ...]]] = [
    (re.compile(r"^(D\d{6}(?:\d{3})?)$"), ("mesh",)),  # descriptors
    (re.compile(r"^(C\d{6}(?:\d{3})?)$"), ("mesh",)),  # supplementary concept records
    (re.compile(r"^(C\d{7})$"), ("umls",)),  # CUIs
    (re.compile(r"^(\d{6})$"), ("omim", "snomedct")),
    (re.compile(r"^(\d{6,18})$"), ("snomedct",)),
]


def id_schemes(kb_id: str) -> Tuple[Tuple[str, ...], str]:
    """The schemes an ID may belong to, most likely first, and the part of the ID
    their pages take (``"MESH:D012345"`` -> ``(("mesh",), "D012345")``); no
    scheme: ``((), kb_id)``."""
    cid = kb_id.strip()
    for pattern, schemes in _PREFIXED + _BARE:
        match = pattern.match(cid)
        if match:
            return schemes, match.group(1)
    return (), cid


_PREFIX_KEY = re.compile(r"^[A-Za-z][\w.-]*:?$")


def _check_template(key: str, template: object) -> str:
    ok = isinstance(template, str) and template.count("{}") == 1
    if ok:
        try:
            template.format("ID")  # type: ignore[union-attr]
        except (IndexError, KeyError, ValueError):
            ok = False
    if not ok:
        raise ValueError(f"kb_url template for {key!r} must be a string with one '{{}}' for the ID, got {template!r}")
    return template  # type: ignore[return-value]


def _split_spec(spec: str) -> List[str]:
    """``"mesh,omim,https://x/a,b/{}"`` -> ``["mesh", "omim", "https://x/a,b/{}"]``: commas
    separate scheme names; anything else (commas and all) is a template."""
    items: List[str] = []
    template: List[str] = []
    for part in spec.split(","):
        if part.strip() in KNOWN_TEMPLATES:
            items.append(part.strip())
        elif part.strip() or template:
            template.append(part)
    if template:
        items.append(",".join(template).strip())
    return items


def resolve_templates(spec: TemplateSpec = None) -> Dict[str, str]:
    """Templates from a spec: None (every known scheme), ``"mesh,omim"`` (those
    schemes), ``"https://example.org/{}"`` (a user template for every ID, as
    ``"*"``), both (``"mesh,https://example.org/{}"``: a known scheme where the
    ID has one, the template otherwise), a list of such strings, or a mapping (scheme names, ID
    prefixes and ``"*"``; a known scheme's value may be None for its known
    template). An unknown scheme name or a template without ``{}`` is a
    :class:`ValueError` that names it."""
    if spec is None:
        return dict(KNOWN_TEMPLATES)
    if isinstance(spec, Mapping):
        resolved: Dict[str, str] = {}
        for key, template in spec.items():
            if template is None and key in KNOWN_TEMPLATES:
                template = KNOWN_TEMPLATES[key]
            if key not in KNOWN_TEMPLATES and key != "*" and not _PREFIX_KEY.match(key):
                raise ValueError(
                    f"kb_url key {key!r} is neither a scheme ({', '.join(KNOWN_TEMPLATES)}), "
                    "an ID prefix (DOID, HP:) nor '*'"
                )
            resolved[key if key in KNOWN_TEMPLATES or key == "*" or key.endswith(":") else key + ":"] = _check_template(
                key, template
            )
        return resolved
    resolved = {}
    for item in [spec] if isinstance(spec, str) else list(spec):
        if not isinstance(item, str):
            raise ValueError(f"kb_url templates: expected scheme names or templates, got {item!r}")
        for part in _split_spec(item):
            if part in KNOWN_TEMPLATES:
                resolved[part] = KNOWN_TEMPLATES[part]
            elif "{" in part:
                resolved["*"] = _check_template("*", part)
            else:
                raise ValueError(
                    f"unknown kb_url scheme {part!r}: use one of {', '.join(KNOWN_TEMPLATES)} "
                    "or a template with '{}' for the ID"
                )
    return resolved


def concept_url(kb_id: Optional[str], templates: TemplateSpec = None) -> Optional[str]:
    """The page of concept ``kb_id``, or None (no ID, or no template fits it).

    ``templates`` is a spec for :func:`resolve_templates` (default: every known
    scheme). An ID prefix key matching the ID comes first and takes the whole
    ID; then the ID's schemes (:func:`id_schemes`) in order, taking the ID
    without its prefix; then ``"*"`` with the whole ID. The URL is not
    HTML-escaped (:class:`KBUrlTemplate` does that for displaCy)."""
    if not kb_id or not kb_id.strip():
        return None
    resolved = resolve_templates(templates)
    cid = kb_id.strip()
    prefixes = sorted((key for key in resolved if key.endswith(":") and cid.startswith(key)), key=len, reverse=True)
    if prefixes:
        return resolved[prefixes[0]].format(cid)
    schemes, local = id_schemes(cid)
    for scheme in schemes:
        if scheme in resolved:
            return resolved[scheme].format(local)
    if "*" in resolved:
        return resolved["*"].format(cid)
    return None


class KBUrlTemplate:
    """What displaCy takes as ``options["kb_url_template"]``: spaCy calls
    ``.format(ent.kb_id_)``, and this answers with the ID's page by
    :func:`concept_url`, HTML-escaped for the ``href`` attribute, or ``"#"``.

        displacy.render(doc, style="ent", options={"kb_url_template": KBUrlTemplate("mesh,omim")})
    """

    def __init__(self, templates: TemplateSpec = None) -> None:
        self.templates = resolve_templates(templates)

    def url(self, kb_id: Optional[str]) -> Optional[str]:
        """The unescaped page of ``kb_id`` or None."""
        return concept_url(kb_id, self.templates)

    def format(self, kb_id: str = "", *args: object, **kwargs: object) -> str:
        url = self.url(kb_id)
        return html.escape(url, quote=True) if url else "#"

    def __repr__(self) -> str:
        return f"KBUrlTemplate({self.templates!r})"


@registry.misc("genbioel.kb_url_template.v1")
def kb_url_template(templates: TemplateSpec = None) -> KBUrlTemplate:
    """A :class:`KBUrlTemplate` for displaCy's ``kb_url_template`` option (registered
    as ``genbioel.kb_url_template.v1``; ``templates`` as :func:`resolve_templates` reads it)."""
    return KBUrlTemplate(templates)
