"""The inverted-initials strategy of the character-level short-form pass: what it accepts,
what it refuses, and that the released style (Ab3P's stand-in) does not use it."""

import string

from hypothesis import given
from hypothesis import strategies as st

from spacy_genbioel.linking.inputs.short_forms import find_short_forms, inverted_initials_long_form


def test_inverted_pairs_only_when_asked():
    text = "Myotonic dystrophy (DM) is dominant."
    assert find_short_forms(text) == {}
    assert find_short_forms(text, inverted=True) == {"DM": "Myotonic dystrophy"}


def test_order_keeping_strategies_come_first():
    text = "Myotonic dystrophy, or dystrophia myotonica (DM), is dominant."
    assert find_short_forms(text, inverted=True) == find_short_forms(text) == {"DM": "dystrophia myotonica"}


def test_inverted_initials_refusals():
    assert inverted_initials_long_form("LC", "cancer of the liver") is None  # "the liver": t, l
    assert inverted_initials_long_form("AA", "aplastic anemia") is None  # a repeated letter
    assert inverted_initials_long_form("dm", "myotonic dystrophy") is None  # not capitals
    assert inverted_initials_long_form("D2M", "myotonic type dystrophy") is None  # a digit
    assert inverted_initials_long_form("ABCDE", "e d c b a") is None  # five letters
    assert inverted_initials_long_form("DM", "dystrophy") is None  # too few words
    assert inverted_initials_long_form("DM", "the myotonic dystrophy") == "myotonic dystrophy"


words = st.text(alphabet=string.ascii_lowercase, min_size=1, max_size=8)


@given(
    st.lists(words, min_size=2, max_size=4, unique_by=lambda w: w[0]),
    st.lists(words, max_size=3),
    st.randoms(use_true_random=False),
)
def test_any_order_of_the_last_words_initials(tail, head, rnd):
    """The last len(short) words are the long form, whatever order the short form's letters take."""
    letters = [w[0].upper() for w in tail]
    rnd.shuffle(letters)
    long_form = " ".join(head + tail)
    assert inverted_initials_long_form("".join(letters), long_form) == " ".join(tail)
