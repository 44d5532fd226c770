"""The numeric settings of the ``genbioel`` component's blocks, coerced and checked where they are defined.

A number reaches a settings class from Python, from a saved ``config.cfg`` (confection leaves
``.5``, ``nan`` or ``+1`` as strings and lets them pass as floats) or from a command's dotted
overrides (``--output.threshold .5``). ``reranker.settle_threshold nan`` made the cascade never
settle and never search; ``output.threshold .5`` crashed with a TypeError on the first document.
Each numeric field of a settings dataclass declares its range beside its default
(:func:`bounded`), and the class's ``__post_init__`` calls :func:`check_numbers`, which turns a
string spelling a finite number into the field's type and refuses NaN, infinities, text and
values out of range with a ``ValueError`` naming the dotted setting, the range and the value
(the rules are ``train-rescnn``'s: :func:`~spacy_genbioel.retrieval.rescnn_checks.check_setting`)::

    @dataclass(frozen=True)
    class DecodingSettings:
        num_beams: int = bounded(5, Bound(int, 1))

        def __post_init__(self) -> None:
            check_numbers(self, "decoding")
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict

from spacy_genbioel.retrieval.rescnn_checks import Bound, check_setting

__all__ = ["Bound", "bounded", "numeric_bounds", "check_numbers"]

_KEY = "genbioel.bound"


def bounded(default: Any, bound: Bound) -> Any:
    """A dataclass field of ``default`` whose values are ``bound``'s (checked by :func:`check_numbers`)."""
    return dataclasses.field(default=default, metadata={_KEY: bound})


def numeric_bounds(cls: type) -> Dict[str, Bound]:
    """The declared range of each numeric field of the settings dataclass ``cls``."""
    return {f.name: f.metadata[_KEY] for f in dataclasses.fields(cls) if _KEY in f.metadata}


def check_numbers(settings: Any, block: str) -> None:
    """Each numeric field of the dataclass instance ``settings`` as the number it spells, in place
    (frozen or not: this is its construction); a value outside its range raises ValueError naming
    ``block.field``, the range and the value."""
    for name, bound in numeric_bounds(type(settings)).items():
        value = getattr(settings, name)
        number = check_setting(f"{block}.{name}", value, bound)
        if number is not value:
            object.__setattr__(settings, name, number)
