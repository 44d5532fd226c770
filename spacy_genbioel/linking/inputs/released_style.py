"""The inputs the published GenBioEL and ANGEL models were trained on: the rules
of the ``genbioel-released-*`` input styles (:class:`~spacy_genbioel.linking.inputs.builder.InputBuilder`'s
``style``), written from GenBioEL's ``src/data_utils/<corpus>/prepare_dataset.py``,
its decoding code, and, for NCBI-disease, BioSyn's ``query_preprocess.py``,
whose preprocessed mentions GenBioEL read.

What every released style does (``genbioel.v1`` differs on each point):

* the document (title, a space, abstract) is lower-cased as a whole and cut at
  the mention's offsets; each side loses its outer spaces (only spaces:
  ``str.strip(" ")``), nothing inside is collapsed;
* the encoder text is ``left + " START " + mention + " END " + right`` with its
  outer spaces removed and HTML entities decoded (``html.unescape``);
* a document of more than 384 words (``text.split(" ")``, so runs of spaces count)
  is cut around the mention: a left side of at most 192 words is kept whole and
  the right side gets the rest of the 384 (counting an empty left side as one
  word); else a right side of at most 192 words is kept whole and the left side
  keeps its last ``384 - len(right)`` words; else 192 words on each side;
* the encoder reads ``" " + text`` (a leading space: its first word is tokenized
  as a word inside a sentence); the decoder prompt is ``" " + mention + " is"``
  after the decoder start token alone (``</s>``, no ``<s>``), the trie is rooted
  at the prompt's last token (`` is``), or at ``</s>`` without a prompt.

How the mention is written differs per corpus:

* ``genbioel-released-ncbi.v1`` (``ANGEL_ncbi``, GenBioEL's NCBI model): BioSyn's
  query preprocessing. Abbreviations are expanded word by word inside the mention
  (Ab3P's short form -> long form pairs of the document; :func:`expand_short_forms`,
  done by the caller, which has the document), a composite mention with several
  gold IDs is split (:func:`split_composite`) and only its first part kept, then
  the text is lower-cased, BioSyn's NCBI spelling list applied
  (:data:`BIOSYN_NCBI_SPELLING`, on whole space-separated words) and every ASCII
  punctuation character but ``|`` turned into a word break.
* ``genbioel-released-bc5cdr.v1`` (``ANGEL_bc5cdr``): the mention as written,
  lower-cased (GenBioEL replaced a whole mention that Ab3P found as a short form
  by its long form; the caller does that too); composite annotations were split
  by their 7th PubTator column before (:func:`split_bc5cdr_composite`).
"""

from __future__ import annotations

import html
import json
import os
import re
import string
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

__all__ = [
    "RELEASED_STYLES",
    "RELEASED_MAX_WORDS",
    "RELEASED_MAX_SOURCE_TOKENS",
    "BIOSYN_NCBI_SPELLING",
    "MentionRules",
    "released_mention",
    "biosyn_clean",
    "expand_short_forms",
    "split_composite",
    "split_bc5cdr_composite",
    "cut_context",
    "document_words",
    "released_parts",
    "recorded_input_style",
    "recorded_max_source_tokens",
    "style_named_in",
]

#: GenBioEL's ``create_input(max_length=384)``: words of a document kept around a mention
RELEASED_MAX_WORDS = 384
#: ``decoding.max_source_tokens`` of a released style: GenBioEL cut documents at 384 words, never
#: at tokens, so the encoder reads them whole (BART-large's 1024 positions, or fewer if the model has fewer)
RELEASED_MAX_SOURCE_TOKENS = 1024
#: the model config's record of the inputs it was trained on (``import-checkpoint`` writes it): a
#: released style's name, or ``genbioel-released`` when the corpus was not known
RECORD_KEY = "genbioel_inputs"

#: BioSyn's ``preprocess/resources/ncbi-spell-check.txt`` (MIT licence, (c) DMIS Lab,
#: Korea University), the spelling corrections its NCBI-disease queries went through,
#: applied to whole lower-cased words (``"tumour,"`` is left alone). Data, needed to
#: write the inputs as the published NCBI models read them.
BIOSYN_NCBI_SPELLING: Dict[str, str] = dict(
    pair.split("||")
    for pair in """
hepatosplenomegally||hepatosplenomegaly hemmorhage||haemorrhage fist||first bactermia||bacteremia
conolidation||consolidation three||triple pneumococcl||pneumococcal collectionan||collection
cirrohsis||cirrhosis adomen||abdomen delerium||delirium atrialfibrillation||atrial_fibrillation
processess||processes dysarthira||dysarthria occlussion||occlusion congenitcal||congenital
atelctasis||atelectasis illeus||ileus pnuemonia||pneumonia withdrawel||withdrawal abdominla||abdominal
hernation||herniation edamatous||edematous smallbowel||small_bowel hyperpigementation||hyperpigmentation
dispress||distress arrrest||arrest forhead||forehead le||leg leukaemia||leukemia abcess||abscess
cerebeller||cerebellar sytem||system hemorrhage||haemorrhage parasthesias||paresthesias tumour||tumor
tumours||tumors
""".split()
)
# two corrections hold a space; "_" stands for it above (the list is split on whitespace)
BIOSYN_NCBI_SPELLING = {typo: fix.replace("_", " ") for typo, fix in BIOSYN_NCBI_SPELLING.items()}

# BioSyn keeps "|" (it separates the parts of a resolved composite mention)
_BIOSYN_BREAKS = re.compile("[\\s" + re.escape(string.punctuation.replace("|", "")) + "]+")


class MentionRules:
    """How one released style writes a mention (see the module docstring)."""

    def __init__(self, name: str, biosyn: bool) -> None:
        self.name = name
        #: BioSyn's query preprocessing (spelling, punctuation) and composite split
        self.biosyn = biosyn

    def __repr__(self) -> str:
        return f"MentionRules({self.name!r})"


#: style name -> its mention rules
RELEASED_STYLES: Dict[str, MentionRules] = {
    "genbioel-released-ncbi.v1": MentionRules("genbioel-released-ncbi.v1", biosyn=True),
    "genbioel-released-bc5cdr.v1": MentionRules("genbioel-released-bc5cdr.v1", biosyn=False),
}


def biosyn_clean(text: str, spelling: Mapping[str, str] = BIOSYN_NCBI_SPELLING) -> str:
    """BioSyn's query text: lower-cased, ``spelling`` applied to whole words, ASCII
    punctuation (but ``|``) and whitespace runs turned into single spaces, stripped."""
    words = [spelling.get(w, w) for w in text.lower().split()]
    return " ".join(_BIOSYN_BREAKS.split(" ".join(words))).strip()


def expand_short_forms(text: str, long_forms: Mapping[str, str], max_rounds: int = 8) -> str:
    """BioSyn's abbreviation expansion inside a mention: each space-separated word
    that is a short form of the document (``long_forms``: short -> long, as written)
    becomes its long form, as do short forms between slashes (``"DM/CMT"``) and a
    short form followed by a comma; repeated until nothing changes (at most
    ``max_rounds`` times: a long form holding its own short form would grow forever)."""
    if not long_forms:
        return text
    for _ in range(max_rounds):
        words = []
        for word in text.split():
            if "/" in word:
                word = "/".join(long_forms.get(part.strip(), part.strip()) for part in word.split("/"))
            if word.endswith(","):
                bare = word.replace(",", "")
                word = long_forms.get(bare, bare) + ","
            else:
                word = long_forms.get(word, word)
            words.append(word)
        expanded = " ".join(words)
        if expanded == text:
            break
        text = expanded
    return text


# BioSyn's composite patterns ("breast and ovarian cancer", "cancer of the breast or ovary", "DM/CMT").
# Its published code allows letters and "-" in a word; the NCBI files GenBioEL read were
# split with digits allowed too ("C6 or C7 deficiency" -> "c6 deficiency", and "breast and
# 79 ovarian cancer" -> "breast ovarian cancer", which only a word pattern with digits gives)
_WORD = "[a-zA-Z0-9-]+"
_PREFIX_OF = re.compile(
    rf"(?P<head>{_WORD}) of (both )?(the )?(?P<first>({_WORD} )+)(and|or) (the )?(?P<second>({_WORD} ?)+)"
)
_NESTED_AND = re.compile(rf"(?P<heads>({_WORD},? )+)(and|or|and/or) (?P<last>{_WORD} and {_WORD}) (?P<stem>.*)")
_LISTED = re.compile(rf"(?P<heads>({_WORD},? )+)(and|or|and/or) (?P<last>(the )?{_WORD}) (?P<stem>.*)")
_SLASHED = re.compile(r"(?P<before>(.* )*)(?P<first>.*)/(?P<second>.*)?(?P<after>( .*)*)")


def _is_omim(concept_id: str) -> bool:
    # MEDIC and the cleaned corpus IDs write OMIM IDs bare (digits); BioSyn saw "OMIM:..."
    return concept_id.upper().startswith("OMIM") or concept_id.isdigit()


def split_composite(text: str, ids: Sequence[str]) -> Tuple[List[str], Tuple[str, ...]]:
    """BioSyn's composite resolution: the parts of a mention with several gold IDs
    (``["breast cancer", "ovarian cancer"]`` for "breast and ovarian cancer") and the
    IDs it keeps (OMIM IDs are dropped when mixed with MeSH ones). A mention it cannot
    split into one part per ID stays whole."""
    ids = tuple(ids)
    if "|" in text:  # already split
        return [text], ids
    if len(ids) > 1 and any(map(_is_omim, ids)) and not all(map(_is_omim, ids)):
        ids = tuple(i for i in ids if not _is_omim(i))
    text = text.strip()
    if len(ids) <= 1:
        return [text], ids
    parts = _composite_parts(text, len(ids))
    return (parts if len(parts) == len(ids) else [text]), ids


def _composite_parts(text: str, n_ids: int) -> List[str]:
    match = _PREFIX_OF.match(text)
    if match:
        return [f"{match['head']} of {match[key].strip()}" for key in ("first", "second")]
    for pattern in (_NESTED_AND, _LISTED):
        match = pattern.match(text)
        if match:
            heads = [*match["heads"].strip().split(","), match["last"]]
            return [f"{head.strip()} {match['stem']}" for head in heads if head]
    match = _SLASHED.fullmatch(text)
    if match and "and/or" not in text:
        before, after = match["before"].strip(), match["after"].strip()
        return [f"{before} {part.strip()} {after}".strip() for part in (match["first"], match["second"] or "")]
    words = text.split()
    return words if len(words) == n_ids else [text]


def split_bc5cdr_composite(
    start: int, text: str, ids: Sequence[str], parts: Sequence[str]
) -> List[Tuple[int, int, str, str]]:
    """GenBioEL's reading of a BC5CDR composite annotation (several IDs, their texts in
    the 7th column): ``(start, end, text, id)`` per part, each part placed after the
    previous one and a space (parts joined by spaces make the mention), " and " or
    " or " (a mention of two parts around that word); an annotation it cannot place
    gives nothing (GenBioEL dropped it)."""
    if " ".join(parts) == text:
        texts, gap = list(parts), 1
    elif len(ids) == 2 and " and " in text:
        texts, gap = text.split(" and "), 5
    elif len(ids) == 2 and " or " in text:
        texts, gap = text.split(" or "), 4
    else:
        return []
    out, offset = [], 0
    for part, cid in zip(texts, ids):
        out.append((start + offset, start + offset + len(part), part, cid))
        offset += gap + len(part)
    return out


def released_mention(text: str, ids: Sequence[str], rules: MentionRules) -> str:
    """The mention as a released style writes it between the markers and in the prompt."""
    if not rules.biosyn:
        return text.lower()
    parts, _ = split_composite(text, ids)
    # BioSyn cleaned the "|"-joined parts as one text, then GenBioEL kept the first part
    return biosyn_clean("|".join(parts)).split("|")[0]


def document_words(left: str, mention: str, right: str) -> int:
    """Words of the document as GenBioEL counted them (``text.split(" ")``)."""
    return len(left.split(" ")) + len(mention.split(" ")) + len(right.split(" ")) - 2


def cut_context(left: str, right: str, n_words: int, max_words: int = RELEASED_MAX_WORDS) -> Tuple[str, str]:
    """The two sides of a mention kept by GenBioEL's ``create_input`` (see the module
    docstring) for a document of ``n_words`` words; each side loses its outer spaces."""
    left, right = left.strip(" "), right.strip(" ")
    if n_words <= max_words:
        return left, right
    left_words, right_words = left.split(" "), right.split(" ")
    half = max_words // 2
    if len(left_words) <= half:
        return left, " ".join(right_words[: max_words - len(left_words)])
    if len(right_words) <= half:
        return " ".join(left_words[len(right_words) - max_words :]), right
    return " ".join(left_words[-half:]), " ".join(right_words[:half])


def released_parts(
    left: str, mention: str, right: str, markers: Tuple[str, str], n_words: int
) -> Tuple[str, str, str, str, str]:
    """``(left, START, mention, END, right)`` of a released style's encoder text, from
    the raw sides and the mention as :func:`released_mention` wrote it: lower-cased,
    cut (``n_words``: the document's words, :func:`document_words`) and HTML-unescaped,
    so that joining the non-empty pieces with single spaces gives GenBioEL's line. An
    entity never spans a space, so unescaping piece by piece is unescaping the line."""
    kept_left, kept_right = cut_context(left.lower(), right.lower(), n_words)
    return html.unescape(kept_left), markers[0], html.unescape(mention), markers[1], html.unescape(kept_right)


def style_named_in(name: str) -> Optional[str]:
    """The released style whose corpus (``ncbi``, ``bc5cdr``) is a word of ``name`` (a
    checkpoint folder's name: ``ANGEL_ncbi``), when exactly one is; else None."""
    words = set(re.split(r"[^a-z0-9]+", name.lower()))
    found = [style for style in RELEASED_STYLES if style[len("genbioel-released-") :].split(".")[0] in words]
    return found[0] if len(found) == 1 else None


def _config_value(model_or_config: Any, key: str) -> Any:
    """``key`` of a model's config: the model, its config, the config as a mapping, or the path
    of a model folder or its ``config.json`` (an unreadable file gives None: loading it says why)."""
    config = getattr(model_or_config, "config", model_or_config)
    if isinstance(config, (str, os.PathLike)):
        path = Path(config)
        try:
            config = json.loads((path / "config.json" if path.is_dir() else path).read_text(encoding="utf8"))
        except (OSError, UnicodeDecodeError, ValueError):
            return None
    return config.get(key) if isinstance(config, Mapping) else getattr(config, key, None)


def recorded_input_style(model_or_config: Any) -> Optional[str]:
    """The released input style a model records it was trained on (``config.genbioel_inputs``,
    written by ``import-checkpoint``), as ``inputs.style`` takes it; None for a model trained
    here, or imported without knowing its corpus (``genbioel-released``). ``model_or_config``:
    the model, its config, the config as a mapping, or a model folder or its ``config.json``."""
    style = _config_value(model_or_config, RECORD_KEY)
    return style if isinstance(style, str) and style in RELEASED_STYLES else None


def recorded_max_source_tokens(model_or_config: Any) -> Optional[int]:
    """The ``decoding.max_source_tokens`` a model with a recorded released style needs
    (:func:`recorded_input_style`): its whole input, at most :data:`RELEASED_MAX_SOURCE_TOKENS`
    (its ``max_position_embeddings`` if fewer); None without a recorded style."""
    if recorded_input_style(model_or_config) is None:
        return None
    positions = _config_value(model_or_config, "max_position_embeddings")
    return (
        min(RELEASED_MAX_SOURCE_TOKENS, positions)
        if isinstance(positions, int) and positions > 0
        else RELEASED_MAX_SOURCE_TOKENS
    )
