"""Non-generative peer linkers: exact match, TF-IDF nearest names, scispacy.

All peers follow the :class:`~spacy_genbioel.ty.Linker` protocol and work
on the same :class:`~spacy_genbioel.kb.base.KnowledgeBase` with the same
normalization as the generative linker: mention texts are normalized with
``kb.normalize`` and every returned :class:`Candidate` carries a KB name
(``kb.names``) and concept IDs that name maps to in the KB. That makes the
peers directly comparable with GenBioEL under the same recall@k rule.

* :class:`ExactLinker` -- the normalized mention is looked up in the KB's
  name index (score 1.0), no candidates otherwise.
* :class:`TfidfLinker` -- scikit-learn ``TfidfVectorizer`` (character 3-grams
  within word boundaries by default) fit on the KB names; the nearest names by
  exact cosine similarity (chunked sparse matrix products, ``argpartition``).
* :class:`ScispacyLinker` -- scispacy's ``CandidateGenerator`` (TF-IDF + nmslib
  HNSW approximate nearest neighbours) built in memory on our KB; concepts
  ranked the way scispacy's ``EntityLinker`` ranks them.

Use :func:`get_linker` to build one by name (``exact``, ``tfidf``, ``scispacy``;
``dense``/``sapbert`` build the dense retriever of :mod:`~spacy_genbioel.retrieval.dense`).
"""
from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import scipy.sparse as sp

from spacy_genbioel.kb.base import KnowledgeBase
from spacy_genbioel.ty import Candidate, Mention

logger = logging.getLogger(__name__)

__all__ = [
    "ExactLinker",
    "TfidfLinker",
    "ScispacyLinker",
    "get_linker",
    "LINKERS",
    "LAZY_LINKERS",
    "kb_to_scispacy_entities",
    "write_scispacy_jsonl",
]

MentionLike = Union[Mention, str]


def _mention_text(mention: MentionLike) -> str:
    return mention if isinstance(mention, str) else mention.text


class ExactLinker:
    """Exact dictionary match on normalized names.

    The normalized mention is looked up in ``kb``'s name index; a hit gives one
    candidate (the name, all the concept IDs it maps to, score 1.0), a miss
    gives no candidates.
    """

    name = "exact"

    def __init__(self, kb: KnowledgeBase) -> None:
        self.kb = kb

    def link(self, mentions: Sequence[MentionLike], top_k: int = 5) -> List[List[Candidate]]:
        results: List[List[Candidate]] = []
        for mention in mentions:
            key = self.kb.normalize(_mention_text(mention))
            idx = self.kb.name_index(key)
            if idx is None or top_k <= 0:
                results.append([])
            else:
                results.append([Candidate(tuple(self.kb.ids_for_name_index(idx)), self.kb.names[idx], 1.0)])
        return results


class TfidfLinker:
    """Nearest KB names by TF-IDF cosine similarity.

    A ``TfidfVectorizer`` is fit on the KB's normalized names (``kb.names``);
    mentions are normalized the same way and scored against every name with a
    sparse matrix product (no ``sparse_dot_topn``), ``chunk_size`` mentions at a
    time so that a score block holds at most ``max_block`` entries (16M, i.e.
    about 130 MB of CSR data in the worst, fully dense case). The top ``top_k``
    names per mention come from ``np.argpartition`` over that row's non-zero
    scores and are sorted by score (ties: KB name order). A name equal to the normalized
    mention is always ranked first. Names with cosine 0 are never returned,
    so a mention sharing no n-gram with the KB gets no candidates.

    ``similarity`` scores mentions against arbitrary name lists with the same
    vectorizer (used for the "mention vs gold names" similarity bins).
    """

    name = "tfidf"

    def __init__(
        self,
        kb: KnowledgeBase,
        ngram_range: Tuple[int, int] = (3, 3),
        analyzer: str = "char_wb",
        *,
        min_df: Union[int, float] = 1,
        max_block: int = 1 << 24,
        chunk_size: Optional[int] = None,
    ) -> None:
        from sklearn.feature_extraction.text import TfidfVectorizer

        self.kb = kb
        self.vectorizer = TfidfVectorizer(
            analyzer=analyzer,
            ngram_range=tuple(ngram_range),
            min_df=min_df,
            lowercase=False,  # names and mentions are normalized by the KB
            dtype=np.float32,
        )
        names = kb.names
        if names:
            # (n_names, vocab), rows L2-normalized by the vectorizer
            self._name_vectors = self.vectorizer.fit_transform(names).tocsr()
            # (vocab, n_names) CSR: X @ names_t is a CSR x CSR product
            self._names_t = self._name_vectors.T.tocsr()
        else:
            self._name_vectors = None
            self._names_t = None
        self.max_block = max(1, int(max_block))
        self.chunk_size = chunk_size
        logger.debug("TfidfLinker: %d names, vocabulary %d", len(names), len(getattr(self.vectorizer, "vocabulary_", {}) or {}))

    # -- vectors ------------------------------------------------------------
    def transform(self, texts: Sequence[str], normalize: bool = True) -> sp.csr_matrix:
        """TF-IDF vectors (rows L2-normalized) of ``texts``, normalized with the KB first."""
        if self._name_vectors is None:
            raise ValueError("TfidfLinker: the knowledge base has no names")
        if normalize:
            texts = [self.kb.normalize(t) for t in texts]
        return self.vectorizer.transform(list(texts)).tocsr()

    def _chunk(self) -> int:
        if self.chunk_size:
            return max(1, int(self.chunk_size))
        return max(1, self.max_block // max(1, len(self.kb.names)))

    def scores(self, mention_texts: Sequence[str]) -> np.ndarray:
        """Dense (n_mentions, n_names) cosine scores; for small inputs and tests."""
        vectors = self.transform(mention_texts)
        return np.asarray((vectors @ self._names_t).todense(), dtype=np.float32)

    # -- linking ------------------------------------------------------------
    def link(self, mentions: Sequence[MentionLike], top_k: int = 5) -> List[List[Candidate]]:
        n = len(mentions)
        if n == 0:
            return []
        if top_k <= 0 or self._names_t is None:
            return [[] for _ in range(n)]
        kb = self.kb
        names = kb.names
        n_names = len(names)
        k = min(top_k, n_names)
        texts = [kb.normalize(_mention_text(m)) for m in mentions]
        exact = [kb.name_index(t) for t in texts]
        vectors = self.vectorizer.transform(texts).tocsr()
        results: List[List[Candidate]] = []
        step = self._chunk()
        for start in range(0, n, step):
            # sparse (chunk, n_names) cosine block; top-k on each row's non-zeros
            block = (vectors[start : start + step] @ self._names_t).tocsr()
            indptr, indices, data = block.indptr, block.indices, block.data
            for row in range(block.shape[0]):
                lo, hi = indptr[row], indptr[row + 1]
                row_idx = indices[lo:hi]
                row_scores = data[lo:hi]
                if hi - lo > k:
                    part = np.argpartition(row_scores, -k)[-k:]
                    row_idx, row_scores = row_idx[part], row_scores[part]
                # score descending, then KB name order
                order = np.lexsort((row_idx, -row_scores))
                ranked = [(int(row_idx[j]), float(row_scores[j])) for j in order if row_scores[j] > 0.0]
                exact_idx = exact[start + row]
                if exact_idx is not None:
                    ranked = [(exact_idx, 1.0)] + [(i, s) for i, s in ranked if i != exact_idx]
                    ranked = ranked[:k]
                results.append(
                    [Candidate(tuple(kb.ids_for_name_index(i)), names[i], min(s, 1.0)) for i, s in ranked]
                )
        return results

    def similarity(
        self,
        mention_texts: Sequence[str],
        names: Sequence[Union[str, Sequence[str]]],
    ) -> np.ndarray:
        """Max cosine between each mention and its own names.

        ``names`` runs parallel to ``mention_texts``; each item is a name or a
        list of names (e.g. all KB names of the gold concepts). Both sides are
        normalized with the KB's normalizer and embedded with the vectorizer
        fit on the KB names. A mention with no names gets ``nan``.
        """
        if len(mention_texts) != len(names):
            raise ValueError(f"similarity: {len(mention_texts)} mentions but {len(names)} name lists")
        out = np.full(len(mention_texts), np.nan, dtype=np.float64)
        if not len(mention_texts):
            return out
        flat: List[str] = []
        owner: List[int] = []
        for i, item in enumerate(names):
            group = [item] if isinstance(item, str) else list(item)
            flat.extend(group)
            owner.extend([i] * len(group))
        if not flat:
            return out
        mention_vectors = self.transform(mention_texts)
        name_vectors = self.transform(flat)
        owner_arr = np.asarray(owner)
        # row-wise dot products of (mention of owner) and name
        sims = np.asarray(mention_vectors[owner_arr].multiply(name_vectors).sum(axis=1)).ravel()
        sims = np.clip(sims, 0.0, 1.0)
        result = np.full(len(mention_texts), -np.inf)
        np.maximum.at(result, owner_arr, sims)
        has = np.isfinite(result)
        out[has] = result[has]
        return out


# -- scispacy ---------------------------------------------------------------

def kb_to_scispacy_entities(kb: KnowledgeBase) -> List[Any]:
    """Our KB as scispacy ``Entity`` records over the *normalized* names.

    ``canonical_name`` is the concept's first normalized name, ``aliases`` the
    rest; concepts whose names all normalize to nothing are left out (scispacy
    needs a canonical name, and they could never be predicted anyway).
    """
    from scispacy.linking_utils import Entity

    entities = []
    for concept in kb:
        names = kb.names_of(concept.id)
        if not names:
            continue
        entities.append(
            Entity(
                concept_id=concept.id,
                canonical_name=names[0],
                aliases=list(names[1:]),
                types=list(concept.types),
                definition=concept.definition,
            )
        )
    return entities


def write_scispacy_jsonl(kb: KnowledgeBase, path: Union[str, Path]) -> Path:
    """Write the KB in scispacy's JSONL KB format
    (``{concept_id, canonical_name, aliases, types, definition}``), normalized names."""
    path = Path(path)
    with path.open("w", encoding="utf8") as out:
        for entity in kb_to_scispacy_entities(kb):
            out.write(json.dumps(entity._asdict(), ensure_ascii=False) + "\n")
    return path


class ScispacyLinker:
    """scispacy's ``CandidateGenerator`` built on our KB, in memory.

    Construction follows ``scispacy.candidate_generation.create_tfidf_ann_index``
    (scispacy 0.6): a ``TfidfVectorizer(analyzer="char_wb", ngram_range=(3, 3),
    min_df=min_df, dtype=float32)`` fit on the KB aliases, aliases with an
    all-zero vector dropped, and an nmslib HNSW index over the sparse vectors
    (``space="cosinesimil_sparse"``). ``create_tfidf_ann_index`` itself is *not*
    called: in scispacy 0.6 it raises ``RuntimeError`` unless scipy < 1.11
    (it checks ``scispacy.util.scipy_supports_sparse_float16`` even when nothing
    is saved), and scipy 1.17 is installed here. The replication builds the
    same vectorizer and index directly with nmslib and keeps them in memory;
    they are then handed to scispacy's own ``CandidateGenerator``, so candidate
    generation (the k-NN query, the alias -> concept canonicalization) is
    scispacy's code.

    Differences from scispacy's defaults, all configurable:

    * The scispacy KB (``scispacy.linking_utils.KnowledgeBase``) is built from
      our concepts with their *normalized* names as aliases (the same
      normalization as every other linker), from an in-memory list of
      ``Entity`` records rather than a JSONL file (``write_scispacy_jsonl``
      writes that file if wanted). Mention texts are normalized the same way.
    * ``min_df`` defaults to scispacy's 10, but falls back to 1 (with a
      warning) when that leaves no n-gram, as on tiny KBs.
    * HNSW build parameters default to nmslib's own ``M=16,
      efConstruction=200`` rather than scispacy's ``M=100, efConstruction=2000``
      (``SCISPACY_INDEX_PARAMS``; pass ``m_parameter``/``ef_construction`` to
      use them): scispacy's values took over 5 minutes for MEDIC's 72k names
      on 2 cores, nmslib's about 30 s. ``index_threads`` defaults to 2
      (scispacy uses 60); ``ef_search=200`` as in scispacy.
    * Ranking is ``EntityLinker``'s: for each candidate concept, the score is
      the max similarity over its retrieved aliases; concepts with score
      ``> threshold`` are sorted by score. ``threshold`` defaults to 0.0 (not
      scispacy's 0.7) so that recall@k sees every retrieved concept, and the
      definition filter (``filter_for_definitions``, scispacy default on) is
      off by default because most of our KBs have no definitions.
    * ``k`` (neighbours retrieved before canonicalization) defaults to
      scispacy's 30 and is raised to ``top_k`` when that is larger.

    With ``group_by_name=False`` each returned :class:`Candidate` is one
    concept, exactly as scispacy ranks them: ``ids=(concept_id,)``, ``name``
    the alias with the best similarity, ``score`` that similarity. By default
    (``group_by_name=True``) concepts whose best alias is the same name are
    merged into one candidate (``ids`` in scispacy's order), matching the
    :class:`Candidate` contract of the other linkers (a name and the concepts
    it stands for), so ``top_k`` counts names for every peer alike. This
    matters when concepts share all their names (MEDIC's MeSH and OMIM IDs
    of one disease): per concept, only one of them can be ranked first.
    """

    SCISPACY_INDEX_PARAMS = {"M": 100, "efConstruction": 2000, "indexThreadQty": 60, "post": 0}

    name = "scispacy"

    def __init__(
        self,
        kb: KnowledgeBase,
        *,
        k: int = 30,
        threshold: float = 0.0,
        no_definition_threshold: float = 0.95,
        filter_for_definitions: bool = False,
        min_df: int = 10,
        m_parameter: int = 16,
        ef_construction: int = 200,
        ef_search: int = 200,
        index_threads: int = 2,
        group_by_name: bool = True,
    ) -> None:
        import nmslib
        from scispacy.candidate_generation import CandidateGenerator
        from scispacy.linking_utils import KnowledgeBase as ScispacyKB
        from sklearn.feature_extraction.text import TfidfVectorizer

        self.kb = kb
        self.k = int(k)
        self.threshold = float(threshold)
        self.no_definition_threshold = float(no_definition_threshold)
        self.filter_for_definitions = bool(filter_for_definitions)
        self.group_by_name = bool(group_by_name)

        entities = kb_to_scispacy_entities(kb)
        if not entities:
            raise ValueError("ScispacyLinker: the knowledge base has no names")
        self.scispacy_kb = ScispacyKB(entities)
        aliases = list(self.scispacy_kb.alias_to_cuis.keys())

        def fit(df: int):
            vectorizer = TfidfVectorizer(analyzer="char_wb", ngram_range=(3, 3), min_df=df, dtype=np.float32)
            return vectorizer, vectorizer.fit_transform(aliases)

        try:
            vectorizer, vectors = fit(min_df)
        except ValueError:
            if min_df == 1:
                raise
            logger.warning(
                "ScispacyLinker: min_df=%s leaves no character 3-gram on %d aliases; using min_df=1",
                min_df,
                len(aliases),
            )
            vectorizer, vectors = fit(1)
        vectors = vectors.tocsr()
        keep = np.asarray(vectors.sum(axis=1)).ravel() != 0
        n_dropped = int((~keep).sum())
        if n_dropped:
            # scispacy drops them too (nmslib cannot index all-zero vectors)
            level = logging.WARNING if n_dropped > 0.01 * len(aliases) else logging.INFO
            logger.log(level, "ScispacyLinker: dropping %d/%d aliases with an empty TF-IDF vector", n_dropped, len(aliases))
        aliases = [a for a, flag in zip(aliases, keep) if flag]
        vectors = vectors[keep]
        if not aliases:
            raise ValueError("ScispacyLinker: no alias has a non-empty TF-IDF vector")

        index = nmslib.init(method="hnsw", space="cosinesimil_sparse", data_type=nmslib.DataType.SPARSE_VECTOR)
        index.addDataPointBatch(vectors)
        index.createIndex(
            {"M": int(m_parameter), "indexThreadQty": int(index_threads), "efConstruction": int(ef_construction), "post": 0},
            print_progress=False,
        )
        index.setQueryTimeParams({"efSearch": int(ef_search)})
        self.aliases = aliases
        self.vectorizer = vectorizer
        self.ann_index = index
        self.candidate_generator = CandidateGenerator(
            ann_index=index,
            tfidf_vectorizer=vectorizer,
            ann_concept_aliases_list=aliases,
            kb=self.scispacy_kb,
            verbose=False,
        )
        logger.debug("ScispacyLinker: %d aliases indexed, %d concepts", len(aliases), len(entities))

    def _kb_order(self, alias: str, ids: List[str]) -> List[str]:
        rank = {cid: i for i, cid in enumerate(self.kb.ids_for_name(alias))}
        return sorted(ids, key=lambda cid: rank.get(cid, len(rank)))

    def link(self, mentions: Sequence[MentionLike], top_k: int = 5) -> List[List[Candidate]]:
        n = len(mentions)
        if n == 0:
            return []
        if top_k <= 0:
            return [[] for _ in range(n)]
        texts = [self.kb.normalize(_mention_text(m)) for m in mentions]
        k = min(max(self.k, top_k), len(self.aliases))
        batch = self.candidate_generator(texts, k)
        results: List[List[Candidate]] = []
        for candidates in batch:
            predicted: List[Tuple[str, str, float]] = []
            for cand in candidates:
                best = int(np.argmax(cand.similarities))
                score = float(cand.similarities[best])
                if (
                    self.filter_for_definitions
                    and self.scispacy_kb.cui_to_entity[cand.concept_id].definition is None
                    and score < self.no_definition_threshold
                ):
                    continue
                if score > self.threshold:
                    predicted.append((cand.concept_id, cand.aliases[best], score))
            # scispacy: candidates come sorted by concept id; stable sort by score
            predicted.sort(key=lambda x: x[2], reverse=True)
            if self.group_by_name:
                grouped: Dict[str, List[Any]] = {}
                for cid, alias, score in predicted:
                    entry = grouped.setdefault(alias, [[], score])
                    entry[0].append(cid)
                # concepts of a shared name in the KB's order (priors first), not scispacy's ID order
                ranked = [Candidate(tuple(self._kb_order(alias, ids)), alias, min(score, 1.0))
                          for alias, (ids, score) in grouped.items()]
            else:
                ranked = [Candidate((cid,), alias, min(score, 1.0)) for cid, alias, score in predicted]
            results.append(ranked[:top_k])
        return results


LINKERS: Dict[str, Any] = {
    "exact": ExactLinker,
    "tfidf": TfidfLinker,
    "scispacy": ScispacyLinker,
}
# peers that need torch and transformers, imported only when asked for
LAZY_LINKERS: Dict[str, str] = {
    "dense": "spacy_genbioel.retrieval.dense:DenseLinker",
    "sapbert": "spacy_genbioel.retrieval.dense:DenseLinker",
}


def get_linker(name: str, kb: KnowledgeBase, **kwargs: Any):
    """Build a peer linker by name: ``exact``, ``tfidf``, ``scispacy``, or
    ``dense``/``sapbert`` (:class:`~spacy_genbioel.retrieval.dense.DenseLinker`, e.g. ``model=DIR``)."""
    key = name.lower()
    if key in LAZY_LINKERS:
        import importlib

        module, _, attr = LAZY_LINKERS[key].partition(":")
        return getattr(importlib.import_module(module), attr)(kb, **kwargs)
    try:
        cls = LINKERS[key]
    except KeyError:
        known = ", ".join(sorted([*LINKERS, *LAZY_LINKERS]))
        raise ValueError(f"Unknown linker {name!r}; known: {known}") from None
    return cls(kb, **kwargs)
