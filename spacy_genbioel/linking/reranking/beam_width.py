"""How wide the generator searches: one function decides it for the component.

Three things name a beam width: ``decoding.num_beams`` (the user's), ``reranker.generator_beams``
(the user's, for a fused pipeline) and a fusion file's ``fit.generator_beams`` (``fit-fusion
--generator-beams``: the width its fold predictions were made with). With a fusion, the
generator must search as its fold predictions were made, or the fusion reads lists of
another shape than it was fitted on. :func:`generator_decoding` applies, in order:

1. no fusion: ``decoding`` as configured;
2. ``reranker.generator_beams``, when set;
3. the fusion file's ``generator_beams``, when it records one (a warning when it overrides a
   ``decoding.num_beams`` set away from its default);
4. ``decoding.num_beams``.

``decoding.top_k`` is capped at the width (the fused list still holds ``decoding.top_k``
candidates). It also warns where the fusion will read lists of another length than it was
fitted on, and where ``reranker.beam`` is set but cannot apply: a cascade whose fusion was
fitted on beam lists searches every mention retrieval does not settle.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Optional

from spacy_genbioel.linking.decoding.decoder import DecodingSettings
from spacy_genbioel.linking.numbers import Bound
from spacy_genbioel.linking.reranking.settings import RerankerSettings
from spacy_genbioel.retrieval.rescnn_checks import check_setting

logger = logging.getLogger(__name__)

__all__ = ["generator_decoding"]

_DEFAULT_BEAMS = DecodingSettings().num_beams
_DEFAULT_BEAM_MODE = RerankerSettings().beam


def generator_decoding(
    decoding: DecodingSettings, reranker: RerankerSettings, fusion: Optional[Any], name: str
) -> DecodingSettings:
    """The decoding settings the generator of component ``name`` searches with (module doc: the order);
    ``fusion``: its :class:`~.fusion.FusionModel`, or None."""
    if fusion is None:
        return decoding
    width = reranker.generator_beams
    recorded = _recorded_beams(fusion)
    if width is None and recorded is not None:
        width = recorded
        if decoding.num_beams not in (_DEFAULT_BEAMS, recorded):
            logger.warning(
                "The '%s' component searches %d beams, the width its fusion's fold predictions were made with "
                "(fit-fusion --generator-beams), not decoding.num_beams = %d; set reranker.generator_beams to "
                "choose the width",
                name,
                recorded,
                decoding.num_beams,
            )
    if width is not None and width != decoding.num_beams:
        decoding = dataclasses.replace(decoding, num_beams=width, top_k=min(decoding.top_k, width))
    _warn_on_list_length(decoding, fusion, name)
    _warn_on_beam_mode(reranker, fusion, name)
    return decoding


def _recorded_beams(fusion: Any) -> Optional[int]:
    value = fusion.fit.get("generator_beams")
    if value is None:
        return None
    return int(check_setting("fusion fit.generator_beams", value, Bound(int, 1)))


def _warn_on_list_length(decoding: DecodingSettings, fusion: Any, name: str) -> None:
    width = (fusion.fit.get("generator_width") or 0) if fusion.generator == "beam" else 0
    if width and min(decoding.top_k, fusion.depth) != min(width, fusion.depth):
        logger.warning(
            "The '%s' fusion was fitted on the generator's top %d; it now reads its top %d "
            "(reranker.generator_beams: the beam width its fold predictions were made with)",
            name,
            width,
            decoding.top_k,
        )


def _warn_on_beam_mode(reranker: RerankerSettings, fusion: Any, name: str) -> None:
    if reranker.cascade == "on" and fusion.generator == "beam" and reranker.beam != _DEFAULT_BEAM_MODE:
        logger.warning(
            "The '%s' component's reranker.beam = %r has no effect: its fusion was fitted on beam lists, so "
            "beam search runs for every mention retrieval does not settle (reranker.beam applies to fusions "
            "fitted on forced lists: fit-fusion --generator forced --cascade)",
            name,
            reranker.beam,
        )
