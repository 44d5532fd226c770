"""``kb_entity_ruler``: a dictionary NER over KB names that a pipeline loads in a fraction of a second.

spaCy's ``entity_ruler`` saves its phrase patterns as text, and ``spacy.load`` runs every one of
them through ``nlp.pipe`` again (with the pipes before the ruler, scispacy's abbreviation detector
included) and keeps a ``Doc`` per pattern: with MEDIC's 73k names, 12 s and 0.46 GB on every load.

This component tokenizes a name once, when it is added, and keeps its token hashes (``ORTH`` for
names matched case-sensitively, ``LOWER`` for the others) in flat arrays, and the names themselves as
one UTF-8 blob (for ``patterns`` and for tokenizing again). Saved, they are one msgpack file
(``patterns.msgpack``) that ``from_disk`` reads back without tokenizing. It does not use spaCy's
:class:`~spacy.matcher.PhraseMatcher` either: its trie takes about 1.5 KB per name (1.3 GB for
BC5CDR's 760k). Each name is one 64-bit polynomial hash of its token hashes instead, in a sorted
array; a document's windows of every pattern length are hashed the same way (from prefix hashes)
and looked up with :func:`numpy.searchsorted`, and a hit is checked token by token.

Hashes are only valid for the tokenizer that cut the names: the component records a digest of
``nlp.tokenizer.to_bytes()`` (and the language, whose ``LOWER`` it is), and when it is loaded into
(or given names under) a pipeline with another tokenizer it tokenizes its names again (logged: as
slow as spaCy's ruler).

Matches become ``doc.ents`` as spaCy's ``entity_ruler`` makes them: the longest match first, then
the earliest (then the label, for a stable order); a match that overlaps one already taken is
dropped, and so is one over a token that already has an entity, unless ``overwrite_ents``.
"""

from __future__ import annotations

import hashlib
import logging
import sys
from array import array
from itertools import islice
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, Iterator, List, Mapping, Optional, Tuple

import numpy as np
import srsly
from spacy.attrs import LOWER, ORTH
from spacy.language import Language
from spacy.pipeline import Pipe
from spacy.tokenizer import Tokenizer
from spacy.tokens import Doc, Span
from spacy.util import ensure_path
from spacy.vocab import Vocab

logger = logging.getLogger(__name__)

__all__ = ["FACTORY", "KBEntityRuler", "make_kb_entity_ruler"]

#: the factory name (``nlp.add_pipe(FACTORY)``)
FACTORY = "kb_entity_ruler"
_FILE = "patterns.msgpack"
_FORMAT = 1
#: names tokenized per batch
_BATCH = 10_000
#: the multiplier of the polynomial pattern hash (odd: arithmetic mod 2**64)
_P = 0x9E3779B97F4A7C15
_MASK = 2**64 - 1
#: windows looked up in one go (more: one pattern length at a time)
_WINDOWS = 1 << 20
#: attribute per pattern kind: 0 case-insensitive, 1 case-sensitive
_ATTRS = (LOWER, ORTH)


def make_kb_entity_ruler(nlp: Language, name: str, overwrite_ents: bool, scorer: Optional[Callable]) -> "KBEntityRuler":
    return KBEntityRuler(nlp, name, overwrite_ents=overwrite_ents, scorer=scorer)


Language.factory(
    FACTORY,
    assigns=["doc.ents", "token.ent_type", "token.ent_iob"],
    default_config={"overwrite_ents": False, "scorer": {"@scorers": "spacy.entity_ruler_scorer.v1"}},
    default_score_weights={"ents_f": 1.0, "ents_p": 0.0, "ents_r": 0.0, "ents_per_type": None},
)(make_kb_entity_ruler)


def tokenizer_digest(nlp: Language) -> Optional[str]:
    """What the saved hashes depend on: the language and the tokenizer's serialized rules
    (None for a tokenizer that cannot be serialized: its names are always tokenized again)."""
    to_bytes = getattr(nlp.tokenizer, "to_bytes", None)
    if to_bytes is None:
        return None
    return hashlib.sha256(nlp.lang.encode() + b"\0" + to_bytes(exclude=["vocab"])).hexdigest()


class KBEntityRuler(Pipe):
    """Phrase patterns ``{"label", "pattern", "case_sensitive"}`` as ``doc.ents`` (see the module docstring).

    ``case_sensitive`` patterns match the tokens' exact text (``ORTH``), the others their lower case
    (``LOWER``, as ``entity_ruler`` with ``phrase_matcher_attr = "LOWER"``)."""

    def __init__(
        self, nlp: Language, name: str = FACTORY, *, overwrite_ents: bool = False, scorer: Optional[Callable] = None
    ) -> None:
        self.nlp = nlp
        self.name = name
        self.overwrite = overwrite_ents
        self.scorer = scorer
        self.clear()

    # -- patterns --------------------------------------------------------------------------------
    def clear(self) -> None:
        """Remove every pattern."""
        self._labels: List[str] = []
        self._label_ids: Dict[str, int] = {}
        self._hashes = array("Q")  # every pattern's token hashes, one after the other
        self._lengths = array("I")  # tokens per pattern
        self._pattern_labels = array("I")  # index into _labels
        self._exact = array("B")  # 1: ORTH, 0: LOWER
        self._names = bytearray()  # the names, "\n"-joined, UTF-8
        self._digest: Optional[str] = None
        self._index: Optional[_HashIndex] = None  # built from the arrays on first use

    def __len__(self) -> int:
        return len(self._lengths)

    @property
    def labels(self) -> Tuple[str, ...]:
        """The labels of the patterns."""
        return tuple(sorted(self._labels))

    @property
    def patterns(self) -> List[Dict[str, Any]]:
        """Every pattern as ``{"label", "pattern", "case_sensitive"}``, in the order added."""
        return [
            {"label": self._labels[lab], "pattern": name, "case_sensitive": bool(exact)}
            for lab, name, exact in zip(self._pattern_labels, self._name_list(), self._exact)
        ]

    def _name_list(self) -> List[str]:
        return self._names.decode("utf8").split("\n") if len(self) else []

    def add_patterns(self, patterns: Iterable[Mapping[str, Any]]) -> int:
        """Add phrase patterns ``{"label": str, "pattern": str, "case_sensitive": bool (default False)}``;
        returns how many were added. A pattern with a line break or without a token is left out
        (spaCy's token patterns, lists of dicts, are not taken: ``ValueError``)."""
        digest = tokenizer_digest(self.nlp)
        if len(self) and digest != self._digest:
            self._retokenize("the tokenizer changed since patterns were added")
        self._digest = digest
        return self._add((p["label"], p["pattern"], bool(p.get("case_sensitive", False))) for p in patterns)

    def _add(self, patterns: Iterable[Tuple[str, Any, bool]]) -> int:
        added = 0
        patterns = iter(patterns)
        self._index = None
        tokenizer = self._scratch_tokenizer()
        while True:
            batch = [(label, text, exact) for label, text, exact in islice(patterns, _BATCH) if _usable(text)]
            if not batch:
                return added
            texts = [text for _, text, _ in batch]
            docs = tokenizer.pipe(texts, batch_size=1000) if hasattr(tokenizer, "pipe") else map(tokenizer, texts)
            for (label, text, exact), doc in zip(batch, docs):
                if not len(doc):
                    continue
                self._pattern_labels.append(self._label_id(label))
                self._hashes.extend(doc.to_array(_ATTRS[exact]).tolist())
                self._lengths.append(len(doc))
                self._exact.append(int(exact))
                self._names.extend((("\n" if len(self) > 1 else "") + text).encode("utf8"))
                added += 1

    def _scratch_tokenizer(self) -> Any:
        """``nlp.tokenizer``, and if it is spaCy's, a copy of it over a vocab of its own: the hashes are the
        same, but the names' words stay out of the pipeline's string store (saved with it, read on load)."""
        tokenizer = self.nlp.tokenizer
        if type(tokenizer) is not Tokenizer:
            return tokenizer
        copy = Tokenizer(Vocab(lex_attr_getters=dict(self.nlp.vocab.lex_attr_getters)))
        return copy.from_bytes(tokenizer.to_bytes(exclude=["vocab"]), exclude=["vocab"])

    def _label_id(self, label: str) -> int:
        if not isinstance(label, str) or not label:
            raise ValueError(f"A pattern's label must be a non-empty string, not {label!r}")
        if label not in self._label_ids:
            self._label_ids[label] = len(self._labels)
            self._labels.append(label)
        return self._label_ids[label]

    def _retokenize(self, why: str) -> None:
        logger.warning("%s: tokenizing its %d names again (%s)", self.name, len(self), why)
        patterns = list(
            zip((self._labels[lab] for lab in self._pattern_labels), self._name_list(), map(bool, self._exact))
        )
        self.clear()
        self._digest = tokenizer_digest(self.nlp)
        self._add(patterns)

    # -- annotation ------------------------------------------------------------------------------
    def __call__(self, doc: Doc) -> Doc:
        error_handler = self.get_error_handler()
        try:
            self.set_annotations(doc, self.match(doc))
            return doc
        except Exception as err:  # spaCy's error handler decides (raises by default)
            return error_handler(self.name, self, [doc], err)

    def match(self, doc: Doc) -> List[Tuple[str, int, int]]:
        """``(label, start, end)`` of every match: the longest first, then the earliest (then by label)."""
        if self._index is None:
            self._index = _HashIndex(self)
        found = {(self._labels[self._pattern_labels[p]], start, end) for p, start, end in self._index.find(doc)}
        return sorted(found, key=lambda m: (m[1] - m[2], m[1], m[0]))

    def set_annotations(self, doc: Doc, matches: List[Tuple[str, int, int]]) -> None:
        entities = list(doc.ents)
        new: List[Span] = []
        taken = set()
        for label, start, end in matches:
            if start in taken or end - 1 in taken:
                continue
            if not self.overwrite and any(token.ent_type for token in doc[start:end]):
                continue
            new.append(Span(doc, start, end, label=label))
            entities = [e for e in entities if not (e.start < end and e.end > start)]
            taken.update(range(start, end))
        doc.ents = entities + new

    def initialize(
        self,
        get_examples: Callable[[], Iterable[Any]],
        *,
        nlp: Optional[Language] = None,
        patterns: Optional[Iterable[Mapping[str, Any]]] = None,
    ) -> None:
        """``nlp.initialize()``: the patterns stay unless ``patterns`` are given (they replace them)."""
        if patterns is not None:
            self.clear()
            self.add_patterns(patterns)

    # -- serialization ---------------------------------------------------------------------------
    def to_bytes(self, *, exclude: Iterable[str] = ()) -> bytes:
        return srsly.msgpack_dumps(
            {
                "format": _FORMAT,
                "byteorder": sys.byteorder,
                "tokenizer": self._digest,
                "labels": self._labels,
                "hashes": self._hashes.tobytes(),
                "lengths": self._lengths.tobytes(),
                "pattern_labels": self._pattern_labels.tobytes(),
                "exact": self._exact.tobytes(),
                "names": bytes(self._names),
            }
        )

    def from_bytes(self, data: bytes, *, exclude: Iterable[str] = ()) -> "KBEntityRuler":
        state = srsly.msgpack_loads(data)
        if state.get("format") != _FORMAT:
            raise ValueError(f"{self.name}: patterns of format {state.get('format')!r}, this version reads {_FORMAT}")
        self.clear()
        self._labels = list(state["labels"])
        self._label_ids = {label: i for i, label in enumerate(self._labels)}
        for attr, typecode in (("hashes", "Q"), ("lengths", "I"), ("pattern_labels", "I"), ("exact", "B")):
            values = array(typecode)
            values.frombytes(state[attr])
            if state["byteorder"] != sys.byteorder:
                values.byteswap()
            setattr(self, f"_{attr}", values)
        self._names = bytearray(state["names"])
        self._digest = state["tokenizer"]
        if self._digest is None or self._digest != tokenizer_digest(self.nlp):
            self._retokenize("it was saved with another tokenizer")
        self._index = _HashIndex(self)
        return self

    def to_disk(self, path: Any, *, exclude: Iterable[str] = ()) -> None:
        path = ensure_path(path)
        path.mkdir(parents=True, exist_ok=True)
        (path / _FILE).write_bytes(self.to_bytes())

    def from_disk(self, path: Any, *, exclude: Iterable[str] = ()) -> "KBEntityRuler":
        return self.from_bytes((Path(path) / _FILE).read_bytes())


class _HashIndex:
    """The patterns of a :class:`KBEntityRuler` for lookup: per attribute (0: LOWER, 1: ORTH), the
    patterns' 64-bit keys ``sum(h[j] * P**(n-1-j)) mod 2**64`` over their token hashes ``h``, sorted."""

    def __init__(self, ruler: KBEntityRuler) -> None:
        self.hashes = np.frombuffer(ruler._hashes, dtype=np.uint64).copy()
        lengths = np.frombuffer(ruler._lengths, dtype=np.uint32).astype(np.int64)
        exact = np.frombuffer(ruler._exact, dtype=np.uint8)
        self.offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=self.offsets[1:])
        keys = np.zeros(len(lengths), dtype=np.uint64)
        by_length = np.argsort(-lengths, kind="stable")
        longest = int(lengths.max()) if len(lengths) else 0
        with np.errstate(over="ignore"):
            for j in range(longest):  # the patterns longer than j take their token j
                active = by_length[: np.count_nonzero(lengths > j)]
                keys[active] = keys[active] * np.uint64(_P) + self.hashes[self.offsets[active] + j]
            self.powers = np.cumprod(np.full(longest + 1, _P, dtype=np.uint64)) if longest else np.ones(1, np.uint64)
        self.powers = np.concatenate([np.ones(1, dtype=np.uint64), self.powers])  # powers[n] = P**n
        self.keys, self.patterns, self.lengths = [], [], []
        for attr in (0, 1):
            mine = np.flatnonzero(exact == attr)
            order = mine[np.argsort(keys[mine], kind="stable")]
            self.keys.append(keys[order])
            self.patterns.append(order)
            self.lengths.append(np.unique(lengths[mine]))

    def find(self, doc: Doc) -> Iterator[Tuple[int, int, int]]:
        """``(pattern, start, end)`` of every occurrence of every pattern in ``doc``."""
        if not len(doc):
            return
        tokens = doc.to_array(list(_ATTRS))
        for attr in (0, 1):
            keys = self.keys[attr]
            if not len(keys):
                continue
            column = tokens[:, attr]
            prefix = [0]
            for value in column.tolist():  # prefix[i] = key of tokens[:i]
                prefix.append((prefix[-1] * _P + value) & _MASK)
            prefix = np.array(prefix, dtype=np.uint64)
            lengths = [length for length in self.lengths[attr].tolist() if length <= len(doc)]
            # every window of every pattern length at once; a long document one length at a time
            for group in [lengths] if len(doc) * len(lengths) <= _WINDOWS else [[length] for length in lengths]:
                yield from self._find(attr, group, prefix, column)

    def _find(
        self, attr: int, lengths: List[int], prefix: np.ndarray, column: np.ndarray
    ) -> Iterator[Tuple[int, int, int]]:
        keys, n = self.keys[attr], len(column)
        with np.errstate(over="ignore"):  # hashed as the patterns are
            windows = np.concatenate([prefix[length:] - prefix[:-length] * self.powers[length] for length in lengths])
        window_lengths = np.repeat(lengths, [n - length + 1 for length in lengths])
        window_starts = np.concatenate([np.arange(n - length + 1) for length in lengths])
        where = np.searchsorted(keys, windows)
        for i in np.flatnonzero(keys[np.minimum(where, len(keys) - 1)] == windows).tolist():
            yield from self._hits(
                attr, int(where[i]), windows[i], column, int(window_starts[i]), int(window_lengths[i])
            )

    def _hits(
        self, attr: int, at: int, key: np.uint64, column: np.ndarray, start: int, length: int
    ) -> Iterator[Tuple[int, int, int]]:
        keys, patterns = self.keys[attr], self.patterns[attr]
        while at < len(keys) and keys[at] == key:
            pattern = int(patterns[at])
            offset = self.offsets[pattern]
            if self.offsets[pattern + 1] - offset == length and np.array_equal(
                self.hashes[offset : offset + length], column[start : start + length]
            ):
                yield pattern, start, start + length
            at += 1


def _usable(text: Any) -> bool:
    if not isinstance(text, str):
        raise ValueError(f"{FACTORY} takes phrase patterns (strings), not {type(text).__name__}: {text!r:.80}")
    return bool(text.strip()) and "\n" not in text
