"""The package's one XML parser configuration: lxml with entities left
unresolved, no network, no DTD loaded, no huge trees.

Every reader that parses XML (MeSH XML in :mod:`~spacy_genbioel.kb.sources`,
BioC XML in :mod:`spacy_genbioel.corpus.bioc`, PubMed and BioC records in
:mod:`spacy_genbioel.annotate.xml_readers`) parses through here, so what an
input may make the parser do does not depend on the lxml version installed
(lxml < 5 resolves external entities by default: a ``<!ENTITY x SYSTEM
"file:///etc/passwd">`` would put a local file into the text). An entity
reference other than the five predefined ones and character references is
refused (:class:`UnsafeXMLError`), not read as ``&name;`` text or dropped:
with entities unresolved lxml keeps them as ``Entity`` nodes. It lives in
``kb`` because ``kb`` is the lowest layer that parses XML (``corpus`` and
``annotate`` import ``kb``, not the other way round).
"""

from __future__ import annotations

import contextlib
from typing import Any, Dict, Iterator, Tuple, Union

from lxml import etree

__all__ = [
    "SAFE_XML_OPTIONS",
    "XML_ERRORS",
    "UnsafeXMLError",
    "check_entities",
    "parse_xml",
    "safe_default_parser",
    "safe_parser",
    "safe_pull_parser",
]

#: the options every parser here is built with (a test checks them, and what they do, on the oldest lxml allowed)
SAFE_XML_OPTIONS: Dict[str, Any] = {
    "resolve_entities": False,  # entity references stay nodes (refused by check_entities), never expanded or fetched
    "no_network": True,  # nothing is fetched over the network, whatever the document says
    "load_dtd": False,  # an external DTD is not read (it could declare entities or defaults)
    "dtd_validation": False,
    "huge_tree": False,  # libxml2's limits on depth and text node size stay on
    "remove_comments": True,  # comments and processing instructions are not text
    "remove_pis": True,
}


class UnsafeXMLError(ValueError):
    """The XML references an entity this package does not expand."""


#: what parsing untrusted XML here may raise
XML_ERRORS: Tuple[type, ...] = (etree.XMLSyntaxError, UnsafeXMLError)


def safe_parser() -> etree.XMLParser:
    """A new lxml parser with :data:`SAFE_XML_OPTIONS`."""
    return etree.XMLParser(**SAFE_XML_OPTIONS)


def safe_pull_parser(events: Tuple[str, ...] = ("start", "end")) -> etree.XMLPullParser:
    """An lxml pull parser (fed bytes, read by events) with :data:`SAFE_XML_OPTIONS`."""
    return etree.XMLPullParser(events=events, **SAFE_XML_OPTIONS)


def check_entities(element: Any) -> None:
    """Raise :class:`UnsafeXMLError` when the subtree holds an entity reference (left unresolved)."""
    found = next(element.iter(etree.Entity), None)
    if found is not None:
        raise UnsafeXMLError(f"entity reference {found.text} (entities are not expanded: write the text itself)")


def parse_xml(data: Union[bytes, str]) -> Any:
    """The root element of ``data`` (UTF-8 bytes, or text without an encoding declaration),
    parsed safely; entity references raise :class:`UnsafeXMLError`."""
    if isinstance(data, str):
        data = data.encode("utf-8")
    root = etree.fromstring(data, safe_parser())
    check_entities(root)
    return root


@contextlib.contextmanager
def safe_default_parser() -> Iterator[None]:
    """While it lasts, lxml parses with a safe parser in this thread where code calls it without a parser
    (the ``bioc`` package's ``biocxml.loads`` does); the previous default comes back after."""
    previous = etree.get_default_parser()
    etree.set_default_parser(safe_parser())
    try:
        yield
    finally:
        etree.set_default_parser(previous)
