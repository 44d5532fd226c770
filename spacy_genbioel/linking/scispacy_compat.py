"""scispacy's ``EntityLinker`` in its meaning, not only its shape.

Code written for scispacy reads ``span._.kb_ents`` and ``linker.kb`` (the
component writes and offers both, :mod:`.kb_view`); what it *means* by them
differs, and this module holds the differences, side by side:

=============================  ==========================================  =============================================
scispacy                       genbioel, default                           genbioel, ``[output]`` setting
=============================  ==========================================  =============================================
score: cosine of char 3-gram   the linker's own score: mean log-prob of    ``probability = true``: a probability in
TF-IDF vectors, in [0, 1]      the generated name's tokens (<= 0; a fused  [0, 1] over the mention's candidates (the
                               probability with a ``reranker.fusion``)     fused one, else a softmax of the scores)
``threshold = 0.7``: drops     ``threshold``: below it no ``kb_id``;       the same, on the probability scale
``kb_ents`` entries below it   candidates and ``kb_ents`` stay
``filter_for_definitions``     off (every concept of the KB is linked)     ``filter_for_definitions = true``
(default on)                                                               (``no_definition_threshold``: kept above it)
``max_entities_per_mention``   ``[decoding] top_k``
=============================  ==========================================  =============================================

With ``probability = true`` every number the component writes is that
probability: ``kb_candidates``, ``kb_ents``, the ``threshold`` it is compared
with and the curve ``evaluate --calibration`` draws, so a threshold calibrated
and shipped (``package --calibration``) reads on the scale it is applied to.
A softmax over the candidates says how the linker's belief splits among them,
not how similar mention and name are: calibrate a threshold on dev either way.

:data:`SCISPACY_SETTINGS` answers scispacy's arguments given at the top level
of the component's config (``threshold = 0.7``) with where they live here, and
:func:`warn_on_scispacy_habits` warns about a threshold no score can reach.
"""

from __future__ import annotations

import logging
import math
from typing import Any, Callable, Dict, List, Sequence

from spacy_genbioel.ty import Candidate

logger = logging.getLogger(__name__)

__all__ = [
    "SCISPACY_SETTINGS",
    "scispacy_setting_hint",
    "written_candidates",
    "as_probabilities",
    "keep_defined",
    "warn_on_scispacy_habits",
]

#: scispacy ``EntityLinker`` arguments (not settings here) -> where their meaning lives in this component
SCISPACY_SETTINGS: Dict[str, str] = {
    "threshold": "the [output] block: config={'output': {'threshold': T}}. No kb_id below it, but the score is the "
    "linker's mean log-probability (<= 0) unless [output] probability = true: calibrate T on dev "
    "(evaluate --calibration; docs/scispacy.md)",
    "max_entities_per_mention": "the [decoding] block, as top_k: config={'decoding': {'top_k': N}}",
    "k": "the [decoding] block, as num_beams (with a retriever, [candidates] num_candidates): "
    "config={'decoding': {'num_beams': K}}",
    "filter_for_definitions": "the [output] block: config={'output': {'filter_for_definitions': True}}",
    "no_definition_threshold": "the [output] block: config={'output': {'filter_for_definitions': True, "
    "'no_definition_threshold': T}}",
    "linker_name": "nothing to download here: give 'model' (a trained model directory) and 'kb' (its KB file); "
    "docs/training.md trains one",
}


def scispacy_setting_hint(name: str) -> str:
    """The message for scispacy's argument ``name`` given at the top level of the config."""
    return (
        f"{name!r} is a setting of scispacy's EntityLinker; in the genbioel component it lives in "
        f"{SCISPACY_SETTINGS[name]}"
    )


def as_probabilities(candidates: Sequence[Candidate]) -> List[Candidate]:
    """The candidates of one mention with a softmax of their scores over the list (in [0, 1],
    summing to 1; the order is kept)."""
    if not candidates:
        return []
    top = max(c.score for c in candidates)
    weights = [math.exp(c.score - top) for c in candidates]
    total = sum(weights)
    return [c._replace(score=w / total) for c, w in zip(candidates, weights)]


def keep_defined(candidates: Sequence[Candidate], kb: Any, keeps_undefined: Callable[[float], bool]) -> List[Candidate]:
    """scispacy's ``filter_for_definitions``: each candidate keeps the concept IDs that have a
    definition in ``kb``; one left with none is dropped, unless ``keeps_undefined(score)`` (its
    score is at least ``no_definition_threshold``: then it stays as it was)."""
    kept = []
    for candidate in candidates:
        ids = tuple(cid for cid in candidate.ids if cid in kb and kb[cid].definition)
        if ids:
            kept.append(candidate._replace(ids=ids))
        elif keeps_undefined(candidate.score):
            kept.append(candidate)
    return kept


def written_candidates(
    results: Sequence[Sequence[Candidate]], output: Any, kb: Any, fused: bool
) -> List[List[Candidate]]:
    """The candidates per mention as the component writes them, after the ``[output]`` settings:
    ``probability`` (a fused list already holds probabilities; another one gets a softmax), then
    ``filter_for_definitions`` over ``kb``, comparing ``no_definition_threshold`` with that score."""
    out = [list(candidates) for candidates in results]
    if not (output.probability or output.filter_for_definitions):
        return out
    if output.probability and not fused:
        out = [as_probabilities(candidates) for candidates in out]
    if output.filter_for_definitions:
        out = [keep_defined(candidates, kb, output.keeps_undefined) for candidates in out]
    return out


def warn_on_scispacy_habits(name: str, settings: Any) -> None:
    """Warn when ``[output] threshold`` is above every score the component can write: positive
    while scores are mean log-probabilities (no ``probability``, no fusion), as scispacy's 0.7 is."""
    threshold = settings.output.threshold
    if threshold is None or threshold <= 0 or settings.output.probability or settings.reranker.enabled:
        return
    logger.warning(
        "The '%s' component's threshold %s is above every score it writes (mean log-probabilities, "
        "at most 0): no span will get an ID. Set [output] probability = true for scores in [0, 1], or "
        "calibrate the threshold (evaluate --calibration; docs/scispacy.md)",
        name,
        threshold,
    )
