"""A corpus written as GenBioEL's own files (``NAME.source``, ``NAME.target``,
``NAMElabel.txt``), with a released input style, so that GenBioEL's or ANGEL's code
and this package run on the same inputs (``python -m spacy_genbioel export-sources``).

One line per mention, in corpus order: ``NAME.source`` holds ``["<encoder text>"]``,
``NAME.target`` ``["<mention> is", "<target name>"]``, ``NAMElabel.txt`` the gold IDs
(``|``-joined). What GenBioEL's ``prepare_dataset.py`` did, per style:

* ``genbioel-released-ncbi.v1`` (BioSyn's NCBI files): the document's abbreviations
  are expanded word by word inside the mention, a composite mention is split and its
  first part kept (OMIM IDs dropped beside MeSH ones in its label), and with a KB a
  mention with an ID outside it is left out (BioSyn's ``--remove_cuiless``);
* ``genbioel-released-bc5cdr.v1``: a composite annotation is split by its 7th
  column into one line per part (one it cannot place, or without that column, is
  left out); a mention that is a short form of the document becomes its long form;
  with a KB, a mention whose ID is outside it is left out.

The target name is the gold concept's name most like the mention (character 3-gram
TF-IDF; each concept's names by length, the first best; GenBioEL loaded scispacy's
UMLS vectorizer, not distributed, so this one is fit on the KB's names). Without a
KB it is the mention itself. Abbreviations come from :func:`.short_forms.find_short_forms`
(``"schwartz-hearst"``), from Ab3P's output for the corpus (a file), or nowhere
(``"none"``).
"""

from __future__ import annotations

import json
import logging
import re
from bisect import bisect_left, bisect_right
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from spacy_genbioel.linking.inputs.builder import INPUT_STYLES, InputBuilder
from spacy_genbioel.linking.inputs.released_style import (
    RELEASED_MAX_WORDS,
    RELEASED_STYLES,
    expand_short_forms,
    split_bc5cdr_composite,
    split_composite,
)
from spacy_genbioel.linking.inputs.short_forms import find_short_forms, read_ab3p_output
from spacy_genbioel.ty import Mention
from spacy_genbioel.util import PathLike

logger = logging.getLogger(__name__)

__all__ = [
    "SourceLine",
    "NameChooser",
    "source_lines",
    "write_genbioel_files",
    "export_sources",
    "check_split_name",
    "DocumentSides",
    "ABBREVIATION_SOURCES",
]

#: where abbreviations come from, besides an Ab3P output file
ABBREVIATION_SOURCES = ("schwartz-hearst", "none")

#: a split name: a plain file-name stem (it names ``SPLIT.source`` ... inside the output folder)
SPLIT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


@dataclass(frozen=True)
class SourceLine:
    """One mention as GenBioEL's files hold it, and where it is in the corpus."""

    source: str
    prompt: str
    name: str
    label: str
    doc_id: str
    start: int
    end: int


class NameChooser:
    """The gold concept's name most like a mention (GenBioEL's synonym choice: each
    concept's names sorted by length, concepts in label order, the first best TF-IDF cosine)."""

    def __init__(self, kb) -> None:
        from sklearn.feature_extraction.text import TfidfVectorizer

        self.kb = kb
        self.vectorizer = TfidfVectorizer(analyzer="char_wb", ngram_range=(3, 3), lowercase=False)
        self.vectorizer.fit(kb.names)

    def choose(self, mention: str, ids: Sequence[str]) -> str:
        names = [name for cid in ids for name in sorted(self.kb.names_of(cid), key=len)]
        if len(names) <= 1:
            return names[0] if names else mention
        sims = (self.vectorizer.transform(names) @ self.vectorizer.transform([mention]).T).toarray().ravel()
        return names[int(sims.argmax())]


def check_split_name(split: str) -> str:
    """``split`` when it is a plain file-name stem (letters, digits, ``_``, ``.``, ``-``, not
    starting with ``.`` or ``-``): a path (``../x``, ``/tmp/x``) would write outside the output folder."""
    if not isinstance(split, str) or SPLIT_NAME.fullmatch(split) is None:
        raise ValueError(
            f"split must be a plain file-name stem (letters, digits, '_', '.', '-'; not starting with '.' or '-'), "
            f"not {split!r}: it names SPLIT.source, SPLIT.target and SPLITlabel.txt inside the output folder"
        )
    return split


class DocumentSides:
    """The two sides of a mention in one (lower-cased) document, cut to what a released style's
    :func:`~spacy_genbioel.linking.inputs.released_style.cut_context` can keep of them, so that a mention
    costs its kept words, not the whole document (slicing the document once per mention was
    quadratic: half an hour for 800k words and 8k mentions).

    A side is kept whole when it has fewer than ``keep`` space-separated words; else only its
    words from a word start on, with at least ``keep`` words (``cut_context`` keeps at most
    ``max_words - 1`` of a side and only asks whether one has more than ``max_words // 2``). The cut
    side starts and ends on a character that is not a space, so ``str.strip(" ")`` and
    ``str.split(" ")`` give the same last (first) words as on the whole side."""

    def __init__(self, text: str, max_words: int = RELEASED_MAX_WORDS) -> None:
        self.text = text
        #: spaces a cut side holds at least (so at least ``max_words + 2`` words)
        self.spaces = max_words + 1
        self.starts: List[int] = []
        self.ends: List[int] = []
        #: spaces in the text before each run of non-spaces
        self.spaces_before: List[int] = []
        seen = 0
        for match in re.finditer(r"[^ ]+", text):
            start, end = match.span()
            self.starts.append(start)
            self.ends.append(end)
            self.spaces_before.append(start - seen)
            seen += end - start

    def left(self, start: int) -> str:
        """``text[:start]``, stripped of spaces and cut to its last words."""
        last = bisect_right(self.starts, start - 1) - 1  # the last run that starts before the mention
        if last < 0:
            return ""
        end = min(self.ends[last], start)
        need = self.spaces_before[last] - self.spaces
        first = max(bisect_right(self.spaces_before, need, 0, last + 1) - 1, 0)
        return self.text[self.starts[first] : end]

    def right(self, end: int) -> str:
        """``text[end:]``, stripped of spaces and cut to its first words."""
        first = bisect_right(self.ends, end)  # the first run that ends after the mention
        if first == len(self.ends):
            return ""
        need = self.spaces_before[first] + self.spaces
        last = min(bisect_left(self.spaces_before, need, first), len(self.ends) - 1)
        return self.text[max(self.starts[first], end) : self.ends[last]]


def source_lines(
    documents: Iterable,
    inputs: InputBuilder,
    kb=None,
    long_forms: Optional[Mapping[str, Mapping[str, str]]] = None,
    find_abbreviations: bool = True,
    stats: Optional[Counter] = None,
) -> List[SourceLine]:
    """The lines of ``documents`` (:class:`~spacy_genbioel.corpus.pubtator.PubTatorDocument`)
    in ``inputs``' released style. ``long_forms``: short -> long forms per document ID
    (Ab3P's); else found in each document when ``find_abbreviations``. ``stats`` counts
    ``mentions``, ``lines``, ``nil``, ``not_in_kb``, ``composite_split``, ``composite_dropped``,
    ``abbreviation_expanded``."""
    rules = inputs.released
    if rules is None:
        raise ValueError(f"export needs a released input style ({', '.join(RELEASED_STYLES)}), not {inputs.style!r}")
    stats = stats if stats is not None else Counter()
    chooser = NameChooser(kb) if kb is not None else None
    lines: List[SourceLine] = []
    for doc in documents:
        text = doc.text
        # GenBioEL cut the lower-cased document at the corpus offsets
        sides = DocumentSides(text.lower())
        n_words = text.count(" ") + 1  # len(text.split(" "))
        if long_forms is not None:
            forms: Mapping[str, str] = long_forms.get(doc.pmid, {})
        else:
            forms = find_short_forms(text) if find_abbreviations else {}
        for ann in doc.annotations:
            stats["mentions"] += 1
            if ann.nil or not ann.ids:
                stats["nil"] += 1
                continue
            for start, end, mention_text, ids, label_ids in _pieces(ann, forms, rules.biosyn, stats):
                if kb is not None and any(cid not in kb for cid in label_ids):
                    stats["not_in_kb"] += 1
                    continue
                mention = Mention(
                    text=mention_text,
                    ids=ids,
                    left=sides.left(start),
                    right=sides.right(end),
                    doc_id=doc.pmid,
                    start=start,
                    end=end,
                    label=ann.type,
                )
                cleaned = inputs.mention_text(mention)
                name = chooser.choose(cleaned, label_ids) if chooser is not None else cleaned
                lines.append(
                    SourceLine(
                        inputs.source(mention, n_words),
                        inputs.prompt(mention),
                        name,
                        "|".join(label_ids),
                        doc.pmid,
                        start,
                        end,
                    )
                )
                stats["lines"] += 1
    return lines


def _pieces(
    ann, forms: Mapping[str, str], biosyn: bool, stats: Counter
) -> List[Tuple[int, int, str, Tuple[str, ...], Tuple[str, ...]]]:
    """``(start, end, mention text, IDs, label IDs)`` of the lines one annotation gives."""
    if biosyn:
        text = expand_short_forms(ann.text, forms)
        stats["abbreviation_expanded"] += text != ann.text
        parts, label_ids = split_composite(text, ann.ids)
        stats["composite_split"] += len(parts) > 1
        return [(ann.start, ann.end, text, tuple(ann.ids), label_ids)]
    if len(ann.ids) > 1:
        placed = split_bc5cdr_composite(ann.start, ann.text, ann.ids, ann.parts) if ann.parts else []
        if not placed:
            stats["composite_dropped"] += 1
            return []
        stats["composite_split"] += 1
        pieces = [(start, end, text, (cid,)) for start, end, text, cid in placed]
    else:
        pieces = [(ann.start, ann.end, ann.text, tuple(ann.ids))]
    out = []
    for start, end, text, ids in pieces:
        long_form = forms.get(text)
        stats["abbreviation_expanded"] += bool(long_form)
        out.append((start, end, long_form or text, ids, ids))
    return out


def write_genbioel_files(lines: Sequence[SourceLine], out_dir: PathLike, split: str) -> Dict[str, Path]:
    """``SPLIT.source``, ``SPLIT.target`` and ``SPLITlabel.txt`` in ``out_dir``, as GenBioEL
    wrote them (``json.dumps`` of a list per line). ``split``: a plain file-name stem."""
    check_split_name(split)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"source": out / f"{split}.source", "target": out / f"{split}.target", "label": out / f"{split}label.txt"}
    with (
        paths["source"].open("w", encoding="utf8", newline="\n") as src,
        paths["target"].open("w", encoding="utf8", newline="\n") as tgt,
        paths["label"].open("w", encoding="utf8", newline="\n") as lab,
    ):
        for line in lines:
            src.write(json.dumps([line.source]) + "\n")
            tgt.write(json.dumps([line.prompt, line.name]) + "\n")
            lab.write(line.label + "\n")
    return paths


def export_sources(
    corpus: PathLike,
    out: PathLike,
    split: str,
    kb: Optional[PathLike] = None,
    fmt: str = "pubtator",
    style: str = "genbioel-released-ncbi.v1",
    abbreviations: str = "schwartz-hearst",
) -> Dict[str, object]:
    """Write ``corpus`` as GenBioEL's files (see the module docstring); returns the counts
    and the paths. ``abbreviations``: ``schwartz-hearst``, ``none`` or Ab3P's output file."""
    from spacy_genbioel.corpus.load import read_documents
    from spacy_genbioel.kb.base import KnowledgeBase

    check_split_name(split)
    if style not in RELEASED_STYLES:
        raise ValueError(
            f"style must be a released style ({', '.join(RELEASED_STYLES)}); "
            f"{', '.join(s for s in INPUT_STYLES if s not in RELEASED_STYLES)} has no GenBioEL file form"
        )
    long_forms = None
    if abbreviations not in ABBREVIATION_SOURCES:
        if not Path(abbreviations).is_file():
            raise ValueError(
                f"abbreviations must be {' or '.join(ABBREVIATION_SOURCES)}, or Ab3P's output file "
                f"(not found: {abbreviations})"
            )
        long_forms = read_ab3p_output(abbreviations)
    documents = read_documents(corpus, fmt)
    knowledge = KnowledgeBase.load(kb) if kb is not None else None
    stats: Counter = Counter()
    lines = source_lines(
        documents,
        InputBuilder(style=style),
        knowledge,
        long_forms,
        find_abbreviations=abbreviations != "none",
        stats=stats,
    )
    paths = write_genbioel_files(lines, out, split)
    logger.info("export-sources: %d lines from %d mentions (%s)", stats["lines"], stats["mentions"], dict(stats))
    return {
        "counts": dict(stats),
        "paths": {key: str(path) for key, path in paths.items()},
        "documents": len(documents),
    }
