"""TF-IDF nearest names: character 3-grams over the KB names, exact cosine similarity.

:class:`TfidfLinker` is a retriever (:class:`~spacy_genbioel.ty.Linker`
protocol) and, through :meth:`TfidfLinker.similarity`, the similarity measure
of the evaluation's mention / gold-name similarity bins and of ANGEL's
negative mining.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import scipy.sparse as sp

from spacy_genbioel.kb.base import KnowledgeBase
from spacy_genbioel.progress import LARGE, StepProgress
from spacy_genbioel.retrieval.name_cache import NameCache
from spacy_genbioel.ty import Candidate, MentionLike, mention_text
from spacy_genbioel.util import PathLike, cache_root

logger = logging.getLogger(__name__)

__all__ = ["CACHE_MIN_NAMES", "TfidfLinker"]

#: KBs of this many names or more keep their fitted index in the cache (fitting 100k names takes about 3 s)
CACHE_MIN_NAMES = 100_000


def _strings(data: np.ndarray, offsets: np.ndarray) -> List[str]:
    """The UTF-8 strings of ``data`` between consecutive ``offsets``."""
    raw = bytes(data)
    if len(offsets) == 0 or offsets[0] != 0 or offsets[-1] != len(raw) or np.any(np.diff(offsets) < 0):
        raise ValueError("vocabulary offsets do not cut the vocabulary bytes")
    return [raw[a:b].decode("utf8") for a, b in zip(offsets[:-1].tolist(), offsets[1:].tolist())]


def _csr(arrays: Dict[str, np.ndarray], prefix: str, shape: Tuple[int, int]) -> sp.csr_matrix:
    """The CSR matrix ``prefix`` of a cache entry, on its memory-mapped arrays (checked, not copied)."""
    data, indices, indptr = (arrays[f"{prefix}_{part}"] for part in ("data", "indices", "indptr"))
    if (
        data.ndim != 1
        or indices.shape != data.shape
        or indptr.shape != (shape[0] + 1,)
        or indptr[0] != 0
        or indptr[-1] != len(data)
        or np.any(np.diff(indptr) < 0)
        or (len(indices) and (indices.min() < 0 or indices.max() >= shape[1]))
        or not np.all(np.isfinite(data))
    ):
        raise ValueError(f"its {prefix} matrix is not a {shape[0]} x {shape[1]} CSR matrix")
    return sp.csr_matrix((data, indices, indptr), shape=shape, copy=False)


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

    Fitting reads the names once; ``progress`` (None: from 100,000 names on,
    on a terminal) counts them as the fit goes. A KB of :data:`CACHE_MIN_NAMES`
    names or more (BC5CDR's 788k take 21 s to fit) keeps its fitted index in
    the folder ``cache`` names (``True``: ``<cache root>/tfidf``, :func:`~spacy_genbioel.util.cache_root`),
    a file named by the SHA-256 of these settings and every name
    (:class:`~spacy_genbioel.retrieval.name_cache.NameCache`): a process that
    loads the same KB later maps it instead of fitting again, and the processes
    of one machine (Ray workers) share its pages. ``cache=False``: never.
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
        progress: Optional[bool] = None,
        cache: Union[bool, PathLike] = True,
    ) -> None:
        self.kb = kb
        self._settings = {"analyzer": analyzer, "ngram_range": tuple(ngram_range), "min_df": min_df}
        self.vectorizer = self._vectorizer()
        names = kb.names
        self._name_vectors: Optional[sp.csr_matrix] = None
        self._names_t: Optional[sp.csr_matrix] = None
        #: the cache entry of this KB's index (None: not cached); ``from_cache``: read from it, not fitted
        self.cache: Optional[NameCache] = None
        self.from_cache = False
        if cache is not False and len(names) >= max(1, CACHE_MIN_NAMES):
            folder = cache_root() / "tfidf" if cache is True else Path(cache)
            self.cache = NameCache(folder, self._cache_spec(), names, kb_name=kb.name, infix=".tfidf")
            self.from_cache = self._read_cache()
        if names and not self.from_cache:
            # (n_names, vocab), rows L2-normalized by the vectorizer; the fit reads the names once, counted as it goes
            with StepProgress.start(
                "tfidf index",
                len(names),
                unit="name",
                enabled=progress if progress is not None else len(names) >= LARGE,
            ) as bar:
                self._name_vectors = self.vectorizer.fit_transform(bar.wrap(names, every=4096)).tocsr()
            # (vocab, n_names) CSR: X @ names_t is a CSR x CSR product
            self._names_t = self._name_vectors.T.tocsr()
            if self.cache is not None:
                self._write_cache()
        self.max_block = max(1, int(max_block))
        self.chunk_size = chunk_size
        logger.debug(
            "TfidfLinker: %d names, vocabulary %d", len(names), len(getattr(self.vectorizer, "vocabulary_", {}) or {})
        )

    # -- the index, fitted or cached ---------------------------------------------
    def _vectorizer(self, vocabulary: Optional[Dict[str, int]] = None):
        from sklearn.feature_extraction.text import TfidfVectorizer

        return TfidfVectorizer(
            **self._settings,
            lowercase=False,  # names and mentions are normalized by the KB
            dtype=np.float32,
            vocabulary=vocabulary,
        )

    def _cache_spec(self) -> bytes:
        """What, besides the names, decides the index: the settings and scikit-learn's version (its analyzer)."""
        import sklearn

        head = {"v": 1, **self._settings, "ngram_range": list(self._settings["ngram_range"])}
        head["sklearn"] = ".".join(sklearn.__version__.split(".")[:2])
        return json.dumps(head, sort_keys=True).encode("utf8")

    def _read_cache(self) -> bool:
        """Take the index from the cache entry (memory-mapped) if there is a sound one."""
        assert self.cache is not None
        found = self.cache.read()
        if found is None:
            return False
        try:
            n_names, n_terms = len(self.kb.names), len(found["idf"])
            terms = _strings(found["vocab_bytes"], found["vocab_offsets"])
            vectors = _csr(found, "vectors", (n_names, n_terms))
            names_t = _csr(found, "names_t", (n_terms, n_names))
            if len(terms) != n_terms:
                raise ValueError(f"{len(terms)} terms for {n_terms} idf weights")
            vectorizer = self._vectorizer({term: i for i, term in enumerate(terms)})
            vectorizer.idf_ = np.asarray(found["idf"])
        except (KeyError, ValueError, UnicodeDecodeError) as err:
            logger.warning("Ignoring the TF-IDF index %s (%s); fitting it again", self.cache.path, err)
            return False
        self.vectorizer, self._name_vectors, self._names_t = vectorizer, vectors, names_t
        return True

    def _write_cache(self) -> None:
        assert self.cache is not None and self._name_vectors is not None and self._names_t is not None
        vocabulary = self.vectorizer.vocabulary_
        terms = sorted(vocabulary, key=vocabulary.get)
        encoded = [t.encode("utf8") for t in terms]
        arrays = {
            "idf": np.asarray(self.vectorizer.idf_),
            "vocab_bytes": np.frombuffer(b"".join(encoded), dtype=np.uint8),
            "vocab_offsets": np.cumsum([0] + [len(b) for b in encoded], dtype=np.int64),
        }
        for prefix, matrix in (("vectors", self._name_vectors), ("names_t", self._names_t)):
            arrays.update({f"{prefix}_data": matrix.data, f"{prefix}_indices": matrix.indices})
            arrays[f"{prefix}_indptr"] = matrix.indptr
        try:
            self.cache.write(arrays, {"what": "tfidf index"})
        except OSError as err:
            logger.info("The TF-IDF index is not cached: %s cannot be written (%s)", self.cache.path, err)

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

    def pair_scores(self, texts: Sequence[str], name_index: np.ndarray, normalize: bool = True) -> np.ndarray:
        """Cosine of ``texts[i]`` with KB name ``name_index[i, j]``
        ((len(texts), k) float32; 0 where an index is -1)."""
        name_index = np.asarray(name_index, dtype=np.int64)
        if name_index.ndim != 2 or name_index.shape[0] != len(texts):
            raise ValueError(f"pair_scores: name_index must be ({len(texts)}, k), got {name_index.shape}")
        if not name_index.size:
            return np.zeros(name_index.shape, dtype=np.float32)
        vectors = self.transform(texts, normalize=normalize)
        rows = np.repeat(np.arange(len(texts)), name_index.shape[1])
        flat = name_index.reshape(-1)
        scores = np.asarray(
            vectors[rows].multiply(self._name_vectors[np.maximum(flat, 0)]).sum(axis=1), dtype=np.float32
        )
        return np.where(flat >= 0, scores.reshape(-1), 0.0).reshape(name_index.shape).astype(np.float32)

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
        all_texts = [kb.normalize(mention_text(m)) for m in mentions]
        # each distinct text is scored once
        texts = list(dict.fromkeys(all_texts))
        exact = [kb.name_index(t) for t in texts]
        vectors = self.vectorizer.transform(texts).tocsr()
        results: List[List[Candidate]] = []
        step = self._chunk()
        for start in range(0, len(texts), step):
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
                results.append([Candidate(tuple(kb.ids_for_name_index(i)), names[i], min(s, 1.0)) for i, s in ranked])
        found = dict(zip(texts, results))
        return [list(found[text]) for text in all_texts]

    def similarity(self, mention_texts: Sequence[str], names: Sequence[Union[str, Sequence[str]]]) -> np.ndarray:
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
