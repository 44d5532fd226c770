"""KB names and mentions in one Unicode form (issue 31 item 12): every normalizer drops
invisible format characters and puts text in NFC, so a name written with a combining
diaeresis matches the mention written with the precomposed letter (and the other way
round), with exact match too, and a name made only of a zero-width space is dropped."""

import unicodedata

import pytest
from hypothesis import given
from hypothesis import strategies as st

from spacy_genbioel.kb.base import Concept, EmptyKBError, KnowledgeBase
from spacy_genbioel.kb.compact import CompactKB
from spacy_genbioel.kb.normalizers import NORMALIZER_ALIASES, canonical_text, get_normalizer
from spacy_genbioel.linking.inputs.builder import InputBuilder
from spacy_genbioel.ty import Mention

NFC = unicodedata.normalize("NFC", "Sjögren syndrome")
NFD = unicodedata.normalize("NFD", "Sjögren syndrome")
NORMALIZERS = sorted(NORMALIZER_ALIASES)


def test_the_two_forms_differ_as_strings():
    assert NFC != NFD and len(NFD) == len(NFC) + 1


@pytest.mark.parametrize("normalizer", NORMALIZERS)
@pytest.mark.parametrize("name, mention", [(NFD, NFC), (NFC, NFD)])
@pytest.mark.parametrize("kind", [KnowledgeBase, CompactKB.build])
def test_a_name_matches_the_mention_in_the_other_form(normalizer, name, mention, kind):
    kb = kind([Concept("D012859", [name]), Concept("D001", ["renal failure"])], normalizer=normalizer)
    assert kb.ids_for_name(mention) == ("D012859",)
    assert kb.names[0] == unicodedata.normalize("NFC", kb.names[0])


@pytest.mark.parametrize("name, mention", [(NFD, NFC), (NFC, NFD)])
def test_exact_match_links_the_other_form(name, mention):
    from spacy_genbioel.retrieval.exact import ExactLinker

    kb = KnowledgeBase([Concept("D012859", [name]), Concept("D001", ["renal failure"])])
    [candidates] = ExactLinker(kb).link([Mention(mention)], 5)
    assert candidates and candidates[0].ids == ("D012859",)


@pytest.mark.parametrize("invisible", ["\u200b", "\u200c\u200d", "\ufeff", "\u00ad", "\u2060", "\u200e\u202e"])
def test_a_name_made_only_of_invisible_characters_is_dropped(invisible):
    kb = KnowledgeBase([Concept("D1", [invisible, "renal failure"]), Concept("D2", [invisible])])
    assert kb.names == ["renal failure"] and "D2" not in kb
    assert kb.drops.names == 2 and kb.drops.concepts == 1
    compact = CompactKB.build([Concept("D1", [invisible, "renal failure"]), Concept("D2", [invisible])])
    assert list(compact.names) == ["renal failure"] and compact.checksum() == kb.checksum()
    with pytest.raises(EmptyKBError):
        KnowledgeBase([Concept("D3", [invisible])])


def test_invisible_characters_inside_a_name_are_ignored():
    kb = KnowledgeBase([Concept("D012859", ["Sjö\u200bgren\u00ad syndrome"])])
    assert kb.names == ["sjögren syndrome"] and kb.ids_for_name(NFD) == ("D012859",)


@given(st.text(max_size=30))
def test_canonically_equivalent_texts_normalize_alike(text):
    for name in NORMALIZERS:
        normalize = get_normalizer(name)
        assert normalize(unicodedata.normalize("NFD", text)) == normalize(unicodedata.normalize("NFC", text))


def test_ascii_text_is_unchanged_by_the_canonical_form():
    text = "Reiter's  Syndrome (ReA), type-2; 1,25-dihydroxyvitamin D3"
    assert canonical_text(text) == text


def test_the_model_reads_the_mention_and_its_context_in_nfc():
    inputs = InputBuilder()
    nfd = Mention(NFD, left=unicodedata.normalize("NFD", "Patient with Sjögren"), right="and fever")
    nfc = Mention(NFC, left=unicodedata.normalize("NFC", "Patient with Sjögren"), right="and fever")
    assert inputs.source(nfd) == inputs.source(nfc) and inputs.prompt(nfd) == inputs.prompt(nfc)
    assert unicodedata.normalize("NFC", inputs.mention_text(nfd)) == inputs.mention_text(nfd)
