"""A document's abbreviations, as mentions are read with them: the long forms scispacy's
``abbreviation_detector`` found, supplemented by a character-level Schwartz-Hearst pass
for what its token-based matcher misses (:func:`doc_long_forms`), the table the component reads a
document's mentions with (:class:`LongForms`), the same expansion for gold mentions
(:class:`AbbreviationExpander`; GenBioEL used Ab3P, we use the detector the pipeline runs),
and the detector's ``spacy_factories`` entry point."""

from __future__ import annotations

import dataclasses
import re
import warnings
from typing import Dict, List, NamedTuple, Sequence, Tuple

from spacy_genbioel.linking.inputs.short_forms import short_form_pairs
from spacy_genbioel.ty import Mention

# a sentence end inside a long form: ". " (or "!", "?") before a capital letter
_SENTENCE_END = re.compile(r"[.!?]\s+[A-Z]")


class LongForms(NamedTuple):
    """A document's abbreviations as the component uses them."""

    #: a span that is a short form -> its long form (scispacy's detector)
    by_span: Dict[Tuple[int, int], str] = {}
    #: a short form's text -> its long form (scispacy's detector)
    by_text: Dict[str, str] = {}
    #: short -> long forms expanded inside mentions (the ncbi released style)
    inside: Dict[str, str] = {}


def doc_long_forms(doc) -> Tuple[Dict[Tuple[int, int], str], Dict[str, str]]:
    """Long forms found by scispacy's detector in a Doc: by short-form character
    span, and by short-form text (for mentions the detector did not mark).

    The detector's matcher works on tokens, so a short form a tokenizer splits
    ("ataxia-telangiectasia (A-T)": ``A``, ``-``, ``T``, each under its two-character
    minimum) is never found, and Schwartz-Hearst keeps the letters' order, so
    "myotonic dystrophy (DM)" is refused. :func:`supplement_long_forms` adds, for the
    short forms the detector did not define, the pairs the character-level pass finds
    (:func:`~.short_forms.short_form_pairs` with ``inverted``): on NCBI-disease dev, 31
    deferred mentions ("A-T", "DM") that no retriever could link. A detector's long form
    that runs over a sentence end ("disorder. Myotonic dystrophy (DM)": a pipeline with
    no sentence splitter gives the detector whole documents) is dropped, and the pass,
    which stops at ". ", decides."""
    by_span: Dict[Tuple[int, int], str] = {}
    by_text: Dict[str, str] = {}
    for short in getattr(doc._, "abbreviations", None) or []:
        long_form = getattr(short._, "long_form", None)
        if long_form is None or crosses_sentence_end(long_form.text):
            continue
        by_span[(short.start_char, short.end_char)] = long_form.text
        by_text.setdefault(short.text, long_form.text)
    supplement_long_forms(doc.text, by_text)
    return by_span, by_text


def crosses_sentence_end(long_form: str) -> bool:
    """Whether a detector's long form runs over a sentence end (". " before a capital)."""
    return _SENTENCE_END.search(long_form) is not None


def supplement_long_forms(text: str, by_text: Dict[str, str]) -> Dict[str, str]:
    """Add to ``by_text`` (in place, and returned) the ``{short form: long form}`` pairs of
    ``text``'s character-level pass whose short form it lacks: the detector's pairs win,
    and of the pass's own, the first definition in the text wins, as in the detector."""
    for short, long_form in short_form_pairs(text, inverted=True):
        by_text.setdefault(short, long_form)
    return by_text


class AbbreviationExpander:
    def __init__(self) -> None:
        import scispacy.abbreviation  # noqa: F401  (registers the factory)
        import spacy

        self.nlp = spacy.blank("en")
        self.nlp.add_pipe("abbreviation_detector")

    def long_forms(self, text: str) -> Tuple[Dict[Tuple[int, int], str], Dict[str, str]]:
        return doc_long_forms(self.nlp(text))

    def expand(self, mentions: Sequence[Mention], texts: Dict[str, str]) -> Tuple[List[Mention], int]:
        """Mentions whose text is a detected short form get its long form;
        returns the new list and how many were expanded."""
        cache: Dict[str, Tuple[Dict[Tuple[int, int], str], Dict[str, str]]] = {}
        out: List[Mention] = []
        expanded = 0
        for m in mentions:
            text = texts.get(m.doc_id)
            if text is None:
                out.append(m)
                continue
            if m.doc_id not in cache:
                cache[m.doc_id] = self.long_forms(text)
            by_span, by_text = cache[m.doc_id]
            long_form = by_span.get((m.start, m.end)) or by_text.get(m.text)
            if long_form and long_form != m.text:
                out.append(dataclasses.replace(m, text=long_form))
                expanded += 1
            else:
                out.append(m)
        return out, expanded


def make_abbreviation_detector(nlp, name: str = "abbreviation_detector", make_serializable: bool = False):
    """Entry point (``spacy_factories``) for scispacy's ``abbreviation_detector``.

    scispacy registers its factory only when ``scispacy.abbreviation`` is
    imported, so ``spacy.load`` of a pipeline that lists the detector before
    ``genbioel`` failed with E002 unless the caller imported scispacy first.
    spaCy finds this entry point by name and imports this module, whose
    import of ``scispacy.abbreviation`` registers the real factory (with its
    default config), which spaCy then uses.
    """
    from scispacy.abbreviation import AbbreviationDetector

    return AbbreviationDetector(nlp, name=name, make_serializable=make_serializable)


def abbreviation_detector_available() -> bool:
    """Whether scispacy is installed; importing it registers the ``abbreviation_detector`` factory."""
    try:
        import scispacy.abbreviation  # noqa: F401  (registers the factory)
    except ImportError:
        return False
    return True


try:  # register scispacy's factory as soon as this module is imported (see above)
    import scispacy.abbreviation  # noqa: F401
except ImportError:  # scispacy is an optional extra
    pass

# scispacy's detector runs a global matcher with no patterns on every doc, and spaCy warns (W036)
# each time: dozens of lines per annotate run, about nothing the user can act on
warnings.filterwarnings("ignore", message=r"\[W036\] The component 'matcher' does not have any patterns defined")
