"""The dictionary NER ``package`` adds: which KB names are patterns (case, stop words, length), and
the ``kb_entity_ruler`` component that matches them and loads without tokenizing them again."""

import logging
import pickle

import pytest
import spacy
from conftest import WORDS, data_dir, random_kb

from spacy_genbioel.kb.base import Concept, KnowledgeBase
from spacy_genbioel.ner.kb_ruler import FACTORY, KBEntityRuler, tokenizer_digest
from spacy_genbioel.ner.pipes import (
    STOP_WORDS,
    RulerRules,
    add_kb_entity_ruler,
    is_abbreviation,
    is_gene_like,
    name_patterns,
    ruler_patterns,
)

# MEDIC's own troublemakers: "WAS" (Wiskott-Aldrich syndrome) and "ALL" (acute lymphoblastic leukemia)
KB_CONCEPTS = [
    Concept("D014923", ["Wiskott-Aldrich Syndrome", "WAS", "WAS1"]),
    Concept("D054198", ["Acute Lymphoblastic Leukemia", "ALL", "ALL2"]),
    Concept("D006073", ["Gout"]),
    Concept("D009103", ["Multiple Sclerosis", "MS"]),
    Concept("D004194", ["Disease", "1"]),
    Concept("D009396", ["Wilms Tumor", "WT1"]),
    Concept("C537360", ["Cornelia de Lange Syndrome", "CdLS"]),
    Concept("D001943", ["Breast Cancer", "Cancer of Breast"], types=["C"]),
    Concept("D002118", ["Calcium", "Ca"], types=["D"]),
    Concept("D051381", ["Rats", "Rat"], types=["B"]),
]
TEXT = (
    "The boy was treated for WAS and all signs of ALL. Gout and gout, not GOUT. MS and ms. "
    "A disease with WT1 mutations, Wilms tumor, CdLS and cdls, breast cancer in rats."
)


def kb():
    return KnowledgeBase(KB_CONCEPTS)


def ents(doc):
    return [(e.text, e.label_) for e in doc.ents]


@pytest.fixture()
def nlp():
    nlp = spacy.blank("en")
    add_kb_entity_ruler(nlp, kb(), "Disease")
    return nlp


# -- which names, matched how -----------------------------------------------------------------------
def test_docstring_examples_of_the_rules():
    assert is_abbreviation("ALL") and is_abbreviation("BRCA1") and is_abbreviation("5-FU")
    assert not is_abbreviation("CdLS") and not is_abbreviation("ALL TYPES") and not is_abbreviation("12")
    assert [n for n in ("BRCA1", "WT1", "RB1", "CYP2D6") if is_gene_like(n)] == ["BRCA1", "WT1", "RB1", "CYP2D6"]
    assert not any(is_gene_like(n) for n in ("COVID-19", "IL-2", "5-HT", "APC", "NRA0160"))
    assert name_patterns("WAS") == [("WAS", True)] and name_patterns("ALL") == [("ALL", True)]
    assert name_patterns("was") == [] and name_patterns("All") == [] and name_patterns("Disease") == []
    assert name_patterns("MS") == [("MS", True)] and name_patterns("NO") == [("NO", True)]  # 2-letter abbreviations
    assert name_patterns("1") == [] and name_patterns("2-3") == [] and name_patterns("WT1") == []
    assert name_patterns("WT1", RulerRules(gene_like=True)) == [("WT1", True)]
    assert name_patterns("Gout") == [("Gout", True), ("gout", True)] and name_patterns("gout") == [
        ("Gout", True),
        ("gout", True),
    ]
    assert name_patterns("CdLS") == [("CdLS", True)]
    assert name_patterns("Breast Cancer") == [("Breast Cancer", False)]
    assert name_patterns("Ca") == []  # shorter than min_chars and not an abbreviation
    assert name_patterns("Gout", RulerRules(exact_chars=3)) == [("Gout", False)]


def test_minimum_lengths():
    assert name_patterns("Ab") == [] and name_patterns("Ab", RulerRules(min_chars=2)) == [("Ab", True), ("ab", True)]
    assert name_patterns("AS") == [("AS", True)] and name_patterns("AS", RulerRules(min_abbreviation_chars=3)) == []
    assert name_patterns("X") == [] and name_patterns("X", RulerRules(min_chars=1, min_abbreviation_chars=1)) == [
        ("X", True)
    ]
    # min_chars below min_abbreviation_chars lowers both (the demo's min_chars=0: every name)
    assert name_patterns("X", RulerRules(min_chars=0)) == [("X", True)]


def test_stop_words():
    assert len(STOP_WORDS) > 300 and all(w == w.lower() for w in STOP_WORDS)
    assert {"was", "all", "can", "disease", "syndrome", "patients", "rats"} <= STOP_WORDS
    assert {"cancer", "pain", "death", "alcohol", "infection"}.isdisjoint(STOP_WORDS)  # gold mentions in a train split
    assert name_patterns("Patients") == [] and name_patterns("Patients", RulerRules(stop_words=())) == [
        ("Patients", False)
    ]
    assert name_patterns("CAN") == [("CAN", True)]  # an abbreviation: exact case instead


def test_patterns_of_a_kb_labels_and_types():
    patterns = list(ruler_patterns(kb()))
    texts = {p["pattern"] for p in patterns}
    assert {"WAS", "ALL", "Gout", "gout", "MS", "CdLS", "Wiskott-Aldrich Syndrome"} <= texts
    assert not texts & {"was", "all", "Disease", "1", "WT1", "WAS1", "ALL2", "Ca", "Rats", "Rat"}
    assert {p["label"] for p in patterns} == {"ENTITY", "C", "D"}  # B: Rats and Rat are stop words
    assert all(p["case_sensitive"] == (len(p["pattern"]) <= 5 or p["pattern"].isupper()) for p in patterns)
    # types: concepts of those types or of none
    typed = {p["pattern"] for p in ruler_patterns(kb(), rules=RulerRules(types=("C",)))}
    assert "Breast Cancer" in typed and "Calcium" not in typed and "WAS" in typed
    # each (label, text) once, case-insensitive patterns by their lower case
    twice = KnowledgeBase(
        [Concept("A", ["Renal Failure", "renal failure", "RF"]), Concept("B", ["RENAL FAILURE", "RF"])]
    )
    assert [p["pattern"] for p in ruler_patterns(twice, "Disease")] == ["Renal Failure", "RF"]


# -- the component ----------------------------------------------------------------------------------
def test_min_chars_of_the_old_signature():
    """add_kb_entity_ruler(nlp, kb, label, min_chars) as package and the demo call it."""
    nlp = spacy.blank("en")
    every = add_kb_entity_ruler(nlp, kb(), "Disease", 0)
    assert "Ca" in {p["pattern"] for p in nlp.get_pipe("entity_ruler").patterns}
    assert (
        add_kb_entity_ruler(spacy.blank("en"), kb(), "Disease", 3)
        == add_kb_entity_ruler(spacy.blank("en"), kb(), "Disease")
        < every
    )


def test_matching_case_and_stop_words(nlp):
    assert nlp.pipe_names == ["entity_ruler"] and nlp.get_pipe_meta("entity_ruler").factory == FACTORY
    assert "Wiskott" not in nlp.vocab.strings  # names are tokenized over a vocab of their own
    found = [text for text, _ in ents(nlp(TEXT))]
    assert found == ["WAS", "ALL", "Gout", "gout", "MS", "Wilms tumor", "CdLS", "breast cancer"]
    assert {label for _, label in ents(nlp(TEXT))} == {"Disease"}


def test_longest_match_first_and_existing_entities():
    nlp = spacy.blank("en")
    ruler = nlp.add_pipe(FACTORY)
    ruler.add_patterns(
        [
            {"label": "A", "pattern": "renal failure"},
            {"label": "B", "pattern": "acute renal failure"},
            {"label": "C", "pattern": "failure of the"},
        ]
    )
    # the longest first, then (same length) the earliest
    assert ents(nlp("Acute renal failure of the heart.")) == [("Acute renal failure", "B")]
    assert ents(nlp("The renal failure of the heart.")) == [("failure of the", "C")]
    doc = nlp.make_doc("acute renal failure")
    doc.ents = [spacy.tokens.Span(doc, 2, 3, label="X")]
    assert ents(ruler(doc)) == [("failure", "X")]  # an entity already there stays
    ruler.overwrite = True
    assert ents(ruler(doc)) == [("acute renal failure", "B")]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_same_spans_as_spacys_entity_ruler(seed, monkeypatch):
    """Case-insensitive patterns: the spans of spaCy's entity_ruler (phrase_matcher_attr LOWER), also when a
    long document is looked up one pattern length at a time."""
    import random

    import spacy_genbioel.ner.kb_ruler as kb_ruler

    names = sorted({n for c in random_kb(seed) for n in c.names})
    rng = random.Random(seed)
    texts = [
        " ".join(rng.choice(WORDS).capitalize() if rng.random() < 0.2 else rng.choice(WORDS) for _ in range(60))
        for _ in range(20)
    ]
    spacy_nlp, ours = spacy.blank("en"), spacy.blank("en")
    spacy_nlp.add_pipe("entity_ruler", config={"phrase_matcher_attr": "LOWER"}).add_patterns(
        [{"label": "D", "pattern": n} for n in names]
    )
    ours.add_pipe(FACTORY).add_patterns([{"label": "D", "pattern": n} for n in names])
    expected = [ents(doc) for doc in spacy_nlp.pipe(texts)]
    assert [ents(doc) for doc in ours.pipe(texts)] == expected and any(expected)
    monkeypatch.setattr(kb_ruler, "_WINDOWS", 1)
    assert [ents(doc) for doc in ours.pipe(texts)] == expected


def test_add_patterns_checks_and_counts():
    nlp = spacy.blank("en")
    ruler = nlp.add_pipe(FACTORY)
    assert (
        ruler.add_patterns(
            [
                {"label": "D", "pattern": "renal failure"},
                {"label": "D", "pattern": "  "},
                {"label": "D", "pattern": "a\nb"},
                {"label": "D", "pattern": "ALL", "case_sensitive": True},
            ]
        )
        == 2
    )
    assert len(ruler) == 2 and ruler.labels == ("D",)
    assert ruler.patterns == [
        {"label": "D", "pattern": "renal failure", "case_sensitive": False},
        {"label": "D", "pattern": "ALL", "case_sensitive": True},
    ]
    with pytest.raises(ValueError, match="phrase patterns"):
        ruler.add_patterns([{"label": "D", "pattern": [{"LOWER": "x"}]}])
    with pytest.raises(ValueError, match="label"):
        ruler.add_patterns([{"label": "", "pattern": "x"}])
    ruler.initialize(lambda: [])
    assert len(ruler) == 2  # nlp.initialize() keeps the patterns
    ruler.initialize(lambda: [], patterns=[{"label": "E", "pattern": "gout"}])
    assert ruler.labels == ("E",) and len(ruler) == 1


def test_saved_and_loaded_without_tokenizing(nlp, tmp_path, monkeypatch, caplog):
    before = ents(nlp(TEXT))
    nlp.to_disk(tmp_path / "pipeline")
    assert [p.name for p in (tmp_path / "pipeline" / "entity_ruler").iterdir()] == ["patterns.msgpack"]

    def no_tokenizing(self):
        raise AssertionError("loading tokenized the names")

    monkeypatch.setattr(KBEntityRuler, "_scratch_tokenizer", no_tokenizing)
    with caplog.at_level(logging.WARNING, logger="spacy_genbioel.ner.kb_ruler"):
        loaded = spacy.load(tmp_path / "pipeline")
    assert not caplog.records
    assert ents(loaded(TEXT)) == before
    assert loaded.get_pipe("entity_ruler").patterns == nlp.get_pipe("entity_ruler").patterns
    assert tokenizer_digest(loaded) == tokenizer_digest(nlp)  # a tokenizer reads back byte for byte
    # bytes too
    ruler = spacy.blank("en").add_pipe(FACTORY).from_bytes(nlp.get_pipe("entity_ruler").to_bytes())
    assert ruler.patterns == nlp.get_pipe("entity_ruler").patterns


def test_another_tokenizer_tokenizes_the_names_again(nlp, tmp_path, caplog):
    nlp.get_pipe("entity_ruler").to_disk(tmp_path / "ruler")
    other = spacy.blank("en")
    other.tokenizer.add_special_case("WAS", [{"ORTH": "WA"}, {"ORTH": "S"}])
    ruler = other.add_pipe(FACTORY)
    with caplog.at_level(logging.WARNING, logger="spacy_genbioel.ner.kb_ruler"):
        ruler.from_disk(tmp_path / "ruler")
    assert "tokenizing its" in caplog.text and "another tokenizer" in caplog.text
    assert ("WAS", "Disease") in ents(other("The boy had WAS."))  # two tokens now, and still found
    # a tokenizer changed between two add_patterns calls: the first patterns follow it
    caplog.clear()
    nlp2 = spacy.blank("en")
    ruler2 = nlp2.add_pipe(FACTORY)
    ruler2.add_patterns([{"label": "D", "pattern": "WAS", "case_sensitive": True}])
    nlp2.tokenizer.add_special_case("WAS", [{"ORTH": "WA"}, {"ORTH": "S"}])
    with caplog.at_level(logging.WARNING, logger="spacy_genbioel.ner.kb_ruler"):
        ruler2.add_patterns([{"label": "D", "pattern": "gout"}])
    assert "tokenizer changed" in caplog.text
    assert ents(nlp2("WAS and gout")) == [("WAS", "D"), ("gout", "D")]


def _entry_point_installed():
    from importlib.metadata import entry_points

    return any(ep.name == FACTORY for ep in entry_points(group="spacy_factories"))


@pytest.mark.skipif(
    not _entry_point_installed(),
    reason="no kb_entity_ruler spacy_factories entry point installed yet (setup.cfg, then pip install -e .)",
)
def test_a_fresh_process_loads_the_pipeline_through_the_entry_point(nlp, tmp_path):
    import subprocess
    import sys

    nlp.to_disk(tmp_path / "pipeline")
    code = (
        f"import spacy; nlp = spacy.load({str(tmp_path / 'pipeline')!r}); print([e.text for e in nlp({TEXT!r}).ents])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == str([text for text, _ in ents(nlp(TEXT))])


def test_pickles(nlp):
    copy = pickle.loads(pickle.dumps(nlp))
    assert ents(copy(TEXT)) == ents(nlp(TEXT))


def test_scores_like_entity_ruler(nlp):
    from spacy.training import Example

    doc = nlp.make_doc("WAS and gout")
    example = Example.from_dict(doc, {"entities": [(0, 3, "Disease")]})
    scores = nlp.evaluate([example])
    assert scores["ents_p"] == 0.5 and scores["ents_r"] == 1.0


@pytest.mark.slow
@pytest.mark.skipif(data_dir() is None, reason="needs ../shared/data")
def test_measured_on_ncbi_dev():
    """add_kb_entity_ruler's docstring: span precision and recall on NCBI-disease dev with MEDIC 2012."""
    from spacy_genbioel.corpus.pubtator import read_pubtator
    from spacy_genbioel.kb.build import build_kb

    data = data_dir()
    medic = build_kb("medic", data / "vocab" / "medic_06Jul2012.txt", progress=False)
    documents = list(read_pubtator(data / "ncbi_disease" / "NCBIdevelopset_corpus.txt"))
    nlp = spacy.blank("en")
    add_kb_entity_ruler(nlp, medic, "Disease")
    gold = [{(a.start, a.end) for a in d.annotations} for d in documents]
    predicted = [{(e.start_char, e.end_char) for e in doc.ents} for doc in nlp.pipe(d.text for d in documents)]
    tp = sum(len(g & p) for g, p in zip(gold, predicted))
    precision, recall = tp / sum(map(len, predicted)), tp / sum(map(len, gold))
    assert (round(precision, 3), round(recall, 3)) == MEASURED_NCBI_DEV


#: (precision, recall) in add_kb_entity_ruler's docstring
MEASURED_NCBI_DEV = (0.662, 0.59)
