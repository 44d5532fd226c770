"""Name normalizers: the functions that turn a KB name or a mention into the
form the KB indexes and the linker generates.

They live in spaCy's ``registry.misc`` under versioned names, each registered
function returning the normalizer (spaCy's style, so a config can say
``@misc = "genbioel.normalizer.v1"``):

* ``genbioel.normalizer.v1`` -- GenBioEL's: lower-case, punctuation to spaces,
  spaces collapsed;
* ``genbioel.lower_normalizer.v1`` -- lower-case and collapse whitespace;
* ``genbioel.whitespace_normalizer.v1`` -- only collapse whitespace.

The short names ``genbioel``, ``lower`` and ``none`` stay aliases of these
forever: saved pipelines (``"kb_normalizer": "genbioel"`` in ``cfg.json``) and
KB files name them. Other packages add a normalizer with
``@spacy.registry.misc("mypkg.normalizer.v1")`` or a ``spacy_misc`` entry point.
"""
from __future__ import annotations

import re
from typing import Callable, Dict, List, Union

import catalogue

# spaCy's ``registry.misc`` (the same catalogue namespace, so ``spacy.util.registry``
# and configs see these names), addressed through catalogue so that reading a KB
# does not import spaCy, thinc and torch (seconds and 250 MB for ``build-kb``).
_spacy_misc = catalogue.Registry(("spacy", "misc"), entry_points=True)

Normalizer = Callable[[str], str]

# GenBioEL turns these characters into spaces before lower-casing and collapsing.
_GENBIOEL_PUNCT = re.compile(r"[,.;{}\[\]()+\-_*/?!`\"'=%><]")
_SPACES = re.compile(r"\s+")

#: The names GenBioEL 0.1 KB files and pipelines use -> their registered names.
NORMALIZER_ALIASES: Dict[str, str] = {
    "genbioel": "genbioel.normalizer.v1",
    "lower": "genbioel.lower_normalizer.v1",
    "none": "genbioel.whitespace_normalizer.v1",
}


def genbioel_normalize(text: str) -> str:
    """GenBioEL's name normalization: lower-case, punctuation to spaces, spaces collapsed."""
    return _SPACES.sub(" ", _GENBIOEL_PUNCT.sub(" ", text.lower())).strip()


def lower_normalize(text: str) -> str:
    """Lower-case and collapse whitespace, keep punctuation."""
    return _SPACES.sub(" ", text.lower()).strip()


def identity_normalize(text: str) -> str:
    """Only collapse whitespace."""
    return _SPACES.sub(" ", text).strip()


@_spacy_misc.register("genbioel.normalizer.v1")
def make_genbioel_normalizer() -> Normalizer:
    return genbioel_normalize


@_spacy_misc.register("genbioel.lower_normalizer.v1")
def make_lower_normalizer() -> Normalizer:
    return lower_normalize


@_spacy_misc.register("genbioel.whitespace_normalizer.v1")
def make_whitespace_normalizer() -> Normalizer:
    return identity_normalize


def normalizer_names() -> List[str]:
    """The names :func:`get_normalizer` knows: the aliases and every registered
    function with ``normalizer`` in its name."""
    registered = [name for name in _spacy_misc.get_all() if "normalizer" in name]
    return sorted({*NORMALIZER_ALIASES, *registered})


def get_normalizer(name_or_fn: Union[str, Normalizer]) -> Normalizer:
    """A normalizer from a registered name, an old short name, or the callable itself."""
    if callable(name_or_fn):
        return name_or_fn
    name = NORMALIZER_ALIASES.get(name_or_fn, name_or_fn)
    if name not in _spacy_misc:
        raise ValueError(f"Unknown normalizer {name_or_fn!r}; known: {', '.join(normalizer_names())}")
    normalizer = _spacy_misc.get(name)()
    if not callable(normalizer):
        raise ValueError(f"{name_or_fn!r} in registry.misc does not make a normalizer (got {type(normalizer).__name__})")
    return normalizer
