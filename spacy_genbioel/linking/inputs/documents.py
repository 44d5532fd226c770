"""Per-document encoder input: a document is read once, with every mention
marked, and each of its mentions is decoded from those encoder states,
told apart by its own decoder prompt ``"mention is"``.

GenBioEL encodes ``left START mention END right`` once per mention, so an
abstract with 16 mentions is encoded 16 times. In document mode
(``InputBuilder.input_mode == "document"``) the encoder reads::

    gap START mention_1 END gap START mention_2 END gap ...

and all mentions of that text share one encoder pass; the prompt names the
mention and the markers show where mentions are. A document longer than
``max_tokens`` is cut into windows that keep every mention whole (each
window starts a quarter of the budget before the first mention it takes), and a
mention reads the window that holds it. Overlapping or nested mentions go to
separate markings of the same document ("layers"): a marking never overlaps.

Which mentions make a document: those with the same ``doc_id`` and character
offsets (``start``/``end``). Their ``left``/``right`` texts (which corpora and
the component cut to a window) are pieced together by offset; characters no
mention's context covers become one space. A mention without ``doc_id`` or
offsets is a document of its own. Training and inference see exactly the same
ids because both come through :meth:`DocumentSources.ids`; a caller that links
a corpus in chunks (training batches, mining, evaluation) first
:meth:`~DocumentSources.register`\\ s all its mentions, so a chunk holding part
of a document still reads the whole of it.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import Counter, defaultdict
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

from spacy_genbioel.ty import Mention

# The SourceEncoder that owns a DocumentSources and the InputBuilder it reads
# (linking.inputs.builder, which imports this module) are typed loosely here.
SourceEncoderLike = Any
InputBuilderLike = Any

logger = logging.getLogger(__name__)

MentionKey = Tuple[int, int, str]


def document_key(mention: Mention) -> Optional[str]:
    """The document a mention belongs to (None: it is a document of its own)."""
    if mention.doc_id and 0 <= mention.start <= mention.end:
        return mention.doc_id
    return None


def mention_key(mention: Mention) -> MentionKey:
    return (mention.start, mention.end, mention.text)


def layers(mentions: Sequence[Mention]) -> List[List[Mention]]:
    """The mentions split into markings that never overlap, each sorted by offset:
    a mention goes to the first layer whose last mention ends before it starts."""
    out: List[List[Mention]] = []
    for m in sorted(mentions, key=lambda m: (m.start, -m.end, m.text)):
        for layer in out:
            if layer[-1].end <= m.start:
                layer.append(m)
                break
        else:
            out.append([m])
    return out


def document_text(mentions: Sequence[Mention]) -> Tuple[str, int]:
    """The document text the mentions' contexts cover, and the offset of its first
    character. Uncovered stretches (between far-apart mentions whose contexts were
    cut) become spaces; mention spans themselves are never read."""
    lo = min(m.start - len(m.left) for m in mentions)
    hi = max(m.end + len(m.right) for m in mentions)
    chars: List[Optional[str]] = [None] * (hi - lo)
    for m in mentions:
        begin = m.start - len(m.left) - lo
        chars[begin : m.start - lo] = m.left
        chars[m.end - lo : m.end - lo + len(m.right)] = m.right
    # a space keeps the offsets; InputBuilder.clean collapses runs of them
    return "".join(ch if ch is not None else " " for ch in chars), lo


class DocumentSources:
    """Encoder token ids of per-document inputs, for :class:`~spacy_genbioel.linking.inputs.builder.SourceEncoder`.

    ``stats`` counts ``documents`` (markings built), ``windows`` and
    ``mentions_shortened`` (a mention longer than a window, kept to its first tokens).
    """

    #: windows of registered documents kept (per input settings); beyond that, rebuilt
    MAX_CACHED = 200_000

    def __init__(self, encoder: SourceEncoderLike) -> None:
        self.encoder = encoder
        self.documents: Dict[str, Dict[MentionKey, Mention]] = {}
        self.stats: Counter = Counter()
        self._cache: Dict[Tuple, Dict[MentionKey, List[int]]] = {}

    def register(self, mentions: Iterable[Mention]) -> int:
        """Remember every mention of these documents, so that any subset of them is
        encoded within its whole document; returns the number of documents known."""
        for m in mentions:
            key = document_key(m)
            if key is not None:
                self.documents.setdefault(key, {})[mention_key(m)] = m
        self._cache.clear()
        return len(self.documents)

    def ids(self, mentions: Sequence[Mention], inputs: InputBuilderLike, max_tokens: int) -> List[List[int]]:
        """Token ids per mention: its document window, special tokens included;
        mentions of one window get the same list object."""
        out: List[Optional[List[int]]] = [None] * len(mentions)
        groups: Dict[str, List[int]] = defaultdict(list)
        for i, m in enumerate(mentions):
            key = document_key(m)
            if key is None:
                # a document of its own: its context is the whole text around it
                alone = dataclasses.replace(m, start=len(m.left), end=len(m.left), doc_id="")
                out[i] = self._windows([alone], inputs, max_tokens)[mention_key(alone)]
            else:
                groups[key].append(i)
        settings = (inputs.start_marker, inputs.end_marker, inputs.lowercase, inputs.max_mention_words, max_tokens)
        for key, members in groups.items():
            known = self.documents.get(key)
            wanted = {mention_key(mentions[i]) for i in members}
            if known is not None and wanted <= known.keys():
                cache_key = (key, settings)
                table = self._cache.get(cache_key)
                if table is None:
                    table = self._windows(list(known.values()), inputs, max_tokens)
                    if len(self._cache) < self.MAX_CACHED:
                        self._cache[cache_key] = table
            else:
                table = self._windows([mentions[i] for i in members], inputs, max_tokens)
            for i in members:
                out[i] = table[mention_key(mentions[i])]
        return out  # type: ignore[return-value]

    # -- one document ------------------------------------------------------------
    def _windows(
        self, mentions: Sequence[Mention], inputs: InputBuilderLike, max_tokens: int
    ) -> Dict[MentionKey, List[int]]:
        unique = list({mention_key(m): m for m in mentions}.values())
        text, lo = document_text(unique)
        table: Dict[MentionKey, List[int]] = {}
        for layer in layers(unique):
            table.update(self._layer_windows(text, lo, layer, inputs, max_tokens))
        return table

    def _layer_windows(
        self, text: str, lo: int, layer: Sequence[Mention], inputs: InputBuilderLike, max_tokens: int
    ) -> Dict[MentionKey, List[int]]:
        encoder = self.encoder
        budget = max_tokens - len(encoder.prefix) - len(encoder.suffix)
        # the pieces, joined with single spaces as InputBuilder.source joins them
        pieces: List[str] = []
        cursor = lo
        for m in layer:
            pieces += [
                inputs.clean(text[cursor - lo : m.start - lo]),
                inputs.start_marker,
                inputs.mention_text(m),
                inputs.end_marker,
            ]
            cursor = m.end
        pieces.append(inputs.clean(text[cursor - lo :]))
        spaced = [(" " if k and any(pieces[:k]) else "") + p if p else "" for k, p in enumerate(pieces)]
        encoded = encoder.pieces(spaced)
        tokens: List[int] = []
        spans: List[Tuple[int, int]] = []
        shortened = 0
        for k in range(len(layer)):
            gap, start, name, end = encoded[4 * k : 4 * k + 4]
            tokens += gap
            name, cut = encoder.fit_mention(name, len(start) + len(end), budget, max_tokens)
            shortened += cut
            spans.append((len(tokens), len(tokens) + len(start) + len(name) + len(end)))
            tokens += start + name + end
        tokens += encoded[-1]
        self.stats["documents"] += 1
        self.stats["mentions_shortened"] += shortened
        table: Dict[MentionKey, List[int]] = {}
        for (begin, end), members in self._cut(spans, len(tokens), budget):
            ids = encoder.prefix + tokens[begin:end] + encoder.suffix
            self.stats["windows"] += 1
            for k in members:
                table[mention_key(layer[k])] = ids
        return table

    @staticmethod
    def _cut(spans: Sequence[Tuple[int, int]], total: int, budget: int) -> List[Tuple[Tuple[int, int], List[int]]]:
        """Windows of at most ``budget`` tokens that keep every span whole:
        ``((begin, end), indices of the spans inside)`` in order. Greedy: a window
        starts a quarter of the budget before its first span (left context for
        it) and takes every later span that ends inside it, so a long document
        needs about ``total / (0.75 budget)`` windows, not always the fewest
        possible. Spans are sorted and disjoint, each at most ``budget`` long."""
        if total <= budget:
            return [((0, total), list(range(len(spans))))]
        lead = budget // 4
        out: List[Tuple[Tuple[int, int], List[int]]] = []
        k = 0
        while k < len(spans):
            a, b = spans[k]
            begin = max(0, min(a - lead, total - budget))
            if begin + budget < b:
                begin = b - budget
            end = min(total, begin + budget)
            members = []
            while k < len(spans) and spans[k][0] >= begin and spans[k][1] <= end:
                members.append(k)
                k += 1
            out.append(((begin, end), members))
        return out
