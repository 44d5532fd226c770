"""The one registry of retrievers, shared by ``evaluate --linker NAME`` and by the
generative linker's candidate generation (:mod:`spacy_genbioel.linking.decoding.candidates`).

Retrievers live in spaCy's ``registry.misc`` under versioned names, so a
saved pipeline keeps the retriever it was saved with:

* ``genbioel.exact_retriever.v1`` -- :class:`~spacy_genbioel.retrieval.exact.ExactLinker`
* ``genbioel.tfidf_retriever.v1`` -- :class:`~spacy_genbioel.retrieval.tfidf.TfidfLinker`
* ``genbioel.scispacy_retriever.v1`` -- :class:`~spacy_genbioel.retrieval.scispacy.ScispacyLinker`
* ``genbioel.dense_retriever.v1`` -- :class:`~spacy_genbioel.retrieval.dense.DenseLinker`
* ``genbioel.rescnn_retriever.v1`` -- :class:`~spacy_genbioel.retrieval.rescnn.ResCNNLinker`

A registered function takes the retriever's settings and returns a builder
``Callable[[KnowledgeBase], Linker]`` (the style of spaCy's
``spacy.CandidateGenerator.v1``): settings come from a config block, the KB
from the component that owns it. A retriever with many settings registers
the frozen dataclass of its settings instead (:mod:`.settings`): an instance
is the builder, so a setting is defined once::

    [components.genbioel.candidates.retriever]
    @misc = "genbioel.tfidf_retriever.v1"
    ngram_range = [3, 3]

:func:`get_retriever` builds one by name: the short names of the command line
(``exact``, ``tfidf``, ``scispacy``, ``dense`` and its alias ``sapbert``) or any
registered name ending in ``_retriever.vN``. Builders import their retriever's
module when called, so naming a retriever never loads torch or scispacy.

Another package adds a retriever by registering it under such a name and
advertising it through spaCy's ``spacy_misc`` entry points, so that it is found
without being imported first::

    # mypkg/retrieval.py
    from spacy.util import registry

    @registry.misc("mypkg.bm25_retriever.v1")
    def make_bm25_retriever(k1: float = 1.2):
        def build(kb):
            return Bm25Linker(kb, k1=k1)  # any Linker: link(mentions, top_k)
        return build

    # setup.cfg
    [options.entry_points]
    spacy_misc =
        mypkg.bm25_retriever.v1 = mypkg.retrieval:make_bm25_retriever

Then ``evaluate --linker mypkg.bm25_retriever.v1`` and the component setting
``candidates = "mypkg.bm25_retriever.v1"`` both use it.
"""

from __future__ import annotations

import importlib
import inspect
import re
from typing import Any, Callable, Dict, List, Optional, Sequence, Union

from spacy.util import registry

from spacy_genbioel.kb.base import KnowledgeBase
from spacy_genbioel.retrieval.settings import DenseSettings, ResCNNSettings, ScispacySettings
from spacy_genbioel.ty import Linker

__all__ = [
    "RetrieverBuilder",
    "SHORT_NAMES",
    "build_later",
    "get_retriever",
    "known_retrievers",
    "make_retriever_builder",
    "resolve_retriever",
    "retriever_takes",
]

#: What a registered retriever function returns.
RetrieverBuilder = Callable[[KnowledgeBase], Linker]

#: Command-line names -> registered names.
SHORT_NAMES: Dict[str, str] = {
    "exact": "genbioel.exact_retriever.v1",
    "tfidf": "genbioel.tfidf_retriever.v1",
    "scispacy": "genbioel.scispacy_retriever.v1",
    "dense": "genbioel.dense_retriever.v1",
    "sapbert": "genbioel.dense_retriever.v1",
    "rescnn": "genbioel.rescnn_retriever.v1",
}

# the naming rule that tells retrievers apart from the rest of registry.misc
_RETRIEVER_NAME = re.compile(r"^\S+_retriever\.v\d+$")


def build_later(module: str, class_name: str, **settings: Any) -> RetrieverBuilder:
    """A builder of ``spacy_genbioel.retrieval.<module>.<class_name>(kb, **settings)``
    that imports the module only when called. The registered functions below
    pass their parameters (``locals()``) as ``settings``."""

    def build(kb: KnowledgeBase) -> Linker:
        return getattr(importlib.import_module(f"spacy_genbioel.retrieval.{module}"), class_name)(kb, **settings)

    return build


@registry.misc("genbioel.exact_retriever.v1")
def make_exact_retriever() -> RetrieverBuilder:
    """Exact match of the normalized mention on the KB's name index."""
    return build_later("exact", "ExactLinker")


@registry.misc("genbioel.tfidf_retriever.v1")
def make_tfidf_retriever(
    ngram_range: Sequence[int] = (3, 3),
    analyzer: str = "char_wb",
    min_df: Union[int, float] = 1,
    max_block: int = 1 << 24,
    chunk_size: Optional[int] = None,
    cache: Union[bool, str] = True,
) -> RetrieverBuilder:
    """Nearest KB names by TF-IDF cosine (character 3-grams by default); a large KB's fitted index is
    cached (``cache``: true, false or a folder; :class:`~spacy_genbioel.retrieval.tfidf.TfidfLinker`)."""
    return build_later("tfidf", "TfidfLinker", **locals())


#: scispacy's candidate generator built in memory on the KB (its settings: :class:`.settings.ScispacySettings`)
make_scispacy_retriever = registry.misc("genbioel.scispacy_retriever.v1")(ScispacySettings)

#: Dense (SapBERT-style) nearest names (its settings: :class:`.settings.DenseSettings`)
make_dense_retriever = registry.misc("genbioel.dense_retriever.v1")(DenseSettings)

#: The tiny residual CNN of Lai et al. 2021 (its settings: :class:`.settings.ResCNNSettings`)
make_rescnn_retriever = registry.misc("genbioel.rescnn_retriever.v1")(ResCNNSettings)


def known_retrievers() -> List[str]:
    """The short names and every registered retriever name (entry points included)."""
    registered = [name for name in registry.misc.get_all() if _RETRIEVER_NAME.match(name)]
    return sorted({*SHORT_NAMES, *registered})


def resolve_retriever(name: str) -> str:
    """The registered name behind ``name`` (a short name, any case, or a registered name)."""
    short = SHORT_NAMES.get(name.lower())
    if short is not None:
        return short
    if _RETRIEVER_NAME.match(name) and name in registry.misc:
        return name
    raise ValueError(f"Unknown linker {name!r}; known: {', '.join(known_retrievers())}")


def retriever_takes(name: str, setting: str) -> bool:
    """Whether the retriever ``name`` has the setting ``setting`` (e.g. ``model``)."""
    parameters = inspect.signature(registry.misc.get(resolve_retriever(name))).parameters
    return setting in parameters or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())


def make_retriever_builder(name: str, **settings: Any) -> RetrieverBuilder:
    """The builder of retriever ``name`` with ``settings``; nothing is built yet."""
    return registry.misc.get(resolve_retriever(name))(**settings)


def get_retriever(name: str, kb: KnowledgeBase, **settings: Any) -> Linker:
    """Build retriever ``name`` (``exact``, ``tfidf``, ``scispacy``, ``dense``/``sapbert``
    or a registered name) on ``kb`` with ``settings`` (e.g. ``model=DIR`` for ``dense``)."""
    return make_retriever_builder(name, **settings)(kb)
