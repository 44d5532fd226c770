"""Abbreviations of a document as ``{short form: long form}``, the table the
released NCBI style expands mentions with (GenBioEL and BioSyn ran Ab3P).

* :func:`find_short_forms`: Schwartz and Hearst's algorithm (PSB 2003) on the raw
  characters of the text: a ``long form (SF)`` pair is kept when the short form's
  letters and digits appear, in order, in the words before the parenthesis, its
  first one at the start of a word. Ab3P is not installable here; this stand-in
  finds what Ab3P found in hyphenated and semicolon-cut short forms (``(A-T)``,
  ``(SJS; ...)``), which scispacy's token-based detector misses. A long form with
  unbalanced parentheses is refused (``Atm (ataxia telangiectasia (AT) -mutated)``
  defines AT, not Atm).
* ``inverted=True`` (the default pipeline's supplement to scispacy's detector, not
  the released style): when neither order-keeping strategy matches, the last words
  whose initials are the short form's letters in another order are the long form
  ("myotonic dystrophy (DM)", from the Latin "dystrophia myotonica"), as
  :func:`inverted_initials_long_form` says.
* :func:`read_ab3p_output`: Ab3P's own output for a corpus (the file GenBioEL read:
  ``PMID|...`` opening each document, then ``  SF|LF|score`` lines), for an exact
  reproduction where Ab3P is at hand.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Dict, Iterator, Optional, Tuple

__all__ = [
    "find_short_forms",
    "short_form_pairs",
    "initials_long_form",
    "inverted_initials_long_form",
    "best_long_form",
    "read_ab3p_output",
]

_WORDS = re.compile(r"[^\W_]+")


def find_short_forms(text: str, inverted: bool = False) -> Dict[str, str]:
    """``{short form: long form}`` of ``text`` (a later pair of the same short form wins,
    as in a dict built from Ab3P's lines)."""
    return dict(short_form_pairs(text, inverted))


def short_form_pairs(text: str, inverted: bool = False) -> Iterator[Tuple[str, str]]:
    """``(short form, long form)`` pairs in text order: every ``" ("`` opens a candidate;
    ``inverted`` also accepts a long form whose initials are the short form's in another order."""
    at = text.find(" (")
    while at > -1:
        open_at = at + 1
        close_at = _closing(text, open_at)
        if close_at < 0:
            return
        pair = _pair(text, open_at, close_at, inverted)
        if pair is not None:
            yield pair
        # from just inside: a parenthesis nested in this one opens a candidate too
        at = text.find(" (", open_at)


def _closing(text: str, open_at: int) -> int:
    depth = 0
    for i in range(open_at, len(text)):
        if text[i] == "(":
            depth += 1
        elif text[i] == ")":
            depth -= 1
            if depth == 0:
                return i
    return -1


def _pair(text: str, open_at: int, close_at: int, inverted: bool = False) -> Optional[Tuple[str, str]]:
    # the long form lies after the last ". " or ", " before the parenthesis
    bound = max(text.rfind(". ", 0, open_at), text.rfind(", ", 0, open_at))
    long_form = text[bound + 2 if bound > -1 else 0 : open_at - 1]
    short_form = text[open_at + 1 : close_at]
    for cut in (", ", "; "):
        if cut in short_form:
            short_form = short_form[: short_form.index(cut)]
    if len(short_form.split()) > 2 or len(short_form) > len(long_form):
        # "short form (long form)": the word before the parenthesis is the short form
        word_at = text.rfind(" ", 0, open_at - 1)
        long_form, short_form = short_form, text[word_at + 1 : open_at - 1]
        if not any(ch.isupper() for ch in short_form):
            return None
    short_form, long_form = short_form.strip(), long_form.strip()
    if not _valid_short_form(short_form):
        return None
    best = initials_long_form(short_form, long_form) or best_long_form(short_form, long_form)
    if best is None and inverted:
        best = inverted_initials_long_form(short_form, long_form)
    if best is None:
        return None
    size = sum(ch.isalnum() for ch in short_form)
    words = len(best.split())
    if (
        len(best) < len(short_form)
        or f"{short_form} " in best
        or best.endswith(short_form)
        or words > 2 * size
        or words > size + 5
        or size > 10
        or best.count("(") != best.count(")")
    ):
        return None
    return short_form, best


def _valid_short_form(short_form: str) -> bool:
    return (
        len(short_form) > 1
        and any(ch.isalpha() for ch in short_form)
        and (short_form[0].isalnum() or short_form[0] == "(")
    )


def initials_long_form(short_form: str, long_form: str) -> Optional[str]:
    """The last words of ``long_form`` (split at anything but letters and digits) whose
    initials spell the short form's letters and digits, from the first of them on
    (Ab3P's most precise strategy: "attenuated adenomatous polyposis coli (AAPC)",
    where :func:`best_long_form` stops at "adenomatous")."""
    letters = [ch.lower() for ch in short_form if ch.isalnum()]
    words = list(_WORDS.finditer(long_form))
    if not letters or len(words) < len(letters):
        return None
    last = words[len(words) - len(letters) :]
    if [w.group()[0].lower() for w in last] != letters:
        return None
    return long_form[last[0].start() :]


def inverted_initials_long_form(short_form: str, long_form: str) -> Optional[str]:
    """The last words of ``long_form`` whose initials are the short form's letters in any
    order, when the short form is two to four capital letters and no letter repeats
    ("Myotonic dystrophy (DM)"); None otherwise. Every word counts, so "cancer of the
    liver (LC)" finds nothing: the rule asks more of the text than the order-keeping
    strategies, because it gives up their order."""
    if not (2 <= len(short_form) <= 4 and short_form.isalpha() and short_form.isupper()):
        return None
    letters = sorted(short_form.lower())
    if len(set(letters)) != len(letters):
        return None
    words = list(_WORDS.finditer(long_form))
    if len(words) < len(letters):
        return None
    last = words[len(words) - len(letters) :]
    if sorted(w.group()[0].lower() for w in last) != letters:
        return None
    return long_form[last[0].start() :]


def best_long_form(short_form: str, long_form: str) -> Optional[str]:
    """The shortest end of ``long_form`` holding the short form's letters and digits in
    order (case-insensitive), the first one at the start of a word; None if there is none."""
    pos = len(long_form) - 1
    for k in range(len(short_form) - 1, -1, -1):
        ch = short_form[k].lower()
        if not ch.isalnum():
            continue
        while pos >= 0 and (long_form[pos].lower() != ch or (k == 0 and pos > 0 and long_form[pos - 1].isalnum())):
            pos -= 1
        if pos < 0:
            return None
        pos -= 1
    return long_form[long_form.rfind(" ", 0, pos + 1) + 1 :].lstrip("([{")


def read_ab3p_output(path) -> Dict[str, Dict[str, str]]:
    """Ab3P's output for a corpus: ``{document ID: {short form: long form}}``. A line
    ``ID|...`` (an all-digit ID) opens a document; ``SF|LF|score`` lines belong to it;
    Ab3P's ``Failed to find sentence`` lines are skipped."""
    out: Dict[str, Dict[str, str]] = {}
    current: Optional[str] = None
    for line in Path(path).read_text(encoding="utf8").splitlines():
        if not line.strip() or line.startswith("Failed to find sentence"):
            continue
        head = line.split("|", 1)[0]
        if head.isdigit():
            current = head
            out.setdefault(current, {})
            continue
        fields = line.strip().split("|")
        if current is not None and len(fields) >= 2:
            out[current][fields[0].strip()] = fields[1].strip()
    return out
