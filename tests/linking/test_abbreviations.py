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
