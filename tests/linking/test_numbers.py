"""Numeric settings: every numeric field of every block of the component takes a finite number of its type and
range, given as a number or as text (a saved config.cfg and the command line give text: ``.5``, ``+1``), and
refuses the rest (``nan``, ``inf``, ``1e309``, ``abc``, out of range) with a ValueError naming the dotted setting."""

import math
import typing

import pytest
import spacy
from hypothesis import given, settings
from hypothesis import strategies as st

from spacy_genbioel.linking.numbers import numeric_bounds
from spacy_genbioel.linking.settings import BLOCKS

#: values of other fields a field's own check needs (top_k <= num_beams)
COMPANIONS = {("decoding", "num_beams"): {"top_k": 1}, ("decoding", "top_k"): {"num_beams": 10**6}}
FIELDS = [
    (block, cls, name, bound) for block, (_, cls) in BLOCKS.items() for name, bound in numeric_bounds(cls).items()
]
NEVER = ["nan", "NaN", "inf", "-inf", "Infinity", "1e309", "-1e309", "abc", "", " ", "1_000", "0x10", "1,5", "[1]"]


def _numeric(annotation) -> bool:
    args = [a for a in typing.get_args(annotation) if a is not type(None)] or [annotation]
    return len(args) == 1 and args[0] in (int, float)


def test_every_numeric_field_of_every_block_declares_its_range():
    for block, (_, cls) in BLOCKS.items():
        hints = typing.get_type_hints(cls)
        numeric = {name for name, annotation in hints.items() if _numeric(annotation)}
        assert numeric == set(numeric_bounds(cls)), block
    assert {("decoding", "length_penalty"), ("reranker", "settle_threshold"), ("output", "threshold")} <= {
        (block, name) for block, _, name, _ in FIELDS
    }


def _valid(bound):
    low = -1e6 if bound.low is None else bound.low
    high = 1e6 if bound.high is None else bound.high
    if bound.kind is int:
        whole = st.integers(int(math.ceil(low)) + int(bound.open), int(high) - int(bound.below))
        return whole.flatmap(lambda v: st.sampled_from([(str(v), v), (f"+{v}" if v >= 0 else str(v), v), (v, v)]))
    real = st.floats(low, high, exclude_min=bound.open, exclude_max=bound.below, allow_nan=False)
    spelled = [lambda v: (repr(v), v), lambda v: (v, v), lambda v: (f"{v:.17e}", float(f"{v:.17e}"))]
    spelled.append(lambda v: (f"+{v!r}" if math.copysign(1.0, v) > 0 else repr(v), v))  # -0.0 has its sign
    return st.tuples(real, st.sampled_from(spelled)).map(lambda pair: pair[1](pair[0]))


def _invalid(bound):
    out = [st.sampled_from(NEVER), st.just(True)]
    if bound.low is not None:
        below = st.floats(bound.low - 1e6, bound.low, exclude_max=not bound.open, allow_nan=False)
        out.append(below.filter(lambda v: bound.kind is float or v < math.floor(bound.low) + bound.open).map(repr))
    if bound.high is not None:
        out.append(st.floats(bound.high, bound.high + 1e6, exclude_min=not bound.below, allow_nan=False).map(repr))
    if bound.kind is int:
        out.append(st.sampled_from([".5", "2.5", "1e-3"]))
    return st.one_of(out)


@pytest.mark.parametrize("block,cls,name,bound", FIELDS, ids=[f"{b}.{n}" for b, _, n, _ in FIELDS])
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_numeric_fields_take_numbers_and_refuse_the_rest(block, cls, name, bound, data):
    base = COMPANIONS.get((block, name), {})
    text, expected = data.draw(_valid(bound), label="valid")
    made = cls(**base, **{name: text})
    assert getattr(made, name) == expected and type(getattr(made, name)) is bound.kind
    bad = data.draw(_invalid(bound), label="invalid")
    with pytest.raises(ValueError, match=rf"^{block}\.{name} must be .*, got "):
        cls(**base, **{name: bad})


def test_text_numbers_in_a_config_reach_the_component_as_numbers():
    nlp = spacy.blank("en")
    pipe = nlp.add_pipe("genbioel", config={"output": {"threshold": ".5"}, "decoding": {"length_penalty": "+1"}})
    assert pipe.output.threshold == 0.5 and pipe.decoding.length_penalty == 1.0
    with pytest.raises(ValueError, match=r"reranker\.settle_threshold must be .*, got 'nan'"):
        spacy.blank("en").add_pipe("genbioel", config={"reranker": {"settle_threshold": "nan"}})
    with pytest.raises(ValueError, match=r"decoding\.length_penalty must be a finite number, got 'nan'"):
        spacy.blank("en").add_pipe("genbioel", config={"decoding": {"length_penalty": "nan"}})
