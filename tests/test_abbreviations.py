import pytest

from spacy_genbioel.mentions import Mention

pytest.importorskip("scispacy")


def test_expander_uses_detected_long_forms():
    from spacy_genbioel.abbreviations import AbbreviationExpander

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
