"""The ``reranker`` block of the ``genbioel`` component (``genbioel.reranker.v1``,
registered with the other blocks by :mod:`spacy_genbioel.linking.settings`): score fusion over
the generator's and the retrievers' candidates, and the cascade that decides per mention which of
them run (:mod:`.cascade`, the one reader)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from spacy_genbioel.linking.numbers import Bound, bounded, check_numbers

__all__ = ["NO_FUSION", "RerankerSettings"]

#: ``reranker.fusion`` that switches fusion off, a saved pipeline's own fusion.json too (null: the pipeline's own)
NO_FUSION = "none"


@dataclass(frozen=True)
class RerankerSettings:
    """Reranking of the linker's candidates (:mod:`~spacy_genbioel.linking.reranking.fusion`)."""

    #: score fusion weights (a ``fit-fusion`` JSON file); a saved pipeline carries its own as fusion.json,
    #: which null keeps; ``none``: no fusion at all, the generator's own ranking (``--reranker.fusion none``)
    fusion: Optional[str] = None
    #: ``off``: the generator's beam, then the fusion; ``on``: mentions retrieval settles skip the
    #: generator, the rest get forced scores of the retrieved names, or beam search and the fusion when
    #: the fusion was fitted on beam lists (:mod:`.cascade`; needs ``fit-fusion --cascade``)
    cascade: str = "off"
    #: in a cascade fitted on forced lists, where beam search also runs: ``never``, ``weak`` (retrieval
    #: looks weak: below ``beam_threshold``) or ``always`` (never by default: merging a beam's names into
    #: forced lists cost 2 points of recall@1 on NCBI dev, docs/benchmarks.md)
    beam: str = "never"
    #: retrieval-only fused probability from which retrieval settles a mention (None: the fusion file's)
    settle_threshold: Optional[float] = bounded(None, Bound(float, optional=True))
    #: retrieval-only fused probability below which the cascade also runs beam search (None: the fusion file's)
    beam_threshold: Optional[float] = bounded(None, Bound(float, optional=True))
    #: in a cascade fitted with ``fit-fusion --defer``: the probability (of a fusion without the deferred
    #: retrievers) from which a mention is linked before they run (None: the fusion file's; above 1: never)
    early_threshold: Optional[float] = bounded(None, Bound(float, optional=True))
    #: with a fusion: the generator's beam width and list length, as the fusion's fold predictions were made
    #: (None: the fusion file's ``fit-fusion --generator-beams``, else ``decoding.num_beams``); ``decoding.top_k``
    #: fused candidates are written whatever the width
    generator_beams: Optional[int] = bounded(None, Bound(int, 1, optional=True))
    #: normalized mention texts whose retrieved candidates each retriever keeps (least recently used
    #: dropped; 0: none): a text's candidates depend on the text alone, and PubMed repeats mention texts
    #: across abstracts (about 1 KB each)
    retrieval_cache: int = bounded(50000, Bound(int, 0))

    def __post_init__(self) -> None:
        check_numbers(self, "reranker")
        if self.cascade not in ("off", "on"):
            raise ValueError(f"reranker.cascade must be 'off' or 'on', got {self.cascade!r}")
        if self.beam not in ("weak", "never", "always"):
            raise ValueError(f"reranker.beam must be 'weak', 'never' or 'always', got {self.beam!r}")

    @property
    def enabled(self) -> bool:
        return self.fusion not in (None, NO_FUSION)
