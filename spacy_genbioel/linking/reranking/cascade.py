"""The reranking stage of the component: the fusion after the beam, or the cascade.

Two ways to combine the generator with retrievers, chosen by ``reranker.cascade``:

* ``off`` (:class:`FusionReranker` after beam search): every mention is
  decoded, then the fusion reranks the union of the beam's and the retrievers'
  top candidates. Accurate, and as slow as the beam.
* ``on`` (:class:`CascadeReranker`): let retrieval propose and the generator
  judge, and ask the generator only where retrieval is unsure.

  1. *retrieval*: every fusion retriever gives its top ``depth`` candidates;
     a retrieval-only fusion (the same features, the generator's left out,
     fitted on the same cross-fitted training predictions) gives each mention
     a probability of its best concept. At or above ``settle_threshold``
     (chosen on those predictions for a target precision) the mention is
     linked from retrieval alone: the generator never runs.
  2. *forced*: the others get the generator's forced score
     (:mod:`.forced`) of every retrieved name, one parallel decoder pass, and
     the fusion ranks the union with them.
  3. *beam*: where retrieval looks weak (its probability below
     ``beam_threshold``; or ``reranker.beam = "always"``, or ``"never"``),
     beam search runs too and its names join the forced ones (one scale: the
     same mean log-probability).

  0. *early* (fusions fitted with ``fit-fusion --defer``): costly retrievers
     (MiniLM) wait; a retrieval-only fusion of the others settles the mentions
     it is sure of (``early_threshold``, chosen like ``settle_threshold``), and
     only the rest get every retriever and the steps above.

  Each mention's path (``early``, ``retrieval``, ``forced``, ``beam``; ``none`` when it
  has nothing to link) is written on the span (``span._.link_path``) and
  counted in :attr:`CascadeReranker.stats`.

The generator's lists the cascade's fusion was fitted on decide step 2
(:class:`~.fusion.FusionModel` records it): a fusion fitted on forced lists
(``evaluate --decoding.search forced``; ``fit-fusion --generator forced
--cascade``) judges by forced scores, as above; one fitted on beam lists
(``fit-fusion --cascade``, today's fusion with the retrieval-only weights) sends
every mention retrieval does not settle to beam search and that fusion: the
fused pipeline's answer, paid only where retrieval is unsure (on NCBI dev the
trained generator's beam proposes concepts retrieval misses, which forced
scoring of retrieved names cannot: docs/benchmarks.md).
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from spacy_genbioel.linking.decoding.forced import merge_lists, rank_by_forced
from spacy_genbioel.linking.inputs.builder import has_linkable_text
from spacy_genbioel.linking.reranking.fusion import GENERATOR, FusionModel, FusionReranker
from spacy_genbioel.linking.reranking.settings import RerankerSettings
from spacy_genbioel.ty import Candidate, Linker, LinkPaths, Mention, Reranker

logger = logging.getLogger(__name__)

__all__ = ["PATHS", "CascadeReranker", "LinkPaths", "settle_model", "link_with_paths"]

#: the ways a mention can be linked, cheapest first
PATHS = ("none", "early", "retrieval", "forced", "beam")


class CascadeError(ValueError):
    """A cascade that cannot run with this fusion (names the file and what to do)."""


def _weighted(model: FusionModel, weights: Any, what: str) -> FusionModel:
    if not isinstance(weights, dict) or sorted(weights) != sorted(model.features):
        raise CascadeError(f"the fusion's {what} must give a weight for each of its features")
    try:
        values = [float(weights[f]) for f in model.features]
    except (TypeError, ValueError):
        raise CascadeError(f"the fusion's {what} must be numbers") from None
    return FusionModel(
        list(model.sources), values, depth=model.depth, retrievers=model.retrievers, list_depth=model.list_depth
    )


def settle_model(model: FusionModel) -> FusionModel:
    """The retrieval-only fusion stored in ``model.cascade`` (the generator's weights are 0); a
    retrieval-only ``model`` (``generator = "none"``) is its own."""
    if model.retrieval_only and not model.cascade.get("settle_weights"):
        return model
    if not isinstance(model.cascade.get("settle_weights"), dict):
        raise CascadeError(
            "the fusion was not fitted for the cascade (fit-fusion --cascade): no retrieval-only weights"
        )
    return _weighted(model, model.cascade["settle_weights"], "cascade's retrieval-only weights")


def early_model(model: FusionModel) -> Optional[Tuple[FusionModel, List[str], Any]]:
    """The early step stored in ``model.cascade["early"]`` (``fit-fusion --defer``): the fusion of the
    retrievers that run first, the deferred retrievers, and the fitted threshold; None without one."""
    early = model.cascade.get("early")
    if early is None:
        return None
    deferred = early.get("defer") if isinstance(early, dict) else None
    if not isinstance(deferred, list) or not deferred or not set(deferred) < set(model.retriever_sources):
        raise CascadeError(
            f"the cascade's early step must defer some, not all, of the retrievers {model.retriever_sources}; "
            f"got {deferred!r}"
        )
    return _weighted(model, early.get("weights"), "early step's weights"), list(deferred), early.get("threshold")


def _threshold(setting: Optional[float], fitted: Any, name: str) -> float:
    if setting is not None:
        return float(setting)
    if fitted is None:  # the fit found no threshold meeting its target: the step never triggers
        return float("inf") if name == "settle" else float("-inf")
    if isinstance(fitted, bool) or not isinstance(fitted, (int, float)):
        raise CascadeError(f"the fusion's {name}_threshold must be a number, got {fitted!r}")
    return float(fitted)


class CascadeReranker:
    """Settle with retrieval, judge the rest with the generator's forced scores, search where needed."""

    def __init__(
        self, model: FusionModel, kb: Any, retrievers: Mapping[str, Any], linker: Any, settings: RerankerSettings
    ) -> None:
        """``linker``: the generator; None with a retrieval-only ``model`` (a pipeline with no model)."""
        if linker is None and not model.retrieval_only:
            raise CascadeError(
                "a fusion fitted with a generator needs one: give the component a model, or a "
                "retrieval-only fusion (fit-fusion without genbioel predictions)"
            )
        self.fusion = FusionReranker(model, kb, retrievers, settings.retrieval_cache)
        self.settle = settle_model(model)
        self.linker = linker
        self.settings = settings
        # retrieval only (no generator to ask): retrieval settles every mention it finds candidates for
        self.settle_threshold = (
            float("-inf")
            if model.retrieval_only
            else _threshold(settings.settle_threshold, model.cascade.get("settle_threshold"), "settle")
        )
        self.beam_threshold = _threshold(settings.beam_threshold, model.cascade.get("beam_threshold"), "beam")
        early = early_model(model)
        self.early: Optional[FusionModel] = None
        self.deferred: List[str] = []
        self.early_threshold = float("inf")
        if early is not None:
            self.early, self.deferred, fitted = early
            self.early_threshold = _threshold(settings.early_threshold, fitted, "settle")
        #: mentions per path since creation (or the last ``stats.clear()``)
        self.stats: Counter = Counter()

    @property
    def model(self) -> FusionModel:
        return self.fusion.model

    @property
    def retrievers(self) -> Dict[str, Any]:
        return self.fusion.retrievers

    def _retrieve(
        self, mentions: Sequence[Mention], positions: Sequence[int], sources: Sequence[str]
    ) -> List[Dict[str, List[Candidate]]]:
        """Each of ``sources``' top ``depth`` candidates for the mentions at ``positions``."""
        if not positions:
            return []
        found = {s: self.fusion.retrieve(s, [mentions[i] for i in positions]) for s in sources}
        return [{s: found[s][n] for s in sources} for n in range(len(positions))]

    def _needs_beam(self, probability: float) -> bool:
        if self.model.generator == "beam":  # fitted on beam lists: the generator judges by searching
            return True
        mode = self.settings.beam
        return mode == "always" or (mode == "weak" and probability < self.beam_threshold)

    def link_paths(self, linker: Linker, mentions: Sequence[Mention], top_k: int) -> LinkPaths:
        """:meth:`link` (the cascade asks its own generator: ``linker`` is the component's, the same one)."""
        return self.link(mentions, top_k)

    def link(self, mentions: Sequence[Mention], top_k: int) -> LinkPaths:
        kb, model = self.fusion.kb, self.model
        priors = self.fusion._priors
        results: List[List[Candidate]] = [[] for _ in mentions]
        paths = ["none"] * len(mentions)
        todo = [i for i, m in enumerate(mentions) if has_linkable_text(m.text, kb.normalize)]
        lists = self._retrieve(mentions, todo, [s for s in model.retriever_sources if s not in self.deferred])
        rest = list(range(len(todo)))
        if self.early is not None:  # the mentions the first retrievers settle; the deferred ones run for the rest
            rest = []
            left_out: Dict[str, List[Candidate]] = {s: [] for s in (GENERATOR, *self.deferred)}
            early_ranks: Dict[str, List[Candidate]] = {}  # a text's lists are the same wherever it occurs: rank it once
            for pos, i in enumerate(todo):
                text = mentions[i].text
                if text not in early_ranks:
                    early_ranks[text] = self.early.rank(text, {**left_out, **lists[pos]}, kb, top_k, priors)
                settled = early_ranks[text]
                if settled and settled[0].score >= self.early_threshold:
                    results[i], paths[i] = list(settled), "early"
                else:
                    rest.append(pos)
            late = self._retrieve(mentions, [todo[pos] for pos in rest], self.deferred)
            for pos, found in zip(rest, late):  # in the fusion's order of sources, as without the early step
                lists[pos] = {s: {**lists[pos], **found}[s] for s in model.retriever_sources}
        judge: List[int] = []
        beam: List[int] = []
        settle_ranks: Dict[str, List[Candidate]] = {}
        for pos in rest:
            i = todo[pos]
            text = mentions[i].text
            if text not in settle_ranks:
                settle_ranks[text] = self.settle.rank(text, {GENERATOR: [], **lists[pos]}, kb, top_k, priors)
            settled = settle_ranks[text]
            probability = settled[0].score if settled else 0.0
            if settled and probability >= self.settle_threshold:
                results[i], paths[i] = list(settled), "retrieval"
                continue
            if self.linker is None:  # retrieval only, and it found nothing: no candidates
                continue
            judge.append(pos)
            if self._needs_beam(probability):
                beam.append(pos)
        if judge:
            generated: Dict[int, List[Candidate]] = {pos: [] for pos in judge}
            if model.generator == "forced":
                proposals = [[c for found in lists[pos].values() for c in found] for pos in judge]
                generated.update(
                    zip(judge, rank_by_forced(self.linker, [mentions[todo[pos]] for pos in judge], proposals))
                )
            if beam:
                beams = self.linker.link([mentions[todo[pos]] for pos in beam], self.linker.decoding.top_k)
                for pos, found in zip(beam, beams):
                    generated[pos] = merge_lists(found, generated[pos])
            beam_set = set(beam)
            for pos in judge:
                i = todo[pos]
                results[i] = model.rank(mentions[i].text, {GENERATOR: generated[pos], **lists[pos]}, kb, top_k, priors)
                paths[i] = "beam" if pos in beam_set else "forced"
        self.stats.update(paths)
        return results, paths


def link_with_paths(linker: Linker, reranker: Optional[Reranker], mentions: Sequence[Mention], top_k: int) -> LinkPaths:
    """The component's linking: the reranker's (the cascade, or the generator then the fusion), else the
    generator's alone; with each mention's path (``beam``, or ``none`` for a mention left without candidates)."""
    if reranker is not None:
        return reranker.link_paths(linker, mentions, top_k)
    results = linker.link(mentions, top_k)
    return results, ["beam" if found else "none" for found in results]


def make_reranker(
    model: Optional[FusionModel], kb: Any, linker: Any, settings: RerankerSettings, retriever_factory: Any
) -> Optional[Reranker]:
    """The component's reranking stage for ``settings``: None (no fusion), a :class:`FusionReranker`
    or a :class:`CascadeReranker`; ``retriever_factory(source, model_dir)`` builds a retriever."""
    if model is None:
        if settings.cascade == "on":
            raise CascadeError(
                "reranker.cascade = 'on' needs a fusion fitted for it (reranker.fusion; fit-fusion --cascade)"
            )
        return None
    retrievers = {
        source: retriever_factory(source, model.retrievers.get(source, {}).get("model"))
        for source in model.retriever_sources
    }
    if settings.cascade == "on":
        return CascadeReranker(model, kb, retrievers, linker, settings)
    return FusionReranker(model, kb, retrievers, settings.retrieval_cache)
