"""PubTator corpora as spaCy NER training data, and the tokenizer they are cut with.

* :func:`convert_pubtator` -- PubTator files (read with
  :func:`~spacy_genbioel.corpus.pubtator.read_pubtator`) to one spaCy ``DocBin`` with
  ``doc.ents``; ``python -m spacy_genbioel ner-corpus`` on the command line
  (:mod:`spacy_genbioel.cli.ner`).
* :func:`make_tokenizer_nlp` -- the blank pipeline whose tokenizer cuts the
  training data; the trained NER and the package built from it keep it.
* :func:`label_mapper`, :func:`parse_label_map` -- corpus labels to NER labels
  (also used to score an end-to-end run against the same labels).

Decisions:

* Labels: BC5CDR's ``Chemical`` / ``Disease`` stay as they are; NCBI-disease's
  ``SpecificDisease``, ``DiseaseClass``, ``Modifier`` and ``CompositeMention``
  become ``Disease`` (``--label-map ncbi``), or every label becomes one
  (``--single-label Disease``). A label map leaves labels it does not name as
  they are.
* Tokenizer: spaCy's English one by default. scispacy's rule-based
  biomedical tokenizer (``--tokenizer scispacy``, ``combined_rule_tokenizer``)
  keeps hyphenated and slashed words whole (``Lidocaine-induced``,
  ``5-FU/LV-treated``), and the corpora annotate the parts: on the training
  splits it moves the boundaries of 882 of 9,385 BC5CDR mentions (9.4%) and
  108 of 5,145 NCBI-disease mentions (and 63 / 30 more are lost to overlaps),
  which a trained NER can never predict exactly; spaCy's tokenizer moves 121
  (1.3%) and 9.
* The tokenizer travels as data, not code: spaCy serializes a tokenizer's
  prefix/suffix/infix patterns and special cases, so a pipeline saved with
  scispacy's tokenizer loads with it under spaCy's stock ``spacy.Tokenizer.v1``
  (scispacy's own released models work the same way). ``ner-corpus
  --tokenizer-out DIR`` saves that blank pipeline, and the training configs
  copy its tokenizer with spaCy's built-in ``spacy.copy_from_base_model.v1``
  callback: ``python -m spacy train`` needs no ``--code`` and ``spacy.load``
  no import of this package.
* Mention offsets inside a token expand to whole tokens (``char_span(...,
  alignment_mode="expand")``, in :func:`~spacy_genbioel.corpus.spacy_docs.to_spacy_docs`);
  such changes are counted and logged. Of overlapping mentions the longer is
  kept (``spacy.util.filter_spans``; same length: the earlier), the others are
  counted; every mention stays in ``doc.spans["gold"]``.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterable, Iterator, Mapping, Optional, Sequence

from spacy_genbioel.util import PathLike

if TYPE_CHECKING:
    from spacy.language import Language
    from spacy.tokens import Doc, Span

    from spacy_genbioel.corpus.pubtator import PubTatorAnnotation, PubTatorDocument

logger = logging.getLogger(__name__)


__all__ = [
    "LABEL_MAPS",
    "NCBI_LABEL_MAP",
    "TOKENIZERS",
    "NerCorpusStats",
    "convert_pubtator",
    "label_mapper",
    "make_tokenizer_nlp",
    "ner_docs",
    "parse_label_map",
]

#: NCBI-disease's four mention types are all diseases.
NCBI_LABEL_MAP: Dict[str, str] = {
    "SpecificDisease": "Disease",
    "DiseaseClass": "Disease",
    "Modifier": "Disease",
    "CompositeMention": "Disease",
}
#: Label maps known by name (``--label-map ncbi``).
LABEL_MAPS: Dict[str, Dict[str, str]] = {"ncbi": NCBI_LABEL_MAP, "none": {}}
#: ``scispacy``: scispacy's rule-based biomedical tokenizer; ``default``: spaCy's English one.
TOKENIZERS = ("default", "scispacy")


def parse_label_map(spec: Optional[str]) -> Dict[str, str]:
    """A label map from a known name (``ncbi``, ``none``) or ``FROM=TO,FROM=TO``."""
    if not spec:
        return {}
    if spec in LABEL_MAPS:
        return dict(LABEL_MAPS[spec])
    mapping: Dict[str, str] = {}
    for item in spec.split(","):
        if not item.strip():
            continue
        source, sep, target = item.partition("=")
        if not sep or not source.strip() or not target.strip():
            raise ValueError(f"label map item {item!r}: expected FROM=TO (or one of {', '.join(sorted(LABEL_MAPS))})")
        mapping[source.strip()] = target.strip()
    return mapping


def label_mapper(
    label_map: Optional[Mapping[str, str]] = None, single_label: Optional[str] = None
) -> Callable[[str], str]:
    """``label -> label``: everything to ``single_label`` when given, else through ``label_map``."""
    if single_label:
        return lambda label: single_label
    mapping = dict(label_map or {})
    return lambda label: mapping.get(label, label)


def make_tokenizer_nlp(tokenizer: str = "default", lang: str = "en") -> "Language":
    """A blank pipeline with spaCy's tokenizer for ``lang`` (``"default"``) or
    scispacy's ``combined_rule_tokenizer`` (``"scispacy"``)."""
    import spacy

    if tokenizer not in TOKENIZERS:
        raise ValueError(f"Unknown tokenizer {tokenizer!r}; use {' or '.join(TOKENIZERS)}")
    nlp = spacy.blank(lang)
    if tokenizer == "scispacy":
        try:
            from scispacy.custom_tokenizer import combined_rule_tokenizer
        except ImportError as err:
            raise ImportError(
                "The scispacy tokenizer needs scispacy (pip install scispacy), or use the default tokenizer"
            ) from err
        nlp.tokenizer = combined_rule_tokenizer(nlp)
    return nlp


# -- conversion ----------------------------------------------------------------------------
@dataclass
class NerCorpusStats:
    """What a conversion did; ``boundary_changed`` mentions were expanded to token boundaries."""

    documents: int = 0
    mentions: int = 0
    entities: int = 0
    boundary_changed: int = 0
    skipped: int = 0
    overlaps_dropped: int = 0
    labels: Counter = field(default_factory=Counter)
    files: Dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> Dict[str, Any]:
        data = dataclasses.asdict(self)
        data["labels"] = dict(sorted(self.labels.items()))
        return data


def _converted_pairs(annotations: Sequence["PubTatorAnnotation"], spans: Sequence["Span"]) -> Iterator[tuple]:
    """(annotation, span) pairs: ``to_spacy_docs`` keeps the annotations' order
    and drops only those covering no token, and an expanded span contains its mention."""
    cursor = 0
    for ann in annotations:
        if cursor < len(spans) and spans[cursor].start_char <= ann.start and ann.end <= spans[cursor].end_char:
            yield ann, spans[cursor]
            cursor += 1


def ner_docs(
    documents: Iterable["PubTatorDocument"],
    nlp: "Language",
    map_label: Callable[[str], str] = lambda label: label,
    source: str = "",
    stats: Optional[NerCorpusStats] = None,
) -> Iterator["Doc"]:
    """spaCy Docs with ``doc.ents`` (mapped labels) for PubTator documents,
    tokenized by ``nlp``; ``stats`` (when given) is updated as they go.
    ``source`` names the file in messages."""
    from spacy_genbioel.corpus.pubtator import CorpusFormatError
    from spacy_genbioel.corpus.spacy_docs import to_spacy_docs

    stats = stats if stats is not None else NerCorpusStats()
    for document in documents:
        for ann in document.annotations:
            if not map_label(ann.type):
                raise CorpusFormatError(
                    f"{source}: PMID {document.pmid}: mention {ann.text!r} at {ann.start}-{ann.end} has no type; "
                    "give --single-label"
                )
        mapped = dataclasses.replace(
            document, annotations=[dataclasses.replace(a, type=map_label(a.type)) for a in document.annotations]
        )
        doc = next(to_spacy_docs([mapped], nlp))
        spans = list(doc.spans["gold"])
        stats.documents += 1
        stats.mentions += len(mapped.annotations)
        stats.skipped += len(mapped.annotations) - len(spans)
        for ann, span in _converted_pairs(mapped.annotations, spans):
            if (span.start_char, span.end_char) != (ann.start, ann.end):
                stats.boundary_changed += 1
                logger.info(
                    "%s: PMID %s: mention %r at %d-%d expanded to token boundaries %d-%d (%r)",
                    source,
                    document.pmid,
                    ann.text,
                    ann.start,
                    ann.end,
                    span.start_char,
                    span.end_char,
                    span.text,
                )
        dropped = len(spans) - len(doc.ents)
        if dropped:
            stats.overlaps_dropped += dropped
            kept = {(e.start, e.end) for e in doc.ents}
            for span in spans:
                if (span.start, span.end) not in kept:
                    logger.info(
                        "%s: PMID %s: overlapping mention %r (%s) dropped",
                        source,
                        document.pmid,
                        span.text,
                        span.label_,
                    )
        stats.entities += len(doc.ents)
        stats.labels.update(e.label_ for e in doc.ents)
        yield doc


def convert_pubtator(
    paths: Sequence[PathLike],
    out: PathLike,
    *,
    nlp: Optional["Language"] = None,
    tokenizer: str = "default",
    label_map: Optional[Mapping[str, str]] = None,
    single_label: Optional[str] = None,
    tokenizer_out: Optional[PathLike] = None,
) -> NerCorpusStats:
    """PubTator files -> one ``.spacy`` DocBin with ``doc.ents`` (see the module
    docstring for labels, boundaries and overlaps). ``nlp`` (default: a blank
    pipeline with ``tokenizer``) tokenizes; ``tokenizer_out`` saves it, for the
    training config's ``paths.tokenizer``. Format errors name file and line."""
    from spacy.tokens import DocBin

    from spacy_genbioel.corpus.pubtator import read_pubtator

    nlp = nlp if nlp is not None else make_tokenizer_nlp(tokenizer)
    map_label = label_mapper(label_map, single_label)
    stats = NerCorpusStats()
    docbin = DocBin(store_user_data=True)
    for path in paths:
        before = stats.documents
        for doc in ner_docs(read_pubtator(path), nlp, map_label, source=str(path), stats=stats):
            docbin.add(doc)
        stats.files[str(path)] = stats.documents - before
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    docbin.to_disk(out)
    if tokenizer_out is not None:
        nlp.to_disk(tokenizer_out)
    logger.info(
        "%d documents, %d entities (%d mentions: %d expanded to "
        "token boundaries, %d overlapping dropped, %d skipped) -> %s",
        stats.documents,
        stats.entities,
        stats.mentions,
        stats.boundary_changed,
        stats.overlaps_dropped,
        stats.skipped,
        out,
    )
    return stats
