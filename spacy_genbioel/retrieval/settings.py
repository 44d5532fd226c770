"""The settings of the configurable retrievers, one frozen dataclass each: every
setting's default, type and meaning is written here once.

Each dataclass is what spaCy's registry holds under the retriever's versioned
name (:mod:`.registry`): a config block (or ``make_retriever_builder(name,
**settings)``) makes an instance, and calling it with a KB builds the
retriever, importing its module only then (so naming a retriever never loads
torch or scispacy)::

    [components.genbioel.candidates.retriever]
    @misc = "genbioel.dense_retriever.v1"
    device = "cuda"

The retrievers take the same dataclass: ``DenseLinker(kb, model, DenseSettings(cache=False))``,
``ScispacyLinker(kb, ScispacySettings(threshold=0.7))``.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Optional

from spacy_genbioel.kb.base import KnowledgeBase
from spacy_genbioel.ty import Linker

__all__ = ["DenseSettings", "ResCNNSettings", "ScispacySettings"]


def _retriever(module: str, class_name: str) -> Any:
    """``spacy_genbioel.retrieval.<module>.<class_name>``, imported now."""
    return getattr(importlib.import_module(f"spacy_genbioel.retrieval.{module}"), class_name)


@dataclass(frozen=True)
class ScispacySettings:
    """scispacy's candidate generator built in memory on the KB
    (:class:`~spacy_genbioel.retrieval.scispacy.ScispacyLinker`, which says where they depart from scispacy)."""

    #: neighbours retrieved before concepts are canonicalized (scispacy's 30; raised to ``top_k`` when that is larger)
    k: int = 30
    #: concepts with a score above this are kept (scispacy's ``EntityLinker`` uses 0.7)
    threshold: float = 0.0
    #: with ``filter_for_definitions``: the score a concept without a definition needs
    no_definition_threshold: float = 0.95
    #: drop concepts without a definition scoring under ``no_definition_threshold`` (scispacy's default on)
    filter_for_definitions: bool = False
    #: TF-IDF ``min_df`` (scispacy's 10; 1 when that leaves no n-gram)
    min_df: int = 10
    #: HNSW ``M`` (nmslib's 16; scispacy's 100)
    m_parameter: int = 16
    #: HNSW ``efConstruction`` (nmslib's 200; scispacy's 2000)
    ef_construction: int = 200
    #: HNSW ``efSearch`` (scispacy's 200)
    ef_search: int = 200
    #: threads building the index (scispacy's 60)
    index_threads: int = 2
    #: one candidate per name with the concepts whose best name it is (False: one per concept, as scispacy)
    group_by_name: bool = True

    def __call__(self, kb: KnowledgeBase) -> Linker:
        """A :class:`~spacy_genbioel.retrieval.scispacy.ScispacyLinker` on ``kb`` with these settings."""
        return _retriever("scispacy", "ScispacyLinker")(kb, self)


@dataclass(frozen=True)
class DenseSettings:
    """Dense (SapBERT-style) nearest names
    (:class:`~spacy_genbioel.retrieval.dense.DenseLinker`)."""

    #: the encoder directory (default: the installed all-MiniLM-L6-v2, untrained for linking)
    model: Optional[str] = None
    #: ``cls``, ``mean`` or ``auto`` (the directory's own: ``dense_config.json``, sentence-transformers' pooling)
    pooling: str = "auto"
    #: tokens per text (default: the directory's ``dense_config.json``, else 25 as SapBERT)
    max_length: Optional[int] = None
    #: where the encoder runs: ``cpu``, ``cuda``, ``cuda:N``, ``auto``
    device: str = "cpu"
    #: ``fp32``, ``bf16`` or ``auto`` (:func:`~spacy_genbioel.util.autocast_dtype`)
    precision: str = "fp32"
    #: texts encoded per batch
    batch_size: int = 128
    #: read the KB's name matrix from ``cache_dir`` and write it there
    cache: bool = True
    #: where name matrices are cached (default: :func:`~spacy_genbioel.retrieval.dense.default_cache_dir`)
    cache_dir: Optional[str] = None
    #: how the name matrix is stored and cached: ``float16`` or ``float32`` (searched in float32)
    cache_dtype: str = "float16"
    #: ``torch`` (a chunked matrix product) or ``faiss`` (its exact inner-product index)
    index: str = "torch"
    #: ``auto``: on a CPU with AVX512-BF16 or AMX, a bfloat16 pass first and its best names rescored in
    #: float32, proven to give the float32 search's names (about 2x cheaper, no float32 copy of the
    #: matrix); ``fp32``: the float32 search alone
    search: str = "auto"
    #: names retrieved per wanted candidate before concepts are grouped
    oversample: int = 10
    #: query rows x names scored at once (memory of one block)
    max_block: int = 1 << 24
    #: show a bar while encoding (None: from 10,000 texts on, on a terminal)
    progress: Optional[bool] = None

    def __call__(self, kb: KnowledgeBase) -> Linker:
        """A :class:`~spacy_genbioel.retrieval.dense.DenseLinker` on ``kb`` with these settings."""
        return _retriever("dense", "DenseLinker")(kb, self.model, self)


@dataclass(frozen=True)
class ResCNNSettings:
    """The tiny residual-CNN retriever (Lai et al. 2021; :class:`~spacy_genbioel.retrieval.rescnn.ResCNNLinker`)."""

    #: the model directory written by ``train-rescnn`` (required: an untrained network ranks nothing)
    model: Optional[str] = None
    #: where the network runs: ``cpu``, ``cuda``, ``cuda:N``, ``auto``
    device: str = "cpu"
    #: texts encoded per batch
    batch_size: int = 256
    #: ``float32``, or ``int8``: the network's matrix products in int8 on CPU (index builds and mention
    #: encoding about 1.6x cheaper, vectors within about 0.2% in cosine; its own index, keyed apart)
    encoder_dtype: str = "float32"
    #: read the KB's name index from ``index_dir`` and write it there
    cache: bool = True
    #: where name indexes live (the KB's folder keeps it beside the KB; default: the cache's ``rescnn`` folder)
    index_dir: Optional[str] = None
    #: how the name index is stored, memory-mapped and searched: ``float16`` or ``int8`` (a scale per name)
    index_dtype: str = "float16"
    #: ``torch`` (a chunked matrix product) or ``faiss`` (its exact inner-product index, over a float32 copy)
    index: str = "torch"
    #: names retrieved per wanted candidate before concepts are grouped
    oversample: int = 10
    #: names turned to float32 and scored at once; an index of at most this many names is turned to
    #: float32 once and kept (MEDIC's 72k names: 70 MB), a larger one is turned a chunk at a time per search
    chunk_names: int = 131072
    #: BioSyn's hybrid score: the retrieved names are re-ranked by ``cosine + w * TF-IDF cosine`` over
    #: ``1 + w``; ``None``: ``w`` is the ratio the model learned (its ``sparse_weight / scale``), 0: cosine alone
    sparse_weight: Optional[float] = None
    #: query rows x names scored at once (memory of one block)
    max_block: int = 1 << 24
    #: show a bar while encoding (None: from 10,000 texts on, on a terminal)
    progress: Optional[bool] = None

    def __call__(self, kb: KnowledgeBase) -> Linker:
        """A :class:`~spacy_genbioel.retrieval.rescnn.ResCNNLinker` on ``kb`` with these settings."""
        return _retriever("rescnn", "ResCNNLinker")(kb, self.model, self)
