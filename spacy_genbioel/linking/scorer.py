"""What the ``genbioel`` factory declares to spaCy, as its ``entity_linker`` does:
a registered scorer, so that ``nlp.evaluate`` and ``spacy evaluate`` report
linking on gold ``kb_id``s, and the attributes it assigns and requires, for
``nlp.analyze_pipes``.

The scorer (``genbioel.linking_scorer.v1``, the component's ``[scorer]``
block) follows spaCy's ``Scorer.score_links``: only the entities whose offsets
match a gold entity with a ``kb_id`` are scored (the NER's misses are the NER
score's business); a right ID is a true positive, a wrong one a false positive
and a false negative, an abstention (no ID: below ``[output] threshold``) a
false negative. Two differences: a gold ``kb_id`` may hold several IDs joined
by ``|`` (how :mod:`spacy_genbioel.corpus.spacy_docs` stores a mention with
several), any of which is right, as recall@1 counts it; and the predicted ID
is read where the component writes it (``span._.<kb_id_attr>``, on
``doc.spans[spans_key]`` when it links those), so a second linker with
``write_kb_id = false`` is scored too. The keys are spaCy's (``nel_micro_p``,
``nel_micro_r``, ``nel_micro_f``, ``nel_macro_*``, ``nel_f_per_type``), for a
component that writes ``kb_id``; another one's are ``nel_<kb_id_attr>_*``, so
two linkers of a pipeline do not overwrite each other's scores.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Dict, Iterable, Optional

from spacy.scorer import PRFScore
from spacy.training import Example
from spacy.util import registry

__all__ = [
    "SCORER",
    "SCORER_CONFIG",
    "ASSIGNS",
    "REQUIRES",
    "SCORE_WEIGHTS",
    "score_links",
    "make_linking_scorer",
    "bind_scorer",
    "score_prefix",
]

SCORER = "genbioel.linking_scorer.v1"
#: the factory's default ``[scorer]`` block
SCORER_CONFIG = {"@scorers": SCORER}
#: what the component writes (the default extension names) and reads, for ``nlp.analyze_pipes``
ASSIGNS = ["token.ent_kb_id", "span._.kb_id", "span._.kb_candidates", "span._.kb_ents"]
REQUIRES = ["doc.ents", "token.ent_iob", "token.ent_type"]
#: spaCy's entity_linker's weights: what ``spacy train`` combines into its score
SCORE_WEIGHTS: Dict[str, Optional[float]] = {"nel_micro_f": 1.0, "nel_micro_r": None, "nel_micro_p": None}


def score_prefix(kb_id_attr: str) -> str:
    """``nel`` for the component writing ``kb_id``, ``nel_<kb_id_attr>`` for another."""
    return "nel" if kb_id_attr == "kb_id" else f"nel_{kb_id_attr}"


def score_links(
    examples: Iterable[Example], *, kb_id_attr: str = "kb_id", spans_key: Optional[str] = None, **cfg: Any
) -> Dict[str, Any]:
    """P/R/F of the predicted IDs (``span._.<kb_id_attr>``) against gold ``kb_id``s, on the
    entities whose offsets match a gold one, micro, macro and per gold label (spaCy's rules)."""
    per_type: Dict[str, PRFScore] = {}
    for example in examples:
        reference, predicted = example.reference, example.predicted
        gold_spans = reference.ents if spans_key is None else reference.spans.get(spans_key, [])
        gold = {(span.start_char, span.end_char): span for span in gold_spans if span.kb_id_}
        spans = predicted.ents if spans_key is None else predicted.spans.get(spans_key, [])
        for span in spans:
            gold_span = gold.get((span.start_char, span.end_char))
            if gold_span is None:
                continue
            prf = per_type.setdefault(gold_span.label_, PRFScore())
            found = span._.get(kb_id_attr) if span.has_extension(kb_id_attr) else None
            if not found:
                prf.fn += 1
            elif found in gold_span.kb_id_.split("|"):
                prf.tp += 1
            else:
                prf.fp += 1
                prf.fn += 1
    micro = PRFScore()
    for prf in per_type.values():
        micro.tp, micro.fp, micro.fn = micro.tp + prf.tp, micro.fp + prf.fp, micro.fn + prf.fn
    n_types = len(per_type) or 1
    prefix = score_prefix(kb_id_attr)
    return {
        f"{prefix}_score": micro.fscore,
        f"{prefix}_score_desc": "micro F",
        f"{prefix}_micro_p": micro.precision,
        f"{prefix}_micro_r": micro.recall,
        f"{prefix}_micro_f": micro.fscore,
        f"{prefix}_macro_p": sum(prf.precision for prf in per_type.values()) / n_types,
        f"{prefix}_macro_r": sum(prf.recall for prf in per_type.values()) / n_types,
        f"{prefix}_macro_f": sum(prf.fscore for prf in per_type.values()) / n_types,
        f"{prefix}_f_per_type": {label: prf.to_dict() for label, prf in per_type.items()},
    }


@registry.scorers(SCORER)
def make_linking_scorer() -> Callable[..., Dict[str, Any]]:
    """The ``[scorer]`` of a ``genbioel`` component: :func:`score_links`."""
    return score_links


def bind_scorer(
    scorer: Optional[Callable[..., Dict[str, Any]]], output: Any, spans_key: Optional[str]
) -> Optional[Callable[..., Dict[str, Any]]]:
    """``scorer`` told where this component writes its IDs (``Pipe.score`` calls it with the examples)."""
    if scorer is None:
        return None
    return functools.partial(scorer, kb_id_attr=output.kb_id_attr, spans_key=spans_key)
