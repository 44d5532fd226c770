"""Name normalizers: the functions that turn a KB name or a mention into the
form the KB indexes and the linker generates.

They live in spaCy's ``registry.misc`` under versioned names, each registered
function returning the normalizer (spaCy's style, so a config can say
``@misc = "genbioel.normalizer.v1"``):

* ``genbioel.normalizer.v1`` -- GenBioEL's: lower-case, punctuation to spaces,
  spaces collapsed;
* ``genbioel.lower_normalizer.v1`` -- lower-case and collapse whitespace;
* ``genbioel.whitespace_normalizer.v1`` -- only collapse whitespace.

Every one first drops invisible format characters (zero-width space and
joiners, soft hyphen, byte order mark, bidirectional marks) and puts the text
in Unicode NFC, so a name typed with a precomposed "ö" and one with "o" plus a
combining diaeresis are the same name, and a name made only of invisible
characters normalizes to nothing (and is dropped from the KB). Text already
in NFC without such characters (nearly all text) is unchanged.

The short names ``genbioel``, ``lower`` and ``none`` stay aliases of these
forever: saved pipelines (``"kb_normalizer": "genbioel"`` in ``cfg.json``) and
KB files name them. Other packages add a normalizer with
``@spacy.registry.misc("mypkg.normalizer.v1")`` or a ``spacy_misc`` entry point:
:func:`get_normalizer` calls only registered functions whose name ends in
``normalizer.vN``, and refuses one that does not make a ``str -> str`` function
(a ``cfg.json`` naming another registered function calls nothing).
"""

from __future__ import annotations

import re
import unicodedata
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
# invisible format characters: soft hyphen, Mongolian vowel separator, zero-width space, joiners and marks,
# bidirectional embeddings and isolates, word joiner and invisible operators, byte order mark
_INVISIBLE = re.compile("[\u00ad\u180e\u200b-\u200f\u202a-\u202e\u2060-\u2064\u2066-\u2069\ufeff]")
# terminal escape sequences (CSI ``ESC [ ... m``, 8-bit CSI, OSC ``ESC ] ... BEL``, two-character escapes), whole
_TERMINAL_ESCAPES = re.compile(r"(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b[@-Z\\-_]")
# control characters that separate words (tab, line ends, form feed, file/group/record/unit separators, NEL)
_CONTROL_SPACES = re.compile("[\t\n\x0b\x0c\r\x1c-\x1f\x85]")
# every other C0 / C1 control character, DEL and NUL included
_CONTROLS = re.compile("[\x00-\x08\x0e-\x1b\x7f-\x84\x86-\x9f]")
# the registered names get_normalizer calls (besides the aliases)
_NORMALIZER_NAME = re.compile(r"^\S*normalizer\.v\d+$")

#: The names GenBioEL 0.1 KB files and pipelines use -> their registered names.
NORMALIZER_ALIASES: Dict[str, str] = {
    "genbioel": "genbioel.normalizer.v1",
    "lower": "genbioel.lower_normalizer.v1",
    "none": "genbioel.whitespace_normalizer.v1",
}


def canonical_text(text: str) -> str:
    """``text`` without invisible format characters, in Unicode NFC (what every normalizer starts with)."""
    return unicodedata.normalize("NFC", _INVISIBLE.sub("", text))


def strip_controls(text: str, keep_tabs: bool = False) -> str:
    """``text`` without terminal escape sequences (``ESC[31m``...) and control characters (NUL, DEL, C1):
    those that separate words (tab, line ends, form feed...) become a space, the others go
    (``keep_tabs``: a tab stays, for a line of a tab-separated file). Text without any is returned as it is."""
    if text.isprintable() or not (_CONTROLS.search(text) or _CONTROL_SPACES.search(text)):
        return text
    text = _CONTROLS.sub("", _TERMINAL_ESCAPES.sub("", text))
    return _CONTROL_SPACES.sub(lambda m: m.group() if keep_tabs and m.group() == "\t" else " ", text)


def genbioel_normalize(text: str) -> str:
    """GenBioEL's name normalization: lower-case, punctuation to spaces, spaces collapsed."""
    return _SPACES.sub(" ", _GENBIOEL_PUNCT.sub(" ", canonical_text(text).lower())).strip()


def lower_normalize(text: str) -> str:
    """Lower-case and collapse whitespace, keep punctuation."""
    return _SPACES.sub(" ", canonical_text(text).lower()).strip()


def identity_normalize(text: str) -> str:
    """Only collapse whitespace."""
    return _SPACES.sub(" ", canonical_text(text)).strip()


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
    function whose name ends in ``normalizer.vN``."""
    registered = [name for name in _spacy_misc.get_all() if _NORMALIZER_NAME.match(name)]
    return sorted({*NORMALIZER_ALIASES, *registered})


def get_normalizer(name_or_fn: Union[str, Normalizer]) -> Normalizer:
    """A normalizer from a registered name (``...normalizer.vN``), an old short name, or the
    callable itself. Any other name, and a registered function that does not make a
    ``str -> str`` function, is refused with a ValueError naming it."""
    if callable(name_or_fn):
        return name_or_fn
    name = NORMALIZER_ALIASES.get(name_or_fn, name_or_fn) if isinstance(name_or_fn, str) else name_or_fn
    if not isinstance(name, str) or not _NORMALIZER_NAME.match(name) or name not in _spacy_misc:
        raise ValueError(f"Unknown normalizer {name_or_fn!r}; known: {', '.join(normalizer_names())}")
    try:
        normalizer = _spacy_misc.get(name)()
        probe = normalizer("Probe ö") if callable(normalizer) else None
    except Exception as err:  # noqa: BLE001  (a registered function of another package may raise anything)
        raise ValueError(
            f"{name_or_fn!r} in registry.misc does not make a normalizer ({type(err).__name__}: {err})"
        ) from None
    if not isinstance(probe, str):
        raise ValueError(
            f"{name_or_fn!r} in registry.misc does not make a normalizer (str -> str; got {type(normalizer).__name__})"
        )
    return normalizer
