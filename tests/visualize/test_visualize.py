"""displaCy rendering of linked entities: concept pages per ID, concept names in
the labels, escaping, the ``visualize`` command, and (marker ``browser``) the
page as headless Chromium renders it."""

import re
import shutil
import subprocess

import pytest
import spacy
from hypothesis import given, settings
from hypothesis import strategies as st
from spacy import displacy
from spacy.tokens import Span
from typer.testing import CliRunner

from spacy_genbioel.cli import app
from spacy_genbioel.kb.base import Concept, KnowledgeBase
from spacy_genbioel.visualize import (
    KBUrlTemplate,
    concept_url,
    displacy_input,
    entity_label,
    id_schemes,
    kb_url_template,
    render_html,
    resolve_templates,
    sample,
)

runner = CliRunner()
MESH = "https://meshb.nlm.nih.gov/record/ui?ui="
OMIM = "https://omim.org/entry/"
UMLS = "https://uts.nlm.nih.gov/uts/umls/concept/"
SNOMED = "https://browser.ihtsdotools.org/?perspective=full&conceptId1="
TEXT = "Reactive arthritis, once called Reiter syndrome, is not breast cancer nor a <b> & c."


@pytest.mark.parametrize(
    "kb_id,templates,url",
    [
        ("D012345", None, MESH + "D012345"),
        ("D000086382", None, MESH + "D000086382"),  # 9-digit descriptor
        ("C565588", None, MESH + "C565588"),  # supplementary concept record
        ("C000656484", None, MESH + "C000656484"),
        ("MESH:D012345", None, MESH + "D012345"),
        (" D015862", None, MESH + "D015862"),
        ("613097", None, OMIM + "613097"),
        ("OMIM:613097", None, OMIM + "613097"),
        ("C0035012", None, UMLS + "C0035012"),
        ("UMLS:C0035012", None, UMLS + "C0035012"),
        ("22298006", None, SNOMED + "22298006&edition=MAIN&languages=en"),
        ("613097", "snomedct", SNOMED + "613097&edition=MAIN&languages=en"),  # a 6-digit ID without OMIM in play
        ("D012345", "omim", None),
        ("DOID:1234", None, None),
        ("DOID:1234", "https://example.org/c/{}", "https://example.org/c/DOID:1234"),
        ("D012345", "mesh,https://example.org/{}", MESH + "D012345"),  # a scheme before the catch-all
        (
            "DOID:1234",
            {"DOID:": "https://disease-ontology.org/?id={}", "mesh": None},
            "https://disease-ontology.org/?id=DOID:1234",
        ),
        ("", None, None),
        (None, None, None),
    ],
)
def test_concept_url(kb_id, templates, url):
    assert concept_url(kb_id, templates) == url


def test_id_schemes_and_bad_templates():
    assert id_schemes("MESH:D012345") == (("mesh",), "D012345")
    assert id_schemes("123456") == (("omim", "snomedct"), "123456")
    assert id_schemes("whatever") == ((), "whatever")
    assert set(resolve_templates(None)) == {"mesh", "omim", "umls", "snomedct"}
    with pytest.raises(ValueError, match="unknown kb_url scheme 'meshh'"):
        resolve_templates("meshh")
    with pytest.raises(ValueError, match="'{}'"):
        resolve_templates({"mesh": "https://example.org/"})
    with pytest.raises(ValueError, match="kb_url key 'a b'"):
        resolve_templates({"a b": "https://example.org/{}"})
    assert resolve_templates({"DOID": "https://d/{}"}) == {
        "DOID:": "https://d/{}"
    }  # configs cannot spell "DOID:" as a key


def test_registered_for_configs():
    from confection import Config
    from spacy.util import registry

    cfg = Config().from_str("""
    [plain]
    @misc = "genbioel.kb_url_template.v1"
    templates = "mesh,omim"

    [mapped]
    @misc = "genbioel.kb_url_template.v1"

    [mapped.templates]
    mesh = "https://example.org/mesh/{}"
    DOID = "https://disease-ontology.org/?id={}"
    """)
    resolved = registry.resolve(cfg)
    assert resolved["plain"].format("109700") == OMIM + "109700"
    assert resolved["mapped"].format("D012345") == "https://example.org/mesh/D012345"
    assert resolved["mapped"].format("DOID:0050589") == "https://disease-ontology.org/?id=DOID:0050589"
    assert resolved["mapped"].format("109700") == "#"


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=30))
def test_kb_url_template_is_always_safe_in_an_attribute(kb_id):
    """Whatever the ID, displaCy gets a URL it can put inside href="..." as is."""
    url = KBUrlTemplate("https://example.org/{}").format(kb_id)
    assert not set('<>"') & set(url)
    assert url == "#" or url.startswith("https://example.org/")


def make_doc(kb_ids, labels=("Disease", "Disease", "Disease")):
    nlp = spacy.blank("en")
    doc = nlp.make_doc(TEXT)
    spans = [doc.char_span(0, 18), doc.char_span(32, 47), doc.char_span(56, 69)]
    doc.ents = [
        Span(doc, s.start, s.end, label=label, kb_id=kb_id or "") for s, label, kb_id in zip(spans, labels, kb_ids)
    ]
    return doc


def said(result):
    """The command's output with wasabi's line wrapping undone."""
    return " ".join(result.output.split())


def links(html):
    return re.findall(r'href="([^"]*)">([^<]*)</a>', html)


def test_plain_displacy_gets_a_link_per_id_scheme():
    """The one-liner for a doc the linker annotated: MeSH and OMIM IDs of one KB each get their page."""
    doc = make_doc(["D016918", "OMIM:109700", None])
    html = displacy.render(doc, style="ent", options={"kb_url_template": kb_url_template("mesh,omim")}, jupyter=False)
    assert links(html) == [(MESH + "D016918", "D016918"), (OMIM + "109700", "OMIM:109700")]
    # the unlinked third entity is shown, without a link
    assert "breast cancer" in html and html.count("<a ") == 2


def test_render_html_labels_with_concept_names():
    kb = KnowledgeBase(
        [Concept("D016918", ["Reactive Arthritis", "Reiter syndrome"]), Concept("109700", ["Reiter Disease"])]
    )
    doc = make_doc(["D016918", "109700", None])
    html = render_html(doc, names=kb)
    assert links(html) == [(MESH + "D016918", "D016918"), (OMIM + "109700", "109700")]
    assert "Disease: Reactive Arthritis" in html and "Disease: Reiter Disease" in html
    assert html.count("<a ") == 2 and html.startswith("<!DOCTYPE html>")
    # the name alone, or the type alone
    only_names = render_html(doc, names=kb, label="name", page=False)
    assert ">Reactive Arthritis" in only_names and "Disease: " not in only_names and "<!DOCTYPE" not in only_names
    assert "Reactive Arthritis" not in render_html(doc, names=kb, label="type")
    with pytest.raises(ValueError, match="unknown label mode"):
        render_html(doc, label="both-ish")


def test_names_and_ids_are_escaped():
    """displaCy puts labels, IDs and titles into its HTML as they are: a name with
    markup in it must show as text, not become markup."""
    names = {"D016918": "<script>alert(1)</script> & co", "X<1>": "x"}
    doc = make_doc(["D016918", "X<1>", None])
    html = render_html(doc, names=names, titles=["<i>PMID</i> & 1"])
    assert "<script>" not in html and "&lt;script&gt;alert(1)&lt;/script&gt; &amp; co" in html
    assert "X&lt;1&gt;" in html and "<1>" not in html
    assert "&lt;i&gt;PMID&lt;/i&gt; &amp; 1" in html
    assert "a &lt;b&gt; &amp; c." in html  # the text, escaped by displaCy itself


def test_manual_input_fallbacks_and_colours():
    doc = make_doc(["D016918", "NOPE:1", None], labels=("Disease", "Chemical", "Gene"))
    doc.ents[0]._.kb_candidates = [("D016918", "reiter syndrome", -0.1)]
    parsed = displacy_input(doc)
    first, second, third = parsed["ents"]
    assert first["label"] == "Disease: reiter syndrome"  # the matched name when there is no KB
    assert (second["kb_id"], second["kb_url"], second["label"]) == ("NOPE:1", "#", "Chemical")  # no page known
    assert (third["kb_id"], third["kb_url"], third["label"]) == ("", "#", "Gene")
    assert len({e["params"]["bg"] for e in parsed["ents"]}) == 3
    assert entity_label("Disease", None) == "Disease" and entity_label("", "x") == "x"


def test_spans_key_and_extension_attribute():
    """A second linker writing elsewhere (a span group, its own attribute) renders from there."""
    if not Span.has_extension("umls_id"):
        Span.set_extension("umls_id", default=None)
    doc = make_doc([None, None, None])
    group = [doc.char_span(0, 18, label="Disease"), doc.char_span(0, 8, label="Disease")]  # overlapping
    group[0]._.umls_id = "C0035012"
    doc.spans["umls"] = group
    parsed = displacy_input(doc, spans_key="umls", kb_id_attr="umls_id", names={"C0035012": "Reactive arthritis"})
    assert [(e["start"], e["end"], e["kb_url"], e["label"]) for e in parsed["ents"]] == [
        (0, 18, UMLS + "C0035012", "Disease: Reactive arthritis")
    ]


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 40), st.integers(1, 10), st.one_of(st.none(), st.integers(0, 5)))
def test_sample(n_items, n_docs, seed):
    items = list(range(n_items))
    chosen = sample(iter(items), n_docs, seed)
    assert len(chosen) == min(n_items, n_docs) and chosen == sorted(set(chosen))
    assert set(chosen) <= set(items)
    if seed is None:
        assert chosen == items[:n_docs]
    else:
        assert chosen == sample(iter(items), n_docs, seed)  # reproducible


# -- the command -----------------------------------------------------------------------------------------
KB = [
    Concept("D016918", ["reactive arthritis", "reiter syndrome"], types=["Disease"]),
    Concept("613097", ["cystic fibrosis"], types=["Disease"]),
    Concept("D001943", ["breast cancer"], types=["Disease"]),
]


@pytest.fixture()
def pipeline_dir(tmp_path, micro_model, word_tokenizer):
    from spacy_genbioel.models import save_model
    from spacy_genbioel.training.package import EntitySource, PipelineMeta, package

    save_model(micro_model, word_tokenizer, tmp_path / "model")
    KnowledgeBase(KB).to_jsonl(tmp_path / "kb.jsonl")
    return package(
        tmp_path / "model",
        tmp_path / "kb.jsonl",
        tmp_path / "pkg",
        settings={"num_beams": 2, "top_k": 2},
        entities=EntitySource(entity_label="Disease", abbreviations=False),
        meta=PipelineMeta(kb_url="mesh,omim"),
    )


def test_visualize_command_links_texts(tmp_path, pipeline_dir):
    assert spacy.load(pipeline_dir).meta["kb_url_templates"] == {"mesh": MESH + "{}", "omim": OMIM + "{}"}
    out = tmp_path / "page.html"
    result = runner.invoke(
        app,
        [
            "visualize",
            "--pipeline",
            str(pipeline_dir),
            "--out",
            str(out),
            "--text",
            "Reactive arthritis and cystic fibrosis.",
            "--text",
            "Breast cancer <here> & there.",
        ],
    )
    assert result.exit_code == 0, result.output
    assert "2 documents, 3 entities (3 linked, 3 with a concept page)" in said(result)
    html = out.read_text(encoding="utf8")
    urls = {MESH + "D016918", OMIM + "613097", MESH + "D001943"}
    found = links(html)
    assert len(found) == 3 and {url for url, _ in found} <= urls  # the untrained model picks some concept
    for url, kb_id in found:
        name = next(c.names[0] for c in KB if c.id == kb_id)
        assert url.endswith(kb_id) and f"Disease: {name}" in html  # the preferred name
    assert "&lt;here&gt; &amp; there" in html


def test_visualize_command_samples_a_corpus_and_shows_gold(tmp_path, pipeline_dir):
    corpus = tmp_path / "dev.pubtator"
    corpus.write_text(
        "1|t|Reactive arthritis.\n1|a|And cystic fibrosis.\n1\t0\t18\tReactive arthritis\tDisease\tMESH:D016918\n"
        "1\t24\t39\tcystic fibrosis\tDisease\tOMIM:613097|D001943\n\n"
        "2|t|Breast cancer.\n2|a|\n2\t0\t13\tBreast cancer\tDisease\tD001943\n\n"
    )
    out = tmp_path / "sample.html"
    result = runner.invoke(
        app, ["visualize", str(corpus), "--pipeline", str(pipeline_dir), "--out", str(out), "--ids", "2,9"]
    )
    assert result.exit_code == 0, result.output
    assert "not found: 9" in said(result) and "1 documents, 1 entities" in said(result)
    assert ">2</h2>" in out.read_text(encoding="utf8")
    gold = tmp_path / "gold.html"
    result = runner.invoke(
        app,
        [
            "visualize",
            str(corpus),
            "--gold",
            "--kb",
            str(tmp_path / "kb.jsonl"),
            "--out",
            str(gold),
            "--kb-url",
            "mesh",
        ],
    )
    assert result.exit_code == 0, result.output
    html = gold.read_text(encoding="utf8")
    # MESH: dropped by the reader; the composite shows its first concept; OMIM has no template here
    assert links(html) == [(MESH + "D016918", "D016918"), ("#", "613097|D001943"), (MESH + "D001943", "D001943")]
    assert "Disease: reactive arthritis" in html and "Disease: cystic fibrosis" in html


def test_visualize_command_errors(tmp_path, pipeline_dir):
    out = tmp_path / "x.html"
    for args, message in [
        (["--text", "x"], "give a pipeline"),
        (["--pipeline", str(tmp_path), "--text", "x"], "not a spaCy pipeline directory"),
        (["--pipeline", str(pipeline_dir)], "give texts or input files"),
        (["--pipeline", str(pipeline_dir), "--text", "x", "--kb-url", "nope"], "unknown kb_url scheme 'nope'"),
        ([str(tmp_path / "missing.txt"), "--pipeline", str(pipeline_dir)], "input not found"),
        (
            ["--pipeline", str(pipeline_dir), "--text", "Breast cancer.", "--kb-id-attr", "no_such_attr"],
            "kb_id attribute 'no_such_attr'",
        ),
    ]:
        result = runner.invoke(app, ["visualize", "--out", str(out), *args])
        assert result.exit_code == 1 and message in said(result), (args, result.output)
    assert not out.exists()


# -- a real browser --------------------------------------------------------------------------------------
def chromium():
    return next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)


@pytest.mark.browser
@pytest.mark.skipif(chromium() is None, reason="no chromium binary")
def test_page_in_headless_chromium(tmp_path):
    """Chromium parses the page into links to the concept pages and renders it (a screenshot is taken)."""
    kb = KnowledgeBase([Concept("D016918", ["Reactive Arthritis"]), Concept("109700", ["Reiter <Disease> & co"])])
    page = tmp_path / "page.html"
    page.write_text(render_html(make_doc(["D016918", "109700", None]), names=kb), encoding="utf8")
    base = [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars"]
    dom = subprocess.run([*base, "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120).stdout
    anchors = re.findall(r'<a [^>]*href="([^"]*)"[^>]*>([^<]*)</a>', dom)
    assert anchors == [(MESH + "D016918", "D016918"), (OMIM + "109700", "109700")]
    assert "Reiter &lt;Disease&gt; &amp; co" in dom and "<disease>" not in dom.lower()
    shot = tmp_path / "page.png"
    subprocess.run(
        [*base, f"--screenshot={shot}", "--window-size=1200,900", page.as_uri()], capture_output=True, timeout=120
    )
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10_000
