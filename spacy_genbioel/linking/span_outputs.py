"""What the component writes on spans: the extension attributes (``kb_id``, ``kb_candidates``,
scispacy's ``kb_ents``, the cascade's ``link_path``) and scispacy's per-concept scores."""

from __future__ import annotations

from typing import Any, Dict, List, Sequence, Tuple

from spacy.tokens import Span

from spacy_genbioel.linking.settings import OutputSettings, written_score
from spacy_genbioel.ty import Candidate

__all__ = ["concept_scores", "register_extensions"]


def register_extensions(output: OutputSettings) -> None:
    """The span extensions ``output`` names (kept when they exist: scispacy registers ``kb_ents`` too)."""
    defaults: List[Any] = [None, None, [], None]  # kb_id, kb_candidates, kb_ents, link_path
    for attr, default in zip((*output.attrs, "link_path"), defaults):
        if not Span.has_extension(attr):
            Span.set_extension(attr, default=default)


def concept_scores(candidates: Sequence[Candidate], limit: int) -> List[Tuple[str, float]]:
    """scispacy's ``kb_ents``: ``(concept_id, score)`` once per concept (its best name's
    score), best first (ties keep the linker's rank), at most ``limit``."""
    best: Dict[str, float] = {}
    for candidate in candidates:
        for cid in candidate.ids:
            best.setdefault(cid, written_score(candidate.score))
    return sorted(best.items(), key=lambda item: -item[1])[:limit]
