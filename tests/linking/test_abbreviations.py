import pytest

from spacy_genbioel.ty import Mention

pytest.importorskip("scispacy")


def test_expander_uses_detected_long_forms():
    from spacy_genbioel.linking.inputs.abbreviations import AbbreviationExpander

    text = "Patients with cystic fibrosis (CF) were seen. CF is common."
    mentions = [
        Mention("CF", ("D003550",), doc_id="1", start=31, end=33),
        Mention("CF", ("D003550",), doc_id="1", start=46, end=48),
        Mention("cystic fibrosis", ("D003550",), doc_id="1", start=14, end=29),
        Mention("CF", ("D003550",), doc_id="unknown", start=0, end=2),
    ]
    out, n = AbbreviationExpander().expand(mentions, {"1": text})
    assert [m.text for m in out] == ["cystic fibrosis", "cystic fibrosis", "cystic fibrosis", "CF"]
    assert n == 2 and out[0].ids == ("D003550",) and out[0].start == 31


def test_spacy_load_finds_the_detector_without_importing_scispacy(tmp_path):
    """The spacy_factories entry point registers scispacy's factory for spacy.load."""
    import subprocess
    import sys

    import scispacy.abbreviation  # noqa: F401
    import spacy

    nlp = spacy.blank("en")
    nlp.add_pipe("abbreviation_detector")
    nlp.to_disk(tmp_path / "pipeline")
    code = (
        "import sys, spacy\n"
        "nlp = spacy.load(sys.argv[1])\n"
        "assert 'scispacy.abbreviation' in sys.modules\n"
        "doc = nlp('Spinal and bulbar muscular atrophy (SBMA) is inherited. SBMA is rare.')\n"
        "print(nlp.pipe_names, [(a.text, a._.long_form.text) for a in doc._.abbreviations])\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "pipeline")], capture_output=True, text=True, check=True
    )
    assert "['abbreviation_detector']" in out.stdout
    assert "('SBMA', 'Spinal and bulbar muscular atrophy')" in out.stdout


def test_supplement_links_short_forms_the_detector_misses():
    """scispacy's token matcher misses "(A-T)" (split into one-character tokens) and
    Schwartz-Hearst refuses "Myotonic dystrophy (DM)" (letters out of order); both were
    deferred mentions on NCBI-disease dev that no retriever could link."""
    from spacy_genbioel.linking.inputs.abbreviations import AbbreviationExpander

    text = (
        "The ATM gene is mutated in ataxia-telangiectasia (A-T), a recessive disorder. "
        "Myotonic dystrophy (DM) is dominant. A-T and DM patients were seen."
    )
    at, dm = text.rindex("A-T"), text.rindex("DM")
    mentions = [
        Mention("A-T", ("D001260",), doc_id="1", start=at, end=at + 3),
        Mention("DM", ("D009223",), doc_id="1", start=dm, end=dm + 2),
    ]
    out, n = AbbreviationExpander().expand(mentions, {"1": text})
    assert [m.text for m in out] == ["ataxia-telangiectasia", "Myotonic dystrophy"] and n == 2


def test_detector_pairs_win_over_the_supplement():
    from spacy_genbioel.linking.inputs.abbreviations import AbbreviationExpander, supplement_long_forms

    text = "Myotonic dystrophy, or dystrophia myotonica (DM), is dominant. DM is common."
    by_span, by_text = AbbreviationExpander().long_forms(text)
    assert by_text == {"DM": "dystrophia myotonica"} and by_span
    kept = {"DM": "a long form from elsewhere"}
    assert supplement_long_forms("Myotonic dystrophy (DM) is dominant.", kept) is kept
    assert kept == {"DM": "a long form from elsewhere"}


def test_the_component_reads_supplemented_long_forms():
    """The pipeline path: the detector in a spaCy pipeline, then doc_long_forms."""
    import spacy

    from spacy_genbioel.linking.inputs.abbreviations import doc_long_forms

    nlp = spacy.blank("en")
    nlp.add_pipe("abbreviation_detector")
    doc = nlp("Cystic fibrosis (CF) and ataxia-telangiectasia (A-T) were seen. CF and A-T are rare.")
    by_span, by_text = doc_long_forms(doc)
    assert by_text == {"CF": "Cystic fibrosis", "A-T": "ataxia-telangiectasia"}
    assert set(by_span.values()) == {"Cystic fibrosis"}
