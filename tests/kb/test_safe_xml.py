"""The package's XML parser (:mod:`spacy_genbioel.kb.safe_xml`): its options, and what they do on the
lxml installed (run it with the oldest lxml setup.cfg allows:
``PYTHONPATH=<lxml 4.9> pytest tests/kb/test_safe_xml.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from lxml import etree

from spacy_genbioel.kb.safe_xml import (
    SAFE_XML_OPTIONS,
    XML_ERRORS,
    UnsafeXMLError,
    parse_xml,
    safe_default_parser,
    safe_pull_parser,
)


def test_the_options_leave_entities_and_the_network_alone() -> None:
    assert SAFE_XML_OPTIONS["resolve_entities"] is False and SAFE_XML_OPTIONS["no_network"] is True
    assert SAFE_XML_OPTIONS["load_dtd"] is False and SAFE_XML_OPTIONS["huge_tree"] is False


def test_an_external_entity_never_reads_a_local_file(tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("SECRET-CONTENT")
    xml = f'<?xml version="1.0"?><!DOCTYPE c [<!ENTITY x SYSTEM "{secret.as_uri()}">]><c><t>a &x; b</t></c>'
    with pytest.raises(XML_ERRORS) as caught:
        parse_xml(xml)
    assert "SECRET" not in str(caught.value)
    parser = safe_pull_parser()
    parser.feed(xml.encode())
    parser.close()
    texts = ["".join(e.itertext()) for _, e in parser.read_events()]
    assert not any("SECRET" in t for t in texts)


def test_internal_entities_are_refused_not_expanded() -> None:
    with pytest.raises(UnsafeXMLError, match="&x;"):
        parse_xml('<!DOCTYPE c [<!ENTITY x "Renal">]><c><t>a &x; b</t></c>')
    bomb = (
        '<!DOCTYPE c [<!ENTITY a "aaaaaaaaaa"><!ENTITY b "&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;">'
        '<!ENTITY c "&b;&b;&b;&b;&b;&b;&b;&b;&b;&b;">]><c>&c;</c>'
    )
    with pytest.raises(XML_ERRORS):
        parse_xml(bomb)


def test_no_network_and_no_dtd_are_fetched() -> None:
    # an external DTD on a port nothing listens on: neither fetched nor an error
    root = parse_xml('<!DOCTYPE c SYSTEM "http://127.0.0.1:9/c.dtd"><c><t>renal &amp; &#65;</t><!-- x --></c>')
    assert "".join(root.itertext()) == "renal & A"


def test_the_safe_default_parser_is_put_back() -> None:
    before = etree.get_default_parser()
    with safe_default_parser():  # what bioc's biocxml.loads parses with
        root = etree.fromstring(b'<!DOCTYPE c [<!ENTITY x SYSTEM "file:///etc/hostname">]><c>&x;</c>')
        assert root.text is None and len(list(root.iter(etree.Entity))) == 1  # left as a node, not read
    assert etree.get_default_parser() is before
